//! Model-based test of the lock state machine.
//!
//! Long random command sequences (duplicated acquires, reordered and stale
//! lease ids, out-of-range parameters, clock going back, leader changes,
//! stale terms and epochs) are applied both to the real `LockTable` and to a
//! small reference model written for clarity, not speed. After every step:
//!
//! * the reply and the events equal the model's;
//! * properties checked on the observed outputs alone, so that a bug shared
//!   by model and table still fails: at most one holder per resource, tokens
//!   strictly increasing per resource, only the current lease renews or
//!   releases, dedup returns the first outcome, grants from the queue follow
//!   FIFO order;
//! * the snapshot round-trips to an equal table and identical bytes.
//!
//! At the end a second table replays the log and must be byte-identical.

use std::collections::{BTreeMap, VecDeque};

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
        // Above max_records: the model has no per-tenant hold quota
        // (tests/scenarios.rs covers it).
        max_held_per_tenant: 1_000,
        dedup_retention_ms: 20_000,
        max_dedup_entries: 14,
        max_records: 3,
        max_retired_per_tick: 1_000,
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
}

#[derive(Clone, Debug)]
struct MWaiter {
    lease: LeaseId,
    req: RequestId,
    ttl: u64,
    deadline: u64,
    attempt: u32,
    value: Vec<u8>,
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
    held: BTreeMap<ResourceName, (MHolder, VecDeque<MWaiter>)>,
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
            for (h, _) in self.held.values_mut() {
                if h.stamped + a > h.expires {
                    h.expires = h.stamped + a;
                    n += 1;
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
                ..
            } => self
                .acquire(
                    resource,
                    request_id,
                    *lease_id,
                    (*lease_ttl_ms, *wait_timeout_ms),
                    value.as_bytes(),
                    ev,
                )
                .map(Reply::Acquire),
            // The contract: only the lease that holds the resource now
            // replaces what it publishes; its token stays.
            Command::Proclaim {
                resource,
                lease_id,
                value,
                ..
            } => {
                self.settle(resource, ev);
                match self.held.get_mut(resource) {
                    Some((h, _)) if h.lease == *lease_id => {
                        h.value = value.as_bytes().to_vec();
                        ev.push(Event::ValueChanged {
                            resource: resource.clone(),
                            lease_id: *lease_id,
                            token: h.token,
                        });
                        Ok(Reply::Proclaimed { token: h.token })
                    }
                    _ => Err(LockError::LeaseNotHeld),
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
                let latest = self.held.get(resource).and_then(|(h, q)| {
                    if h.lease == *lease_id {
                        Some(h.attempt)
                    } else {
                        q.iter().find(|w| w.lease == *lease_id).map(|w| w.attempt)
                    }
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

    fn settle(&mut self, r: &ResourceName, ev: &mut Vec<Event>) {
        if self
            .held
            .get(r)
            .is_some_and(|(h, _)| h.expires <= self.clock)
        {
            self.end_holder(r, LeaseEnd::Expired, ev);
        }
    }

    fn end_holder(&mut self, r: &ResourceName, how: LeaseEnd, ev: &mut Vec<Event>) {
        let (h, mut q) = self.held.remove(r).unwrap();
        let forget = self.clock + self.l.dedup_retention_ms;
        self.set_end(r, &h.req, MDedup::Ended(h.token, how, forget));
        ev.push(Event::LeaseEnded {
            resource: r.clone(),
            lease_id: h.lease,
            token: h.token,
            ended: how,
        });
        while let Some(w) = q.pop_front() {
            let ended = if w.deadline <= self.clock {
                WaitEnd::TimedOut
            } else if let Some(token) = self.mint((1 << 40) - 1) {
                let expires = self.clock + w.ttl;
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
                let h = MHolder {
                    lease: w.lease,
                    req: w.req,
                    token,
                    granted: self.clock,
                    ttl: w.ttl,
                    stamped: expires,
                    expires,
                    attempt: w.attempt,
                    value: w.value,
                };
                self.held.insert(r.clone(), (h, q));
                return;
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
    }

    fn tenant_waiters(&self, tenant: &str) -> u32 {
        self.held
            .iter()
            .filter(|(r, _)| r.tenant() == tenant)
            .map(|(_, (_, q))| q.len() as u32)
            .sum()
    }

    fn acquire(
        &mut self,
        r: &ResourceName,
        req: &RequestId,
        lease: LeaseId,
        (ttl, wait): (u64, u64),
        value: &[u8],
        ev: &mut Vec<Event>,
    ) -> Result<AcquireReply, LockError> {
        self.check_ttl(ttl)?;
        if wait > self.l.max_wait_timeout_ms {
            return Err(LockError::WaitTimeoutOutOfRange {
                wait_timeout_ms: wait,
                max_ms: self.l.max_wait_timeout_ms,
            });
        }
        self.settle(r, ev);
        if let Some(&(orig_lease, orig_ttl, state)) = self.dedup.get(&(r.clone(), req.clone())) {
            if orig_ttl != ttl {
                return Err(LockError::RequestIdReused {
                    original_ttl_ms: orig_ttl,
                });
            }
            // A retry of a live acquire attaches as its next attempt.
            let (status, attempt) = match state {
                MDedup::Waiting => {
                    let q = &mut self.held.get_mut(r).unwrap().1;
                    let i = q.iter().position(|w| w.lease == orig_lease).unwrap();
                    q[i].attempt += 1;
                    let status = AcquireStatus::Queued {
                        position: i as u32 + 1,
                        wait_deadline_ms: q[i].deadline,
                    };
                    (status, q[i].attempt)
                }
                MDedup::Held(token) => {
                    let h = &mut self.held.get_mut(r).unwrap().0;
                    h.attempt += 1;
                    // The retry's sender may count only on what is left
                    // of the lease's stamped time.
                    let status = AcquireStatus::Held {
                        token,
                        expires_at_ms: h.expires,
                        lease_ttl_ms: h.stamped.saturating_sub(self.clock),
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
        let status = if let Some((h, q)) = self.held.get(r) {
            if h.lease == lease || q.iter().any(|w| w.lease == lease) {
                return Err(LockError::LeaseIdCollision);
            }
            if wait == 0 {
                return Err(LockError::LockHeld {
                    holder_expires_at_ms: h.expires,
                    queue_len: q.len() as u32,
                });
            }
            if q.len() as u32 >= self.l.max_waiters_per_resource {
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
            let q = &mut self.held.get_mut(r).unwrap().1;
            q.push_back(MWaiter {
                lease,
                req: req.clone(),
                ttl,
                deadline,
                attempt: FIRST_ATTEMPT,
                value: value.to_vec(),
            });
            let position = q.len() as u32;
            self.dedup
                .insert((r.clone(), req.clone()), (lease, ttl, MDedup::Waiting));
            AcquireStatus::Queued {
                position,
                wait_deadline_ms: deadline,
            }
        } else {
            if self.held.len() >= self.l.max_records as usize {
                return Err(LockError::TableFull {
                    limit: self.l.max_records,
                });
            }
            let token = self
                .mint(token::POSITION_SOFT_LIMIT)
                .ok_or(LockError::TokenSpaceExhausted { epoch: self.epoch })?;
            let expires = now + ttl;
            let h = MHolder {
                lease,
                req: req.clone(),
                token,
                granted: now,
                ttl,
                stamped: expires,
                expires,
                attempt: FIRST_ATTEMPT,
                value: value.to_vec(),
            };
            self.held.insert(r.clone(), (h, VecDeque::new()));
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
        let Some((h, _)) = self.held.get(r) else {
            return Err(LockError::LeaseNotHeld);
        };
        if h.lease != lease {
            return Err(LockError::LeaseNotHeld);
        }
        let ttl = if ttl == 0 { h.ttl } else { ttl };
        self.check_ttl(ttl)?;
        if now >= h.granted + max_hold {
            return Err(LockError::HoldLimitReached {
                max_hold_ms: max_hold,
                granted_at_ms: h.granted,
            });
        }
        let h = &mut self.held.get_mut(r).unwrap().0;
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

    fn end(
        &mut self,
        r: &ResourceName,
        lease: LeaseId,
        how: LeaseEnd,
        ev: &mut Vec<Event>,
    ) -> bool {
        self.settle(r, ev);
        let Some((h, q)) = self.held.get_mut(r) else {
            return false;
        };
        if h.lease == lease {
            self.end_holder(r, how, ev);
            return true;
        }
        if let Some(i) = q.iter().position(|w| w.lease == lease) {
            let w = q.remove(i).unwrap();
            let forget = self.clock + self.l.dedup_retention_ms;
            self.set_end(r, &w.req, MDedup::WaitEnded(WaitEnd::Cancelled, forget));
            ev.push(Event::WaitEnded {
                resource: r.clone(),
                lease_id: w.lease,
                request_id: w.req,
                ended: WaitEnd::Cancelled,
            });
            return true;
        }
        false
    }

    fn tick(&mut self, ev: &mut Vec<Event>) -> TickReport {
        let now = self.clock;
        let mut rep = TickReport::default();
        // Leases first, oldest expiry first; then waiters by deadline; then dedup.
        let mut due: Vec<(u64, ResourceName)> = self
            .held
            .iter()
            .filter(|(_, (h, _))| h.expires <= now)
            .map(|(r, (h, _))| (h.expires, r.clone()))
            .collect();
        due.sort();
        for (_, r) in due {
            self.end_holder(&r, LeaseEnd::Expired, ev);
            rep.leases_expired += 1;
        }
        let mut waits: Vec<(u64, ResourceName, LeaseId)> = self
            .held
            .iter()
            .flat_map(|(r, (_, q))| {
                q.iter()
                    .filter(|w| w.deadline <= now)
                    .map(move |w| (w.deadline, r.clone(), w.lease))
            })
            .collect();
        waits.sort();
        for (_, r, lease) in waits {
            let q = &mut self.held.get_mut(&r).unwrap().1;
            let i = q.iter().position(|w| w.lease == lease).unwrap();
            let w = q.remove(i).unwrap();
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
    /// Acquire; `dup` retries an earlier acquire verbatim instead.
    Acquire {
        res: usize,
        req: u8,
        lease: u8,
        ttl: usize,
        wait: usize,
        /// Index into `VALUES` (0: none).
        value: usize,
    },
    Retry {
        pick: usize,
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

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4usize, 0..6u8, 0..40u8, 0..5usize, 0..5usize, prop_oneof![2 => Just(0usize), 1 => 1..4usize]).prop_map(|(res, req, lease, ttl, wait, value)| Op::Acquire { res, req, lease, ttl, wait, value }),
        2 => (0..4usize, any::<usize>(), 0..4usize).prop_map(|(res, pick, value)| Op::Proclaim { res, pick, value }),
        2 => any::<usize>().prop_map(|pick| Op::Retry { pick }),
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
    (op(), -3_000i64..9_000, prop::bool::weighted(0.15))
}

// ------------------------------------------------ properties on outputs only

/// What an observer of replies and events alone knows.
#[derive(Default)]
struct Observer {
    /// The shard's clock (the highest leader stamp applied so far).
    clock_ms: u64,
    /// Per resource, the lease a reply or grant told its holder it holds,
    /// and until when (clock at the answer + the TTL answered): the holder's
    /// stop-by can be no later, since it sent the request before the apply.
    promised_until: BTreeMap<ResourceName, (LeaseId, u64)>,
    holder: BTreeMap<ResourceName, LeaseId>,
    highest_token: BTreeMap<ResourceName, FencingToken>,
    queue: BTreeMap<ResourceName, Vec<LeaseId>>,
    first_outcome: BTreeMap<(ResourceName, RequestId), (LeaseId, Option<FencingToken>)>,
}

impl Observer {
    /// A reply or grant told the holder of `lease_id` that it may work for
    /// `ttl_ms` more.
    fn promise(&mut self, resource: &ResourceName, lease_id: LeaseId, ttl_ms: u64) {
        let until = self.clock_ms + ttl_ms;
        let entry = self
            .promised_until
            .entry(resource.clone())
            .or_insert((lease_id, until));
        if entry.0 != lease_id {
            *entry = (lease_id, until);
        }
        entry.1 = entry.1.max(until);
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
                    // Invariant 1: only one holder at a time.
                    prop_assert!(
                        !self.holder.contains_key(resource),
                        "second holder for {}",
                        resource
                    );
                    // Invariant 2: strictly larger token.
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
                    self.holder.insert(resource.clone(), *lease_id);
                    if *from_queue {
                        // FIFO: the head of the queue (after removals) wins.
                        let q = self.queue.entry(resource.clone()).or_default();
                        prop_assert_eq!(q.first(), Some(lease_id), "grant out of FIFO order");
                        q.remove(0);
                    }
                }
                Event::LeaseEnded {
                    resource,
                    lease_id,
                    ended,
                    ..
                } => {
                    prop_assert_eq!(self.holder.remove(resource), Some(*lease_id));
                    // Leases time out only after every deadline their holder
                    // was given: else the next holder overlaps the old one.
                    if let Some((promised, until)) = self.promised_until.remove(resource) {
                        if *ended == LeaseEnd::Expired && promised == *lease_id {
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
                    let i = q.iter().position(|l| l == lease_id);
                    prop_assert!(i.is_some(), "wait ended for a lease not queued");
                    q.remove(i.unwrap());
                }
                Event::WaitMoved { .. } => prop_assert!(false, "no migration in the model"),
                // Only the lease that holds now publishes, under its own
                // token.
                Event::ValueChanged {
                    resource,
                    lease_id,
                    token,
                } => {
                    prop_assert_eq!(self.holder.get(resource), Some(lease_id));
                    prop_assert_eq!(self.highest_token.get(resource), Some(token));
                }
            }
        }
        // Only the current lease renews or releases; a stale one changes
        // nothing. (Events were folded in above, so a waiter that the command
        // itself promoted is already the holder here.)
        match (cmd, &out.reply) {
            (
                Command::Renew {
                    resource, lease_id, ..
                },
                result,
            ) => {
                let holds = self.holder.get(resource) == Some(lease_id);
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
                        prop_assert_eq!(self.holder.get(&item.resource), Some(&item.lease_id));
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
        if let (
            Command::Acquire {
                resource,
                request_id,
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
                    let q = self.queue.entry(resource.clone()).or_default();
                    q.push(a.lease_id);
                    prop_assert_eq!(position as usize, q.len());
                }
            }
            if let AcquireStatus::Held { lease_ttl_ms, .. } = a.status {
                prop_assert_eq!(self.holder.get(resource), Some(&a.lease_id));
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
            } => {
                let c = Command::Acquire {
                    owner: Owner::anonymous(),
                    resource: res(r),
                    request_id: RequestId::new(vec![b'q', req]).unwrap(),
                    lease_id: LeaseId([lease; 16]),
                    lease_ttl_ms: TTLS[ttl],
                    wait_timeout_ms: WAITS[wait],
                    value: HolderValue::new(values()[value].clone()).unwrap(),
                };
                leases.push((r, LeaseId([lease; 16])));
                acquires.push(c.clone());
                c
            }
            Op::Retry { pick } => match acquires.is_empty() {
                true => Command::Tick,
                false => acquires[pick % acquires.len()].clone(),
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
        // At most one holder: the table's view agrees with the observer.
        for r in RESOURCES {
            let r = ResourceName::parse(r).unwrap();
            prop_assert_eq!(
                table.view(&r).map(|v| v.lease_id),
                observer.holder.get(&r).copied()
            );
            // What `Get` publishes is the model holder's value.
            prop_assert_eq!(
                table.view(&r).map(|v| v.value.as_bytes().to_vec()),
                model.held.get(&r).map(|(h, _)| h.value.clone())
            );
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
