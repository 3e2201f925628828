//! `slow-disk` (fencelock only): the `seed` load while the leader of every
//! shard has a slow disk.
//!
//! Node 1 runs with the disk-fault layer ([`crate::cluster::diskfault`]),
//! and every shard's leadership is handed to it before the warm-up. The
//! measured window of `seed` is then split in two halves: **healthy**, and,
//! from the midpoint, **slow**: every sync of node 1 waits `sync_delay_ms`
//! (200 ms) first. Only the leaders' disk is slow, so this is the "slow
//! leader disk" case of issue #19: a leader sends its appends before its
//! own write and answers once a majority has the entry durable (the two
//! followers, here), so commit latency should stay within 2× the healthy
//! half (docs/safety.md, "Sending before persisting").
//!
//! What makes the halves comparable is recorded beside them: node 1's mean
//! sync time in each half (it shows that the fault was on, and how long a
//! leader's own write took), and how many shards node 1 still led at the
//! end (a leader that lost its leadership would make the slow half measure
//! a healthy leader). The run's own summary is the slow half's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::seed::{self, ScheduledEvent, SeedConfig, SeedFindings};
use super::RunContext;
use crate::cluster::LocalCluster;
use crate::driver::{Backend, ServerCounters};
use crate::error::BenchError;
use crate::outcome::Op;
use crate::stats::Summary;

/// How long each sync of the slow node takes: the figure of issue #19.
pub const DEFAULT_SYNC_DELAY_MS: u64 = 200;
/// The slowed node (1-based): the one every shard's leadership goes to.
pub const SLOW_NODE: usize = 1;

#[derive(Clone, Debug, Serialize)]
pub struct SlowDiskConfig {
    /// How long each sync of the slow node waits in the slow half.
    pub sync_delay_ms: u64,
}

impl Default for SlowDiskConfig {
    fn default() -> Self {
        SlowDiskConfig {
            sync_delay_ms: DEFAULT_SYNC_DELAY_MS,
        }
    }
}

/// One half of the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phase {
    pub window_s: f64,
    /// Successful acquires, renews and releases.
    pub lock_ops: u64,
    /// Requests of any operation that did not succeed.
    pub failed: u64,
    pub acquire_p50_ms: Option<f64>,
    pub acquire_p99_ms: Option<f64>,
    pub acquire_p999_ms: Option<f64>,
    pub release_p99_ms: Option<f64>,
    /// The slow node's mean synced write in this half, ms.
    pub slow_node_sync_mean_ms: Option<f64>,
}

impl Phase {
    fn of(summary: &Summary, syncs: Option<ServerCounters>) -> Phase {
        let ok = |op: Op| {
            summary
                .ops
                .get(&op)
                .map_or(0, |s| s.outcomes.get("ok").copied().unwrap_or(0))
        };
        let acquire = summary.ops.get(&Op::Acquire).filter(|s| s.total > 0);
        Phase {
            window_s: summary.window_s,
            lock_ops: ok(Op::Acquire) + ok(Op::Renew) + ok(Op::Release),
            failed: summary.failed(),
            acquire_p50_ms: acquire.map(|s| s.p50_ms),
            acquire_p99_ms: acquire.map(|s| s.p99_ms),
            acquire_p999_ms: acquire.map(|s| s.p999_ms),
            release_p99_ms: summary
                .ops
                .get(&Op::Release)
                .filter(|s| s.total > 0)
                .map(|s| s.p99_ms),
            slow_node_sync_mean_ms: syncs.and_then(|c| {
                let count = c.log_fsyncs.filter(|&n| n > 0)?;
                Some(c.log_fsync_s? * 1000.0 / count as f64)
            }),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SlowDiskFindings {
    pub sync_delay_ms: u64,
    pub slow_node: usize,
    /// Shards the slow node led when the load started, and of how many.
    pub led_at_start: (usize, usize),
    /// The same when the window closed (`None`: could not be read).
    pub led_at_end: Option<(usize, usize)>,
    pub healthy: Phase,
    pub slow: Phase,
    /// Slow half's acquire p99 over the healthy half's: the figure the
    /// target (≤ 2) is about.
    pub acquire_p99_ratio: Option<f64>,
    /// The seed run's own findings (the switch is its event).
    pub seed: SeedFindings,
}

/// What the switch keeps of the healthy half: its summary and the slow
/// node's sync counters over it.
type HalfTaken = (Summary, Option<ServerCounters>);

/// The slow node's sync counters now (its metrics page).
async fn slow_node_syncs(metrics_url: Option<&String>) -> Option<ServerCounters> {
    let url = metrics_url?;
    let mut c = ServerCounters::default();
    c.scrape_fsyncs(
        std::slice::from_ref(url),
        crate::driver::fencelock::FSYNC_METRIC,
    )
    .await;
    c.log_fsyncs.is_some().then_some(c)
}

/// Runs the profile on `cluster`, whose node [`SLOW_NODE`] was started with
/// the disk-fault layer; measurements go to `ctx.recorder` (the slow half).
pub async fn run(
    ctx: &RunContext,
    config: &SlowDiskConfig,
    seed_config: &SeedConfig,
    cluster: Option<&Arc<Mutex<LocalCluster>>>,
) -> Result<SlowDiskFindings, BenchError> {
    let Some(cluster) = cluster else {
        return Err(BenchError::InvalidArgument(
            "the slow-disk profile slows a node's disk, so it needs a local cluster \
             (drop --endpoints)"
                .to_owned(),
        ));
    };
    crate::cluster::diskfault::control_text(config.sync_delay_ms)?;
    if config.sync_delay_ms == 0 {
        return Err(BenchError::InvalidArgument(
            "slow-disk: the sync delay must be at least 1 ms".to_owned(),
        ));
    }
    let Backend::Fencelock(driver) = &ctx.backend else {
        return Err(BenchError::InvalidArgument(
            "the slow-disk profile is fencelock only".to_owned(),
        ));
    };
    let index = SLOW_NODE - 1;
    let led_at_start = driver
        .lead_all_on(index)
        .await
        .map_err(|e| BenchError::Cluster(format!("slow-disk: {e}")))?;
    let metrics_url = cluster
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .metrics_urls()
        .get(index)
        .cloned();

    // The switch, at the window's midpoint: the healthy half's summary and
    // the slow node's sync counters are taken, the recorder starts the
    // slow half, and the node's syncs turn slow.
    let healthy: Arc<Mutex<Option<HalfTaken>>> = Arc::default();
    let at_open: Arc<Mutex<Option<ServerCounters>>> = Arc::default();
    let window = Duration::from_secs(seed_config.duration_s);
    let events = {
        let (open_url, switch_url) = (metrics_url.clone(), metrics_url.clone());
        let open_store = at_open.clone();
        let (recorder, switch_cluster, store, opened) = (
            ctx.recorder.clone(),
            cluster.clone(),
            healthy.clone(),
            at_open.clone(),
        );
        let delay_ms = config.sync_delay_ms;
        vec![
            ScheduledEvent {
                at: Duration::ZERO,
                label: format!("node {SLOW_NODE}'s sync counters read"),
                action: Box::new(move || {
                    let now = tokio::runtime::Handle::current()
                        .block_on(slow_node_syncs(open_url.as_ref()));
                    *open_store.lock().unwrap_or_else(|e| e.into_inner()) = now;
                    Ok(())
                }),
            },
            ScheduledEvent {
                at: window / 2,
                label: format!("node {SLOW_NODE}'s syncs take {delay_ms} ms each"),
                action: Box::new(move || {
                    let summary = recorder.summary();
                    recorder.restart();
                    let set = switch_cluster
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .set_sync_delay_ms(SLOW_NODE, delay_ms)
                        .map_err(|e| e.to_string());
                    let now = tokio::runtime::Handle::current()
                        .block_on(slow_node_syncs(switch_url.as_ref()));
                    let before = opened.lock().unwrap_or_else(|e| e.into_inner()).take();
                    let syncs = before.zip(now.clone()).map(|(b, n)| b.delta(&n));
                    *store.lock().unwrap_or_else(|e| e.into_inner()) = Some((summary, syncs));
                    *opened.lock().unwrap_or_else(|e| e.into_inner()) = now;
                    set
                }),
            },
        ]
    };
    let seed = seed::run(ctx, seed_config, events).await?;
    let slow_summary = ctx.recorder.summary();
    let syncs_at_end = slow_node_syncs(metrics_url.as_ref()).await;
    // Healthy again, so that the cluster stops promptly.
    let healed = cluster
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .set_sync_delay_ms(SLOW_NODE, 0);
    let led_at_end = driver.shards_led_by(index).await;
    healed?;
    let Some((healthy_summary, healthy_syncs)) =
        healthy.lock().unwrap_or_else(|e| e.into_inner()).take()
    else {
        return Err(BenchError::Cluster(
            "slow-disk: the window closed before its midpoint switch ran".to_owned(),
        ));
    };
    if let Some(e) = seed.events.iter().find_map(|e| e.error.as_ref()) {
        return Err(BenchError::Cluster(format!("slow-disk: {e}")));
    }
    let slow_syncs = at_open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .zip(syncs_at_end)
        .map(|(b, n)| b.delta(&n));
    let healthy = Phase::of(&healthy_summary, healthy_syncs);
    let slow = Phase::of(&slow_summary, slow_syncs);
    let acquire_p99_ratio = slow
        .acquire_p99_ms
        .zip(healthy.acquire_p99_ms.filter(|&p| p > 0.0))
        .map(|(s, h)| s / h);
    Ok(SlowDiskFindings {
        sync_delay_ms: config.sync_delay_ms,
        slow_node: SLOW_NODE,
        led_at_start,
        led_at_end,
        healthy,
        slow,
        acquire_p99_ratio,
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;
    use crate::stats::Recorder;
    use std::time::Instant;

    #[test]
    fn a_phase_counts_ok_lock_ops_and_failures_and_the_mean_sync() {
        let recorder = Recorder::new();
        let t = Instant::now();
        for _ in 0..3 {
            recorder.record(
                Op::Acquire,
                t,
                t + Duration::from_millis(4),
                Outcome::Ok,
                None,
            );
        }
        recorder.record(
            Op::Release,
            t,
            t + Duration::from_millis(2),
            Outcome::Ok,
            None,
        );
        recorder.record(Op::Renew, t, t, Outcome::Timeout, Some("late"));
        let syncs = ServerCounters {
            raft_entries: None,
            log_fsyncs: Some(4),
            log_fsync_s: Some(0.8),
        };
        let phase = Phase::of(&recorder.summary(), Some(syncs));
        assert_eq!(phase.lock_ops, 4);
        assert_eq!(phase.failed, 1);
        let p99 = phase.acquire_p99_ms.unwrap();
        assert!((3.9..4.1).contains(&p99), "{p99}");
        assert!((phase.slow_node_sync_mean_ms.unwrap() - 200.0).abs() < 1e-9);
        let none = Phase::of(&Recorder::new().summary(), None);
        assert_eq!(none.acquire_p99_ms, None);
        assert_eq!(none.slow_node_sync_mean_ms, None);
    }
}
