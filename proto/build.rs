//! Generates every gRPC and message type of Warden. Only this crate runs code generation
//! (ARCHITECTURE.md: "Architecture invariant").

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos =
        ["proto/transport.proto", "proto/kv.proto", "proto/warden.proto", "proto/namespace.proto", "proto/placement.proto", "proto/batch.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptor_path = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("warden_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        // Watch events are shared by every watcher they go to: cloning `Bytes` is free.
        .bytes(".warden.v1.WatchEvent")
        // Errors travel in `Result`s everywhere; the rarely present descriptor stays out of line.
        .boxed(".warden.v1.WardenError.descriptor")
        .boxed(".warden.v1.WardenError.quota")
        // Batched items are decoded by method on arrival: no copy of their payloads.
        .bytes(".warden.batch")
        .compile_protos(&protos, &["proto"])?;
    compile_etcd()
}

/// etcd's v3 API (vendored unchanged in `proto/etcd`, see its README), servers and clients.
/// A separate generation: its files stay out of `warden_descriptor.bin`, which describes
/// Warden's own API only. The Google and OpenAPI annotations they import are compiled along
/// (prost ignores the options) but `src/lib.rs` includes only etcd's packages.
fn compile_etcd() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/etcd/etcd/api/mvccpb/kv.proto",
        "proto/etcd/etcd/api/authpb/auth.proto",
        "proto/etcd/etcd/api/etcdserverpb/rpc.proto",
        "proto/etcd/etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
        "proto/etcd/etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    ];
    let imports = [
        "proto/etcd/etcd/api/versionpb/version.proto",
        "proto/etcd/google/api/annotations.proto",
        "proto/etcd/google/api/http.proto",
        "proto/etcd/protoc-gen-openapiv2/options/annotations.proto",
        "proto/etcd/protoc-gen-openapiv2/options/openapiv2.proto",
    ];
    for proto in protos.iter().chain(&imports) {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure().compile_protos(&protos, &["proto/etcd"])?;
    Ok(())
}
