//! The deterministic simulation of fencelock's multi-Raft layer.
//!
//! The simulation is this crate's tests: `tests/simulation.rs` runs the
//! real `Store` (crate `fencelock-multiraft`) of three nodes step by step
//! on one thread, and `tests/sim/` is its driver — the world (network,
//! simulated time, crashes that lose unsynced writes, clock skew), the
//! simulated clients, and the migration and split protocol of
//! `fencelock-controller` over simulated nodes. One seeded RNG makes every
//! choice, so a seed is an exact replay:
//!
//! ```text
//! FENCELOCK_SIM_SEED=123 cargo test -p fencelock-simulation --test simulation -- --nocapture
//! ```
//!
//! It is its own crate so that it builds without gRPC, HTTP or TLS: no
//! tonic, axum or rustls in its dependency graph (the server crate's
//! architecture tests check it). See `docs/testing.md`, "Deterministic
//! simulation".
