//! The pure half of fencelock's fault testing (Jepsen style): what a run
//! recorded and whether it kept every promise. No processes, no network,
//! no clock beyond the monotonic timestamps histories are stamped with.
//!
//! * [`history`] — the operation model and its JSONL form.
//! * [`check`] — one checker per safety or liveness property, each a
//!   function of a history.
//! * [`fence`] — the fenced resource a run writes through (the product's
//!   `FenceStore`), checked against the history.
//! * [`growth`] — whether a soak's resource samples are flat.
//! * [`report`] — the printed verdicts.
//! * [`clock`] — the one clock history timestamps come from.
//!
//! Used by `fencelock-nemesis` (real processes, which re-exports these
//! modules under its own name) and by the deterministic simulation, which
//! checks its histories with the same checkers. `docs/testing.md` lists
//! every checker.

pub mod check;
pub mod clock;
pub mod fence;
pub mod growth;
pub mod history;
pub mod report;
