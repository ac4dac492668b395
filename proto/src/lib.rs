//! Every `.proto` of Warden and the tonic/prost code generated from it.
//!
//! Architecture invariant: only this crate runs code generation. Other crates use these
//! types at their edges and convert to their own domain types.

/// Node-to-node raft transport (batches of opaque raft-proto messages).
pub mod transport {
    tonic::include_proto!("warden.transport");
}

/// Commands of the engine's test key-value state machine.
pub mod kv {
    tonic::include_proto!("warden.kv");
}

/// Encoded `FileDescriptorSet` of every Warden proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("warden_descriptor");
