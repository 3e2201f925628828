//! State-machine snapshots: when a shard takes one, taking it, and sending
//! it again to a replica that never reported it.

use fencelock_storage::WriteBatch;
use raft::StateRole;

use crate::ready::staged_or_die;
use crate::replica::Peer;
use crate::{compaction, encode_state, LOG_KEEP_BEHIND_SNAPSHOT, SNAPSHOT_RESEND_TICKS};

/// Leader: a replica that has waited [`SNAPSHOT_RESEND_TICKS`] for a
/// snapshot is reported as failed to take it, so raft-rs probes it again
/// and sends a snapshot anew. A replica that did take it answered long
/// before and is out of the snapshot state already; one that is slow to
/// install gets a duplicate, which it ignores.
pub(crate) fn resend_lost_snapshots(peer: &mut Peer) {
    if peer.raw.raft.state != StateRole::Leader {
        peer.snapshot_wait_ticks.clear();
        return;
    }
    let any_waiting = peer
        .raw
        .raft
        .prs()
        .iter()
        .any(|(_, pr)| pr.state == raft::ProgressState::Snapshot);
    if !any_waiting {
        peer.snapshot_wait_ticks.clear();
        return;
    }
    let waiting: Vec<u64> = peer
        .raw
        .raft
        .prs()
        .iter()
        .filter(|(_, pr)| pr.state == raft::ProgressState::Snapshot)
        .map(|(id, _)| *id)
        .collect();
    peer.snapshot_wait_ticks
        .retain(|id, _| waiting.contains(id));
    for id in waiting {
        let ticks = peer.snapshot_wait_ticks.entry(id).or_insert(0);
        *ticks += 1;
        if *ticks >= SNAPSHOT_RESEND_TICKS {
            *ticks = 0;
            peer.raw.report_snapshot(id, raft::SnapshotStatus::Failure);
        }
    }
}

/// Whether the shard should save a state-machine snapshot now: once per
/// `interval` applied entries (at a point of the shard's own, see
/// [`compaction`]), or when `force` (raft-rs needs a snapshot newer than the
/// saved one) and something was applied since.
pub(crate) fn snapshot_wanted(peer: &Peer, interval: u64, force: bool) -> bool {
    let due = compaction::snapshot_due(
        peer.shard_id,
        peer.applied_index,
        peer.last_snapshot_index,
        interval,
    );
    due || (force && peer.applied_index > peer.last_snapshot_index)
}

/// Saves a state-machine snapshot at the applied index and truncates the
/// log behind it.
pub(crate) fn take_snapshot(peer: &mut Peer, interval: u64, batch: &mut WriteBatch) {
    debug_assert!(
        peer.applied_index > peer.last_snapshot_index,
        "snapshot_wanted: nothing applied since the last snapshot"
    );
    let data = encode_state(&peer.table, peer.placement.as_ref());
    // Raft's own view: a configuration change applied in this iteration may
    // not be visible in the storage until its write.
    let cs = peer.raw.raft.prs().conf().to_conf_state();
    let store = peer.raw.mut_store();
    let saved =
        store.save_state_machine_snapshot(peer.applied_index, peer.applied_term, &cs, &data, batch);
    staged_or_die(peer.shard_id, "a snapshot", saved);
    peer.last_snapshot_index = peer.applied_index;
    peer.last_snapshot_bytes = data.len() as u64;
    let keep = LOG_KEEP_BEHIND_SNAPSHOT.min(interval / 2);
    let compact_to = peer.applied_index.saturating_sub(keep);
    if compact_to > store.truncated().0 {
        let compacted = store.compact(compact_to, batch);
        staged_or_die(peer.shard_id, "a log compaction", compacted);
    }
}
