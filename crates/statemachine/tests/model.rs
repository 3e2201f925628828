//! Model-based test of the lock state machine.
//!
//! Long random command sequences (duplicated acquires, reordered and stale
//! lease ids, out-of-range parameters, clock going back, leader changes,
//! stale terms and epochs, and every acquire mode: exclusive, shared and
//! semaphores, valid and invalid permit counts, kinds mixed on one
//! resource) are applied both to the real `LockTable` and to a small
//! reference model written from the contract, for clarity, not speed. After
//! every step:
//!
//! * the reply and the events equal the model's, and so does `view()`;
//! * properties checked on the observed outputs alone, so that a bug shared
//!   by model and table still fails: a lock never has an exclusive holder
//!   beside another holder, a semaphore never more than its permits, all
//!   holders and waiters of a resource are of one kind, tokens strictly
//!   increasing per resource, only a current holding's lease renews or
//!   releases, dedup returns the first outcome, grants from the queue follow
//!   FIFO order and no direct grant passes a waiter, and no waiter that
//!   fits is left at the head of a queue;
//! * the snapshot round-trips to an equal table and identical bytes.
//!
//! At the end a second table replays the log and must be byte-identical.

use std::collections::{BTreeMap, VecDeque};

use fencelock_statemachine::limits::MAX_HOLDERS_PER_RESOURCE;
use fencelock_statemachine::token::{FencingToken, POSITION_BITS};
use fencelock_statemachine::*;
use proptest::prelude::*;

const RESOURCES: [&str; 4] = ["acme/a", "acme/b", "acme/c", "zeta/a"];

fn limits() -> Limits {
    Limits {
        min_lease_ttl_ms: 1_000,
        max_lease_ttl_ms: 40_000,
        max_wait_timeout_ms: 30_000,
        max_hold_ms: 60_000,
        max_waiters_per_resource: 3,
        max_waiters_per_tenant: 4,
        // Above what the dedup table lets live at once (every holding has
        // a dedup entry): the model has no per-tenant hold quota
        // (tests/scenarios.rs covers it).
        max_held_per_tenant: 1_000,
        dedup_retention_ms: 20_000,
        max_dedup_entries: 14,
        max_records: 3,
        max_retired_per_tick: 1_000,
    }
}

/// The contract's rule of what fits beside the current holders (given by
/// their modes, all of the acquire's kind): `Exclusive` beside nobody,
/// `Shared` beside shared holders only and while fewer than
/// `MAX_HOLDERS_PER_RESOURCE` hold, a semaphore's acquire while fewer than
/// its permits hold.
fn fits(mode: AcquireMode, holders: &[AcquireMode]) -> bool {
    match mode {
        AcquireMode::Exclusive => holders.is_empty(),
        AcquireMode::Shared => {
            holders.iter().all(|m| *m == AcquireMode::Shared)
                && holders.len() < MAX_HOLDERS_PER_RESOURCE as usize
        }
        AcquireMode::Semaphore { permits } => holders.len() < permits as usize,
    }
}

/// A resource's kind: 0 for a lock (exclusive or shared), else the
/// semaphore's permit count.
fn kind(mode: AcquireMode) -> u32 {
    match mode {
        AcquireMode::Exclusive | AcquireMode::Shared => 0,
        AcquireMode::Semaphore { permits } => permits,
    }
}

// ---------------------------------------------------------------- the model

#[derive(Clone, Debug)]
struct MHolder {
    lease: LeaseId,
    req: RequestId,
    token: FencingToken,
    granted: u64,
    ttl: u64,
    stamped: u64,
    expires: u64,
    attempt: u32,
    /// What the holder publishes (`Get`); empty: nothing.
    value: Vec<u8>,
    mode: AcquireMode,
}

#[derive(Clone, Debug)]
struct MWaiter {
    lease: LeaseId,
    req: RequestId,
    ttl: u64,
    deadline: u64,
    attempt: u32,
    value: Vec<u8>,
    mode: AcquireMode,
}

/// One resource's record: its holdings in grant order (tokens rising) and
/// its queue. Deleted when both are empty.
#[derive(Clone, Debug, Default)]
struct MRecord {
    holders: Vec<MHolder>,
    queue: VecDeque<MWaiter>,
    /// The highest token granted since the record was created (`Get`'s
    /// last token: a newer shared holder may leave before an older one).
    last_token: FencingToken,
}

impl MRecord {
    fn modes(&self) -> Vec<AcquireMode> {
        self.holders.iter().map(|h| h.mode).collect()
    }

    /// The record's kind (fixed while it exists).
    fn kind(&self) -> u32 {
        let first = self
            .holders
            .first()
            .map(|h| h.mode)
            .or(self.queue.front().map(|w| w.mode))
            .expect("a record has a holder or a waiter");
        kind(first)
    }
}

#[derive(Clone, Copy, Debug)]
enum MDedup {
    Waiting,
    Held(FencingToken),
    Ended(FencingToken, LeaseEnd, u64),
    WaitEnded(WaitEnd, u64),
}

struct Model {
    l: Limits,
    epoch: u64,
    base: u64,
    last_pos: u64,
    term: u64,
    index: u64,
    clock: u64,
    held: BTreeMap<ResourceName, MRecord>,
    dedup: BTreeMap<(ResourceName, RequestId), (LeaseId, u64, MDedup)>,
}

impl Model {
    fn new(l: Limits) -> Model {
        Model {
            l,
            epoch: 0,
            base: 0,
            last_pos: 0,
            term: 0,
            index: 0,
            clock: 0,
            held: BTreeMap::new(),
            dedup: BTreeMap::new(),
        }
    }

    fn mint(&mut self, limit: u64) -> Option<FencingToken> {
        let pos = (self.last_pos + 1).max(self.index - self.base);
        if pos > limit {
            return None;
        }
        self.last_pos = pos;
        Some(FencingToken::new(self.epoch, pos))
    }

    /// What `LockTable::view` must show: the oldest holding on top, every
    /// holding oldest first.
    fn view(&self, r: &ResourceName) -> Option<LockView> {
        let rec = self.held.get(r)?;
        let holders: Vec<HolderView> = rec
            .holders
            .iter()
            .map(|h| HolderView {
                lease_id: h.lease,
                token: h.token,
                expires_at_ms: h.expires,
                granted_at_ms: h.granted,
                value: HolderValue::new(h.value.clone()).unwrap(),
                mode: h.mode,
            })
            .collect();
        let first = holders.first()?.clone();
        Some(LockView {
            lease_id: first.lease_id,
            token: first.token,
            expires_at_ms: first.expires_at_ms,
            granted_at_ms: first.granted_at_ms,
            queue_len: rec.queue.len() as u32,
            value: first.value,
            mode: first.mode,
            last_token: rec.last_token,
            holders,
        })
    }

    fn apply(&mut self, c: &Command, ctx: &ApplyContext) -> Outcome {
        let mut ev = Vec::new();
        let reply = self.apply_inner(c, ctx, &mut ev);
        Outcome { reply, events: ev }
    }

    fn apply_inner(
        &mut self,
        c: &Command,
        ctx: &ApplyContext,
        ev: &mut Vec<Event>,
    ) -> Result<Reply, LockError> {
        if ctx.index == 0 || ctx.index < self.index {
            return Err(LockError::InvalidCommand {
                reason: "log index is zero or went backwards",
            });
        }
        if ctx.epoch == 0 || ctx.epoch >= 1 << 23 {
            return Err(LockError::InvalidCommand {
                reason: "epoch out of range",
            });
        }
        if ctx.epoch < self.epoch {
            return Err(LockError::StaleEpoch {
                entry_epoch: ctx.epoch,
                current_epoch: self.epoch,
            });
        }
        if ctx.epoch > self.epoch {
            self.epoch = ctx.epoch;
            self.base = ctx.index - 1;
            self.last_pos = 0;
        }
        self.index = ctx.index;
        self.clock = self.clock.max(ctx.now_ms);
        if let Command::LeaderChanged {
            clock_offset_allowance_ms: a,
        } = c
        {
            if *a > 60_000 {
                return Err(LockError::InvalidCommand {
                    reason: "clock offset allowance too large",
                });
            }
            if ctx.term < self.term {
                return Err(LockError::InvalidCommand {
                    reason: "leader changed to an older term",
                });
            }
            self.term = ctx.term;
            let mut n = 0;
            for rec in self.held.values_mut() {
                for h in &mut rec.holders {
                    if h.stamped + a > h.expires {
                        h.expires = h.stamped + a;
                        n += 1;
                    }
                }
            }
            return Ok(Reply::LeaderChanged { leases_extended: n });
        }
        if ctx.term != self.term {
            return Err(LockError::LeaderNotReady {
                entry_term: ctx.term,
                leader_term: self.term,
            });
        }
        match c {
            Command::Acquire {
                resource,
                request_id,
                lease_id,
                lease_ttl_ms,
                wait_timeout_ms,
                value,
                mode,
                ..
            } => self
                .acquire(
                    resource,
                    request_id,
                    *lease_id,
                    (*lease_ttl_ms, *wait_timeout_ms),
                    (value.as_bytes(), *mode),
                    ev,
                )
                .map(Reply::Acquire),
            // The contract: only a lease that holds the resource now
            // replaces what it publishes; its token stays, and the other
            // holders are untouched.
            Command::Proclaim {
                resource,
                lease_id,
                value,
                ..
            } => {
                self.settle(resource, ev);
                let holder = self
                    .held
                    .get_mut(resource)
                    .and_then(|rec| rec.holders.iter_mut().find(|h| h.lease == *lease_id));
                match holder {
                    Some(h) => {
                        h.value = value.as_bytes().to_vec();
                        ev.push(Event::ValueChanged {
                            resource: resource.clone(),
                            lease_id: *lease_id,
                            token: h.token,
                        });
                        Ok(Reply::Proclaimed { token: h.token })
                    }
                    None => Err(LockError::LeaseNotHeld),
                }
            }
            Command::Renew {
                resource,
                lease_id,
                lease_ttl_ms,
                ..
            } => self
                .renew(resource, *lease_id, *lease_ttl_ms, ev)
                .map(Reply::Renewed),
            Command::RenewBatch { items, .. } => {
                if items.len() > 1024 {
                    return Err(LockError::BatchTooLarge {
                        len: items.len(),
                        max: 1024,
                    });
                }
                Ok(Reply::RenewedBatch(
                    items
                        .iter()
                        .map(|i| self.renew(&i.resource, i.lease_id, i.lease_ttl_ms, ev))
                        .collect(),
                ))
            }
            Command::Release {
                resource, lease_id, ..
            } => Ok(Reply::Released {
                released: self.end(resource, *lease_id, LeaseEnd::Released, ev),
            }),
            Command::Cancel {
                resource,
                lease_id,
                attempt,
            } => {
                // Only the latest attempt attached to the lease cancels it.
                self.settle(resource, ev);
                let latest = self.held.get(resource).and_then(|rec| {
                    rec.holders
                        .iter()
                        .find(|h| h.lease == *lease_id)
                        .map(|h| h.attempt)
                        .or_else(|| {
                            rec.queue
                                .iter()
                                .find(|w| w.lease == *lease_id)
                                .map(|w| w.attempt)
                        })
                });
                let removed = latest == Some(*attempt)
                    && self.end(resource, *lease_id, LeaseEnd::Cancelled, ev);
                Ok(Reply::Cancelled { removed })
            }
            Command::Tick => Ok(Reply::Ticked(self.tick(ev))),
            Command::LeaderChanged { .. } => unreachable!(),
            // Resharding moves state between tables; the single-table model
            // never generates it (tests/migration.rs covers it).
            Command::ExportSlots { .. }
            | Command::ImportSlots { .. }
            | Command::DropExport { .. }
            | Command::CloseMigration { .. } => unreachable!(),
        }
    }

    fn check_ttl(&self, ttl: u64) -> Result<(), LockError> {
        if ttl < self.l.min_lease_ttl_ms || ttl > self.l.max_lease_ttl_ms {
            return Err(LockError::TtlOutOfRange {
                ttl_ms: ttl,
                min_ms: self.l.min_lease_ttl_ms,
                max_ms: self.l.max_lease_ttl_ms,
            });
        }
        Ok(())
    }

    fn set_end(&mut self, r: &ResourceName, req: &RequestId, state: MDedup) {
        self.dedup.get_mut(&(r.clone(), req.clone())).unwrap().2 = state;
    }

    /// Settling: every holder whose lease is due ends as expired (in grant
    /// order), then the queue is granted once.
    fn settle(&mut self, r: &ResourceName, ev: &mut Vec<Event>) {
        let now = self.clock;
        let Some(rec) = self.held.get_mut(r) else {
            return;
        };
        if !rec.holders.iter().any(|h| h.expires <= now) {
            return;
        }
        let (due, live): (Vec<MHolder>, Vec<MHolder>) = std::mem::take(&mut rec.holders)
            .into_iter()
            .partition(|h| h.expires <= now);
        rec.holders = live;
        for h in due {
            self.ended_holder(r, h, LeaseEnd::Expired, ev);
        }
        self.grant_queue(r, ev);
    }

    /// Records and reports the end of a holding already taken out of its
    /// record.
    fn ended_holder(&mut self, r: &ResourceName, h: MHolder, how: LeaseEnd, ev: &mut Vec<Event>) {
        let forget = self.clock + self.l.dedup_retention_ms;
        self.set_end(r, &h.req, MDedup::Ended(h.token, how, forget));
        ev.push(Event::LeaseEnded {
            resource: r.clone(),
            lease_id: h.lease,
            token: h.token,
            ended: how,
        });
    }

    /// Grants the queue from its head for as long as the head fits beside
    /// the holders (a head that fits but whose wait is over ends as timed
    /// out instead, and the loop goes on; a head that does not fit stops
    /// it, over or not: `Tick` times it out); deletes the record if it is
    /// left empty.
    fn grant_queue(&mut self, r: &ResourceName, ev: &mut Vec<Event>) {
        let now = self.clock;
        let forget = now + self.l.dedup_retention_ms;
        loop {
            let rec = self.held.get_mut(r).unwrap();
            let Some(head) = rec.queue.front() else {
                break;
            };
            if !fits(head.mode, &rec.modes()) {
                break;
            }
            let w = rec.queue.pop_front().unwrap();
            let ended = if w.deadline <= now {
                WaitEnd::TimedOut
            } else if let Some(token) = self.mint((1 << 40) - 1) {
                let expires = now + w.ttl;
                self.set_end(r, &w.req, MDedup::Held(token));
                ev.push(Event::Granted {
                    resource: r.clone(),
                    lease_id: w.lease,
                    request_id: w.req.clone(),
                    token,
                    expires_at_ms: expires,
                    lease_ttl_ms: w.ttl,
                    from_queue: true,
                });
                let rec = self.held.get_mut(r).unwrap();
                rec.last_token = token;
                rec.holders.push(MHolder {
                    lease: w.lease,
                    req: w.req,
                    token,
                    granted: now,
                    ttl: w.ttl,
                    stamped: expires,
                    expires,
                    attempt: w.attempt,
                    value: w.value,
                    mode: w.mode,
                });
                continue;
            } else {
                WaitEnd::TokenSpaceExhausted
            };
            self.set_end(r, &w.req, MDedup::WaitEnded(ended, forget));
            ev.push(Event::WaitEnded {
                resource: r.clone(),
                lease_id: w.lease,
                request_id: w.req,
                ended,
            });
        }
        self.drop_if_empty(r);
    }

    fn drop_if_empty(&mut self, r: &ResourceName) {
        if self
            .held
            .get(r)
            .is_some_and(|rec| rec.holders.is_empty() && rec.queue.is_empty())
        {
            self.held.remove(r);
        }
    }

    fn tenant_waiters(&self, tenant: &str) -> u32 {
        self.held
            .iter()
            .filter(|(r, _)| r.tenant() == tenant)
            .map(|(_, rec)| rec.queue.len() as u32)
            .sum()
    }

    fn acquire(
        &mut self,
        r: &ResourceName,
        req: &RequestId,
        lease: LeaseId,
        (ttl, wait): (u64, u64),
        (value, mode): (&[u8], AcquireMode),
        ev: &mut Vec<Event>,
    ) -> Result<AcquireReply, LockError> {
        self.check_ttl(ttl)?;
        if wait > self.l.max_wait_timeout_ms {
            return Err(LockError::WaitTimeoutOutOfRange {
                wait_timeout_ms: wait,
                max_ms: self.l.max_wait_timeout_ms,
            });
        }
        if let AcquireMode::Semaphore { permits } = mode {
            if permits == 0 || permits > MAX_HOLDERS_PER_RESOURCE {
                return Err(LockError::InvalidPermits {
                    permits,
                    max: MAX_HOLDERS_PER_RESOURCE,
                });
            }
        }
        self.settle(r, ev);
        if let Some(&(orig_lease, orig_ttl, state)) = self.dedup.get(&(r.clone(), req.clone())) {
            if orig_ttl != ttl {
                return Err(LockError::RequestIdReused {
                    original_ttl_ms: orig_ttl,
                });
            }
            // A retry of a live acquire attaches as its next attempt,
            // whatever mode it names.
            let (status, attempt) = match state {
                MDedup::Waiting => {
                    let q = &mut self.held.get_mut(r).unwrap().queue;
                    let i = q.iter().position(|w| w.lease == orig_lease).unwrap();
                    q[i].attempt += 1;
                    let status = AcquireStatus::Queued {
                        position: i as u32 + 1,
                        wait_deadline_ms: q[i].deadline,
                    };
                    (status, q[i].attempt)
                }
                MDedup::Held(token) => {
                    let now = self.clock;
                    let h = self
                        .held
                        .get_mut(r)
                        .unwrap()
                        .holders
                        .iter_mut()
                        .find(|h| h.lease == orig_lease)
                        .unwrap();
                    h.attempt += 1;
                    // The retry's sender may count only on what is left
                    // of the lease's stamped time.
                    let status = AcquireStatus::Held {
                        token,
                        expires_at_ms: h.expires,
                        lease_ttl_ms: h.stamped.saturating_sub(now),
                    };
                    (status, h.attempt)
                }
                MDedup::Ended(token, ended, _) => (AcquireStatus::Ended { token, ended }, 0),
                MDedup::WaitEnded(e, _) => (AcquireStatus::WaitEnded(e), 0),
            };
            return Ok(AcquireReply {
                lease_id: orig_lease,
                deduplicated: true,
                status,
                attempt,
            });
        }
        if self.dedup.len() >= self.l.max_dedup_entries as usize {
            return Err(LockError::DedupTableFull {
                limit: self.l.max_dedup_entries,
            });
        }
        let now = self.clock;
        let grant_now = match self.held.get(r) {
            None => {
                if self.held.len() >= self.l.max_records as usize {
                    return Err(LockError::TableFull {
                        limit: self.l.max_records,
                    });
                }
                true
            }
            Some(rec) => {
                if rec.kind() != kind(mode) {
                    return Err(LockError::ModeMismatch {
                        permits: rec.kind(),
                    });
                }
                if rec.holders.iter().any(|h| h.lease == lease)
                    || rec.queue.iter().any(|w| w.lease == lease)
                {
                    return Err(LockError::LeaseIdCollision);
                }
                // FIFO across modes: nobody is granted past a waiter.
                rec.queue.is_empty() && fits(mode, &rec.modes())
            }
        };
        let status = if grant_now {
            let token = self
                .mint(token::POSITION_SOFT_LIMIT)
                .ok_or(LockError::TokenSpaceExhausted { epoch: self.epoch })?;
            let expires = now + ttl;
            let rec = self.held.entry(r.clone()).or_default();
            rec.last_token = token;
            rec.holders.push(MHolder {
                lease,
                req: req.clone(),
                token,
                granted: now,
                ttl,
                stamped: expires,
                expires,
                attempt: FIRST_ATTEMPT,
                value: value.to_vec(),
                mode,
            });
            self.dedup
                .insert((r.clone(), req.clone()), (lease, ttl, MDedup::Held(token)));
            ev.push(Event::Granted {
                resource: r.clone(),
                lease_id: lease,
                request_id: req.clone(),
                token,
                expires_at_ms: expires,
                lease_ttl_ms: ttl,
                from_queue: false,
            });
            AcquireStatus::Held {
                token,
                expires_at_ms: expires,
                lease_ttl_ms: ttl,
            }
        } else {
            let rec = &self.held[r];
            if wait == 0 {
                // An exclusive acquire waits for the last holder to leave,
                // a shared or semaphore one for the first.
                let expiries = rec.holders.iter().map(|h| h.expires);
                let holder_expires_at_ms = match mode {
                    AcquireMode::Exclusive => expiries.max(),
                    _ => expiries.min(),
                }
                .expect("a record with waiters has holders");
                return Err(LockError::LockHeld {
                    holder_expires_at_ms,
                    queue_len: rec.queue.len() as u32,
                });
            }
            if rec.queue.len() as u32 >= self.l.max_waiters_per_resource {
                return Err(LockError::QueueFull {
                    limit: self.l.max_waiters_per_resource,
                });
            }
            if self.tenant_waiters(r.tenant()) >= self.l.max_waiters_per_tenant {
                return Err(LockError::TenantWaitersExceeded {
                    limit: self.l.max_waiters_per_tenant,
                });
            }
            let deadline = now + wait;
            let q = &mut self.held.get_mut(r).unwrap().queue;
            q.push_back(MWaiter {
                lease,
                req: req.clone(),
                ttl,
                deadline,
                attempt: FIRST_ATTEMPT,
                value: value.to_vec(),
                mode,
            });
            let position = q.len() as u32;
            self.dedup
                .insert((r.clone(), req.clone()), (lease, ttl, MDedup::Waiting));
            AcquireStatus::Queued {
                position,
                wait_deadline_ms: deadline,
            }
        };
        Ok(AcquireReply {
            lease_id: lease,
            deduplicated: false,
            status,
            attempt: FIRST_ATTEMPT,
        })
    }

    fn renew(
        &mut self,
        r: &ResourceName,
        lease: LeaseId,
        ttl: u64,
        ev: &mut Vec<Event>,
    ) -> Result<Renewed, LockError> {
        self.settle(r, ev);
        let now = self.clock;
        let max_hold = self.l.max_hold_ms;
        let Some(h) = self
            .held
            .get(r)
            .and_then(|rec| rec.holders.iter().find(|h| h.lease == lease))
        else {
            return Err(LockError::LeaseNotHeld);
        };
        let ttl = if ttl == 0 { h.ttl } else { ttl };
        self.check_ttl(ttl)?;
        if now >= h.granted + max_hold {
            return Err(LockError::HoldLimitReached {
                max_hold_ms: max_hold,
                granted_at_ms: h.granted,
            });
        }
        let h = self
            .held
            .get_mut(r)
            .unwrap()
            .holders
            .iter_mut()
            .find(|h| h.lease == lease)
            .unwrap();
        let want = (now + ttl).min(h.granted + max_hold);
        h.expires = h.expires.max(want);
        h.stamped = h.stamped.max(want);
        h.ttl = ttl;
        // The contract: the holder may work until its send time plus the
        // answered TTL, and the lease lasts until its stamp, so the answer is
        // the time to the stamp (less than the asked TTL at the hold cap).
        Ok(Renewed {
            expires_at_ms: h.expires,
            lease_ttl_ms: h.stamped - now,
        })
    }

    /// Ends the holding or the wait of `lease` on `r` (other holders are
    /// untouched), then grants the queue if a holder or the head waiter
    /// left.
    fn end(
        &mut self,
        r: &ResourceName,
        lease: LeaseId,
        how: LeaseEnd,
        ev: &mut Vec<Event>,
    ) -> bool {
        self.settle(r, ev);
        let Some(rec) = self.held.get_mut(r) else {
            return false;
        };
        if let Some(i) = rec.holders.iter().position(|h| h.lease == lease) {
            let h = rec.holders.remove(i);
            self.ended_holder(r, h, how, ev);
            self.grant_queue(r, ev);
            return true;
        }
        if let Some(i) = rec.queue.iter().position(|w| w.lease == lease) {
            let w = rec.queue.remove(i).unwrap();
            let forget = self.clock + self.l.dedup_retention_ms;
            self.set_end(r, &w.req, MDedup::WaitEnded(WaitEnd::Cancelled, forget));
            ev.push(Event::WaitEnded {
                resource: r.clone(),
                lease_id: w.lease,
                request_id: w.req,
                ended: WaitEnd::Cancelled,
            });
            if i == 0 {
                self.grant_queue(r, ev);
            }
            self.drop_if_empty(r);
            return true;
        }
        false
    }

    fn tick(&mut self, ev: &mut Vec<Event>) -> TickReport {
        let now = self.clock;
        let mut rep = TickReport::default();
        // Leases first, by (expiry, resource, lease id), each followed by
        // its resource's queue grants; then waiters by deadline; then dedup.
        let mut due: Vec<(u64, ResourceName, LeaseId)> = self
            .held
            .iter()
            .flat_map(|(r, rec)| {
                rec.holders
                    .iter()
                    .filter(|h| h.expires <= now)
                    .map(move |h| (h.expires, r.clone(), h.lease))
            })
            .collect();
        due.sort();
        for (_, r, lease) in due {
            let rec = self.held.get_mut(&r).unwrap();
            let i = rec.holders.iter().position(|h| h.lease == lease).unwrap();
            let h = rec.holders.remove(i);
            self.ended_holder(&r, h, LeaseEnd::Expired, ev);
            rep.leases_expired += 1;
            self.grant_queue(&r, ev);
        }
        let mut waits: Vec<(u64, ResourceName, LeaseId)> = self
            .held
            .iter()
            .flat_map(|(r, rec)| {
                rec.queue
                    .iter()
                    .filter(|w| w.deadline <= now)
                    .map(move |w| (w.deadline, r.clone(), w.lease))
            })
            .collect();
        waits.sort();
        for (_, r, lease) in waits {
            // An earlier removal's grants may have ended it already.
            let Some(i) = self
                .held
                .get(&r)
                .and_then(|rec| rec.queue.iter().position(|w| w.lease == lease))
            else {
                continue;
            };
            let w = self.held.get_mut(&r).unwrap().queue.remove(i).unwrap();
            self.set_end(
                &r,
                &w.req,
                MDedup::WaitEnded(WaitEnd::TimedOut, now + self.l.dedup_retention_ms),
            );
            ev.push(Event::WaitEnded {
                resource: r.clone(),
                lease_id: w.lease,
                request_id: w.req,
                ended: WaitEnd::TimedOut,
            });
            rep.waiters_timed_out += 1;
            if i == 0 {
                self.grant_queue(&r, ev);
            }
            self.drop_if_empty(&r);
        }
        let before = self.dedup.len();
        self.dedup.retain(|_, (_, _, s)| match s {
            MDedup::Ended(_, _, at) | MDedup::WaitEnded(_, at) => *at > now,
            _ => true,
        });
        rep.dedup_forgotten = (before - self.dedup.len()) as u32;
        rep
    }
}

// ------------------------------------------------------- random command ops

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        res: usize,
        req: u8,
        lease: u8,
        ttl: usize,
        wait: usize,
        /// Index into `VALUES` (0: none).
        value: usize,
        mode: AcquireMode,
    },
    /// Retries an earlier acquire verbatim, or naming another mode.
    Retry {
        pick: usize,
        mode: Option<AcquireMode>,
    },
    Renew {
        res: usize,
        pick: usize,
        ttl: usize,
    },
    RenewBatch {
        picks: Vec<(usize, usize)>,
    },
    Release {
        res: usize,
        pick: usize,
    },
    Cancel {
        res: usize,
        pick: usize,
        attempt: u32,
    },
    Proclaim {
        res: usize,
        pick: usize,
        value: usize,
    },
    Tick,
    LeaderChanged {
        allowance: usize,
        new_term: bool,
    },
    /// A command from a leader whose LeaderChanged has not been applied.
    NotReady {
        res: usize,
    },
    /// Move to a new epoch (placement handed one out), or replay an old one.
    EpochBump,
    StaleEpoch {
        res: usize,
    },
}

const TTLS: [u64; 5] = [1_000, 5_000, 30_000, 0, 45_000];
const WAITS: [u64; 5] = [0, 2_000, 10_000, 25_000, 31_000];
const ALLOWANCES: [u64; 4] = [0, 500, 2_000, 61_000];
/// Holder values: none, small ones, and one at the size limit.
fn values() -> [Vec<u8>; 4] {
    [
        Vec::new(),
        b"10.0.0.1:7000".to_vec(),
        vec![0xff, 0, 7],
        vec![b'v'; limits::MAX_HOLDER_VALUE_BYTES],
    ]
}

/// Every valid mode the ops use, and the two invalid permit counts.
const MODES: [AcquireMode; 7] = [
    AcquireMode::Exclusive,
    AcquireMode::Shared,
    AcquireMode::Semaphore { permits: 1 },
    AcquireMode::Semaphore { permits: 2 },
    AcquireMode::Semaphore { permits: 3 },
    AcquireMode::Semaphore { permits: 0 },
    AcquireMode::Semaphore {
        permits: MAX_HOLDERS_PER_RESOURCE + 1,
    },
];

/// An acquire's mode from a roll in 0..100. Each resource mostly sees one
/// kind, so that shared hand-offs, full semaphores and mixed queues build
/// up: `acme/a` exclusive (as before modes), `acme/b` a lock taken shared
/// and exclusive, `acme/c` a semaphore of 2, `zeta/a` mostly exclusive,
/// sometimes a semaphore of 1 or 3 (kinds clash there, and change as its
/// record ends). Some rolls take any mode, a few an invalid permit count.
fn mode_of(res: usize, roll: u8) -> AcquireMode {
    use AcquireMode::*;
    match roll {
        0..=2 => MODES[5],
        3..=5 => MODES[6],
        6..=20 => [MODES[0], MODES[0], MODES[1], MODES[2], MODES[3], MODES[4]][roll as usize % 6],
        _ => match res {
            0 => Exclusive,
            1 if roll % 5 < 3 => Shared,
            1 => Exclusive,
            2 => Semaphore { permits: 2 },
            _ => [
                Exclusive,
                Exclusive,
                Exclusive,
                Exclusive,
                Exclusive,
                Exclusive,
                Semaphore { permits: 3 },
                Semaphore { permits: 1 },
            ][roll as usize % 8],
        },
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4usize, 0..6u8, 0..40u8, 0..5usize, 0..5usize, prop_oneof![2 => Just(0usize), 1 => 1..4usize], 0..100u8).prop_map(|(res, req, lease, ttl, wait, value, roll)| Op::Acquire { res, req, lease, ttl, wait, value, mode: mode_of(res, roll) }),
        2 => (0..4usize, any::<usize>(), 0..4usize).prop_map(|(res, pick, value)| Op::Proclaim { res, pick, value }),
        2 => (any::<usize>(), prop_oneof![3 => Just(None), 1 => (0..MODES.len()).prop_map(|i| Some(MODES[i]))]).prop_map(|(pick, mode)| Op::Retry { pick, mode }),
        3 => (0..4usize, any::<usize>(), 0..5usize).prop_map(|(res, pick, ttl)| Op::Renew { res, pick, ttl }),
        1 => prop::collection::vec((0..4usize, any::<usize>()), 0..4).prop_map(|picks| Op::RenewBatch { picks }),
        3 => (0..4usize, any::<usize>()).prop_map(|(res, pick)| Op::Release { res, pick }),
        2 => (0..4usize, any::<usize>(), 1..4u32).prop_map(|(res, pick, attempt)| Op::Cancel { res, pick, attempt }),
        2 => Just(Op::Tick),
        1 => (0..4usize, any::<bool>()).prop_map(|(allowance, new_term)| Op::LeaderChanged { allowance, new_term }),
        1 => (0..4usize).prop_map(|res| Op::NotReady { res }),
        1 => Just(Op::EpochBump),
        1 => (0..4usize).prop_map(|res| Op::StaleEpoch { res }),
    ]
}

/// One step: the op, how far time moves (may go back), and whether the
/// command shares the previous entry's log index (coalesced proposals).
fn step() -> impl Strategy<Value = (Op, i64, bool)> {
    prop_oneof![
        9 => (op(), -3_000i64..9_000, prop::bool::weighted(0.15)),
        2 => (crowd(), 0i64..1_000, prop::bool::weighted(0.15)),
    ]
}

/// Valid acquires crowding the shared lock and the semaphore, close
/// together in time, so that their queues fill: shared hand-offs, exclusive
/// waiters between shared ones, semaphores granting as permits free up.
fn crowd() -> impl Strategy<Value = Op> {
    (
        prop_oneof![2 => Just(1usize), 1 => Just(2usize)],
        0..6u8,
        0..40u8,
        1..3usize,
        2..4usize,
        prop_oneof![2 => Just(0usize), 1 => 1..4usize],
        0..100u8,
    )
        .prop_map(|(res, req, lease, ttl, wait, value, roll)| Op::Acquire {
            res,
            req,
            lease,
            ttl,
            wait,
            value,
            mode: mode_of(res, roll),
        })
}

// ------------------------------------------------ properties on outputs only

/// What an observer of replies and events alone knows.
#[derive(Default)]
struct Observer {
    /// The shard's clock (the highest leader stamp applied so far).
    clock_ms: u64,
    /// Per holding, until when a reply or grant told its holder it may work
    /// (clock at the answer + the TTL answered): the holder's stop-by can be
    /// no later, since it sent the request before the apply.
    promised_until: BTreeMap<(ResourceName, LeaseId), u64>,
    /// Per resource, its holdings in grant order: lease, mode, token.
    holders: BTreeMap<ResourceName, Vec<(LeaseId, AcquireMode, FencingToken)>>,
    highest_token: BTreeMap<ResourceName, FencingToken>,
    /// Per resource, its waiters in queue order, with their modes.
    queue: BTreeMap<ResourceName, Vec<(LeaseId, AcquireMode)>>,
    first_outcome: BTreeMap<(ResourceName, RequestId), (LeaseId, Option<FencingToken>)>,
}

impl Observer {
    /// A reply or grant told the holder of `lease_id` that it may work for
    /// `ttl_ms` more.
    fn promise(&mut self, resource: &ResourceName, lease_id: LeaseId, ttl_ms: u64) {
        let until = self.clock_ms + ttl_ms;
        let entry = self
            .promised_until
            .entry((resource.clone(), lease_id))
            .or_insert(until);
        *entry = (*entry).max(until);
    }

    fn holds(&self, resource: &ResourceName, lease_id: &LeaseId) -> bool {
        self.holders
            .get(resource)
            .is_some_and(|hs| hs.iter().any(|h| h.0 == *lease_id))
    }

    fn holder_modes(&self, resource: &ResourceName) -> Vec<AcquireMode> {
        self.holders
            .get(resource)
            .map(|hs| hs.iter().map(|h| h.1).collect())
            .unwrap_or_default()
    }

    /// The kind the resource is in use as, if it has holders or waiters.
    fn kind_of(&self, resource: &ResourceName) -> Option<u32> {
        let holder = self.holders.get(resource).and_then(|hs| hs.first());
        let waiter = self.queue.get(resource).and_then(|q| q.first());
        holder.map(|h| h.1).or(waiter.map(|w| w.1)).map(kind)
    }

    fn queue_len(&self, resource: &ResourceName) -> usize {
        self.queue.get(resource).map_or(0, Vec::len)
    }

    fn check(&mut self, cmd: &Command, out: &Outcome, clock_ms: u64) -> Result<(), TestCaseError> {
        self.clock_ms = clock_ms;
        for e in &out.events {
            match e {
                Event::Granted {
                    resource,
                    lease_id,
                    token,
                    from_queue,
                    lease_ttl_ms,
                    ..
                } => {
                    self.promise(resource, *lease_id, *lease_ttl_ms);
                    // Tokens strictly rise per resource, across all grants.
                    let prev = self
                        .highest_token
                        .get(resource)
                        .copied()
                        .unwrap_or(FencingToken::NONE);
                    prop_assert!(
                        *token > prev,
                        "token {} not above {} on {}",
                        token,
                        prev,
                        resource
                    );
                    self.highest_token.insert(resource.clone(), *token);
                    let kind_before = self.kind_of(resource);
                    let mode = if *from_queue {
                        // FIFO: the head of the queue (after removals) wins.
                        let q = self.queue.entry(resource.clone()).or_default();
                        prop_assert_eq!(
                            q.first().map(|w| w.0),
                            Some(*lease_id),
                            "grant out of FIFO order"
                        );
                        q.remove(0).1
                    } else {
                        // A direct grant answers the acquire being applied,
                        // and never passes a waiter.
                        let mode = match cmd {
                            Command::Acquire {
                                resource: r,
                                lease_id: l,
                                mode,
                                ..
                            } if r == resource && l == lease_id => *mode,
                            _ => {
                                return Err(TestCaseError::fail(format!(
                                    "direct grant of {lease_id:?} on {resource} by {cmd:?}"
                                )))
                            }
                        };
                        prop_assert!(
                            self.queue_len(resource) == 0,
                            "direct grant on {} past a waiter",
                            resource
                        );
                        mode
                    };
                    // One kind per resource while it has holders or waiters.
                    prop_assert!(
                        kind_before.is_none_or(|k| k == kind(mode)),
                        "{:?} granted on {} in use as kind {:?}",
                        mode,
                        resource,
                        kind_before
                    );
                    let hs = self.holders.entry(resource.clone()).or_default();
                    prop_assert!(
                        !hs.iter().any(|h| h.0 == *lease_id),
                        "{:?} holds {} twice",
                        lease_id,
                        resource
                    );
                    hs.push((*lease_id, mode, *token));
                    match mode {
                        // A lock: never an exclusive holder beside another.
                        AcquireMode::Exclusive | AcquireMode::Shared => prop_assert!(
                            hs.len() == 1 || hs.iter().all(|h| h.1 == AcquireMode::Shared),
                            "exclusive holder beside another on {}: {:?}",
                            resource,
                            hs
                        ),
                        // A semaphore: never more holders than permits.
                        AcquireMode::Semaphore { permits } => prop_assert!(
                            hs.len() <= permits as usize,
                            "semaphore {} of {} permits has {} holders",
                            resource,
                            permits,
                            hs.len()
                        ),
                    }
                }
                Event::LeaseEnded {
                    resource,
                    lease_id,
                    ended,
                    token,
                } => {
                    let hs = self.holders.entry(resource.clone()).or_default();
                    let i = hs.iter().position(|h| h.0 == *lease_id);
                    prop_assert!(i.is_some(), "lease ended on {} without holding", resource);
                    let (_, _, held_token) = hs.remove(i.unwrap());
                    prop_assert_eq!(held_token, *token);
                    if hs.is_empty() {
                        self.holders.remove(resource);
                    }
                    // Leases time out only after every deadline their holder
                    // was given: else the next holder overlaps the old one.
                    if let Some(until) = self.promised_until.remove(&(resource.clone(), *lease_id))
                    {
                        if *ended == LeaseEnd::Expired {
                            prop_assert!(
                                self.clock_ms >= until,
                                "{} expired at {} but its holder was told it may work until {}",
                                resource,
                                self.clock_ms,
                                until
                            );
                        }
                    }
                }
                Event::WaitEnded {
                    resource, lease_id, ..
                } => {
                    let q = self.queue.entry(resource.clone()).or_default();
                    let i = q.iter().position(|w| w.0 == *lease_id);
                    prop_assert!(i.is_some(), "wait ended for a lease not queued");
                    q.remove(i.unwrap());
                }
                Event::WaitMoved { .. } => prop_assert!(false, "no migration in the model"),
                // Only a lease that holds now publishes, under its own
                // token.
                Event::ValueChanged {
                    resource,
                    lease_id,
                    token,
                } => {
                    prop_assert!(
                        self.holders
                            .get(resource)
                            .is_some_and(|hs| hs.iter().any(|h| h.0 == *lease_id && h.2 == *token)),
                        "value changed by a non-holder"
                    );
                }
            }
        }
        // Only a current holding's lease renews or releases; a stale one
        // changes nothing. (Events were folded in above, so a waiter that
        // the command itself promoted is already a holder here.)
        match (cmd, &out.reply) {
            (
                Command::Renew {
                    resource, lease_id, ..
                },
                result,
            ) => {
                let holds = self.holds(resource, lease_id);
                match result {
                    Ok(Reply::Renewed(r)) => {
                        prop_assert!(holds, "renew by a non-holder succeeded");
                        self.promise(resource, *lease_id, r.lease_ttl_ms);
                    }
                    Ok(_) => prop_assert!(holds, "renew by a non-holder succeeded"),
                    Err(LockError::LeaseNotHeld) => {
                        prop_assert!(!holds, "holder refused as not holding")
                    }
                    Err(_) => {}
                }
            }
            (Command::RenewBatch { items, .. }, Ok(Reply::RenewedBatch(results))) => {
                prop_assert_eq!(items.len(), results.len());
                for (item, result) in items.iter().zip(results) {
                    if let Ok(renewed) = result {
                        prop_assert!(self.holds(&item.resource, &item.lease_id));
                        self.promise(&item.resource, item.lease_id, renewed.lease_ttl_ms);
                    }
                }
            }
            (
                Command::Release {
                    resource, lease_id, ..
                },
                Ok(Reply::Released { released }),
            ) => {
                let ended_now = out.events.iter().any(|e| {
                    matches!(e,
                    Event::LeaseEnded { resource: r, lease_id: l, ended: LeaseEnd::Released, .. }
                    | Event::WaitEnded { resource: r, lease_id: l, ended: WaitEnd::Cancelled, .. }
                    if r == resource && l == lease_id)
                });
                prop_assert_eq!(
                    *released,
                    ended_now,
                    "release result disagrees with what ended"
                );
                // Whatever else happened, a release never ends another lease
                // except by expiry.
                for e in &out.events {
                    if let Event::LeaseEnded {
                        lease_id: l, ended, ..
                    } = e
                    {
                        prop_assert!(
                            l == lease_id || *ended == LeaseEnd::Expired,
                            "release ended someone else's lease"
                        );
                    }
                }
            }
            _ => {}
        }
        if let Command::Acquire { resource, mode, .. } = cmd {
            let invalid = matches!(mode, AcquireMode::Semaphore { permits }
                if *permits == 0 || *permits > MAX_HOLDERS_PER_RESOURCE);
            match &out.reply {
                Ok(_) => prop_assert!(!invalid, "{:?} accepted", mode),
                Err(LockError::InvalidPermits { permits, max }) => {
                    prop_assert!(invalid, "{:?} refused as invalid", mode);
                    prop_assert_eq!(*permits, kind(*mode));
                    prop_assert_eq!(*max, MAX_HOLDERS_PER_RESOURCE);
                }
                // Refused as another kind: the resource is in use as the
                // kind named, and it is not the acquire's.
                Err(LockError::ModeMismatch { permits }) => {
                    prop_assert_eq!(self.kind_of(resource), Some(*permits));
                    prop_assert_ne!(*permits, kind(*mode));
                }
                Err(LockError::LockHeld { queue_len, .. }) => {
                    prop_assert!(self.holders.contains_key(resource), "held by nobody");
                    prop_assert_eq!(*queue_len as usize, self.queue_len(resource));
                }
                Err(_) => {}
            }
        }
        if let (
            Command::Acquire {
                resource,
                request_id,
                mode,
                ..
            },
            Ok(Reply::Acquire(a)),
        ) = (cmd, &out.reply)
        {
            let token = match a.status {
                AcquireStatus::Held { token, .. } | AcquireStatus::Ended { token, .. } => {
                    Some(token)
                }
                _ => None,
            };
            let key = (resource.clone(), request_id.clone());
            if a.deduplicated {
                let (first_lease, first_token) = self
                    .first_outcome
                    .get(&key)
                    .copied()
                    .expect("dedup of an unknown request");
                prop_assert_eq!(a.lease_id, first_lease, "retry got a different lease");
                if let (Some(t), Some(first)) = (token, first_token) {
                    prop_assert_eq!(t, first, "retry got a different token");
                }
            } else {
                self.first_outcome.insert(key, (a.lease_id, token));
                if let AcquireStatus::Queued { position, .. } = a.status {
                    // It waits on a resource in use as its own kind.
                    prop_assert_eq!(self.kind_of(resource), Some(kind(*mode)));
                    let q = self.queue.entry(resource.clone()).or_default();
                    q.push((a.lease_id, *mode));
                    prop_assert_eq!(position as usize, q.len());
                }
            }
            if let AcquireStatus::Held { lease_ttl_ms, .. } = a.status {
                prop_assert!(
                    self.holds(resource, &a.lease_id),
                    "held reply of a non-holder"
                );
                self.promise(resource, a.lease_id, lease_ttl_ms);
            }
        }
        // A granted waiter's token is first known from its event.
        for e in &out.events {
            if let Event::Granted {
                resource,
                request_id,
                token,
                ..
            } = e
            {
                if let Some(entry) = self
                    .first_outcome
                    .get_mut(&(resource.clone(), request_id.clone()))
                {
                    entry.1.get_or_insert(*token);
                }
            }
        }
        // No waiter that fits is left at the head of a queue: grants happen
        // whenever holders or the head leave.
        for (resource, q) in &self.queue {
            if let Some((lease_id, mode)) = q.first() {
                prop_assert!(
                    !fits(*mode, &self.holder_modes(resource)),
                    "{:?} ({:?}) waits at the head of {} beside {:?}",
                    lease_id,
                    mode,
                    resource,
                    self.holders.get(resource)
                );
            }
        }
        self.queue.retain(|_, q| !q.is_empty());
        Ok(())
    }

    fn forget_dedup(&mut self, table: &LockTable, model: &Model) {
        // Forgotten dedup entries may legitimately start over.
        self.first_outcome
            .retain(|k, _| model.dedup.contains_key(k));
        let _ = table;
    }
}

/// Groups events by resource, keeping each resource's order: the table and
/// the model may interleave different resources differently within a tick.
fn by_resource(events: &[Event]) -> BTreeMap<String, Vec<Event>> {
    let mut m: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    for e in events {
        let r = match e {
            Event::Granted { resource, .. }
            | Event::LeaseEnded { resource, .. }
            | Event::WaitEnded { resource, .. }
            | Event::WaitMoved { resource, .. }
            | Event::ValueChanged { resource, .. } => resource,
        };
        m.entry(r.to_string()).or_default().push(e.clone());
    }
    m
}

fn run(steps: Vec<(Op, i64, bool)>) -> Result<(), TestCaseError> {
    let mut table = LockTable::new(limits()).unwrap();
    let mut model = Model::new(limits());
    let mut observer = Observer::default();
    let mut log: Vec<(Command, ApplyContext)> = Vec::new();
    let mut acquires: Vec<Command> = Vec::new();
    let mut leases: Vec<(usize, LeaseId)> = Vec::new();
    let (mut index, mut term, mut epoch, mut now) = (1u64, 1u64, 1u64, 1_000_000u64);
    let res = |i: usize| ResourceName::parse(RESOURCES[i]).unwrap();
    let pick_lease = |leases: &Vec<(usize, LeaseId)>, r: usize, pick: usize| -> LeaseId {
        let mine: Vec<LeaseId> = leases
            .iter()
            .filter(|(x, _)| *x == r)
            .map(|(_, l)| *l)
            .collect();
        if mine.is_empty() || pick.is_multiple_of(5) {
            LeaseId([pick as u8; 16])
        } else {
            mine[pick % mine.len()]
        }
    };

    // Every table starts with its leader's LeaderChanged entry.
    let first = (
        Command::LeaderChanged {
            clock_offset_allowance_ms: 0,
        },
        ApplyContext {
            index,
            term,
            epoch,
            now_ms: now,
        },
    );
    let mut all_steps = vec![first];
    for (op, dt, same_entry) in steps {
        if !same_entry {
            index += 1;
        }
        now = now.saturating_add_signed(dt);
        let mut ctx = ApplyContext {
            index,
            term,
            epoch,
            now_ms: now,
        };
        let cmd = match op {
            Op::Acquire {
                res: r,
                req,
                lease,
                ttl,
                wait,
                value,
                mode,
            } => {
                let c = Command::Acquire {
                    owner: Owner::anonymous(),
                    resource: res(r),
                    request_id: RequestId::new(vec![b'q', req]).unwrap(),
                    lease_id: LeaseId([lease; 16]),
                    lease_ttl_ms: TTLS[ttl],
                    wait_timeout_ms: WAITS[wait],
                    value: HolderValue::new(values()[value].clone()).unwrap(),
                    mode,
                };
                leases.push((r, LeaseId([lease; 16])));
                acquires.push(c.clone());
                c
            }
            Op::Retry { pick, mode } => match acquires.is_empty() {
                true => Command::Tick,
                false => {
                    let mut c = acquires[pick % acquires.len()].clone();
                    if let (Command::Acquire { mode: m, .. }, Some(mode)) = (&mut c, mode) {
                        *m = mode;
                    }
                    c
                }
            },
            Op::Renew { res: r, pick, ttl } => Command::Renew {
                owner: Owner::anonymous(),
                resource: res(r),
                lease_id: pick_lease(&leases, r, pick),
                lease_ttl_ms: TTLS[ttl],
            },
            Op::RenewBatch { picks } => Command::RenewBatch {
                owner: Owner::anonymous(),
                items: picks
                    .into_iter()
                    .map(|(r, pick)| RenewItem {
                        resource: res(r),
                        lease_id: pick_lease(&leases, r, pick),
                        lease_ttl_ms: 0,
                    })
                    .collect(),
            },
            Op::Release { res: r, pick } => Command::Release {
                owner: Owner::anonymous(),
                resource: res(r),
                lease_id: pick_lease(&leases, r, pick),
            },
            Op::Cancel {
                res: r,
                pick,
                attempt,
            } => Command::Cancel {
                resource: res(r),
                lease_id: pick_lease(&leases, r, pick),
                attempt,
            },
            Op::Proclaim {
                res: r,
                pick,
                value,
            } => Command::Proclaim {
                owner: Owner::anonymous(),
                resource: res(r),
                lease_id: pick_lease(&leases, r, pick),
                value: HolderValue::new(values()[value].clone()).unwrap(),
            },
            Op::Tick => Command::Tick,
            Op::LeaderChanged {
                allowance,
                new_term,
            } => {
                if new_term {
                    term += 1;
                    index += 1;
                }
                ctx = ApplyContext {
                    index,
                    term,
                    epoch,
                    now_ms: now,
                };
                Command::LeaderChanged {
                    clock_offset_allowance_ms: ALLOWANCES[allowance],
                }
            }
            Op::NotReady { res: r } => {
                ctx.term = term + 1;
                Command::Release {
                    owner: Owner::anonymous(),
                    resource: res(r),
                    lease_id: pick_lease(&leases, r, 1),
                }
            }
            Op::EpochBump => {
                epoch += 1;
                ctx.epoch = epoch;
                Command::Tick
            }
            Op::StaleEpoch { res: r } => {
                ctx.epoch = epoch.saturating_sub(1);
                Command::Release {
                    owner: Owner::anonymous(),
                    resource: res(r),
                    lease_id: pick_lease(&leases, r, 1),
                }
            }
        };
        all_steps.push((cmd, ctx));
    }

    for (cmd, ctx) in all_steps {
        let got = table.apply(&cmd, &ctx);
        let want = model.apply(&cmd, &ctx);
        prop_assert_eq!(
            &got.reply,
            &want.reply,
            "reply differs for {:?} at {:?}",
            cmd,
            ctx
        );
        prop_assert_eq!(
            by_resource(&got.events),
            by_resource(&want.events),
            "events differ for {:?}",
            cmd
        );
        observer.check(&cmd, &got, model.clock)?;
        observer.forget_dedup(&table, &model);
        prop_assert_eq!(table.check_invariants(), Ok(()));
        // Snapshot round trip: equal table, identical bytes.
        let bytes = table.snapshot();
        let restored = LockTable::restore(&bytes).expect("snapshot restores");
        prop_assert!(restored == table, "restored table differs");
        prop_assert_eq!(restored.snapshot(), bytes);
        // The command itself survives its log encoding.
        prop_assert_eq!(Command::decode(&cmd.encode()), Ok(cmd.clone()));
        for r in RESOURCES {
            let r = ResourceName::parse(r).unwrap();
            let view = table.view(&r);
            // The table's holders are the observer's, oldest grant first,
            // with the modes they were granted in; the top-level fields
            // describe the oldest.
            prop_assert_eq!(
                view.as_ref().map(|v| v
                    .holders
                    .iter()
                    .map(|h| (h.lease_id, h.mode, h.token))
                    .collect::<Vec<_>>()),
                observer.holders.get(&r).cloned()
            );
            if let Some(v) = &view {
                let oldest = &v.holders[0];
                prop_assert_eq!(
                    (
                        v.lease_id,
                        v.token,
                        v.mode,
                        v.expires_at_ms,
                        v.granted_at_ms
                    ),
                    (
                        oldest.lease_id,
                        oldest.token,
                        oldest.mode,
                        oldest.expires_at_ms,
                        oldest.granted_at_ms
                    )
                );
                prop_assert_eq!(&v.value, &oldest.value);
                prop_assert!(v.holders.windows(2).all(|w| w[0].token < w[1].token));
                prop_assert_eq!(v.queue_len as usize, observer.queue_len(&r));
            }
            // What `Get` shows (values, expiries, grant times) is the model's.
            prop_assert_eq!(view, model.view(&r));
        }
        log.push((cmd, ctx));
    }

    // Determinism: replaying the log gives the same bytes.
    let mut replica = LockTable::new(limits()).unwrap();
    for (cmd, ctx) in &log {
        replica.apply(cmd, ctx);
    }
    prop_assert_eq!(replica.snapshot(), table.snapshot());
    prop_assert!(
        table.max_token().as_u64() < 1 << 63
            && table.max_token().as_u64() >> POSITION_BITS <= epoch
    );
    Ok(())
}

fn cases() -> u32 {
    // CI and `make test` run the full 1,000; FENCELOCK_MODEL_CASES raises it
    // for soak runs.
    std::env::var("FENCELOCK_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn random_histories_match_the_model_and_keep_every_invariant(steps in prop::collection::vec(step(), 200..300)) {
        run(steps)?;
    }
}
