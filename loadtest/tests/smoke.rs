//! Short runs of the harness (seconds, tiny rates) against real clusters,
//! through the same code `fencelock-bench` runs. They prove the harness
//! works end to end — scheduling, both fencelock paths (routing, renewals,
//! waiting acquires), statistics, reports, process clusters — not how fast
//! anything is: performance is measured by `make bench` and reported in
//! `docs/benchmarks.md`, never asserted here.

use std::time::Duration;

use fencelock_bench::driver::TargetKind;
use fencelock_bench::error::BenchError;
use fencelock_bench::outcome::Op;
use fencelock_bench::profile::saturate::LoadMode;
use fencelock_bench::profile::{ProfileFindings, ProfileKind};
use fencelock_bench::report::Report;
use fencelock_bench::suite::{self, Machine, Profiles, RunResult, TargetSetup};
use fencelock_server::config::NodeConfig;
use fencelock_server::node::Node;

/// Profiles small enough to finish in a few seconds each.
fn tiny_profiles() -> Profiles {
    let mut p = Profiles::default();
    p.seed.resources = 500;
    p.seed.held = 20;
    p.seed.acquire_rate_per_s = 20.0;
    p.seed.ttl_ms = 3_000;
    p.seed.renew_interval_ms = 500;
    p.seed.warmup_s = 1;
    p.seed.duration_s = 3;
    p.contended.hot_resources = 2;
    p.contended.clients_per_resource = 3;
    p.contended.duration_s = 2;
    p.saturate.start_rate_per_s = 40.0;
    p.saturate.growth = 2.0;
    p.saturate.step_s = 1;
    p.saturate.max_steps = 2;
    // Generous: this checks the mechanics, not the speed of a debug build
    // on a shared machine.
    p.saturate.p99_bound_ms = 5_000.0;
    p.watch.watchers = 30;
    p.watch.resources = 3;
    p.watch.lock_clients = 1;
    p.watch.phase_s = 2;
    p.watch.watchers_per_client = 10;
    p.failover.elections = 1;
    p.failover.candidates = 2;
    p.failover.ttl_ms = 1_000;
    p.failover.crash_reps = 1;
    p.failover.kill_reps = 1;
    p
}

fn setup(
    kind: TargetKind,
    endpoints: Option<Vec<String>>,
    work_dir: &std::path::Path,
) -> TargetSetup {
    TargetSetup {
        kind,
        endpoints,
        fencelock_bin: None,
        etcd_bin: None,
        work_dir: work_dir.to_owned(),
        shards: 2,
        conns: 1,
        op_timeout: Duration::from_secs(10),
        max_in_flight: 256,
        keep_data: false,
        progress: false,
    }
}

/// Runs `profile` on a fresh local cluster of `fencelock` processes (the
/// debug binary `cargo build --workspace` puts beside the test).
async fn run_local(target: &TargetSetup, profile: ProfileKind, profiles: &Profiles) -> RunResult {
    suite::run_one(target, profile, profiles)
        .await
        .unwrap_or_else(|e| {
            panic!("{e} (the `fencelock` binary is built by `cargo build --workspace`)")
        })
}

fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Three in-process nodes on loopback.
async fn start_in_process_cluster(dir: &std::path::Path) -> (Vec<Node>, Vec<String>) {
    let peers: Vec<(u64, String)> = (1..=3).map(|id| (id, free_addr())).collect();
    let mut nodes = Vec::new();
    for (id, _) in &peers {
        let config = NodeConfig::for_test(*id, dir.join(format!("node{id}")), peers.clone());
        nodes.push(Node::start(config).await.expect("node starts"));
    }
    (nodes, peers.into_iter().map(|(_, a)| a).collect())
}

fn ok_count(run: &RunResult, op: Op) -> u64 {
    run.summary
        .ops
        .get(&op)
        .map_or(0, |s| s.outcomes.get("ok").copied().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_contended_and_saturate_run_against_a_real_cluster_and_write_a_report() {
    let tmp = tempfile::tempdir().unwrap();
    let (_nodes, endpoints) = start_in_process_cluster(tmp.path()).await;
    let target = setup(TargetKind::Fencelock, Some(endpoints), tmp.path());
    let mut profiles = tiny_profiles();

    let seed = suite::run_one(&target, ProfileKind::Seed, &profiles)
        .await
        .unwrap();
    // Every acquire picks a free resource: nothing may conflict or fail.
    assert_eq!(seed.summary.failed(), 0, "{:?}", seed.summary.error_samples);
    for op in [Op::Acquire, Op::Renew, Op::Release] {
        assert!(ok_count(&seed, op) > 0, "no successful {}", op.name());
    }
    assert!(seed.counters.raft_entries.is_some_and(|e| e > 0));
    assert!(!seed.summary.series.is_empty());

    let contended = suite::run_one(&target, ProfileKind::Contended, &profiles)
        .await
        .unwrap();
    let ProfileFindings::Contended(findings) = &contended.findings else {
        panic!("contended findings expected");
    };
    assert!(findings.grants > 1);
    assert!(
        ok_count(&contended, Op::Handoff) > 0,
        "no hand-off measured"
    );
    assert_eq!(findings.token_regressions, 0, "fencing tokens went back");

    let saturate = suite::run_one(&target, ProfileKind::Saturate, &profiles)
        .await
        .unwrap();
    let ProfileFindings::Saturate(open) = &saturate.findings else {
        panic!("saturate findings expected");
    };
    assert!(!open.steps.is_empty());
    profiles.saturate.mode = LoadMode::Closed;
    profiles.saturate.start_clients = 2;
    profiles.saturate.max_clients = 4;
    let closed = suite::run_one(&target, ProfileKind::Saturate, &profiles)
        .await
        .unwrap();
    let ProfileFindings::Saturate(closed_findings) = &closed.findings else {
        panic!("saturate findings expected");
    };
    assert!(closed_findings
        .steps
        .iter()
        .any(|s| s.delivered_per_s > 0.0));

    let report = Report::new(
        Machine::probe(None),
        profiles,
        vec![seed, contended, saturate, closed],
    );
    let out = tmp.path().join("report");
    let written = report.write(&out).unwrap();
    assert_eq!(written.len(), 3);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 4);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<svg") && !html.contains("<script"));
    let tables = std::fs::read_to_string(out.join("tables.md")).unwrap();
    assert!(tables.contains("| fencelock | seed | acquire |"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capacity_kills_and_restarts_a_node_process_of_a_local_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let target = setup(TargetKind::Fencelock, None, tmp.path());
    let mut profiles = tiny_profiles();
    profiles.seed.duration_s = 6;
    let run = run_local(&target, ProfileKind::Capacity, &profiles).await;
    let ProfileFindings::Seed(findings) = &run.findings else {
        panic!("seed findings expected");
    };
    let labels: Vec<&str> = findings.events.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(labels[0].contains("killed") && labels[1].contains("restarted"));
    assert!(
        findings.events.iter().all(|e| e.error.is_none()),
        "{:?}",
        findings.events
    );
    assert_eq!(run.nodes.len(), 3, "CPU and memory of every node");
    assert!(run.nodes.iter().all(|n| n.peak_rss_mib > 0.0));
    // With one replica of three down the cluster keeps serving.
    assert!(ok_count(&run, Op::Acquire) > 0);
    // The nodes' CPU per lock operation, from their processes.
    let cpu_s = run
        .derived
        .server_cpu_s
        .expect("the nodes are this run's processes");
    let per_op = run
        .derived
        .server_cpu_us_per_lock_op
        .expect("lock ops were done");
    assert!(cpu_s > 0.0 && per_op > 0.0, "{cpu_s} s, {per_op} µs");
    let expected = cpu_s * 1e6 / run.derived.lock_ops as f64;
    assert!(
        (per_op - expected).abs() < 1e-6 * expected,
        "{per_op} vs {expected}"
    );
    let tables = suite_tables(run, tmp.path());
    assert!(tables.contains("| µs per lock op |"), "{tables}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_delivers_every_change_to_every_watcher_of_a_real_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let (_nodes, endpoints) = start_in_process_cluster(tmp.path()).await;
    let target = setup(TargetKind::Fencelock, Some(endpoints), tmp.path());
    let profiles = tiny_profiles();
    let run = suite::run_one(&target, ProfileKind::Watch, &profiles)
        .await
        .unwrap();
    let ProfileFindings::Watch(f) = &run.findings else {
        panic!("watch findings expected");
    };
    assert_eq!(f.watchers_ready, 30, "every watcher got its first event");
    for phase in [&f.without_watchers, &f.with_watchers] {
        assert!(phase.lock_ops_per_s > 0.0, "{f:?}");
        assert_eq!(phase.failed, 0, "{:?}", run.summary.error_samples);
    }
    // Every grant and release reached each of its resource's 10 watchers,
    // matched by token and kind; nothing arrived that no lock client was
    // answered for.
    assert!(f.changes > 0);
    assert_eq!(f.deliveries_expected, f.changes * 10);
    assert_eq!(f.delivered, f.deliveries_expected, "{f:?}");
    assert_eq!((f.missed, f.unmatched, f.gaps), (0, 0, 0), "{f:?}");
    assert_eq!(f.watch_errors, 0, "{:?}", f.error_samples);
    assert_eq!(ok_count(&run, Op::Delivery), f.delivered);
    let tables = suite_tables(run, tmp.path());
    assert!(tables.contains("### Watch: delivery"), "{tables}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_sees_the_next_leader_after_a_crash_and_a_node_kill() {
    let tmp = tempfile::tempdir().unwrap();
    let target = setup(TargetKind::Fencelock, None, tmp.path());
    let run = run_local(&target, ProfileKind::Failover, &tiny_profiles()).await;
    let ProfileFindings::Failover(f) = &run.findings else {
        panic!("failover findings expected");
    };
    assert_eq!((f.crash.len(), f.kill.len()), (1, 1));
    assert_eq!(f.failed_reps, 0, "{f:?}");
    for rep in f.crash.iter().chain(&f.kill) {
        assert!(
            rep.observed_ms.is_some() && rep.leader_read_ms.is_some(),
            "{rep:?}"
        );
    }
    assert!(f.kill[0].killed_node.is_some() && f.kill[0].served_ms.is_some());
    assert_eq!(f.token_regressions, 0);
    let tables = suite_tables(run, tmp.path());
    assert!(tables.contains("### Failover"), "{tables}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_disk_slows_only_the_leaders_syncs_and_every_request_is_still_answered() {
    let tmp = tempfile::tempdir().unwrap();
    let target = setup(TargetKind::Fencelock, None, tmp.path());
    let mut profiles = tiny_profiles();
    profiles.seed.duration_s = 6;
    let delay_ms = profiles.slow_disk.sync_delay_ms;
    let run = run_local(&target, ProfileKind::SlowDisk, &profiles).await;
    let ProfileFindings::SlowDisk(f) = &run.findings else {
        panic!("slow-disk findings expected");
    };
    // Every shard was led by the slowed node: its syncs are the leaders'.
    let (led, shards) = f.led_at_start;
    assert!(shards > 0 && led == shards, "{f:?}");
    // The fault reached the node's syncs in the slow half only. (A few
    // healthy syncs land in the slow half's counters: a node publishes its
    // histograms once per tick, and the half is 3 s; so half the delay.)
    let slow_sync = f
        .slow
        .slow_node_sync_mean_ms
        .expect("the node serves metrics");
    let healthy_sync = f
        .healthy
        .slow_node_sync_mean_ms
        .expect("the node serves metrics");
    assert!(slow_sync >= delay_ms as f64 / 2.0, "{f:?}");
    assert!(healthy_sync < slow_sync, "{f:?}");
    // With the leaders' disk slow, the followers' majority answers.
    for phase in [&f.healthy, &f.slow] {
        assert!(phase.lock_ops > 0 && phase.failed == 0, "{f:?}");
    }
    assert!(f.acquire_p99_ratio.is_some());
    // The run's own summary is the slow half.
    assert_eq!(
        ok_count(&run, Op::Acquire) + ok_count(&run, Op::Renew) + ok_count(&run, Op::Release),
        f.slow.lock_ops
    );
    let tables = suite_tables(run, tmp.path());
    assert!(tables.contains("### Slow leader disk"), "{tables}");
}

#[tokio::test]
async fn fencelock_only_profiles_refuse_etcd() {
    let tmp = tempfile::tempdir().unwrap();
    let target = setup(
        TargetKind::Etcd,
        Some(vec!["127.0.0.1:1".to_owned()]),
        tmp.path(),
    );
    for profile in [
        ProfileKind::Watch,
        ProfileKind::Failover,
        ProfileKind::SlowDisk,
    ] {
        let result = suite::run_one(&target, profile, &tiny_profiles()).await;
        assert!(
            matches!(result, Err(BenchError::InvalidArgument(_))),
            "{profile:?}"
        );
    }
}

/// The Markdown tables of a report of one run (written under `dir`).
fn suite_tables(run: RunResult, dir: &std::path::Path) -> String {
    let report = Report::new(Machine::probe(None), tiny_profiles(), vec![run]);
    let out = dir.join("report");
    report.write(&out).unwrap();
    std::fs::read_to_string(out.join("tables.md")).unwrap()
}
