//! Local three-node clusters of real processes, for benchmarks on one
//! machine: `fencelock serve` nodes ([`LocalCluster::start_fencelock`]) or
//! `etcd` members ([`LocalCluster::start_etcd`]), on free loopback ports,
//! with data in a directory the cluster owns and deletes.
//!
//! The cluster can kill and restart a node (the capacity scenario) and
//! samples every node's CPU time and peak memory from `/proc`; CPU of a
//! node's earlier processes (before a restart) is carried over, so a
//! node's figure covers the whole run.

pub mod diskfault;
pub mod procstat;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::driver::TargetKind;
use crate::error::BenchError;
use procstat::ProcSample;

/// Nodes of a local cluster: the brief's three replicas.
pub const LOCAL_NODES: usize = 3;
/// Lines of a node's log quoted when it exited unexpectedly.
const LOG_TAIL_LINES: usize = 20;
/// How long a node gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE_MS: u64 = 10_000;

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub kind: TargetKind,
    /// The program: the `fencelock` binary or `etcd`.
    pub program: PathBuf,
    /// Where data and logs go (created; deleted on drop unless `keep`).
    pub dir: PathBuf,
    /// fencelock: shards per node (Raft groups).
    pub shards: u32,
    /// Entries between snapshots: fencelock's `snapshot_interval_entries`,
    /// etcd's `--snapshot-count`. `None` = the system's default.
    pub snapshot_entries: Option<u64>,
    /// fencelock: the node (1-based) started with the disk-fault layer, so
    /// that [`LocalCluster::set_sync_delay_ms`] can slow its syncs.
    pub slow_disk_node: Option<usize>,
    pub keep: bool,
}

struct LocalNode {
    id: usize,
    /// Client address, `127.0.0.1:port`.
    client_addr: String,
    /// etcd's peer address; fencelock's admin HTTP address (fencelock
    /// serves peers on the client port).
    peer_addr: String,
    child: Option<Child>,
    /// CPU seconds of this node's processes that have exited.
    past_cpu_s: f64,
    /// Highest peak RSS of any of its processes.
    past_peak_kib: u64,
}

/// A running local cluster; stops its nodes when dropped.
pub struct LocalCluster {
    options: ClusterOptions,
    nodes: Vec<LocalNode>,
    /// Whether the nodes serve Prometheus metrics (fencelock builds without
    /// the admin HTTP port do not).
    metrics: bool,
    /// The disk-fault layer `slow_disk_node` runs with.
    disk_fault_layer: Option<PathBuf>,
}

/// One node's resource use over the run.
#[derive(Clone, Debug, Serialize)]
pub struct NodeUsage {
    pub node: usize,
    /// CPU seconds used since start (all of its processes).
    pub cpu_s: f64,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
}

/// A free TCP port on loopback (free when asked; the small race with other
/// programs is acceptable for a benchmark).
fn free_port() -> Result<u16, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::Cluster(format!("no free port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| BenchError::Cluster(e.to_string()))
}

/// Finds `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// The `fencelock` binary: `explicit`, else `$FENCELOCK_BIN`, else the one
/// beside this executable (same cargo profile; for a test executable in
/// `target/<profile>/deps/`, the one a directory up), else on `PATH`.
pub fn find_fencelock(explicit: Option<&Path>) -> Result<PathBuf, BenchError> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    if let Some(p) = std::env::var_os("FENCELOCK_BIN") {
        return Ok(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        let beside = exe.parent().map(|d| d.join("fencelock"));
        let above = exe
            .parent()
            .filter(|d| d.ends_with("deps"))
            .and_then(Path::parent)
            .map(|d| d.join("fencelock"));
        if let Some(found) = [beside, above].into_iter().flatten().find(|p| p.is_file()) {
            return Ok(found);
        }
    }
    which("fencelock").ok_or_else(|| BenchError::ProgramNotFound {
        program: "fencelock".to_owned(),
        hint: "build it with `cargo build --release --workspace`, or pass --fencelock-bin"
            .to_owned(),
    })
}

/// The `etcd` server binary: `explicit`, else on `PATH`.
pub fn find_etcd(explicit: Option<&Path>) -> Result<PathBuf, BenchError> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    which("etcd").ok_or_else(|| BenchError::ProgramNotFound {
        program: "etcd".to_owned(),
        hint: "install Debian's etcd-server (`make bench` does), or pass --etcd-bin".to_owned(),
    })
}

impl LocalCluster {
    /// Starts three `fencelock serve` processes.
    pub fn start_fencelock(options: ClusterOptions) -> Result<LocalCluster, BenchError> {
        Self::start(options)
    }

    /// Starts three `etcd` members.
    pub fn start_etcd(options: ClusterOptions) -> Result<LocalCluster, BenchError> {
        Self::start(options)
    }

    fn start(options: ClusterOptions) -> Result<LocalCluster, BenchError> {
        if options.dir.exists() {
            std::fs::remove_dir_all(&options.dir).map_err(|e| BenchError::io(&options.dir, e))?;
        }
        std::fs::create_dir_all(&options.dir).map_err(|e| BenchError::io(&options.dir, e))?;
        // Absolute, since the nodes run with it as their working directory.
        let mut options = options;
        options.dir = options
            .dir
            .canonicalize()
            .map_err(|e| BenchError::io(&options.dir, e))?;
        let mut nodes = Vec::new();
        for id in 1..=LOCAL_NODES {
            nodes.push(LocalNode {
                id,
                client_addr: format!("127.0.0.1:{}", free_port()?),
                peer_addr: format!("127.0.0.1:{}", free_port()?),
                child: None,
                past_cpu_s: 0.0,
                past_peak_kib: 0,
            });
        }
        let metrics = options.kind == TargetKind::Etcd;
        let disk_fault_layer = match options.slow_disk_node {
            Some(id)
                if options.kind != TargetKind::Fencelock || !(1..=LOCAL_NODES).contains(&id) =>
            {
                return Err(BenchError::InvalidArgument(format!(
                    "a slow disk is for one of the {LOCAL_NODES} nodes of a fencelock cluster \
                     (etcd does not sync through libc), not node {id} of {}",
                    options.kind.name()
                )));
            }
            Some(_) => Some(diskfault::build_layer(&options.dir)?),
            None => None,
        };
        let mut cluster = LocalCluster {
            options,
            nodes,
            metrics,
            disk_fault_layer,
        };
        if cluster.options.kind == TargetKind::Fencelock {
            cluster.write_fencelock_configs(true)?;
            if cluster.config_accepted() {
                cluster.metrics = true;
            } else {
                cluster.write_fencelock_configs(false)?;
            }
        }
        for id in 1..=LOCAL_NODES {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    fn node_dir(&self, id: usize) -> PathBuf {
        self.options.dir.join(format!("node{id}"))
    }

    fn disk_fault_path(&self, id: usize) -> PathBuf {
        self.options.dir.join(format!("node{id}.diskfault"))
    }

    /// Makes every sync of node `id` wait `delay_ms` first (0: no delay
    /// again). Only the cluster's `slow_disk_node` can be slowed.
    pub fn set_sync_delay_ms(&self, id: usize, delay_ms: u64) -> Result<(), BenchError> {
        // `start` built the layer exactly when `slow_disk_node` is set.
        if self.options.slow_disk_node != Some(id) {
            return Err(BenchError::InvalidArgument(format!(
                "node {id} was not started with the disk-fault layer (slow_disk_node is {:?})",
                self.options.slow_disk_node
            )));
        }
        let path = self.disk_fault_path(id);
        std::fs::write(&path, diskfault::control_text(delay_ms)?)
            .map_err(|e| BenchError::io(&path, e))
    }

    /// Whether this `fencelock` accepts the written config (an older build
    /// refuses the admin HTTP key).
    fn config_accepted(&self) -> bool {
        Command::new(&self.options.program)
            .arg("config")
            .arg("check")
            .arg(self.options.dir.join("node1.toml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn write_fencelock_configs(&self, admin_http: bool) -> Result<(), BenchError> {
        let mut peers = String::from("peers = [\n");
        for n in &self.nodes {
            peers.push_str(&format!(
                "  {{ id = {}, addr = \"{}\" }},\n",
                n.id, n.client_addr
            ));
        }
        peers.push_str("]\n");
        // Benchmarks run on one host without TLS (docs/security.md); as an
        // inline table so that sections may follow.
        peers.push_str("tls = { insecure = true }\n");
        for n in &self.nodes {
            let mut text = format!(
                "node_id = {}\nlisten_addr = \"{}\"\ndata_dir = \"node{}\"\nshard_count = {}\n{peers}",
                n.id, n.client_addr, n.id, self.options.shards
            );
            if admin_http {
                text.insert_str(0, &format!("admin_listen_addr = \"{}\"\n", n.peer_addr));
            }
            if let Some(entries) = self.options.snapshot_entries {
                text.push_str(&format!("[raft]\nsnapshot_interval_entries = {entries}\n"));
            }
            let path = self.options.dir.join(format!("node{}.toml", n.id));
            std::fs::write(&path, text).map_err(|e| BenchError::io(&path, e))?;
        }
        Ok(())
    }

    fn command(&self, id: usize) -> Command {
        let node = &self.nodes[id - 1];
        let mut command = Command::new(&self.options.program);
        match self.options.kind {
            TargetKind::Fencelock => {
                command
                    .arg("serve")
                    .arg("--config")
                    .arg(self.options.dir.join(format!("node{id}.toml")))
                    // Warnings only: logging every request would measure
                    // the logger.
                    .env("RUST_LOG", "warn");
                if let (Some(layer), true) = (
                    &self.disk_fault_layer,
                    self.options.slow_disk_node == Some(id),
                ) {
                    command
                        .env("LD_PRELOAD", layer)
                        .env(diskfault::CONTROL_ENV, self.disk_fault_path(id));
                }
            }
            TargetKind::Etcd => {
                let initial: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| format!("m{}=http://{}", n.id, n.peer_addr))
                    .collect();
                command
                    .arg("--name")
                    .arg(format!("m{id}"))
                    .arg("--data-dir")
                    .arg(self.node_dir(id))
                    .arg("--listen-client-urls")
                    .arg(format!("http://{}", node.client_addr))
                    .arg("--advertise-client-urls")
                    .arg(format!("http://{}", node.client_addr))
                    .arg("--listen-peer-urls")
                    .arg(format!("http://{}", node.peer_addr))
                    .arg("--initial-advertise-peer-urls")
                    .arg(format!("http://{}", node.peer_addr))
                    .arg("--initial-cluster")
                    .arg(initial.join(","))
                    .arg("--initial-cluster-token")
                    .arg("fencelock-bench")
                    .arg("--initial-cluster-state")
                    .arg("new")
                    .arg("--log-level")
                    .arg("warn")
                    .arg("--logger")
                    .arg("zap");
                if let Some(entries) = self.options.snapshot_entries {
                    command.arg("--snapshot-count").arg(entries.to_string());
                }
            }
        }
        command
    }

    fn spawn(&mut self, id: usize) -> Result<(), BenchError> {
        let log_path = self.options.dir.join(format!("node{id}.log"));
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| BenchError::io(&log_path, e))?;
        let log_err = log.try_clone().map_err(|e| BenchError::io(&log_path, e))?;
        let mut command = self.command(id);
        command
            .current_dir(&self.options.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        let child = command.spawn().map_err(|e| {
            BenchError::Cluster(format!(
                "cannot start {}: {e}",
                self.options.program.display()
            ))
        })?;
        self.nodes[id - 1].child = Some(child);
        Ok(())
    }

    /// Client endpoints, `127.0.0.1:port`, node 1 first.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.client_addr.clone()).collect()
    }

    /// URLs of the nodes' Prometheus metrics, where the system serves them:
    /// etcd on its client port, fencelock on its admin HTTP port.
    pub fn metrics_urls(&self) -> Vec<String> {
        if !self.metrics {
            return Vec::new();
        }
        self.nodes
            .iter()
            .map(|n| match self.options.kind {
                TargetKind::Etcd => format!("http://{}/metrics", n.client_addr),
                TargetKind::Fencelock => format!("http://{}/metrics", n.peer_addr),
            })
            .collect()
    }

    /// Where node logs are.
    pub fn dir(&self) -> &Path {
        &self.options.dir
    }

    /// Checks that every started node is still running.
    pub fn check_alive(&mut self) -> Result<(), BenchError> {
        for node in &mut self.nodes {
            if let Some(child) = node.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    // The log's tail goes in the error: the directory is
                    // deleted with the cluster unless --keep-data.
                    let log = self.options.dir.join(format!("node{}.log", node.id));
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
                    return Err(BenchError::Cluster(format!(
                        "node {} exited ({status}); the end of {}:\n{tail}",
                        node.id,
                        log.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Kills node `id` with SIGKILL (a crash: no clean shutdown).
    pub fn kill(&mut self, id: usize) -> Result<(), BenchError> {
        let node = &mut self.nodes[id - 1];
        if let Some(mut child) = node.child.take() {
            if let Some(s) = procstat::sample(child.id()) {
                node.past_cpu_s += s.cpu_s;
                node.past_peak_kib = node.past_peak_kib.max(s.peak_rss_kib);
            }
            child
                .kill()
                .map_err(|e| BenchError::Cluster(format!("kill node {id}: {e}")))?;
            let _ = child.wait();
        }
        Ok(())
    }

    /// Starts node `id` again on its old data.
    pub fn restart(&mut self, id: usize) -> Result<(), BenchError> {
        if self.nodes[id - 1].child.is_none() {
            self.spawn(id)?;
        }
        Ok(())
    }

    /// Every node's CPU and memory so far.
    pub fn usage(&self) -> Vec<NodeUsage> {
        self.nodes
            .iter()
            .map(|n| {
                let now = n
                    .child
                    .as_ref()
                    .and_then(|c| procstat::sample(c.id()))
                    .unwrap_or_default();
                NodeUsage {
                    node: n.id,
                    cpu_s: n.past_cpu_s + now.cpu_s,
                    rss_mib: kib_to_mib(now.rss_kib),
                    peak_rss_mib: kib_to_mib(now.peak_rss_kib.max(n.past_peak_kib)),
                }
            })
            .collect()
    }

    /// Raw samples of the running processes (for tests).
    pub fn samples(&self) -> Vec<Option<ProcSample>> {
        self.nodes
            .iter()
            .map(|n| n.child.as_ref().and_then(|c| procstat::sample(c.id())))
            .collect()
    }

    /// Stops every node: SIGTERM, then SIGKILL after a grace period.
    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = node.child.as_ref() {
                // SAFETY: kill(2) on our own child's pid.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_millis(STOP_GRACE_MS);
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
        if !self.options.keep {
            let _ = std::fs::remove_dir_all(&self.options.dir);
        }
    }
}

fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
