//! An in-process cluster: real nodes (RocksDB in temp dirs, gRPC on
//! loopback, the real peer transport) in one test process, with network
//! faults injected through `NetworkRules` and crash/restart of nodes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{
    AcquireRequest, AcquireResponse, ErrorDetail, GetRequest, GetResponse, Reason, ReleaseRequest,
    RenewRequest, RenewResponse,
};
use fencelock_server::config::NodeConfig;
use fencelock_server::netfilter::NetworkRules;
use fencelock_server::node::Node;
use tonic::transport::Channel;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub configs: BTreeMap<u64, NodeConfig>,
    pub nodes: BTreeMap<u64, Node>,
    pub rules: BTreeMap<u64, Arc<NetworkRules>>,
}

/// The `fencelock` binary (crates/cli) that `cargo test --workspace` built
/// beside this test binary: `target/debug/deps/<test>` → `target/debug/
/// fencelock` (or `FENCELOCK_BIN`). Panics saying how to build it.
pub fn fencelock_bin() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("FENCELOCK_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("fencelock"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no fencelock binary next to {}: run these tests with `cargo test --workspace` \
                 (which builds crates/cli) or set FENCELOCK_BIN",
                exe.display()
            )
        })
}

/// A port free on loopback now that no earlier call in this process handed
/// out (see [`free_ports`]).
pub fn free_port() -> u16 {
    free_ports(1)
}

/// The first of `n` consecutive ports free on loopback now, none of them
/// handed out before in this process (the tests of one binary run side by
/// side; a cluster once got the same port for two of its nodes).
///
/// The ports lie below the kernel's ephemeral range: a node that is
/// restarted, or started minutes after its port was picked (the fourth node
/// of the admin test), must find it still free, and a port in the ephemeral
/// range can meanwhile become the local end of any outgoing connection of
/// the machine (a CI run once failed with "node 4 did not start").
pub fn free_ports(n: u16) -> u16 {
    use rand::Rng as _;
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    assert!((1..=16).contains(&n), "{n} ports in a row");
    let (low, high) = below_ephemeral_range();
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let base = rng.random_range(low..high - n);
        let mut handed_out = HANDED_OUT.lock().unwrap();
        let all_free = (base..base + n).all(|port| {
            !handed_out.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        });
        if all_free {
            handed_out.extend(base..base + n);
            return base;
        }
    }
    panic!("no {n} consecutive free ports in {low}..{high}");
}

/// Ports for test servers: from 10000 up to the start of the ephemeral
/// range (`net.ipv4.ip_local_port_range`, 32768 by default).
fn below_ephemeral_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    assert!(
        ephemeral_low > 12_000,
        "the ephemeral port range starts at {ephemeral_low}: no room for test ports below it"
    );
    (10_000, ephemeral_low)
}

impl Cluster {
    pub async fn start(n: u64, tweak: impl Fn(&mut NodeConfig)) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let peers: BTreeMap<u64, String> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let mut configs = BTreeMap::new();
        for id in 1..=n {
            let mut c =
                NodeConfig::for_test(id, dir.path().join(format!("node{id}")), peers.clone());
            tweak(&mut c);
            configs.insert(id, c);
        }
        let mut cluster = Cluster {
            dir,
            configs,
            nodes: BTreeMap::new(),
            rules: (1..=n)
                .map(|id| (id, Arc::new(NetworkRules::default())))
                .collect(),
        };
        for id in 1..=n {
            cluster.restart(id).await;
        }
        cluster.wait_for_leaders(Duration::from_secs(20)).await;
        cluster
    }

    pub async fn restart(&mut self, id: u64) {
        let node = Node::start_with_rules(self.configs[&id].clone(), self.rules[&id].clone())
            .await
            .expect("node starts");
        self.nodes.insert(id, node);
    }

    /// Stops a node abruptly from the cluster's point of view (its process
    /// state is gone; only what it wrote to RocksDB survives).
    pub async fn crash(&mut self, id: u64) {
        if let Some(node) = self.nodes.remove(&id) {
            node.shutdown().await;
        }
    }

    pub fn wipe(&self, id: u64) {
        let _ = std::fs::remove_dir_all(&self.configs[&id].data_dir);
    }

    pub fn endpoint(&self, id: u64) -> String {
        format!("http://{}", self.configs[&id].listen_addr)
    }

    /// Waits until every shard has a ready leader among the running nodes.
    pub async fn wait_for_leaders(&self, within: Duration) {
        let deadline = Instant::now() + within;
        // The data shards plus the meta shard (placement), as bootstrapped.
        let shards = self.configs.values().next().unwrap().shard_count as usize + 1;
        loop {
            let mut led = std::collections::BTreeSet::new();
            for node in self.nodes.values() {
                for s in node.shard_status() {
                    if s.is_leader {
                        led.insert(s.shard_id);
                    }
                }
            }
            if led.len() == shards {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {shards} shards have a leader",
                led.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The node that leads `shard_id`, if any running node says so.
    pub fn leader_of(&self, shard_id: u64) -> Option<u64> {
        self.nodes
            .iter()
            .find(|(_, n)| {
                n.shard_status()
                    .iter()
                    .any(|s| s.shard_id == shard_id && s.is_leader)
            })
            .map(|(id, _)| *id)
    }

    pub async fn admin(
        &self,
        id: u64,
    ) -> fencelock_api::v1::admin_service_client::AdminServiceClient<Channel> {
        fencelock_api::v1::admin_service_client::AdminServiceClient::connect(self.endpoint(id))
            .await
            .expect("connect")
    }

    pub async fn client(&self, id: u64) -> LockServiceClient<Channel> {
        LockServiceClient::connect(self.endpoint(id))
            .await
            .expect("connect")
    }
}

/// Runs `call` against `start_node`, following NOT_LEADER hints and retrying
/// retryable refusals until `within` runs out. Returns the last error.
pub async fn with_leader<T, F, Fut>(
    cluster: &Cluster,
    start_node: u64,
    within: Duration,
    call: F,
) -> Result<T, ErrorDetail>
where
    F: FnMut(LockServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let running: Vec<String> = cluster
        .nodes
        .keys()
        .map(|id| cluster.endpoint(*id))
        .collect();
    call_endpoints(&cluster.endpoint(start_node), &running, within, call).await
}

/// Runs `call` against `first`, following NOT_LEADER hints and otherwise
/// trying `endpoints` in turn on transient refusals (no leader yet, no
/// quorum, unknown outcome, unreachable) until `within` runs out.
pub async fn call_endpoints<T, F, Fut>(
    first: &str,
    endpoints: &[String],
    within: Duration,
    mut call: F,
) -> Result<T, ErrorDetail>
where
    F: FnMut(LockServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + within;
    let mut endpoint = first.to_string();
    let mut attempt = 0usize;
    loop {
        let connect = LockServiceClient::connect(endpoint.clone());
        let result = match tokio::time::timeout(Duration::from_secs(1), connect).await {
            Ok(Ok(client)) => call(client).await,
            _ => Err(tonic::Status::unavailable("connect failed")),
        };
        let status = match result {
            Ok(v) => return Ok(v),
            Err(status) => status,
        };
        let detail = ErrorDetail::from_status(&status).unwrap_or_else(|| ErrorDetail {
            reason: Reason::Unspecified as i32,
            message: status.message().to_string(),
            ..Default::default()
        });
        let retryable = matches!(
            detail.reason(),
            Reason::NotLeader
                | Reason::LeaderUnknown
                | Reason::LeaderNotReady
                | Reason::NoQuorum
                | Reason::OutcomeUnknown
                | Reason::Unspecified
                | Reason::ServerBusy
                | Reason::ShuttingDown
                | Reason::EpochNotMatch
                | Reason::ShardNotFound
        );
        if !retryable || Instant::now() >= deadline {
            return Err(detail);
        }
        match detail.leader.as_ref().map(|l| l.address.clone()) {
            Some(addr) if detail.reason() == Reason::NotLeader && !addr.is_empty() => {
                endpoint = format!("http://{addr}");
            }
            _ => {
                attempt += 1;
                endpoint = endpoints[attempt % endpoints.len()].clone();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

pub fn acquire_req(resource: &str, request_id: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.into(),
        request_id: request_id.as_bytes().to_vec(),
        lease_ttl_ms: ttl_ms,
        wait_timeout_ms: wait_ms,
    }
}

pub async fn acquire(
    cluster: &Cluster,
    node: u64,
    req: AcquireRequest,
) -> Result<AcquireResponse, ErrorDetail> {
    with_leader(cluster, node, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.acquire(req).await.map(|r| r.into_inner()) }
    })
    .await
}

pub async fn get(cluster: &Cluster, node: u64, resource: &str) -> Result<GetResponse, ErrorDetail> {
    let req = GetRequest {
        resource: resource.into(),
    };
    with_leader(cluster, node, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.get(req).await.map(|r| r.into_inner()) }
    })
    .await
}

pub async fn renew(
    cluster: &Cluster,
    node: u64,
    resource: &str,
    lease_id: &[u8],
) -> Result<RenewResponse, ErrorDetail> {
    let req = RenewRequest {
        resource: resource.into(),
        lease_id: lease_id.to_vec(),
        lease_ttl_ms: 0,
    };
    with_leader(cluster, node, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.renew(req).await.map(|r| r.into_inner()) }
    })
    .await
}

pub async fn release(
    cluster: &Cluster,
    node: u64,
    resource: &str,
    lease_id: &[u8],
) -> Result<bool, ErrorDetail> {
    let req = ReleaseRequest {
        resource: resource.into(),
        lease_id: lease_id.to_vec(),
    };
    with_leader(cluster, node, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.release(req).await.map(|r| r.into_inner().released) }
    })
    .await
}

/// A child process killed (and reaped) when the test ends, passing or not.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
