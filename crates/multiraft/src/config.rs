//! The store loop's configuration: the `[raft]` section of the node's
//! configuration file ([`RaftConfig`], whose defaults live here) and what
//! else the loop needs of the node's configuration ([`StoreConfig`]).
//! Ranges are checked where the file is read (the server's config module).

use std::collections::BTreeMap;
use std::time::Duration;

use fencelock_statemachine::Limits;
use serde::{Deserialize, Serialize};

/// The `[raft]` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// One Raft logical clock tick, 10..=1000 ms (default 100).
    pub tick_interval_ms: u64,
    /// Ticks without a heartbeat before a follower campaigns, 5..=100
    /// (default 10). Raft randomizes the actual timeout in
    /// `[election_ticks, 2 * election_ticks)`.
    pub election_ticks: u32,
    /// Ticks between leader heartbeats, 1..=election_ticks/2 (default 2).
    pub heartbeat_ticks: u32,
    /// How long a request waits for its proposal to be committed and applied
    /// before it fails with OUTCOME_UNKNOWN, 100..=60000 ms (default 5000).
    pub proposal_timeout_ms: u64,
    /// Most commands coalesced into one Raft entry, 1..=4096 (default 256).
    pub max_commands_per_entry: u32,
    /// Applied entries between snapshots of a shard, 100..=1000000
    /// (default 10000).
    pub snapshot_interval_entries: u64,
    /// Capacity of the store loop's request queue, 1024..=1048576 (default
    /// 65536). When it is full, requests fail with SERVER_BUSY.
    pub store_queue_depth: usize,
    /// Raft messages queued per peer before new ones are dropped (Raft
    /// retransmits), 64..=1048576 (default 8192).
    pub peer_queue_depth: usize,
    /// 0..=60000 ms (default 500). A new leader extends every inherited
    /// lease by this much once, and an import every imported one: a margin
    /// on this release, and the wall-clock offset bound that nodes of the
    /// previous release rely on (see `docs/safety.md`, assumption A1).
    pub clock_offset_allowance_ms: u64,
    /// Group commit: when the store loop's previous iteration ended less
    /// than this long ago, it waits up to the rest of it for more requests
    /// and peer messages to share the next one, 0..=20000 µs (default
    /// 2000; 0 disables): fewer, fuller entries. The writer thread syncs
    /// one batch at a time, so what arrives during an fsync shares the
    /// next one anyway; an idle node answers at once.
    pub group_commit_window_us: u64,
}

impl Default for RaftConfig {
    fn default() -> Self {
        RaftConfig {
            tick_interval_ms: 100,
            election_ticks: 10,
            heartbeat_ticks: 2,
            proposal_timeout_ms: 5_000,
            max_commands_per_entry: 256,
            snapshot_interval_entries: 10_000,
            store_queue_depth: 65_536,
            peer_queue_depth: 8_192,
            clock_offset_allowance_ms: 500,
            group_commit_window_us: 2_000,
        }
    }
}

impl RaftConfig {
    /// One Raft tick.
    pub fn tick_interval(&self) -> Duration {
        Duration::from_millis(self.tick_interval_ms)
    }

    /// The shortest election timeout (`election_ticks` ticks).
    pub fn election_timeout(&self) -> Duration {
        self.tick_interval() * self.election_ticks
    }

    /// How long a request waits for its proposal to be applied.
    pub fn proposal_timeout(&self) -> Duration {
        Duration::from_millis(self.proposal_timeout_ms)
    }

    /// Fast timings for tests: 20 ms ticks, short proposal timeouts, small
    /// queues (the in-process clusters and the simulation).
    pub fn for_test() -> RaftConfig {
        RaftConfig {
            tick_interval_ms: 20,
            election_ticks: 10,
            heartbeat_ticks: 2,
            proposal_timeout_ms: 2_000,
            max_commands_per_entry: 256,
            snapshot_interval_entries: 1_000,
            store_queue_depth: 8_192,
            peer_queue_depth: 1_024,
            clock_offset_allowance_ms: 100,
            group_commit_window_us: RaftConfig::default().group_commit_window_us,
        }
    }

    /// The group-commit window (zero: none).
    pub fn group_commit_window(&self) -> Duration {
        Duration::from_micros(self.group_commit_window_us)
    }
}

/// What the store loop needs of the node's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// This node's id, at least 1.
    pub node_id: u64,
    /// Node id → advertised address of every initial member, this node
    /// included (bootstrap of a fresh node's shards).
    pub initial_members: BTreeMap<u64, String>,
    /// Shards a fresh cluster bootstraps.
    pub shard_count: u32,
    /// Replicas per shard at bootstrap.
    pub replication_factor: u32,
    /// A fresh node with `join` starts with no replica and waits to be
    /// added.
    pub join: bool,
    /// The lock tables' limits.
    pub limits: Limits,
    /// The store loop's tuning.
    pub raft: RaftConfig,
}

impl StoreConfig {
    /// The lock tables' limits.
    pub fn limits(&self) -> Limits {
        self.limits.clone()
    }

    /// A test configuration of node `node_id` in a cluster of `members`:
    /// [`RaftConfig::for_test`] timings, 4 shards of 3 replicas, default
    /// limits.
    pub fn for_test<'a>(
        node_id: u64,
        members: impl IntoIterator<Item = (u64, &'a str)>,
    ) -> StoreConfig {
        StoreConfig {
            node_id,
            initial_members: members
                .into_iter()
                .map(|(id, addr)| (id, addr.to_owned()))
                .collect(),
            shard_count: 4,
            replication_factor: 3,
            join: false,
            limits: Limits::default(),
            raft: RaftConfig::for_test(),
        }
    }

    /// Node id → advertised address of every initial member.
    pub fn peer_map(&self) -> BTreeMap<u64, String> {
        self.initial_members.clone()
    }
}
