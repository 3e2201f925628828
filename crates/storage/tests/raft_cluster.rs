//! Drives real raft-rs `RawNode`s over `ShardStorage`: three nodes, two
//! shards each, one engine per node, group commit of all shards' `Ready`s in
//! one synced batch. Covers what the storage unit suites cannot: that raft-rs
//! accepts this storage's semantics end to end — elections, replication,
//! log compaction, a lagging follower caught up by snapshot, and a restart
//! of every node recovering from snapshot + log.
//!
//! The store loop here is a minimal, single-threaded stand-in for the real
//! one; it follows the order the storage requires: stage every `Ready`,
//! write once (synced), `on_persisted`, then send, apply and `advance`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fencelock_storage::meta::{self, NodeIdent};
use fencelock_storage::{Engine, MemEngine, RocksEngine, ShardStorage, WriteBatch};
use raft::prelude::{ConfState, Entry, EntryType, Message, MessageType};
use raft::{Config, RawNode, SnapshotStatus, StateRole, Storage};

const NODES: [u64; 3] = [1, 2, 3];
const SHARDS: [u64; 2] = [1, 2];
/// Leader-side compaction trigger: snapshot + compact every this many applied
/// entries, so that a follower isolated for longer needs a snapshot.
const COMPACT_EVERY: u64 = 20;
const MAX_ROUNDS: usize = 300;

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

fn config(id: u64, applied: u64) -> Config {
    let cfg = Config {
        id,
        election_tick: 10,
        heartbeat_tick: 1,
        // Keeps the isolated node from bumping its term and disrupting the
        // leader when it comes back.
        pre_vote: true,
        applied,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: 256,
        ..Default::default()
    };
    if let Err(e) = cfg.validate() {
        panic!("config: {e}");
    }
    cfg
}

/// The replicated state machine of the test: the list of applied payloads.
fn encode_items(items: &[Vec<u8>]) -> Vec<u8> {
    items.join(&b'\n')
}

fn decode_items(data: &[u8]) -> Vec<Vec<u8>> {
    if data.is_empty() {
        return Vec::new();
    }
    data.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect()
}

struct Group<E: Engine + 'static> {
    raw: RawNode<ShardStorage<E>>,
    items: Vec<Vec<u8>>,
    applied: u64,
    snapshots_received: usize,
}

impl<E: Engine + 'static> Group<E> {
    fn apply(&mut self, entries: Vec<Entry>) {
        for e in entries {
            assert_eq!(e.index, self.applied + 1, "entries applied in order");
            if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
                self.items.push(e.data.to_vec());
            }
            self.applied = e.index;
        }
    }
}

struct Node<E: Engine + 'static> {
    id: u64,
    engine: Arc<E>,
    groups: BTreeMap<u64, Group<E>>,
}

impl<E: Engine + 'static> Node<E> {
    /// First start: identity, shard registrations and initial voters, all
    /// in one synced batch.
    fn bootstrap(id: u64, engine: Arc<E>) -> Self {
        meta::init_store(
            &*engine,
            NodeIdent {
                cluster_id: 1,
                node_id: id,
            },
        )
        .expect("init store");
        let mut batch = WriteBatch::new();
        let mut storages = Vec::new();
        for shard in SHARDS {
            let mut s = ShardStorage::open(Arc::clone(&engine), shard).expect("open shard");
            let cs = ConfState {
                voters: NODES.to_vec(),
                ..Default::default()
            };
            s.set_conf_state(&cs, &mut batch).expect("conf state");
            meta::register_shard(&mut batch, shard);
            storages.push(s);
        }
        engine.write(&batch, true).expect("bootstrap write");
        let mut groups = BTreeMap::new();
        for mut s in storages {
            s.on_persisted();
            let raw = RawNode::new(&config(id, 0), s, &logger()).expect("raw node");
            groups.insert(
                raw.store().shard_id(),
                Group {
                    raw,
                    items: Vec::new(),
                    applied: 0,
                    snapshots_received: 0,
                },
            );
        }
        Node { id, engine, groups }
    }

    /// Restart: every registered shard is reopened from the engine; the
    /// state machine is restored from the latest snapshot and raft replays
    /// the committed log after it.
    fn restart(id: u64, engine: Arc<E>) -> Self {
        meta::init_store(
            &*engine,
            NodeIdent {
                cluster_id: 1,
                node_id: id,
            },
        )
        .expect("ident");
        let mut groups = BTreeMap::new();
        for shard in meta::registered_shards(&*engine).expect("shard list") {
            let s = ShardStorage::open(Arc::clone(&engine), shard).expect("reopen shard");
            let (items, applied) = match s.state_machine_snapshot().expect("snapshot") {
                Some(snap) => (decode_items(snap.get_data()), snap.get_metadata().index),
                None => (Vec::new(), 0),
            };
            let raw = RawNode::new(&config(id, applied), s, &logger()).expect("raw node");
            groups.insert(
                shard,
                Group {
                    raw,
                    items,
                    applied,
                    snapshots_received: 0,
                },
            );
        }
        assert_eq!(groups.len(), SHARDS.len());
        Node { id, engine, groups }
    }

    /// One store-loop iteration. Returns outgoing `(shard, message)`s.
    fn handle_ready(&mut self) -> Vec<(u64, Message)> {
        let mut out = Vec::new();
        let mut batch = WriteBatch::new();
        let mut readies = Vec::new();
        for (&shard, g) in &mut self.groups {
            if !g.raw.has_ready() {
                continue;
            }
            let rd = g.raw.ready();
            let store = g.raw.mut_store();
            if !rd.snapshot().is_empty() {
                store
                    .apply_snapshot(rd.snapshot(), &mut batch)
                    .expect("stage snapshot");
            }
            store
                .append(rd.entries(), &mut batch)
                .expect("stage entries");
            if let Some(hs) = rd.hs() {
                store
                    .set_hard_state(hs, &mut batch)
                    .expect("stage hard state");
            }
            readies.push((shard, rd));
        }
        if readies.is_empty() {
            return out;
        }
        // Group commit: one synced write for every shard of this node.
        self.engine.write(&batch, true).expect("group commit");

        let mut after = WriteBatch::new();
        for (shard, mut rd) in readies {
            let Some(g) = self.groups.get_mut(&shard) else {
                continue;
            };
            g.raw.mut_store().on_persisted();
            out.extend(rd.take_messages().into_iter().map(|m| (shard, m)));
            out.extend(rd.take_persisted_messages().into_iter().map(|m| (shard, m)));
            if !rd.snapshot().is_empty() {
                g.items = decode_items(rd.snapshot().get_data());
                g.applied = rd.snapshot().get_metadata().index;
                g.snapshots_received += 1;
            }
            g.apply(rd.take_committed_entries());
            let mut light = g.raw.advance(rd);
            if let Some(commit) = light.commit_index() {
                g.raw
                    .mut_store()
                    .set_commit_index(commit, &mut after)
                    .expect("commit");
            }
            out.extend(light.take_messages().into_iter().map(|m| (shard, m)));
            g.apply(light.take_committed_entries());
            g.raw.advance_apply();
            Self::after_apply(g, &mut after);
        }
        self.engine.write(&after, true).expect("apply-state write");
        for g in self.groups.values_mut() {
            g.raw.mut_store().on_persisted();
        }
        out
    }

    /// Applied index, and snapshot + compaction when due or requested.
    fn after_apply(g: &mut Group<E>, batch: &mut WriteBatch) {
        let applied = g.applied;
        let items = encode_items(&g.items);
        let store = g.raw.mut_store();
        if applied > store.applied_index() {
            store.set_applied_index(applied, batch).expect("applied");
        }
        let (truncated, _) = store.truncated();
        let requested = store.take_snapshot_request().is_some();
        let latest = store.snapshot_info().map_or(0, |s| s.index);
        if (applied >= truncated + COMPACT_EVERY || requested) && applied > latest {
            let term = store.term(applied).expect("term of applied entry");
            let cs = store.conf_state().clone();
            store
                .save_state_machine_snapshot(applied, term, &cs, &items, batch)
                .expect("save snapshot");
            store.compact(applied, batch).expect("compact");
        }
    }
}

struct Cluster<E: Engine + 'static> {
    nodes: BTreeMap<u64, Node<E>>,
    isolated: BTreeSet<u64>,
    open: Box<dyn Fn(u64) -> Arc<E>>,
    proposed: BTreeMap<u64, Vec<Vec<u8>>>,
}

impl<E: Engine + 'static> Cluster<E> {
    fn new(open: Box<dyn Fn(u64) -> Arc<E>>) -> Self {
        let nodes = NODES
            .iter()
            .map(|&id| (id, Node::bootstrap(id, open(id))))
            .collect();
        Cluster {
            nodes,
            isolated: BTreeSet::new(),
            open,
            proposed: BTreeMap::new(),
        }
    }

    fn restart_all(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        // Every engine handle must be gone before RocksDB can reopen.
        self.nodes.clear();
        for id in ids {
            let node = Node::restart(id, (self.open)(id));
            self.nodes.insert(id, node);
        }
    }

    fn group(&mut self, node: u64, shard: u64) -> &mut Group<E> {
        match self
            .nodes
            .get_mut(&node)
            .and_then(|n| n.groups.get_mut(&shard))
        {
            Some(g) => g,
            None => panic!("no group {shard} on node {node}"),
        }
    }

    fn deliver(&mut self, msgs: Vec<(u64, Message)>) {
        for (shard, m) in msgs {
            let (from, to) = (m.from, m.to);
            let is_snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
            let dropped = self.isolated.contains(&from) || self.isolated.contains(&to);
            if !dropped {
                // Step errors are raft's to judge (e.g. stale messages).
                let _ = self.group(to, shard).raw.step(m);
            }
            if is_snapshot {
                let status = if dropped {
                    SnapshotStatus::Failure
                } else {
                    SnapshotStatus::Finish
                };
                self.group(from, shard).raw.report_snapshot(to, status);
            }
        }
    }

    /// One tick everywhere, then messages until the cluster is quiet.
    fn round(&mut self) {
        for node in self.nodes.values_mut() {
            for g in node.groups.values_mut() {
                g.raw.tick();
            }
        }
        for _ in 0..100 {
            let mut msgs = Vec::new();
            for node in self.nodes.values_mut() {
                msgs.extend(node.handle_ready());
            }
            if msgs.is_empty() {
                return;
            }
            self.deliver(msgs);
        }
    }

    fn run_until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        for _ in 0..MAX_ROUNDS {
            if done(self) {
                return;
            }
            self.round();
        }
        assert!(done(self), "not reached in {MAX_ROUNDS} rounds: {what}");
    }

    fn leader(&self, shard: u64) -> Option<u64> {
        self.nodes
            .values()
            .filter(|n| !self.isolated.contains(&n.id))
            .find(|n| {
                n.groups
                    .get(&shard)
                    .is_some_and(|g| g.raw.raft.state == StateRole::Leader)
            })
            .map(|n| n.id)
    }

    fn elect(&mut self) {
        for shard in SHARDS {
            if self.leader(shard).is_none() {
                let _ = self.group(1, shard).raw.campaign();
            }
        }
        self.run_until("leaders elected", |c| {
            SHARDS.iter().all(|&s| c.leader(s).is_some())
        });
    }

    fn propose(&mut self, count: usize) {
        for shard in SHARDS {
            let Some(leader) = self.leader(shard) else {
                panic!("no leader for {shard}")
            };
            for _ in 0..count {
                let n = self.proposed.entry(shard).or_default().len();
                let data = format!("shard{shard}-item{n}").into_bytes();
                self.group(leader, shard)
                    .raw
                    .propose(vec![], data.clone())
                    .expect("propose");
                self.proposed.entry(shard).or_default().push(data);
            }
            // Let each batch of proposals flow before the next shard's.
            self.round();
        }
    }

    fn caught_up(&self, nodes: &[u64]) -> bool {
        nodes.iter().all(|id| {
            SHARDS.iter().all(|shard| {
                let want = self.proposed.get(shard).map_or(&[][..], |v| &v[..]);
                self.nodes[id].groups[shard].items == want
            })
        })
    }
}

fn run_scenario<E: Engine + 'static>(open: Box<dyn Fn(u64) -> Arc<E>>) {
    let mut c = Cluster::new(open);
    c.elect();
    c.propose(30);
    c.run_until("all nodes apply the first 30", |c| c.caught_up(&NODES));

    // Node 3 falls behind while the leader compacts past its log.
    c.isolated.insert(3);
    c.propose(50);
    c.run_until("majority applies 80", |c| c.caught_up(&[1, 2]));
    for shard in SHARDS {
        let leader = c.leader(shard).expect("leader");
        let (truncated, _) = c.nodes[&leader].groups[&shard].raw.store().truncated();
        let behind = c.nodes[&3].groups[&shard].raw.store().last().0;
        assert!(
            truncated > behind,
            "shard {shard}: leader compacted past node 3's log"
        );
    }

    c.isolated.clear();
    c.run_until("node 3 catches up", |c| c.caught_up(&NODES));
    for shard in SHARDS {
        let g = &c.nodes[&3].groups[&shard];
        assert!(
            g.snapshots_received > 0,
            "shard {shard}: node 3 caught up via snapshot"
        );
        assert!(g.raw.store().snapshot_info().is_some());
    }

    // Full restart: state machines come back from snapshot + log replay.
    c.restart_all();
    c.run_until("state restored on every node after restart", |c| {
        c.caught_up(&NODES)
    });
    c.elect();
    c.propose(10);
    c.run_until("progress after restart", |c| c.caught_up(&NODES));
    for shard in SHARDS {
        assert_eq!(c.proposed[&shard].len(), 90);
        for node in c.nodes.values() {
            let store = node.groups[&shard].raw.store();
            assert!(store.hard_state().commit >= store.applied_index());
            assert_eq!(store.first_index().ok(), Some(store.truncated().0 + 1));
        }
    }
}

#[test]
fn three_nodes_two_shards_on_mem_engine() {
    let engines: BTreeMap<u64, MemEngine> =
        NODES.iter().map(|&id| (id, MemEngine::new())).collect();
    run_scenario(Box::new(move |id| Arc::new(engines[&id].clone())));
}

#[test]
fn three_nodes_two_shards_on_rocksdb() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    run_scenario(Box::new(move |id| {
        Arc::new(RocksEngine::open(root.join(format!("node{id}"))).expect("open rocksdb"))
    }));
    drop(dir);
}
