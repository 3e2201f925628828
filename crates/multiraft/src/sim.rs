//! Deliberate bugs for the deterministic simulation's broken-variant test
//! (feature `simulation`; never in a release build). Each one breaks a
//! safety mechanism of the store so the test can show that the history
//! checkers catch what it lets through.

use fencelock_statemachine::{AcquireMode, Command, Event};

use super::Store;

/// One deliberate bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// A new leader starts its lease clock from its wall clock (the rule
    /// before 2026-12) instead of the table's clock plus the time it
    /// measured since applying it: a new leader whose wall clock jumped
    /// ahead by more than the allowance frees inherited leases early.
    TrustWallClockOnNewLeader,
    /// A follower acknowledges appended entries (and a candidate asks for
    /// votes) before its synced write instead of after it: a leader may
    /// count a copy a crash can still lose.
    AckBeforePersist,
    /// Every replica applies a semaphore's acquire as if the semaphore had
    /// one permit more than its acquires name: one holder too many at once.
    ExtraPermit,
    /// Every replica leaves the grants handed to a queued waiter (by a
    /// release, an expiry or a cancel ahead of it) out of its watch log, as
    /// a log fed from the commands' own grants instead of their events
    /// would: a watcher sees the lock end and the waiter's lease end, never
    /// its grant.
    WatchSkipsQueueGrants,
}

/// `command`, a semaphore acquire of N permits applied as one of N + 1
/// (`SimFault::ExtraPermit`); any other command as it is.
pub(crate) fn one_permit_more(command: &Command) -> Command {
    let mut command = command.clone();
    if let Command::Acquire {
        mode: AcquireMode::Semaphore { permits },
        ..
    } = &mut command
    {
        *permits += 1;
    }
    command
}

/// `events` without the grants to queued waiters
/// (`SimFault::WatchSkipsQueueGrants`): what the broken watch log records.
pub(crate) fn without_queue_grants(events: &[Event]) -> Vec<Event> {
    (events.iter())
        .filter(|e| {
            !matches!(
                e,
                Event::Granted {
                    from_queue: true,
                    ..
                }
            )
        })
        .cloned()
        .collect()
}

/// A shard this node leads, with what a client may have been answered
/// for: every entry up to `commit_index` may have been applied and
/// acknowledged.
#[derive(Clone, Debug)]
pub struct LeaderCommit {
    pub shard_id: u64,
    pub commit_index: u64,
    /// The committed entry as this leader's log has it (staged or durable),
    /// encoded as on disk; `None` once compacted.
    pub entry: Option<Vec<u8>>,
    pub voters: Vec<u64>,
}

impl Store {
    /// Arms `fault` in this store (until it is dropped).
    pub fn inject_fault(&mut self, fault: SimFault) {
        self.sim_fault = Some(fault);
    }

    /// Every shard this node leads and its commit index right now (not as
    /// of the last published status): what the simulation's durability
    /// property checks after every step.
    pub fn leader_commits(&self) -> Vec<LeaderCommit> {
        use protobuf::Message as _;
        use raft::{GetEntriesContext, Storage as _};
        (self.peers.values())
            .filter(|p| p.is_leader())
            .map(|p| {
                let commit_index = p.raw.raft.raft_log.committed;
                let entry = (p.raw.store())
                    .entries(
                        commit_index,
                        commit_index + 1,
                        None,
                        GetEntriesContext::empty(false),
                    )
                    .ok()
                    .and_then(|e| e.first().and_then(|e| e.write_to_bytes().ok()));
                LeaderCommit {
                    shard_id: p.shard_id,
                    commit_index,
                    entry,
                    voters: p.raw.raft.prs().conf().to_conf_state().voters,
                }
            })
            .filter(|c| c.commit_index > 0)
            .collect()
    }
}
