//! Moving the lock state of some slots from one shard to another.
//!
//! Resharding is three commands, each applied through its shard's own log:
//!
//! 1. `ExportSlots` on the source: from this entry on the source refuses
//!    every request for those slots (`WrongShard`), and their records and
//!    dedup entries leave the table for an export kept in the replicated
//!    state, so whichever replica leads next can hand it over again.
//! 2. `ImportSlots` on the target: the export enters the table — holders
//!    keep their lease ids and tokens, and the time each had left (its
//!    times moved from the source's lease clock to the target's, when the
//!    import carries the source's clock; plus the clock allowance a leader
//!    change gives), waiters keep their order — and the
//!    target moves to a fresh epoch above every epoch handed out before, so
//!    the next token it mints for any moved resource is above every token
//!    the source minted for it.
//! 3. `DropExport` on the source once the target has applied the import.
//!
//! Between 1 and 2 nobody serves the slots (requests are refused with a
//! retry hint); that window is what makes "one owner at a time" hold
//! without any clock. Both sides are idempotent by migration id.
//!
//! 4. `CloseMigration` on either shard, when the orchestrator must know
//!    for certain what a shard did (a step was refused, or its outcome is
//!    unknown): from that entry on no export or import of the migration can
//!    change the shard any more, and the reply says what it did before. The
//!    one exception is the source taking its own kept export back (the
//!    roll-back of a migration whose target was closed without importing).
//!    `last_imported_migration` is the fence: ids up to it are settled here
//!    (an import, a close and a `DropExport` each settle their id).

use crate::codec::{decode_export, encode_export, Export};
use crate::error::LockError;
use crate::limits::{
    MAX_CLOCK_MS, MAX_CLOCK_OFFSET_ALLOWANCE_MS, MAX_MIGRATION_DATA_BYTES, MAX_PENDING_EXPORTS,
    MAX_STORED_MS,
};
use crate::machine::{DedupEntry, DedupKey, DedupState, LockTable, PendingExport, Record};
use crate::name::ResourceName;
use crate::slots::{slot_of, SlotSet};
use crate::token::{FencingToken, MAX_EPOCH};
use crate::types::{ApplyContext, Event, Reply};

/// How an import treats the exported times (see `Command::ImportSlots`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ImportTimes {
    pub allowance_ms: u64,
    pub export_clock_ms: Option<u64>,
}

impl LockTable {
    pub(crate) fn export_slots(
        &mut self,
        migration_id: u64,
        slots: &SlotSet,
        events: &mut Vec<Event>,
    ) -> Result<Reply, LockError> {
        if let Some(done) = self.exports.get(&migration_id) {
            if done.slots != *slots {
                return Err(refused(format!(
                    "migration {migration_id} already exported other slots {}",
                    done.slots
                )));
            }
            return Ok(Reply::Exported {
                data: done.data.to_vec(),
                resources: done.resources,
                clock_ms: self.clock_ms,
            });
        }
        if migration_id == 0 || slots.is_empty() {
            return Err(LockError::InvalidCommand {
                reason: "export needs a migration id and at least one slot",
            });
        }
        if migration_id <= self.last_imported_migration {
            return Err(closed(migration_id));
        }
        if !slots.is_subset(&self.owned) {
            return Err(refused(format!(
                "slots {} are not served by this shard",
                slots.difference(&self.owned)
            )));
        }
        if self.exports.len() >= MAX_PENDING_EXPORTS {
            return Err(refused(format!(
                "{MAX_PENDING_EXPORTS} exports are still waiting for their targets"
            )));
        }
        let moving = |name: &ResourceName| slots.contains(slot_of(name));
        let records: Vec<(ResourceName, Record)> = self
            .records
            .iter()
            .filter(|(name, _)| moving(name))
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        let dedup: Vec<(DedupKey, DedupEntry)> = self
            .dedup
            .iter()
            .filter(|(key, _)| slots.contains(key.slot()))
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        let max_token = records
            .iter()
            .map(|(_, r)| r.last_token)
            .chain(dedup.iter().filter_map(|(_, e)| e.state.token()))
            .max()
            .unwrap_or(FencingToken::NONE);
        let export = Export {
            max_token,
            records,
            dedup,
        };
        let data = encode_export(&export);
        // Refuse before changing anything: a refused command changes nothing.
        if data.len() > MAX_MIGRATION_DATA_BYTES {
            return Err(refused(format!(
                "the slots hold {} bytes of lock state, more than one migration may carry \
                 ({MAX_MIGRATION_DATA_BYTES}); move fewer slots at a time",
                data.len()
            )));
        }
        for (name, record) in &export.records {
            self.remove_record_indexed(name);
            for waiter in &record.waiters {
                events.push(Event::WaitMoved {
                    resource: name.clone(),
                    lease_id: waiter.lease_id,
                });
            }
        }
        for (key, _) in &export.dedup {
            self.remove_dedup_indexed(key);
        }
        self.owned = self.owned.difference(slots);
        let resources = export.records.len() as u32;
        self.exports.insert(
            migration_id,
            PendingExport {
                slots: *slots,
                data: data.as_slice().into(),
                resources,
            },
        );
        debug_assert!(self.exports.len() <= MAX_PENDING_EXPORTS);
        Ok(Reply::Exported {
            data,
            resources,
            clock_ms: self.clock_ms,
        })
    }

    pub(crate) fn import_slots(
        &mut self,
        migration_id: u64,
        epoch: u64,
        slots: &SlotSet,
        data: &[u8],
        times: ImportTimes,
        ctx: &ApplyContext,
    ) -> Result<Reply, LockError> {
        let ImportTimes {
            allowance_ms,
            export_clock_ms,
        } = times;
        // The source taking its own kept export back (a roll-back after the
        // target was closed without it, or a leftover an older orchestrator
        // abandoned): allowed whatever happened here since, because the
        // export says these slots left this shard in this migration and
        // nobody else imported them (the orchestrator decides a take-back
        // only from the target's close, or from a map that still routes
        // them here). Checked first: the shard may have taken part in later
        // migrations of other slots meanwhile.
        let own_export = self.exports.get(&migration_id).map(|e| e.slots);
        let taking_back = migration_id != 0 && own_export == Some(*slots);
        if taking_back && slots.is_subset(&self.owned) {
            // Taken back before: nothing to do.
            return Ok(Reply::Imported { resources: 0 });
        }
        if !taking_back && migration_id != 0 && self.later_than(migration_id) {
            // This shard already took part in a later migration: this one
            // has ended, whatever the caller believes.
            return Err(closed(migration_id));
        }
        if !taking_back && migration_id != 0 && migration_id <= self.last_imported_migration {
            if slots.is_subset(&self.owned) {
                // Imported before (or the slots are this shard's anyway):
                // nothing to do.
                return Ok(Reply::Imported { resources: 0 });
            }
            // Settled here without these slots, and not a take-back.
            return Err(closed(migration_id));
        }
        if migration_id == 0 || slots.is_empty() || allowance_ms > MAX_CLOCK_OFFSET_ALLOWANCE_MS {
            return Err(LockError::InvalidCommand {
                reason: "import needs a migration id, slots and a sane allowance",
            });
        }
        if epoch == 0 || epoch > MAX_EPOCH {
            return Err(LockError::InvalidCommand {
                reason: "import epoch out of range",
            });
        }
        if export_clock_ms.is_some_and(|ms| ms > MAX_CLOCK_MS) {
            return Err(LockError::InvalidCommand {
                reason: "export clock out of range",
            });
        }
        // From the source's lease clock to this shard's: `clock_ms` has
        // advanced to this entry's stamp, read after the export's answer.
        let shift_ms = export_clock_ms.map_or(0, |at| i128::from(self.clock_ms) - i128::from(at));
        if epoch <= self.epoch {
            return Err(LockError::StaleEpoch {
                entry_epoch: epoch,
                current_epoch: self.epoch,
            });
        }
        if !slots.is_disjoint(&self.owned) {
            return Err(refused(format!(
                "slots {} are already served by this shard",
                slots.difference(&slots.difference(&self.owned))
            )));
        }
        let export = decode_export(data).map_err(|e| refused(format!("export: {e}")))?;
        let outside = (export.records.iter())
            .map(|(n, _)| (n.as_str(), slot_of(n)))
            .chain(export.dedup.iter().map(|(k, _)| (k.resource(), k.slot())))
            .find(|(_, slot)| !slots.contains(*slot))
            .map(|(name, _)| name);
        if let Some(name) = outside {
            return Err(refused(format!("export holds {name}, outside the slots")));
        }
        if export.max_token.epoch() >= epoch {
            return Err(refused(format!(
                "export holds token {} from an epoch not below {epoch}",
                export.max_token
            )));
        }
        if self.records.len() + export.records.len() > self.limits.max_records as usize
            || self.dedup.len() + export.dedup.len() > self.limits.max_dedup_entries as usize
        {
            return Err(refused(
                "the target shard has no room for the moved state".into(),
            ));
        }
        let resources = export.records.len() as u32;
        // The export must be a consistent table of its own (holders match
        // their dedup entries, tokens fit the epochs, ...): check it alone,
        // in a scratch table, before it can touch this one. Bytes from a
        // peer are not trusted to be what a source shard wrote.
        let mut scratch = LockTable::with_slots(self.limits.clone(), *slots)
            .map_err(|e| refused(format!("limits: {e}")))?;
        scratch.epoch = epoch;
        scratch.applied_index = ctx.index;
        scratch.epoch_base_index = ctx.index - 1;
        scratch.max_token = export.max_token;
        for (name, mut record) in export.records {
            shift_record(&mut record, shift_ms);
            // Margin (and, without the source's clock, the assumption that
            // the clocks agree): the allowance a new leader gives, bounded
            // by the stamp.
            for holder in record.holders.iter_mut() {
                holder.expires_at_ms = holder
                    .expires_at_ms
                    .max(holder.stamped_expires_at_ms + allowance_ms);
            }
            if !scratch.insert_record_indexed(name, record) {
                return Err(refused("export lists a resource twice".into()));
            }
        }
        for (key, mut entry) in export.dedup {
            shift_dedup(&mut entry, shift_ms);
            if !scratch.insert_dedup_indexed(key, entry) {
                return Err(refused("export lists a dedup entry twice".into()));
            }
        }
        if let Err(broken) = scratch.check_invariants() {
            return Err(refused(format!("export is inconsistent: {broken}")));
        }
        let records = std::mem::take(&mut scratch.records);
        let dedup = std::mem::take(&mut scratch.dedup);
        for (name, record) in records.into_unordered() {
            let inserted = self.insert_record_indexed(name, record);
            debug_assert!(inserted, "slots were disjoint, so names are new");
        }
        for (key, entry) in dedup.into_unordered() {
            let inserted = self.insert_dedup_indexed(key, entry);
            debug_assert!(inserted, "slots were disjoint, so keys are new");
        }
        self.owned = self.owned.union(slots);
        self.max_token = self.max_token.max(export.max_token);
        // A new epoch starts at this entry (position 1), as in `advance`.
        self.epoch = epoch;
        self.epoch_base_index = ctx.index - 1;
        self.last_position = 0;
        self.last_imported_migration = self.last_imported_migration.max(migration_id);
        debug_assert!(self.max_token.epoch() < self.epoch);
        Ok(Reply::Imported { resources })
    }

    /// `CloseMigration`: settles `migration_id` (and every lower id) on this
    /// shard and reports what the shard did for it. Applied through the
    /// log, so the answer is final: a proposal of an export or import of
    /// this migration still in flight cannot apply after it.
    pub(crate) fn close_migration(
        &mut self,
        migration_id: u64,
        slots: &SlotSet,
    ) -> Result<Reply, LockError> {
        if migration_id == 0 {
            return Err(LockError::InvalidCommand {
                reason: "close needs a migration id",
            });
        }
        let later_migration = self.later_than(migration_id);
        self.last_imported_migration = self.last_imported_migration.max(migration_id);
        Ok(Reply::MigrationClosed {
            pending_export: self.exports.get(&migration_id).map(|e| e.slots),
            owns_slots: slots.is_subset(&self.owned),
            epoch: self.epoch,
            later_migration,
        })
    }

    /// Whether this shard settled, or keeps the export of, a migration
    /// after `migration_id` (so that one has ended: one runs at a time).
    fn later_than(&self, migration_id: u64) -> bool {
        self.last_imported_migration > migration_id
            || (self.exports.last_key_value()).is_some_and(|(id, _)| *id > migration_id)
    }

    /// `DropExport`: forgets the export and settles the migration here (a
    /// stale orchestrator's export or import of it is refused from now on).
    pub(crate) fn drop_export(&mut self, migration_id: u64) -> Reply {
        self.last_imported_migration = self.last_imported_migration.max(migration_id);
        Reply::ExportDropped {
            existed: self.exports.remove(&migration_id).is_some(),
        }
    }

    /// Inserts a record with its index entries; false if the name exists.
    pub(crate) fn insert_record_indexed(&mut self, name: ResourceName, record: Record) -> bool {
        if self.records.contains_key(&name) {
            return false;
        }
        for holder in &record.holders {
            self.value_bytes += holder.value.len() as u64;
            self.expiry_index
                .insert((holder.expires_at_ms, name.clone(), holder.lease_id));
            self.count_held(&name, true);
        }
        for waiter in &record.waiters {
            self.value_bytes += waiter.value.len() as u64;
            self.wait_index
                .insert((waiter.wait_deadline_ms, name.clone(), waiter.lease_id));
            *self
                .tenant_waiters
                .entry(name.tenant().to_owned())
                .or_default() += 1;
        }
        self.records.insert(name, record);
        true
    }

    fn remove_record_indexed(&mut self, name: &ResourceName) {
        let record = self.records.remove(name).expect("caller listed it");
        for holder in &record.holders {
            self.count_held(name, false);
            self.value_bytes -= holder.value.len() as u64;
            let removed =
                (self.expiry_index).remove(&(holder.expires_at_ms, name.clone(), holder.lease_id));
            debug_assert!(removed);
        }
        for waiter in &record.waiters {
            self.unindex_waiter(name, waiter);
        }
    }

    /// Inserts a dedup entry with its index entry; false if the key exists.
    pub(crate) fn insert_dedup_indexed(&mut self, key: DedupKey, entry: DedupEntry) -> bool {
        if self.dedup.contains_key(&key) {
            return false;
        }
        if let Some(at) = entry.state.forget_at_ms() {
            self.forget_index.insert((at, key.clone()));
        }
        self.dedup.insert(key, entry);
        true
    }

    fn remove_dedup_indexed(&mut self, key: &DedupKey) {
        let entry = self.dedup.remove(key).expect("caller listed it");
        if let Some(at) = entry.state.forget_at_ms() {
            let removed = self.forget_index.remove(&(at, key.clone()));
            debug_assert!(removed);
        }
    }
}

fn closed(migration_id: u64) -> LockError {
    refused(format!(
        "migration {migration_id} is settled on this shard (imported or closed)"
    ))
}

fn refused(reason: String) -> LockError {
    LockError::MigrationRefused { reason }
}

/// `ms` moved by `shift_ms` from one lease clock to another, kept within
/// what a table stores (a time before the clock's start is long past).
fn shifted(ms: u64, shift_ms: i128) -> u64 {
    (i128::from(ms) + shift_ms).clamp(0, i128::from(MAX_STORED_MS)) as u64
}

/// Moves every time of an exported record from the source's lease clock
/// to the target's: durations (a lease's time left, a waiter's wait left)
/// stay what they were at the export.
fn shift_record(record: &mut Record, shift_ms: i128) {
    if shift_ms == 0 {
        return;
    }
    for h in record.holders.iter_mut() {
        h.granted_at_ms = shifted(h.granted_at_ms, shift_ms);
        h.stamped_expires_at_ms = shifted(h.stamped_expires_at_ms, shift_ms);
        h.expires_at_ms = shifted(h.expires_at_ms, shift_ms);
    }
    for w in record.waiters.iter_mut() {
        w.enqueued_at_ms = shifted(w.enqueued_at_ms, shift_ms);
        w.wait_deadline_ms = shifted(w.wait_deadline_ms, shift_ms);
    }
}

/// [`shift_record`] for a dedup entry's forget time.
fn shift_dedup(entry: &mut DedupEntry, shift_ms: i128) {
    match &mut entry.state {
        DedupState::Ended { forget_at_ms, .. } | DedupState::WaitEnded { forget_at_ms, .. } => {
            *forget_at_ms = shifted(*forget_at_ms, shift_ms);
        }
        DedupState::Waiting | DedupState::Held { .. } => {}
    }
}
