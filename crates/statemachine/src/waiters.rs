//! Read access to the queued waiters, for the server's sweep of waiters
//! whose callers are not connected to the leader (docs/safety.md,
//! "Waiting"). Reads only: nothing here changes the table.

use crate::machine::LockTable;
use crate::name::ResourceName;
use crate::types::LeaseId;

/// One queued waiter as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedWaiter<'a> {
    pub resource: &'a ResourceName,
    pub lease_id: LeaseId,
    /// Its latest attempt: what a `Cancel` for it must name.
    pub attempt: u32,
}

impl LockTable {
    /// Every queued waiter: each resource's in queue order, the resources
    /// in no particular order (a walk of the map's buckets, without the
    /// merge into key order: the store's orphan sweep runs this a few
    /// times a second per shard and needs no order).
    pub fn queued_waiters(&self) -> impl Iterator<Item = QueuedWaiter<'_>> {
        self.records
            .iter_unordered()
            .flat_map(|(resource, record)| {
                record.waiters.iter().map(move |w| QueuedWaiter {
                    resource,
                    lease_id: w.lease_id,
                    attempt: w.attempt,
                })
            })
    }
}
