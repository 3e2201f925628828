//! One shard replica on this node ([`Peer`]: its `RawNode`, lock table and
//! what waits on it) and what the loop publishes of it ([`ShardStatus`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use fencelock_placement::{PlacementCommand, PlacementMap};
use fencelock_statemachine::{Command, LeaseId, LockTable, ResourceName};
use fencelock_storage::{Engine, ShardStorage};
use raft::{RawNode, StateRole};
use tokio::sync::oneshot;

use crate::apply::respond_err;
use crate::msg::{AcquireResult, Caller, MetaResult, ReadReply, ReplyResult, Responder};
use crate::{hot, Clock, HotEntry, StoreError};

/// A proposal in flight.
pub(crate) struct Pending {
    pub(crate) term: u64,
    pub(crate) proposed_at: Instant,
    pub(crate) responders: Vec<Responder>,
    /// Parallel to `responders` for lock commands; empty otherwise.
    pub(crate) callers: Vec<Caller>,
}

/// What `take_pending` found for an entry.
#[derive(Default)]
pub(crate) struct Taken {
    pub(crate) responders: Vec<Responder>,
    pub(crate) callers: Vec<Caller>,
    pub(crate) proposed_at: Option<Instant>,
}

pub(crate) struct PendingRead {
    pub(crate) resource: ResourceName,
    pub(crate) tx: oneshot::Sender<Result<ReadReply, StoreError>>,
    pub(crate) asked_at: Instant,
    /// Set once raft reported the read index.
    pub(crate) index: Option<u64>,
}

/// An acquire waiting in a resource's queue.
pub(crate) struct Waiting {
    pub(crate) resource: ResourceName,
    /// The attempt this caller is (named in the `Cancel` if it goes away).
    pub(crate) attempt: u32,
    pub(crate) tx: oneshot::Sender<AcquireResult>,
    pub(crate) caller: Caller,
}

/// A waiter in the table whose caller is not registered with this leader
/// (see [`sweep_orphans`]).
pub(crate) struct Orphan {
    pub(crate) resource: ResourceName,
    /// Its latest attempt when it was first seen without a caller.
    pub(crate) attempt: u32,
    pub(crate) since: Instant,
}

/// The leader's clock: wall time read once at election plus monotonic time
/// since, so a wall-clock step during a term does not move lease time
/// (assumption A3 in docs/safety.md).
#[derive(Clone, Copy)]
pub(crate) struct LeaderClock {
    pub(crate) wall_ms_at_start: u64,
    pub(crate) started: Instant,
}

/// Where a new leader's lease clock starts: the table's clock
/// (`table_clock_ms`, the highest stamp applied), or, if later, the stamp
/// of the last entry this replica applied plus the time it has measured on
/// its own monotonic clock since (`last_stamp`). That entry's proposer read
/// its lease clock before the entry committed and this replica applied it
/// after, so the sum is never ahead of the proposer's lease clock now, and
/// the proposer is the last leader whose entries this replica has applied:
/// the leader whose leases it inherits.
///
/// Not the highest stamp plus the time since it was first applied: a
/// leader whose clock started behind the table's (one that restarted, or
/// installed a snapshot, and could not account for the time since its
/// stamp) grants while the table's time stands still at an older leader's
/// stamp, and a successor extrapolating that older stamp would run ahead of
/// it by up to the time it stood still and end its leases early (the chaos
/// run of 2026-12-07, seed 4538120458970: a lease gone 0.5 s before its
/// holder's stop-by after a leadership transfer).
///
/// Never the wall clock: a node whose wall clock jumped ahead by seconds
/// would free every lease seconds early the moment it was elected (the
/// allowance a `LeaderChanged` adds covers only
/// `clock_offset_allowance_ms`). Only a brand-new table, which holds no
/// lease, starts from the wall clock (so that lease times read like Unix
/// times). Lease safety across a leader change therefore rests on
/// monotonic clock rates alone (docs/safety.md, "Time and leases").
pub(crate) fn lease_clock_start(
    table_clock_ms: u64,
    last_stamp: Option<(u64, Instant)>,
    wall_ms: u64,
    now: Instant,
) -> u64 {
    if table_clock_ms == 0 {
        return wall_ms;
    }
    match last_stamp {
        Some((stamp_ms, at)) => table_clock_ms
            .max(stamp_ms.saturating_add(now.saturating_duration_since(at).as_millis() as u64)),
        // Nothing applied here since this process started or since the
        // last snapshot it installed: no elapsed time is known.
        None => table_clock_ms,
    }
}

/// The rule before 2026-12, kept for the simulation's broken variant: a
/// new leader's lease clock starts at its wall clock (if that is past the
/// table's clock), which is safe only while wall clocks stay within the
/// allowance of each other.
#[cfg(feature = "simulation")]
pub(crate) fn start_from_wall_clock(peer: &mut Peer, time: &dyn Clock) {
    if let Some(clock) = peer.clock.as_mut() {
        clock.wall_ms_at_start = time.wall_ms().max(peer.table.clock_ms());
    }
}

/// Whether a leader without a lease clock has applied every entry of the
/// terms before its own, so its clock may start.
pub(crate) fn may_start_lease_clock(peer: &Peer) -> bool {
    peer.is_leader() && peer.leadership_taken_up && peer.applied_index + 1 >= peer.term_start_index
}

/// Starts a leader's lease clock (see [`lease_clock_start`]). Called once
/// [`may_start_lease_clock`]: a new leader's log may hold entries of the
/// previous leader it has not applied yet (committed, but not yet known
/// to be); their stamps are that leader's time, and starting from an
/// older entry's stamp could run ahead of it. Those entries are applied
/// once the first entry of this term commits, and no command of this
/// leader counts before its `LeaderChanged`, which is stamped from here.
/// Defence in depth: a replica holding any lease-bearing entry of the
/// previous leader learned, with it, that leader's `LeaderChanged`
/// committed and applied it (docs/safety.md, "Where a new leader's lease
/// clock starts"); the wait keeps the rule without that argument.
pub(crate) fn start_lease_clock(peer: &mut Peer, time: &dyn Clock) {
    debug_assert!(may_start_lease_clock(peer));
    let now = time.now();
    let start = lease_clock_start(peer.table.clock_ms(), peer.last_stamp, time.wall_ms(), now);
    peer.clock = Some(LeaderClock {
        wall_ms_at_start: start,
        started: now,
    });
}

/// Records the stamp of the last entry an apply pass applied, with the
/// pass's end on this replica's monotonic clock (later than the apply
/// itself: it only shortens the time a successor adds).
pub(crate) fn note_last_stamp(peer: &mut Peer, stamp_ms: u64, now: Instant) {
    peer.last_stamp = Some((stamp_ms, now));
}

impl LeaderClock {
    /// Lease time at monotonic instant `now`.
    pub(crate) fn now_ms(&self, now: Instant) -> u64 {
        self.wall_ms_at_start + now.saturating_duration_since(self.started).as_millis() as u64
    }
}

/// One shard replica on this node.
pub(crate) struct Peer {
    pub(crate) shard_id: u64,
    pub(crate) raw: RawNode<ShardStorage<dyn Engine>>,
    pub(crate) table: LockTable,
    /// The placement map, on replicas of the meta shard only.
    pub(crate) placement: Option<PlacementMap>,
    pub(crate) queued: Vec<(Command, Responder, Caller)>,
    pub(crate) meta_queued: Vec<(PlacementCommand, oneshot::Sender<MetaResult>)>,
    /// An epoch to start at the next flush (see `StoreMsg::AdoptEpoch`).
    pub(crate) epoch_queued: Option<(u64, oneshot::Sender<ReplyResult>)>,
    pub(crate) pending: HashMap<u64, Pending>,
    pub(crate) reads: HashMap<u64, PendingRead>,
    pub(crate) waiting: HashMap<LeaseId, Waiting>,
    /// Ready leader: waiters nobody here waits for, since when.
    pub(crate) orphans: BTreeMap<LeaseId, Orphan>,
    /// Ready leader: when it next looks for orphans (`None`: at once).
    pub(crate) next_orphan_scan: Option<Instant>,
    /// How long a waiter may stay without a caller here before the leader
    /// cancels it: the proposal timeout.
    pub(crate) orphan_grace: Duration,
    /// A leader's lease clock, from when it has applied every entry of the
    /// terms before its own (see [`start_lease_clock`]); `None` before.
    pub(crate) clock: Option<LeaderClock>,
    /// A leader: the index of the first entry of its term (the empty entry
    /// raft-rs appends on election). Its lease clock starts once every
    /// entry before it is applied.
    pub(crate) term_start_index: u64,
    /// The stamp of the last entry this replica applied (its proposer's
    /// lease clock when proposed) and when, on this replica's monotonic
    /// clock; `None` after a restart until an entry is applied, and after
    /// a snapshot install. Where its lease clock starts if it becomes
    /// leader (see [`lease_clock_start`]).
    pub(crate) last_stamp: Option<(u64, Instant)>,
    /// Propose `LeaderChanged` at the next flush.
    pub(crate) needs_leader_changed: bool,
    /// This replica has taken up its leadership ([`on_role_change`] ran
    /// for it). raft-rs is leader from the moment it counts the votes,
    /// before the ready that says so is processed; until then the lease
    /// clock must not start (see [`may_start_lease_clock`]).
    pub(crate) leadership_taken_up: bool,
    /// When this leader last proposed its `LeaderChanged` entry: if it has
    /// not applied within the proposal timeout (dropped during a leadership
    /// transfer, say), it is proposed again rather than leaving the shard
    /// refusing requests forever.
    pub(crate) leader_changed_at: Option<Instant>,
    pub(crate) tick_in_flight: Option<u64>,
    pub(crate) applied_index: u64,
    pub(crate) applied_term: u64,
    pub(crate) last_snapshot_index: u64,
    /// The snapshot being encoded on the snapshot thread, if any.
    pub(crate) snapshot_in_flight: Option<crate::snapshot::SnapshotInFlight>,
    /// Size of the latest snapshot's data: the saved one the replica
    /// started from, or the last it took or installed.
    pub(crate) last_snapshot_bytes: u64,
    pub(crate) snapshots_installed: u64,
    /// Since when this replica has known no leader.
    pub(crate) leaderless_since: Option<Instant>,
    /// The hottest resources, counted while this replica leads.
    pub(crate) hot: hot::HotCounter,
    /// Recent changes of the shard's resources and this node's watchers.
    pub(crate) watch: crate::watch::WatchHub,
    /// Leader: ticks each replica has spent waiting for a snapshot
    /// (see [`SNAPSHOT_RESEND_TICKS`]).
    pub(crate) snapshot_wait_ticks: BTreeMap<u64, u32>,
}

impl Peer {
    pub(crate) fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Remembers who waits for the entry proposed with context `id` at
    /// `now`.
    pub(crate) fn track(&mut self, id: u64, responders: Vec<Responder>, now: Instant) {
        self.track_commands(id, responders, Vec::new(), now);
    }

    /// [`Peer::track`] for lock commands, with who asked for each.
    pub(crate) fn track_commands(
        &mut self,
        id: u64,
        responders: Vec<Responder>,
        callers: Vec<Caller>,
        now: Instant,
    ) {
        let term = self.raw.raft.term;
        self.pending.insert(
            id,
            Pending {
                term,
                proposed_at: now,
                responders,
                callers,
            },
        );
    }

    /// Leader whose `LeaderChanged` entry has been applied in its term.
    /// A leader whose lease clock has not started yet (entries of earlier
    /// terms still to apply): it proposes nothing, its queues wait.
    pub(crate) fn awaits_lease_clock(&self) -> bool {
        self.is_leader() && self.clock.is_none()
    }

    pub(crate) fn is_ready_leader(&self) -> bool {
        self.is_leader() && self.table.leader_term() == self.raw.raft.term
    }
}

/// Per-shard numbers for tests and admin views.
#[derive(Clone, Debug, Default)]
pub struct ShardStatus {
    pub shard_id: u64,
    pub leader_id: u64,
    pub term: u64,
    pub is_leader: bool,
    pub applied_index: u64,
    pub held: usize,
    /// Dedup entries this replica keeps (live and retained outcomes).
    pub dedup_entries: usize,
    /// Size of the latest snapshot's data: the one this replica started
    /// from, or the last it took or installed.
    pub snapshot_bytes: u64,
    /// Snapshots received from a leader and installed since start.
    pub snapshots_installed: u64,
    pub commit_index: u64,
    pub epoch: u64,
    /// Token positions left in the current epoch before new acquires are
    /// refused (see [`EPOCH_ADVANCE_POSITIONS_LEFT`]).
    pub token_positions_left: u64,
    pub waiters: usize,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// Slots this replica's table serves.
    pub owned_slots: u32,
    pub pending_exports: Vec<u64>,
    /// How long this replica has known no leader (0 while it knows one).
    pub leaderless_ms: u64,
    /// The hottest resources while this replica leads, most acquired first
    /// (at most [`HOT_REPORTED_PER_SHARD`]).
    pub hot: Vec<HotEntry>,
    /// While this replica leads: how far its wall clock is ahead of the
    /// shard's lease clock (negative: behind), in ms, so the edge can show
    /// lease times (`expires_at_ms`) as wall-clock times. The lease clock
    /// never follows the wall clock (see [`lease_clock_start`]); this is
    /// for display only. 0 when not leading.
    pub lease_clock_behind_wall_ms: i64,
}

/// Answers everything waiting on `peer` with `e`.
pub(crate) fn fail_peer(peer: &mut Peer, e: StoreError) {
    for (_, p) in peer.pending.drain() {
        for r in p.responders {
            respond_err(r, e.clone());
        }
    }
    for (_, r, _) in peer.queued.drain(..) {
        respond_err(r, e.clone());
    }
    for (_, tx) in peer.meta_queued.drain(..) {
        let _ = tx.send(Err(e.clone()));
    }
    if let Some((_, tx)) = peer.epoch_queued.take() {
        let _ = tx.send(Err(e.clone()));
    }
    for (_, r) in peer.reads.drain() {
        let _ = r.tx.send(Err(e.clone()));
    }
    for (_, w) in peer.waiting.drain() {
        let _ = w.tx.send(Err(e.clone()));
    }
}

pub(crate) fn on_role_change(peer: &mut Peer, role: StateRole) {
    if role == StateRole::Leader {
        // The lease clock waits until the entries of earlier terms are
        // applied (`start_lease_clock`): only then is the last applied
        // entry the last leader's, whose leases this one inherits. Paired
        // with `may_start_lease_clock`, which waits for this call: raft-rs
        // is leader as soon as it counts the votes, an iteration's tick
        // and proposals run before its ready says so, and a clock started
        // there would skip the wait (`term_start_index` still the last
        // term's).
        debug_assert!(
            peer.clock.is_none(),
            "shard {}: a lease clock started before the leadership was taken up",
            peer.shard_id
        );
        peer.clock = None;
        peer.term_start_index = peer.raw.raft.raft_log.last_index();
        peer.needs_leader_changed = true;
        peer.leadership_taken_up = true;
        return;
    }
    peer.leadership_taken_up = false;
    peer.clock = None;
    peer.term_start_index = 0;
    peer.hot.clear();
    peer.orphans.clear();
    peer.next_orphan_scan = None;
    peer.needs_leader_changed = false;
    peer.leader_changed_at = None;
    peer.tick_in_flight = None;
    // Entries already proposed may still commit under the next leader: their
    // outcome is unknown, and a retry by requestId finds it.
    let shard_id = peer.shard_id;
    for (_, p) in peer.pending.drain() {
        for r in p.responders {
            respond_err(r, StoreError::OutcomeUnknown { shard_id });
        }
    }
    for (_, r, _) in peer.queued.drain(..) {
        respond_err(r, StoreError::LeaderUnknown { shard_id });
    }
    for (_, tx) in peer.meta_queued.drain(..) {
        let _ = tx.send(Err(StoreError::LeaderUnknown { shard_id }));
    }
    if let Some((_, tx)) = peer.epoch_queued.take() {
        let _ = tx.send(Err(StoreError::LeaderUnknown { shard_id }));
    }
    for (_, r) in peer.reads.drain() {
        let _ = r.tx.send(Err(StoreError::LeaderUnknown { shard_id }));
    }
    for (_, w) in peer.waiting.drain() {
        let _ = w.tx.send(Err(StoreError::OutcomeUnknown { shard_id }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WALL_MS: u64 = 1_700_000_000_000;

    #[test]
    fn a_new_leader_continues_from_the_stamp_plus_what_it_measured_since() {
        let applied_at = Instant::now();
        let now = applied_at + Duration::from_millis(1_250);
        let stamp = WALL_MS + 40_000;
        let seen = Some((stamp, applied_at));
        assert_eq!(lease_clock_start(stamp, seen, WALL_MS, now), stamp + 1_250);
        // A wall clock seconds ahead (or behind) changes nothing.
        for wall in [stamp + 9_000, stamp - 9_000, 0] {
            assert_eq!(lease_clock_start(stamp, seen, wall, now), stamp + 1_250);
        }
    }

    #[test]
    fn nothing_applied_here_gives_no_elapsed_time() {
        let now = Instant::now();
        let stamp = WALL_MS;
        // Restarted, or installed a snapshot, and applied nothing since.
        assert_eq!(lease_clock_start(stamp, None, stamp + 5_000, now), stamp);
        // An old entry's stamp plus the time since never goes below the
        // table's clock.
        let older = Some((stamp - 4_000, now - Duration::from_secs(3)));
        assert_eq!(lease_clock_start(stamp, older, stamp + 5_000, now), stamp);
    }

    /// The table's time stood still at an older leader's stamp (10 s) while
    /// the last leader, whose clock started behind it (it had restarted),
    /// stamped 8 s and granted a lease until 10 s + 2 s of table time. Its
    /// successor must continue the last leader's time, not the older
    /// leader's: starting at 10 s + the 3.1 s since that stamp was applied
    /// would end the lease at once, about 4 s early.
    #[test]
    fn a_new_leader_continues_the_last_leaders_time_not_an_older_higher_stamp() {
        let stalled_since = Instant::now();
        let last_applied = stalled_since + Duration::from_millis(3_000);
        let now = last_applied + Duration::from_millis(100);
        let table_clock = WALL_MS + 10_000;
        let last = Some((WALL_MS + 8_000, last_applied));
        let start = lease_clock_start(table_clock, last, WALL_MS + 99_000, now);
        assert_eq!(start, table_clock, "the table's time, still standing");
        let lease_end = table_clock + 2_000;
        assert!(start < lease_end, "the inherited lease is still held");
        // Once the last leader's time passed the table's, it continues.
        let later = now + Duration::from_millis(2_500);
        assert_eq!(
            lease_clock_start(table_clock, last, WALL_MS, later),
            WALL_MS + 8_000 + 2_600
        );
    }

    #[test]
    fn only_a_table_that_was_never_stamped_starts_from_the_wall_clock() {
        assert_eq!(lease_clock_start(0, None, WALL_MS, Instant::now()), WALL_MS);
    }
}
