//! An in-process cluster: real nodes (RocksDB in temp dirs, gRPC on
//! loopback, the real peer transport) in one test process, with network
//! faults injected through `NetworkRules` and crash/restart of nodes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_server::config::NodeConfig;
use fencelock_server::netfilter::NetworkRules;
use fencelock_server::node::Node;
use tonic::transport::Channel;

use crate::ports::free_port;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub configs: BTreeMap<u64, NodeConfig>,
    pub nodes: BTreeMap<u64, Node>,
    pub rules: BTreeMap<u64, Arc<NetworkRules>>,
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

    /// Starts node `id` on a fresh port with `join = true` (empty, waiting
    /// to be added: `admin add-node`), its peers being every node so far;
    /// `tweak` adjusts its configuration. Returns its address.
    pub async fn start_joining(&mut self, id: u64, tweak: impl Fn(&mut NodeConfig)) -> String {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut peers: BTreeMap<u64, String> = self
            .configs
            .iter()
            .map(|(id, c)| (*id, c.listen_addr.clone()))
            .collect();
        peers.insert(id, addr.clone());
        let mut config = NodeConfig::for_test(id, self.dir.path().join(format!("node{id}")), peers);
        config.join = true;
        tweak(&mut config);
        self.configs.insert(id, config);
        self.rules.insert(id, Arc::new(NetworkRules::default()));
        self.restart(id).await;
        addr
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

    /// Waits until every running node's map carries a cluster format of at
    /// least `format` (the controller raises it within a round or two of
    /// seeing every member read it; docs/operations.md "The cluster
    /// format").
    pub async fn wait_for_cluster_format(&self, format: u32, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let lowest = self
                .nodes
                .values()
                .map(|n| n.router().map().map_or(0, |m| m.cluster_format()))
                .min()
                .unwrap_or(0);
            if lowest >= format {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster format stayed at {lowest}, below {format}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
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
