//! Deliberate bugs for the deterministic simulation's broken-variant test
//! (feature `simulation`; never in a release build). Each one breaks a
//! safety mechanism of the store so the test can show that the history
//! checkers catch what it lets through.

use super::Store;

/// One deliberate bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// A new leader's `LeaderChanged` entry carries no clock-offset
    /// allowance: inherited leases keep the old leader's stamped expiry,
    /// and a new leader whose clock runs ahead frees them early.
    SkipLeaseExtension,
    /// A follower acknowledges appended entries (and a candidate asks for
    /// votes) before its synced write instead of after it: a leader may
    /// count a copy a crash can still lose.
    AckBeforePersist,
}

impl Store {
    /// Arms `fault` in this store (until it is dropped).
    pub fn inject_fault(&mut self, fault: SimFault) {
        self.sim_fault = Some(fault);
    }
}
