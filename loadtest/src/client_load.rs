//! `client-load`: load driven by a client library's own processes instead
//! of the harness's gRPC driver, so that the client's overhead (retries,
//! routing, the renewal thread, the interpreter) is what is measured.
//!
//! This module owns the run end to end: the local fencelock cluster unless
//! endpoints are given (through [`crate::cluster`]), the check that the
//! Python package is importable, `P` processes of
//! `<python> clients/python/bench.py --threads T --seconds D` started
//! together and each bounded in time (killed past `D` +
//! [`OVERRUN_MARGIN_S`]), the one JSON line each prints — bench.py's
//! output is the interface, parsed as [`ClientLine`] — and the report: per
//! process ops/s and acquire latency percentiles, and the total.
//!
//! It asserts nothing about speed; a process that fails, overruns or
//! prints no result line fails the run, so the totals are never partial.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cluster::{self, ClusterOptions, LocalCluster};
use crate::driver::{Backend, TargetKind};
use crate::error::BenchError;
use crate::suite::Machine;

/// Client processes started side by side.
pub const DEFAULT_CLIENT_PROCS: usize = 2;
/// Closed-loop threads per client process (bench.py's own default).
pub const DEFAULT_CLIENT_THREADS: u32 = 8;
/// Seconds each client process loads the cluster.
pub const DEFAULT_CLIENT_SECONDS: f64 = 10.0;
/// The interpreter that runs bench.py.
pub const DEFAULT_PYTHON: &str = "python3";
/// bench.py, relative to the repository root.
pub const BENCH_SCRIPT: &str = "clients/python/bench.py";
/// Seconds a client process may run past its `--seconds` before it is
/// killed: interpreter start-up and imports, connecting, and the last
/// operation's retries (each of bench.py's threads ends after the
/// operation in flight at `--seconds`, whose retries are bounded by the
/// client's call timeout).
pub const OVERRUN_MARGIN_S: f64 = 75.0;
/// Seconds the `import fencelock` check may take.
const IMPORT_CHECK_TIMEOUT_S: f64 = 60.0;
/// How often running client processes are polled.
const POLL_INTERVAL_MS: u64 = 50;
/// Characters of a failed process's stderr quoted in the error.
const STDERR_TAIL_CHARS: usize = 2_000;
/// The local cluster's directory under the work dir.
const CLUSTER_DIR: &str = "fencelock-client-load";
/// The report's file name under the output directory.
pub const REPORT_FILE: &str = "client-load.json";

/// Client certificate files, passed through to bench.py (for clusters
/// given with `--endpoints` that require mutual TLS).
#[derive(Clone, Debug)]
pub struct ClientTls {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ClientLoadSetup {
    /// Given endpoints; `None` = start a local cluster (no TLS).
    pub endpoints: Option<Vec<String>>,
    pub fencelock_bin: Option<PathBuf>,
    /// Parent of the local cluster's data directory.
    pub work_dir: PathBuf,
    pub shards: u32,
    pub keep_data: bool,
    /// The Python interpreter (a virtualenv's `bin/python` works).
    pub python: PathBuf,
    /// bench.py; `None` = [`find_bench_script`].
    pub script: Option<PathBuf>,
    pub procs: usize,
    pub threads: u32,
    pub seconds: f64,
    /// Lease TTL in seconds (bench.py's default without it).
    pub ttl_s: Option<f64>,
    /// Tenant prefix of the resources (bench.py's default without it).
    pub tenant: Option<String>,
    pub tls: Option<ClientTls>,
}

/// Acquire latency percentiles of one process, in ms.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

/// The JSON line bench.py prints (its output format is the interface).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ClientLine {
    pub profile: String,
    pub threads: u32,
    /// The process's own measured window.
    pub seconds: f64,
    /// Acquires plus releases per second.
    pub ops_per_s: f64,
    pub acquires_per_s: f64,
    pub acquired: u64,
    pub released: u64,
    pub errors: u64,
    pub acquire_ms: Percentiles,
    #[serde(default)]
    pub renew_batch_calls: Option<u64>,
}

/// One client process's result.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessResult {
    /// 1-based.
    pub process: usize,
    pub pid: u32,
    #[serde(flatten)]
    pub line: ClientLine,
}

/// The sums over every process.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    pub ops_per_s: f64,
    pub acquires_per_s: f64,
    pub acquired: u64,
    pub released: u64,
    pub errors: u64,
    /// The highest acquire p99 of any process (percentiles do not add up).
    pub worst_acquire_p99_ms: f64,
}

impl Totals {
    pub fn of(processes: &[ProcessResult]) -> Totals {
        processes.iter().fold(Totals::default(), |t, p| Totals {
            ops_per_s: t.ops_per_s + p.line.ops_per_s,
            acquires_per_s: t.acquires_per_s + p.line.acquires_per_s,
            acquired: t.acquired + p.line.acquired,
            released: t.released + p.line.released,
            errors: t.errors + p.line.errors,
            worst_acquire_p99_ms: t.worst_acquire_p99_ms.max(p.line.acquire_ms.p99),
        })
    }
}

/// Everything a client-load run measured.
#[derive(Clone, Debug, Serialize)]
pub struct ClientLoadReport {
    pub client: &'static str,
    pub python: PathBuf,
    pub script: PathBuf,
    pub endpoints: Vec<String>,
    /// Whether the cluster was started by this run.
    pub local_cluster: bool,
    pub client_procs: usize,
    pub threads_per_proc: u32,
    pub seconds: f64,
    pub processes: Vec<ProcessResult>,
    pub total: Totals,
    pub machine: Machine,
}

impl ClientLoadReport {
    /// Writes [`REPORT_FILE`] under `out`; returns its path.
    pub fn write(&self, out: &Path) -> Result<PathBuf, BenchError> {
        std::fs::create_dir_all(out).map_err(|e| BenchError::io(out, e))?;
        let path = out.join(REPORT_FILE);
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(&path, json + "\n").map_err(|e| BenchError::io(&path, e))?;
        Ok(path)
    }

    /// A plain-text table: one row per process, then the total.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} × {} {}, {} threads each, {} s, on {}\n",
            self.client_procs,
            self.python.display(),
            self.script.display(),
            self.threads_per_proc,
            self.seconds,
            self.endpoints.join(",")
        );
        s.push_str(&format!(
            "{:>7} {:>9} {:>10} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9}\n",
            "process",
            "ops/s",
            "acquire/s",
            "acquired",
            "released",
            "errors",
            "p50 ms",
            "p95 ms",
            "p99 ms"
        ));
        for p in &self.processes {
            let l = &p.line;
            s.push_str(&format!(
                "{:>7} {:>9.1} {:>10.1} {:>9} {:>9} {:>6} {:>9.2} {:>9.2} {:>9.2}\n",
                p.process,
                l.ops_per_s,
                l.acquires_per_s,
                l.acquired,
                l.released,
                l.errors,
                l.acquire_ms.p50,
                l.acquire_ms.p95,
                l.acquire_ms.p99
            ));
        }
        let t = &self.total;
        s.push_str(&format!(
            "{:>7} {:>9.1} {:>10.1} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9.2} (worst)\n",
            "total",
            t.ops_per_s,
            t.acquires_per_s,
            t.acquired,
            t.released,
            t.errors,
            "",
            "",
            t.worst_acquire_p99_ms
        ));
        s
    }
}

/// bench.py: `explicit`, else [`BENCH_SCRIPT`] under the working directory
/// or one of its parents, else under the repository this program was built
/// from.
pub fn find_bench_script(explicit: Option<&Path>) -> Result<PathBuf, BenchError> {
    if let Some(p) = explicit {
        return if p.is_file() {
            std::path::absolute(p).map_err(|e| BenchError::io(p, e))
        } else {
            Err(BenchError::ProgramNotFound {
                program: p.display().to_string(),
                hint: "--bench-script names no file".to_owned(),
            })
        };
    }
    let cwd = std::env::current_dir().ok();
    let from_cwd = cwd
        .iter()
        .flat_map(|d| d.ancestors())
        .map(|d| d.join(BENCH_SCRIPT));
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|repo| repo.join(BENCH_SCRIPT));
    from_cwd
        .chain(built_from)
        .find(|p| p.is_file())
        .ok_or_else(|| BenchError::ProgramNotFound {
            program: BENCH_SCRIPT.to_owned(),
            hint: "run from the repository, or pass --bench-script".to_owned(),
        })
}

/// Checks the arguments, starts a local cluster unless endpoints were
/// given, runs the client processes and stops the cluster.
pub async fn run(setup: &ClientLoadSetup) -> Result<ClientLoadReport, BenchError> {
    check_setup(setup)?;
    let script = find_bench_script(setup.script.as_deref())?;
    // A path like `.venv/bin/python` is made absolute, since the import
    // check runs in the script's directory; a bare name is found on PATH.
    let python = if setup.python.components().count() > 1 {
        std::path::absolute(&setup.python).map_err(|e| BenchError::io(&setup.python, e))?
    } else {
        setup.python.clone()
    };
    // Before any cluster is started: a missing package is the likeliest
    // mistake, and the cheapest to report.
    let (checked, dir) = (python.clone(), script.parent().map(Path::to_owned));
    tokio::task::spawn_blocking(move || check_importable(&checked, dir.as_deref()))
        .await
        .map_err(|e| BenchError::Client(format!("import check: {e}")))??;

    let mut cluster = match &setup.endpoints {
        Some(_) => None,
        None => Some(start_cluster(setup)?),
    };
    let endpoints = match (&setup.endpoints, &cluster) {
        (Some(e), _) => e.clone(),
        (None, Some(c)) => c.endpoints(),
        (None, None) => unreachable!("a cluster is started when no endpoints are given"),
    };
    if let Some(c) = cluster.as_mut() {
        let backend = Backend::connect(TargetKind::Fencelock, &endpoints, 1, Vec::new()).await?;
        if let Err(e) = backend.wait_ready().await {
            c.check_alive()?;
            return Err(e);
        }
    }
    let args = client_args(setup, &endpoints);
    let (py, sc, procs, seconds) = (python.clone(), script.clone(), setup.procs, setup.seconds);
    let processes = tokio::task::spawn_blocking(move || drive(&py, &sc, &args, procs, seconds))
        .await
        .map_err(|e| BenchError::Client(format!("client processes: {e}")))??;
    if let Some(c) = cluster.as_mut() {
        c.stop();
    }
    let total = Totals::of(&processes);
    Ok(ClientLoadReport {
        client: "python",
        python,
        script,
        endpoints,
        local_cluster: cluster.is_some(),
        client_procs: setup.procs,
        threads_per_proc: setup.threads,
        seconds: setup.seconds,
        processes,
        total,
        machine: Machine::probe(None),
    })
}

fn check_setup(setup: &ClientLoadSetup) -> Result<(), BenchError> {
    let invalid = |m: &str| Err(BenchError::InvalidArgument(m.to_owned()));
    if setup.procs == 0 {
        return invalid("--client-procs must be at least 1");
    }
    if setup.threads == 0 {
        return invalid("--threads must be at least 1");
    }
    if !(setup.seconds > 0.0 && setup.seconds.is_finite()) {
        return invalid("--seconds must be a positive number");
    }
    if setup.tls.is_some() && setup.endpoints.is_none() {
        return invalid("the local cluster runs without TLS; client certificates need --endpoints");
    }
    Ok(())
}

fn start_cluster(setup: &ClientLoadSetup) -> Result<LocalCluster, BenchError> {
    LocalCluster::start_fencelock(ClusterOptions {
        kind: TargetKind::Fencelock,
        program: cluster::find_fencelock(setup.fencelock_bin.as_deref())?,
        dir: setup.work_dir.join(CLUSTER_DIR),
        shards: setup.shards,
        snapshot_entries: None,
        slow_disk_node: None,
        keep: setup.keep_data,
    })
}

/// bench.py's arguments (everything but the script itself).
fn client_args(setup: &ClientLoadSetup, endpoints: &[String]) -> Vec<String> {
    let mut args = vec![
        "--endpoints".to_owned(),
        endpoints.join(","),
        "--threads".to_owned(),
        setup.threads.to_string(),
        "--seconds".to_owned(),
        setup.seconds.to_string(),
    ];
    if let Some(ttl) = setup.ttl_s {
        args.extend(["--ttl".to_owned(), ttl.to_string()]);
    }
    if let Some(tenant) = &setup.tenant {
        args.extend(["--tenant".to_owned(), tenant.clone()]);
    }
    if let Some(tls) = &setup.tls {
        for (flag, path) in [
            ("--ca-file", &tls.ca_file),
            ("--cert-file", &tls.cert_file),
            ("--key-file", &tls.key_file),
        ] {
            args.extend([flag.to_owned(), path.display().to_string()]);
        }
    }
    args
}

fn not_installed(python: &Path, detail: &str) -> BenchError {
    BenchError::ClientNotInstalled {
        python: python.display().to_string(),
        detail: detail.trim().lines().last().unwrap_or("").to_owned(),
    }
}

/// Whether `python` can import the `fencelock` package, from `dir` (the
/// script's directory, first on the script's `sys.path`).
fn check_importable(python: &Path, dir: Option<&Path>) -> Result<(), BenchError> {
    let args = ["-c".to_owned(), "import fencelock".to_owned()];
    let child = spawn(python, &args, dir)?;
    let deadline = Instant::now() + Duration::from_secs_f64(IMPORT_CHECK_TIMEOUT_S);
    let done = wait_bounded(child, deadline)?;
    match done.status {
        Some(s) if s.success() => Ok(()),
        Some(_) => Err(not_installed(python, &done.stderr)),
        None => Err(BenchError::Client(format!(
            "`{} -c 'import fencelock'` did not finish within {IMPORT_CHECK_TIMEOUT_S} s",
            python.display()
        ))),
    }
}

/// A process with its output being collected.
struct Running {
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

/// A process that ended, or was killed (`status: None`).
struct Finished {
    pid: u32,
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

fn spawn(python: &Path, args: &[String], dir: Option<&Path>) -> Result<Running, BenchError> {
    let mut command = Command::new(python);
    if let Some(d) = dir {
        command.current_dir(d);
    }
    // A client process dies with this harness (killed or crashed), so an
    // interrupted run leaves no load behind.
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: prctl is async-signal-safe and touches only this child.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => BenchError::ProgramNotFound {
                program: python.display().to_string(),
                hint: "pass --python (a virtualenv's bin/python works)".to_owned(),
            },
            _ => BenchError::Client(format!("cannot start {}: {e}", python.display())),
        })?;
    // Read both pipes while the process runs, so that it never blocks on a
    // full one.
    fn collect(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    }
    let stdout = collect(child.stdout.take());
    let stderr = collect(child.stderr.take());
    Ok(Running {
        child,
        stdout,
        stderr,
    })
}

/// Waits for one process until `deadline`, then kills it.
fn wait_bounded(running: Running, deadline: Instant) -> Result<Finished, BenchError> {
    wait_all(vec![running], deadline).map(|mut v| v.remove(0))
}

/// Waits for every process until `deadline`; kills those still running
/// then.
fn wait_all(mut running: Vec<Running>, deadline: Instant) -> Result<Vec<Finished>, BenchError> {
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; running.len()];
    // A failed wait ends the waiting, but not before every process still
    // running is killed and reaped below: none is left behind.
    let mut wait_error = None;
    'polling: loop {
        for (r, status) in running.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                match r.child.try_wait() {
                    Ok(s) => *status = s,
                    Err(e) => {
                        wait_error = Some(BenchError::Client(format!("waiting for a client: {e}")));
                        break 'polling;
                    }
                }
            }
        }
        if statuses.iter().all(Option::is_some) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
    let finished: Vec<Finished> = running
        .into_iter()
        .zip(statuses)
        .map(|(mut r, status)| {
            if status.is_none() {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            Finished {
                pid: r.child.id(),
                status,
                stdout: r.stdout.join().unwrap_or_default(),
                stderr: r.stderr.join().unwrap_or_default(),
            }
        })
        .collect();
    match wait_error {
        Some(e) => Err(e),
        None => Ok(finished),
    }
}

fn tail(text: &str) -> &str {
    let start = text.len().saturating_sub(STDERR_TAIL_CHARS);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].trim()
}

/// The result line: the last line of `stdout` that is a JSON object.
pub fn parse_line(stdout: &str) -> Result<ClientLine, String> {
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| "printed no result line".to_owned())?;
    serde_json::from_str(line).map_err(|e| format!("result line {line:?}: {e}"))
}

/// Starts `procs` client processes together, waits for them (bounded) and
/// parses their results.
fn drive(
    python: &Path,
    script: &Path,
    args: &[String],
    procs: usize,
    seconds: f64,
) -> Result<Vec<ProcessResult>, BenchError> {
    let mut full = vec![script.display().to_string()];
    full.extend_from_slice(args);
    let mut running = Vec::with_capacity(procs);
    for _ in 0..procs {
        match spawn(python, &full, None) {
            Ok(r) => running.push(r),
            Err(e) => {
                // Do not leave the ones already started behind.
                let _ = wait_all(running, Instant::now());
                return Err(e);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds + OVERRUN_MARGIN_S);
    let finished = wait_all(running, deadline)?;
    let mut results = Vec::with_capacity(procs);
    for (i, f) in finished.into_iter().enumerate() {
        let process = i + 1;
        let failed = |reason: String| BenchError::ClientProcess {
            process,
            reason,
            stderr: tail(&f.stderr).to_owned(),
        };
        match f.status {
            None => {
                return Err(failed(format!(
                    "still running {OVERRUN_MARGIN_S} s after its {seconds} s; killed"
                )))
            }
            Some(s) if !s.success() => {
                if f.stderr.contains("No module named 'fencelock'") {
                    return Err(not_installed(python, &f.stderr));
                }
                return Err(failed(format!("exited with {s}")));
            }
            Some(_) => {}
        }
        let line = parse_line(&f.stdout).map_err(failed)?;
        results.push(ProcessResult {
            process,
            pid: f.pid,
            line,
        });
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"profile": "python-acquire-release", "threads": 2, "seconds": 2.01,
        "ops_per_s": 310.5, "acquires_per_s": 155.2, "acquired": 312, "released": 312,
        "errors": 0, "acquire_ms": {"p50": 5.1, "p95": 9.8, "p99": 14.0},
        "renew_batch_calls": 0}"#;

    fn result(process: usize, ops_per_s: f64, acquired: u64, p99: f64) -> ProcessResult {
        let mut line = parse_line(&LINE.replace('\n', " ")).expect("parses");
        line.ops_per_s = ops_per_s;
        line.acquired = acquired;
        line.acquire_ms.p99 = p99;
        ProcessResult {
            process,
            pid: 1,
            line,
        }
    }

    #[test]
    fn parses_the_last_json_line_of_bench_py() {
        let out = format!("some warning\n{}\n", LINE.replace('\n', " "));
        let line = parse_line(&out).expect("parses");
        assert_eq!(line.acquired, 312);
        assert_eq!(line.acquire_ms.p99, 14.0);
        assert_eq!(line.renew_batch_calls, Some(0));
    }

    #[test]
    fn no_result_line_is_an_error() {
        assert!(parse_line("").is_err());
        assert!(parse_line("Traceback (most recent call last):\n").is_err());
        assert!(parse_line("{\"ops_per_s\": 1}").is_err());
    }

    #[test]
    fn totals_are_sums_and_the_worst_p99() {
        let t = Totals::of(&[result(1, 100.0, 50, 7.0), result(2, 50.5, 25, 9.5)]);
        assert_eq!(t.ops_per_s, 150.5);
        assert_eq!(t.acquired, 75);
        assert_eq!(t.worst_acquire_p99_ms, 9.5);
    }

    #[test]
    fn passes_tls_and_options_to_bench_py() {
        let setup = ClientLoadSetup {
            endpoints: Some(vec!["a:1".to_owned(), "b:2".to_owned()]),
            fencelock_bin: None,
            work_dir: PathBuf::from("w"),
            shards: 1,
            keep_data: false,
            python: PathBuf::from(DEFAULT_PYTHON),
            script: None,
            procs: 2,
            threads: 3,
            seconds: 1.5,
            ttl_s: Some(5.0),
            tenant: None,
            tls: Some(ClientTls {
                ca_file: "ca".into(),
                cert_file: "c".into(),
                key_file: "k".into(),
            }),
        };
        let args = client_args(&setup, &["a:1".to_owned(), "b:2".to_owned()]);
        assert_eq!(
            args.join(" "),
            "--endpoints a:1,b:2 --threads 3 --seconds 1.5 --ttl 5 \
             --ca-file ca --cert-file c --key-file k"
        );
        let mut local = setup.clone();
        local.endpoints = None;
        assert!(check_setup(&local).is_err(), "TLS needs --endpoints");
    }
}
