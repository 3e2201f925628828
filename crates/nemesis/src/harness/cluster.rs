//! The node processes: `fencelock serve`, one per network namespace, each
//! with its own data directory; and the operations the nemesis performs on
//! them (SIGKILL and restart from the same data, SIGSTOP, SIGCONT) and on
//! the cluster (the admin API).
//!
//! Every node's config lists the same peers (their namespace addresses, one
//! port), so the bootstrapped placement map is identical everywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock_api::v1::admin_service_client::AdminServiceClient;
use fencelock_api::v1::ListShardsRequest;
use fencelock_api::v1::ListShardsResponse;
use tonic::transport::{Channel, Endpoint};

use super::netns::{NetError, Network};

/// The port every node listens on, in its own namespace.
pub const NODE_PORT: u16 = 7100;
/// Admin calls that take longer than this are abandoned (they resume or
/// are finished by a later call; see docs/operations.md).
pub const ADMIN_TIMEOUT_MS: u64 = 20_000;

/// Raft timing of the test cluster: fast elections keep runs short.
pub const TICK_INTERVAL_MS: u64 = 50;
pub const ELECTION_TICKS: u64 = 10;
pub const PROPOSAL_TIMEOUT_MS: u64 = 2_000;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("node {id}: {what}: {source}")]
    Io {
        id: u64,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the cluster did not get a leader for every shard within {within_ms} ms: {last}")]
    NotReady { within_ms: u64, last: String },
    #[error("no node answered the admin call: {0}")]
    Admin(String),
    #[error(
        "the disk- and clock-fault layer could not be built (it needs a C compiler, `cc`): {0}"
    )]
    DiskFaultLayer(String),
}

/// What a node's disk does to calls that make data durable (the
/// LD_PRELOAD layer in `crates/nemesis/faults/diskfault.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    Healthy,
    /// fsync, fdatasync and sync_file_range fail with EIO.
    Eio,
    /// Each of them waits this many milliseconds first.
    Slow {
        delay_ms: u64,
    },
    /// Syncs go through; statvfs says at most this many bytes are free (a
    /// disk running full, as the node's free-space watcher sees it).
    Low {
        free_bytes: u64,
    },
}

/// What a node's clocks do (the LD_PRELOAD layer in
/// `crates/nemesis/faults/clockfault.c`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockFault {
    /// The wall clock reads this far off true time (negative: behind).
    pub step_ms: i64,
    /// Every clock runs this many parts per million fast (negative: slow).
    pub rate_ppm: i64,
}

/// The fault layers' sources, compiled into each run's directory as one
/// library.
const FAULT_SOURCES: [(&str, &str); 2] = [
    ("diskfault.c", include_str!("../../faults/diskfault.c")),
    ("clockfault.c", include_str!("../../faults/clockfault.c")),
];

/// Builds the disk- and clock-fault layer into `dir`, returning the
/// library's path.
fn build_disk_fault_layer(dir: &Path) -> Result<PathBuf, ClusterError> {
    let library = dir.join("libnodefaults.so");
    let mut sources = Vec::new();
    for (name, text) in FAULT_SOURCES {
        let source = dir.join(name);
        std::fs::write(&source, text)
            .map_err(|e| ClusterError::DiskFaultLayer(format!("{}: {e}", source.display())))?;
        sources.push(source);
    }
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .args(&sources)
        .args(["-ldl", "-lpthread"])
        .output()
        .map_err(|e| ClusterError::DiskFaultLayer(format!("running cc: {e}")))?;
    if !out.status.success() {
        return Err(ClusterError::DiskFaultLayer(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(library)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    Running,
    Paused,
    Killed,
}

struct NodeProc {
    child: Option<Child>,
    state: NodeState,
}

/// Failpoints armed in a node process (`FAILPOINTS`), for binaries built
/// with the server's `failpoints` feature.
pub type Failpoints = Option<String>;

pub struct Cluster {
    /// The members started so far (by [`Cluster::start`] or
    /// [`Cluster::join`]).
    pub ids: Vec<u64>,
    pub shard_count: u32,
    bin: PathBuf,
    dir: PathBuf,
    net: Network,
    procs: BTreeMap<u64, NodeProc>,
    /// Appended to every node's config (e.g. a `[controller]` section).
    extra_config: String,
    /// Nodes that joined a running cluster (`join = true`).
    joined: Vec<u64>,
    /// The pid of each node's running process, for observers that must not
    /// hold the cluster (the soak's resource sampler).
    pids: NodePids,
    /// The disk- and clock-fault layer every node is started with.
    disk_fault_layer: PathBuf,
    /// Nodes started from another `fencelock` binary than `bin` (a rolling
    /// upgrade: the previous release's, then this one's).
    bins: BTreeMap<u64, PathBuf>,
}

/// Each node's current process id (absent while killed), shared with
/// observers; updated on every spawn, kill and reaped crash.
#[derive(Clone, Debug, Default)]
pub struct NodePids(Arc<Mutex<BTreeMap<u64, u32>>>);

impl NodePids {
    /// The running process of every node now.
    pub fn now(&self) -> BTreeMap<u64, u32> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, id: u64, pid: Option<u32>) {
        let mut pids = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match pid {
            Some(pid) => pids.insert(id, pid),
            None => pids.remove(&id),
        };
    }
}

/// Makes the child die (SIGKILL) when the harness dies, even by SIGKILL
/// (a CI timeout): a node left running would hold its namespace's address
/// and burn CPU for every later run. The setting survives `execve`. It fires
/// when the spawning *thread* ends, so nodes are spawned from runtime
/// threads that live as long as the run (never from `spawn_blocking`).
pub fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid of our own child and a valid signal.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// How long [`Cluster::busiest_leader`] waits for elections to end: a few
/// election timeouts.
const LEADER_WAIT: Duration = Duration::from_secs(5);

impl Cluster {
    /// Writes configs under `dir` and starts `nodes` nodes.
    pub fn start(
        bin: &Path,
        dir: &Path,
        nodes: u64,
        shard_count: u32,
    ) -> Result<Cluster, ClusterError> {
        Cluster::start_with(bin, dir, nodes, 0, shard_count, String::new())
    }

    /// Like [`Cluster::start`], with `spares` more namespaces for nodes to
    /// [`Cluster::join`] later (ids `nodes + 1..`), and `extra_config`
    /// appended to every node's config.
    pub fn start_with(
        bin: &Path,
        dir: &Path,
        nodes: u64,
        spares: u64,
        shard_count: u32,
        extra_config: String,
    ) -> Result<Cluster, ClusterError> {
        let ids: Vec<u64> = (1..=nodes).collect();
        let all: Vec<u64> = (1..=nodes + spares).collect();
        let net = Network::create(&all)?;
        let disk_fault_layer = build_disk_fault_layer(dir)?;
        let mut cluster = Cluster {
            ids: ids.clone(),
            shard_count,
            bin: bin.to_owned(),
            dir: dir.to_owned(),
            net,
            procs: BTreeMap::new(),
            extra_config,
            joined: Vec::new(),
            pids: NodePids::default(),
            disk_fault_layer,
            bins: BTreeMap::new(),
        };
        for &id in &ids {
            cluster.write_config(id)?;
            cluster.spawn(id, None)?;
        }
        Ok(cluster)
    }

    fn write_config(&self, id: u64) -> Result<(), ClusterError> {
        std::fs::write(self.config_path(id), self.config_text(id)).map_err(|source| {
            ClusterError::Io {
                id,
                what: "write config",
                source,
            }
        })
    }

    /// Starts node `id` (a spare namespace) empty with `join = true` and
    /// adds it to the placement map, as docs/operations.md "Add a node"
    /// does. It holds nothing until replicas are moved to it.
    pub async fn join(&mut self, id: u64) -> Result<(), ClusterError> {
        if self.ids.contains(&id) {
            return Err(ClusterError::Admin(format!(
                "node {id} is a member already"
            )));
        }
        self.ids.push(id);
        self.joined.push(id);
        self.write_config(id)?;
        self.spawn(id, None)?;
        let request = fencelock_api::v1::AddNodeRequest {
            address: self.addr(id),
            node_id: id,
        };
        let mut last = String::from("no running member");
        for attempt in 0..10u64 {
            for member in self.running(attempt) {
                if member == id {
                    continue;
                }
                match self.admin_client(member).add_node(request.clone()).await {
                    Ok(_) => return Ok(()),
                    Err(status) => last = format!("node {member}: {}", status.message()),
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(ClusterError::Admin(format!("adding node {id}: {last}")))
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("data{id}"))
    }

    /// The process ids of the nodes, kept current as they are killed and
    /// restarted.
    pub fn pids(&self) -> NodePids {
        self.pids.clone()
    }

    fn disk_fault_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("disk{id}.fault"))
    }

    fn clock_fault_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("clock{id}.fault"))
    }

    /// Makes node `id`'s clocks behave as `fault` within 20 ms (running or
    /// not: a restarted node keeps it until set back).
    pub fn set_clock_fault(&self, id: u64, fault: ClockFault) -> Result<(), ClusterError> {
        let text = format!("step {} rate {}", fault.step_ms, fault.rate_ppm);
        std::fs::write(self.clock_fault_path(id), text).map_err(|source| ClusterError::Io {
            id,
            what: "write the clock-fault control file",
            source,
        })
    }

    /// Makes node `id`'s disk behave as `fault` from its next sync on
    /// (running or not: a restarted node keeps it until set back).
    pub fn set_disk_fault(&self, id: u64, fault: DiskFault) -> Result<(), ClusterError> {
        let verb = match fault {
            DiskFault::Healthy => String::new(),
            DiskFault::Eio => "eio".to_owned(),
            DiskFault::Slow { delay_ms } => format!("delay {delay_ms}"),
            DiskFault::Low { free_bytes } => format!("free {free_bytes}"),
        };
        std::fs::write(self.disk_fault_path(id), verb).map_err(|source| ClusterError::Io {
            id,
            what: "write the disk-fault control file",
            source,
        })
    }

    fn config_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node{id}.toml"))
    }

    fn config_text(&self, id: u64) -> String {
        let peers: Vec<String> = self
            .ids
            .iter()
            .map(|p| format!("{{ id = {p}, addr = \"{}\" }}", self.addr(*p)))
            .collect();
        let join = if self.joined.contains(&id) {
            "join = true\n"
        } else {
            ""
        };
        format!(
            "node_id = {id}\nlisten_addr = \"{}\"\ndata_dir = \"{}\"\nshard_count = {}\n{join}peers = [{}]\n\n\
             [raft]\ntick_interval_ms = {TICK_INTERVAL_MS}\nelection_ticks = {ELECTION_TICKS}\n\
             proposal_timeout_ms = {PROPOSAL_TIMEOUT_MS}\n\n\
             # Fault-injection runs on one host: no TLS (docs/security.md).\n\
             [tls]\ninsecure = true\n{}",
            self.addr(id),
            self.data_dir(id).display(),
            self.shard_count,
            peers.join(", "),
            self.extra_config,
        )
    }

    fn spawn(&mut self, id: u64, failpoints: Failpoints) -> Result<(), ClusterError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .map_err(|source| ClusterError::Io {
                id,
                what: "open log",
                source,
            })?;
        // `ip netns exec` enters the namespace and then execs the program
        // (no fork), so the child's pid is the node's: signals reach it.
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.net.netns(id)])
            .arg(self.bins.get(&id).unwrap_or(&self.bin))
            .arg("serve")
            .arg("--config")
            .arg(self.config_path(id))
            .env("RUST_LOG", "warn")
            .env("FAILPOINTS", failpoints.unwrap_or_default())
            .env("LD_PRELOAD", &self.disk_fault_layer)
            .env("FENCELOCK_DISK_FAULT_FILE", self.disk_fault_path(id))
            .env("FENCELOCK_CLOCK_FAULT_FILE", self.clock_fault_path(id))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        die_with_parent(&mut command);
        let child = command.spawn().map_err(|source| ClusterError::Io {
            id,
            what: "spawn",
            source,
        })?;
        self.pids.set(id, Some(child.id()));
        self.procs.insert(
            id,
            NodeProc {
                child: Some(child),
                state: NodeState::Running,
            },
        );
        Ok(())
    }

    pub fn addr(&self, id: u64) -> String {
        format!("{}:{NODE_PORT}", self.net.node_ip(id))
    }

    pub fn endpoint(&self, id: u64) -> String {
        format!("http://{}", self.addr(id))
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.ids.iter().map(|id| self.endpoint(*id)).collect()
    }

    pub fn network(&self) -> &Network {
        &self.net
    }

    pub fn state(&self, id: u64) -> NodeState {
        self.procs.get(&id).map_or(NodeState::Killed, |p| p.state)
    }

    /// SIGKILL: the process ends at once; only what it synced survives.
    pub fn kill(&mut self, id: u64) {
        if let Some(p) = self.procs.get_mut(&id) {
            if let Some(mut child) = p.child.take() {
                // A stopped process dies of SIGKILL too.
                let _ = child.kill();
                let _ = child.wait();
            }
            p.state = NodeState::Killed;
            self.pids.set(id, None);
        }
    }

    /// Runs node `id` from `bin` from its next start on.
    pub fn set_bin(&mut self, id: u64, bin: &Path) {
        self.bins.insert(id, bin.to_owned());
    }

    /// One step of a rolling upgrade: stops node `id` as an operator would
    /// (SIGTERM: it hands its leaderships over and exits; SIGKILL after
    /// `within`), then starts it from `bin` on the same data directory.
    /// Returns how the old process ended.
    pub async fn upgrade(
        &mut self,
        id: u64,
        bin: &Path,
        within: Duration,
    ) -> Result<String, ClusterError> {
        let mut ended = "was not running".to_owned();
        if let Some(p) = self.procs.get_mut(&id) {
            if let Some(mut child) = p.child.take() {
                signal(child.id(), libc::SIGTERM);
                let deadline = tokio::time::Instant::now() + within;
                ended = loop {
                    if let Ok(Some(status)) = child.try_wait() {
                        break format!("stopped ({status})");
                    }
                    if tokio::time::Instant::now() > deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        break format!("did not stop within {} ms: killed", within.as_millis());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
            }
            p.state = NodeState::Killed;
            self.pids.set(id, None);
        }
        self.set_bin(id, bin);
        self.spawn(id, None)?;
        Ok(ended)
    }

    /// Starts a killed node again from its data directory.
    pub fn restart(&mut self, id: u64) -> Result<(), ClusterError> {
        if self.state(id) == NodeState::Killed {
            self.spawn(id, None)?;
        }
        Ok(())
    }

    /// Kills node `id` (if running) and starts it again with `failpoints`
    /// armed (`None`: disarmed). A node a failpoint made exit is reaped
    /// here, so it never counts as a crash.
    pub fn restart_with(&mut self, id: u64, failpoints: Failpoints) -> Result<(), ClusterError> {
        self.kill(id);
        self.spawn(id, failpoints)
    }

    pub fn pause(&mut self, id: u64) {
        if let Some(p) = self.procs.get_mut(&id) {
            if let (Some(child), NodeState::Running) = (&p.child, p.state) {
                signal(child.id(), libc::SIGSTOP);
                p.state = NodeState::Paused;
            }
        }
    }

    pub fn resume(&mut self, id: u64) {
        if let Some(p) = self.procs.get_mut(&id) {
            if let (Some(child), NodeState::Paused) = (&p.child, p.state) {
                signal(child.id(), libc::SIGCONT);
                p.state = NodeState::Running;
            }
        }
    }

    /// Resumes paused nodes and restarts killed ones.
    pub fn revive_all(&mut self) -> Result<(), ClusterError> {
        for id in self.ids.clone() {
            match self.state(id) {
                NodeState::Paused => self.resume(id),
                NodeState::Killed => self.restart(id)?,
                NodeState::Running => {}
            }
        }
        Ok(())
    }

    /// Whether node `id`'s process has exited (it stays listed as running
    /// until reaped by [`Cluster::kill`] or [`Cluster::crashed`]).
    pub fn has_exited(&mut self, id: u64) -> bool {
        self.procs
            .get_mut(&id)
            .and_then(|p| p.child.as_mut())
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Node `id`'s exit status if its process has exited, reaping it (so it
    /// is not counted as a crash); `None` while it runs.
    pub fn reap(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let p = self.procs.get_mut(&id)?;
        let status = p.child.as_mut()?.try_wait().ok()??;
        p.child = None;
        p.state = NodeState::Killed;
        self.pids.set(id, None);
        Some(status)
    }

    /// Where node `id`'s stderr goes (appended across restarts).
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node{id}.log"))
    }

    /// Nodes whose process exited on its own (a crash, not our SIGKILL).
    pub fn crashed(&mut self) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        for (id, p) in self.procs.iter_mut() {
            if let Some(child) = p.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    out.push((*id, status.to_string()));
                    self.pids.set(*id, None);
                    p.child = None;
                    p.state = NodeState::Killed;
                }
            }
        }
        out
    }

    pub fn admin_client(&self, id: u64) -> AdminServiceClient<Channel> {
        let channel = Endpoint::from_shared(self.endpoint(id))
            .expect("endpoint URLs are built here")
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_millis(ADMIN_TIMEOUT_MS))
            .connect_lazy();
        AdminServiceClient::new(channel)
    }

    /// Running nodes, in a rotation chosen by `pick`.
    pub fn running(&self, pick: u64) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .ids
            .iter()
            .copied()
            .filter(|id| self.state(*id) == NodeState::Running)
            .collect();
        if !ids.is_empty() {
            let k = (pick % ids.len() as u64) as usize;
            ids.rotate_left(k);
        }
        ids
    }

    /// The shard list from the first running node that answers.
    pub async fn shards(&self) -> Result<ListShardsResponse, ClusterError> {
        let mut last = String::from("no running node");
        for id in self.running(0) {
            let mut client = self.admin_client(id);
            let call = client.list_shards(ListShardsRequest { shard_ids: vec![] });
            match tokio::time::timeout(Duration::from_secs(3), call).await {
                Ok(Ok(list)) => return Ok(list.into_inner()),
                Ok(Err(status)) => last = format!("node {id}: {}", status.message()),
                Err(_) => last = format!("node {id}: timed out"),
            }
        }
        Err(ClusterError::Admin(last))
    }

    /// Waits until every shard reports a leader.
    pub async fn wait_ready(&self, within: Duration) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let last = match self.shards().await {
                Ok(list)
                    if list.shards.len() > self.shard_count as usize
                        && list.shards.iter().all(|s| s.leader_node_id != 0) =>
                {
                    return Ok(())
                }
                Ok(list) => format!(
                    "shards without a leader: {:?}",
                    list.shards
                        .iter()
                        .filter(|s| s.leader_node_id == 0)
                        .map(|s| s.shard_id)
                        .collect::<Vec<_>>()
                ),
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(ClusterError::NotReady {
                    within_ms: within.as_millis() as u64,
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The node leading the most shards, with those shards. Right after a
    /// fault heals (a lost majority, say) every shard may still be electing:
    /// it waits up to [`LEADER_WAIT`] for a leader rather than report none.
    pub async fn busiest_leader(&self) -> Result<(u64, Vec<u64>), ClusterError> {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        loop {
            let list = self.shards().await?;
            let mut led: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            for s in &list.shards {
                if s.leader_node_id != 0 {
                    led.entry(s.leader_node_id).or_default().push(s.shard_id);
                }
            }
            if let Some(busiest) = led.into_iter().max_by_key(|(_, shards)| shards.len()) {
                return Ok(busiest);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClusterError::Admin("no shard has a leader".into()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.procs.values_mut() {
            if let Some(mut child) = p.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
