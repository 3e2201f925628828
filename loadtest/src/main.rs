//! `fencelock-bench`: see the crate docs (`lib.rs`) and `loadtest/README.md`.
//!
//! * `run` — one profile against one target (a fresh local cluster, or
//!   `--endpoints`).
//! * `compare` — the side-by-side suite behind `make bench`: every profile
//!   against fencelock and against etcd, each on a fresh local cluster, one
//!   report (the fencelock-only profiles, `watch`, `failover` and
//!   `slow-disk`, against fencelock alone).
//! * `client-load` — load from client processes of the Python package
//!   (`clients/python/bench.py`), ops/s per process and in total.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelock_bench::client_load::{
    self, ClientLoadSetup, ClientTls, DEFAULT_CLIENT_PROCS, DEFAULT_CLIENT_SECONDS,
    DEFAULT_CLIENT_THREADS, DEFAULT_PYTHON,
};
use fencelock_bench::driver::{TargetKind, DEFAULT_OP_TIMEOUT_MS};
use fencelock_bench::error::BenchError;
use fencelock_bench::fair::{self, RunOrder, SettleConfig};
use fencelock_bench::profile::saturate::LoadMode;
use fencelock_bench::profile::{ProfileKind, DEFAULT_MAX_IN_FLIGHT};
use fencelock_bench::report::Report;
use fencelock_bench::suite::{self, Machine, Profiles, TargetSetup, DEFAULT_CONNS, DEFAULT_SHARDS};

/// Load-test harness for fencelock, with etcd as the reference.
#[derive(Debug, Parser)]
#[command(name = "fencelock-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one profile against one target.
    Run(RunArgs),
    /// Run profiles against fencelock and etcd side by side (what `make
    /// bench` does); writes one report.
    Compare(CompareArgs),
    /// Drive the load from processes of the Python client
    /// (clients/python/bench.py) and report ops/s per process and in total.
    ClientLoad(ClientLoadArgs),
}

#[derive(Debug, Args)]
struct ClientLoadArgs {
    /// Existing nodes (`host:port`, comma-separated). Without it a local
    /// three-node cluster (no TLS) is started and stopped.
    #[arg(long, value_delimiter = ',')]
    endpoints: Option<Vec<String>>,
    /// Client processes started side by side.
    #[arg(long, default_value_t = DEFAULT_CLIENT_PROCS)]
    client_procs: usize,
    /// Closed-loop acquire/release threads per process.
    #[arg(long, default_value_t = DEFAULT_CLIENT_THREADS)]
    threads: u32,
    /// Seconds each process loads the cluster.
    #[arg(long, default_value_t = DEFAULT_CLIENT_SECONDS)]
    seconds: f64,
    /// Lease TTL in seconds (default: bench.py's).
    #[arg(long)]
    ttl_s: Option<f64>,
    /// Tenant prefix of the resources (default: bench.py's).
    #[arg(long)]
    tenant: Option<String>,
    /// The Python interpreter that has the `fencelock` package (e.g. a
    /// virtualenv's bin/python).
    #[arg(long, default_value = DEFAULT_PYTHON)]
    python: PathBuf,
    /// The client's load script (default: clients/python/bench.py of this
    /// repository).
    #[arg(long)]
    bench_script: Option<PathBuf>,
    /// CA certificate for the clients (with --endpoints of a TLS cluster;
    /// also needs --cert-file and --key-file).
    #[arg(long, requires_all = ["cert_file", "key_file"])]
    ca_file: Option<PathBuf>,
    #[arg(long, requires = "ca_file")]
    cert_file: Option<PathBuf>,
    #[arg(long, requires = "ca_file")]
    key_file: Option<PathBuf>,
    /// Where client-load.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// The `fencelock` binary for the local cluster (this flag or
    /// $FENCELOCK_BIN, else beside this program, else PATH).
    #[arg(long, env = "FENCELOCK_BIN")]
    fencelock_bin: Option<PathBuf>,
    /// Where the local cluster keeps its data (deleted afterwards unless
    /// --keep-data).
    #[arg(long, default_value = "target/bench/clusters")]
    work_dir: PathBuf,
    #[arg(long)]
    keep_data: bool,
    /// Shards per node of the local cluster.
    #[arg(long, default_value_t = DEFAULT_SHARDS)]
    shards: u32,
}

impl ClientLoadArgs {
    fn setup(&self) -> ClientLoadSetup {
        let tls = match (&self.ca_file, &self.cert_file, &self.key_file) {
            (Some(ca), Some(cert), Some(key)) => Some(ClientTls {
                ca_file: ca.clone(),
                cert_file: cert.clone(),
                key_file: key.clone(),
            }),
            _ => None,
        };
        ClientLoadSetup {
            endpoints: self.endpoints.clone(),
            fencelock_bin: self.fencelock_bin.clone(),
            work_dir: self.work_dir.clone(),
            shards: self.shards,
            keep_data: self.keep_data,
            python: self.python.clone(),
            script: self.bench_script.clone(),
            procs: self.client_procs,
            threads: self.threads,
            seconds: self.seconds,
            ttl_s: self.ttl_s,
            tenant: self.tenant.clone(),
            tls,
        }
    }
}

async fn client_load(args: &ClientLoadArgs) -> Result<(), BenchError> {
    let report = client_load::run(&args.setup()).await?;
    print!("{}", report.table());
    let path = report.write(&args.out)?;
    eprintln!("writing {}", path.display());
    Ok(())
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The system to load.
    #[arg(long, value_enum, default_value_t = TargetKind::Fencelock)]
    target: TargetKind,
    /// The workload.
    #[arg(long, value_enum, default_value_t = ProfileKind::Seed)]
    profile: ProfileKind,
    /// Existing nodes (`host:port`, comma-separated). Without it a local
    /// three-node cluster is started and stopped.
    #[arg(long, value_delimiter = ',')]
    endpoints: Option<Vec<String>>,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Args)]
struct CompareArgs {
    /// Targets to compare.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [TargetKind::Fencelock, TargetKind::Etcd])]
    targets: Vec<TargetKind>,
    /// Profiles to run against each target (`watch`, `failover` and
    /// `slow-disk` against fencelock only).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ProfileKind::Seed, ProfileKind::Contended, ProfileKind::Saturate, ProfileKind::Capacity, ProfileKind::Watch, ProfileKind::Failover, ProfileKind::SlowDisk])]
    profiles: Vec<ProfileKind>,
    /// Runs of each profile per system. The systems run each profile back
    /// to back, the first one alternating across repeats, so the default
    /// (2) has each system run each shared profile once first and once
    /// second.
    #[arg(long, default_value_t = fair::DEFAULT_REPEATS, value_parser = clap::value_parser!(u32).range(1..=10))]
    repeats: u32,
    /// Before every run, wait at most this long for a quiet machine (CPU
    /// busy and load average under the two limits below); 0 = do not wait.
    /// Each run records whether it started quiet, and a ratio between the
    /// systems is claimed only from pairs that all did.
    #[arg(long, default_value_t = fair::DEFAULT_SETTLE_TIMEOUT_S)]
    settle_timeout_s: u64,
    /// A quiet machine's CPU busy over a 2 s sample, percent of all cores.
    #[arg(long, default_value_t = fair::DEFAULT_MAX_BUSY_PCT)]
    settle_max_busy_pct: f64,
    /// A quiet machine's 1-minute load average per CPU.
    #[arg(long, default_value_t = fair::DEFAULT_MAX_LOAD_PER_CPU)]
    settle_max_load_per_cpu: f64,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Args)]
struct CommonArgs {
    /// Where results.json, report.html and tables.md go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// The `fencelock` binary for local clusters (this flag or
    /// $FENCELOCK_BIN, else beside this program, else PATH).
    #[arg(long, env = "FENCELOCK_BIN")]
    fencelock_bin: Option<PathBuf>,
    /// The `etcd` binary for local clusters (default: PATH).
    #[arg(long, env = "ETCD_BIN")]
    etcd_bin: Option<PathBuf>,
    /// Where local clusters keep their data (deleted afterwards unless
    /// --keep-data).
    #[arg(long, default_value = "target/bench/clusters")]
    work_dir: PathBuf,
    #[arg(long)]
    keep_data: bool,
    /// Shards per fencelock node in local clusters.
    #[arg(long, default_value_t = DEFAULT_SHARDS)]
    shards: u32,
    /// gRPC connections per endpoint.
    #[arg(long, default_value_t = DEFAULT_CONNS)]
    conns: usize,
    /// Deadline of one operation, retries included.
    #[arg(long, default_value_t = DEFAULT_OP_TIMEOUT_MS)]
    op_timeout_ms: u64,
    /// Requests in flight before new ones wait (their latency still counts
    /// from their schedule).
    #[arg(long, default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    max_in_flight: usize,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Short runs (seconds per profile) to check the setup, not to measure
    /// (`compare`: one pass, without waiting for a quiet machine).
    #[arg(long)]
    quick: bool,

    // ---- seed, capacity and slow-disk ----
    /// Measured seconds of seed, capacity and slow-disk (slow-disk: half
    /// healthy, half slow).
    #[arg(long)]
    duration_s: Option<u64>,
    /// Seconds of warm-up before the seed window opens.
    #[arg(long)]
    warmup_s: Option<u64>,
    /// Acquires per second (seed, capacity, slow-disk).
    #[arg(long)]
    rate: Option<f64>,
    /// Resources to pick from (seed, capacity, slow-disk).
    #[arg(long)]
    resources: Option<u32>,
    /// Leases held at steady state (seed, capacity, slow-disk).
    #[arg(long)]
    held: Option<u32>,
    #[arg(long)]
    ttl_ms: Option<u64>,
    #[arg(long)]
    renew_interval_ms: Option<u64>,

    // ---- contended ----
    /// Hot resources (contended).
    #[arg(long)]
    hot: Option<u32>,
    /// Callers per hot resource (contended).
    #[arg(long)]
    clients: Option<u32>,
    /// Seconds of the contended run.
    #[arg(long)]
    contended_s: Option<u64>,

    // ---- saturate ----
    /// open: step a rate up; closed: double the callers per step.
    #[arg(long, value_enum)]
    mode: Option<LoadMode>,
    /// Lock ops/s of the first saturate step.
    #[arg(long)]
    start_rate: Option<f64>,
    /// Seconds per saturate step.
    #[arg(long)]
    step_s: Option<u64>,
    /// Acquire p99 bound of saturate, in ms.
    #[arg(long)]
    p99_bound_ms: Option<f64>,
    /// Repeats of a failed saturate step before its rate counts as missed
    /// (default 1; 0 stops at the first failed step).
    #[arg(long)]
    confirm_misses: Option<u32>,

    // ---- watch ----
    /// Watch streams (watch).
    #[arg(long)]
    watchers: Option<u32>,
    /// Busy resources the watchers watch and the lock clients lock (watch).
    #[arg(long)]
    watch_resources: Option<u32>,
    /// Closed-loop lock callers per busy resource (watch).
    #[arg(long)]
    lock_clients: Option<u32>,
    /// How long a lock client holds each lease, in ms (watch).
    #[arg(long)]
    watch_hold_ms: Option<u64>,
    /// Seconds of each watch phase (without, then with the watchers).
    #[arg(long)]
    watch_phase_s: Option<u64>,

    // ---- failover ----
    /// Elections (failover).
    #[arg(long)]
    elections: Option<u32>,
    /// Campaigners per election (failover).
    #[arg(long)]
    candidates: Option<u32>,
    /// Lease TTL of the campaigners, in ms (failover).
    #[arg(long)]
    election_ttl_ms: Option<u64>,
    /// Repetitions of the leader crash (failover).
    #[arg(long)]
    crash_reps: Option<u32>,
    /// Repetitions of the shard leader node kill (failover; 0 with
    /// --endpoints).
    #[arg(long)]
    kill_reps: Option<u32>,

    // ---- slow-disk ----
    /// How long each sync of the slow node takes in the slow half, in ms
    /// (slow-disk; 1..=60000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    slow_disk_delay_ms: Option<u64>,
}

impl CommonArgs {
    fn profiles(&self) -> Profiles {
        let mut p = Profiles::default();
        if self.quick {
            p.seed.resources = 2_000;
            p.seed.held = 200;
            p.seed.acquire_rate_per_s = 100.0;
            p.seed.renew_interval_ms = 1_000;
            p.seed.ttl_ms = 5_000;
            p.seed.warmup_s = 3;
            p.seed.duration_s = 10;
            p.contended.duration_s = 5;
            p.saturate.step_s = 3;
            p.saturate.max_steps = 4;
            p.watch.watchers = 100;
            p.watch.phase_s = 3;
            p.failover.crash_reps = 1;
            p.failover.kill_reps = 1;
            p.failover.ttl_ms = 1_000;
        }
        let s = &mut p.seed;
        s.duration_s = self.duration_s.unwrap_or(s.duration_s);
        s.warmup_s = self.warmup_s.unwrap_or(s.warmup_s);
        s.acquire_rate_per_s = self.rate.unwrap_or(s.acquire_rate_per_s);
        s.resources = self.resources.unwrap_or(s.resources);
        s.held = self.held.unwrap_or(s.held);
        s.ttl_ms = self.ttl_ms.unwrap_or(s.ttl_ms);
        s.renew_interval_ms = self.renew_interval_ms.unwrap_or(s.renew_interval_ms);
        let c = &mut p.contended;
        c.hot_resources = self.hot.unwrap_or(c.hot_resources);
        c.clients_per_resource = self.clients.unwrap_or(c.clients_per_resource);
        c.duration_s = self.contended_s.unwrap_or(c.duration_s);
        let t = &mut p.saturate;
        t.mode = self.mode.unwrap_or(t.mode);
        t.start_rate_per_s = self.start_rate.unwrap_or(t.start_rate_per_s);
        t.step_s = self.step_s.unwrap_or(t.step_s);
        t.p99_bound_ms = self.p99_bound_ms.unwrap_or(t.p99_bound_ms);
        t.confirm_misses = self.confirm_misses.unwrap_or(t.confirm_misses);
        let w = &mut p.watch;
        w.watchers = self.watchers.unwrap_or(w.watchers);
        w.resources = self.watch_resources.unwrap_or(w.resources);
        w.lock_clients = self.lock_clients.unwrap_or(w.lock_clients);
        w.hold_ms = self.watch_hold_ms.unwrap_or(w.hold_ms);
        w.phase_s = self.watch_phase_s.unwrap_or(w.phase_s);
        let f = &mut p.failover;
        f.elections = self.elections.unwrap_or(f.elections);
        f.candidates = self.candidates.unwrap_or(f.candidates);
        f.ttl_ms = self.election_ttl_ms.unwrap_or(f.ttl_ms);
        f.crash_reps = self.crash_reps.unwrap_or(f.crash_reps);
        f.kill_reps = self.kill_reps.unwrap_or(f.kill_reps);
        let d = &mut p.slow_disk;
        d.sync_delay_ms = self.slow_disk_delay_ms.unwrap_or(d.sync_delay_ms);
        p
    }

    fn setup(&self, kind: TargetKind, endpoints: Option<Vec<String>>) -> TargetSetup {
        TargetSetup {
            kind,
            endpoints,
            fencelock_bin: self.fencelock_bin.clone(),
            etcd_bin: self.etcd_bin.clone(),
            work_dir: self.work_dir.clone(),
            shards: self.shards,
            conns: self.conns,
            op_timeout: Duration::from_millis(self.op_timeout_ms),
            max_in_flight: self.max_in_flight,
            keep_data: self.keep_data,
            progress: !self.quiet,
        }
    }
}

/// One run of an invocation: where, what, and (in a comparison) its place.
type Run = (TargetSetup, ProfileKind, Option<fair::Job>);

async fn run(cli: Cli) -> Result<(), BenchError> {
    // What a comparison waits for before every run (`None`: no waiting).
    let (common, jobs, settle): (&CommonArgs, Vec<Run>, Option<SettleConfig>) = match &cli.command {
        Command::Run(args) => (
            &args.common,
            vec![(
                args.common.setup(args.target, args.endpoints.clone()),
                args.profile,
                None,
            )],
            None,
        ),
        Command::ClientLoad(args) => return client_load(args).await,
        Command::Compare(args) => {
            // --quick checks the setup: one pass, no waiting.
            let repeats = if args.common.quick { 1 } else { args.repeats };
            let settle =
                (args.settle_timeout_s > 0 && !args.common.quick).then_some(SettleConfig {
                    max_busy_pct: args.settle_max_busy_pct,
                    max_load_per_cpu: args.settle_max_load_per_cpu,
                    timeout_s: args.settle_timeout_s,
                });
            (
                &args.common,
                fair::schedule(&args.targets, &args.profiles, repeats)
                    .into_iter()
                    .map(|job| (args.common.setup(job.target, None), job.profile, Some(job)))
                    .collect(),
                settle,
            )
        }
    };
    let profiles = common.profiles();
    let mut runs = Vec::new();
    for (setup, profile, place) in jobs {
        let settled = match settle.filter(|_| place.is_some()) {
            Some(config) => {
                let record = fair::settle(&config).await;
                eprintln!(
                    "{} / {}: machine {} after {:.0} s (CPU {:.0}% busy, load {:.1})",
                    setup.kind.name(),
                    profile.name(),
                    if record.quiet { "quiet" } else { "NOT quiet" },
                    record.waited_ms as f64 / 1000.0,
                    record.busy_pct,
                    record.load_1m
                );
                Some(record)
            }
            None => None,
        };
        let mut result = match suite::run_one(&setup, profile, &profiles).await {
            // A local cluster that did not come up (a node exited at
            // start: a port taken between choosing and binding it, say) is
            // started once more on new ports rather than ending a run of
            // many profiles; a second failure ends it.
            Err(e @ (BenchError::Cluster(_) | BenchError::NotReady { .. }))
                if setup.endpoints.is_none() =>
            {
                eprintln!(
                    "{} / {}: {e}; starting a fresh cluster once more",
                    setup.kind.name(),
                    profile.name()
                );
                suite::run_one(&setup, profile, &profiles).await?
            }
            other => other?,
        };
        result.order = place.map(|job| RunOrder {
            repeat: job.repeat,
            position: job.position,
            settle: settled,
        });
        eprintln!(
            "{} / {}: {} failed requests",
            result.target.name(),
            result.profile.name(),
            result.summary.failed()
        );
        runs.push(result);
        // Write after every run, so a late failure keeps what was measured.
        let report = Report::new(
            Machine::probe(common.etcd_bin.as_deref()),
            profiles.clone(),
            runs.clone(),
        );
        let paths = report.write(&common.out)?;
        if runs.len() == 1 {
            for p in &paths {
                eprintln!("writing {}", p.display());
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
