//! What the store loop tells operators about applied commands: metrics,
//! audit records and the hot-resource tally.
//!
//! Called at apply on the shard's leader only (see `apply_entries`), so each
//! change is counted and audited once in the cluster. Everything here is
//! thread-local or a non-blocking queue push: nothing waits on the hot path.

use std::time::Instant;

use fencelock_statemachine::{
    AcquireStatus, Command, Event, LeaseEnd, LeaseId, LockError, Reply, WaitEnd,
};

use super::audit::{AuditLog, AuditRecord};
use super::hot::HotCounter;
use super::metrics::StoreMetrics;
use super::Caller;

/// The store loop's observers: its metric accumulators and the audit sink.
pub struct Observers {
    pub metrics: StoreMetrics,
    pub audit: AuditLog,
}

/// What one apply pass needs from the observers.
pub(crate) struct ApplyObs<'a> {
    pub metrics: &'a mut StoreMetrics,
    pub audit: &'a AuditLog,
    /// The store's clock (for the commit-to-apply time).
    pub clock: &'a dyn super::Clock,
    /// When this pass learned its entries were committed.
    pub committed_at: Instant,
    /// The simulation's deliberate bug armed in this store, if any (the
    /// ones that act at apply: `SimFault::ExtraPermit`,
    /// `SimFault::WatchSkipsQueueGrants`).
    #[cfg(feature = "simulation")]
    pub sim_fault: Option<crate::SimFault>,
}

/// Where a command applied.
#[derive(Clone, Copy, Debug)]
pub(super) struct At {
    pub shard_id: u64,
    pub index: u64,
    /// The leader's time stamped in the entry.
    pub now_ms: u64,
}

fn record(
    obs: &ApplyObs<'_>,
    at: At,
    event: &'static str,
    resource: &str,
    lease_id: LeaseId,
    token: i64,
    caller: Option<&Caller>,
) {
    if !obs.audit.is_enabled() {
        return;
    }
    obs.audit.record(AuditRecord {
        time_ms: at.now_ms,
        shard_id: at.shard_id,
        index: at.index,
        event,
        resource: resource.to_owned(),
        lease_id,
        token,
        caller: caller.cloned().flatten(),
    });
}

/// Counts a command's direct result: hot tally for acquires, renewals and
/// their failures, a `queued` audit line. Grants and ends come as events.
pub(super) fn command_applied(
    hot: &mut HotCounter,
    command: &Command,
    reply: &Result<Reply, LockError>,
    caller: &Caller,
    at: At,
    obs: &mut ApplyObs<'_>,
) {
    match (command, reply) {
        (Command::Acquire { resource, .. }, Ok(Reply::Acquire(a))) => {
            let queued = matches!(a.status, AcquireStatus::Queued { .. });
            // A retry by requestId is the same logical acquire: not counted.
            if !a.deduplicated {
                hot.record(resource, queued);
                if queued {
                    record(
                        obs,
                        at,
                        "queued",
                        resource.as_str(),
                        a.lease_id,
                        0,
                        Some(caller),
                    );
                }
            }
        }
        (Command::Acquire { resource, .. }, Err(e)) => {
            hot.record(resource, matches!(e, LockError::LockHeld { .. }));
        }
        (
            Command::Renew {
                resource, lease_id, ..
            },
            Ok(Reply::Renewed(_)),
        ) => {
            obs.metrics.renewals.inc();
            if obs.audit.include_renewals() {
                record(
                    obs,
                    at,
                    "renewed",
                    resource.as_str(),
                    *lease_id,
                    0,
                    Some(caller),
                );
            }
        }
        (Command::Renew { .. }, Err(_)) => obs.metrics.renewal_failures.inc(),
        (Command::RenewBatch { items, .. }, Ok(Reply::RenewedBatch(results))) => {
            for (item, r) in items.iter().zip(results) {
                match r {
                    Ok(_) => {
                        obs.metrics.renewals.inc();
                        if obs.audit.include_renewals() {
                            let name = item.resource.as_str();
                            record(obs, at, "renewed", name, item.lease_id, 0, Some(caller));
                        }
                    }
                    Err(_) => obs.metrics.renewal_failures.inc(),
                }
            }
        }
        _ => {}
    }
}

/// Counts and audits one event. `caller` asked for the command that caused
/// it; `waiter` is the caller of the queued acquire the event concerns, when
/// this node holds that acquire's RPC.
pub(super) fn event_applied(
    event: &Event,
    caller: &Caller,
    waiter: Caller,
    at: At,
    obs: &mut ApplyObs<'_>,
) {
    let m = &mut *obs.metrics;
    match event {
        Event::Granted {
            resource,
            lease_id,
            token,
            from_queue,
            ..
        } => {
            if *from_queue {
                m.grants_from_queue.inc();
                let who = Some(&waiter);
                record(
                    obs,
                    at,
                    "granted_from_queue",
                    resource.as_str(),
                    *lease_id,
                    token.as_i64(),
                    who,
                );
            } else {
                m.grants.inc();
                record(
                    obs,
                    at,
                    "granted",
                    resource.as_str(),
                    *lease_id,
                    token.as_i64(),
                    Some(caller),
                );
            }
        }
        Event::LeaseEnded {
            resource,
            lease_id,
            token,
            ended,
        } => {
            // An expiry is the service's own doing: whoever's command
            // happened to settle it did not ask for it.
            let (name, who) = match ended {
                LeaseEnd::Released => {
                    m.releases.inc();
                    ("released", Some(caller))
                }
                LeaseEnd::Expired => {
                    m.expiries.inc();
                    ("expired", None)
                }
                LeaseEnd::Cancelled => {
                    m.lease_cancels.inc();
                    ("cancelled", Some(caller))
                }
            };
            record(
                obs,
                at,
                name,
                resource.as_str(),
                *lease_id,
                token.as_i64(),
                who,
            );
        }
        Event::WaitEnded {
            resource,
            lease_id,
            ended,
            ..
        } => {
            let name = match ended {
                WaitEnd::TimedOut => {
                    m.wait_timeouts.inc();
                    "wait_timed_out"
                }
                WaitEnd::Cancelled => {
                    m.wait_cancels.inc();
                    "wait_cancelled"
                }
                WaitEnd::TokenSpaceExhausted => "wait_token_space_exhausted",
            };
            record(
                obs,
                at,
                name,
                resource.as_str(),
                *lease_id,
                0,
                Some(&waiter),
            );
        }
        Event::ValueChanged {
            resource,
            lease_id,
            token,
        } => {
            m.proclaims.inc();
            record(
                obs,
                at,
                "value_changed",
                resource.as_str(),
                *lease_id,
                token.as_i64(),
                Some(caller),
            );
        }
        Event::WaitMoved { resource, lease_id } => {
            record(
                obs,
                at,
                "wait_moved",
                resource.as_str(),
                *lease_id,
                0,
                Some(&waiter),
            );
        }
    }
}
