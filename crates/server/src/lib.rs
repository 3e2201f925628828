//! The fencelock node.
//!
//! * [`config`] — the node's configuration file, defaults and validation.
//! * [`errors`] — the crate's error type and its mapping to gRPC statuses.
//! * [`netfilter`] — fault rules (partitions, drops, delays) applied by the
//!   transport, for the in-process cluster tests and fault injection.
//! * [`transport`] — one long-lived gRPC stream per peer carrying batches of
//!   Raft messages for all shards.
//! * [`store`] — the multi-Raft store loop: one thread drives every shard's
//!   `RawNode` and persists all of them with one synced write per iteration.
//! * [`service`] — the public `LockService` over the store.
//! * [`node`] — wiring: open storage, start the store, transport and gRPC
//!   server; shut them down.
//! * [`shard_map`] — which shard a resource belongs to.

pub mod config;
pub mod errors;
pub mod netfilter;
pub mod node;
pub mod service;
pub mod shard_map;
pub mod store;
pub mod transport;

/// Generated code of the internal peer protocol (`proto/fencelock/internal`).
pub mod internal {
    tonic::include_proto!("fencelock.internal.v1");
}
