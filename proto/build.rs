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
    Ok(())
}
