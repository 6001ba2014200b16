//! The gateway<->shard protocol (`proto/cluster.proto`): generated tonic client and server.
//!
//! Only `gateway` and `shard` depend on this crate; the generated types never leave them.
//! This crate holds no logic beyond the generated code and the constants both ends agree on.

/// Types and services generated from `proto/cluster.proto` (package `meridian.cluster.v1`).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/meridian.cluster.v1.rs"));
}

/// Inputs per `GatewayBatch` at most; a gateway sends several batches when it has more.
pub const MAX_INPUTS_PER_BATCH: usize = 4096;
/// Deliveries per `ShardBatch` at most.
pub const MAX_DELIVERIES_PER_BATCH: usize = 4096;
/// gRPC message size limit both ends configure (a full batch of maximal frames fits).
pub const MAX_GRPC_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
