//! One chaos run, start to finish: network and nodes up, clients loading,
//! the schedule's faults, heal, a settling period under load, final reads,
//! then the history is written to JSONL and checked.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::cluster::Cluster;
use super::fence_server::{self, FenceClient};
use super::holder::HolderProc;
use super::lock_client::LockClient;
use super::nemesis::Nemesis;
use super::recorder::Recorder;
use super::workload::{self, Ctx};
use crate::check::{check_all, CheckConfig};
use crate::fence::{FenceMode, FencedResource};
use crate::history::{write_jsonl, History, HistoryError, ProcessId};
use crate::report::Report;
use crate::schedule::{self, FaultKind, Step};

/// How long the cluster may take to elect every shard's first leader.
pub const STARTUP_TIMEOUT_MS: u64 = 60_000;
/// Load continues this long after the heal (liveness is measured on it).
pub const SETTLE_MS: u64 = 8_000;
/// Client tasks still running this long after the stop are abandoned
/// (their calls in flight become unknown outcomes).
pub const STOP_GRACE_MS: u64 = 30_000;
/// An interrupted slot migration gets this long to finish after the heal.
pub const FINISH_MIGRATION_MS: u64 = 30_000;

/// Process ids by role.
const FIFO_FIRST_PROCESS: ProcessId = 100;
const FINAL_READER_PROCESS: ProcessId = 500;
const HOLDER_FIRST_PROCESS: ProcessId = 1_000;
/// Process ids of the watchers.
const WATCHER_FIRST_PROCESS: ProcessId = 500;

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub seed: u64,
    /// How long faults are injected (every selected kind runs at least once
    /// even if that takes longer).
    pub duration: Duration,
    pub kinds: Vec<FaultKind>,
    pub nodes: u64,
    pub shard_count: u32,
    pub clients: u64,
    pub resources: usize,
    pub holders: u64,
    pub holder_ttl_ms: u64,
    pub fence_mode: FenceMode,
    pub fencelock_bin: PathBuf,
    /// This crate's `nemesis` binary (it runs the client processes).
    pub nemesis_bin: PathBuf,
    /// Where the history, configs, data and node logs go. `None`: a
    /// temporary directory, deleted if every check passed.
    pub out_dir: Option<PathBuf>,
    pub check: CheckConfig,
}

impl RunConfig {
    /// The defaults `make test` uses, apart from duration and binaries.
    pub fn new(
        seed: u64,
        duration: Duration,
        fencelock_bin: PathBuf,
        nemesis_bin: PathBuf,
    ) -> RunConfig {
        RunConfig {
            seed,
            duration,
            kinds: FaultKind::ALL.to_vec(),
            nodes: 4,
            shard_count: 4,
            clients: 6,
            resources: 8,
            holders: 1,
            holder_ttl_ms: 2_000,
            fence_mode: FenceMode::Checked,
            fencelock_bin,
            nemesis_bin,
            out_dir: None,
            check: CheckConfig::default(),
        }
    }

    /// The command that replays this run's schedule.
    pub fn replay_command(&self) -> String {
        let kinds: Vec<&str> = self.kinds.iter().map(|k| k.name()).collect();
        format!(
            "make chaos CHAOS_SEED={} CHAOS_SECS={} CHAOS_FAULTS={}",
            self.seed,
            self.duration.as_secs(),
            kinds.join(",")
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Cluster(#[from] super::cluster::ClusterError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the recorded history is malformed (a harness bug): {0}")]
    History(#[from] HistoryError),
    #[error("bad run configuration: {0}")]
    Config(String),
    /// A rolling upgrade turned a feature on too early or never.
    #[error("upgrade: {0}")]
    Upgrade(String),
}

pub struct RunResult {
    pub report: Report,
    /// The recorded history (also in `history_path` if the run failed).
    pub history: History,
    /// Nodes that exited by themselves during the run.
    pub crashes: Vec<(u64, String)>,
    pub dir: PathBuf,
    pub history_path: PathBuf,
}

impl RunResult {
    pub fn passed(&self) -> bool {
        self.report.all_passed() && self.crashes.is_empty()
    }
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> RunError {
    move |source| RunError::Io { what, source }
}

pub async fn run(cfg: &RunConfig) -> Result<RunResult, RunError> {
    let (dir, temporary) = out_dir(cfg)?;
    eprintln!(
        "nemesis: seed {} for {} s, output in {}",
        cfg.seed,
        cfg.duration.as_secs(),
        dir.display()
    );
    let steps = schedule::generate(
        cfg.seed,
        cfg.duration.as_millis() as u64,
        &cfg.kinds,
        cfg.holder_ttl_ms,
    );
    let mut cluster = Cluster::start(&cfg.fencelock_bin, &dir, cfg.nodes, cfg.shard_count)?;
    let mut load = Load::start(cfg, &cluster).await?;
    let crashes = inject(&mut cluster, &mut load, &steps, None).await?;
    load.finish(cfg, cluster, dir, temporary, crashes).await
}

/// Load before the first node of a rolling upgrade is upgraded, and
/// between one node's start and the next one's stop.
const UPGRADE_GAP_MS: u64 = 8_000;
/// How long an old node has for its graceful shutdown (SIGTERM) before it
/// is killed.
const UPGRADE_STOP_WITHIN_MS: u64 = 45_000;
/// How long every shard has to have a leader again after a node's upgrade.
const UPGRADE_READY_WITHIN_MS: u64 = 60_000;

/// A rolling upgrade under load: the cluster starts from `from_bin` (the
/// previous release), the recorded load runs, and each node in turn is
/// stopped with SIGTERM and started from `cfg.fencelock_bin` on its data
/// directory; the next waits until every shard has a leader again. Then
/// the whole history goes through every checker, as after a chaos run
/// (docs/operations.md, "Upgrades").
pub async fn rolling_upgrade(
    cfg: &RunConfig,
    from_bin: &std::path::Path,
) -> Result<RunResult, RunError> {
    let (dir, temporary) = out_dir(cfg)?;
    eprintln!(
        "nemesis: rolling upgrade from {} to {}, seed {}, output in {}",
        from_bin.display(),
        cfg.fencelock_bin.display(),
        cfg.seed,
        dir.display()
    );
    let mut cluster = Cluster::start(from_bin, &dir, cfg.nodes, cfg.shard_count)?;
    let mut load = Load::start(cfg, &cluster).await?;
    let gap = Duration::from_millis(UPGRADE_GAP_MS);
    tokio::time::sleep(gap).await;
    let ids = cluster.ids.clone();
    for (i, &id) in ids.iter().enumerate() {
        // Mixed: an upgraded node must refuse a value while a member of
        // the previous release could meet it in the log.
        if i + 1 == ids.len() && i > 0 {
            let upgraded = cluster.endpoint(ids[0]);
            match values_probe(&upgraded, Duration::from_secs(10), false).await {
                Probe::Refused => eprintln!(
                    "nemesis: upgrade: values refused while node {id} runs the previous release"
                ),
                other => {
                    return Err(RunError::Upgrade(format!(
                        "an acquire with a value was {other:?} while node {id} still ran the \
                         previous release"
                    )))
                }
            }
        }
        let ended = cluster
            .upgrade(
                id,
                &cfg.fencelock_bin,
                Duration::from_millis(UPGRADE_STOP_WITHIN_MS),
            )
            .await?;
        let detail = format!("node {id} {ended}; started from the new build");
        eprintln!("nemesis: upgrade: {detail}");
        load.recorder
            .nemesis("upgrade", crate::history::Phase::Start, detail);
        cluster
            .wait_ready(Duration::from_millis(UPGRADE_READY_WITHIN_MS))
            .await?;
        tokio::time::sleep(gap).await;
    }
    // Every member upgraded: the controller turns values on by itself.
    match values_probe(&cluster.endpoint(ids[0]), Duration::from_secs(60), true).await {
        Probe::Granted => eprintln!("nemesis: upgrade: values on once every node was upgraded"),
        other => {
            return Err(RunError::Upgrade(format!(
                "values stayed off after every node was upgraded ({other:?})"
            )))
        }
    }
    let crashes = inject(&mut cluster, &mut load, &[], None).await?;
    load.finish(cfg, cluster, dir, temporary, crashes).await
}

/// What an acquire carrying a value got from an upgraded node.
#[derive(Debug)]
enum Probe {
    /// Granted, and `Get` returned the value.
    Granted,
    /// FEATURE_NOT_ENABLED.
    Refused,
    /// Anything else until the deadline (the last one).
    Other(String),
}

/// Acquires (and releases) a probe resource with a value at `endpoint`,
/// retrying transient failures until `within`; the first definite answer,
/// or, with `until_granted`, the first grant (the controller raises the
/// cluster format within a round or two of seeing every member).
async fn values_probe(endpoint: &str, within: Duration, until_granted: bool) -> Probe {
    use fencelock_api::v1::lock_service_client::LockServiceClient;
    use fencelock_api::v1::{AcquireRequest, ErrorDetail, GetRequest, Reason, ReleaseRequest};
    let deadline = tokio::time::Instant::now() + within;
    let resource = "upgrade/values-probe".to_owned();
    let mut last = String::from("no attempt");
    while tokio::time::Instant::now() < deadline {
        let attempt = async {
            let mut client = LockServiceClient::connect(endpoint.to_owned())
                .await
                .map_err(|e| e.to_string())?;
            let request = AcquireRequest {
                resource: resource.clone(),
                request_id: crate::clock::monotonic_ns().to_be_bytes().to_vec(),
                lease_ttl_ms: 5_000,
                wait_timeout_ms: 0,
                value: b"probe".to_vec(),
                ..Default::default()
            };
            match client.acquire(request).await {
                Ok(granted) => {
                    let granted = granted.into_inner();
                    let read = client
                        .get(GetRequest {
                            resource: resource.clone(),
                        })
                        .await
                        .map_err(|s| s.to_string())?
                        .into_inner();
                    let _ = client
                        .release(ReleaseRequest {
                            resource: resource.clone(),
                            lease_id: granted.lease_id,
                        })
                        .await;
                    if read.value == b"probe" {
                        Ok(Probe::Granted)
                    } else {
                        Ok(Probe::Other(format!(
                            "granted, but Get read {:?}",
                            read.value
                        )))
                    }
                }
                Err(status) => match ErrorDetail::from_status(&status).map(|d| d.reason()) {
                    Some(Reason::FeatureNotEnabled) => Ok(Probe::Refused),
                    _ => Err(status.to_string()),
                },
            }
        };
        match attempt.await {
            Ok(Probe::Refused) if until_granted => last = "refused (FEATURE_NOT_ENABLED)".into(),
            Ok(probe @ (Probe::Granted | Probe::Refused)) => return probe,
            Ok(Probe::Other(why)) => return Probe::Other(why),
            Err(why) => last = why,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Probe::Other(last)
}

/// Runs `steps` against the loaded cluster, then (once `until`, if given,
/// has passed) heals everything, finishes an interrupted migration and lets
/// the load settle. Returns the nodes that exited by themselves.
pub(crate) async fn inject(
    cluster: &mut Cluster,
    load: &mut Load,
    steps: &[Step],
    until: Option<tokio::time::Instant>,
) -> Result<Vec<(u64, String)>, RunError> {
    let started = tokio::time::Instant::now();
    let mut nemesis = Nemesis::new(
        cluster,
        &mut load.holders,
        load.recorder.clone(),
        load.fence_addr.clone(),
        load.resources.clone(),
    );
    for (i, step) in steps.iter().enumerate() {
        let kinds: Vec<&str> = step.kinds.iter().map(|k| k.name()).collect();
        eprintln!(
            "nemesis: {:>5} s, step {}/{}: {} for {} ms",
            started.elapsed().as_secs(),
            i + 1,
            steps.len(),
            kinds.join(" + "),
            step.hold_ms
        );
        nemesis.run_step(step).await;
    }
    if let Some(until) = until {
        tokio::time::sleep_until(until).await;
    }
    nemesis.heal_all().await?;
    if let Err(e) = nemesis
        .finish_migration(Duration::from_millis(FINISH_MIGRATION_MS))
        .await
    {
        eprintln!("nemesis: could not finish an interrupted migration: {e}");
    }
    tokio::time::sleep(Duration::from_millis(SETTLE_MS)).await;
    Ok(nemesis.crashes.clone())
}

/// The run's output directory, and whether it is a temporary one.
pub(crate) fn out_dir(cfg: &RunConfig) -> Result<(PathBuf, bool), RunError> {
    match &cfg.out_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(io("create the output directory"))?;
            Ok((d.clone(), false))
        }
        None => {
            let tmp = tempfile::Builder::new()
                .prefix("fencelock-nemesis-")
                .tempdir()
                .map_err(io("create a temporary directory"))?;
            Ok((tmp.keep(), true))
        }
    }
}

/// The recorded load on a running cluster: the lock clients, the FIFO
/// prober and the holder processes, with the fenced resource they write to.
pub(crate) struct Load {
    pub holders: Vec<HolderProc>,
    pub recorder: Recorder,
    pub fence_addr: String,
    pub resources: Vec<String>,
    pub endpoints: Vec<String>,
    fifo_resource: String,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Waits for every shard's first leader, then starts the load.
    pub async fn start(cfg: &RunConfig, cluster: &Cluster) -> Result<Load, RunError> {
        cluster
            .wait_ready(Duration::from_millis(STARTUP_TIMEOUT_MS))
            .await?;
        let endpoints = cluster.endpoints();
        let fence = Arc::new(FencedResource::new(cfg.fence_mode));
        let fence_addr = fence_server::serve(fence)
            .await
            .map_err(io("serve the fenced resource"))?;
        let recorder = Recorder::new();
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Ctx {
            endpoints: endpoints.clone(),
            fence_addr: fence_addr.clone(),
            recorder: recorder.clone(),
            stop: stop.clone(),
        };
        let resources: Vec<String> = (0..cfg.resources).map(|i| format!("chaos/r-{i}")).collect();
        let fifo_resource = "chaos/fifo".to_string();
        let mut tasks = Vec::new();
        for p in 1..=cfg.clients {
            tasks.push(tokio::spawn(workload::lock_client(
                ctx.clone(),
                p,
                resources.clone(),
                cfg.seed,
            )));
        }
        // One watcher on each of the first two resources (an exclusive
        // lock) and the last two (the shared lock and the semaphore).
        let watched: Vec<&String> = (resources.iter().take(2))
            .chain(resources.iter().skip(2).rev().take(2))
            .collect();
        for (k, resource) in watched.into_iter().enumerate() {
            tasks.push(tokio::spawn(workload::watcher(
                ctx.clone(),
                WATCHER_FIRST_PROCESS + k as ProcessId,
                resource.clone(),
            )));
        }
        tasks.push(tokio::spawn(workload::fifo_prober(
            ctx.clone(),
            FIFO_FIRST_PROCESS,
            fifo_resource.clone(),
        )));
        let mut holders = Vec::new();
        for k in 0..cfg.holders {
            holders.push(
                HolderProc::spawn(
                    &cfg.nemesis_bin,
                    HOLDER_FIRST_PROCESS + k,
                    &format!("chaos/held-{k}"),
                    &endpoints,
                    &fence_addr,
                    cfg.holder_ttl_ms,
                    recorder.clone(),
                )
                .map_err(io("start a client process"))?,
            );
        }
        Ok(Load {
            holders,
            recorder,
            fence_addr,
            resources,
            endpoints,
            fifo_resource,
            stop,
            tasks,
        })
    }

    /// Stops the load, reads every resource once more, writes the history
    /// and checks it. The cluster stops here; a passing run's temporary
    /// directory is deleted.
    pub async fn finish(
        self,
        cfg: &RunConfig,
        cluster: Cluster,
        dir: PathBuf,
        temporary: bool,
        crashes: Vec<(u64, String)>,
    ) -> Result<RunResult, RunError> {
        self.stop.store(true, Ordering::Relaxed);
        let grace = tokio::time::Instant::now() + Duration::from_millis(STOP_GRACE_MS);
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(grace, task).await.is_err() {
                abort.abort();
            }
        }
        let holder_resources: Vec<String> =
            self.holders.iter().map(|h| h.resource.clone()).collect();
        for h in self.holders {
            h.stop().await;
        }
        let recorder = self.recorder;
        let mut reader = LockClient::new(FINAL_READER_PROCESS, &self.endpoints, recorder.clone());
        let mut fence_reader =
            FenceClient::new(FINAL_READER_PROCESS, self.fence_addr, recorder.clone());
        let all: Vec<&String> = self
            .resources
            .iter()
            .chain(&holder_resources)
            .chain(std::iter::once(&self.fifo_resource))
            .collect();
        for r in all {
            reader.get(r).await;
            fence_reader.read(r).await;
        }

        let events = recorder.events();
        let history_path = dir.join("history.jsonl");
        let file = std::fs::File::create(&history_path).map_err(io("create history.jsonl"))?;
        write_jsonl(std::io::BufWriter::new(file), &events).map_err(io("write history.jsonl"))?;
        let history = History::from_events(&events)?;
        let report = Report::new(&history, check_all(&history, &cfg.check));
        let result = RunResult {
            report,
            history,
            crashes,
            dir: dir.clone(),
            history_path,
        };
        drop(cluster);
        if result.passed() && temporary {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(result)
    }
}

/// Prints the report, and on failure where to look and how to replay.
pub fn print_result(cfg: &RunConfig, result: &RunResult) {
    println!("=== nemesis run, seed {} ===", cfg.seed);
    print!("{}", result.report);
    for (node, status) in &result.crashes {
        println!("NODE FAILURE: node {node} {status}");
    }
    if result.passed() {
        println!("result: PASS");
    } else {
        println!("result: FAIL");
        println!(
            "history, configs and node logs kept in {}",
            result.dir.display()
        );
        println!(
            "re-check the history:  $CARGO_TARGET_DIR/debug/nemesis check {}",
            result.history_path.display()
        );
        println!("replay the schedule:   {}", cfg.replay_command());
    }
}
