//! Failpoints in real node processes (the server's `failpoints` feature,
//! which this crate's dev-dependency turns on for `cargo test --workspace`):
//! a leader crashing after its log write before answering, replies dropped
//! after commit, an old leader with a slow disk cut off from the others, and
//! a crash while installing the snapshot of a replica move. Each runs once,
//! under load; the whole history must pass every checker.

use std::time::Duration;

use fencelock_nemesis::harness::{fencelock_bin, run};
use fencelock_nemesis::schedule::FaultKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_failpoint_fault_under_load_keeps_every_checker_green() {
    let mut cfg = run::RunConfig::new(
        3,
        // The first pass runs each kind once, however short the duration.
        Duration::from_secs(1),
        fencelock_bin().unwrap(),
        env!("CARGO_BIN_EXE_nemesis").into(),
    );
    cfg.kinds = FaultKind::FAILPOINTS.to_vec();
    let result = run::run(&cfg).await.expect("the run could be set up");
    run::print_result(&cfg, &result);
    for kind in FaultKind::FAILPOINTS {
        assert!(
            result.report.faults.contains_key(kind.name()),
            "{kind} was never injected"
        );
    }
    assert!(result.passed(), "see the report above");
}
