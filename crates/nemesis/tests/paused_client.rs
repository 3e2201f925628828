//! The brief's decisive end-to-end check, with a real client process: a
//! holder paused (SIGSTOP) past its TTL loses the lock to a newer holder,
//! wakes up, and writes with its old token — the fenced resource must refuse
//! it. Run once with the real fence check (every checker passes and the
//! stale write is refused) and once with a protected system that skips the
//! check (the fence checker must catch the stale write it accepts).

use std::time::Duration;

use fencelock_nemesis::check::Status;
use fencelock_nemesis::fence::FenceMode;
use fencelock_nemesis::harness::{fencelock_bin, run};
use fencelock_nemesis::schedule::FaultKind;

/// The two runs take turns: each starts a whole cluster, and two at once
/// would only make both slower on a small machine.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One pause-client step (the first pass always runs it once).
fn config(seed: u64, mode: FenceMode) -> run::RunConfig {
    let mut cfg = run::RunConfig::new(
        seed,
        Duration::from_secs(1),
        fencelock_bin().unwrap(),
        env!("CARGO_BIN_EXE_nemesis").into(),
    );
    cfg.kinds = vec![FaultKind::PauseClient];
    cfg.fence_mode = mode;
    cfg.clients = 2;
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_paused_past_its_ttl_is_fenced_off_by_its_token() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cfg = config(1, FenceMode::Checked);
    let result = run::run(&cfg).await.expect("the run could be set up");
    run::print_result(&cfg, &result);
    assert_eq!(result.report.faults.get("pause-client"), Some(&1));
    assert!(
        result.report.op_count("fence_write", "rejected") >= 1,
        "the resumed holder's delayed write was not refused"
    );
    assert!(result.passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unfenced_store_accepts_the_delayed_write_and_the_fence_checker_catches_it() {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cfg = config(2, FenceMode::Unchecked);
    let result = run::run(&cfg).await.expect("the run could be set up");
    run::print_result(&cfg, &result);
    let fence = result
        .report
        .verdicts
        .iter()
        .find(|v| v.checker == "fence")
        .unwrap();
    assert_eq!(fence.status, Status::Fail, "{fence}");
    assert!(
        fence.problems.iter().any(|p| p.contains("accepted")),
        "{fence}"
    );
    // The lock service itself did nothing wrong.
    for v in &result.report.verdicts {
        if v.checker != "fence" {
            assert!(v.passed(), "{v}");
        }
    }
    // The run "failed" as intended; its kept directory is of no use.
    let _ = std::fs::remove_dir_all(&result.dir);
}
