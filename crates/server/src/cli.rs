//! Command-line interface of the `fencelock` binary.
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
mod json;
mod lock;

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use fencelock_server::config::{ConfigError, NodeConfig};
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

/// The exit codes, as shown by `--help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  the lock is held by someone else (LOCK_HELD, WAIT_TIMED_OUT, QUEUE_FULL,
     TENANT_WAITERS_EXCEEDED), or the lease does not hold it (LEASE_NOT_HELD,
     HOLD_LIMIT_REACHED, a release that released nothing)
  2  usage error: bad arguments, an invalid config file, or a request the
     server refused as malformed (INVALID_ARGUMENT)
  3  unavailable: no server reachable, no leader, no quorum, or a deadline
     passed, after retries (the outcome of a write may be unknown: retry an
     acquire with the same --request-id)
  4  any other error";

/// fencelock: a distributed lock service with fencing tokens.
#[derive(Debug, Parser)]
#[command(name = "fencelock", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one node until Ctrl-C or SIGTERM. Logs go to stderr; set their
    /// level with RUST_LOG (default `info`).
    #[command(after_help = EXIT_CODES_HELP)]
    Serve {
        /// The node's TOML config file.
        #[arg(long, value_name = "PATH")]
        config: PathBuf,
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
    /// Run a command while holding a lock: acquire, pass the fencing token
    /// in $FENCELOCK_TOKEN, keep the lease renewed, stop the command if the
    /// lock is lost, release when it exits.
    #[command(after_help = lock::LOCK_EXIT_CODES_HELP)]
    Lock(lock::LockArgs),
    /// Operator commands: inspect and change placement (nodes, shards,
    /// leaders, replicas, slots). Any node answers.
    #[command(after_help = EXIT_CODES_HELP)]
    Admin(admin::AdminArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a config file: prints OK, or the first bad key and its
    /// allowed range (exit code 2).
    Check {
        /// The node's TOML config file.
        path: PathBuf,
    },
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
    /// The node to ask first. NOT_LEADER answers are followed to the hinted
    /// leader (at most 5 hops).
    #[arg(
        long,
        env = "FENCELOCK_ENDPOINT",
        default_value = "http://127.0.0.1:7001"
    )]
    endpoint: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Human)]
    output: Output,
    /// Print redirects and retries to stderr.
    #[arg(long, short)]
    verbose: bool,
}

/// Runs the parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Serve { config } => serve(&config).await,
        Command::Config(ConfigCommand::Check { path }) => config_check(&path),
        Command::Dev(args) => dev::run(args).await,
        Command::Acquire(args) => client::acquire(args).await,
        Command::Renew(args) => client::renew(args).await,
        Command::Release(args) => client::release(args).await,
        Command::Get(args) => client::get(args).await,
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

fn config_check(path: &Path) -> u8 {
    match NodeConfig::load(path) {
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
            EXIT_OK
        }
        Err(e) => {
            eprintln!("{}", describe_config_error(path, &e));
            EXIT_USAGE
        }
    }
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colors only on a terminal: `fencelock dev` and log collectors read
    // the output through pipes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

async fn serve(path: &Path) -> u8 {
    init_tracing();
    // Install the handlers before anything else, so a SIGTERM that arrives
    // while the node starts is not fatal to a half-opened store.
    let mut signals = match ShutdownSignals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot install signal handlers: {e}");
            return EXIT_OTHER;
        }
    };
    let config = match NodeConfig::load(path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{}", describe_config_error(path, &e));
            return EXIT_USAGE;
        }
    };
    let node_id = config.node_id;
    let node = match Node::start(config).await {
        Ok(node) => node,
        Err(e) => {
            eprintln!("error: node {node_id} failed to start: {e}");
            return match e {
                ServerError::Config(_) => EXIT_USAGE,
                _ => EXIT_OTHER,
            };
        }
    };
    println!("fencelock node {node_id} serving on {}", node.addr());

    let signal = signals.recv().await;
    tracing::info!(signal, "shutting down");
    tokio::select! {
        () = node.shutdown() => {
            tracing::info!("stopped");
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
