//! Replicas coming and going: bootstrap of a fresh node's shards, creating
//! and destroying replicas, and Raft configuration changes at apply.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fencelock_placement::PlacementMap;
use fencelock_statemachine::{LockTable, SlotSet};
use fencelock_storage::{Engine, ShardStorage, WriteBatch};
use raft::prelude::Entry;
use raft::RawNode;

use crate::msg::{PeerInit, Responder};
use crate::ready::staged_or_die;
use crate::replica::{fail_peer, Peer};
use crate::store::Store;
use crate::{decode_state, encode_state, hot, StoreConfig, StoreError};

/// Applies a replica change to raft-rs and stages the new configuration.
///
/// The answer is an error only when nothing changed: raft-rs refuses a
/// change before it touches its configuration (and every replica refuses
/// the same entry alike). Once raft-rs applied it, the new configuration
/// must reach the storage; a refused staging stops the node rather than
/// answer "failed" for a change that happened.
pub(crate) fn apply_conf_change(
    peer: &mut Peer,
    entry: &Entry,
    responders: Vec<Responder>,
    batch: &mut WriteBatch,
) {
    use protobuf::Message as _;
    let cc = match raft::prelude::ConfChange::parse_from_bytes(&entry.data) {
        Ok(cc) => cc,
        Err(e) => panic!(
            "fencelock: shard {} configuration change {} does not decode: {e}",
            peer.shard_id, entry.index
        ),
    };
    let result = match peer.raw.apply_conf_change(&cc) {
        Ok(cs) => {
            let staged = peer.raw.mut_store().set_conf_state(&cs, batch);
            staged_or_die(peer.shard_id, "a configuration", staged);
            Ok(())
        }
        Err(e) => Err(StoreError::Internal(format!(
            "configuration change refused: {e}"
        ))),
    };
    for r in responders {
        if let Responder::Done(tx) = r {
            let _ = tx.send(result.clone());
        }
    }
}

/// The meta shard's lock table serves no slot and mints no token; its epoch
/// only satisfies the apply context (which needs one) for its leader-change
/// entries.
pub(crate) const META_TABLE_EPOCH: u64 = 1;

/// Log index of every shard's bootstrap snapshot. Starting the log after a
/// snapshot means a replica added later always begins from a snapshot sent
/// by the leader, never by replaying a log it has no initial state for.
pub(crate) const BOOTSTRAP_INDEX: u64 = 1;

pub(crate) const BOOTSTRAP_TERM: u64 = 1;

pub(crate) fn bootstrap_table(
    config: &StoreConfig,
    slots: SlotSet,
    epoch: u64,
) -> Result<LockTable, StoreError> {
    LockTable::bootstrap(config.limits(), slots, epoch, BOOTSTRAP_INDEX)
        .map_err(|e| StoreError::Internal(e.to_string()))
}

/// Stages a brand-new shard replica into `batch`: registration plus the
/// bootstrap snapshot (identical bytes on every initial replica). Call
/// `on_persisted` on the returned storage after the batch is written.
pub(crate) fn bootstrap_batch(
    engine: &Arc<dyn Engine>,
    shard_id: u64,
    voters: &BTreeSet<u64>,
    table: &LockTable,
    placement: Option<&PlacementMap>,
    batch: &mut WriteBatch,
) -> Result<ShardStorage<dyn Engine>, StoreError> {
    let storage_err = StoreError::from_storage;
    fencelock_storage::meta::register_shard(batch, shard_id);
    let mut st = ShardStorage::open(engine.clone(), shard_id).map_err(storage_err)?;
    let mut snap = raft::prelude::Snapshot::default();
    snap.set_data(encode_state(table, placement).into());
    let md = snap.mut_metadata();
    md.index = BOOTSTRAP_INDEX;
    md.term = BOOTSTRAP_TERM;
    md.mut_conf_state()
        .set_voters(voters.iter().copied().collect());
    st.apply_snapshot(&snap, batch).map_err(storage_err)?;
    Ok(st)
}

impl Store {
    /// Builds the in-memory replica over `storage`: restores its state from
    /// the latest snapshot (every initialized replica has one: the bootstrap
    /// snapshot at least), or starts empty for a replica waiting for one.
    pub(crate) fn add_peer(
        &mut self,
        shard_id: u64,
        storage: ShardStorage<dyn Engine>,
    ) -> Result<(), StoreError> {
        let storage_err = StoreError::from_storage;
        // The saved snapshot's size is reported as the shard's snapshot
        // bytes from the start, not only after the next one is taken.
        let (table, placement, applied, applied_term, snapshot_bytes) = match storage
            .state_machine_snapshot()
        {
            Ok(Some(snap)) => {
                let (table, placement) = decode_state(snap.get_data())
                    .map_err(|e| StoreError::Storage(format!("shard {shard_id} snapshot: {e}")))?;
                let md = snap.get_metadata();
                let bytes = snap.get_data().len() as u64;
                (table, placement, md.index, md.term, bytes)
            }
            Ok(None) => (
                LockTable::with_slots(self.config.limits(), SlotSet::EMPTY)
                    .map_err(|e| StoreError::Internal(e.to_string()))?,
                None,
                0,
                0,
                0,
            ),
            Err(e) => return Err(storage_err(e)),
        };
        let raft_config = raft::Config {
            id: self.node_id,
            election_tick: self.config.raft.election_ticks as usize,
            heartbeat_tick: self.config.raft.heartbeat_ticks as usize,
            applied,
            // [election_ticks, election_ticks + 1): always election_ticks.
            max_election_tick: if self.fixed_election_timeout {
                self.config.raft.election_ticks as usize + 1
            } else {
                0
            },
            check_quorum: true,
            pre_vote: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_config, storage, &logger)
            .map_err(|e| StoreError::Storage(format!("shard {shard_id}: {e}")))?;
        let watch = crate::watch::WatchHub::starting_at(&table);
        self.peers.insert(
            shard_id,
            Peer {
                shard_id,
                raw,
                table,
                placement,
                queued: Vec::new(),
                meta_queued: Vec::new(),
                epoch_queued: None,
                pending: HashMap::new(),
                reads: HashMap::new(),
                waiting: HashMap::new(),
                orphans: BTreeMap::new(),
                next_orphan_scan: None,
                orphan_grace: Duration::from_millis(self.config.raft.proposal_timeout_ms),
                clock: None,
                term_start_index: 0,
                last_stamp: None,
                needs_leader_changed: false,
                leadership_taken_up: false,
                leader_changed_at: None,
                tick_in_flight: None,
                applied_index: applied,
                applied_term,
                last_snapshot_index: applied,
                snapshot_in_flight: None,
                last_snapshot_bytes: snapshot_bytes,
                snapshots_installed: 0,
                leaderless_since: None,
                hot: hot::HotCounter::new(self.time.now()),
                watch,
                snapshot_wait_ticks: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Starts a replica of `shard_id` here; nothing if one exists.
    pub(crate) fn create_peer(&mut self, shard_id: u64, init: PeerInit) -> Result<(), StoreError> {
        if self.peers.contains_key(&shard_id) {
            return Ok(());
        }
        let storage_err = StoreError::from_storage;
        let mut batch = WriteBatch::new();
        let mut storage = match init {
            PeerInit::Empty => {
                fencelock_storage::meta::register_shard(&mut batch, shard_id);
                ShardStorage::open(self.engine.clone(), shard_id).map_err(storage_err)?
            }
            PeerInit::NewShard { voters, epoch } => {
                if !voters.contains(&self.node_id) {
                    return Err(StoreError::InvalidArgument {
                        field: "voters",
                        reason: format!("node {} is not among {voters:?}", self.node_id),
                    });
                }
                let table = bootstrap_table(&self.config, SlotSet::EMPTY, epoch)?;
                bootstrap_batch(&self.engine, shard_id, &voters, &table, None, &mut batch)?
            }
        };
        self.write_or_die(&batch, true);
        storage.on_persisted();
        self.add_peer(shard_id, storage)
    }

    /// Deletes this node's replica of `shard_id` and everything it stored.
    /// Refused while this replica counts itself a member of the shard's
    /// configuration, unless `removed` (the caller saw the leader's
    /// configuration without this node): deleting a member's data is what
    /// docs/safety.md forbids. A replica never deletes itself on applying
    /// its own removal: a replica re-added later replays that removal from
    /// an older snapshot on its way to the configuration that has it again.
    pub(crate) fn destroy_peer(&mut self, shard_id: u64, removed: bool) -> Result<(), StoreError> {
        let Some(peer) = self.peers.get(&shard_id) else {
            return Ok(());
        };
        let conf = peer.raw.raft.prs().conf().to_conf_state();
        let member = conf.voters.contains(&self.node_id) || conf.learners.contains(&self.node_id);
        if member && !removed {
            return Err(StoreError::InvalidArgument {
                field: "shard_id",
                reason: format!(
                    "node {} is still a member of shard {shard_id}; remove it from the shard first",
                    self.node_id
                ),
            });
        }
        // The replica's deferred writes (a snapshot, a compaction, the
        // commit index) go to disk before its deletion does: written after
        // it, they would bring back records of a replica that no longer
        // exists, for a later replica of the same shard to find.
        self.flush_deferred();
        let mut peer = self.peers.remove(&shard_id).expect("checked");
        fail_peer(&mut peer, StoreError::ShardNotHere { shard_id });
        peer.watch.restart(&peer.table);
        let mut batch = WriteBatch::new();
        peer.raw
            .mut_store()
            .destroy(&mut batch)
            .map_err(StoreError::from_storage)?;
        fencelock_storage::meta::unregister_shard(&mut batch, shard_id);
        self.write_or_die(&batch, true);
        peer.raw.mut_store().on_persisted();
        tracing::info!(shard_id, "replica destroyed");
        Ok(())
    }
}
