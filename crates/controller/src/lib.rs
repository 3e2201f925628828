//! The placement controller: the operator actions and the protocols that
//! change where shards live, apart from the node that runs them. No gRPC:
//! it reaches the nodes through [`nodes::NodeApi`] (gRPC calls in the
//! server, `fencelock_server::ops::GrpcNodes`) and answers with
//! [`ControllerError`].
//!
//! * [`ops`] — the operator actions behind `fencelock admin`: replica
//!   moves, leader transfers, balance, drain and undrain, add node, slot
//!   moves and splits. Each step observes the cluster and does only what is
//!   missing; what to move where comes from `fencelock-placement`'s planner.
//! * [`reshard`] — slot migration and splits: every step idempotent, every
//!   decision taken from the shards' and the map's replicated state (see
//!   docs/safety.md, claim 7). It runs over [`reshard::Cluster`]: [`ops::Ops`]
//!   in the server, the simulated stores in the deterministic simulation.
//! * [`act`] — acting by itself: one round a second on the meta leader
//!   observes once and repairs (replicas of nodes down for
//!   `node_down_after_ms`), splits by lock count, or balances, with the
//!   same steps as the operator actions; [`repair`] and [`rates`] hold
//!   its memory: since when each node has been unreachable, and each
//!   shard's write rate.
//! * [`epochs`] — every shard's epoch raised above a floor (recovery
//!   without token reuse).
//! * [`formats`] — placement commands newer than the first release wait
//!   until every member reads them (rolling upgrades).
//! * [`handoff`] — a stopping node hands its leaderships to serving voters.
//! * [`nodes`] — the I/O seam: the node-local calls the above are made of.
//! * [`error`] — [`ControllerError`], with its wire reason and retry advice.

pub mod act;
pub mod epochs;
pub mod error;
pub mod formats;
pub mod handoff;
pub mod nodes;
pub mod ops;
pub mod rates;
pub mod repair;
pub mod reshard;

pub use error::ControllerError;
