//! `fencelock-bench`: the load-test harness of fencelock.
//!
//! It drives a lock service (fencelock, or etcd for comparison) with the
//! workloads of the product brief and reports what it measured:
//!
//! * [`schedule`] — open-loop pacing at a target rate (latency counted from
//!   each request's *scheduled* start, so a stalled server cannot hide its
//!   stall by slowing the load) and closed-loop workers.
//! * [`profile`] — the workloads: `seed` (the brief's steady state),
//!   `contended` (hot resources with queued waiters), `saturate` (step the
//!   rate up until acquire p99 passes a bound) and `capacity` (`seed` with a
//!   replica down and a snapshot happening).
//! * [`driver`] — one backend per system: fencelock's gRPC API with
//!   leader-aware routing, and etcd mapped the idiomatic way (lease grant +
//!   create-if-absent transaction, keep-alive, revoke; `v3lock` for waits).
//! * [`cluster`] — starts local three-node clusters of real processes
//!   (`fencelock serve`, `etcd`) and samples their CPU and memory.
//! * [`stats`] — HDR histograms per operation, outcome counts, per-second
//!   series; [`report`] turns them into JSON, an HTML page with SVG charts,
//!   and Markdown tables.
//! * [`fair`] — the order of a comparison (systems back to back per
//!   profile, the first one alternating across repeats) and the quiet
//!   machine every run waits for.
//! * [`client_load`] — load from a client library's own processes
//!   (`clients/python/bench.py`), to measure the client's overhead.

pub mod client_load;
pub mod cluster;
pub mod driver;
pub mod error;
pub mod fair;
pub mod outcome;
pub mod profile;
pub mod progress;
pub mod report;
pub mod schedule;
pub mod stats;
pub mod suite;
