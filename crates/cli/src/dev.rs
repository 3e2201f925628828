//! `fencelock dev`: a local cluster of `fencelock serve` processes.
//!
//! Writes `nodeN.toml` for every node under `--dir` (each with its own data
//! directory `nodeN/`), starts one child process per node from this very
//! executable, prefixes their output with `[nodeN]`, and on Ctrl-C or
//! SIGTERM asks every child to stop (SIGTERM), then waits. A child that dies
//! on its own is reported; the others keep running.
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
use fencelock_server::config::{NodeConfig, MAX_PEERS};

use super::{ShutdownSignals, EXIT_OK, EXIT_OTHER, EXIT_USAGE};

/// How long the children get to stop after SIGTERM before they are killed:
/// more than a node's default graceful drain (`shutdown.drain_timeout_ms`,
/// 20 s), so a clean stop is never cut short.
const STOP_GRACE: Duration = Duration::from_secs(30);
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
fn config_text(id: u64, peers: &BTreeMap<u64, String>, shards: u32, admin: Option<&str>) -> String {
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let mut text = String::from(
        "# Written by `fencelock dev` and rewritten on every start: edit\n\
         # deploy/dev/*.toml or pass flags to `fencelock dev` instead.\n",
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
    text.push_str(
        "\n# A local dev cluster: no TLS, every caller may do everything.\n\
         # See docs/security.md for a TLS setup (`fencelock dev certs`).\n\
         [tls]\ninsecure = true\n",
    );
    text
}

/// Prepares `--dir`: checks it is ours, applies `--fresh`, checks the old
/// data matches the shape, and writes the configs. Returns the nodes.
fn prepare(args: &DevArgs) -> Result<(PathBuf, Vec<DevNode>), String> {
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

    let mut nodes = Vec::new();
    for (&id, addr) in &peers {
        // Data directories of older dev clusters were made with the
        // default mode; the node now refuses those, and these are ours.
        restrict_dir(&dir.join(format!("node{id}")))?;
        let config_path = dir.join(format!("node{id}.toml"));
        let admin = admins.get(&id).map(String::as_str);
        std::fs::write(&config_path, config_text(id, &peers, args.shards, admin))
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
    Ok((dir, nodes))
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

pub async fn run(args: DevArgs) -> u8 {
    if let Some(DevAction::Certs(certs_args)) = &args.action {
        return certs(certs_args);
    }
    let (dir, nodes) = match prepare(&args) {
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
    let mut live: BTreeMap<u64, u32> = BTreeMap::new();
    let mut failed = false;
    for node in &nodes {
        match spawn_node(&exe, node, exit_tx.clone()) {
            Ok(pid) => {
                live.insert(node.id, pid);
            }
            Err(e) => {
                eprintln!("error: cannot start node {}: {e}", node.id);
                failed = true;
                break;
            }
        }
    }
    drop(exit_tx);

    if !failed {
        println!(
            "fencelock dev: {} nodes, {} shards, configs and data in {}",
            nodes.len(),
            args.shards,
            dir.display()
        );
        for node in &nodes {
            println!(
                "  node {}  http://{}  pid {}  {}",
                node.id,
                node.addr,
                live[&node.id],
                node.config_path.display()
            );
            if let Some(admin) = &node.admin {
                println!("          status page http://{admin}/  metrics http://{admin}/metrics");
            }
        }
        println!(
            "try:  {} acquire demo/hello --ttl-ms 30000 --endpoint http://{}",
            exe.display(),
            nodes[0].addr
        );
        println!(
            "Ctrl-C stops the cluster; its data is kept for the next start (--fresh deletes it)."
        );
    }

    // Stopping: None while running; Some(deadline) once the children were
    // asked to stop.
    let mut stop_deadline: Option<tokio::time::Instant> = None;
    let mut killed = false;
    if failed {
        for &pid in live.values() {
            send_signal(pid, "TERM");
        }
        stop_deadline = Some(tokio::time::Instant::now() + STOP_GRACE);
    }
    let mut died = false;
    while !live.is_empty() {
        let grace = async {
            match stop_deadline {
                Some(deadline) if !killed => tokio::time::sleep_until(deadline).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            signal = signals.recv() => {
                if stop_deadline.is_none() {
                    eprintln!("fencelock dev: {signal}: stopping {} nodes", live.len());
                    for &pid in live.values() {
                        send_signal(pid, "TERM");
                    }
                    stop_deadline = Some(tokio::time::Instant::now() + STOP_GRACE);
                } else {
                    eprintln!("fencelock dev: {signal} again: killing {} nodes", live.len());
                    for &pid in live.values() {
                        send_signal(pid, "KILL");
                    }
                    killed = true;
                }
            }
            exited = exit_rx.recv() => {
                let Some(Exited { id, status }) = exited else {
                    // Every waiter thread is gone; nothing more to wait for.
                    break;
                };
                live.remove(&id);
                if stop_deadline.is_none() {
                    died = true;
                    eprintln!(
                        "fencelock dev: node {id} exited unexpectedly: {}; {} nodes still running \
                         (its log is above; Ctrl-C stops the rest)",
                        describe_exit(&status),
                        live.len()
                    );
                } else {
                    eprintln!("fencelock dev: node {id} stopped: {}", describe_exit(&status));
                }
            }
            () = grace => {
                eprintln!(
                    "fencelock dev: {} nodes did not stop within {} s; killing them",
                    live.len(),
                    STOP_GRACE.as_secs()
                );
                for &pid in live.values() {
                    send_signal(pid, "KILL");
                }
                killed = true;
            }
        }
    }
    if failed || died || killed {
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
            action: None,
        }
    }

    #[test]
    fn generated_configs_validate_for_every_cluster_size() {
        for nodes in 1..=MAX_PEERS as u64 {
            let peers = addresses(nodes, 7001).unwrap();
            for id in 1..=nodes {
                let admin = format!("127.0.0.1:{}", 9100 + id);
                let config = NodeConfig::from_toml_str(&config_text(id, &peers, 8, Some(&admin)))
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
        let (root, nodes) = prepare(&args(&dir, 3, false)).unwrap();
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
