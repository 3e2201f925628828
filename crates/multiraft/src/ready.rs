//! Ready handling: every shard's `Ready` staged into the next batch, the
//! leaders' messages sent and committed entries applied at once; the batch
//! handed to the disk when the previous one has landed (see [`crate::write`]);
//! on landing, the messages that needed it durable sent and raft-rs told.

use std::collections::BTreeMap;

use fencelock_storage::WriteBatch;
use raft::prelude::{Entry, EntryType, Message, Snapshot};
use raft::{GetEntriesContext, StateRole};

use crate::apply::{apply_entries, serve_reads, u64_from_ctx};
use crate::replica::{on_role_change, Peer};
use crate::snapshot::{snapshot_wanted, start_snapshot, Encoder};
use crate::store::Store;
use crate::write::{InFlight, StagedReady, WriteDone};
use crate::{decode_state, observe, Envelope};

/// Puts `msgs` in `outbox` by destination; returns how many are snapshots.
pub(crate) fn queue_messages(
    outbox: &mut BTreeMap<u64, Vec<Envelope>>,
    shard_id: u64,
    msgs: Vec<Message>,
) -> u64 {
    let mut snapshots = 0;
    for msg in msgs {
        if msg.get_msg_type() == raft::prelude::MessageType::MsgSnapshot {
            snapshots += 1;
        }
        outbox
            .entry(msg.to)
            .or_default()
            .push(Envelope { shard_id, msg });
    }
    snapshots
}

/// Checks the staging of one write into a shard's storage. A refusal means
/// the store's view of the shard is not what its storage holds (a bug, or
/// state that raft-rs has already moved past): the node stops, as for a
/// refused `Ready` or a failed write, and restarts from what is on disk,
/// rather than carry on with a write silently missing.
pub(crate) fn staged_or_die(shard_id: u64, what: &str, staged: fencelock_storage::Result<()>) {
    #[cfg(test)]
    let staged = crate::tests::refusal(what).map_or(staged, Err);
    if let Err(e) = staged {
        panic!("fencelock: shard {shard_id}: staging {what} failed ({e}); stopping the node");
    }
}

impl Store {
    /// Stages every shard's `Ready` into the next batch, sends the leaders'
    /// messages, applies the entries already committed and durable, and
    /// advances each `RawNode` without waiting for the write
    /// (`advance_append_async`): what needs the write durable waits in
    /// [`Writes::staging`] until it lands ([`Store::on_write_landed`]).
    /// Returns whether any shard had a ready.
    pub(crate) fn process_readies(&mut self) -> bool {
        let mut outbox: BTreeMap<u64, Vec<Envelope>> = BTreeMap::new();
        let mut any = false;
        let mut snapshots_sent = 0u64;
        for (shard_id, peer) in self.peers.iter_mut() {
            if !peer.raw.has_ready() {
                continue;
            }
            any = true;
            let mut rd = peer.raw.ready();
            if let Some(ss) = rd.ss() {
                let role = ss.raft_state;
                if role == StateRole::Leader && !peer.leadership_taken_up {
                    self.obs.metrics.leader_changes.inc();
                }
                on_role_change(peer, role);
            }
            self.writes.staging.entries += rd.entries().len() as u64;
            // What raft-rs may send before this ready is persisted: only a
            // leader's messages (appends, heartbeats, snapshots from saved
            // state; Raft thesis 10.2.1). They leave now, so followers
            // write in parallel with the leader. A follower's or
            // candidate's messages (acks, votes) are `persisted_messages`,
            // sent once the write holding this ready has landed.
            snapshots_sent += queue_messages(&mut outbox, *shard_id, rd.take_messages());
            #[cfg(feature = "simulation")]
            if self.sim_fault == Some(crate::SimFault::AckBeforePersist) {
                snapshots_sent +=
                    queue_messages(&mut outbox, *shard_id, rd.take_persisted_messages());
            }
            let batch = &mut self.deferred;
            let store = peer.raw.mut_store();
            let mut snapshot = None;
            if !rd.snapshot().is_empty() {
                let staged = store.apply_snapshot(rd.snapshot(), batch);
                staged_or_die(*shard_id, "a received snapshot", staged);
                snapshot = Some(rd.snapshot().clone());
            }
            if !rd.entries().is_empty() {
                let staged = store.append(rd.entries(), batch);
                staged_or_die(*shard_id, "log entries", staged);
            }
            if let Some(hs) = rd.hs() {
                let staged = store.set_hard_state(hs, batch);
                staged_or_die(*shard_id, "the hard state", staged);
            }
            for rs in rd.take_read_states() {
                let id = u64_from_ctx(&rs.request_ctx);
                if let Some(r) = id.and_then(|id| peer.reads.get_mut(&id)) {
                    r.index = Some(rs.index);
                }
            }
            self.writes.staging.must_sync |= rd.must_sync();
            let committed = rd.take_committed_entries();
            self.writes.staging.readies.push(StagedReady {
                shard_id: *shard_id,
                number: rd.number(),
                persisted_messages: rd.take_persisted_messages(),
                snapshot,
            });
            peer.raw.advance_append_async(rd);
            // raft-rs hands over only entries both committed and durable
            // here, so they apply now, whatever write is still in flight.
            let mut obs = observe::ApplyObs {
                metrics: &mut self.obs.metrics,
                audit: &self.obs.audit,
                clock: self.time.as_ref(),
                committed_at: self.time.now(),
                #[cfg(feature = "simulation")]
                sim_fault: self.sim_fault,
            };
            apply_entries(peer, committed, &mut self.deferred, &mut obs);
            // A leader applies, and answers, what a majority of followers
            // has durable while its own copy is still being written.
            if peer.is_leader() {
                let ahead = committed_ahead_of_own_disk(peer);
                apply_entries(peer, ahead, &mut self.deferred, &mut obs);
            }
            after_apply(
                peer,
                self.config.raft.snapshot_interval_entries,
                &mut self.deferred,
                &mut self.snapshots,
            );
        }
        self.obs.metrics.snapshots_sent.inc_by(snapshots_sent);
        self.send_outbox(outbox);
        any
    }

    /// Hands the staged batch to the disk if none is in flight and there
    /// is anything to write or to wait for. Returns whether it did.
    pub(crate) fn hand_over_write(&mut self) -> bool {
        if self.writes.in_flight.is_some()
            || (self.deferred.is_empty() && self.writes.staging.readies.is_empty())
        {
            return false;
        }
        // Every shard's mark: deferred writes of shards without a ready
        // (a snapshot save, a compaction) are in this batch too, and
        // raft-rs may read their storage before their next ready.
        let marks = (self.peers.iter())
            .filter(|(_, p)| p.raw.store().has_staged())
            .map(|(id, p)| (*id, p.raw.store().staged_mark()))
            .collect();
        let staging = std::mem::take(&mut self.writes.staging);
        let batch = std::mem::take(&mut self.deferred);
        let sync = staging.must_sync;
        let leading = self.peers.values().any(Peer::is_leader);
        let commands = std::mem::take(&mut self.obs.metrics.commands_since_sync);
        let in_flight = InFlight {
            seq: 0,
            marks,
            readies: staging.readies,
            entries: staging.entries,
            commands,
        };
        self.writes.hand_over(in_flight, batch, sync, leading);
        true
    }

    /// Handles every write that has landed. Returns whether any had.
    pub(crate) fn collect_writes(&mut self) -> bool {
        let mut any = false;
        while let Ok(done) = self.writes.done_rx.try_recv() {
            self.on_write_landed(done);
            any = true;
        }
        any
    }

    /// A write landed: each shard's storage is durable through its mark,
    /// received snapshots are installed, the messages that waited for it
    /// leave, and raft-rs learns which readies are persisted.
    pub(crate) fn on_write_landed(&mut self, done: WriteDone) {
        let Some(in_flight) = self.writes.in_flight.take() else {
            panic!("fencelock: write {} landed with none in flight", done.seq);
        };
        // Pair assertion: batches land in the order they were handed over,
        // one at a time.
        assert_eq!(done.seq, in_flight.seq, "writes land in order");
        if let Err(e) = done.result {
            // A failed fsync leaves the disk in an unknown state: the only
            // safe reaction is to stop (the PostgreSQL fsync lesson).
            panic!("fencelock: RocksDB write failed: {e}");
        }
        // Failpoint (feature `failpoints`, docs/testing.md): a crash (abort:
        // no unwinding, like SIGKILL) with the batch durable, the leaders'
        // appends sent, and nothing that waited for it done.
        if done.sync {
            fail::fail_point!("store::after_persist", |_| std::process::abort());
        }
        let m = &mut self.obs.metrics;
        if done.sync {
            m.fsync_seconds.observe(done.took.as_secs_f64());
            m.fsync_entries.observe(in_flight.entries as f64);
            m.fsync_commands.observe(in_flight.commands as f64);
        }
        for (shard_id, mark) in &in_flight.marks {
            if let Some(peer) = self.peers.get_mut(shard_id) {
                peer.raw.mut_store().on_persisted_through(*mark);
            }
        }
        let mut outbox: BTreeMap<u64, Vec<Envelope>> = BTreeMap::new();
        let mut snapshots_sent = 0u64;
        for ready in in_flight.readies {
            let Some(peer) = self.peers.get_mut(&ready.shard_id) else {
                continue;
            };
            if let Some(snap) = ready.snapshot {
                install_snapshot(peer, &snap, &mut self.obs.metrics);
            }
            snapshots_sent += queue_messages(&mut outbox, ready.shard_id, ready.persisted_messages);
            peer.raw.on_persist_ready(ready.number);
            // A snapshot's index (or entries a leader applied ahead of its
            // own disk) count as applied for raft-rs once durable here.
            tell_raft_applied(peer);
        }
        self.obs.metrics.snapshots_sent.inc_by(snapshots_sent);
        self.send_outbox(outbox);
    }

    /// Writes everything staged and waits for it: before a replica's
    /// deletion and at a clean stop, so that nothing staged is written
    /// after them.
    pub(crate) fn flush_deferred(&mut self) {
        loop {
            if let Some(done) = self.writes.wait() {
                self.on_write_landed(done);
                continue;
            }
            // Synced: a deletion or a stop must not be undone by a crash
            // that keeps it but loses what came before.
            self.writes.staging.must_sync = true;
            if !self.hand_over_write() {
                // Anything the loop queued itself (an empty batch) too.
                self.collect_writes();
                return;
            }
        }
    }

    pub(crate) fn write_or_die(&self, batch: &WriteBatch, sync: bool) {
        if let Err(e) = self.engine.write(batch, sync) {
            // A failed fsync leaves the disk in an unknown state: the only
            // safe reaction is to stop (the PostgreSQL fsync lesson).
            panic!("fencelock: RocksDB write failed: {e}");
        }
    }

    pub(crate) fn send_outbox(&self, outbox: BTreeMap<u64, Vec<Envelope>>) {
        for (to, envelopes) in outbox {
            self.transport.send(to, envelopes);
        }
    }
}

/// After an apply pass: raft-rs learns the applied index, the applied
/// index is staged (informational on disk: a restart replays from the
/// snapshot, but it tells operators and tools how far each replica had
/// applied), reads are served, and a snapshot is started when due.
fn after_apply(peer: &mut Peer, interval: u64, batch: &mut WriteBatch, encoder: &mut Encoder) {
    tell_raft_applied(peer);
    let applied = peer.applied_index;
    if applied > peer.raw.store().applied_index() {
        let staged = peer.raw.mut_store().set_applied_index(applied, batch);
        staged_or_die(peer.shard_id, "the applied index", staged);
    }
    serve_reads(peer);
    // raft-rs asked for a snapshot newer than the saved one (a replica was
    // added since): take one at the applied index, unless the one being
    // encoded already covers it.
    let mut force = false;
    if let Some(wanted) = peer.raw.store().take_snapshot_request() {
        let in_flight = peer.snapshot_in_flight.map(|f| f.index);
        if in_flight.is_none() && peer.applied_index >= wanted {
            force = true;
        } else if in_flight.is_none_or(|index| index < wanted) {
            // Not applied that far yet, or the one in flight is older:
            // ask again next time.
            peer.raw.store().request_snapshot(wanted);
        }
    }
    if snapshot_wanted(peer, interval, force) {
        start_snapshot(peer, encoder);
    }
}

/// Most entries a leader applies ahead of its own disk in one pass.
const MAX_APPLY_AHEAD_ENTRIES: u64 = 4_096;

/// Entries committed (a majority of voters has them durable) that raft-rs
/// does not hand over yet because this leader's own write of them is still
/// in flight (raft-rs 0.7 hands over `min(committed, persisted)`). Applying
/// and answering them now is what send-before-persist is for: a leader
/// whose disk stalls still answers through its followers' majority
/// (docs/safety.md, "Sending before persisting"). Configuration changes
/// are left to raft-rs's own pace: the first one ends the run.
fn committed_ahead_of_own_disk(peer: &Peer) -> Vec<Entry> {
    let log = &peer.raw.raft.raft_log;
    let from = peer.applied_index + 1;
    if log.committed <= log.persisted || log.committed < from || from < log.first_index() {
        return Vec::new();
    }
    let to = log.committed.min(from + MAX_APPLY_AHEAD_ENTRIES - 1);
    let Ok(entries) = log.slice(from, to + 1, None, GetEntriesContext::empty(false)) else {
        return Vec::new();
    };
    // Pair assertion with raft-rs: the slice is the committed log from the
    // applied index on, without a hole.
    debug_assert!(entries
        .iter()
        .enumerate()
        .all(|(i, e)| e.index == from + i as u64));
    (entries.into_iter())
        .take_while(|e| e.get_entry_type() == EntryType::EntryNormal)
        .collect()
}

/// raft-rs's applied index follows ours, up to what is durable here (it
/// refuses to count an entry applied past its persisted index).
fn tell_raft_applied(peer: &mut Peer) {
    let log = &peer.raw.raft.raft_log;
    let applied = peer.applied_index.min(log.persisted).min(log.committed);
    if applied > log.applied {
        peer.raw.advance_apply_to(applied);
    }
}

/// Replaces the replica's table with a received snapshot's, once the
/// snapshot is durable here.
fn install_snapshot(peer: &mut Peer, snap: &Snapshot, metrics: &mut crate::metrics::StoreMetrics) {
    fail::fail_point!("store::snapshot_install", |_| std::process::abort());
    match decode_state(snap.get_data()) {
        Ok((table, placement)) => {
            peer.table = table;
            // The entries the snapshot stands for were never applied here
            // one by one: whose clock their stamps came from, and when, is
            // unknown.
            peer.last_stamp = None;
            peer.watch.restart(&peer.table);
            peer.placement = placement;
            peer.applied_index = snap.get_metadata().index;
            peer.applied_term = snap.get_metadata().term;
            peer.last_snapshot_index = peer.applied_index;
            peer.last_snapshot_bytes = snap.get_data().len() as u64;
            peer.snapshots_installed += 1;
            metrics.snapshots_installed.inc();
        }
        Err(e) => {
            panic!(
                "fencelock: shard {} received a snapshot it cannot read: {e}. {}",
                peer.shard_id,
                crate::apply::UNREADABLE_FORMAT
            )
        }
    }
}
