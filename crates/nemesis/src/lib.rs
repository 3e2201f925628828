//! Fault injection for fencelock, Jepsen style: run real `fencelock serve`
//! processes, drive concurrent clients that record every operation, inject
//! faults on a schedule, and check the whole recorded history.
//!
//! The crate has two halves with a hard line between them:
//!
//! * **Pure** — [`schedule`] (which faults happen when, a function of a
//!   seed) and [`retry`] (which refusals a recording client retries) here;
//!   the history, the checkers, the fenced resource, the growth fit and the
//!   report live in `crates/checker` (`fencelock-checker`) and are
//!   re-exported here under their old paths ([`history`], [`check`],
//!   [`fence`], [`growth`], [`report`], [`clock`]). No I/O: they are
//!   unit-tested on hand-made histories, and a recorded history can be
//!   re-checked offline with `nemesis check FILE`.
//! * **I/O** — [`harness`]: network namespaces and partitions, node
//!   processes, the fenced resource, clients, the nemesis that executes a
//!   schedule, and the run that ties them together. Behind the `harness`
//!   feature (on by default): without it the crate builds without tonic,
//!   for the deterministic simulation (`crates/simulation`), which checks
//!   its histories with the same checkers.
//!
//! `docs/testing.md` lists every fault and checker and how to replay a
//! failed run.

#[cfg(feature = "harness")]
pub mod harness;
pub mod retry;
pub mod schedule;

pub use fencelock_checker::{check, clock, fence, growth, history, report};
