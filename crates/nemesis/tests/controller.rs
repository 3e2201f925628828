//! The placement controller on real processes (`harness::controller`):
//! five `fencelock serve` processes in network namespaces, sixteen data
//! shards under the chaos run's recorded load; one node killed for good is
//! replaced within `node_down_after_ms` + 60 s, a node joining while the
//! scheduler is paused receives nothing, and after the resume it fills up;
//! a hot range splits its shard with tokens still rising — every checker
//! green and no client call left without an answer.

use std::time::Duration;

use fencelock_nemesis::harness::{controller, fencelock_bin, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_for_good_is_replaced_a_joined_node_fills_up_and_a_hot_shard_splits_under_load(
) {
    let cfg = run::RunConfig::new(
        fencelock_nemesis::clock::monotonic_ns(),
        Duration::ZERO,
        fencelock_bin().unwrap(),
        env!("CARGO_BIN_EXE_nemesis").into(),
    );
    let result = controller::run(&cfg)
        .await
        .expect("the run could be set up");
    // The report, not `run::print_result`: its replay command is for the
    // random fault schedule of `make chaos`, which this run does not use.
    print!("{}", result.run.report);
    for (node, status) in &result.run.crashes {
        println!("NODE FAILURE: node {node} {status}");
    }
    println!(
        "killed node {}; repaired after {:?} ms (bound {} ms); balanced after {:?} ms; \
         split (shard, after ms) {:?}",
        result.victim,
        result.repaired_after_ms,
        controller::REPAIR_WITHIN_MS,
        result.balanced_after_ms,
        result.split
    );
    for problem in &result.problems {
        println!("PROBLEM: {problem}");
    }
    assert!(
        result.passed(),
        "the controller run failed; see above (history, configs and node logs kept in {}; \
         re-check with `nemesis check {}`)",
        result.run.dir.display(),
        result.run.history_path.display()
    );
}
