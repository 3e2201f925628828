//! The lock table and its `apply` function.
//!
//! `LockTable::apply(command, context)` is the only way the replicated state
//! changes. It is a pure function of the table, the command and the context:
//! no clock, no randomness, no I/O. Every replica that applies the same log
//! ends with the same table (the model tests check this by comparing
//! snapshots byte for byte).
//!
//! Shape of the state:
//! * `records`: one record per resource that is held. A record always has
//!   at least one holder (exactly one for an exclusive lock; several shared
//!   holders, or up to a semaphore's permit count); waiters queue behind
//!   them in FIFO order whatever their mode. When a holder leaves, waiters
//!   are granted from the head in the same apply for as long as each fits
//!   beside the holders (direct hand-off, so nobody else is woken). A
//!   resource with neither is deleted; its tokens cannot restart lower
//!   because they come from the shard's log position.
//! * `dedup`: the outcome of every acquire by `(resource, requestId)`, kept
//!   while the lease or wait lives and `dedup_retention_ms` after it ends.
//! * indexes derived from the above (expiry, wait deadlines, dedup forget
//!   times, waiters per tenant), rebuilt on restore and checked by
//!   [`LockTable::check_invariants`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::cow_map::CowMap;
use crate::error::LockError;
use crate::limits::{
    InvalidLimits, Limits, MAX_CLOCK_OFFSET_ALLOWANCE_MS, MAX_HOLDERS_PER_RESOURCE,
    MAX_RENEW_BATCH, MAX_VALUE_BYTES_PER_SHARD,
};
use crate::name::ResourceName;
use crate::slots::{slot_of, SlotSet};
use crate::token::{FencingToken, MAX_EPOCH, MAX_POSITION, POSITION_SOFT_LIMIT};
use crate::types::*;

/// Debug builds check every invariant after each apply while the table has at
/// most this many records plus dedup entries.
const FULL_CHECK_MAX_ITEMS: usize = 4_096;

/// The attempt number of an acquire's first (original) request.
pub const FIRST_ATTEMPT: u32 = 1;

/// One holding of a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub lease_id: LeaseId,
    /// The identity that acquired the lease: the only one that may renew
    /// or release it.
    pub owner: Owner,
    pub request_id: RequestId,
    pub token: FencingToken,
    pub granted_at_ms: u64,
    pub lease_ttl_ms: u64,
    /// Expiry as stamped by the leader that granted or last renewed the
    /// lease. `LeaderChanged` may extend `expires_at_ms` to at most this plus
    /// one clock-offset allowance, so repeated elections cannot keep a lease
    /// alive forever.
    pub stamped_expires_at_ms: u64,
    /// The expiry actually enforced.
    pub expires_at_ms: u64,
    /// The latest acquire attempt attached to this lease (see
    /// [`Waiter::attempt`]); carried over from the waiter at a grant.
    pub attempt: u32,
    /// What the holder publishes (the acquire's value, or the latest
    /// `Proclaim`); empty: none.
    pub value: HolderValue,
    /// How it holds (of its record's kind).
    pub mode: AcquireMode,
}

/// A queued acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Waiter {
    pub lease_id: LeaseId,
    pub owner: Owner,
    pub request_id: RequestId,
    pub lease_ttl_ms: u64,
    pub enqueued_at_ms: u64,
    pub wait_deadline_ms: u64,
    /// The latest acquire attempt attached to this lease: 1 for the
    /// original, one more for each retry by request id applied while the
    /// acquire waits or holds. A `Cancel` names the attempt whose caller
    /// went away and is ignored once a later attempt attached, because that
    /// retry may already have been told of the grant.
    pub attempt: u32,
    /// The value the holder will publish once granted.
    pub value: HolderValue,
    /// How it wants to hold (of its record's kind).
    pub mode: AcquireMode,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// Every holding, oldest grant first (so tokens rise along it). Never
    /// empty: a record without holders is deleted.
    pub holders: Vec<Holder>,
    pub waiters: VecDeque<Waiter>,
    /// The highest token granted while the record has existed (`Get`'s
    /// last token): a newer holding of a shared lock or a semaphore may
    /// end before an older one, so the holdings alone do not show it.
    pub last_token: FencingToken,
}

impl Record {
    /// A record with one holder and nobody waiting.
    pub(crate) fn held_by(holder: Holder) -> Record {
        Record {
            last_token: holder.token,
            holders: vec![holder],
            waiters: VecDeque::new(),
        }
    }

    /// The mode of the oldest holding: its kind is the record's.
    pub(crate) fn kind(&self) -> AcquireMode {
        self.holders[0].mode
    }

    pub(crate) fn holder(&self, lease_id: LeaseId) -> Option<&Holder> {
        self.holders.iter().find(|h| h.lease_id == lease_id)
    }

    pub(crate) fn holder_mut(&mut self, lease_id: LeaseId) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.lease_id == lease_id)
    }

    /// Whether an acquire in `mode` fits beside the holders now.
    pub(crate) fn fits(&self, mode: AcquireMode) -> bool {
        mode.fits_beside(self.holders.iter().map(|h| h.mode))
    }

    /// When a holding that blocks an acquire in `mode` could end by
    /// expiry: the last holder to expire for an exclusive acquire (it needs
    /// them all gone), the first otherwise (one leaving may be enough).
    fn blocking_expiry_ms(&self, mode: AcquireMode) -> u64 {
        let expiries = self.holders.iter().map(|h| h.expires_at_ms);
        let at = match mode {
            AcquireMode::Exclusive => expiries.max(),
            AcquireMode::Shared | AcquireMode::Semaphore { .. } => expiries.min(),
        };
        at.expect("a record has a holder")
    }
}

pub(crate) use crate::dedup_key::DedupKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DedupState {
    Waiting,
    Held {
        token: FencingToken,
    },
    Ended {
        token: FencingToken,
        ended: LeaseEnd,
        forget_at_ms: u64,
    },
    WaitEnded {
        ended: WaitEnd,
        forget_at_ms: u64,
    },
}

impl DedupState {
    /// The token of a granted acquire, if it was granted.
    pub(crate) fn token(&self) -> Option<FencingToken> {
        match *self {
            DedupState::Held { token } | DedupState::Ended { token, .. } => Some(token),
            DedupState::Waiting | DedupState::WaitEnded { .. } => None,
        }
    }

    pub(crate) fn forget_at_ms(&self) -> Option<u64> {
        match *self {
            DedupState::Ended { forget_at_ms, .. } | DedupState::WaitEnded { forget_at_ms, .. } => {
                Some(forget_at_ms)
            }
            DedupState::Waiting | DedupState::Held { .. } => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DedupEntry {
    pub lease_id: LeaseId,
    pub lease_ttl_ms: u64,
    pub state: DedupState,
}

/// The replicated lock state of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockTable {
    pub(crate) limits: Limits,
    /// Current epoch (0 until the first entry is applied).
    pub(crate) epoch: u64,
    /// `index - epoch_base_index` is an entry's position in the epoch.
    pub(crate) epoch_base_index: u64,
    /// Position of the last token minted in this epoch.
    pub(crate) last_position: u64,
    /// Highest token this shard ever minted (or imported).
    pub(crate) max_token: FencingToken,
    /// Term of the last applied `LeaderChanged`.
    pub(crate) leader_term: u64,
    pub(crate) applied_index: u64,
    /// Highest leader stamp seen: the machine's notion of now.
    pub(crate) clock_ms: u64,
    pub(crate) records: CowMap<ResourceName, Record>,
    pub(crate) dedup: CowMap<DedupKey, DedupEntry>,
    // Derived indexes.
    pub(crate) expiry_index: BTreeSet<(u64, ResourceName, LeaseId)>,
    pub(crate) wait_index: BTreeSet<(u64, ResourceName, LeaseId)>,
    pub(crate) forget_index: BTreeSet<(u64, DedupKey)>,
    pub(crate) tenant_waiters: BTreeMap<String, u32>,
    /// Held resources per tenant (for `max_held_per_tenant`).
    pub(crate) tenant_held: BTreeMap<String, u32>,
    /// Bytes of holder values kept by holders and waiters (for
    /// `MAX_VALUE_BYTES_PER_SHARD`).
    pub(crate) value_bytes: u64,
    /// Slots this shard serves. Requests for other slots are refused with
    /// `WrongShard` at apply, whatever map routed them here.
    pub(crate) owned: SlotSet,
    /// Highest migration id imported or closed (`CloseMigration`) here: no
    /// export or import of this id or a lower one changes the table any
    /// more (see `migrate.rs`).
    pub(crate) last_imported_migration: u64,
    /// Exports not yet confirmed by their target, by migration id.
    pub(crate) exports: BTreeMap<u64, PendingExport>,
}

/// State taken out of the table by `ExportSlots`, kept until `DropExport`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PendingExport {
    pub slots: SlotSet,
    /// Shared: a frozen copy of the table (a snapshot) takes it too.
    pub data: std::sync::Arc<[u8]>,
    pub resources: u32,
}

impl LockTable {
    /// An empty table with the given limits.
    pub fn new(limits: Limits) -> Result<LockTable, InvalidLimits> {
        limits.validate()?;
        Ok(LockTable {
            limits,
            epoch: 0,
            epoch_base_index: 0,
            last_position: 0,
            max_token: FencingToken::NONE,
            leader_term: 0,
            applied_index: 0,
            clock_ms: 0,
            records: CowMap::new(),
            dedup: CowMap::new(),
            expiry_index: BTreeSet::new(),
            wait_index: BTreeSet::new(),
            forget_index: BTreeSet::new(),
            tenant_waiters: BTreeMap::new(),
            value_bytes: 0,
            tenant_held: BTreeMap::new(),
            owned: SlotSet::full(),
            last_imported_migration: 0,
            exports: BTreeMap::new(),
        })
    }

    /// An empty table that serves only `slots` (a shard of a sharded
    /// cluster; [`LockTable::new`] serves every slot).
    pub fn with_slots(limits: Limits, slots: SlotSet) -> Result<LockTable, InvalidLimits> {
        let mut table = LockTable::new(limits)?;
        table.owned = slots;
        Ok(table)
    }

    /// The first state of a shard created at log position `index` (its
    /// bootstrap snapshot): serves `slots` in `epoch`, with entry `index + 1`
    /// the epoch's position 1... onwards. Every replica of the shard starts
    /// from the same bytes.
    ///
    /// # Panics
    /// If `epoch` is outside `1..=MAX_EPOCH` or `index` is 0.
    pub fn bootstrap(
        limits: Limits,
        slots: SlotSet,
        epoch: u64,
        index: u64,
    ) -> Result<LockTable, InvalidLimits> {
        assert!(
            (1..=MAX_EPOCH).contains(&epoch),
            "epoch {epoch} out of range"
        );
        assert!(index >= 1, "a bootstrap snapshot is at index 1 or later");
        let mut table = LockTable::with_slots(limits, slots)?;
        table.epoch = epoch;
        table.applied_index = index;
        table.epoch_base_index = index - 1;
        Ok(table)
    }

    /// Applies one command at the log position described by `ctx`.
    pub fn apply(&mut self, command: &Command, ctx: &ApplyContext) -> Outcome {
        let mut events = Vec::new();
        let reply = self.apply_inner(command, ctx, &mut events);
        // The full check is O(table); debug builds run it while tables are
        // small enough for it to stay cheap (model tests, cluster tests).
        if cfg!(debug_assertions) && self.records.len() + self.dedup.len() <= FULL_CHECK_MAX_ITEMS {
            if let Err(broken) = self.check_invariants() {
                panic!("invariant broken after {command:?} at {ctx:?}: {broken}");
            }
        }
        Outcome { reply, events }
    }

    fn apply_inner(
        &mut self,
        command: &Command,
        ctx: &ApplyContext,
        events: &mut Vec<Event>,
    ) -> Result<Reply, LockError> {
        self.advance(ctx)?;
        if let Command::LeaderChanged {
            clock_offset_allowance_ms,
        } = command
        {
            return self.leader_changed(ctx.term, *clock_offset_allowance_ms);
        }
        // A leader's commands count only after its own LeaderChanged entry:
        // that entry is what makes remaining lease time conservative.
        if ctx.term != self.leader_term {
            return Err(LockError::LeaderNotReady {
                entry_term: ctx.term,
                leader_term: self.leader_term,
            });
        }
        match command {
            Command::Acquire {
                resource,
                owner,
                request_id,
                lease_id,
                lease_ttl_ms,
                wait_timeout_ms,
                value,
                mode,
            } => self
                .acquire(
                    resource,
                    owner,
                    request_id,
                    *lease_id,
                    *lease_ttl_ms,
                    *wait_timeout_ms,
                    value,
                    *mode,
                    events,
                )
                .map(Reply::Acquire),
            Command::Proclaim {
                resource,
                owner,
                lease_id,
                value,
            } => self
                .proclaim(resource, owner, *lease_id, value, events)
                .map(|token| Reply::Proclaimed { token }),
            Command::Renew {
                resource,
                owner,
                lease_id,
                lease_ttl_ms,
            } => self
                .renew(resource, owner, *lease_id, *lease_ttl_ms, events)
                .map(Reply::Renewed),
            Command::RenewBatch { owner, items } => {
                if items.len() > MAX_RENEW_BATCH {
                    return Err(LockError::BatchTooLarge {
                        len: items.len(),
                        max: MAX_RENEW_BATCH,
                    });
                }
                let results = items
                    .iter()
                    .map(|item| {
                        self.renew(
                            &item.resource,
                            owner,
                            item.lease_id,
                            item.lease_ttl_ms,
                            events,
                        )
                    })
                    .collect();
                Ok(Reply::RenewedBatch(results))
            }
            Command::Release {
                resource,
                owner,
                lease_id,
            } => {
                self.check_owned(resource)?;
                let released =
                    self.end(resource, Some(owner), *lease_id, LeaseEnd::Released, events)?;
                Ok(Reply::Released { released })
            }
            Command::Cancel {
                resource,
                lease_id,
                attempt,
            } => {
                self.check_owned(resource)?;
                // Proposed by the server for a caller that went away, never
                // by a caller: no owner to check. A later attempt (a retry
                // by request id) attached since keeps the acquire alive.
                self.settle(resource, events);
                if self.latest_attempt(resource, *lease_id) != Some(*attempt) {
                    return Ok(Reply::Cancelled { removed: false });
                }
                let removed = self.end(resource, None, *lease_id, LeaseEnd::Cancelled, events)?;
                Ok(Reply::Cancelled { removed })
            }
            Command::Tick => Ok(Reply::Ticked(self.tick(events))),
            Command::LeaderChanged { .. } => unreachable!("handled above"),
            Command::ExportSlots {
                migration_id,
                slots,
            } => self.export_slots(*migration_id, slots, events),
            Command::ImportSlots {
                migration_id,
                epoch,
                slots,
                data,
                clock_offset_allowance_ms,
                export_clock_ms,
            } => self.import_slots(
                *migration_id,
                *epoch,
                slots,
                data,
                crate::migrate::ImportTimes {
                    allowance_ms: *clock_offset_allowance_ms,
                    export_clock_ms: *export_clock_ms,
                },
                ctx,
            ),
            Command::DropExport { migration_id } => Ok(self.drop_export(*migration_id)),
            Command::CloseMigration {
                migration_id,
                slots,
            } => self.close_migration(*migration_id, slots),
        }
    }

    /// Moves the log position, epoch and clock forward to `ctx`. Refuses
    /// (changing nothing) a context that would move any of them backwards.
    fn advance(&mut self, ctx: &ApplyContext) -> Result<(), LockError> {
        if ctx.index == 0 || ctx.index < self.applied_index {
            return Err(LockError::InvalidCommand {
                reason: "log index is zero or went backwards",
            });
        }
        if ctx.epoch == 0 || ctx.epoch > MAX_EPOCH {
            return Err(LockError::InvalidCommand {
                reason: "epoch out of range",
            });
        }
        if ctx.now_ms > crate::limits::MAX_CLOCK_MS {
            return Err(LockError::InvalidCommand {
                reason: "leader time stamp out of range",
            });
        }
        if ctx.epoch < self.epoch {
            return Err(LockError::StaleEpoch {
                entry_epoch: ctx.epoch,
                current_epoch: self.epoch,
            });
        }
        if ctx.epoch > self.epoch {
            // A new epoch starts counting positions at this entry (position 1),
            // and every token of it is above every token of older epochs.
            self.epoch = ctx.epoch;
            self.epoch_base_index = ctx.index - 1;
            self.last_position = 0;
        }
        self.applied_index = ctx.index;
        self.clock_ms = self.clock_ms.max(ctx.now_ms);
        Ok(())
    }

    /// The position the next token would get.
    fn next_position(&self) -> u64 {
        debug_assert!(self.applied_index > self.epoch_base_index);
        (self.last_position + 1).max(self.applied_index - self.epoch_base_index)
    }

    /// Mints the next token if its position is at most `limit`.
    fn mint(&mut self, limit: u64) -> Result<FencingToken, LockError> {
        let position = self.next_position();
        if position > limit {
            return Err(LockError::TokenSpaceExhausted { epoch: self.epoch });
        }
        debug_assert!(limit <= MAX_POSITION);
        let token = FencingToken::new(self.epoch, position);
        // Paired with the per-resource check in `check_invariants`: every
        // token is above every token minted before it by this shard.
        assert!(
            token > self.max_token,
            "token {token} not above {}",
            self.max_token
        );
        self.last_position = position;
        self.max_token = token;
        Ok(token)
    }

    fn now(&self) -> u64 {
        self.clock_ms
    }

    fn leader_changed(&mut self, term: u64, allowance_ms: u64) -> Result<Reply, LockError> {
        if allowance_ms > MAX_CLOCK_OFFSET_ALLOWANCE_MS {
            return Err(LockError::InvalidCommand {
                reason: "clock offset allowance too large",
            });
        }
        if term < self.leader_term {
            return Err(LockError::InvalidCommand {
                reason: "leader changed to an older term",
            });
        }
        self.leader_term = term;
        // Conservative remaining time: the new leader's clock may run ahead of
        // the old leader's by up to the allowance, so push each expiry out to
        // the last leader-stamped expiry plus the allowance. The bound is on
        // the stamp, not on the current expiry, so a second election adds
        // nothing: only a renewal moves the stamp.
        let mut extended = 0u32;
        let mut moves = Vec::new();
        for (name, record) in self.records.iter_mut_unordered() {
            for holder in record.holders.iter_mut() {
                let target = holder.stamped_expires_at_ms + allowance_ms;
                if target > holder.expires_at_ms {
                    moves.push((holder.expires_at_ms, target, name.clone(), holder.lease_id));
                    holder.expires_at_ms = target;
                    extended += 1;
                }
            }
        }
        for (old, new, name, lease_id) in moves {
            let removed = self.expiry_index.remove(&(old, name.clone(), lease_id));
            debug_assert!(removed);
            self.expiry_index.insert((new, name, lease_id));
        }
        Ok(Reply::LeaderChanged {
            leases_extended: extended,
        })
    }

    fn check_ttl(&self, lease_ttl_ms: u64) -> Result<(), LockError> {
        let (min_ms, max_ms) = (self.limits.min_lease_ttl_ms, self.limits.max_lease_ttl_ms);
        if !(min_ms..=max_ms).contains(&lease_ttl_ms) {
            return Err(LockError::TtlOutOfRange {
                ttl_ms: lease_ttl_ms,
                min_ms,
                max_ms,
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        resource: &ResourceName,
        owner: &Owner,
        request_id: &RequestId,
        lease_id: LeaseId,
        lease_ttl_ms: u64,
        wait_timeout_ms: u64,
        value: &HolderValue,
        mode: AcquireMode,
        events: &mut Vec<Event>,
    ) -> Result<AcquireReply, LockError> {
        self.check_owned(resource)?;
        self.check_ttl(lease_ttl_ms)?;
        if wait_timeout_ms > self.limits.max_wait_timeout_ms {
            return Err(LockError::WaitTimeoutOutOfRange {
                wait_timeout_ms,
                max_ms: self.limits.max_wait_timeout_ms,
            });
        }
        mode.validate()?;
        self.settle(resource, events);
        let key = DedupKey::new(resource, owner, request_id);
        if let Some(entry) = self.dedup.get(&key) {
            if entry.lease_ttl_ms != lease_ttl_ms {
                return Err(LockError::RequestIdReused {
                    original_ttl_ms: entry.lease_ttl_ms,
                });
            }
            let entry = entry.clone();
            let attempt = self.attach_attempt(resource, &entry);
            return Ok(self.dedup_reply(resource, &entry, attempt));
        }
        if self.dedup.len() >= self.limits.max_dedup_entries as usize {
            return Err(LockError::DedupTableFull {
                limit: self.limits.max_dedup_entries,
            });
        }
        self.check_value_room(0, value)?;
        let grant_now = match self.records.get(resource) {
            None => {
                if self.records.len() >= self.limits.max_records as usize {
                    return Err(LockError::TableFull {
                        limit: self.limits.max_records,
                    });
                }
                true
            }
            Some(record) => {
                if !record.kind().same_kind(&mode) {
                    return Err(LockError::ModeMismatch {
                        permits: record.kind().permits(),
                    });
                }
                if record.holder(lease_id).is_some()
                    || record.waiters.iter().any(|w| w.lease_id == lease_id)
                {
                    return Err(LockError::LeaseIdCollision);
                }
                // FIFO across modes: nobody is granted past a waiter.
                record.waiters.is_empty() && record.fits(mode)
            }
        };
        let status = if grant_now {
            let held = self.tenant_held.get(resource.tenant()).copied();
            if held.unwrap_or(0) >= self.limits.max_held_per_tenant {
                return Err(LockError::TenantQuotaExceeded {
                    limit: self.limits.max_held_per_tenant,
                });
            }
            let token = self.mint(POSITION_SOFT_LIMIT)?;
            let holder = Holder {
                lease_id,
                owner: owner.clone(),
                request_id: request_id.clone(),
                token,
                granted_at_ms: 0,
                lease_ttl_ms,
                stamped_expires_at_ms: 0,
                expires_at_ms: 0,
                attempt: FIRST_ATTEMPT,
                value: value.clone(),
                mode,
            };
            self.dedup.insert(
                key,
                DedupEntry {
                    lease_id,
                    lease_ttl_ms,
                    state: DedupState::Held { token },
                },
            );
            let expires_at_ms = self.add_holder(resource, holder, false, events);
            AcquireStatus::Held {
                token,
                expires_at_ms,
                lease_ttl_ms,
            }
        } else {
            self.enqueue(
                resource,
                key,
                Waiter {
                    lease_id,
                    owner: owner.clone(),
                    request_id: request_id.clone(),
                    lease_ttl_ms,
                    enqueued_at_ms: self.now(),
                    wait_deadline_ms: self.now() + wait_timeout_ms,
                    attempt: FIRST_ATTEMPT,
                    value: value.clone(),
                    mode,
                },
                wait_timeout_ms,
            )?
        };
        Ok(AcquireReply {
            lease_id,
            deduplicated: false,
            status,
            attempt: FIRST_ATTEMPT,
        })
    }

    /// Makes `holder` (its token minted, its dedup entry saying held) a
    /// holder of `resource` from now, creating the record if there is
    /// none: stamps its times, indexes and counts it, and reports the
    /// grant. Returns its expiry.
    fn add_holder(
        &mut self,
        resource: &ResourceName,
        mut holder: Holder,
        from_queue: bool,
        events: &mut Vec<Event>,
    ) -> u64 {
        let now = self.now();
        let expires_at_ms = now + holder.lease_ttl_ms;
        holder.granted_at_ms = now;
        holder.stamped_expires_at_ms = expires_at_ms;
        holder.expires_at_ms = expires_at_ms;
        self.count_held(resource, true);
        self.value_bytes += holder.value.len() as u64;
        self.expiry_index
            .insert((expires_at_ms, resource.clone(), holder.lease_id));
        events.push(Event::Granted {
            resource: resource.clone(),
            lease_id: holder.lease_id,
            request_id: holder.request_id.clone(),
            token: holder.token,
            expires_at_ms,
            lease_ttl_ms: holder.lease_ttl_ms,
            from_queue,
        });
        match self.records.get_mut(resource) {
            Some(record) => {
                // Paired with the check in `check_invariants`: holders fit
                // together, and tokens rise along the list.
                assert!(record.fits(holder.mode), "{resource}: grant does not fit");
                debug_assert!(record.holders.last().is_none_or(|h| h.token < holder.token));
                assert!(record.last_token < holder.token, "{resource}: tokens rise");
                record.last_token = holder.token;
                record.holders.push(holder);
            }
            None => {
                self.records
                    .insert(resource.clone(), Record::held_by(holder));
            }
        }
        expires_at_ms
    }

    /// Queues `waiter` on the held `resource` (its acquire's dedup key
    /// `key`), or refuses as the limits say.
    fn enqueue(
        &mut self,
        resource: &ResourceName,
        key: DedupKey,
        waiter: Waiter,
        wait_timeout_ms: u64,
    ) -> Result<AcquireStatus, LockError> {
        let record = self.records.get(resource).expect("queued behind holders");
        let queue_len = record.waiters.len() as u32;
        if wait_timeout_ms == 0 {
            return Err(LockError::LockHeld {
                holder_expires_at_ms: record.blocking_expiry_ms(waiter.mode),
                queue_len,
            });
        }
        if queue_len >= self.limits.max_waiters_per_resource {
            return Err(LockError::QueueFull {
                limit: self.limits.max_waiters_per_resource,
            });
        }
        let tenant = resource.tenant();
        let tenant_count = self.tenant_waiters.get(tenant).copied().unwrap_or(0);
        if tenant_count >= self.limits.max_waiters_per_tenant {
            return Err(LockError::TenantWaitersExceeded {
                limit: self.limits.max_waiters_per_tenant,
            });
        }
        // A waiter will need a token; do not queue into an epoch that
        // already refuses direct grants.
        if self.next_position() > POSITION_SOFT_LIMIT {
            return Err(LockError::TokenSpaceExhausted { epoch: self.epoch });
        }
        let wait_deadline_ms = waiter.wait_deadline_ms;
        self.tenant_waiters
            .insert(tenant.to_owned(), tenant_count + 1);
        self.wait_index
            .insert((wait_deadline_ms, resource.clone(), waiter.lease_id));
        self.value_bytes += waiter.value.len() as u64;
        self.dedup.insert(
            key,
            DedupEntry {
                lease_id: waiter.lease_id,
                lease_ttl_ms: waiter.lease_ttl_ms,
                state: DedupState::Waiting,
            },
        );
        let record = self.records.get_mut(resource).expect("looked up above");
        record.waiters.push_back(waiter);
        Ok(AcquireStatus::Queued {
            position: queue_len + 1,
            wait_deadline_ms,
        })
    }

    /// What a retry of an earlier acquire learns: where that acquire stands
    /// now, under its original lease id.
    ///
    /// `attempt` is the number this retry got from [`Self::attach_attempt`].
    fn dedup_reply(
        &self,
        resource: &ResourceName,
        entry: &DedupEntry,
        attempt: u32,
    ) -> AcquireReply {
        let status = match entry.state {
            DedupState::Waiting => {
                let record = self.records.get(resource);
                let found = record.and_then(|r| {
                    r.waiters
                        .iter()
                        .position(|w| w.lease_id == entry.lease_id)
                        .map(|i| (i, &r.waiters[i]))
                });
                let (index, waiter) = found.expect("a waiting dedup entry has its waiter queued");
                AcquireStatus::Queued {
                    position: index as u32 + 1,
                    wait_deadline_ms: waiter.wait_deadline_ms,
                }
            }
            DedupState::Held { token } => {
                let holder = self
                    .records
                    .get(resource)
                    .and_then(|r| r.holder(entry.lease_id))
                    .expect("a held dedup entry has its holder");
                assert_eq!(holder.token, token);
                // The retry's caller counts its stop-by from when it sent the
                // retry, but the lease's time runs from its grant or last
                // renewal, possibly long before: answer what is left of the
                // stamped expiry, not the lease's full TTL. 0 when only a
                // leader change's allowance keeps it alive: renew at once.
                AcquireStatus::Held {
                    token,
                    expires_at_ms: holder.expires_at_ms,
                    lease_ttl_ms: holder.stamped_expires_at_ms.saturating_sub(self.now()),
                }
            }
            DedupState::Ended { token, ended, .. } => AcquireStatus::Ended { token, ended },
            DedupState::WaitEnded { ended, .. } => AcquireStatus::WaitEnded(ended),
        };
        AcquireReply {
            lease_id: entry.lease_id,
            deduplicated: true,
            status,
            attempt,
        }
    }

    /// A retry by request id of an acquire that still waits or holds
    /// attaches to it as the next attempt, so that a `Cancel` for an earlier
    /// attempt (whose caller went away) can no longer end a lease this retry
    /// may be told it holds. Returns the retry's attempt number; 0 when the
    /// acquire is over (nothing to attach to).
    fn attach_attempt(&mut self, resource: &ResourceName, entry: &DedupEntry) -> u32 {
        let Some(record) = self.records.get_mut(resource) else {
            debug_assert!(
                entry.state.forget_at_ms().is_some(),
                "a live entry has its record"
            );
            return 0;
        };
        let attempt = match entry.state {
            DedupState::Held { .. } => {
                &mut record
                    .holder_mut(entry.lease_id)
                    .expect("held by its entry's lease")
                    .attempt
            }
            DedupState::Waiting => {
                let waiter = record
                    .waiters
                    .iter_mut()
                    .find(|w| w.lease_id == entry.lease_id)
                    .expect("a waiting dedup entry has its waiter queued");
                &mut waiter.attempt
            }
            DedupState::Ended { .. } | DedupState::WaitEnded { .. } => return 0,
        };
        debug_assert!(*attempt >= FIRST_ATTEMPT);
        // Saturating: retries of one acquire are far fewer than u32::MAX
        // (each is a committed entry).
        *attempt = attempt.saturating_add(1);
        *attempt
    }

    fn renew(
        &mut self,
        resource: &ResourceName,
        owner: &Owner,
        lease_id: LeaseId,
        lease_ttl_ms: u64,
        events: &mut Vec<Event>,
    ) -> Result<Renewed, LockError> {
        self.check_owned(resource)?;
        self.settle(resource, events);
        let now = self.now();
        let max_hold_ms = self.limits.max_hold_ms;
        let Some(holder) = self.records.get(resource).and_then(|r| r.holder(lease_id)) else {
            return Err(LockError::LeaseNotHeld);
        };
        // A lease id is a bearer secret only together with its owner: one
        // that leaked (logs, a shared queue) is useless to anyone else.
        if holder.owner != *owner {
            return Err(LockError::PermissionDenied);
        }
        // 0 keeps the lease's current TTL.
        let lease_ttl_ms = if lease_ttl_ms == 0 {
            holder.lease_ttl_ms
        } else {
            lease_ttl_ms
        };
        self.check_ttl(lease_ttl_ms)?;
        let hold_deadline_ms = holder.granted_at_ms + max_hold_ms;
        if now >= hold_deadline_ms {
            return Err(LockError::HoldLimitReached {
                max_hold_ms,
                granted_at_ms: holder.granted_at_ms,
            });
        }
        let holder = (self.records.get_mut(resource))
            .and_then(|r| r.holder_mut(lease_id))
            .expect("found above");
        // Never shorten: the holder may have computed its stop-by deadline
        // from an earlier, longer grant whose reply it did receive.
        let wanted = (now + lease_ttl_ms).min(hold_deadline_ms);
        let old_expires = holder.expires_at_ms;
        holder.expires_at_ms = holder.expires_at_ms.max(wanted);
        holder.stamped_expires_at_ms = holder.stamped_expires_at_ms.max(wanted);
        holder.lease_ttl_ms = lease_ttl_ms;
        let new_expires = holder.expires_at_ms;
        // The TTL answered is the time the holder may count on from now, not
        // the TTL asked for: near the hold cap the renewal grants less, and a
        // client that computed its stop-by from the asked TTL would go on
        // working after the lock was freed. Counted to the stamped expiry,
        // never to a leader change's allowance on top of it (that allowance
        // covers the leaders' clocks, not the holder's).
        let granted_ttl_ms = holder.stamped_expires_at_ms - now;
        // Paired with the expiry check in `settle`: the lease cannot end
        // before the holder's deadline.
        debug_assert!(granted_ttl_ms > 0 && now + granted_ttl_ms <= new_expires);
        if new_expires != old_expires {
            let removed = (self.expiry_index).remove(&(old_expires, resource.clone(), lease_id));
            debug_assert!(removed);
            (self.expiry_index).insert((new_expires, resource.clone(), lease_id));
        }
        Ok(Renewed {
            expires_at_ms: new_expires,
            lease_ttl_ms: granted_ttl_ms,
        })
    }

    /// Ends the holding or wait of `lease_id` on `resource`. Returns false
    /// (changing nothing) when the lease neither holds nor waits, and
    /// refuses (changing nothing) when `owner` is given and the lease
    /// belongs to another identity.
    fn end(
        &mut self,
        resource: &ResourceName,
        owner: Option<&Owner>,
        lease_id: LeaseId,
        how: LeaseEnd,
        events: &mut Vec<Event>,
    ) -> Result<bool, LockError> {
        self.settle(resource, events);
        let Some(record) = self.records.get(resource) else {
            return Ok(false);
        };
        let not_theirs = |lease_owner: &Owner| owner.is_some_and(|o| o != lease_owner);
        if let Some(holder) = record.holder(lease_id) {
            if not_theirs(&holder.owner) {
                return Err(LockError::PermissionDenied);
            }
            self.end_holder(resource, lease_id, how, events);
            return Ok(true);
        }
        if let Some(pos) = record.waiters.iter().position(|w| w.lease_id == lease_id) {
            if not_theirs(&record.waiters[pos].owner) {
                return Err(LockError::PermissionDenied);
            }
            self.remove_waiter(resource, pos, WaitEnd::Cancelled, events);
            return Ok(true);
        }
        Ok(false)
    }

    /// The latest attempt attached to `lease_id` on `resource`, if it holds
    /// or waits there (call after settling, so an expired lease has none).
    fn latest_attempt(&self, resource: &ResourceName, lease_id: LeaseId) -> Option<u32> {
        let record = self.records.get(resource)?;
        if let Some(holder) = record.holder(lease_id) {
            return Some(holder.attempt);
        }
        record
            .waiters
            .iter()
            .find(|w| w.lease_id == lease_id)
            .map(|w| w.attempt)
    }

    /// Refuses a value that would take the shard's value bytes past
    /// `MAX_VALUE_BYTES_PER_SHARD` once `freed` bytes (a value it replaces)
    /// are given back. An empty value always fits.
    fn check_value_room(&self, freed: u64, value: &HolderValue) -> Result<(), LockError> {
        let after = self.value_bytes - freed + value.len() as u64;
        if !value.is_empty() && after > MAX_VALUE_BYTES_PER_SHARD {
            return Err(LockError::ValuesFull {
                limit_bytes: MAX_VALUE_BYTES_PER_SHARD,
            });
        }
        Ok(())
    }

    /// `Proclaim`: the holder replaces the value it publishes. Answers the
    /// lease's token. Like a renew, refused unless `lease_id` holds the
    /// resource now (an expired lease is settled first) and `owner` took it.
    fn proclaim(
        &mut self,
        resource: &ResourceName,
        owner: &Owner,
        lease_id: LeaseId,
        value: &HolderValue,
        events: &mut Vec<Event>,
    ) -> Result<FencingToken, LockError> {
        self.check_owned(resource)?;
        self.settle(resource, events);
        let Some(holder) = self.records.get(resource).and_then(|r| r.holder(lease_id)) else {
            return Err(LockError::LeaseNotHeld);
        };
        if holder.owner != *owner {
            return Err(LockError::PermissionDenied);
        }
        let old_len = holder.value.len() as u64;
        self.check_value_room(old_len, value)?;
        let holder = (self.records.get_mut(resource))
            .and_then(|r| r.holder_mut(lease_id))
            .expect("looked up above");
        holder.value = value.clone();
        let token = holder.token;
        self.value_bytes = self.value_bytes - old_len + value.len() as u64;
        events.push(Event::ValueChanged {
            resource: resource.clone(),
            lease_id,
            token,
        });
        Ok(token)
    }

    /// Counts a held resource in (or out of) its tenant's total.
    pub(crate) fn count_held(&mut self, resource: &ResourceName, held: bool) {
        let tenant = resource.tenant();
        if held {
            // Per grant: allocate the tenant's key only the first time.
            match self.tenant_held.get_mut(tenant) {
                Some(count) => *count += 1,
                None => {
                    self.tenant_held.insert(tenant.to_owned(), 1);
                }
            }
            return;
        }
        let count = self
            .tenant_held
            .get_mut(tenant)
            .expect("a held resource is counted for its tenant");
        *count -= 1;
        if *count == 0 {
            self.tenant_held.remove(tenant);
        }
    }

    /// Expires every holder of `resource` whose lease ran out by the
    /// table's clock. Every command that touches a resource settles it
    /// first, so an expired lease never blocks, renews or answers as held.
    fn settle(&mut self, resource: &ResourceName, events: &mut Vec<Event>) {
        let now = self.now();
        let Some(record) = self.records.get(resource) else {
            return;
        };
        let due: Vec<LeaseId> = (record.holders.iter())
            .filter(|h| h.expires_at_ms <= now)
            .map(|h| h.lease_id)
            .collect();
        if due.is_empty() {
            return;
        }
        // Every due holding ends before anyone is granted.
        for lease_id in due {
            self.remove_holder(resource, lease_id, LeaseEnd::Expired, events);
        }
        self.grant_waiters(resource, events);
    }

    /// Removes the holding of `lease_id`, records how it ended, and grants
    /// the waiters it was keeping out ([`Self::grant_waiters`]).
    fn end_holder(
        &mut self,
        resource: &ResourceName,
        lease_id: LeaseId,
        how: LeaseEnd,
        events: &mut Vec<Event>,
    ) {
        self.remove_holder(resource, lease_id, how, events);
        self.grant_waiters(resource, events);
    }

    /// [`Self::end_holder`] without the grants: the caller grants (or
    /// deletes the emptied record) with [`Self::grant_waiters`] next.
    fn remove_holder(
        &mut self,
        resource: &ResourceName,
        lease_id: LeaseId,
        how: LeaseEnd,
        events: &mut Vec<Event>,
    ) {
        let record = self.records.get_mut(resource).expect("caller checked");
        let pos = (record.holders.iter())
            .position(|h| h.lease_id == lease_id)
            .expect("caller checked");
        let holder = record.holders.remove(pos);
        self.count_held(resource, false);
        self.value_bytes -= holder.value.len() as u64;
        let removed =
            (self.expiry_index).remove(&(holder.expires_at_ms, resource.clone(), lease_id));
        debug_assert!(removed);
        self.finish_dedup(
            resource,
            &holder.owner,
            &holder.request_id,
            DedupStateEnd::Lease {
                token: holder.token,
                ended: how,
            },
        );
        events.push(Event::LeaseEnded {
            resource: resource.clone(),
            lease_id,
            token: holder.token,
            ended: how,
        });
    }

    /// Grants `resource`'s waiters from the head of the queue for as long
    /// as the head fits beside the holders (FIFO across modes: a waiter
    /// that does not fit keeps everyone behind it waiting). A head whose
    /// wait ran out, or that cannot get a token, ends its wait instead.
    /// Deletes the record when nobody is left.
    fn grant_waiters(&mut self, resource: &ResourceName, events: &mut Vec<Event>) {
        let now = self.now();
        loop {
            let record = self.records.get_mut(resource).expect("caller checked");
            let fits = record.waiters.front().is_some_and(|w| record.fits(w.mode));
            if !fits {
                break;
            }
            let waiter = record.waiters.pop_front().expect("looked at");
            self.unindex_waiter(resource, &waiter);
            let ended = if waiter.wait_deadline_ms <= now {
                WaitEnd::TimedOut
            } else {
                match self.mint(MAX_POSITION) {
                    Ok(token) => {
                        self.set_dedup_state(
                            resource,
                            &waiter.owner,
                            &waiter.request_id,
                            DedupState::Held { token },
                        );
                        let holder = Holder {
                            lease_id: waiter.lease_id,
                            owner: waiter.owner,
                            request_id: waiter.request_id,
                            token,
                            granted_at_ms: now,
                            lease_ttl_ms: waiter.lease_ttl_ms,
                            stamped_expires_at_ms: 0,
                            expires_at_ms: 0,
                            attempt: waiter.attempt,
                            // `unindex_waiter` took the value out;
                            // `add_holder` counts it back in.
                            value: waiter.value,
                            mode: waiter.mode,
                        };
                        self.add_holder(resource, holder, true, events);
                        continue;
                    }
                    Err(_) => WaitEnd::TokenSpaceExhausted,
                }
            };
            self.finish_dedup(
                resource,
                &waiter.owner,
                &waiter.request_id,
                DedupStateEnd::Wait(ended),
            );
            events.push(Event::WaitEnded {
                resource: resource.clone(),
                lease_id: waiter.lease_id,
                request_id: waiter.request_id,
                ended,
            });
        }
        let record = self.records.get(resource).expect("caller checked");
        if record.holders.is_empty() {
            // Anything fits beside no holders: the loop emptied the queue.
            assert!(record.waiters.is_empty(), "{resource}: waiters left unheld");
            self.records.remove(resource);
        }
    }

    /// Removes the waiter at `pos` of `resource`'s queue, and grants the
    /// ones behind it that it was keeping out.
    fn remove_waiter(
        &mut self,
        resource: &ResourceName,
        pos: usize,
        ended: WaitEnd,
        events: &mut Vec<Event>,
    ) {
        let record = self.records.get_mut(resource).expect("caller checked");
        let waiter = record.waiters.remove(pos).expect("caller checked");
        self.unindex_waiter(resource, &waiter);
        self.finish_dedup(
            resource,
            &waiter.owner,
            &waiter.request_id,
            DedupStateEnd::Wait(ended),
        );
        events.push(Event::WaitEnded {
            resource: resource.clone(),
            lease_id: waiter.lease_id,
            request_id: waiter.request_id,
            ended,
        });
        if pos == 0 {
            self.grant_waiters(resource, events);
        }
    }

    pub(crate) fn unindex_waiter(&mut self, resource: &ResourceName, waiter: &Waiter) {
        self.value_bytes -= waiter.value.len() as u64;
        let removed =
            self.wait_index
                .remove(&(waiter.wait_deadline_ms, resource.clone(), waiter.lease_id));
        debug_assert!(removed);
        let tenant = resource.tenant();
        let count = self
            .tenant_waiters
            .get_mut(tenant)
            .expect("a queued waiter is counted for its tenant");
        *count -= 1;
        if *count == 0 {
            self.tenant_waiters.remove(tenant);
        }
    }

    fn set_dedup_state(
        &mut self,
        resource: &ResourceName,
        owner: &Owner,
        request_id: &RequestId,
        state: DedupState,
    ) {
        let probe = DedupKey::new(resource, owner, request_id);
        let (stored, entry) = (self.dedup.get_key_value_mut(&probe))
            .expect("every live lease and waiter has a dedup entry");
        debug_assert!(entry.state.forget_at_ms().is_none());
        entry.state = state;
        if let Some(at) = state.forget_at_ms() {
            // The key stored in the table, not the probe: the index shares
            // its allocation (one copy of the bytes per entry).
            let key = stored.clone();
            self.forget_index.insert((at, key));
        }
    }

    fn finish_dedup(
        &mut self,
        resource: &ResourceName,
        owner: &Owner,
        request_id: &RequestId,
        end: DedupStateEnd,
    ) {
        let forget_at_ms = self.now() + self.limits.dedup_retention_ms;
        let state = match end {
            DedupStateEnd::Lease { token, ended } => DedupState::Ended {
                token,
                ended,
                forget_at_ms,
            },
            DedupStateEnd::Wait(ended) => DedupState::WaitEnded {
                ended,
                forget_at_ms,
            },
        };
        self.set_dedup_state(resource, owner, request_id, state);
    }

    /// Retires what is due by the table's clock, oldest first, at most
    /// `max_retired_per_tick` items in all.
    fn tick(&mut self, events: &mut Vec<Event>) -> TickReport {
        let now = self.now();
        let mut budget = self.limits.max_retired_per_tick;
        let mut report = TickReport::default();
        while budget > 0 {
            let Some((at, name, lease_id)) = self.expiry_index.first().cloned() else {
                break;
            };
            if at > now {
                break;
            }
            self.end_holder(&name, lease_id, LeaseEnd::Expired, events);
            report.leases_expired += 1;
            budget -= 1;
        }
        while budget > 0 {
            let Some((at, name, lease_id)) = self.wait_index.first().cloned() else {
                break;
            };
            if at > now {
                break;
            }
            let record = self
                .records
                .get(&name)
                .expect("indexed waiter has a record");
            let pos = record
                .waiters
                .iter()
                .position(|w| w.lease_id == lease_id)
                .expect("indexed waiter is queued");
            self.remove_waiter(&name, pos, WaitEnd::TimedOut, events);
            report.waiters_timed_out += 1;
            budget -= 1;
        }
        while budget > 0 {
            let Some((at, key)) = self.forget_index.first().cloned() else {
                break;
            };
            if at > now {
                break;
            }
            self.forget_index.remove(&(at, key.clone()));
            let removed = self.dedup.remove(&key);
            debug_assert!(removed.is_some());
            report.dedup_forgotten += 1;
            budget -= 1;
        }
        report.more_due = self.next_due_ms().is_some_and(|at| at <= now);
        report
    }

    // ----- reads -----

    /// The holder and queue of one resource, as of the last applied entry.
    /// A lease past its expiry is shown until a command retires it; compare
    /// `expires_at_ms` with the current time to tell.
    pub fn view(&self, resource: &ResourceName) -> Option<LockView> {
        self.records.get(resource).map(|r| {
            let first = &r.holders[0];
            LockView {
                lease_id: first.lease_id,
                token: first.token,
                expires_at_ms: first.expires_at_ms,
                granted_at_ms: first.granted_at_ms,
                queue_len: r.waiters.len() as u32,
                value: first.value.clone(),
                mode: first.mode,
                last_token: r.last_token,
                holders: (r.holders.iter())
                    .map(|h| HolderView {
                        lease_id: h.lease_id,
                        token: h.token,
                        expires_at_ms: h.expires_at_ms,
                        granted_at_ms: h.granted_at_ms,
                        value: h.value.clone(),
                        mode: h.mode,
                    })
                    .collect(),
            }
        })
    }

    /// Bytes of holder values the shard keeps (holders and waiters).
    pub fn value_bytes(&self) -> u64 {
        self.value_bytes
    }

    /// When the next lease expiry, wait deadline or dedup forget time falls
    /// due (by the table's clock): when the leader should propose a `Tick`.
    pub fn next_due_ms(&self) -> Option<u64> {
        [
            self.expiry_index.first().map(|e| e.0),
            self.wait_index.first().map(|e| e.0),
            self.forget_index.first().map(|e| e.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Positions left before this epoch refuses new acquires. The placement
    /// layer hands the shard a new epoch long before this reaches zero.
    pub fn token_positions_left(&self) -> u64 {
        if self.epoch == 0 {
            return POSITION_SOFT_LIMIT;
        }
        POSITION_SOFT_LIMIT.saturating_sub(self.next_position() - 1)
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }
    /// Refuses a resource whose slot this shard does not serve.
    pub(crate) fn check_owned(&self, resource: &ResourceName) -> Result<(), LockError> {
        let slot = slot_of(resource);
        if self.owned.contains(slot) {
            Ok(())
        } else {
            Err(LockError::WrongShard {
                slot,
                epoch: self.epoch,
            })
        }
    }

    /// Whether this shard serves `resource` (reads check it too).
    pub fn owns(&self, resource: &ResourceName) -> bool {
        self.owned.contains(slot_of(resource))
    }

    /// The slots this shard serves.
    pub fn owned_slots(&self) -> &SlotSet {
        &self.owned
    }

    /// Migration ids whose export is still kept.
    pub fn pending_exports(&self) -> Vec<u64> {
        self.exports.keys().copied().collect()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn leader_term(&self) -> u64 {
        self.leader_term
    }
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }
    pub fn max_token(&self) -> FencingToken {
        self.max_token
    }
    /// Resources currently held.
    pub fn held_count(&self) -> usize {
        self.records.len()
    }
    /// How many holdings `resource` has (0: free). A lookup, no copy: the
    /// watch log asks per applied event.
    pub fn holders_of(&self, resource: &ResourceName) -> usize {
        self.records.get(resource).map_or(0, |r| r.holders.len())
    }

    /// The value `lease_id`'s holding of `resource` publishes, if it holds.
    pub fn value_of(&self, resource: &ResourceName, lease_id: LeaseId) -> Option<&HolderValue> {
        Some(&self.records.get(resource)?.holder(lease_id)?.value)
    }
    /// Waiters queued across all resources.
    pub fn waiter_count(&self) -> usize {
        self.wait_index.len()
    }
    pub fn dedup_count(&self) -> usize {
        self.dedup.len()
    }

    /// Checks every structural invariant of the table; `Err` names the first
    /// one broken. Run after every apply in debug builds and by the tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let kept = (self.records.keys_unordered())
            .map(|name| (name.as_str(), slot_of(name)))
            .chain(
                self.dedup
                    .keys_unordered()
                    .map(|k| (k.resource(), k.slot())),
            );
        for (name, slot) in kept {
            if !self.owned.contains(slot) {
                return Err(format!("{name} kept in slot {slot} not owned"));
            }
        }
        if self.exports.len() > crate::limits::MAX_PENDING_EXPORTS {
            return Err("too many pending exports".into());
        }
        let mut expiry = BTreeSet::new();
        let mut waits = BTreeSet::new();
        let mut tenants: BTreeMap<String, u32> = BTreeMap::new();
        let mut held: BTreeMap<String, u32> = BTreeMap::new();
        let mut live_dedup = 0usize;
        let mut value_bytes = 0u64;
        if self.epoch > MAX_EPOCH || self.last_position > MAX_POSITION {
            return Err("epoch or position out of range".into());
        }
        if self.epoch != 0 && self.applied_index <= self.epoch_base_index {
            return Err("epoch starts after the applied index".into());
        }
        if self.epoch == 0 && (!self.records.is_empty() || self.max_token != FencingToken::NONE) {
            return Err("tokens before any epoch".into());
        }
        if self.max_token.epoch() > self.epoch {
            return Err(format!(
                "max token {} beyond epoch {}",
                self.max_token, self.epoch
            ));
        }
        // The next mint must be above every token so far (`mint` asserts
        // it): in the current epoch, nothing beyond the last position.
        if self.max_token.epoch() == self.epoch && self.max_token.position() > self.last_position {
            return Err(format!(
                "max token {} beyond the last position {}",
                self.max_token, self.last_position
            ));
        }
        for (name, record) in self.records.iter_unordered() {
            // Invariant 1: the holders fit together (one exclusive holder,
            // or shared ones only, or at most a semaphore's permits), all
            // of one kind with the waiters, in grant order.
            let Some(first) = record.holders.first() else {
                return Err(format!("{name}: record without a holder"));
            };
            let kind = first.mode;
            if kind.validate().is_err() {
                return Err(format!("{name}: mode {kind:?} out of range"));
            }
            let modes = || record.holders.iter().map(|h| h.mode);
            if modes().any(|m| !m.same_kind(&kind))
                || record.waiters.iter().any(|w| !w.mode.same_kind(&kind))
            {
                return Err(format!("{name}: holdings of different kinds"));
            }
            // Of one kind, the holdings fit together exactly when the last
            // fits beside the others (fitting is symmetric within a kind).
            let (last, others) = record.holders.split_last().expect("not empty");
            if !last.mode.fits_beside(others.iter().map(|h| h.mode)) {
                return Err(format!(
                    "{name}: {:?} holding beside {} others",
                    last.mode,
                    others.len()
                ));
            }
            if record.holders.len() > MAX_HOLDERS_PER_RESOURCE as usize {
                return Err(format!("{name}: over the holders cap"));
            }
            if (record.holders.windows(2)).any(|pair| pair[0].token >= pair[1].token) {
                return Err(format!("{name}: holders out of grant order"));
            }
            // The last token is the newest grant's: at least every
            // holding's, above none minted, and an exclusive holder's own
            // (nothing is granted beside it, so nothing after it).
            if record.last_token < last.token || record.last_token > self.max_token {
                return Err(format!("{name}: last token {}", record.last_token));
            }
            if kind == AcquireMode::Exclusive && record.last_token != first.token {
                return Err(format!("{name}: last token beyond the exclusive holder's"));
            }
            // FIFO: a waiter at the head that fits would have been granted.
            if record.waiters.front().is_some_and(|w| record.fits(w.mode)) {
                return Err(format!("{name}: head waiter fits but waits"));
            }
            let mut ids = BTreeSet::new();
            for h in &record.holders {
                // Each holding is the one the dedup table says holds.
                if h.token > self.max_token || h.token == FencingToken::NONE {
                    return Err(format!("{name}: holder token {} not minted", h.token));
                }
                if h.expires_at_ms < h.stamped_expires_at_ms {
                    return Err(format!("{name}: expiry below its stamp"));
                }
                if h.attempt < FIRST_ATTEMPT {
                    return Err(format!("{name}: holder attempt {}", h.attempt));
                }
                if h.value.len() > crate::limits::MAX_HOLDER_VALUE_BYTES {
                    return Err(format!("{name}: holder value over its cap"));
                }
                if !ids.insert(h.lease_id) {
                    return Err(format!("{name}: lease id {} twice", h.lease_id));
                }
                value_bytes += h.value.len() as u64;
                expiry.insert((h.expires_at_ms, name.clone(), h.lease_id));
                *held.entry(name.tenant().to_owned()).or_default() += 1;
                let key = DedupKey::new(name, &h.owner, &h.request_id);
                match self.dedup.get(&key) {
                    Some(e)
                        if e.lease_id == h.lease_id
                            && e.state == DedupState::Held { token: h.token } => {}
                    other => return Err(format!("{name}: holder dedup entry is {other:?}")),
                }
                live_dedup += 1;
            }
            if record.waiters.len() > self.limits.max_waiters_per_resource as usize {
                return Err(format!("{name}: queue over its cap"));
            }
            for w in &record.waiters {
                if !ids.insert(w.lease_id) {
                    return Err(format!("{name}: lease id {} twice", w.lease_id));
                }
                if w.attempt < FIRST_ATTEMPT {
                    return Err(format!("{name}: waiter attempt {}", w.attempt));
                }
                if w.value.len() > crate::limits::MAX_HOLDER_VALUE_BYTES {
                    return Err(format!("{name}: waiter value over its cap"));
                }
                value_bytes += w.value.len() as u64;
                waits.insert((w.wait_deadline_ms, name.clone(), w.lease_id));
                *tenants.entry(name.tenant().to_owned()).or_default() += 1;
                let key = DedupKey::new(name, &w.owner, &w.request_id);
                match self.dedup.get(&key) {
                    Some(e) if e.lease_id == w.lease_id && e.state == DedupState::Waiting => {}
                    other => return Err(format!("{name}: waiter dedup entry is {other:?}")),
                }
                live_dedup += 1;
            }
        }
        if expiry != self.expiry_index {
            return Err("expiry index out of sync".into());
        }
        if waits != self.wait_index {
            return Err("wait index out of sync".into());
        }
        if tenants != self.tenant_waiters {
            return Err("tenant waiter counts out of sync".into());
        }
        if held != self.tenant_held {
            return Err("tenant held counts out of sync".into());
        }
        if value_bytes != self.value_bytes {
            return Err(format!(
                "value bytes out of sync: kept {value_bytes}, counted {}",
                self.value_bytes
            ));
        }
        if tenants
            .values()
            .any(|&n| n > self.limits.max_waiters_per_tenant)
        {
            return Err("tenant over its waiter cap".into());
        }
        let forget: BTreeSet<(u64, DedupKey)> = self
            .dedup
            .iter()
            .filter_map(|(k, e)| e.state.forget_at_ms().map(|at| (at, k.clone())))
            .collect();
        if forget != self.forget_index {
            return Err("forget index out of sync".into());
        }
        if forget.len() + live_dedup != self.dedup.len() {
            return Err("dedup entry for a lease that neither holds nor waits".into());
        }
        Ok(())
    }
}

/// How a lease or wait ended, before the forget time is attached.
enum DedupStateEnd {
    Lease {
        token: FencingToken,
        ended: LeaseEnd,
    },
    Wait(WaitEnd),
}
