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

/// The public API: the hierarchical namespace.
pub mod v1 {
    tonic::include_proto!("warden.v1");
}

/// The namespace state machine's internal records (commands, queries, stored nodes).
pub mod namespace {
    tonic::include_proto!("warden.namespace");
}

/// Cluster administration: the routing table, shard groups, node liveness.
pub mod placement {
    tonic::include_proto!("warden.placement");
}

/// Encoded `FileDescriptorSet` of every Warden proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("warden_descriptor");
