//! `fencelock dev`: a local cluster of `fencelock serve` processes.
//!
//! Writes `nodeN.toml` for every node under `--dir` (each with its own data
//! directory `nodeN/`), starts one child process per node from this very
//! executable, prefixes their output with `[nodeN]`, and on Ctrl-C or
//! SIGTERM asks every child to stop (SIGTERM), then waits. A child that
//! fails on its own is restarted after a back-off ([`RESTART_FIRST_DELAY`]
//! doubling to [`RESTART_MAX_DELAY`]), at most [`MAX_RESTARTS_IN_A_ROW`]
//! times without [`RESTART_STREAK_RESET`] of running in between; one that
//! exits cleanly (status 0: someone else stopped it) is reported as clean
//! and left stopped. The others keep running either way.
//!
//! With `--tls` the cluster uses mutual TLS: a development CA and
//! certificates are made once in `DIR/certs` and the configs point at them.
//!
//! Data is kept between runs, so a restarted dev cluster has its locks back.
//! The directory records the cluster's shape; starting a different shape on
//! old data is refused unless `--fresh` deletes the old data first. Nothing
//! is deleted in a directory that `fencelock dev` did not create.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use clap::Args;
use fencelock_config::{NodeConfig, MAX_PEERS};

use super::{ShutdownSignals, EXIT_OK, EXIT_OTHER, EXIT_USAGE};

/// How long the children get to stop after SIGTERM before they are killed:
/// more than a node's default graceful drain (`shutdown.drain_timeout_ms`,
/// 20 s), so a clean stop is never cut short.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// The wait before the first restart of a failed node; doubles per failure
/// in a row, up to [`RESTART_MAX_DELAY`].
const RESTART_FIRST_DELAY: Duration = Duration::from_secs(1);
const RESTART_MAX_DELAY: Duration = Duration::from_secs(30);
/// Failures in a row after which a node is left stopped (it fails at start:
/// its log says why, and restarting it again would only repeat that).
const MAX_RESTARTS_IN_A_ROW: u32 = 5;
/// A node that ran this long before it failed starts a new streak.
const RESTART_STREAK_RESET: Duration = Duration::from_secs(60);
/// Where `--tls` keeps the development CA and certificates, under `--dir`.
const CERTS_DIR: &str = "certs";
/// The tenant and name of the client certificate `--tls` makes.
const TLS_CLIENT_TENANT: &str = "demo";
/// The file that marks a directory as made by `fencelock dev`; it holds the
/// cluster's shape.
const MARKER_FILE: &str = ".fencelock-dev";

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Number of nodes (1 to 7).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=MAX_PEERS as u64))]
    nodes: u64,
    /// Port of node 1; node N listens on 127.0.0.1:(base-port + N - 1).
    #[arg(long, default_value_t = 7001, value_parser = clap::value_parser!(u16).range(1..))]
    base_port: u16,
    /// Directory for the configs (`nodeN.toml`) and data (`nodeN/`).
    #[arg(long, default_value = ".fencelock-dev")]
    dir: PathBuf,
    /// Shards (Raft groups) per node (1 to 256).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    shards: u32,
    /// Delete the data of the previous dev cluster in --dir before starting.
    #[arg(long)]
    fresh: bool,
    /// Admin HTTP port of node 1 (metrics, status page); node N uses
    /// admin-base-port + N - 1. 0 turns the admin ports off.
    #[arg(long, default_value_t = 9101)]
    admin_base_port: u16,
    /// Run with mutual TLS: makes a development CA and node, client (tenant
    /// `demo`) and admin certificates in DIR/certs once (kept between runs)
    /// and configs that use them. The clients' flags are printed at start.
    #[arg(long)]
    tls: bool,
    #[command(subcommand)]
    action: Option<DevAction>,
}

#[derive(Debug, clap::Subcommand)]
enum DevAction {
    /// Generate a development CA and node, client and admin certificates
    /// (PEM; keys written 0600) for a TLS setup: see docs/security.md.
    Certs(CertsArgs),
}

#[derive(Debug, Args)]
struct CertsArgs {
    /// Directory to write `ca.crt`, `node-N.crt`, `client-<tenant>-<name>.crt`,
    /// `admin-<name>.crt` and their `.key` files to (created 0700).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Node certificates `node-1` ..= `node-N`.
    #[arg(long = "nodes", default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=MAX_PEERS as u64))]
    nodes: u64,
    /// DNS names and IPs the nodes are dialed by (repeatable).
    #[arg(long = "host", value_name = "NAME_OR_IP", default_values_t = ["localhost".to_owned(), "127.0.0.1".to_owned()])]
    hosts: Vec<String>,
    /// A client certificate for TENANT, named NAME (default `client`);
    /// repeatable.
    #[arg(long = "tenant", value_name = "TENANT[:NAME]")]
    tenants: Vec<String>,
    /// An admin certificate named NAME (repeatable; default one named `admin`).
    #[arg(long = "admin", value_name = "NAME", default_values_t = ["admin".to_owned()])]
    admins: Vec<String>,
}

/// `fencelock dev certs`.
fn certs(args: &CertsArgs) -> u8 {
    use fencelock_server::security::certs::{DevCerts, DevCertsSpec};
    let tenants = args
        .tenants
        .iter()
        .map(|t| match t.split_once(':') {
            Some((tenant, name)) => (tenant.to_owned(), name.to_owned()),
            None => (t.clone(), "client".to_owned()),
        })
        .collect();
    let spec = DevCertsSpec {
        nodes: args.nodes,
        hosts: args.hosts.clone(),
        tenants,
        admins: args.admins.clone(),
    };
    let written = DevCerts::generate(&spec).and_then(|set| {
        set.write(&args.out)?;
        Ok(set)
    });
    match written {
        Ok(set) => {
            for item in &set.issued {
                println!(
                    "{}  {}",
                    args.out.join(format!("{}.crt", item.name)).display(),
                    args.out.join(format!("{}.key", item.name)).display()
                );
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_USAGE
        }
    }
}

/// One node of the planned cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DevNode {
    id: u64,
    addr: String,
    /// The admin HTTP address, when enabled.
    admin: Option<String>,
    config_path: PathBuf,
}

/// The cluster's shape, as recorded in the marker file.
fn shape(args: &DevArgs) -> String {
    format!(
        "nodes={} base_port={} shards={}\n",
        args.nodes, args.base_port, args.shards
    )
}

/// The addresses of nodes `1..=nodes`, or why the ports do not fit.
fn addresses(nodes: u64, base_port: u16) -> Result<BTreeMap<u64, String>, String> {
    let last = u64::from(base_port) + nodes - 1;
    if last > u64::from(u16::MAX) {
        return Err(format!(
            "--base-port {base_port} leaves no room for {nodes} nodes (the last port would be {last})"
        ));
    }
    Ok((1..=nodes)
        .map(|id| (id, format!("127.0.0.1:{}", u64::from(base_port) + id - 1)))
        .collect())
}

/// The TOML config of node `id`. Its data directory is relative, so the dev
/// directory can be moved as a whole.
fn config_text(
    id: u64,
    peers: &BTreeMap<u64, String>,
    shards: u32,
    admin: Option<&str>,
    tls: bool,
) -> String {
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let mut text = String::from(
        "# Written by `fencelock dev` and rewritten on every start, so edits\n\
         # here are lost: change the cluster with `fencelock dev` flags\n\
         # (--nodes, --shards, --base-port, --admin-base-port, --tls; see\n\
         # `fencelock dev --help`). Every other key has its default; they are\n\
         # listed in docs/configuration.md. For a cluster of your own, start\n\
         # from deploy/dev/node1.toml and run `fencelock serve --config FILE`.\n",
    );
    text.push_str(&format!("node_id = {id}\n"));
    text.push_str(&format!("listen_addr = {}\n", quote(&peers[&id])));
    if let Some(admin) = admin {
        text.push_str(&format!("admin_listen_addr = {}\n", quote(admin)));
    }
    text.push_str(&format!(
        "# Relative to this file's directory.\ndata_dir = {}\n",
        quote(&format!("node{id}"))
    ));
    text.push_str(&format!("shard_count = {shards}\n"));
    text.push_str("peers = [\n");
    for (peer, addr) in peers {
        text.push_str(&format!("  {{ id = {peer}, addr = {} }},\n", quote(addr)));
    }
    text.push_str("]\n");
    if tls {
        text.push_str(&format!(
            "\n# Mutual TLS with the development CA of `fencelock dev --tls`\n\
             # (docs/security.md). Relative to this file's directory.\n\
             [tls]\nca_file = {}\ncert_file = {}\nkey_file = {}\n",
            quote(&format!("{CERTS_DIR}/ca.crt")),
            quote(&format!("{CERTS_DIR}/node-{id}.crt")),
            quote(&format!("{CERTS_DIR}/node-{id}.key")),
        ));
    } else {
        text.push_str(
            "\n# A local dev cluster: no TLS, every caller may do everything.\n\
             # `fencelock dev --tls` runs it with mutual TLS (docs/security.md).\n\
             [tls]\ninsecure = true\n",
        );
    }
    text
}

/// The files of `--tls` in `dir/certs`: made once, again only when one is
/// missing (for example a node was added). Returns the CA, client and
/// admin certificate paths the clients use.
fn ensure_certs(dir: &Path, nodes: u64) -> Result<DevTls, String> {
    use fencelock_server::security::certs::{DevCerts, DevCertsSpec};
    let certs = dir.join(CERTS_DIR);
    let tls = DevTls {
        ca: certs.join("ca.crt"),
        client: certs.join(format!("client-{TLS_CLIENT_TENANT}-client")),
        admin: certs.join("admin-admin"),
    };
    let needed = (1..=nodes)
        .flat_map(|id| ["crt", "key"].map(|ext| certs.join(format!("node-{id}.{ext}"))))
        .chain([tls.ca.clone()])
        .chain(["crt", "key"].map(|ext| tls.client.with_extension(ext)))
        .chain(["crt", "key"].map(|ext| tls.admin.with_extension(ext)));
    if needed.into_iter().all(|path| path.is_file()) {
        return Ok(tls);
    }
    let spec = DevCertsSpec {
        nodes,
        hosts: vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
        tenants: vec![(TLS_CLIENT_TENANT.to_owned(), "client".to_owned())],
        admins: vec!["admin".to_owned()],
    };
    DevCerts::generate(&spec)
        .and_then(|set| set.write(&certs))
        .map_err(|e| {
            format!(
                "cannot make the development certificates in {}: {e}",
                certs.display()
            )
        })?;
    Ok(tls)
}

/// The certificates clients of a `--tls` dev cluster use (the client and
/// admin paths without their `.crt` / `.key` extension).
#[derive(Clone, Debug)]
struct DevTls {
    ca: PathBuf,
    client: PathBuf,
    admin: PathBuf,
}

impl DevTls {
    /// The flags a client command needs, for the start-up message.
    fn flags(&self, identity: &Path) -> String {
        format!(
            "--ca-file {} --cert-file {} --key-file {}",
            self.ca.display(),
            identity.with_extension("crt").display(),
            identity.with_extension("key").display()
        )
    }
}

/// Prepares `--dir`: checks it is ours, applies `--fresh`, checks the old
/// data matches the shape, and writes the configs. Returns the nodes.
fn prepare(args: &DevArgs) -> Result<(PathBuf, Vec<DevNode>, Option<DevTls>), String> {
    let peers = addresses(args.nodes, args.base_port)?;
    let admins = match args.admin_base_port {
        0 => BTreeMap::new(),
        port => addresses(args.nodes, port)?,
    };
    let dir = &args.dir;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
    let marker = dir.join(MARKER_FILE);
    let is_empty = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .next()
        .is_none();
    if !marker.exists() && !is_empty {
        return Err(format!(
            "{} is not empty and was not made by `fencelock dev`; choose another --dir",
            dir.display()
        ));
    }
    let old_shape = std::fs::read_to_string(&marker).unwrap_or_default();
    let has_data = (1..=MAX_PEERS as u64).any(|id| dir.join(format!("node{id}")).exists());
    if args.fresh {
        for id in 1..=MAX_PEERS as u64 {
            let data = dir.join(format!("node{id}"));
            if data.exists() {
                std::fs::remove_dir_all(&data)
                    .map_err(|e| format!("cannot delete {}: {e}", data.display()))?;
            }
            let _ = std::fs::remove_file(dir.join(format!("node{id}.toml")));
        }
    } else if has_data && old_shape != shape(args) {
        return Err(format!(
            "{} holds the data of a dev cluster with {}; pass --fresh to delete it, \
             or use another --dir",
            dir.display(),
            old_shape.trim()
        ));
    }
    std::fs::write(&marker, shape(args))
        .map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    let tls = if args.tls {
        Some(ensure_certs(&dir, args.nodes)?)
    } else {
        None
    };

    let mut nodes = Vec::new();
    for (&id, addr) in &peers {
        // Data directories of older dev clusters were made with the
        // default mode; the node now refuses those, and these are ours.
        restrict_dir(&dir.join(format!("node{id}")))?;
        let config_path = dir.join(format!("node{id}.toml"));
        let admin = admins.get(&id).map(String::as_str);
        std::fs::write(
            &config_path,
            config_text(id, &peers, args.shards, admin, args.tls),
        )
        .map_err(|e| format!("cannot write {}: {e}", config_path.display()))?;
        // The children would refuse a bad config; find out here, once.
        NodeConfig::load(&config_path)
            .map_err(|e| format!("generated config {}: {e}", config_path.display()))?;
        nodes.push(DevNode {
            id,
            addr: addr.clone(),
            admin: admins.get(&id).cloned(),
            config_path,
        });
    }
    Ok((dir, nodes, tls))
}

/// Makes an existing directory private (0700), as a node requires of its
/// data directory.
fn restrict_dir(path: &Path) -> Result<(), String> {
    #[cfg(unix)]
    if path.is_dir() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot chmod 700 {}: {e}", path.display()))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Refuses ports something else listens on, before any child starts.
fn check_ports(nodes: &[DevNode]) -> Result<(), String> {
    for node in nodes {
        if let Err(e) = std::net::TcpListener::bind(&node.addr) {
            return Err(format!(
                "cannot use {} for node {}: {e}; is another cluster running? choose another --base-port",
                node.addr, node.id
            ));
        }
        if let Some(admin) = &node.admin {
            if let Err(e) = std::net::TcpListener::bind(admin) {
                return Err(format!(
                    "cannot use {admin} for node {}'s admin port: {e}; choose another \
                     --admin-base-port (0 turns admin ports off)",
                    node.id
                ));
            }
        }
    }
    Ok(())
}

/// A child that ended, as reported by its waiter thread.
struct Exited {
    id: u64,
    status: std::io::Result<ExitStatus>,
}

/// Copies a child's output line by line, prefixed with its node.
fn forward_lines(id: u64, stream: impl Read + Send + 'static, to_stderr: bool) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            // Errors writing our own output (a closed pipe) are ignored:
            // the children must keep running until told to stop.
            if to_stderr {
                let _ = writeln!(std::io::stderr().lock(), "[node{id}] {text}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "[node{id}] {text}");
            }
        }
    });
}

/// Sends `signal` (`TERM`, `KILL`) to `pid` with kill(1): std can only
/// SIGKILL a child it still owns, and the waiter threads own them.
fn send_signal(pid: u32, signal: &str) {
    let result = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(e) = result {
        eprintln!("fencelock dev: cannot send SIG{signal} to pid {pid}: {e}");
    }
}

/// Starts node `node` as a child; its waiter thread reports its end on
/// `exits`. Returns the child's pid.
fn spawn_node(
    exe: &Path,
    node: &DevNode,
    exits: tokio::sync::mpsc::UnboundedSender<Exited>,
) -> std::io::Result<u32> {
    let mut command = Command::new(exe);
    command
        .arg("serve")
        .arg("--config")
        .arg(&node.config_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Own process group: a Ctrl-C in the terminal reaches only this
    // supervisor, which then stops the children in order, instead of every
    // process at once.
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn()?;
    let pid = child.id();
    if let Some(out) = child.stdout.take() {
        forward_lines(node.id, out, false);
    }
    if let Some(err) = child.stderr.take() {
        forward_lines(node.id, err, true);
    }
    let id = node.id;
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = exits.send(Exited { id, status });
    });
    Ok(pid)
}

fn describe_exit(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("unknown status ({e})"),
    }
}

/// Counts a failure of a node that ran for `ran_for` into `in_a_row` (its
/// failures since it last ran [`RESTART_STREAK_RESET`]); the wait before its
/// restart, or `None` once it failed more than [`MAX_RESTARTS_IN_A_ROW`]
/// times in a row and is left stopped.
fn restart_after_failure(in_a_row: &mut u32, ran_for: Duration) -> Option<Duration> {
    if ran_for >= RESTART_STREAK_RESET {
        *in_a_row = 0;
    }
    *in_a_row += 1;
    (*in_a_row <= MAX_RESTARTS_IN_A_ROW).then(|| restart_delay(*in_a_row))
}

/// The wait before restart number `in_a_row` (1 = the first) of a node.
fn restart_delay(in_a_row: u32) -> Duration {
    let doublings = in_a_row.saturating_sub(1).min(16);
    RESTART_FIRST_DELAY
        .saturating_mul(1 << doublings)
        .min(RESTART_MAX_DELAY)
}

pub async fn run(args: DevArgs) -> u8 {
    if let Some(DevAction::Certs(certs_args)) = &args.action {
        return certs(certs_args);
    }
    let (dir, nodes, tls) = match prepare(&args) {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!("error: {message}");
            return EXIT_USAGE;
        }
    };
    if let Err(message) = check_ports(&nodes) {
        eprintln!("error: {message}");
        return EXIT_USAGE;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("error: cannot find this executable to start the nodes: {e}");
            return EXIT_OTHER;
        }
    };
    let mut signals = match ShutdownSignals::new() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("error: cannot install signal handlers: {e}");
            return EXIT_OTHER;
        }
    };

    let (exit_tx, mut exit_rx) = tokio::sync::mpsc::unbounded_channel();
    let by_id: BTreeMap<u64, &DevNode> = nodes.iter().map(|n| (n.id, n)).collect();
    // Running nodes: pid and start time.
    let mut live: BTreeMap<u64, (u32, tokio::time::Instant)> = BTreeMap::new();
    let mut failed = false;
    for node in &nodes {
        match spawn_node(&exe, node, exit_tx.clone()) {
            Ok(pid) => {
                live.insert(node.id, (pid, tokio::time::Instant::now()));
            }
            Err(e) => {
                eprintln!("error: cannot start node {}: {e}", node.id);
                failed = true;
                break;
            }
        }
    }

    if !failed {
        let scheme = if tls.is_some() { "https" } else { "http" };
        println!(
            "fencelock dev: {} nodes, {} shards, {}, configs and data in {}",
            nodes.len(),
            args.shards,
            if tls.is_some() {
                "mutual TLS"
            } else {
                "no TLS"
            },
            dir.display()
        );
        for node in &nodes {
            println!(
                "  node {}  {scheme}://{}  pid {}  {}",
                node.id,
                node.addr,
                live[&node.id].0,
                node.config_path.display()
            );
            if let Some(admin) = &node.admin {
                println!(
                    "          status page {scheme}://{admin}/  metrics {scheme}://{admin}/metrics"
                );
            }
        }
        let client_flags = tls
            .as_ref()
            .map(|t| format!(" {}", t.flags(&t.client)))
            .unwrap_or_default();
        println!(
            "try:  {} acquire {TLS_CLIENT_TENANT}/hello --ttl-ms 30000 --endpoint {}{client_flags}",
            exe.display(),
            nodes[0].addr
        );
        if let Some(t) = &tls {
            println!(
                "admin: {} admin nodes --endpoint {} {}",
                exe.display(),
                nodes[0].addr,
                t.flags(&t.admin)
            );
        }
        println!(
            "Ctrl-C stops the cluster; its data is kept for the next start (--fresh deletes it)."
        );
    }

    // Stopping: None while running; Some(deadline) once the children were
    // asked to stop.
    let mut stop_deadline: Option<tokio::time::Instant> = None;
    let mut killed = false;
    if failed {
        for &(pid, _) in live.values() {
            send_signal(pid, "TERM");
        }
        stop_deadline = Some(tokio::time::Instant::now() + STOP_GRACE);
    }
    // Failures in a row per node (see `restart_after_failure`).
    let mut failures: BTreeMap<u64, u32> = BTreeMap::new();
    // Failed nodes waiting for their restart, and when it is due.
    let mut pending: BTreeMap<u64, tokio::time::Instant> = BTreeMap::new();
    let mut gave_up = false;
    while !live.is_empty() || !pending.is_empty() {
        let grace = async {
            match stop_deadline {
                Some(deadline) if !killed => tokio::time::sleep_until(deadline).await,
                _ => std::future::pending().await,
            }
        };
        let next_restart = pending
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(id, at)| (*id, *at));
        // The node whose restart is due next, once it is due.
        let restart_due = async {
            match next_restart {
                Some((id, at)) => {
                    tokio::time::sleep_until(at).await;
                    id
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            signal = signals.recv() => {
                if stop_deadline.is_none() {
                    eprintln!("fencelock dev: {signal}: stopping {} nodes", live.len());
                    pending.clear();
                    for &(pid, _) in live.values() {
                        send_signal(pid, "TERM");
                    }
                    stop_deadline = Some(tokio::time::Instant::now() + STOP_GRACE);
                } else {
                    eprintln!("fencelock dev: {signal} again: killing {} nodes", live.len());
                    for &(pid, _) in live.values() {
                        send_signal(pid, "KILL");
                    }
                    killed = true;
                }
            }
            // Never closed: this loop holds a sender for the restarts.
            Some(Exited { id, status }) = exit_rx.recv() => {
                let Some((_, started_at)) = live.remove(&id) else { continue };
                if stop_deadline.is_some() {
                    eprintln!("fencelock dev: node {id} stopped: {}", describe_exit(&status));
                } else if status.as_ref().is_ok_and(ExitStatus::success) {
                    // A node exits 0 only when asked to stop (SIGTERM from
                    // someone else): that is not a failure to repair.
                    eprintln!(
                        "fencelock dev: node {id} exited cleanly ({}), so it is left stopped; \
                         {} nodes still running (restart `fencelock dev` to bring it back)",
                        describe_exit(&status),
                        live.len()
                    );
                } else {
                    let in_a_row = failures.entry(id).or_default();
                    let Some(delay) = restart_after_failure(in_a_row, started_at.elapsed()) else {
                        gave_up = true;
                        eprintln!(
                            "fencelock dev: node {id} exited unexpectedly: {}; it failed {in_a_row} \
                             times in a row, so it is left stopped (its log is above; {} nodes \
                             still running, Ctrl-C stops them)",
                            describe_exit(&status),
                            live.len()
                        );
                        continue;
                    };
                    eprintln!(
                        "fencelock dev: node {id} exited unexpectedly: {}; restarting it in {} s \
                         (restart {in_a_row} of at most {MAX_RESTARTS_IN_A_ROW} in a row; its log \
                         is above)",
                        describe_exit(&status),
                        delay.as_secs()
                    );
                    pending.insert(id, tokio::time::Instant::now() + delay);
                }
            }
            id = restart_due => {
                pending.remove(&id);
                match spawn_node(&exe, by_id[&id], exit_tx.clone()) {
                    Ok(pid) => {
                        eprintln!("fencelock dev: restarted node {id} (pid {pid})");
                        live.insert(id, (pid, tokio::time::Instant::now()));
                    }
                    Err(e) => {
                        gave_up = true;
                        eprintln!("fencelock dev: cannot restart node {id}: {e}; it is left stopped");
                    }
                }
            }
            () = grace => {
                eprintln!(
                    "fencelock dev: {} nodes did not stop within {} s; killing them",
                    live.len(),
                    STOP_GRACE.as_secs()
                );
                for &(pid, _) in live.values() {
                    send_signal(pid, "KILL");
                }
                killed = true;
            }
        }
    }
    if failed || gave_up || killed {
        EXIT_OTHER
    } else {
        EXIT_OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dir: &Path, nodes: u64, fresh: bool) -> DevArgs {
        DevArgs {
            nodes,
            base_port: 17001,
            dir: dir.to_owned(),
            shards: 4,
            fresh,
            admin_base_port: 0,
            tls: false,
            action: None,
        }
    }

    #[test]
    fn a_failing_node_is_restarted_after_a_doubling_bounded_delay() {
        assert_eq!(restart_delay(1), RESTART_FIRST_DELAY);
        assert_eq!(restart_delay(2), RESTART_FIRST_DELAY * 2);
        assert_eq!(restart_delay(3), RESTART_FIRST_DELAY * 4);
        assert_eq!(restart_delay(40), RESTART_MAX_DELAY);
        assert!(restart_delay(MAX_RESTARTS_IN_A_ROW) <= RESTART_MAX_DELAY);
    }

    #[test]
    fn a_node_that_keeps_failing_at_start_is_left_stopped_and_one_that_ran_starts_afresh() {
        let mut in_a_row = 0;
        for n in 1..=MAX_RESTARTS_IN_A_ROW {
            assert_eq!(
                restart_after_failure(&mut in_a_row, Duration::ZERO),
                Some(restart_delay(n))
            );
        }
        assert_eq!(restart_after_failure(&mut in_a_row, Duration::ZERO), None);
        // Running long enough before the failure starts a new streak.
        assert_eq!(
            restart_after_failure(&mut in_a_row, RESTART_STREAK_RESET),
            Some(RESTART_FIRST_DELAY)
        );
        assert_eq!(in_a_row, 1);
    }

    #[test]
    fn tls_configs_use_the_certificates_made_once_in_the_dev_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let tls = ensure_certs(tmp.path(), 3).unwrap();
        let ca = std::fs::read(&tls.ca).unwrap();
        for id in 1..=3 {
            assert!(tmp.path().join(format!("certs/node-{id}.key")).is_file());
        }
        assert!(tls.client.with_extension("key").is_file());
        assert!(tls.admin.with_extension("crt").is_file());
        // Kept between runs: the same CA, so clients' files stay valid.
        ensure_certs(tmp.path(), 3).unwrap();
        assert_eq!(std::fs::read(&tls.ca).unwrap(), ca);
        // A node more needs its certificate: all are made anew.
        ensure_certs(tmp.path(), 4).unwrap();
        assert!(tmp.path().join("certs/node-4.crt").is_file());

        let peers = addresses(3, 7001).unwrap();
        let config = NodeConfig::from_toml_str(&config_text(2, &peers, 8, None, true)).unwrap();
        assert!(!config.tls.insecure);
        assert_eq!(
            config.tls.cert_file.as_deref(),
            Some(Path::new("certs/node-2.crt"))
        );
    }

    #[test]
    fn generated_configs_validate_for_every_cluster_size() {
        for nodes in 1..=MAX_PEERS as u64 {
            let peers = addresses(nodes, 7001).unwrap();
            for id in 1..=nodes {
                let admin = format!("127.0.0.1:{}", 9100 + id);
                let config =
                    NodeConfig::from_toml_str(&config_text(id, &peers, 8, Some(&admin), false))
                        .unwrap_or_else(|e| panic!("{nodes} nodes, node {id}: {e}"));
                assert_eq!(config.node_id, id);
                assert_eq!(config.peer_map(), peers);
                assert_eq!(config.shard_count, 8);
            }
        }
        assert!(addresses(3, 65534).is_err());
        assert!(addresses(2, 65534).is_ok());
    }

    #[test]
    fn prepare_writes_configs_with_separate_data_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dev");
        let (root, nodes, _) = prepare(&args(&dir, 3, false)).unwrap();
        assert_eq!(nodes.len(), 3);
        let mut data_dirs = Vec::new();
        for node in &nodes {
            let config = NodeConfig::load(&node.config_path).unwrap();
            assert_eq!(config.listen_addr, node.addr);
            assert_eq!(config.data_dir, root.join(format!("node{}", node.id)));
            data_dirs.push(config.data_dir);
        }
        data_dirs.dedup();
        assert_eq!(data_dirs.len(), 3);
    }

    #[test]
    fn a_different_shape_on_old_data_needs_fresh() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dev");
        prepare(&args(&dir, 3, false)).unwrap();
        std::fs::create_dir_all(dir.join("node1/db")).unwrap();
        // Same shape: the data is reused.
        prepare(&args(&dir, 3, false)).unwrap();
        assert!(dir.join("node1/db").exists());
        // Another shape is refused, then allowed with --fresh, which deletes.
        let err = prepare(&args(&dir, 5, false)).unwrap_err();
        assert!(err.contains("--fresh"), "{err}");
        prepare(&args(&dir, 5, true)).unwrap();
        assert!(!dir.join("node1").exists());
        assert!(dir.join("node5.toml").exists());
    }

    #[test]
    fn foreign_directories_are_never_touched() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("important.txt"), "keep").unwrap();
        std::fs::create_dir(tmp.path().join("node1")).unwrap();
        let err = prepare(&args(tmp.path(), 3, true)).unwrap_err();
        assert!(err.contains("not made by `fencelock dev`"), "{err}");
        assert!(tmp.path().join("node1").exists());
        assert!(tmp.path().join("important.txt").exists());
    }

    #[test]
    fn busy_ports_are_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let node = DevNode {
            id: 1,
            addr,
            admin: None,
            config_path: PathBuf::new(),
        };
        let err = check_ports(&[node]).unwrap_err();
        assert!(err.contains("--base-port"), "{err}");
    }
}
