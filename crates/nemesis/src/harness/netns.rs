//! A private network for the node processes: one network namespace per
//! node, each with a veth link onto one bridge in the host namespace, and
//! partitions as packet drops inside the namespaces.
//!
//! Why namespaces: every node gets its own IP address (10.231.K.N) and
//! listens on the same port, so every node's config lists the SAME peer
//! addresses — the placement map is bootstrapped from that list and must be
//! byte-identical on all nodes, which rules out per-link TCP proxies that
//! would give each node different peer addresses. The harness (in the host
//! namespace) reaches every node through the bridge; clients are never
//! partitioned, only node-to-node links are.
//!
//! Why policy-routing drops and not iptables: this kernel has no `tc`
//! actions or `netem`, and the `iptables` tool is not installed, while
//! iproute2 (needed for the namespaces anyway) can drop packets in the
//! kernel with a `blackhole` routing rule on the *input* path:
//! `ip rule add from <peer> blackhole` inside a node's namespace makes the
//! kernel silently discard every packet from that peer, exactly like
//! `iptables -A INPUT -s <peer> -j DROP`. Dropping (not rejecting) is what a
//! real partition looks like: connections hang and time out instead of
//! failing fast. A link is cut in one direction by a rule at its receiver,
//! so asymmetric partitions are possible; the shapes we use cut both ways.
//! The rules must come before the `local` table's lookup, which by default
//! has priority 0, so each namespace moves it behind ours.
//!
//! Names carry the harness's pid; namespaces and bridges left by a harness
//! that died (SIGKILL, a crashed test) are deleted by the next one.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::grudge::{dropped_at, Grudge};

/// Priority of the partition rules; the `local` lookup moves behind them.
const DROP_RULE_PRIORITY: u32 = 1000;
const LOCAL_RULE_PRIORITY: u32 = 2000;
/// The /16 the node subnets come from; the third octet is picked free.
const SUBNET_BASE: &str = "10.231";
/// The host's (harness's) address on the bridge.
const HOST_OCTET: u64 = 254;
const NETNS_DIR: &str = "/var/run/netns";
const NAME_PREFIX: &str = "fencelock-";
/// Serialises network creation between harness processes on one machine.
const LOCK_FILE: &str = "/tmp/fencelock-nemesis-netns.lock";

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network namespaces need root (the harness runs `ip netns`); run as root or in a container with CAP_NET_ADMIN")]
    NotRoot,
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("cannot run `ip`: {0} (install iproute2)")]
    NoIpTool(std::io::Error),
    #[error("no free subnet under {SUBNET_BASE}.0.0/16")]
    NoFreeSubnet,
    #[error("cannot lock {LOCK_FILE}: {0}")]
    Lock(std::io::Error),
}

fn ip(args: &[&str]) -> Result<String, NetError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(NetError::NoIpTool)?;
    if !out.status.success() {
        return Err(NetError::Command {
            command: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The network of one run.
pub struct Network {
    pid_tag: String,
    bridge: String,
    subnet: String,
    nodes: Vec<u64>,
}

impl Network {
    /// Creates the bridge and one namespace per node.
    pub fn create(nodes: &[u64]) -> Result<Network, NetError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NetError::NotRoot);
        }
        // Picking a subnet and taking it must not interleave with another
        // network doing the same, in this process or another harness.
        static CREATING: Mutex<()> = Mutex::new(());
        let _creating = CREATING.lock().unwrap_or_else(|e| e.into_inner());
        let _machine_wide = MachineLock::take()?;
        remove_stale();
        // The pid names the owner (for stale cleanup); the counter lets one
        // process run several networks (tests in parallel).
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % 16;
        let pid_tag = format!("{:06x}{n:x}", std::process::id());
        let subnet = free_subnet()?;
        let net = Network {
            bridge: format!("flb{pid_tag}"),
            pid_tag,
            subnet,
            nodes: nodes.to_vec(),
        };
        // From here on Drop cleans up whatever was made.
        net.build()?;
        Ok(net)
    }

    fn build(&self) -> Result<(), NetError> {
        let host_cidr = format!("{}.{HOST_OCTET}/24", self.subnet);
        ip(&["link", "add", &self.bridge, "type", "bridge"])?;
        ip(&["addr", "add", &host_cidr, "dev", &self.bridge])?;
        ip(&["link", "set", &self.bridge, "up"])?;
        for &id in &self.nodes {
            let ns = self.netns(id);
            let host_end = format!("flv{}{id}", self.pid_tag);
            let node_end = format!("fln{}{id}", self.pid_tag);
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &node_end,
            ])?;
            ip(&["link", "set", &host_end, "master", &self.bridge])?;
            ip(&["link", "set", &host_end, "up"])?;
            ip(&["link", "set", &node_end, "netns", &ns])?;
            let cidr = format!("{}/24", self.node_ip(id));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", &node_end])?;
            ip(&["-n", &ns, "link", "set", &node_end, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let local = LOCAL_RULE_PRIORITY.to_string();
            ip(&["-n", &ns, "rule", "add", "pref", &local, "lookup", "local"])?;
            ip(&["-n", &ns, "rule", "del", "pref", "0"])?;
        }
        Ok(())
    }

    /// The namespace node `id` runs in.
    pub fn netns(&self, id: u64) -> String {
        format!("{NAME_PREFIX}{}-n{id}", self.pid_tag)
    }

    pub fn node_ip(&self, id: u64) -> String {
        format!("{}.{id}", self.subnet)
    }

    /// Cuts exactly the links in `grudge` (replacing any earlier cut).
    pub fn partition(&self, grudge: &Grudge) -> Result<(), NetError> {
        self.heal()?;
        for &id in &self.nodes {
            let ns = self.netns(id);
            for from in dropped_at(grudge, id) {
                let pref = DROP_RULE_PRIORITY.to_string();
                let src = self.node_ip(from);
                ip(&[
                    "-n",
                    &ns,
                    "rule",
                    "add",
                    "pref",
                    &pref,
                    "from",
                    &src,
                    "blackhole",
                ])?;
            }
        }
        Ok(())
    }

    /// Removes every partition rule.
    pub fn heal(&self) -> Result<(), NetError> {
        let pref = DROP_RULE_PRIORITY.to_string();
        for &id in &self.nodes {
            let ns = self.netns(id);
            // `ip rule del pref P` removes one rule per call; stop when none
            // is left (the call then fails).
            while ip(&["-n", &ns, "rule", "del", "pref", &pref]).is_ok() {}
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for &id in &self.nodes {
            // Deleting the namespace deletes its veth end, and with it the
            // host end.
            let _ = ip(&["netns", "del", &self.netns(id)]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// An exclusive `flock` on [`LOCK_FILE`], released when dropped (or when the
/// process dies).
struct MachineLock {
    /// Held, not read: closing it releases the lock.
    _file: std::fs::File,
}

impl MachineLock {
    fn take() -> Result<MachineLock, NetError> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(LOCK_FILE)
            .map_err(NetError::Lock)?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(NetError::Lock(std::io::Error::last_os_error()));
        }
        Ok(MachineLock { _file: file })
    }
}

/// A /24 under [`SUBNET_BASE`] that no address or route on the host uses.
fn free_subnet() -> Result<String, NetError> {
    let used = ip(&["-4", "addr"])? + &ip(&["-4", "route"])?;
    (0..=255u32)
        .map(|k| format!("{SUBNET_BASE}.{k}"))
        .find(|s| !used.contains(&format!("{s}.")))
        .ok_or(NetError::NoFreeSubnet)
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Deletes namespaces and bridges whose harness process is gone.
fn remove_stale() {
    if let Ok(entries) = std::fs::read_dir(NETNS_DIR) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
                continue;
            };
            let pid = rest.get(..6).and_then(|h| u32::from_str_radix(h, 16).ok());
            if pid.is_some_and(|pid| !pid_alive(pid)) {
                let _ = ip(&["netns", "del", &name]);
            }
        }
    }
    if let Ok(links) = ip(&["-o", "link", "show", "type", "bridge"]) {
        for line in links.lines() {
            let Some(name) = line.split(": ").nth(1) else {
                continue;
            };
            let Some(hex) = name.strip_prefix("flb").and_then(|h| h.get(..6)) else {
                continue;
            };
            if u32::from_str_radix(hex, 16).is_ok_and(|pid| !pid_alive(pid)) {
                let _ = ip(&["link", "del", name]);
            }
        }
    }
}
