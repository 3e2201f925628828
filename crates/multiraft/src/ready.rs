//! Ready handling: every shard's `Ready` staged into one `WriteBatch`, the
//! leaders' messages sent, one synced write (group commit), then the
//! messages that need it durable sent and `RawNode`s advanced.

use std::collections::BTreeMap;

use fencelock_storage::WriteBatch;
use raft::prelude::Message;
use raft::StateRole;

use crate::apply::{apply_entries, serve_reads, u64_from_ctx};
use crate::replica::{on_role_change, Peer};
use crate::snapshot::{snapshot_wanted, take_snapshot};
use crate::store::Store;
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
    /// Handles every shard's `Ready` with one synced write. Returns whether
    /// any shard had one.
    pub(crate) fn process_readies(&mut self) -> bool {
        let mut batch = std::mem::take(&mut self.deferred);
        let mut readies = Vec::new();
        let mut outbox: BTreeMap<u64, Vec<Envelope>> = BTreeMap::new();
        let mut failed = false;
        let mut entries_staged = 0u64;
        let mut snapshots_sent = 0u64;
        for (shard_id, peer) in self.peers.iter_mut() {
            if !peer.raw.has_ready() {
                continue;
            }
            let mut rd = peer.raw.ready();
            if let Some(ss) = rd.ss() {
                let role = ss.raft_state;
                if role == StateRole::Leader && peer.clock.is_none() {
                    self.obs.metrics.leader_changes.inc();
                }
                on_role_change(peer, role);
            }
            entries_staged += rd.entries().len() as u64;
            // What raft-rs may send before this ready is persisted: only a
            // leader's messages (appends, heartbeats, snapshots from saved
            // state; Raft thesis 10.2.1). They leave before the synced
            // write below, so followers write in parallel with the leader.
            // A follower's or candidate's messages (acks, votes) are
            // `persisted_messages`, sent after the write.
            snapshots_sent += queue_messages(&mut outbox, *shard_id, rd.take_messages());
            #[cfg(feature = "simulation")]
            if self.sim_fault == Some(crate::SimFault::AckBeforePersist) {
                snapshots_sent +=
                    queue_messages(&mut outbox, *shard_id, rd.take_persisted_messages());
            }
            let store = peer.raw.mut_store();
            let mut snapshot_data = None;
            if !rd.snapshot().is_empty() {
                if store.apply_snapshot(rd.snapshot(), &mut batch).is_err() {
                    failed = true;
                }
                snapshot_data = Some(rd.snapshot().clone());
            }
            if !rd.entries().is_empty() && store.append(rd.entries(), &mut batch).is_err() {
                failed = true;
            }
            if let Some(hs) = rd.hs() {
                if store.set_hard_state(hs, &mut batch).is_err() {
                    failed = true;
                }
            }
            for rs in rd.take_read_states() {
                let id = u64_from_ctx(&rs.request_ctx);
                if let Some(r) = id.and_then(|id| peer.reads.get_mut(&id)) {
                    r.index = Some(rs.index);
                }
            }
            readies.push((*shard_id, rd, snapshot_data, self.time.now()));
        }
        if readies.is_empty() {
            if !batch.is_empty() {
                self.write_or_die(&batch, false);
                self.mark_persisted();
            }
            return false;
        }
        if failed {
            // Staging refused something raft-rs handed us: the node cannot
            // continue safely. Crash rather than guess; restart recovers
            // from the durable state.
            panic!("fencelock: staging a Raft ready failed; stopping the node");
        }
        // Send before persist: the leaders' messages go out now, so the
        // followers' fsyncs overlap this node's instead of following it. A
        // leader counts its own copy towards a majority only once this
        // write returns (raft-rs updates its own progress at `advance`),
        // so nothing commits on an entry the leader may still lose unless
        // a majority of followers has it durable (docs/safety.md,
        // "Sending before persisting").
        self.send_outbox(std::mem::take(&mut outbox));
        let synced_at = self.time.now();
        // Failpoints (feature `failpoints`, docs/testing.md): a slow disk on
        // a leader, and a crash (abort: no unwinding, like SIGKILL) with
        // entries durable, the leaders' appends sent, and nothing applied,
        // answered or acknowledged.
        if self.peers.values().any(Peer::is_leader) {
            fail::fail_point!("store::leader_sync");
        }
        self.write_or_die(&batch, true);
        // Every shard whose staging was in the batch sees it now, not only
        // the shards with a ready: the deferred part carries the snapshot
        // saves and compactions of shards that may be idle this time, and
        // raft-rs may read their storage before their next ready.
        self.mark_persisted();
        fail::fail_point!("store::after_persist", |_| std::process::abort());
        let m = &mut self.obs.metrics;
        m.fsync_seconds.observe(
            self.time
                .now()
                .saturating_duration_since(synced_at)
                .as_secs_f64(),
        );
        m.fsync_entries.observe(entries_staged as f64);
        m.fsync_commands
            .observe(std::mem::take(&mut m.commands_since_sync) as f64);
        for (shard_id, mut rd, snapshot, committed_at) in readies {
            let peer = self.peers.get_mut(&shard_id).expect("listed");
            let mut obs = observe::ApplyObs {
                metrics: &mut self.obs.metrics,
                audit: &self.obs.audit,
                clock: self.time.as_ref(),
                committed_at,
                #[cfg(feature = "simulation")]
                sim_fault: self.sim_fault,
            };
            if let Some(snap) = snapshot {
                fail::fail_point!("store::snapshot_install", |_| std::process::abort());
                match decode_state(snap.get_data()) {
                    Ok((table, placement)) => {
                        peer.table = table;
                        // The entries the snapshot stands for were never
                        // applied here one by one: whose clock their
                        // stamps came from, and when, is unknown.
                        peer.last_stamp = None;
                        peer.watch.restart(&peer.table);
                        peer.placement = placement;
                        peer.applied_index = snap.get_metadata().index;
                        peer.applied_term = snap.get_metadata().term;
                        peer.last_snapshot_index = peer.applied_index;
                        peer.last_snapshot_bytes = snap.get_data().len() as u64;
                        peer.snapshots_installed += 1;
                        obs.metrics.snapshots_installed.inc();
                    }
                    Err(e) => {
                        panic!(
                            "fencelock: shard {shard_id} received a snapshot it cannot read: {e}. {}",
                            crate::apply::UNREADABLE_FORMAT
                        )
                    }
                }
            }
            snapshots_sent += queue_messages(&mut outbox, shard_id, rd.take_persisted_messages());
            apply_entries(
                peer,
                rd.take_committed_entries(),
                &mut self.deferred,
                &mut obs,
            );
            let mut light = peer.raw.advance(rd);
            if let Some(commit) = light.commit_index() {
                let staged = peer
                    .raw
                    .mut_store()
                    .set_commit_index(commit, &mut self.deferred);
                staged_or_die(shard_id, "the commit index", staged);
            }
            snapshots_sent += queue_messages(&mut outbox, shard_id, light.take_messages());
            // Entries the light ready commits were learned just now.
            obs.committed_at = self.time.now();
            apply_entries(
                peer,
                light.take_committed_entries(),
                &mut self.deferred,
                &mut obs,
            );
            peer.raw.advance_apply();
            // Informational on disk (restart replays from the snapshot), but
            // it tells operators and tools how far each replica had applied.
            let applied = peer.applied_index;
            if applied > peer.raw.store().applied_index() {
                let staged = peer
                    .raw
                    .mut_store()
                    .set_applied_index(applied, &mut self.deferred);
                staged_or_die(shard_id, "the applied index", staged);
            }
            serve_reads(peer);
            // raft-rs asked for a snapshot newer than the saved one (a
            // replica was added since): take one at the applied index.
            let requested = peer.raw.store().take_snapshot_request();
            let force = requested.is_some_and(|i| peer.applied_index >= i);
            if requested.is_some() && !force {
                // Not applied that far yet: ask again next time.
                peer.raw.store().request_snapshot(requested.unwrap_or(0));
            }
            let interval = self.config.raft.snapshot_interval_entries;
            if snapshot_wanted(peer, interval, force) {
                // Timed only when taken: this runs per shard per iteration.
                let started = self.time.now();
                take_snapshot(peer, interval, &mut self.deferred);
                obs.metrics.snapshots_taken.inc();
                obs.metrics.snapshot_seconds.observe(
                    self.time
                        .now()
                        .saturating_duration_since(started)
                        .as_secs_f64(),
                );
            }
        }
        self.obs.metrics.snapshots_sent.inc_by(snapshots_sent);
        self.send_outbox(outbox);
        true
    }

    /// Makes every shard's staged writes visible to its raft-rs storage:
    /// call right after writing the batch that holds them. Every write the
    /// store stages goes into [`Store::deferred`] or into the batch that
    /// starts from it (a replica's creation and destruction write their own
    /// batch at once), so after that batch is written nothing staged
    /// anywhere is still unwritten. A shard left out would keep a view that
    /// contradicts the disk (entries compacted away, snapshot metadata
    /// replaced) until its next ready, and raft-rs fails on such a read.
    pub(crate) fn mark_persisted(&mut self) {
        for peer in self.peers.values_mut() {
            let store = peer.raw.mut_store();
            if store.has_staged() {
                store.on_persisted();
            }
        }
    }

    /// Writes the deferred batch now (unsynced, like at the end of an
    /// iteration) and makes it visible.
    pub(crate) fn flush_deferred(&mut self) {
        let deferred = std::mem::take(&mut self.deferred);
        if !deferred.is_empty() {
            self.write_or_die(&deferred, false);
        }
        self.mark_persisted();
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
