//! `nemesis`: run a chaos test, re-check a recorded history, or (internal)
//! be a lock-holding client process.
//!
//! ```text
//! nemesis run   [--seed N] [--duration-secs N] [--faults LIST] [--out DIR]
//! nemesis soak  [--seed N] [--duration-secs N] [--fault-every-secs N]
//!               [--faults LIST] [--rate N] [--out DIR]
//! nemesis upgrade --from OLD_FENCELOCK [--seed N] [--out DIR]
//! nemesis check HISTORY.jsonl [--liveness-bound-ms N]
//! nemesis hold  ...            (started by the harness)
//! ```
//!
//! Exit codes: 0 every check passed, 1 a check failed or a node crashed,
//! 2 bad usage or the run could not be set up.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use fencelock_nemesis::check::{check_all, CheckConfig};
use fencelock_nemesis::harness::{self, holder, run, soak};
use fencelock_nemesis::history::{read_jsonl, History};
use fencelock_nemesis::report::Report;
use fencelock_nemesis::schedule::parse_kinds;

const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;

#[derive(Parser)]
#[command(
    name = "nemesis",
    about = "Fault injection and history checking for fencelock"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a cluster in network namespaces, load it, inject faults, check.
    Run {
        /// Seed of the fault schedule (default: from the clock; printed).
        #[arg(long, env = "FENCELOCK_CHAOS_SEED")]
        seed: Option<u64>,
        /// Seconds of faults (every selected kind runs at least once).
        #[arg(long, env = "FENCELOCK_CHAOS_SECS", default_value_t = 120)]
        duration_secs: u64,
        /// Comma-separated fault kinds, or `all`.
        #[arg(long, env = "FENCELOCK_CHAOS_FAULTS", default_value = "all")]
        faults: String,
        /// Keep history, configs, data and logs here (default: a temporary
        /// directory, kept only if a check fails).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Lock client tasks.
        #[arg(long, default_value_t = 6)]
        clients: u64,
    },
    /// Hours of load with a fault every few minutes: the whole history is
    /// checked and every node's memory, open files and data directory must
    /// be flat after the warm-up.
    Soak {
        /// Seed of the fault schedule (default: from the clock; printed).
        #[arg(long, env = "FENCELOCK_SOAK_SEED")]
        seed: Option<u64>,
        /// Seconds of load and faults.
        #[arg(long, env = "FENCELOCK_SOAK_SECS", default_value_t = 3_600)]
        duration_secs: u64,
        /// A fault step starts this often, in seconds.
        #[arg(long, default_value_t = soak::DEFAULT_FAULT_EVERY_S)]
        fault_every_secs: u64,
        /// Seconds between resource samples.
        #[arg(long, default_value_t = soak::DEFAULT_SAMPLE_EVERY_S)]
        sample_every_secs: u64,
        /// Comma-separated fault kinds, or `all`.
        #[arg(long, default_value = "all")]
        faults: String,
        /// Acquires per second of the seed-shaped background load (renewals
        /// and releases follow from it; 1,000 leases held per 100/s).
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        /// Keep history, samples, configs, data and logs here (default: a
        /// temporary directory, kept only if the soak fails).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// A rolling upgrade under load: a cluster of the `--from` binary (the
    /// previous release), each node stopped and started from this build's
    /// `fencelock` in turn; the whole history is checked.
    Upgrade {
        /// The previous release's `fencelock` binary.
        #[arg(long)]
        from: PathBuf,
        /// Seed of the load (default: from the clock; printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Keep history, configs, data and logs here (default: a temporary
        /// directory, kept only if a check fails).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Check a recorded history (JSONL) again.
    Check {
        history: PathBuf,
        #[arg(long, default_value_t = fencelock_nemesis::check::DEFAULT_LIVENESS_BOUND_MS)]
        liveness_bound_ms: u64,
        #[arg(long, default_value_t = fencelock_nemesis::check::DEFAULT_LINEAR_MAX_STEPS)]
        linear_max_steps: u64,
    },
    /// A lock-holding client process (started by the harness).
    #[command(hide = true)]
    Hold {
        #[arg(long)]
        process: u64,
        #[arg(long)]
        resource: String,
        #[arg(long, value_delimiter = ',')]
        endpoints: Vec<String>,
        #[arg(long)]
        fence: String,
        #[arg(long)]
        ttl_ms: u64,
    },
}

/// What `run` and `soak` both need: the fault kinds, the `fencelock`
/// binary, this binary (it runs the client processes) and the seed.
fn setup(
    faults: &str,
    seed: Option<u64>,
) -> Result<
    (
        Vec<fencelock_nemesis::schedule::FaultKind>,
        PathBuf,
        PathBuf,
        u64,
    ),
    String,
> {
    let kinds = parse_kinds(faults).map_err(|e| e.to_string())?;
    let bin = harness::fencelock_bin()?;
    let me = std::env::current_exe().map_err(|e| format!("own executable path: {e}"))?;
    let seed = seed.unwrap_or_else(fencelock_nemesis::clock::monotonic_ns);
    Ok((kinds, bin, me, seed))
}

/// Prints a run's or soak's result (`print`) and says how the process
/// exits: 0 if it `passed`, 1 if not, 2 if it could not be set up.
fn exit_code<R, E: std::fmt::Display>(
    result: Result<R, E>,
    print: impl FnOnce(&R),
    passed: impl FnOnce(&R) -> bool,
) -> u8 {
    match result {
        Ok(result) => {
            print(&result);
            if passed(&result) {
                0
            } else {
                EXIT_FAILED
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_USAGE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    ExitCode::from(runtime.block_on(async_main(cli)))
}

async fn async_main(cli: Cli) -> u8 {
    match cli.command {
        Cmd::Run {
            seed,
            duration_secs,
            faults,
            out,
            clients,
        } => {
            let (kinds, bin, me, seed) = match setup(&faults, seed) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_USAGE;
                }
            };
            let mut cfg = run::RunConfig::new(seed, Duration::from_secs(duration_secs), bin, me);
            cfg.kinds = kinds;
            cfg.out_dir = out;
            cfg.clients = clients;
            exit_code(
                run::run(&cfg).await,
                |r| run::print_result(&cfg, r),
                run::RunResult::passed,
            )
        }
        Cmd::Soak {
            seed,
            duration_secs,
            fault_every_secs,
            sample_every_secs,
            faults,
            rate,
            out,
        } => {
            if fault_every_secs == 0 || sample_every_secs == 0 || duration_secs == 0 {
                eprintln!("error: the duration, --fault-every-secs and --sample-every-secs must be at least 1");
                return EXIT_USAGE;
            }
            let (kinds, bin, me, seed) = match setup(&faults, seed) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_USAGE;
                }
            };
            let mut cfg = soak::SoakConfig::new(seed, Duration::from_secs(duration_secs), bin, me);
            cfg.run.kinds = kinds;
            cfg.run.out_dir = out;
            cfg.fault_every = Duration::from_secs(fault_every_secs);
            cfg.sample_every = Duration::from_secs(sample_every_secs);
            let held = (rate * 10.0).round().max(1.0) as u32;
            cfg.background.acquire_rate_per_s = rate;
            cfg.background.held = held;
            cfg.background.resources = held.saturating_mul(10);
            println!("soak seed {seed}; replay with: {}", cfg.replay_command());
            exit_code(
                soak::soak(&cfg).await,
                |r| soak::print_result(&cfg, r),
                soak::SoakResult::passed,
            )
        }
        Cmd::Upgrade { from, seed, out } => {
            if !from.is_file() {
                eprintln!("error: --from {} is not a file", from.display());
                return EXIT_USAGE;
            }
            let (_, bin, me, seed) = match setup("all", seed) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_USAGE;
                }
            };
            let mut cfg = run::RunConfig::new(seed, Duration::ZERO, bin, me);
            cfg.out_dir = out;
            exit_code(
                run::rolling_upgrade(&cfg, &from).await,
                |r| run::print_result(&cfg, r),
                run::RunResult::passed,
            )
        }
        Cmd::Check {
            history,
            liveness_bound_ms,
            linear_max_steps,
        } => {
            let file = match std::fs::File::open(&history) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("error: {}: {e}", history.display());
                    return EXIT_USAGE;
                }
            };
            let events = match read_jsonl(std::io::BufReader::new(file)) {
                Ok(events) => events,
                Err(e) => {
                    eprintln!("error: {}: {e}", history.display());
                    return EXIT_USAGE;
                }
            };
            let history = match History::from_events(&events) {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("error: malformed history: {e}");
                    return EXIT_USAGE;
                }
            };
            let config = CheckConfig {
                liveness_bound_ms,
                linear_max_steps,
                ..CheckConfig::default()
            };
            let report = Report::new(&history, check_all(&history, &config));
            print!("{report}");
            if report.all_passed() {
                0
            } else {
                EXIT_FAILED
            }
        }
        Cmd::Hold {
            process,
            resource,
            endpoints,
            fence,
            ttl_ms,
        } => {
            holder::hold_forever(process, &resource, &endpoints, &fence, ttl_ms).await;
            0
        }
    }
}
