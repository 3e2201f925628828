//! Command-line interface of the `fencelock` binary (`main.rs` parses the
//! arguments and calls [`run`]).
//!
//! * `serve --config PATH` runs one node until Ctrl-C or SIGTERM.
//! * `config check PATH` validates a config file.
//! * `dev` writes configs for a local cluster and runs one `serve` child
//!   process per node ([`dev`]).
//! * `acquire`, `renew`, `release`, `get` are a minimal client ([`client`]).
//! * `lock <resource> -- <command>` runs a command while holding a lock,
//!   through the client library ([`lock`]).
//! * `admin ...` are the operator commands ([`admin`]).
//!
//! Exit codes are the same for every subcommand ([`EXIT_CODES_HELP`]).

mod admin;
mod client;
mod dev;
mod diagnose;
mod json;
mod lock;

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use fencelock_config::{ConfigError, NodeConfig};
use fencelock_server::errors::ServerError;
use fencelock_server::node::Node;

/// Success.
pub const EXIT_OK: u8 = 0;
/// The lock is held by someone else, or the lease does not hold it.
pub const EXIT_LOCK: u8 = 1;
/// Bad command line, bad config file, or a request the server refused as
/// malformed.
pub const EXIT_USAGE: u8 = 2;
/// The service could not be reached or could not answer (after retries).
pub const EXIT_UNAVAILABLE: u8 = 3;
/// Any other failure.
pub const EXIT_OTHER: u8 = 4;
/// `serve` only: the data directory is damaged and the node refused to run
/// on it. Restarting will not help (a supervisor should not retry: the
/// systemd unit lists it in `RestartPreventExitStatus`); the recovery is to
/// replace the node's replicas from their peers. 6, not 5: `lock` uses 5.
pub const EXIT_DAMAGED: u8 = 6;

/// Where the client commands look for the cluster when no endpoint is given.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7001";

/// The endpoints a client command uses: `--endpoints` (or `--endpoint`, or
/// `$FENCELOCK_ENDPOINTS`, comma-separated; clap reads those), else the
/// single `$FENCELOCK_ENDPOINT`, else [`DEFAULT_ENDPOINT`].
pub fn resolve_endpoints(given: &[String]) -> Vec<String> {
    let given: Vec<String> = given
        .iter()
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect();
    if !given.is_empty() {
        return given;
    }
    match std::env::var("FENCELOCK_ENDPOINT") {
        Ok(endpoint) if !endpoint.trim().is_empty() => vec![endpoint.trim().to_owned()],
        _ => vec![DEFAULT_ENDPOINT.to_owned()],
    }
}

/// The exit codes, as shown by `--help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  the lock is held by someone else (LOCK_HELD, WAIT_TIMED_OUT, QUEUE_FULL,
     TENANT_WAITERS_EXCEEDED, TENANT_QUOTA_EXCEEDED), or the lease does not hold it (LEASE_NOT_HELD,
     HOLD_LIMIT_REACHED, a release that released nothing)
  2  usage error: bad arguments, an invalid config file, or a request the
     server refused as malformed (INVALID_ARGUMENT)
  3  unavailable: no server reachable, no leader, no quorum, or a deadline
     passed, after retries (the outcome of a write may be unknown: retry an
     acquire with the same --request-id)
  4  any other error
  6  serve: the data directory is damaged and the node refused to start on
     it; restarting will not help (docs/operations.md, \"Replace a node whose
     disk was lost\")";

/// fencelock: a distributed lock service with fencing tokens.
#[derive(Debug, Parser)]
#[command(name = "fencelock", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one node until Ctrl-C or SIGTERM (graceful: leaderships are
    /// handed over and requests drained first). Logs go to stderr
    /// (`[log]` section; RUST_LOG replaces `log.filter`). SIGHUP reopens the
    /// audit log file.
    #[command(after_help = EXIT_CODES_HELP)]
    Serve {
        /// The node's TOML config file.
        #[arg(long, value_name = "PATH")]
        config: PathBuf,
        #[command(flatten)]
        overrides: OverrideArgs,
    },
    /// Work with config files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Run a local cluster: writes one config per node under --dir and runs
    /// one `fencelock serve` process per node until Ctrl-C.
    #[command(after_help = EXIT_CODES_HELP)]
    Dev(dev::DevArgs),
    /// Take an exclusive lease on a resource; prints the lease id and the
    /// fencing token.
    #[command(after_help = EXIT_CODES_HELP)]
    Acquire(client::AcquireArgs),
    /// Extend a held lease.
    #[command(after_help = EXIT_CODES_HELP)]
    Renew(client::RenewArgs),
    /// End a held lease.
    #[command(after_help = EXIT_CODES_HELP)]
    Release(client::ReleaseArgs),
    /// Show a resource's lock state (linearizable read).
    #[command(after_help = EXIT_CODES_HELP)]
    Get(client::GetArgs),
    /// Follow a resource's changes: its state now, then one line per change
    /// (granted with the token and value, value changed, released,
    /// expired, cancelled) with its revision, until Ctrl-C. Reconnects by
    /// itself from the last revision seen.
    #[command(after_help = EXIT_CODES_HELP)]
    Watch(client::WatchArgs),
    /// Run a command while holding a lock: acquire, pass the fencing token
    /// in $FENCELOCK_TOKEN, keep the lease renewed, stop the command if the
    /// lock is lost, release when it exits.
    #[command(after_help = lock::LOCK_EXIT_CODES_HELP)]
    Lock(lock::LockArgs),
    /// Run a command as the elected leader: campaign on NAME (wait in its
    /// FIFO queue for as long as it takes; --wait-ms is not used), publish
    /// --value (e.g. this instance's address) while leading, then run the
    /// command as `lock` does: $FENCELOCK_TOKEN for its writes, stopped if
    /// leadership is lost, resigned when it exits. `fencelock get NAME`
    /// shows the leader, `fencelock watch NAME` follows it.
    #[command(after_help = lock::LOCK_EXIT_CODES_HELP)]
    Elect(lock::LockArgs),
    /// Operator commands: inspect and change placement (nodes, shards,
    /// leaders, replicas, slots). Any node answers.
    #[command(after_help = EXIT_CODES_HELP)]
    Admin(admin::AdminArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a config file, with FENCELOCK_* environment overrides and
    /// --set flags applied as `serve` would: prints OK, or the first bad
    /// key and its allowed range (exit code 2).
    Check {
        /// The node's TOML config file.
        path: PathBuf,
        #[command(flatten)]
        overrides: OverrideArgs,
        /// Also print the effective configuration (every key, defaults
        /// included) as TOML.
        #[arg(long)]
        print: bool,
    },
}

/// Config overrides on the command line (after the file and the
/// environment).
#[derive(Debug, Args)]
struct OverrideArgs {
    /// Override one config key, e.g. `--set raft.tick_interval_ms=50` or
    /// `--set admin_listen_addr=0.0.0.0:9100`; repeatable. Environment
    /// variables `FENCELOCK_<SECTION>_<KEY>` apply first.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

impl OverrideArgs {
    /// The environment's overrides, then the flags'.
    fn collect(&self) -> Result<Vec<fencelock_config::Override>, ConfigError> {
        use fencelock_config::overrides;
        let mut all = overrides::from_env(std::env::vars());
        for arg in &self.set {
            all.push(overrides::parse_set(arg)?);
        }
        Ok(all)
    }
}

/// How client subcommands print their answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned `key value` lines.
    Human,
    /// One JSON object on stdout (errors too, with `"ok": false`).
    Json,
}

/// Options shared by the client subcommands.
#[derive(Debug, Args)]
pub struct ClientOpts {
    /// Nodes of the cluster, comma-separated (any of them: the client
    /// follows leader hints and fails over to the next node, with the
    /// fencelock-client library's retry rules). Default:
    /// $FENCELOCK_ENDPOINTS, else $FENCELOCK_ENDPOINT, else
    /// http://127.0.0.1:7001.
    #[arg(
        long,
        alias = "endpoint",
        env = "FENCELOCK_ENDPOINTS",
        value_delimiter = ',',
        value_name = "HOST:PORT,..."
    )]
    endpoints: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Human)]
    output: Output,
    /// Print redirects and retries to stderr.
    #[arg(long, short)]
    verbose: bool,
    #[command(flatten)]
    tls: TlsArgs,
}

/// How an acquire holds its resource (docs/fencing.md, "Shared locks and
/// semaphores"). Neither flag: exclusive.
#[derive(Clone, Copy, Debug, Default, Args)]
pub struct ModeArgs {
    /// Hold the lock shared: beside other shared holders, never beside an
    /// exclusive one. Waiting follows the queue: a writer that came first
    /// is served first.
    #[arg(long, conflicts_with = "semaphore")]
    shared: bool,
    /// Hold one of the resource's N permits (a semaphore of N holders,
    /// 1..=1024; every acquire of it must name the same N).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(fencelock_client::MAX_PERMITS)))]
    semaphore: Option<u32>,
}

impl ModeArgs {
    /// The mode the flags ask for.
    pub fn mode(&self) -> fencelock_client::AcquireMode {
        match (self.shared, self.semaphore) {
            (_, Some(permits)) => fencelock_client::AcquireMode::Semaphore(permits),
            (true, None) => fencelock_client::AcquireMode::Shared,
            (false, None) => fencelock_client::AcquireMode::Exclusive,
        }
    }
}

/// Mutual TLS for the client commands (docs/security.md). All three files,
/// or none (plaintext, for a cluster in insecure dev mode).
#[derive(Clone, Debug, Default, Args)]
pub struct TlsArgs {
    /// The CA certificate (PEM) that signed the nodes' certificates.
    #[arg(
        long,
        env = "FENCELOCK_TLS_CA_FILE",
        value_name = "PATH",
        global = true
    )]
    ca_file: Option<PathBuf>,
    /// This client's certificate (PEM); its URI SAN is the caller's
    /// identity (spiffe://fencelock/tenant/<tenant>/<name> for locks,
    /// spiffe://fencelock/admin/<name> for `fencelock admin`).
    #[arg(
        long,
        env = "FENCELOCK_TLS_CERT_FILE",
        value_name = "PATH",
        global = true
    )]
    cert_file: Option<PathBuf>,
    /// This client's private key (PEM).
    #[arg(
        long,
        env = "FENCELOCK_TLS_KEY_FILE",
        value_name = "PATH",
        global = true
    )]
    key_file: Option<PathBuf>,
}

impl TlsArgs {
    /// Whether any TLS file was given (the command speaks TLS).
    pub fn given(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// The TLS to dial with: none when no file is given.
    pub fn peer_tls(&self) -> Result<fencelock_server::security::PeerTls, String> {
        use fencelock_server::security::{PeerTls, TlsMaterial};
        match (&self.ca_file, &self.cert_file, &self.key_file) {
            (None, None, None) => Ok(PeerTls::insecure()),
            (Some(ca), Some(cert), Some(key)) => {
                let material = TlsMaterial::load(ca, cert, key).map_err(|e| {
                    // The loader names the node's config keys; say flags.
                    e.to_string()
                        .replace("tls.ca_file", "--ca-file")
                        .replace("tls.cert_file", "--cert-file")
                        .replace("tls.key_file", "--key-file")
                })?;
                Ok(PeerTls::new(Some(std::sync::Arc::new(material))))
            }
            _ => Err("TLS needs all of --ca-file, --cert-file and --key-file \
                      (or FENCELOCK_TLS_CA_FILE, FENCELOCK_TLS_CERT_FILE, FENCELOCK_TLS_KEY_FILE)"
                .to_owned()),
        }
    }

    /// The same for the client library.
    pub fn client_tls(&self) -> Result<Option<fencelock_client::ClientTls>, String> {
        let tls = self.peer_tls()?;
        Ok(tls.material().map(|m| fencelock_client::ClientTls {
            ca_pem: m.ca_pem().to_vec(),
            cert_pem: m.cert_pem().to_vec(),
            key_pem: m.key_pem().to_vec(),
        }))
    }
}

/// Runs the parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Serve { config, overrides } => serve(&config, &overrides).await,
        Command::Config(ConfigCommand::Check {
            path,
            overrides,
            print,
        }) => config_check(&path, &overrides, print),
        Command::Dev(args) => dev::run(args).await,
        Command::Acquire(args) => client::acquire(args).await,
        Command::Renew(args) => client::renew(args).await,
        Command::Release(args) => client::release(args).await,
        Command::Get(args) => client::get(args).await,
        Command::Elect(args) => lock::elect(args).await,
        Command::Watch(args) => client::watch(args).await,
        Command::Lock(args) => lock::run(args).await,
        Command::Admin(args) => admin::run(args).await,
    }
}

/// One line describing a config error, naming the file.
fn describe_config_error(path: &Path, error: &ConfigError) -> String {
    match error {
        // These already name the file.
        ConfigError::Read { .. } | ConfigError::Parse { .. } => format!("error: {error}"),
        ConfigError::Invalid { .. } => format!("error: {}: {error}", path.display()),
    }
}

/// Loads `path` with the environment's and `args`' overrides.
fn load_config(path: &Path, args: &OverrideArgs) -> Result<NodeConfig, String> {
    let overrides = args
        .collect()
        .map_err(|e| describe_config_error(path, &e))?;
    NodeConfig::load_with(path, &overrides).map_err(|e| describe_config_error(path, &e))
}

fn config_check(path: &Path, args: &OverrideArgs, print: bool) -> u8 {
    match load_config(path, args) {
        Ok(config) => {
            println!(
                "OK: {} (node {} of {} peers, {} shards, listening on {}, data in {})",
                path.display(),
                config.node_id,
                config.peers.len(),
                config.shard_count,
                config.listen_addr,
                config.data_dir.display()
            );
            if print {
                match toml::to_string(&config) {
                    Ok(text) => print!("{text}"),
                    Err(e) => {
                        eprintln!("error: cannot print the configuration: {e}");
                        return EXIT_OTHER;
                    }
                }
            }
            EXIT_OK
        }
        Err(message) => {
            eprintln!("{message}");
            EXIT_USAGE
        }
    }
}

async fn serve(path: &Path, args: &OverrideArgs) -> u8 {
    // Install the handlers before anything else, so a SIGTERM that arrives
    // while the node starts is not fatal to a half-opened store.
    let signals = ShutdownSignals::new().and_then(|s| Ok((s, Hangup::new()?)));
    let (mut signals, mut hangup) = match signals {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot install signal handlers: {e}");
            return EXIT_OTHER;
        }
    };
    let config = match load_config(path, args) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("{message}");
            return EXIT_USAGE;
        }
    };
    fencelock_server::logging::init(&config.log);
    let node_id = config.node_id;
    let node = match Node::start(config).await {
        Ok(node) => node,
        Err(e) => {
            eprintln!("error: node {node_id} failed to start: {e}");
            return match e {
                ServerError::Config(_) => EXIT_USAGE,
                ServerError::Damaged(_) => EXIT_DAMAGED,
                _ => EXIT_OTHER,
            };
        }
    };
    match node.admin_addr() {
        Some(admin) => println!(
            "fencelock node {node_id} serving on {}, admin http://{admin}/",
            node.addr()
        ),
        None => println!("fencelock node {node_id} serving on {}", node.addr()),
    }

    let signal = loop {
        tokio::select! {
            signal = signals.recv() => break signal,
            () = hangup.recv() => {
                tracing::info!("SIGHUP: reopening the audit log");
                node.audit().reopen();
            }
        }
    };
    tracing::info!(signal, "shutting down gracefully");
    tokio::select! {
        report = node.shutdown_gracefully() => {
            tracing::info!(?report, "stopped");
            EXIT_OK
        }
        signal = signals.recv() => {
            eprintln!("error: {signal} received again during shutdown; exiting now");
            EXIT_OTHER
        }
    }
}

/// Ctrl-C (SIGINT) and, on Unix, SIGTERM.
pub struct ShutdownSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

/// SIGHUP, caught by `serve` only (it reopens the audit log); everywhere
/// else it keeps its default (terminate), as a closed terminal expects.
pub struct Hangup {
    #[cfg(unix)]
    hup: tokio::signal::unix::Signal,
}

impl Hangup {
    pub fn new() -> std::io::Result<Hangup> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Hangup {
                hup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Hangup {})
    }

    /// Waits for the next SIGHUP (never, where there is none).
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            self.hup.recv().await;
        }
        #[cfg(not(unix))]
        std::future::pending::<()>().await
    }
}

impl ShutdownSignals {
    pub fn new() -> std::io::Result<ShutdownSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(ShutdownSignals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(ShutdownSignals {})
    }

    /// Waits for the next signal; returns its name.
    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_documents_the_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        for code in [
            "0  success",
            "1  the lock",
            "2  usage",
            "3  unavailable",
            "4  any",
        ] {
            assert!(help.contains(code), "{code:?} missing from:\n{help}");
        }
        for sub in ["acquire", "renew", "release", "get", "serve", "dev"] {
            let mut cmd = Cli::command();
            let help = cmd
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            assert!(help.contains("Exit codes:"), "{sub}");
        }
    }

    #[test]
    fn client_subcommands_parse() {
        let cli = Cli::try_parse_from([
            "fencelock",
            "acquire",
            "demo/a",
            "--ttl-ms",
            "5000",
            "--wait-ms",
            "100",
            "--request-id",
            "00ff",
            "--endpoint",
            "http://127.0.0.1:7002",
            "--output",
            "json",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Acquire(_)));

        let lease = "00112233445566778899aabbccddeeff";
        for args in [
            vec!["fencelock", "renew", "demo/a", lease, "--ttl-ms", "3000"],
            vec!["fencelock", "release", "demo/a", lease],
            vec!["fencelock", "get", "demo/a"],
            vec!["fencelock", "config", "check", "x.toml"],
            vec!["fencelock", "serve", "--config", "x.toml"],
            vec!["fencelock", "dev", "--nodes", "5", "--base-port", "9001"],
        ] {
            Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
    }

    #[test]
    fn malformed_ids_are_usage_errors() {
        for args in [
            vec!["fencelock", "release", "demo/a", "00ff"],
            vec![
                "fencelock",
                "release",
                "demo/a",
                "zz112233445566778899aabbccddeeff",
            ],
            vec!["fencelock", "acquire", "demo/a", "--request-id", ""],
            vec!["fencelock", "acquire", "demo/a", "--request-id", "abc"],
            vec!["fencelock", "dev", "--nodes", "8"],
            vec!["fencelock", "dev", "--shards", "0"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            assert_eq!(err.exit_code(), i32::from(EXIT_USAGE), "{args:?}");
        }
    }
}
