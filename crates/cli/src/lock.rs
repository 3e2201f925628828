//! `fencelock lock <resource> -- <command...>`: runs a command while holding
//! a lock.
//!
//! The lease is taken and kept alive by the client library
//! (`fencelock-client`); the command gets the fencing token in its
//! environment and must pass it to the protected system. When the lock is
//! lost (a renewal answered LEASE_NOT_HELD, or the stop-by deadline passed
//! unconfirmed) the command is told to stop with SIGTERM and killed with
//! SIGKILL after a grace period, because it no longer holds the lock. When
//! the command ends by itself the lease is released and its exit code
//! becomes ours.
//!
//! The command runs in its own process group (unless `--foreground`), so
//! the signals reach everything it started, not only the first process:
//! work that outlives a lost lock is exactly what a lock must prevent.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use clap::Args;
use fencelock_client::{Client, ClientConfig, ClientError, LockGuard, LostReason};

use super::client::exit_code_of;
use super::diagnose::Diagnosis;
use super::json::Object;
use super::{Output, ShutdownSignals, EXIT_OK, EXIT_OTHER, EXIT_USAGE};

/// The lock was lost while the command ran; the command was stopped.
pub const EXIT_LOCK_LOST: u8 = 5;
/// The command was found but could not be started (shell convention).
pub const EXIT_CANNOT_RUN: u8 = 126;
/// The command was not found (shell convention).
pub const EXIT_NOT_FOUND: u8 = 127;
/// A process killed by signal N exits, by shell convention, with 128 + N.
const SIGNAL_EXIT_BASE: u8 = 128;

/// Default time between SIGTERM and SIGKILL. Short, because after a lost
/// lock another holder may already be working: the command should only
/// have time to stop cleanly, not to finish.
const DEFAULT_GRACE_MS: u64 = 3_000;
/// Longest accepted grace period.
const MAX_GRACE_MS: u64 = 600_000;

/// How long a release after a lost lock may take. Best effort: the lease
/// is probably gone already, and when the cluster is unreachable (a common
/// reason for losing it) waiting would only delay the exit code that tells
/// the caller to react.
const LOST_RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// The environment variables the command gets.
pub const ENV_TOKEN: &str = "FENCELOCK_TOKEN";
pub const ENV_LEASE_ID: &str = "FENCELOCK_LEASE_ID";
pub const ENV_RESOURCE: &str = "FENCELOCK_RESOURCE";

/// The exit codes of `lock`, as shown by `fencelock lock --help`.
pub const LOCK_EXIT_CODES_HELP: &str = "\
Environment of the command:
  FENCELOCK_TOKEN     the fencing token: pass it with every protected write
  FENCELOCK_LEASE_ID  the lease id in hex (a credential: do not log it)
  FENCELOCK_RESOURCE  the resource name

Exit codes:
  the command's own exit code when it ran and ended by itself (128+N if a
     signal N ended it), after the lease was released
  0  success (the command exited 0)
  1  the lock is held by someone else (LOCK_HELD, WAIT_TIMED_OUT, QUEUE_FULL,
     TENANT_WAITERS_EXCEEDED, TENANT_QUOTA_EXCEEDED); the command did not run
  2  usage error: bad arguments or a request the server refused as malformed
  3  unavailable: no server reachable, no leader, no quorum, or a deadline
     passed, after retries; the command did not run
  4  any other error before the command ran
  5  the lock was lost while the command ran: it was sent SIGTERM, then
     SIGKILL after --grace-ms
  126  the command could not be started (not executable; the lock was
       not taken)
  127  the command was not found (the lock was not taken)
With --output json the first and last lines on stdout are fencelock's
(`\"event\": \"acquired\"` and `\"event\": \"exited\"`), whatever the command
prints in between.";

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The resource, `tenant/path` (for example `demo/backup`).
    resource: String,
    /// Lease TTL in milliseconds; renewed at about a third of it. Absent: the
    /// server's default (30000).
    #[arg(long, value_name = "MS")]
    ttl_ms: Option<u64>,
    /// Wait up to this long in the resource's queue if it is held. 0: fail
    /// at once (exit 1) without running the command.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    wait_ms: u64,
    /// What the lease publishes while it holds (`fencelock get` shows it):
    /// for an election, the leader's address. At most 4096 bytes. Refused
    /// (FEATURE_NOT_ENABLED) while a member runs a build without values.
    #[arg(long, value_name = "TEXT")]
    value: Option<String>,
    #[command(flatten)]
    mode: super::ModeArgs,
    /// Nodes of the cluster, comma-separated (any of them; the client finds
    /// each shard's leader). Default: $FENCELOCK_ENDPOINTS, else
    /// $FENCELOCK_ENDPOINT, else http://127.0.0.1:7001.
    #[arg(
        long,
        alias = "endpoint",
        env = "FENCELOCK_ENDPOINTS",
        value_delimiter = ',',
        value_name = "HOST:PORT,..."
    )]
    endpoints: Vec<String>,
    /// How long the command gets to stop after SIGTERM (lock lost, or
    /// fencelock interrupted) before SIGKILL.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_GRACE_MS,
          value_parser = clap::value_parser!(u64).range(0..=MAX_GRACE_MS))]
    grace_ms: u64,
    /// Run the command in fencelock's process group instead of its own, so
    /// it may read from the terminal. Signals then reach only the command's
    /// first process, not what it started.
    #[arg(long)]
    foreground: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Human)]
    output: Output,
    /// Print retries and renewals to stderr.
    #[arg(long, short)]
    verbose: bool,
    #[command(flatten)]
    tls: super::TlsArgs,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// How the command ended.
enum Ending {
    /// It exited by itself.
    Exited(ExitStatus),
    /// The lock was lost; it was stopped.
    Lost(LostReason, ExitStatus),
    /// fencelock was interrupted; the signal was passed on.
    Interrupted(&'static str, ExitStatus),
}

pub async fn run(args: LockArgs) -> u8 {
    run_with(args, false).await
}

/// `fencelock elect`: campaign (wait in the queue for as long as it takes)
/// instead of one acquire, then as `lock`.
pub async fn elect(args: LockArgs) -> u8 {
    run_with(args, true).await
}

async fn run_with(args: LockArgs, campaign: bool) -> u8 {
    if args.verbose {
        init_verbose_logging();
    }
    // A command that cannot be run is found out before the lock is taken:
    // acquiring it only to give it back would still make a grant (a token
    // spent, a waiter behind it delayed).
    if let Err((code, message)) = check_runnable(&args.command[0]) {
        eprintln!(
            "error: cannot run {:?}: {message}; the lock was not taken",
            args.command[0]
        );
        report_exit(&args, code, None, None, Released::NotTaken);
        return code;
    }
    // Before the acquire: a Ctrl-C while waiting in the queue must drop the
    // acquire (which leaves the queue), not kill the process mid-call.
    let mut signals = match ShutdownSignals::new() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("error: cannot install signal handlers: {e}");
            return EXIT_OTHER;
        }
    };
    let tls = match args.tls.client_tls() {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let config = ClientConfig {
        tls,
        ..ClientConfig::default()
    };
    let client = match Client::connect(super::resolve_endpoints(&args.endpoints), config).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("error: {e}");
            return exit_code_of(&e);
        }
    };
    let ttl_ms = args.ttl_ms.unwrap_or(0);
    let value = args.value.clone().unwrap_or_default().into_bytes();
    let take = async {
        if campaign {
            client
                .election(args.resource.as_str())
                .campaign(value, ttl_ms)
                .await
        } else {
            let options = fencelock_client::AcquireOptions {
                lease_ttl_ms: ttl_ms,
                wait_timeout_ms: args.wait_ms,
                value,
                mode: args.mode.mode(),
                ..Default::default()
            };
            client.acquire_with(&args.resource, options).await
        }
    };
    let acquired = tokio::select! {
        result = take => result,
        signal = signals.recv() => {
            eprintln!("fencelock: {signal} while acquiring {}; gave up", args.resource);
            return SIGNAL_EXIT_BASE + signal_number(signal) as u8;
        }
    };
    let guard = match acquired {
        Ok(guard) => guard,
        Err(e) => {
            let diagnosis = match e {
                ClientError::Unavailable { .. } => Some(
                    Diagnosis::of(&super::resolve_endpoints(&args.endpoints), args.tls.given())
                        .await,
                ),
                _ => None,
            };
            return report_acquire_failure(&args, &e, diagnosis.as_ref());
        }
    };
    report_acquired(&args, &guard);

    let mut child = match spawn(&args, &guard) {
        Ok(child) => child,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_CANNOT_RUN,
            };
            eprintln!(
                "error: cannot run {:?}: {e}",
                args.command[0].to_string_lossy()
            );
            let released = release(guard).await;
            report_exit(&args, code, None, None, released);
            return code;
        }
    };
    let grace = Duration::from_millis(args.grace_ms);
    let target = Target::of(&child, args.foreground);

    let ending = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => Ending::Exited(status),
            Err(e) => {
                eprintln!("error: lost track of the command: {e}");
                let status = stop(&mut child, target, Signal::Term, grace, &mut signals).await;
                Ending::Exited(status)
            }
        },
        reason = guard.lost() => {
            eprintln!(
                "error: LOCK_LOST: {reason}; stopping the command (SIGTERM, SIGKILL after {} ms)",
                args.grace_ms
            );
            let status = stop(&mut child, target, Signal::Term, grace, &mut signals).await;
            Ending::Lost(reason, status)
        }
        signal = signals.recv() => {
            let status = stop(&mut child, target, Signal::from_name(signal), grace, &mut signals).await;
            Ending::Interrupted(signal, status)
        }
    };

    if let Ending::Interrupted(signal, status) = &ending {
        eprintln!(
            "fencelock: {signal} received; passed it on to the command, which ended with {status}"
        );
    }
    match ending {
        Ending::Exited(status) | Ending::Interrupted(_, status) => {
            let code = child_exit_code(status);
            let released = release(guard).await;
            report_exit(&args, code, Some(status), None, released);
            code
        }
        Ending::Lost(reason, status) => {
            // The lease may still be held when only its confirmation was
            // missing: give it back so the next holder need not wait.
            let released = tokio::time::timeout(LOST_RELEASE_TIMEOUT, release(guard))
                .await
                .unwrap_or_else(|_| Released::Failed("timed out".to_owned()));
            report_exit(&args, EXIT_LOCK_LOST, Some(status), Some(reason), released);
            EXIT_LOCK_LOST
        }
    }
}

pub(crate) fn init_verbose_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("fencelock_client=debug"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn spawn(args: &LockArgs, guard: &LockGuard) -> std::io::Result<tokio::process::Child> {
    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env(ENV_TOKEN, guard.token().to_string())
        .env(ENV_LEASE_ID, hex::encode(guard.lease_id()))
        .env(ENV_RESOURCE, guard.resource())
        // If fencelock itself dies, the command must not go on unguarded.
        .kill_on_drop(true);
    #[cfg(unix)]
    if !args.foreground {
        command.process_group(0);
    }
    command.spawn()
}

/// Who gets the signals: the command's process group, or only the command.
#[derive(Clone, Copy, Debug)]
enum Target {
    Group(i32),
    Process(i32),
    Unknown,
}

impl Target {
    fn of(child: &tokio::process::Child, foreground: bool) -> Target {
        match child.id().and_then(|id| i32::try_from(id).ok()) {
            // With `process_group(0)` the command leads a group whose id is
            // its pid.
            Some(pid) if !foreground => Target::Group(pid),
            Some(pid) => Target::Process(pid),
            None => Target::Unknown,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    Term,
    Int,
    Kill,
}

impl Signal {
    /// The signal fencelock received, to pass on.
    fn from_name(name: &str) -> Signal {
        match name {
            "SIGINT" => Signal::Int,
            _ => Signal::Term,
        }
    }
}

fn signal_number(name: &str) -> i32 {
    match name {
        "SIGINT" => 2,
        _ => 15,
    }
}

#[cfg(unix)]
fn send(target: Target, signal: Signal) {
    let signo = match signal {
        Signal::Term => libc::SIGTERM,
        Signal::Int => libc::SIGINT,
        Signal::Kill => libc::SIGKILL,
    };
    let pid = match target {
        Target::Group(pgid) => -pgid,
        Target::Process(pid) => pid,
        Target::Unknown => return,
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours. The
    // pid (or group) is our own child's, which we have not yet reaped, so it
    // cannot have been reused by an unrelated process.
    let rc = unsafe { libc::kill(pid, signo) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        // ESRCH: it is already gone, which is what we wanted.
        if e.raw_os_error() != Some(libc::ESRCH) {
            eprintln!("warning: cannot signal the command: {e}");
        }
    }
}

/// Sends `first` to the command, waits up to `grace` for it to exit, then
/// kills it (at once if fencelock is signalled again meanwhile).
async fn stop(
    child: &mut tokio::process::Child,
    target: Target,
    first: Signal,
    grace: Duration,
    signals: &mut ShutdownSignals,
) -> ExitStatus {
    #[cfg(unix)]
    send(target, first);
    #[cfg(not(unix))]
    let _ = (target, first, child.start_kill());
    let deadline = Instant::now() + grace;
    tokio::select! {
        status = child.wait() => {
            if let Ok(status) = status {
                return status;
            }
        }
        () = tokio::time::sleep_until(deadline.into()) => {
            eprintln!("fencelock: the command did not stop within {} ms; sending SIGKILL", grace.as_millis());
        }
        signal = signals.recv() => {
            eprintln!("fencelock: {signal} again; sending SIGKILL");
        }
    }
    #[cfg(unix)]
    send(target, Signal::Kill);
    let _ = child.start_kill();
    loop {
        match child.wait().await {
            Ok(status) => return status,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("error: cannot wait for the command: {e}");
                return std::process::ExitStatus::default();
            }
        }
    }
}

/// The command's exit code, or 128 + the signal that ended it.
fn child_exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(EXIT_OTHER);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return SIGNAL_EXIT_BASE.saturating_add(u8::try_from(signal).unwrap_or(0));
        }
    }
    EXIT_OTHER
}

/// Whether `program` can be started: a path must name an executable file,
/// a bare name must be one on `$PATH`. The error is the exit code (127 not
/// found, 126 not executable) and why.
fn check_runnable(program: &std::ffi::OsStr) -> Result<(), (u8, String)> {
    use std::path::{Path, PathBuf};
    fn executable(path: &Path) -> Option<bool> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            Some(meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        }
        #[cfg(not(unix))]
        Some(meta.is_file())
    }
    let path = Path::new(program);
    if path.components().count() > 1 || program.to_string_lossy().contains('/') {
        return match executable(path) {
            None => Err((EXIT_NOT_FOUND, "no such file".to_owned())),
            Some(false) => Err((EXIT_CANNOT_RUN, "not an executable file".to_owned())),
            Some(true) => Ok(()),
        };
    }
    let dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if dirs
        .iter()
        .any(|dir| executable(&dir.join(program)) == Some(true))
    {
        Ok(())
    } else {
        Err((EXIT_NOT_FOUND, "not found on $PATH".to_owned()))
    }
}

/// What came of the release after the command ended.
enum Released {
    /// The command could not be run, so the lock was never taken.
    NotTaken,
    Yes,
    /// The lease no longer held the lock (it had been lost or expired).
    NotHeld,
    Failed(String),
}

async fn release(guard: LockGuard) -> Released {
    match guard.release().await {
        Ok(true) => Released::Yes,
        Ok(false) => Released::NotHeld,
        Err(e) => Released::Failed(e.to_string()),
    }
}

fn report_acquire_failure(
    args: &LockArgs,
    error: &ClientError,
    diagnosis: Option<&Diagnosis>,
) -> u8 {
    let code = exit_code_of(error);
    eprintln!("error: {error}");
    // Only a request that reached a node's lock service may have been
    // granted; one that never got a connection, or met only TLS mismatches,
    // cannot have been.
    let reached = Diagnosis::may_have_reached_a_node(diagnosis);
    if let ClientError::Unavailable {
        request_id: Some(id),
        sent: true,
        ..
    } = error
    {
        if reached {
            eprintln!(
                "note: the acquire may have been granted; it expires unless renewed (retry \
                 with `fencelock acquire {} --request-id {id}` to learn its outcome)",
                args.resource
            );
        }
    }
    if let Some(diagnosis) = diagnosis {
        diagnosis.print();
    }
    if args.output == Output::Json {
        let mut object = Object::new()
            .with("ok", false)
            .with("event", "not_acquired")
            .with("resource", args.resource.as_str())
            .with("exit_code", u64::from(code))
            .with("message", error.to_string());
        if let Some(reason) = error.reason() {
            let name = reason.as_str_name();
            object = object.with("reason", name.strip_prefix("REASON_").unwrap_or(name));
        }
        println!("{}", object.render());
    }
    code
}

fn report_acquired(args: &LockArgs, guard: &LockGuard) {
    match args.output {
        Output::Json => {
            let object = Object::new()
                .with("ok", true)
                .with("event", "acquired")
                .with("resource", guard.resource())
                .with("fencing_token", guard.token())
                .with("lease_ttl_ms", guard.lease_ttl_ms())
                .with("expires_at_ms", guard.expires_at_ms())
                .with("shard_id", guard.shard_id());
            println!("{}", object.render());
        }
        Output::Human => eprintln!(
            "fencelock: acquired {} (fencing token {}, ttl {} ms); running {}",
            guard.resource(),
            guard.token(),
            guard.lease_ttl_ms(),
            args.command[0].to_string_lossy()
        ),
    }
}

fn report_exit(
    args: &LockArgs,
    code: u8,
    status: Option<ExitStatus>,
    lost: Option<LostReason>,
    released: Released,
) {
    if let Released::Failed(e) = &released {
        eprintln!("warning: release failed; the lease expires by itself: {e}");
    }
    match args.output {
        Output::Json => {
            let mut object = Object::new()
                .with("ok", code == EXIT_OK)
                .with("event", "exited")
                .with("resource", args.resource.as_str())
                .with("exit_code", u64::from(code))
                .with("lock_lost", lost.is_some());
            if let Some(reason) = lost {
                object = object.with("lost_reason", lost_reason_name(reason));
            }
            if let Some(status) = status {
                if let Some(c) = status.code() {
                    object = object.with("command_exit_code", i64::from(c));
                }
                #[cfg(unix)]
                {
                    use std::os::unix::process::ExitStatusExt as _;
                    if let Some(signal) = status.signal() {
                        object = object.with("command_signal", i64::from(signal));
                    }
                }
            }
            object = object.with("released", matches!(released, Released::Yes));
            println!("{}", object.render());
        }
        Output::Human => {
            if args.verbose {
                match released {
                    Released::Yes => eprintln!("fencelock: released {}", args.resource),
                    Released::NotHeld => eprintln!(
                        "fencelock: {} was no longer held by this lease",
                        args.resource
                    ),
                    Released::Failed(_) | Released::NotTaken => {}
                }
            }
        }
    }
}

fn lost_reason_name(reason: LostReason) -> &'static str {
    match reason {
        LostReason::NotHeld => "LEASE_NOT_HELD",
        LostReason::Unconfirmed => "RENEWAL_UNCONFIRMED",
        LostReason::Released => "RELEASED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cli;
    use crate::{EXIT_LOCK, EXIT_UNAVAILABLE};
    use clap::{CommandFactory, Parser};

    fn parse(args: &[&str]) -> LockArgs {
        let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match cli.command {
            crate::Command::Lock(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn the_command_follows_the_double_dash() {
        let args = parse(&[
            "fencelock",
            "lock",
            "demo/a",
            "--ttl-ms",
            "3000",
            "--endpoints",
            "127.0.0.1:1,127.0.0.1:2",
            "--",
            "sh",
            "-c",
            "echo --ttl-ms",
        ]);
        assert_eq!(args.resource, "demo/a");
        assert_eq!(args.ttl_ms, Some(3000));
        assert_eq!(args.endpoints, vec!["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(args.command, vec!["sh", "-c", "echo --ttl-ms"]);
        assert_eq!(args.grace_ms, DEFAULT_GRACE_MS);
    }

    #[test]
    fn a_command_is_required() {
        assert!(Cli::try_parse_from(["fencelock", "lock", "demo/a"]).is_err());
        assert!(Cli::try_parse_from(["fencelock", "lock", "demo/a", "--"]).is_err());
    }

    #[test]
    fn help_lists_the_lock_exit_codes_and_environment() {
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("lock")
            .unwrap()
            .render_long_help()
            .to_string();
        for text in [
            "Exit codes:",
            "5  the lock was lost",
            "127",
            "FENCELOCK_TOKEN",
            "FENCELOCK_LEASE_ID",
        ] {
            assert!(help.contains(text), "{text:?} missing from:\n{help}");
        }
    }

    #[test]
    fn child_exit_codes_pass_through_and_signals_add_128() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(child_exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(child_exit_code(ExitStatus::from_raw(0)), 0);
        // Killed by SIGKILL (9).
        assert_eq!(child_exit_code(ExitStatus::from_raw(9)), 137);
    }

    #[test]
    fn acquire_failures_map_to_the_documented_codes() {
        use fencelock_api::v1::{ErrorDetail, Reason};
        let rejected = |reason| ClientError::Rejected(Box::new(ErrorDetail::new(reason, "")));
        assert_eq!(exit_code_of(&rejected(Reason::LockHeld)), EXIT_LOCK);
        assert_eq!(exit_code_of(&rejected(Reason::WaitTimedOut)), EXIT_LOCK);
        assert_eq!(exit_code_of(&rejected(Reason::InvalidResource)), EXIT_USAGE);
        let unavailable = ClientError::Unavailable {
            timeout_ms: 1,
            attempts: 1,
            last_error: String::new(),
            request_id: None,
            sent: true,
        };
        assert_eq!(exit_code_of(&unavailable), EXIT_UNAVAILABLE);
    }
}
