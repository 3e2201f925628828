//! Runs profiles against targets and collects everything a report needs:
//! [`run_one`] for one target and profile (on a fresh local cluster, or on
//! given endpoints), [`RunResult`] for what it measured, [`Machine`] for
//! where.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cluster::{self, ClusterOptions, LocalCluster, NodeUsage};
use crate::driver::{Backend, ServerCounters, TargetKind};
use crate::error::BenchError;
use crate::outcome::Op;
use crate::profile::contended::ContendedConfig;
use crate::profile::failover::FailoverConfig;
use crate::profile::saturate::SaturateConfig;
use crate::profile::seed::{ScheduledEvent, SeedConfig};
use crate::profile::slow_disk::{SlowDiskConfig, SLOW_NODE};
use crate::profile::watch::WatchConfig;
use crate::profile::{
    contended, failover, saturate, seed, slow_disk, watch, ProfileFindings, ProfileKind, RunContext,
};
use crate::stats::Summary;

/// Shards per fencelock node in local clusters: `fencelock dev`'s default.
pub const DEFAULT_SHARDS: u32 = 8;
/// gRPC connections per endpoint.
pub const DEFAULT_CONNS: usize = 4;
/// Capacity scenario: entries between snapshots (both systems), low enough
/// that logs are compacted while the replica is down.
pub const CAPACITY_SNAPSHOT_ENTRIES: u64 = 2_000;
/// Capacity scenario: when the replica is killed and brought back, as
/// fractions of the measured window.
const CAPACITY_KILL_AT: f64 = 0.25;
const CAPACITY_RESTART_AT: f64 = 0.75;

/// Where to run.
#[derive(Clone, Debug)]
pub struct TargetSetup {
    pub kind: TargetKind,
    /// Given endpoints; `None` = start a local cluster.
    pub endpoints: Option<Vec<String>>,
    pub fencelock_bin: Option<PathBuf>,
    pub etcd_bin: Option<PathBuf>,
    /// Parent of the local clusters' data directories.
    pub work_dir: PathBuf,
    pub shards: u32,
    pub conns: usize,
    pub op_timeout: Duration,
    pub max_in_flight: usize,
    pub keep_data: bool,
    pub progress: bool,
}

/// The profiles' settings.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Profiles {
    pub seed: SeedConfig,
    pub contended: ContendedConfig,
    pub saturate: SaturateConfig,
    pub watch: WatchConfig,
    pub failover: FailoverConfig,
    pub slow_disk: SlowDiskConfig,
}

/// Figures derived from the counters and the summary.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Derived {
    /// Successful acquires, renews and releases in the window.
    pub lock_ops: u64,
    /// Lock operations per Raft log entry.
    pub ops_per_entry: Option<f64>,
    /// Lock operations per synced log write of one node (the fsyncs of all
    /// nodes divided by their number).
    pub ops_per_fsync: Option<f64>,
    /// Raft entries per synced log write of one node.
    pub entries_per_fsync: Option<f64>,
    /// Mean duration of one synced log write, in ms.
    pub fsync_mean_ms: Option<f64>,
    /// CPU seconds of all the cluster's nodes over the window (from
    /// `/proc/<pid>/stat`); `None` when the nodes are not local processes.
    pub server_cpu_s: Option<f64>,
    /// Server CPU per successful lock operation, in µs, summed over the
    /// nodes: a figure a busy shared machine disturbs far less than
    /// throughput. For `saturate` it spans every step of the run.
    pub server_cpu_us_per_lock_op: Option<f64>,
}

/// Everything one run of one profile against one target measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub target: TargetKind,
    pub profile: ProfileKind,
    pub summary: Summary,
    pub findings: ProfileFindings,
    /// CPU over the measured window and memory at its end, per node; empty
    /// when the nodes are not local processes of this run.
    pub nodes: Vec<NodeUsageWindow>,
    /// Counter growth over the measured window.
    pub counters: ServerCounters,
    pub derived: Derived,
    /// The machine's 1-minute load average when the run started and ended
    /// (`/proc/loadavg`): other work on the machine shows here.
    pub load_avg_1m: [f64; 2],
    /// Its place in a comparison and the machine it started on (`compare`
    /// sets it; a single run has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<crate::fair::RunOrder>,
}

/// The machine's 1-minute load average.
pub fn load_avg_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A node's use of the machine during the measured window.
#[derive(Clone, Debug, Serialize)]
pub struct NodeUsageWindow {
    pub node: usize,
    /// CPU seconds per second of window (1.0 = one core busy).
    pub cpu_cores: f64,
    pub rss_mib: f64,
    /// Peak resident memory since the node started.
    pub peak_rss_mib: f64,
}

/// The machine the run was on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub etcd_version: Option<String>,
}

impl Machine {
    pub fn probe(etcd_bin: Option<&std::path::Path>) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let etcd_version = etcd_bin
            .map(std::path::Path::to_owned)
            .or_else(|| cluster::which("etcd"))
            .and_then(|bin| {
                std::process::Command::new(bin)
                    .arg("--version")
                    .output()
                    .ok()
            })
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .find_map(|l| l.strip_prefix("etcd Version:").map(|v| v.trim().to_owned()))
            });
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            memory_gib: mem_kib / 1024.0 / 1024.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            etcd_version,
        }
    }
}

fn start_cluster(setup: &TargetSetup, profile: ProfileKind) -> Result<LocalCluster, BenchError> {
    let dir = setup
        .work_dir
        .join(format!("{}-{}", setup.kind.name(), profile.name()));
    let snapshot_entries = (profile == ProfileKind::Capacity).then_some(CAPACITY_SNAPSHOT_ENTRIES);
    match setup.kind {
        TargetKind::Fencelock => LocalCluster::start_fencelock(ClusterOptions {
            kind: setup.kind,
            program: cluster::find_fencelock(setup.fencelock_bin.as_deref())?,
            dir,
            shards: setup.shards,
            snapshot_entries,
            slow_disk_node: (profile == ProfileKind::SlowDisk).then_some(SLOW_NODE),
            keep: setup.keep_data,
        }),
        TargetKind::Etcd => LocalCluster::start_etcd(ClusterOptions {
            kind: setup.kind,
            program: cluster::find_etcd(setup.etcd_bin.as_deref())?,
            dir,
            shards: 1,
            snapshot_entries,
            slow_disk_node: None,
            keep: setup.keep_data,
        }),
    }
}

/// Runs `profile` against the target of `setup`: starts a fresh local
/// cluster unless endpoints were given, waits until it is ready, runs,
/// and stops it.
pub async fn run_one(
    setup: &TargetSetup,
    profile: ProfileKind,
    profiles: &Profiles,
) -> Result<RunResult, BenchError> {
    if profile.fencelock_only() && setup.kind != TargetKind::Fencelock {
        return Err(BenchError::InvalidArgument(format!(
            "the {} profile is fencelock only (etcd has no counterpart of its API in the \
             harness)",
            profile.name()
        )));
    }
    if profile.needs_local_cluster() && setup.endpoints.is_some() {
        return Err(BenchError::InvalidArgument(format!(
            "the {} profile kills a node or slows its disk, so it needs a local cluster \
             (drop --endpoints)",
            profile.name()
        )));
    }
    let cluster = match &setup.endpoints {
        Some(_) => None,
        None => Some(Arc::new(Mutex::new(start_cluster(setup, profile)?))),
    };
    let lock =
        |c: &Arc<Mutex<LocalCluster>>| c.lock().unwrap_or_else(|e| e.into_inner()).endpoints();
    let endpoints = match (&setup.endpoints, &cluster) {
        (Some(e), _) => e.clone(),
        (None, Some(c)) => lock(c),
        (None, None) => unreachable!("a cluster is started when no endpoints are given"),
    };
    let metrics_urls = cluster
        .as_ref()
        .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()).metrics_urls())
        .unwrap_or_default();
    let backend = Backend::connect(setup.kind, &endpoints, setup.conns, metrics_urls).await?;
    if let Err(e) = backend.wait_ready().await {
        if let Some(c) = &cluster {
            let mut c = c.lock().unwrap_or_else(|e| e.into_inner());
            c.check_alive()?;
        }
        return Err(e);
    }
    let load_at_start = load_avg_1m();
    let mut ctx = RunContext::new(
        backend.clone(),
        endpoints.clone(),
        setup.op_timeout,
        setup.max_in_flight,
    );
    ctx.progress = setup.progress;
    ctx.server_cpu_s = cluster.clone().map(|c| {
        Arc::new(move || {
            c.lock()
                .unwrap_or_else(|e| e.into_inner())
                .usage()
                .iter()
                .map(|n| n.cpu_s)
                .sum::<f64>()
        }) as Arc<dyn Fn() -> f64 + Send + Sync>
    });
    if setup.progress {
        eprintln!(
            "== {} / {} on {}",
            setup.kind.name(),
            profile.name(),
            endpoints.join(",")
        );
    }

    // The measured window opens after the warm-up (seed, capacity) or at
    // once; counters and CPU are read at both ends of it.
    let warmup = match profile {
        ProfileKind::Seed | ProfileKind::Capacity | ProfileKind::SlowDisk => {
            Duration::from_secs(profiles.seed.warmup_s)
        }
        _ => Duration::ZERO,
    };
    let opening = {
        let backend = backend.clone();
        let cluster = cluster.clone();
        tokio::spawn(async move {
            tokio::time::sleep(warmup).await;
            let usage = cluster
                .as_ref()
                .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()).usage());
            (Instant::now(), backend.counters().await, usage)
        })
    };

    let findings = match profile {
        ProfileKind::Seed => {
            ProfileFindings::Seed(seed::run(&ctx, &profiles.seed, Vec::new()).await?)
        }
        ProfileKind::Capacity => {
            let events = capacity_events(&backend, cluster.as_ref(), &profiles.seed).await?;
            ProfileFindings::Seed(seed::run(&ctx, &profiles.seed, events).await?)
        }
        ProfileKind::Contended => {
            ProfileFindings::Contended(contended::run(&ctx, &profiles.contended).await?)
        }
        ProfileKind::Saturate => {
            ProfileFindings::Saturate(saturate::run(&ctx, &profiles.saturate).await?)
        }
        ProfileKind::Watch => ProfileFindings::Watch(watch::run(&ctx, &profiles.watch).await?),
        ProfileKind::Failover => ProfileFindings::Failover(
            failover::run(&ctx, &profiles.failover, cluster.as_ref()).await?,
        ),
        ProfileKind::SlowDisk => ProfileFindings::SlowDisk(
            slow_disk::run(&ctx, &profiles.slow_disk, &profiles.seed, cluster.as_ref()).await?,
        ),
    };
    if setup.progress {
        eprintln!();
    }
    let summary = ctx.recorder.summary();
    let closed_at = Instant::now();
    let counters_after = backend.counters().await;
    let usage_after = cluster
        .as_ref()
        .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()).usage());
    let (opened_at, counters_before, usage_before) = opening
        .await
        .map_err(|e| BenchError::Cluster(format!("window probe: {e}")))?;
    let window_s = closed_at.duration_since(opened_at).as_secs_f64().max(1e-3);
    let nodes = match (usage_before, usage_after) {
        (Some(before), Some(after)) => window_usage(&before, &after, window_s),
        _ => Vec::new(),
    };
    let counters = counters_before.delta(&counters_after);
    let server_cpu_s =
        (!nodes.is_empty()).then(|| nodes.iter().map(|n| n.cpu_cores).sum::<f64>() * window_s);
    let derived = derive(&summary, &counters, nodes.len().max(3), server_cpu_s);
    if let Some(c) = &cluster {
        c.lock().unwrap_or_else(|e| e.into_inner()).stop();
    }
    Ok(RunResult {
        target: setup.kind,
        profile,
        summary,
        findings,
        nodes,
        counters,
        derived,
        load_avg_1m: [load_at_start, load_avg_1m()],
        order: None,
    })
}

fn window_usage(before: &[NodeUsage], after: &[NodeUsage], window_s: f64) -> Vec<NodeUsageWindow> {
    after
        .iter()
        .map(|a| {
            let cpu_before = before
                .iter()
                .find(|b| b.node == a.node)
                .map_or(0.0, |b| b.cpu_s);
            NodeUsageWindow {
                node: a.node,
                cpu_cores: ((a.cpu_s - cpu_before) / window_s).max(0.0),
                rss_mib: a.rss_mib,
                peak_rss_mib: a.peak_rss_mib,
            }
        })
        .collect()
}

/// `server_cpu_s`: CPU seconds of every node over the window (`None`: the
/// nodes are not this run's processes).
fn derive(
    summary: &Summary,
    counters: &ServerCounters,
    nodes: usize,
    server_cpu_s: Option<f64>,
) -> Derived {
    let lock_ops: u64 = [Op::Acquire, Op::Renew, Op::Release]
        .iter()
        .filter_map(|op| summary.ops.get(op))
        .map(|s| s.outcomes.get("ok").copied().unwrap_or(0))
        .sum();
    let per_node_fsyncs = counters
        .log_fsyncs
        .filter(|&f| f > 0)
        .map(|f| f as f64 / nodes as f64);
    let entries = counters.raft_entries.filter(|&e| e > 0).map(|e| e as f64);
    Derived {
        lock_ops,
        ops_per_entry: entries.map(|e| lock_ops as f64 / e),
        ops_per_fsync: per_node_fsyncs.map(|f| lock_ops as f64 / f),
        entries_per_fsync: entries.zip(per_node_fsyncs).map(|(e, f)| e / f),
        fsync_mean_ms: counters
            .log_fsync_s
            .zip(counters.log_fsyncs.filter(|&f| f > 0))
            .map(|(s, f)| s * 1000.0 / f as f64),
        server_cpu_s,
        server_cpu_us_per_lock_op: server_cpu_s
            .filter(|_| lock_ops > 0)
            .map(|s| s * 1e6 / lock_ops as f64),
    }
}

/// The capacity scenario's events: kill the node that leads the most (a
/// leader change is the expensive part of losing a replica), bring it back
/// later on its old data, behind a compacted log.
async fn capacity_events(
    backend: &Backend,
    cluster: Option<&Arc<Mutex<LocalCluster>>>,
    seed: &SeedConfig,
) -> Result<Vec<ScheduledEvent>, BenchError> {
    let Some(cluster) = cluster else {
        return Err(BenchError::InvalidArgument(
            "capacity needs a local cluster".to_owned(),
        ));
    };
    let victim = backend.busiest_leader().await.unwrap_or(0) + 1;
    let window = Duration::from_secs(seed.duration_s);
    let (kill, restart) = (cluster.clone(), cluster.clone());
    Ok(vec![
        ScheduledEvent {
            at: window.mul_f64(CAPACITY_KILL_AT),
            label: format!("node {victim} killed (SIGKILL)"),
            action: Box::new(move || {
                kill.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .kill(victim)
                    .map_err(|e| e.to_string())
            }),
        },
        ScheduledEvent {
            at: window.mul_f64(CAPACITY_RESTART_AT),
            label: format!("node {victim} restarted"),
            action: Box::new(move || {
                restart
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .restart(victim)
                    .map_err(|e| e.to_string())
            }),
        },
    ])
}
