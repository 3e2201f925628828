//! Apply: committed entries into the lock tables (and the meta shard's
//! placement map), answering the requests whose entries applied, events of
//! later applies (grants from the queue, expiries, timeouts), orphaned waiters
//! and linearizable reads.

use std::collections::BTreeMap;
use std::time::Instant;

use fencelock_placement::PlacementCommand;
use fencelock_statemachine::{
    slot_of, AcquireReply, AcquireStatus, ApplyContext, Command, Event, LeaseId, LockError, Reply,
    ResourceName, WaitEnd,
};
use fencelock_storage::WriteBatch;
use raft::prelude::{Entry, EntryType};

use crate::membership::apply_conf_change;
use crate::msg::{AcquireResult, Caller, ReadReply, Responder};
use crate::replica::{Orphan, Peer, Taken, Waiting};
use crate::{decode_payload, observe, Payload, StoreError, ORPHAN_SCANS_PER_GRACE};

/// What a node that meets a committed entry or a snapshot it cannot read
/// is told (it stops rather than skip it: every replica must apply the
/// same log).
pub(crate) const UNREADABLE_FORMAT: &str = "Most likely another member runs a newer fencelock \
     that wrote a format this build does not know: upgrade this node (docs/operations.md, \
     \"Upgrades and the placement log\"); it catches up from where it stopped. Otherwise \
     the log is damaged: replace this node's replicas from their peers";

pub(crate) fn apply_entries(
    peer: &mut Peer,
    entries: Vec<Entry>,
    batch: &mut WriteBatch,
    obs: &mut observe::ApplyObs<'_>,
) {
    let mut applied_normal = 0u32;
    // The stamp of the last entry applied in this pass (placement entries
    // included: every stamp is its leader's lease clock).
    let mut last_stamp_ms = None;
    for entry in entries {
        if entry.index <= peer.applied_index {
            continue;
        }
        // raft-rs hands committed entries over in order and without holes
        // (after a snapshot, from the one after it). Applying across a gap
        // would run a later command on a table that never saw an earlier
        // one: replicas would diverge. Stop instead (fail-stop).
        assert!(
            entry.index == peer.applied_index + 1,
            "shard {}: committed entry {} does not follow the applied index {} (a gap in the log)",
            peer.shard_id,
            entry.index,
            peer.applied_index
        );
        peer.applied_index = entry.index;
        peer.applied_term = entry.term;
        let Taken {
            responders,
            callers,
            proposed_at,
        } = take_pending(peer, &entry);
        if let Some(at) = proposed_at {
            let seconds = obs.committed_at.saturating_duration_since(at).as_secs_f64();
            obs.metrics.propose_commit_seconds.observe(seconds);
        }
        if entry.get_entry_type() == EntryType::EntryConfChange {
            apply_conf_change(peer, &entry, responders, batch);
            continue;
        }
        if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
            // The empty entry a new leader appends, or a proposal raft-rs
            // replaced by one (a second configuration change while one is
            // pending): nothing was applied for whoever waits on it.
            for r in responders {
                respond_err(
                    r,
                    StoreError::Internal("proposal dropped by raft; retry".into()),
                );
            }
            continue;
        }
        let (now_ms, payload) = match decode_payload(&entry.data) {
            Ok(p) => p,
            Err(e) => panic!(
                "fencelock: shard {} entry {} does not decode: {e}. {UNREADABLE_FORMAT}",
                peer.shard_id, entry.index
            ),
        };
        last_stamp_ms = Some(now_ms);
        let (entry_epoch, commands) = match payload {
            Payload::Locks(commands) => (None, commands),
            Payload::LocksAtEpoch { epoch, commands } => (Some(epoch), commands),
            Payload::Placement(commands) => {
                apply_placement(peer, &commands, responders);
                continue;
            }
        };
        let mut responders = responders.into_iter();
        let mut callers = callers.into_iter();
        // Counted and audited by the leader only: followers apply the same
        // entries, and every change should be told once.
        let leader = peer.is_leader();
        for command in &commands {
            // The table's own epoch: an import moves it mid-entry, and the
            // commands after it belong to the new epoch. An entry stamped
            // with an epoch is applied at that one: the table moves to it
            // (positions start again at 1) or refuses it as stale.
            let ctx = ApplyContext {
                index: entry.index,
                term: entry.term,
                epoch: entry_epoch.unwrap_or_else(|| peer.table.epoch()),
                now_ms,
            };
            #[cfg(feature = "simulation")]
            let bumped = (obs.sim_fault == Some(crate::SimFault::ExtraPermit))
                .then(|| crate::sim::one_permit_more(command));
            #[cfg(feature = "simulation")]
            let command = bumped.as_ref().unwrap_or(command);
            let outcome = peer.table.apply(command, &ctx);
            // This leader's own `LeaderChanged` (it is ready from here on)
            // or an import: waiters nobody here waits for may have arrived.
            let arrived = match command {
                Command::LeaderChanged { .. } => true,
                Command::ImportSlots { .. } => outcome.reply.is_ok(),
                _ => false,
            };
            if arrived && peer.is_ready_leader() {
                sweep_orphans(peer, obs.clock.now(), true);
            }
            let caller = callers.next().flatten();
            let at = observe::At {
                shard_id: peer.shard_id,
                index: entry.index,
                now_ms,
            };
            if leader {
                observe::command_applied(&mut peer.hot, command, &outcome.reply, &caller, at, obs);
            }
            for event in &outcome.events {
                on_event(peer, event, leader.then_some((&caller, at)), obs);
            }
            #[cfg(feature = "simulation")]
            let unwatched = (obs.sim_fault == Some(crate::SimFault::WatchSkipsQueueGrants))
                .then(|| crate::sim::without_queue_grants(&outcome.events));
            #[cfg(feature = "simulation")]
            let watched = unwatched.as_deref().unwrap_or(&outcome.events);
            #[cfg(not(feature = "simulation"))]
            let watched = &outcome.events;
            peer.watch.on_events(&peer.table, entry.index, watched);
            if matches!(command, Command::ExportSlots { .. }) && outcome.reply.is_ok() {
                let table = &peer.table;
                peer.watch.cut_moved(|resource| !table.owns(resource));
            }
            let responder = responders.next().unwrap_or(Responder::None);
            respond(peer, responder, outcome.reply, caller);
        }
        applied_normal += 1;
    }
    // One clock read per apply pass, not per entry: every entry of the pass
    // is applied by its end.
    if let Some(stamp_ms) = last_stamp_ms {
        crate::replica::note_last_stamp(peer, stamp_ms, obs.clock.now());
    }
    if applied_normal > 0 {
        let seconds = obs
            .clock
            .now()
            .saturating_duration_since(obs.committed_at)
            .as_secs_f64();
        for _ in 0..applied_normal {
            obs.metrics.commit_apply_seconds.observe(seconds);
        }
    }
}

/// Applies placement commands to the meta shard's map.
pub(crate) fn apply_placement(
    peer: &mut Peer,
    commands: &[PlacementCommand],
    responders: Vec<Responder>,
) {
    let Some(map) = peer.placement.as_mut() else {
        // Only the meta shard's leader proposes these; a data shard holding
        // one means the log is not what this node believes it is.
        panic!(
            "fencelock: shard {} has a placement entry but no placement map",
            peer.shard_id
        );
    };
    let mut responders = responders.into_iter();
    for command in commands {
        let result = map.apply(command);
        if let Some(Responder::Meta(tx)) = responders.next() {
            let _ = tx.send(
                result
                    .map(|reply| (reply, map.clone()))
                    .map_err(StoreError::Placement),
            );
        }
    }
}

/// Who waits for `entry`: the responders of this node's proposal, if the
/// entry is that proposal (same context id, same term); otherwise nobody.
pub(crate) fn take_pending(peer: &mut Peer, entry: &Entry) -> Taken {
    let Some(id) = u64_from_ctx(&entry.context) else {
        return Taken::default();
    };
    if peer.tick_in_flight == Some(id) {
        peer.tick_in_flight = None;
    }
    match peer.pending.get(&id) {
        Some(p) if p.term == entry.term => peer
            .pending
            .remove(&id)
            .map(|p| Taken {
                responders: p.responders,
                callers: p.callers,
                proposed_at: Some(p.proposed_at),
            })
            .unwrap_or_default(),
        _ => Taken::default(),
    }
}

pub(crate) fn respond(
    peer: &mut Peer,
    responder: Responder,
    reply: Result<Reply, fencelock_statemachine::LockError>,
    caller: Caller,
) {
    // Failpoint: the entry committed and applied, the answer lost.
    fail::fail_point!("store::drop_reply", |_| {});
    match responder {
        Responder::None => {}
        Responder::Reply(tx) => {
            let _ = tx.send(reply.map_err(StoreError::Lock));
        }
        Responder::Done(tx) => {
            let _ = tx.send(Err(StoreError::Internal(
                "not a configuration change".into(),
            )));
        }
        Responder::Meta(tx) => {
            let _ = tx.send(Err(StoreError::Internal("not a placement command".into())));
        }
        Responder::Acquire { resource, tx } => match reply {
            Ok(Reply::Acquire(a)) => {
                // This attempt's caller is here: the acquire is nobody's orphan.
                peer.orphans.remove(&a.lease_id);
                if let AcquireStatus::Queued { .. } = a.status {
                    // Answered when a later apply grants or ends the wait.
                    // A retry replaces an earlier attempt's entry: only the
                    // latest attempt's caller can make the store cancel.
                    peer.waiting.insert(
                        a.lease_id,
                        Waiting {
                            resource,
                            attempt: a.attempt,
                            tx,
                            caller,
                        },
                    );
                } else {
                    // Only a grant made by this very apply can be known to
                    // nobody when its answer fails: a deduplicated answer
                    // repeats a grant whose earlier answer (the original's,
                    // or another retry's) may have been delivered, and this
                    // later apply took the latest attempt number, so its
                    // cancel would end a lease somebody was told it holds.
                    let fresh_grant =
                        matches!(a.status, AcquireStatus::Held { .. }) && !a.deduplicated;
                    let (lease_id, attempt) = (a.lease_id, a.attempt);
                    if tx.send(finish_acquire(peer.table.epoch(), a)).is_err() && fresh_grant {
                        // The caller left before it heard of the grant:
                        // nobody holds this lease. Cancel this attempt (a
                        // retry attached since is a later one and stays).
                        queue_cancel(peer, resource, lease_id, attempt, caller);
                    }
                }
            }
            Ok(other) => {
                let _ = tx.send(Err(StoreError::Internal(format!(
                    "unexpected reply {other:?}"
                ))));
            }
            Err(e) => {
                let _ = tx.send(Err(StoreError::Lock(e)));
            }
        },
    }
}

/// Answers the waiting RPC an event concerns, and (on the leader: `audit`
/// given) counts and audits it.
pub(crate) fn on_event(
    peer: &mut Peer,
    event: &Event,
    audit: Option<(&Caller, observe::At)>,
    obs: &mut observe::ApplyObs<'_>,
) {
    if let Some((caller, at)) = audit {
        let waiter = match event {
            Event::Granted { lease_id, .. }
            | Event::WaitEnded { lease_id, .. }
            | Event::WaitMoved { lease_id, .. } => {
                peer.waiting.get(lease_id).and_then(|w| w.caller.clone())
            }
            Event::LeaseEnded { .. } | Event::ValueChanged { .. } => None,
        };
        observe::event_applied(event, caller, waiter, at, obs);
    }
    match event {
        Event::Granted {
            resource,
            lease_id,
            token,
            expires_at_ms,
            lease_ttl_ms,
            ..
        } => {
            if let Some(w) = peer.waiting.remove(lease_id) {
                let told = w.tx.send(Ok(AcquireReply {
                    lease_id: *lease_id,
                    deduplicated: false,
                    status: AcquireStatus::Held {
                        token: *token,
                        expires_at_ms: *expires_at_ms,
                        lease_ttl_ms: *lease_ttl_ms,
                    },
                    attempt: w.attempt,
                }));
                if told.is_err() {
                    // The waiter's caller left just before its turn came:
                    // nobody holds the lease it was handed. Cancel it, as
                    // the waiter would have been (naming its attempt).
                    queue_cancel(peer, resource.clone(), *lease_id, w.attempt, w.caller);
                }
            }
        }
        Event::WaitEnded {
            lease_id, ended, ..
        } => {
            peer.orphans.remove(lease_id);
            if let Some(w) = peer.waiting.remove(lease_id) {
                let reply = AcquireReply {
                    lease_id: *lease_id,
                    deduplicated: false,
                    status: AcquireStatus::WaitEnded(*ended),
                    attempt: w.attempt,
                };
                let _ = w.tx.send(finish_acquire(peer.table.epoch(), reply));
            }
        }
        Event::WaitMoved { resource, lease_id } => {
            // The wait continues on the shard the resource moved to; the
            // caller's retry (same requestId) finds it there (and that
            // shard's leader cancels it if no retry comes).
            peer.orphans.remove(lease_id);
            if let Some(w) = peer.waiting.remove(lease_id) {
                let _ = w.tx.send(Err(StoreError::Lock(LockError::WrongShard {
                    slot: slot_of(resource),
                    epoch: peer.table.epoch(),
                })));
            }
        }
        Event::LeaseEnded { lease_id, .. } => {
            peer.orphans.remove(lease_id);
        }
        Event::ValueChanged { .. } => {}
    }
}

/// Queues the `Cancel` of `attempt` of `lease_id`, whose caller is gone.
/// The state machine ignores it if a later attempt (a retry by request id,
/// which may have been told of the grant) attached since.
pub(crate) fn queue_cancel(
    peer: &mut Peer,
    resource: ResourceName,
    lease_id: LeaseId,
    attempt: u32,
    caller: Caller,
) {
    peer.queued.push((
        Command::Cancel {
            resource,
            lease_id,
            attempt,
        },
        Responder::None,
        caller,
    ));
}

/// Ready leader: cancels the waiters whose callers are not connected here.
///
/// A waiting caller is registered with the leader that applied its acquire
/// (`Peer::waiting`); that leader cancels the waiter when the caller goes
/// away. Nobody is registered, though, for a waiter queued under an earlier
/// leader (its caller was answered `OUTCOME_UNKNOWN` or lost its
/// connection when leadership moved, and a cancel that leader had queued or
/// proposed may never have committed), for one that arrived with an import
/// (a migration moved it here), or for one whose cancel was lost. Its
/// caller, if it is still there, retries with the same request id, which
/// attaches a new attempt and registers it here. So a waiter found
/// unregistered, still at the same attempt, `grace` (the proposal timeout)
/// after it was first found is cancelled, naming that attempt; if it was
/// granted in the meantime, nobody was told, and the cancel ends the lease.
/// A retry that attached in between makes the cancel a no-op.
///
/// Also run (`force`) the moment a leader's `LeaderChanged` entry or an
/// import applies: every waiter there is then is found before any later
/// entry of this leader can grant it, so a waiter granted before the next
/// periodic look is still known to have no caller.
pub(crate) fn sweep_orphans(peer: &mut Peer, now: Instant, force: bool) {
    if !force && peer.next_orphan_scan.is_some_and(|at| now < at) {
        return;
    }
    let grace = peer.orphan_grace;
    peer.next_orphan_scan = Some(now + grace / ORPHAN_SCANS_PER_GRACE);
    let mut tracked = std::mem::take(&mut peer.orphans);
    let mut orphans = BTreeMap::new();
    for w in peer.table.queued_waiters() {
        if peer.waiting.contains_key(&w.lease_id) {
            continue;
        }
        let since = match tracked.remove(&w.lease_id) {
            Some(o) if o.attempt == w.attempt => o.since,
            _ => now,
        };
        orphans.insert(
            w.lease_id,
            Orphan {
                resource: w.resource.clone(),
                attempt: w.attempt,
                since,
            },
        );
    }
    // Tracked waiters that were granted since, with nobody here to tell.
    for (lease_id, o) in tracked {
        if peer
            .table
            .view(&o.resource)
            .is_some_and(|v| v.lease_id == lease_id)
        {
            orphans.insert(lease_id, o);
        }
    }
    let mut due = Vec::new();
    orphans.retain(|lease_id, o| {
        let keep = now.saturating_duration_since(o.since) < grace;
        if !keep {
            due.push((o.resource.clone(), *lease_id, o.attempt));
        }
        keep
    });
    peer.orphans = orphans;
    if !due.is_empty() {
        tracing::info!(
            shard_id = peer.shard_id,
            cancelled = due.len(),
            "cancelling acquires whose callers are not connected to this leader"
        );
    }
    for (resource, lease_id, attempt) in due {
        queue_cancel(peer, resource, lease_id, attempt, None);
    }
}

/// The final answer to an acquire: a wait that ended without a grant
/// (directly, or reported again to a retry) is an error, with the shard's
/// current epoch where the reason needs it.
pub(crate) fn finish_acquire(epoch: u64, reply: AcquireReply) -> AcquireResult {
    match reply.status {
        AcquireStatus::WaitEnded(WaitEnd::TimedOut) => Err(StoreError::WaitTimedOut),
        AcquireStatus::WaitEnded(WaitEnd::Cancelled) => Err(StoreError::WaitCancelled),
        AcquireStatus::WaitEnded(WaitEnd::TokenSpaceExhausted) => {
            Err(StoreError::Lock(LockError::TokenSpaceExhausted { epoch }))
        }
        _ => Ok(reply),
    }
}

pub(crate) fn serve_reads(peer: &mut Peer) {
    let ready: Vec<u64> = peer
        .reads
        .iter()
        .filter(|(_, r)| r.index.is_some_and(|i| i <= peer.applied_index))
        .map(|(id, _)| *id)
        .collect();
    for id in ready {
        if let Some(r) = peer.reads.remove(&id) {
            let epoch = peer.table.epoch();
            let reply = if peer.table.owns(&r.resource) {
                Ok(ReadReply {
                    view: peer.table.view(&r.resource),
                    epoch,
                })
            } else {
                Err(StoreError::Lock(LockError::WrongShard {
                    slot: slot_of(&r.resource),
                    epoch,
                }))
            };
            let _ = r.tx.send(reply);
        }
    }
}

pub(crate) fn respond_err(responder: Responder, err: StoreError) {
    match responder {
        Responder::None => {}
        Responder::Reply(tx) => {
            let _ = tx.send(Err(err));
        }
        Responder::Acquire { tx, .. } => {
            let _ = tx.send(Err(err));
        }
        Responder::Done(tx) => {
            let _ = tx.send(Err(err));
        }
        Responder::Meta(tx) => {
            let _ = tx.send(Err(err));
        }
    }
}

pub(crate) fn u64_from_ctx(ctx: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(ctx.try_into().ok()?))
}
