//! State-machine snapshots: when a shard takes one, taking it off the
//! loop, saving it, and sending it again to a replica that never reported
//! it.
//!
//! Taking a snapshot is two halves. On the loop, the table is frozen
//! ([`fencelock_statemachine::LockTable::freeze`]: microseconds, whatever
//! its size, as the big maps are shared copy-on-write) and handed to the
//! snapshot thread with the Raft index, term and configuration it stands
//! for. The thread encodes it (10–80 ms for a 6 MB table on a busy node:
//! the stall issue 19 took off the loop) and hands the bytes back; the
//! loop then stages them and the log compaction behind them into the next
//! batch, unless something newer (a leader's snapshot installed meanwhile)
//! made them stale, or the replica is gone. One snapshot per replica is in
//! flight at a time, so the thread's queue is bounded by the replicas on
//! the node.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fencelock_placement::PlacementMap;
use fencelock_statemachine::FrozenTable;
use fencelock_storage::WriteBatch;
use raft::prelude::ConfState;
use raft::StateRole;

use crate::ready::staged_or_die;
use crate::replica::Peer;
use crate::store::Store;
use crate::{
    compaction, encode_frozen_state, WriteMode, LOG_KEEP_BEHIND_SNAPSHOT, SNAPSHOT_RESEND_TICKS,
};

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

/// Whether the shard should start a state-machine snapshot now: none is
/// being encoded, and either once per `interval` applied entries (at a
/// point of the shard's own, see [`compaction`]), or `force` (raft-rs
/// needs a snapshot newer than the saved one) and something was applied
/// since.
pub(crate) fn snapshot_wanted(peer: &Peer, interval: u64, force: bool) -> bool {
    if peer.snapshot_in_flight.is_some() {
        return false;
    }
    let due = compaction::snapshot_due(
        peer.shard_id,
        peer.applied_index,
        peer.last_snapshot_index,
        interval,
    );
    due || (force && peer.applied_index > peer.last_snapshot_index)
}

/// The snapshot a replica has handed to the snapshot thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotInFlight {
    /// The encoder's number for it: a replica deleted and created again
    /// meanwhile never takes its predecessor's bytes.
    pub(crate) seq: u64,
    /// The applied index it stands for.
    pub(crate) index: u64,
}

/// What a snapshot stands for, from the freeze to its save.
pub(crate) struct SnapshotMeta {
    /// The encoder's number for it ([`SnapshotInFlight::seq`]).
    seq: u64,
    shard_id: u64,
    /// The applied index and its term.
    index: u64,
    term: u64,
    /// The configuration raft-rs had at the freeze.
    conf_state: ConfState,
}

/// A frozen table on its way to the snapshot thread.
pub(crate) struct SnapshotJob {
    meta: SnapshotMeta,
    table: FrozenTable,
    placement: Option<PlacementMap>,
}

/// A snapshot encoded (or the reason it could not be).
pub(crate) struct Encoded {
    meta: SnapshotMeta,
    data: Result<Vec<u8>, String>,
    /// How long the encoding took (the snapshot duration metric).
    took: Duration,
}

fn encode(job: SnapshotJob) -> Encoded {
    let started = Instant::now();
    let SnapshotJob {
        meta,
        table,
        placement,
    } = job;
    // A panic is reported like a failed encoding: the loop stops the node
    // rather than wait for bytes that never come.
    let data = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        encode_frozen_state(&table, placement.as_ref())
    }))
    .map_err(|_| "the snapshot thread panicked while encoding".to_string());
    // The frozen copy goes here, off the loop: it may hold the last
    // reference to buckets the table has copied since.
    drop(table);
    Encoded {
        meta,
        data,
        took: started.elapsed(),
    }
}

/// The loop's side of the snapshot thread.
pub(crate) struct Encoder {
    next_seq: u64,
    /// To the thread ([`WriteMode::Thread`]). Otherwise jobs are encoded
    /// on the loop's thread, when submitted ([`WriteMode::Inline`], unit
    /// tests) or when the driver says ([`WriteMode::Driven`], the
    /// simulation), and still come back through `done_rx`.
    jobs: Option<Sender<SnapshotJob>>,
    /// Joined on drop, like the writer.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Jobs the driver has yet to complete ([`WriteMode::Driven`]: the
    /// simulation decides when each encoding comes back).
    held: Option<std::collections::VecDeque<SnapshotJob>>,
    done_tx: Sender<Encoded>,
    pub(crate) done_rx: Receiver<Encoded>,
}

impl Encoder {
    pub(crate) fn new(mode: WriteMode, node_id: u64) -> Encoder {
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let (jobs, thread) = if mode == WriteMode::Thread {
            // Unbounded, yet bounded by the replicas on the node: each has
            // at most one snapshot in flight (`snapshot_wanted`).
            let (tx, rx) = crossbeam_channel::unbounded::<SnapshotJob>();
            let done = done_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("fencelock-snapshot-{node_id}"))
                .spawn(move || {
                    lower_own_priority();
                    for job in rx {
                        if done.send(encode(job)).is_err() {
                            break;
                        }
                    }
                })
                .expect("spawn the snapshot thread");
            (Some(tx), Some(thread))
        } else {
            (None, None)
        };
        Encoder {
            next_seq: 1,
            jobs,
            thread,
            held: (mode == WriteMode::Driven).then(Default::default),
            done_tx,
            done_rx,
        }
    }

    /// The number of the next job.
    fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    fn submit(&mut self, job: SnapshotJob) {
        if let Some(held) = &mut self.held {
            held.push_back(job);
        } else if let Some(jobs) = &self.jobs {
            if jobs.send(job).is_err() {
                panic!("fencelock: the snapshot thread is gone; stopping the node");
            }
        } else {
            let _ = self.done_tx.send(encode(job));
        }
    }

    /// Encodes the oldest held job ([`WriteMode::Driven`]); the store
    /// saves it at its next step. Returns whether there was one.
    pub(crate) fn complete_held(&mut self) -> bool {
        let Some(job) = self.held.as_mut().and_then(|h| h.pop_front()) else {
            return false;
        };
        let _ = self.done_tx.send(encode(job));
        true
    }

    pub(crate) fn held(&self) -> bool {
        self.held.as_ref().is_some_and(|h| !h.is_empty())
    }
}

/// Background work yields to the loop and the request threads: on a busy
/// node an encoding that took a core from them for tens of milliseconds
/// showed up in the acquire p99. (Linux: `setpriority` with `who = 0`
/// sets the calling thread's nice value. Failing is harmless.)
fn lower_own_priority() {
    const BACKGROUND_NICE: libc::c_int = 10;
    // SAFETY: a plain system call on this thread, no memory involved.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS as _, 0, BACKGROUND_NICE);
    }
}

impl Drop for Encoder {
    /// Stops the thread after the snapshot it may be encoding (a snapshot
    /// not saved is only a later compaction: a restart replays the log
    /// from the last saved one).
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Freezes the replica's table at the applied index and hands it to the
/// snapshot thread.
pub(crate) fn start_snapshot(peer: &mut Peer, encoder: &mut Encoder) {
    debug_assert!(
        peer.applied_index > peer.last_snapshot_index,
        "snapshot_wanted: nothing applied since the last snapshot"
    );
    debug_assert!(
        peer.snapshot_in_flight.is_none(),
        "snapshot_wanted: one at a time"
    );
    // Raft's own view: a configuration change applied in this iteration may
    // not be visible in the storage until its write.
    let conf_state = peer.raw.raft.prs().conf().to_conf_state();
    let seq = encoder.next_seq();
    encoder.submit(SnapshotJob {
        meta: SnapshotMeta {
            seq,
            shard_id: peer.shard_id,
            index: peer.applied_index,
            term: peer.applied_term,
            conf_state,
        },
        table: peer.table.freeze(),
        placement: peer.placement.clone(),
    });
    peer.snapshot_in_flight = Some(SnapshotInFlight {
        seq,
        index: peer.applied_index,
    });
}

impl Store {
    /// Saves every snapshot the thread has encoded since; returns whether
    /// there was any.
    pub(crate) fn collect_snapshots(&mut self) -> bool {
        let mut any = false;
        while let Ok(done) = self.snapshots.done_rx.try_recv() {
            self.on_snapshot_encoded(done);
            any = true;
        }
        any
    }

    /// Stages an encoded snapshot and the compaction behind it into the
    /// next batch, unless its replica is gone (or is a new one) or a newer
    /// snapshot was installed while it was encoded.
    pub(crate) fn on_snapshot_encoded(&mut self, done: Encoded) {
        let meta = &done.meta;
        let data = match &done.data {
            Ok(data) => data,
            Err(e) => panic!(
                "fencelock: shard {}: encoding a snapshot failed ({e}); stopping the node",
                meta.shard_id
            ),
        };
        let Some(peer) = self.peers.get_mut(&meta.shard_id) else {
            return;
        };
        if peer.snapshot_in_flight.map(|f| f.seq) != Some(meta.seq) {
            return;
        }
        // Pair assertion with `start_snapshot`.
        debug_assert_eq!(peer.snapshot_in_flight.map(|f| f.index), Some(meta.index));
        peer.snapshot_in_flight = None;
        let m = &mut self.obs.metrics;
        m.snapshot_seconds.observe(done.took.as_secs_f64());
        let interval = self.config.raft.snapshot_interval_entries;
        let staged = save(peer, meta, data, interval, &mut self.deferred);
        if staged {
            m.snapshots_taken.inc();
        }
    }
}

/// Stages an encoded snapshot and truncates the log behind it; false
/// (nothing staged) if a snapshot at or past its index was installed or
/// staged while it was encoded.
fn save(
    peer: &mut Peer,
    meta: &SnapshotMeta,
    data: &[u8],
    interval: u64,
    batch: &mut WriteBatch,
) -> bool {
    if meta.index <= peer.last_snapshot_index {
        return false;
    }
    let store = peer.raw.mut_store();
    let saved =
        store.save_state_machine_snapshot(meta.index, meta.term, &meta.conf_state, data, batch);
    if let Err(fencelock_storage::Error::SnapshotOutOfDate { .. }) = saved {
        // A leader's snapshot, staged and not yet durable, is newer.
        return false;
    }
    staged_or_die(peer.shard_id, "a snapshot", saved);
    peer.last_snapshot_index = meta.index;
    peer.last_snapshot_bytes = data.len() as u64;
    let keep = LOG_KEEP_BEHIND_SNAPSHOT.min(interval / 2);
    let compact_to = meta.index.saturating_sub(keep);
    if compact_to > store.truncated().0 {
        let compacted = store.compact(compact_to, batch);
        staged_or_die(peer.shard_id, "a log compaction", compacted);
    }
    true
}
