//! A short soak on real processes (`harness::soak`; `make soak` runs an
//! hour): the chaos load, the seed-shaped background load and a fault every
//! 25 s; every node is sampled throughout, the whole history passes every
//! checker, and a leak added to the real samples is caught by the growth
//! check — a run this short cannot show a real leak, so it is not asked to
//! be flat.

use std::time::Duration;

use fencelock_nemesis::growth::{assess_fitting, Resource};
use fencelock_nemesis::harness::{fencelock_bin, soak};

const MIB: f64 = 1048576.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_soak_samples_every_node_passes_every_checker_and_a_leak_in_its_samples_is_caught()
{
    let seed = fencelock_nemesis::clock::monotonic_ns();
    let mut cfg = soak::SoakConfig::new(
        seed,
        Duration::from_secs(75),
        fencelock_bin().unwrap(),
        env!("CARGO_BIN_EXE_nemesis").into(),
    );
    cfg.fault_every = Duration::from_secs(25);
    cfg.sample_every = Duration::from_secs(2);
    cfg.background.acquire_rate_per_s = 20.0;
    cfg.background.held = 200;
    cfg.background.resources = 2_000;
    let out = tempfile::tempdir().unwrap();
    cfg.run.out_dir = Some(out.path().to_owned());
    println!("soak seed {seed}; replay with: {}", cfg.replay_command());
    let result = soak::soak(&cfg).await.expect("the soak could be set up");
    soak::print_result(&cfg, &result);
    assert!(
        result.run.passed(),
        "the soak's history failed a checker or a node crashed (seed {seed})"
    );
    assert!(out.path().join("resources.csv").is_file());
    for node in 1..=cfg.run.nodes {
        let mine: Vec<_> = result.samples.iter().filter(|s| s.node == node).collect();
        assert!(mine.len() >= 20, "node {node}: {} samples", mine.len());
        assert!(
            mine.iter()
                .all(|s| s.rss_bytes > 0 && s.open_files > 0 && s.disk_bytes > 0),
            "node {node}: a resource read as 0: {mine:?}"
        );
    }
    assert!(
        result.background.acquire.latencies_us.len() > 200,
        "too little background load: {}",
        result.background
    );
    // The same samples with node 1 leaking 1 MiB a second: the fit finds
    // the added 3,600 MiB an hour on top of what the run really did.
    let real = assess_fitting(&result.samples, 0.0, 20.0);
    let mut leaky = result.samples.clone();
    for s in leaky.iter_mut().filter(|s| s.node == 1) {
        s.rss_bytes += (s.at_s * MIB) as u64;
    }
    let leaked = assess_fitting(&leaky, 0.0, 20.0);
    let memory_of_node_1 = |all: &[fencelock_nemesis::growth::Growth]| {
        all.iter()
            .find(|g| g.node == 1 && g.resource == Resource::Memory)
            .cloned()
            .unwrap()
    };
    let (before, after) = (memory_of_node_1(&real), memory_of_node_1(&leaked));
    assert!(!after.flat(), "the leak was not caught: {after}");
    let added = after.per_hour.unwrap() - before.per_hour.unwrap();
    assert!(
        (added / MIB - 3_600.0).abs() < 36.0,
        "measured {added} B/h added, not 3,600 MiB/h: {before} / {after}"
    );
}
