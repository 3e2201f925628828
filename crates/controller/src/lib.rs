//! The placement controller's protocols, apart from the node that runs them.
//!
//! * [`reshard`] — slot migration and splits: every step idempotent, every
//!   decision taken from the shards' and the map's replicated state (see
//!   docs/safety.md, claim 7). It runs over [`reshard::Cluster`]: gRPC calls
//!   to the nodes in the server (`fencelock_server::ops::Ops`), the simulated
//!   stores in the deterministic simulation.
//!
//! The operator actions that drive replicas and leaders (moves, balance,
//! drain) still live in the server's `ops.rs`; issue 18 moves them here.

pub mod reshard;
