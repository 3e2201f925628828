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

impl Store {
    /// Arms `fault` in this store (until it is dropped).
    pub fn inject_fault(&mut self, fault: SimFault) {
        self.sim_fault = Some(fault);
    }
}
