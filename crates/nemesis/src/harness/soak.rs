//! A soak (`make soak`): hours of the chaos run's recorded load plus the
//! steady seed-shaped [`background`](super::background) load, one fault
//! every `fault_every`, and every node process's memory, open files and
//! data directory sampled throughout. At the end the whole recorded history
//! is checked, as in a chaos run, and every resource must be flat after the
//! warm-up ([`crate::growth`]): leaks that a 90-second run cannot show.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::background::{Background, BackgroundConfig, BackgroundReport};
use super::cluster::{Cluster, NodePids};
use super::run::{self, Load, RunConfig, RunError, RunResult};
use crate::growth::{assess, Growth, Resource, Sample};
use crate::schedule;

/// Defaults of `make soak`.
pub const DEFAULT_FAULT_EVERY_S: u64 = 180;
pub const DEFAULT_SAMPLE_EVERY_S: u64 = 30;
/// The warm-up left out of the growth fits, counted from each node
/// process's start (a restarted node warms up again): caches, memtables,
/// the dedup table and the first snapshots fill during it. The 1-hour soak
/// of 2026-12-04 saw a node's memory climb for 25-35 minutes and then stay
/// level (docs/testing.md, "Soak"). At most this, and at most half the
/// run.
pub const MAX_WARMUP_S: u64 = 1_800;
/// How long the background's leases in flight get to end after its stop.
const BACKGROUND_GRACE_MS: u64 = 40_000;

#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// Seed, duration, fault kinds, cluster and recorded-load shape.
    pub run: RunConfig,
    /// A fault step starts this often.
    pub fault_every: Duration,
    pub sample_every: Duration,
    pub warmup: Duration,
    pub background: BackgroundConfig,
}

impl SoakConfig {
    pub fn new(
        seed: u64,
        duration: Duration,
        fencelock_bin: PathBuf,
        nemesis_bin: PathBuf,
    ) -> SoakConfig {
        SoakConfig {
            run: RunConfig::new(seed, duration, fencelock_bin, nemesis_bin),
            fault_every: Duration::from_secs(DEFAULT_FAULT_EVERY_S),
            sample_every: Duration::from_secs(DEFAULT_SAMPLE_EVERY_S),
            warmup: Duration::from_secs(MAX_WARMUP_S).min(duration / 2),
            background: BackgroundConfig::default(),
        }
    }

    /// The command that replays this soak's schedule.
    pub fn replay_command(&self) -> String {
        let kinds: Vec<&str> = self.run.kinds.iter().map(|k| k.name()).collect();
        format!(
            "make soak SOAK_SEED={} SOAK_SECS={} SOAK_FAULT_EVERY_SECS={} SOAK_FAULTS={} SOAK_RATE={}",
            self.run.seed,
            self.run.duration.as_secs(),
            self.fault_every.as_secs(),
            kinds.join(","),
            self.background.acquire_rate_per_s
        )
    }
}

pub struct SoakResult {
    /// The chaos part: the checked history, the report, crashes.
    pub run: RunResult,
    pub background: BackgroundReport,
    pub samples: Vec<Sample>,
    pub growth: Vec<Growth>,
    /// From the start of the load to the end of the faults and settling.
    pub loaded_for: Duration,
}

impl SoakResult {
    pub fn passed(&self) -> bool {
        self.run.passed() && self.growth.iter().all(Growth::flat) && self.memory_judged()
    }

    /// Whether some node's memory was watched long enough past its
    /// warm-up to judge: a soak whose every process restarted too
    /// recently proves nothing (not a pass).
    pub fn memory_judged(&self) -> bool {
        self.growth
            .iter()
            .any(|g| g.resource == Resource::Memory && g.per_hour.is_some())
    }
}

pub async fn soak(cfg: &SoakConfig) -> Result<SoakResult, RunError> {
    cfg.background
        .check()
        .map_err(|e| RunError::Config(format!("background load: {e}")))?;
    let (dir, temporary) = run::out_dir(&cfg.run)?;
    eprintln!(
        "soak: seed {} for {} s, a fault every {} s, output in {}",
        cfg.run.seed,
        cfg.run.duration.as_secs(),
        cfg.fault_every.as_secs(),
        dir.display()
    );
    let steps = schedule::spaced(
        cfg.run.seed,
        cfg.run.duration.as_millis() as u64,
        &cfg.run.kinds,
        cfg.run.holder_ttl_ms,
        cfg.fault_every.as_millis() as u64,
    );
    let mut cluster = Cluster::start(
        &cfg.run.fencelock_bin,
        &dir,
        cfg.run.nodes,
        cfg.run.shard_count,
    )?;
    let mut load = Load::start(&cfg.run, &cluster).await?;
    let started = Instant::now();
    let background = Background::start(&cfg.background, &load.endpoints, cfg.run.seed);
    let data_dirs: BTreeMap<u64, PathBuf> = cluster
        .ids
        .iter()
        .map(|&id| (id, cluster.data_dir(id)))
        .collect();
    let sampler = Sampler::start(cluster.pids(), data_dirs, cfg.sample_every, started);
    // The steps end within the duration; the load runs its whole length.
    let crashes = run::inject(
        &mut cluster,
        &mut load,
        &steps,
        Some(started + cfg.run.duration),
    )
    .await?;
    let loaded_for = started.elapsed();
    let background = background
        .finish(Duration::from_millis(BACKGROUND_GRACE_MS))
        .await;
    let samples = sampler.stop().await;
    write_samples(&dir.join("resources.csv"), &samples).map_err(|source| RunError::Io {
        what: "write resources.csv",
        source,
    })?;
    let growth = assess(&samples, cfg.warmup.as_secs_f64());
    let flat = growth.iter().all(Growth::flat);
    // A directory whose resources grew is kept, like a failed check's.
    let run = load
        .finish(&cfg.run, cluster, dir, temporary && flat, crashes)
        .await?;
    Ok(SoakResult {
        run,
        background,
        samples,
        growth,
        loaded_for,
    })
}

/// Prints the chaos report, the background load and the growth table.
pub fn print_result(cfg: &SoakConfig, result: &SoakResult) {
    run::print_result(&cfg.run, &result.run);
    println!(
        "=== soak: {:.1} min under load, {} samples, warm-up {} s of each process left out ===",
        result.loaded_for.as_secs_f64() / 60.0,
        result.samples.len(),
        cfg.warmup.as_secs()
    );
    print!("{}", result.background);
    for g in &result.growth {
        println!("{g}");
    }
    if !result.memory_judged() {
        println!(
            "no node process lived past its warm-up long enough to judge its memory: \
             run longer (SOAK_SECS) or with faults further apart"
        );
    }
    if result.passed() {
        println!("soak: PASS");
    } else {
        println!("soak: FAIL");
        println!(
            "samples (resources.csv), history and node logs kept in {}",
            result.run.dir.display()
        );
        println!("replay the schedule:   {}", cfg.replay_command());
    }
}

fn write_samples(path: &Path, samples: &[Sample]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "at_s,node,pid,rss_bytes,open_files,disk_bytes")?;
    for s in samples {
        writeln!(
            out,
            "{:.1},{},{},{},{},{}",
            s.at_s, s.node, s.pid, s.rss_bytes, s.open_files, s.disk_bytes
        )?;
    }
    out.flush()
}

/// Samples every node's process and data directory until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(
        pids: NodePids,
        data_dirs: BTreeMap<u64, PathBuf>,
        every: Duration,
        started: Instant,
    ) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stopped.load(Ordering::Relaxed) {
                tick.tick().await;
                let at_s = started.elapsed().as_secs_f64();
                let pids = pids.now();
                let dirs = data_dirs.clone();
                // /proc and a directory walk: blocking file-system reads.
                let taken = tokio::task::spawn_blocking(move || look(at_s, &pids, &dirs))
                    .await
                    .unwrap_or_default();
                samples
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(taken);
            }
            let taken = samples.lock().unwrap_or_else(|e| e.into_inner());
            taken.clone()
        });
        Sampler { stop, task }
    }

    async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// One sample of each node that has a process now (a killed node has none
/// until its restart).
fn look(at_s: f64, pids: &BTreeMap<u64, u32>, dirs: &BTreeMap<u64, PathBuf>) -> Vec<Sample> {
    let mut out = Vec::new();
    for (&node, &pid) in pids {
        let Some(rss_bytes) = rss_bytes(pid) else {
            continue; // exited between the table and the read
        };
        out.push(Sample {
            at_s,
            node,
            pid,
            rss_bytes,
            open_files: open_files(pid).unwrap_or(0),
            disk_bytes: dirs.get(&node).map_or(0, |d| tree_bytes(d)),
        });
    }
    out
}

/// `VmRSS` of `/proc/<pid>/status`, in bytes.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Entries of `/proc/<pid>/fd`.
fn open_files(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Bytes of every file under `dir` (0 for what cannot be read: RocksDB
/// deletes files while we walk).
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_can_be_sampled() {
        let me = std::process::id();
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(open_files(me).unwrap() >= 3, "stdin, stdout, stderr");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a"), [0u8; 100]).unwrap();
        std::fs::write(dir.path().join("sub/b"), [0u8; 28]).unwrap();
        assert_eq!(tree_bytes(dir.path()), 128);
        assert_eq!(tree_bytes(&dir.path().join("absent")), 0);
        let pids = BTreeMap::from([(1, me), (2, u32::MAX)]);
        let dirs = BTreeMap::from([(1, dir.path().to_owned())]);
        let samples = look(5.0, &pids, &dirs);
        assert_eq!(samples.len(), 1, "no process {}: no sample", u32::MAX);
        assert_eq!(samples[0].disk_bytes, 128);
    }

    #[test]
    fn the_warm_up_is_at_most_half_the_run() {
        let cfg =
            |secs| SoakConfig::new(1, Duration::from_secs(secs), "f".into(), "n".into()).warmup;
        assert_eq!(cfg(7_200), Duration::from_secs(MAX_WARMUP_S));
        assert_eq!(cfg(3_600), Duration::from_secs(1_800));
        assert_eq!(cfg(600), Duration::from_secs(300));
    }
}
