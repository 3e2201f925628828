//! Fault injection for fencelock, Jepsen style: run real `fencelock serve`
//! processes, drive concurrent clients that record every operation, inject
//! faults on a schedule, and check the whole recorded history.
//!
//! The crate has two halves with a hard line between them:
//!
//! * **Pure** — [`history`] (the operation model and its JSONL form),
//!   [`check`] (one checker per safety or liveness property, each a function
//!   of a history), [`schedule`] (which faults happen when, a function of a
//!   seed), [`retry`] (which refusals a recording client retries),
//!   [`growth`] (whether a soak's resource samples are flat) and
//!   [`report`]. No I/O, no clock: they are unit-tested on
//!   hand-made histories, and a recorded history can be re-checked offline
//!   with `nemesis check FILE`.
//! * **I/O** — [`harness`]: network namespaces and partitions, node
//!   processes, the fenced resource, clients, the nemesis that executes a
//!   schedule, and the run that ties them together. Behind the `harness`
//!   feature (on by default): without it the crate builds without tonic,
//!   for the deterministic simulation (`crates/simulation`), which checks
//!   its histories with the same checkers.
//!
//! `docs/testing.md` lists every fault and checker and how to replay a
//! failed run.

pub mod check;
pub mod clock;
pub mod fence;
pub mod growth;
#[cfg(feature = "harness")]
pub mod harness;
pub mod history;
pub mod report;
pub mod retry;
pub mod schedule;
