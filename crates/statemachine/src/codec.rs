//! Binary encoding of commands (Raft entry payloads) and snapshots.
//!
//! Hand-written rather than derived so the bytes are ours to keep stable:
//! every field is written in a fixed order, integers big-endian, maps in key
//! order. Equal tables therefore encode to equal bytes, which is how replicas
//! and the tests compare them. Each encoding starts with a magic and a
//! version; decoding never panics on bad input, it returns [`DecodeError`].

use std::collections::{BTreeMap, VecDeque};

use crate::cow_map::CowMap;
use crate::limits::{Limits, MAX_CLOCK_MS, MAX_HOLDERS_PER_RESOURCE, MAX_STORED_MS};
use crate::machine::{
    DedupEntry, DedupKey, DedupState, Holder, LockTable, PendingExport, Record, Waiter,
    FIRST_ATTEMPT,
};
use crate::name::ResourceName;
use crate::slots::{SlotSet, SLOT_COUNT};
use crate::token::FencingToken;
use crate::types::*;

const SNAPSHOT_MAGIC: &[u8; 4] = b"FLSM";
// Version 3: lease owners (holders, waiters, dedup keys) and the
// `max_held_per_tenant` limit. Older versions are refused, not upgraded
// (like every earlier bump): a node is upgraded with an empty data dir or
// after its shards were snapshotted by the new version elsewhere.
// Version 4: the attempt number of holders and waiters.
const SNAPSHOT_VERSION: u16 = 4;
// Version 5: version 4 plus each holder's and waiter's value. Written only
// while some lease has a value, so a table without values (every table
// until the cluster format allows values, `PlacementMap::cluster_format`)
// stays readable by the previous release in a rolling upgrade; one
// table, one encoding either way.
const SNAPSHOT_VERSION_WITH_VALUES: u16 = 5;
// Version 6: version 5 plus acquire modes: every holding of a record (a
// count, then each) and each holding's and waiter's mode. Written only
// while some holding or waiter is shared or a semaphore's (the cluster
// format gates them like values), else version 5 or 4 as before.
const SNAPSHOT_VERSION_WITH_MODES: u16 = 6;
const EXPORT_MAGIC: &[u8; 4] = b"FLMX";
// Version 2: lease owners. Version 3: attempt numbers. Version 4: values
// (written only when a moved lease has one, like snapshot version 5).
// Version 5: modes (only when a moved holding or waiter has one other
// than exclusive, like snapshot version 6).
const EXPORT_VERSION: u16 = 3;
const EXPORT_VERSION_WITH_VALUES: u16 = 4;
const EXPORT_VERSION_WITH_MODES: u16 = 5;

/// What a snapshot's or export's records carry beyond the base version:
/// the least that holds the table, so a table that uses no newer feature
/// is written exactly as the previous release writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RecordLevel {
    Base,
    Values,
    Modes,
}

impl RecordLevel {
    /// The level `records` need.
    fn needed<'a>(records: impl Iterator<Item = &'a Record>) -> RecordLevel {
        let mut level = RecordLevel::Base;
        for record in records {
            let modes = record.holders.iter().map(|h| h.mode);
            if modes
                .chain(record.waiters.iter().map(|w| w.mode))
                .any(|m| m != AcquireMode::Exclusive)
            {
                return RecordLevel::Modes;
            }
            let values = record.holders.iter().map(|h| &h.value);
            if values
                .chain(record.waiters.iter().map(|w| &w.value))
                .any(|v| !v.is_empty())
            {
                level = RecordLevel::Values;
            }
        }
        level
    }
}
const RECORD_MIN_BYTES: usize = 4 + 4 + 16 + 4 + 40 + 4 + 4;
/// One holder of a record in version 6: lease, owner, request id, five
/// u64s, attempt, value, mode.
const HOLDER_MIN_BYTES: usize = 16 + 4 + 4 + 40 + 4 + 4 + 1;
const DEDUP_MIN_BYTES: usize = 4 + 4 + 4 + 16 + 8 + 1;
const SLOT_WORDS_BYTES: usize = 8 * (SLOT_COUNT as usize / 64);
// Version 2: Acquire, Renew, RenewBatch and Release carry the owner.
// Version 3: Cancel carries the attempt it cancels. New commands since are
// new tags (an older build refuses an unknown tag and stops, never
// misreads it) proposed only once every member reads them.
const COMMAND_VERSION: u8 = 3;

/// Why bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Truncated,
    BadMagic,
    UnsupportedVersion(u32),
    BadTag { what: &'static str, tag: u8 },
    Invalid(String),
    TrailingBytes(usize),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "input ends early"),
            DecodeError::BadMagic => write!(f, "not a fencelock snapshot"),
            DecodeError::UnsupportedVersion(v) => write!(f, "unsupported encoding version {v}"),
            DecodeError::BadTag { what, tag } => write!(f, "unknown {what} tag {tag}"),
            DecodeError::Invalid(why) => write!(f, "invalid content: {why}"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} unexpected bytes at the end"),
        }
    }
}

impl std::error::Error for DecodeError {}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(u32::try_from(v.len()).expect("length bounded by limits"));
        self.0.extend_from_slice(v);
    }
    fn name(&mut self, v: &ResourceName) {
        self.bytes(v.as_str().as_bytes());
    }
    fn owner(&mut self, v: &Owner) {
        self.bytes(v.as_str().as_bytes());
    }
    fn lease(&mut self, v: &LeaseId) {
        self.0.extend_from_slice(&v.0);
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        self.take(len)
    }
    fn name(&mut self) -> Result<ResourceName, DecodeError> {
        let raw = self.bytes()?;
        let s =
            std::str::from_utf8(raw).map_err(|_| DecodeError::Invalid("name not utf-8".into()))?;
        ResourceName::parse(s).map_err(|e| DecodeError::Invalid(format!("resource {s:?}: {e}")))
    }
    fn owner(&mut self) -> Result<Owner, DecodeError> {
        let raw = self.bytes()?;
        let s =
            std::str::from_utf8(raw).map_err(|_| DecodeError::Invalid("owner not utf-8".into()))?;
        Owner::new(s).map_err(|e| DecodeError::Invalid(e.to_string()))
    }
    fn request_id(&mut self) -> Result<RequestId, DecodeError> {
        RequestId::new(self.bytes()?).map_err(|e| DecodeError::Invalid(e.to_string()))
    }
    fn lease(&mut self) -> Result<LeaseId, DecodeError> {
        Ok(LeaseId::from_slice(self.take(16)?).expect("16 bytes"))
    }
    fn value(&mut self) -> Result<HolderValue, DecodeError> {
        HolderValue::new(self.bytes()?).map_err(|e| DecodeError::Invalid(e.to_string()))
    }
    /// A stored time or duration (`_ms` field of a snapshot or export),
    /// at most `max`: larger values could overflow the time arithmetic of
    /// apply.
    fn ms(&mut self, max: u64) -> Result<u64, DecodeError> {
        let v = self.u64()?;
        if v > max {
            return Err(DecodeError::Invalid(format!("time {v} ms out of range")));
        }
        Ok(v)
    }
    /// A holder's or waiter's attempt number (at least the first).
    fn attempt(&mut self) -> Result<u32, DecodeError> {
        let v = self.u32()?;
        if v < FIRST_ATTEMPT {
            return Err(DecodeError::Invalid(format!("attempt {v}")));
        }
        Ok(v)
    }
    /// A count of items that each take at least `min_item_bytes`: refuses
    /// counts the remaining input cannot hold, so corrupt input cannot make
    /// us allocate without bound.
    fn count(&mut self, min_item_bytes: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item_bytes) > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(n)
    }
    fn finish(self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.0.len()))
        }
    }
}

// ----- commands -----

const CMD_ACQUIRE: u8 = 1;
const CMD_RENEW: u8 = 2;
const CMD_RENEW_BATCH: u8 = 3;
const CMD_RELEASE: u8 = 4;
const CMD_CANCEL: u8 = 5;
const CMD_TICK: u8 = 6;
const CMD_LEADER_CHANGED: u8 = 7;
const CMD_EXPORT_SLOTS: u8 = 8;
const CMD_IMPORT_SLOTS: u8 = 9;
const CMD_DROP_EXPORT: u8 = 10;
const CMD_CLOSE_MIGRATION: u8 = 11;
/// `ImportSlots` with the source's lease clock: a tag of its own, so a
/// build of the previous release refuses it (and stops) rather than
/// importing without moving times between clocks, unlike its peers. The
/// orchestrator sends it only when every replica of the target reads it
/// (placement format 3).
const CMD_IMPORT_SLOTS_AT_CLOCK: u8 = 12;
/// `Acquire` with a holder value (an acquire without one keeps tag 1, so
/// it stays readable by the previous release).
const CMD_ACQUIRE_WITH_VALUE: u8 = 13;
const CMD_PROCLAIM: u8 = 14;
/// `Acquire` in a mode other than exclusive: tag 13's fields (the value
/// possibly empty), then the mode. Exclusive acquires keep tags 1 and 13.
const CMD_ACQUIRE_WITH_MODE: u8 = 15;

const MODE_EXCLUSIVE: u8 = 0;
const MODE_SHARED: u8 = 1;
const MODE_SEMAPHORE: u8 = 2;

fn write_mode(w: &mut Writer, mode: AcquireMode) {
    match mode {
        AcquireMode::Exclusive => w.u8(MODE_EXCLUSIVE),
        AcquireMode::Shared => w.u8(MODE_SHARED),
        AcquireMode::Semaphore { permits } => {
            w.u8(MODE_SEMAPHORE);
            w.u32(permits);
        }
    }
}

/// Reads a mode. A command's permit count is not range-checked here: a
/// proposed acquire with a count out of range is a well-formed entry that
/// apply refuses (`InvalidPermits`) on every replica alike, where refusing
/// to decode it would stop them. A table's modes (`checked`) were granted,
/// so a count out of range there is damage.
fn read_mode(r: &mut Reader, checked: bool) -> Result<AcquireMode, DecodeError> {
    let mode = match r.u8()? {
        MODE_EXCLUSIVE => AcquireMode::Exclusive,
        MODE_SHARED => AcquireMode::Shared,
        MODE_SEMAPHORE => AcquireMode::Semaphore { permits: r.u32()? },
        tag => return Err(DecodeError::BadTag { what: "mode", tag }),
    };
    if checked {
        mode.validate()
            .map_err(|e| DecodeError::Invalid(e.to_string()))?;
    }
    Ok(mode)
}

impl Command {
    /// Encodes the command as a Raft entry payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out);
        out
    }

    /// Appends the encoding to `out`, so many commands can share one buffer.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut w = Writer(std::mem::take(out));
        w.u8(COMMAND_VERSION);
        match self {
            Command::Acquire {
                resource,
                owner,
                request_id,
                lease_id,
                lease_ttl_ms,
                wait_timeout_ms,
                value,
                mode,
            } => {
                let tag = if *mode != AcquireMode::Exclusive {
                    CMD_ACQUIRE_WITH_MODE
                } else if !value.is_empty() {
                    CMD_ACQUIRE_WITH_VALUE
                } else {
                    CMD_ACQUIRE
                };
                w.u8(tag);
                w.name(resource);
                w.owner(owner);
                w.bytes(request_id.as_bytes());
                w.lease(lease_id);
                w.u64(*lease_ttl_ms);
                w.u64(*wait_timeout_ms);
                if tag != CMD_ACQUIRE {
                    w.bytes(value.as_bytes());
                }
                if tag == CMD_ACQUIRE_WITH_MODE {
                    write_mode(&mut w, *mode);
                }
            }
            Command::Proclaim {
                resource,
                owner,
                lease_id,
                value,
            } => {
                w.u8(CMD_PROCLAIM);
                w.name(resource);
                w.owner(owner);
                w.lease(lease_id);
                w.bytes(value.as_bytes());
            }
            Command::Renew {
                resource,
                owner,
                lease_id,
                lease_ttl_ms,
            } => {
                w.u8(CMD_RENEW);
                w.name(resource);
                w.owner(owner);
                w.lease(lease_id);
                w.u64(*lease_ttl_ms);
            }
            Command::RenewBatch { owner, items } => {
                w.u8(CMD_RENEW_BATCH);
                w.owner(owner);
                w.u32(items.len() as u32);
                for item in items {
                    w.name(&item.resource);
                    w.lease(&item.lease_id);
                    w.u64(item.lease_ttl_ms);
                }
            }
            Command::Release {
                resource,
                owner,
                lease_id,
            } => {
                w.u8(CMD_RELEASE);
                w.name(resource);
                w.owner(owner);
                w.lease(lease_id);
            }
            Command::Cancel {
                resource,
                lease_id,
                attempt,
            } => {
                w.u8(CMD_CANCEL);
                w.name(resource);
                w.lease(lease_id);
                w.u32(*attempt);
            }
            Command::Tick => w.u8(CMD_TICK),
            Command::LeaderChanged {
                clock_offset_allowance_ms,
            } => {
                w.u8(CMD_LEADER_CHANGED);
                w.u64(*clock_offset_allowance_ms);
            }
            Command::ExportSlots {
                migration_id,
                slots,
            } => {
                w.u8(CMD_EXPORT_SLOTS);
                w.u64(*migration_id);
                for word in slots.words() {
                    w.u64(*word);
                }
            }
            Command::ImportSlots {
                migration_id,
                epoch,
                slots,
                data,
                clock_offset_allowance_ms,
                export_clock_ms,
            } => {
                w.u8(if export_clock_ms.is_some() {
                    CMD_IMPORT_SLOTS_AT_CLOCK
                } else {
                    CMD_IMPORT_SLOTS
                });
                w.u64(*migration_id);
                w.u64(*epoch);
                for word in slots.words() {
                    w.u64(*word);
                }
                w.bytes(data);
                w.u64(*clock_offset_allowance_ms);
                if let Some(clock_ms) = export_clock_ms {
                    w.u64(*clock_ms);
                }
            }
            Command::DropExport { migration_id } => {
                w.u8(CMD_DROP_EXPORT);
                w.u64(*migration_id);
            }
            Command::CloseMigration {
                migration_id,
                slots,
            } => {
                w.u8(CMD_CLOSE_MIGRATION);
                w.u64(*migration_id);
                for word in slots.words() {
                    w.u64(*word);
                }
            }
        }
        *out = w.0;
    }

    /// Decodes a Raft entry payload.
    pub fn decode(bytes: &[u8]) -> Result<Command, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != COMMAND_VERSION {
            return Err(DecodeError::UnsupportedVersion(version.into()));
        }
        let tag = r.u8()?;
        let command = match tag {
            CMD_ACQUIRE | CMD_ACQUIRE_WITH_VALUE | CMD_ACQUIRE_WITH_MODE => {
                let resource = r.name()?;
                let owner = r.owner()?;
                let request_id = r.request_id()?;
                let lease_id = r.lease()?;
                let lease_ttl_ms = r.u64()?;
                let wait_timeout_ms = r.u64()?;
                let value = if tag == CMD_ACQUIRE {
                    HolderValue::none()
                } else {
                    r.value()?
                };
                let mode = if tag == CMD_ACQUIRE_WITH_MODE {
                    read_mode(&mut r, false)?
                } else {
                    AcquireMode::Exclusive
                };
                // One command, one encoding: each tag only for what needs it.
                if tag == CMD_ACQUIRE_WITH_VALUE && value.is_empty() {
                    return Err(DecodeError::Invalid("empty value in its own tag".into()));
                }
                if tag == CMD_ACQUIRE_WITH_MODE && mode == AcquireMode::Exclusive {
                    return Err(DecodeError::Invalid("exclusive mode in its own tag".into()));
                }
                Command::Acquire {
                    resource,
                    owner,
                    request_id,
                    lease_id,
                    lease_ttl_ms,
                    wait_timeout_ms,
                    value,
                    mode,
                }
            }
            CMD_PROCLAIM => Command::Proclaim {
                resource: r.name()?,
                owner: r.owner()?,
                lease_id: r.lease()?,
                value: r.value()?,
            },
            CMD_RENEW => Command::Renew {
                resource: r.name()?,
                owner: r.owner()?,
                lease_id: r.lease()?,
                lease_ttl_ms: r.u64()?,
            },
            CMD_RENEW_BATCH => {
                let owner = r.owner()?;
                let n = r.count(4 + 16 + 8)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(RenewItem {
                        resource: r.name()?,
                        lease_id: r.lease()?,
                        lease_ttl_ms: r.u64()?,
                    });
                }
                Command::RenewBatch { owner, items }
            }
            CMD_RELEASE => Command::Release {
                resource: r.name()?,
                owner: r.owner()?,
                lease_id: r.lease()?,
            },
            CMD_CANCEL => Command::Cancel {
                resource: r.name()?,
                lease_id: r.lease()?,
                attempt: r.u32()?,
            },
            CMD_TICK => Command::Tick,
            CMD_LEADER_CHANGED => Command::LeaderChanged {
                clock_offset_allowance_ms: r.u64()?,
            },
            CMD_EXPORT_SLOTS => Command::ExportSlots {
                migration_id: r.u64()?,
                slots: read_slots(&mut r)?,
            },
            CMD_IMPORT_SLOTS | CMD_IMPORT_SLOTS_AT_CLOCK => Command::ImportSlots {
                migration_id: r.u64()?,
                epoch: r.u64()?,
                slots: read_slots(&mut r)?,
                data: r.bytes()?.to_vec(),
                clock_offset_allowance_ms: r.u64()?,
                export_clock_ms: if tag == CMD_IMPORT_SLOTS_AT_CLOCK {
                    Some(r.ms(MAX_CLOCK_MS)?)
                } else {
                    None
                },
            },
            CMD_DROP_EXPORT => Command::DropExport {
                migration_id: r.u64()?,
            },
            CMD_CLOSE_MIGRATION => Command::CloseMigration {
                migration_id: r.u64()?,
                slots: read_slots(&mut r)?,
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "command",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(command)
    }
}

// ----- snapshots -----

fn lease_end_tag(e: LeaseEnd) -> u8 {
    match e {
        LeaseEnd::Released => 1,
        LeaseEnd::Expired => 2,
        LeaseEnd::Cancelled => 3,
    }
}

fn lease_end_from(tag: u8) -> Result<LeaseEnd, DecodeError> {
    Ok(match tag {
        1 => LeaseEnd::Released,
        2 => LeaseEnd::Expired,
        3 => LeaseEnd::Cancelled,
        tag => {
            return Err(DecodeError::BadTag {
                what: "lease end",
                tag,
            })
        }
    })
}

fn wait_end_tag(e: WaitEnd) -> u8 {
    match e {
        WaitEnd::TimedOut => 1,
        WaitEnd::Cancelled => 2,
        WaitEnd::TokenSpaceExhausted => 3,
    }
}

fn wait_end_from(tag: u8) -> Result<WaitEnd, DecodeError> {
    Ok(match tag {
        1 => WaitEnd::TimedOut,
        2 => WaitEnd::Cancelled,
        3 => WaitEnd::TokenSpaceExhausted,
        tag => {
            return Err(DecodeError::BadTag {
                what: "wait end",
                tag,
            })
        }
    })
}

fn write_limits(w: &mut Writer, l: &Limits) {
    w.u64(l.min_lease_ttl_ms);
    w.u64(l.max_lease_ttl_ms);
    w.u64(l.max_wait_timeout_ms);
    w.u64(l.max_hold_ms);
    w.u32(l.max_waiters_per_resource);
    w.u32(l.max_waiters_per_tenant);
    w.u32(l.max_held_per_tenant);
    w.u64(l.dedup_retention_ms);
    w.u32(l.max_dedup_entries);
    w.u32(l.max_records);
    w.u32(l.max_retired_per_tick);
}

fn read_limits(r: &mut Reader) -> Result<Limits, DecodeError> {
    let limits = Limits {
        min_lease_ttl_ms: r.u64()?,
        max_lease_ttl_ms: r.u64()?,
        max_wait_timeout_ms: r.u64()?,
        max_hold_ms: r.u64()?,
        max_waiters_per_resource: r.u32()?,
        max_waiters_per_tenant: r.u32()?,
        max_held_per_tenant: r.u32()?,
        dedup_retention_ms: r.u64()?,
        max_dedup_entries: r.u32()?,
        max_records: r.u32()?,
        max_retired_per_tick: r.u32()?,
    };
    limits
        .validate()
        .map_err(|e| DecodeError::Invalid(e.to_string()))?;
    Ok(limits)
}

/// What a snapshot of a table encodes, copied out of it in microseconds
/// whatever its size: the resources and remembered acquires are shared
/// with the table ([`CowMap`]), so the store loop can hand this to
/// another thread to encode while the table goes on changing. The derived
/// indexes are not here: a restore rebuilds them.
#[derive(Clone, Debug)]
pub struct FrozenTable {
    limits: Limits,
    epoch: u64,
    epoch_base_index: u64,
    last_position: u64,
    max_token: FencingToken,
    leader_term: u64,
    applied_index: u64,
    clock_ms: u64,
    records: CowMap<ResourceName, Record>,
    dedup: CowMap<DedupKey, DedupEntry>,
    owned: SlotSet,
    last_imported_migration: u64,
    exports: BTreeMap<u64, PendingExport>,
}

impl LockTable {
    /// A consistent copy of what [`LockTable::snapshot`] encodes, taken in
    /// O(buckets) time (see [`FrozenTable`]).
    pub fn freeze(&self) -> FrozenTable {
        FrozenTable {
            limits: self.limits.clone(),
            epoch: self.epoch,
            epoch_base_index: self.epoch_base_index,
            last_position: self.last_position,
            max_token: self.max_token,
            leader_term: self.leader_term,
            applied_index: self.applied_index,
            clock_ms: self.clock_ms,
            records: self.records.clone(),
            dedup: self.dedup.clone(),
            owned: self.owned,
            last_imported_migration: self.last_imported_migration,
            exports: self.exports.clone(),
        }
    }

    /// Encodes the whole table. Equal tables give equal bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        if cfg!(debug_assertions) {
            let level = RecordLevel::needed(self.records.values_unordered());
            assert_eq!(
                level >= RecordLevel::Values,
                self.value_bytes > 0 || level == RecordLevel::Modes
            );
        }
        self.freeze().encode()
    }
}

impl FrozenTable {
    /// The index of the last entry applied to the table this copies.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// [`LockTable::snapshot`]'s bytes for the table as it was frozen.
    pub fn encode(&self) -> Vec<u8> {
        let hint = 64 + self.records.len() * 128 + self.dedup.len() * 96;
        let mut w = Writer(Vec::with_capacity(hint));
        let level = RecordLevel::needed(self.records.values_unordered());
        let version = match level {
            RecordLevel::Base => SNAPSHOT_VERSION,
            RecordLevel::Values => SNAPSHOT_VERSION_WITH_VALUES,
            RecordLevel::Modes => SNAPSHOT_VERSION_WITH_MODES,
        };
        w.0.extend_from_slice(SNAPSHOT_MAGIC);
        w.0.extend_from_slice(&version.to_be_bytes());
        write_limits(&mut w, &self.limits);
        w.u64(self.epoch);
        w.u64(self.epoch_base_index);
        w.u64(self.last_position);
        w.u64(self.max_token.as_u64());
        w.u64(self.leader_term);
        w.u64(self.applied_index);
        w.u64(self.clock_ms);
        w.u32(self.records.len() as u32);
        for (name, record) in self.records.iter() {
            write_record(&mut w, name, record, level);
        }
        w.u32(self.dedup.len() as u32);
        for (key, entry) in self.dedup.iter() {
            write_dedup(&mut w, key, entry);
        }
        for word in self.owned.words() {
            w.u64(*word);
        }
        w.u64(self.last_imported_migration);
        w.u32(self.exports.len() as u32);
        for (id, export) in &self.exports {
            w.u64(*id);
            for word in export.slots.words() {
                w.u64(*word);
            }
            w.u32(export.resources);
            w.bytes(&export.data);
        }
        w.0
    }
}

impl LockTable {
    /// Rebuilds a table from [`LockTable::snapshot`] bytes, checking every
    /// invariant before returning it.
    pub fn restore(bytes: &[u8]) -> Result<LockTable, DecodeError> {
        let mut r = Reader(bytes);
        if r.take(4)? != SNAPSHOT_MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = u16::from_be_bytes(r.take(2)?.try_into().expect("2 bytes"));
        let level = match version {
            SNAPSHOT_VERSION => RecordLevel::Base,
            SNAPSHOT_VERSION_WITH_VALUES => RecordLevel::Values,
            SNAPSHOT_VERSION_WITH_MODES => RecordLevel::Modes,
            _ => return Err(DecodeError::UnsupportedVersion(version.into())),
        };
        let limits = read_limits(&mut r)?;
        let mut table = LockTable::new(limits).map_err(|e| DecodeError::Invalid(e.to_string()))?;
        table.epoch = r.u64()?;
        table.epoch_base_index = r.u64()?;
        table.last_position = r.u64()?;
        table.max_token = FencingToken::from_u64(r.u64()?);
        table.leader_term = r.u64()?;
        table.applied_index = r.u64()?;
        table.clock_ms = r.ms(MAX_CLOCK_MS)?;
        let records = r.count(RECORD_MIN_BYTES)?;
        let mut last_name: Option<ResourceName> = None;
        for _ in 0..records {
            let (name, record) = read_record(&mut r, level)?;
            // Key order, as `snapshot` writes them: one table, one encoding.
            if last_name.as_ref().is_some_and(|last| *last >= name) {
                return Err(DecodeError::Invalid("resources out of order".into()));
            }
            last_name = Some(name.clone());
            if !table.insert_record_indexed(name, record) {
                return Err(DecodeError::Invalid("resource listed twice".into()));
            }
        }
        let entries = r.count(DEDUP_MIN_BYTES)?;
        let mut last_key: Option<DedupKey> = None;
        for _ in 0..entries {
            let (key, entry) = read_dedup(&mut r)?;
            if last_key.as_ref().is_some_and(|last| *last >= key) {
                return Err(DecodeError::Invalid("dedup entries out of order".into()));
            }
            last_key = Some(key.clone());
            if !table.insert_dedup_indexed(key, entry) {
                return Err(DecodeError::Invalid("dedup entry listed twice".into()));
            }
        }
        table.owned = read_slots(&mut r)?;
        table.last_imported_migration = r.u64()?;
        let exports = r.count(8 + SLOT_WORDS_BYTES + 4 + 4)?;
        for _ in 0..exports {
            let id = r.u64()?;
            if table
                .exports
                .last_key_value()
                .is_some_and(|(last, _)| *last >= id)
            {
                return Err(DecodeError::Invalid("exports out of order".into()));
            }
            let slots = read_slots(&mut r)?;
            let resources = r.u32()?;
            let data = r.bytes()?.into();
            let export = PendingExport {
                slots,
                data,
                resources,
            };
            if table.exports.insert(id, export).is_some() {
                return Err(DecodeError::Invalid("export listed twice".into()));
            }
        }
        r.finish()?;
        // Canonical: a version only ever carries what needs it.
        if RecordLevel::needed(table.records.values_unordered()) != level {
            return Err(DecodeError::Invalid(format!(
                "version {version} for a table that needs another"
            )));
        }
        table.check_invariants().map_err(DecodeError::Invalid)?;
        Ok(table)
    }
}

// ----- pieces shared by snapshots and migration exports -----

/// With [`RecordLevel::Values`] (snapshot version 5, export version 4)
/// each holder and waiter ends with its value; with [`RecordLevel::Modes`]
/// (snapshot 6, export 5) a record lists its holders (a count, then each)
/// and its last token, and each holder and waiter ends with its value and
/// mode. Below `Modes`
/// a record has exactly one holder and everything is exclusive.
fn write_record(w: &mut Writer, name: &ResourceName, record: &Record, level: RecordLevel) {
    w.name(name);
    if level == RecordLevel::Modes {
        w.u32(record.holders.len() as u32);
    } else {
        assert_eq!(record.holders.len(), 1, "{name}: one holder below modes");
    }
    for h in &record.holders {
        w.lease(&h.lease_id);
        w.owner(&h.owner);
        w.bytes(h.request_id.as_bytes());
        w.u64(h.token.as_u64());
        w.u64(h.granted_at_ms);
        w.u64(h.lease_ttl_ms);
        w.u64(h.stamped_expires_at_ms);
        w.u64(h.expires_at_ms);
        w.u32(h.attempt);
        if level >= RecordLevel::Values {
            w.bytes(h.value.as_bytes());
        }
        if level == RecordLevel::Modes {
            write_mode(w, h.mode);
        }
    }
    if level == RecordLevel::Modes {
        w.u64(record.last_token.as_u64());
    } else {
        // Below modes the one holder is the newest grant.
        assert_eq!(record.last_token, record.holders[0].token, "{name}");
    }
    w.u32(record.waiters.len() as u32);
    for waiter in &record.waiters {
        w.lease(&waiter.lease_id);
        w.owner(&waiter.owner);
        w.bytes(waiter.request_id.as_bytes());
        w.u64(waiter.lease_ttl_ms);
        w.u64(waiter.enqueued_at_ms);
        w.u64(waiter.wait_deadline_ms);
        w.u32(waiter.attempt);
        if level >= RecordLevel::Values {
            w.bytes(waiter.value.as_bytes());
        }
        if level == RecordLevel::Modes {
            write_mode(w, waiter.mode);
        }
    }
}

fn read_record(r: &mut Reader, level: RecordLevel) -> Result<(ResourceName, Record), DecodeError> {
    let name = r.name()?;
    let holders = if level == RecordLevel::Modes {
        r.count(HOLDER_MIN_BYTES)?
    } else {
        1
    };
    if holders == 0 || holders > MAX_HOLDERS_PER_RESOURCE as usize {
        return Err(DecodeError::Invalid(format!("{holders} holders of {name}")));
    }
    let extras = |r: &mut Reader| -> Result<(HolderValue, AcquireMode), DecodeError> {
        let value = if level >= RecordLevel::Values {
            r.value()?
        } else {
            HolderValue::none()
        };
        let mode = if level == RecordLevel::Modes {
            read_mode(r, true)?
        } else {
            AcquireMode::Exclusive
        };
        Ok((value, mode))
    };
    let mut record = Record {
        holders: Vec::with_capacity(holders),
        waiters: VecDeque::new(),
        last_token: FencingToken::NONE,
    };
    for _ in 0..holders {
        let lease_id = r.lease()?;
        let owner = r.owner()?;
        let request_id = r.request_id()?;
        let token = FencingToken::from_u64(r.u64()?);
        let granted_at_ms = r.ms(MAX_STORED_MS)?;
        let lease_ttl_ms = r.ms(MAX_STORED_MS)?;
        let stamped_expires_at_ms = r.ms(MAX_STORED_MS)?;
        let expires_at_ms = r.ms(MAX_STORED_MS)?;
        let attempt = r.attempt()?;
        let (value, mode) = extras(r)?;
        record.holders.push(Holder {
            lease_id,
            owner,
            request_id,
            token,
            granted_at_ms,
            lease_ttl_ms,
            stamped_expires_at_ms,
            expires_at_ms,
            attempt,
            value,
            mode,
        });
    }
    let newest = record.holders.iter().map(|h| h.token).max();
    record.last_token = if level == RecordLevel::Modes {
        let last_token = FencingToken::from_u64(r.u64()?);
        if newest.is_some_and(|t| last_token < t) {
            return Err(DecodeError::Invalid(format!(
                "{name}: last token {last_token} below a holder's"
            )));
        }
        last_token
    } else {
        newest.expect("one holder")
    };
    let n = r.count(16 + 4 + 4 + 24 + 4)?;
    record.waiters.reserve(n);
    for _ in 0..n {
        let lease_id = r.lease()?;
        let owner = r.owner()?;
        let request_id = r.request_id()?;
        let lease_ttl_ms = r.ms(MAX_STORED_MS)?;
        let enqueued_at_ms = r.ms(MAX_STORED_MS)?;
        let wait_deadline_ms = r.ms(MAX_STORED_MS)?;
        let attempt = r.attempt()?;
        let (value, mode) = extras(r)?;
        record.waiters.push_back(Waiter {
            lease_id,
            owner,
            request_id,
            lease_ttl_ms,
            enqueued_at_ms,
            wait_deadline_ms,
            attempt,
            value,
            mode,
        });
    }
    Ok((name, record))
}

fn write_dedup(w: &mut Writer, key: &DedupKey, entry: &DedupEntry) {
    w.bytes(key.resource().as_bytes());
    w.bytes(key.owner().as_bytes());
    w.bytes(key.request_id());
    w.lease(&entry.lease_id);
    w.u64(entry.lease_ttl_ms);
    match entry.state {
        DedupState::Waiting => w.u8(1),
        DedupState::Held { token } => {
            w.u8(2);
            w.u64(token.as_u64());
        }
        DedupState::Ended {
            token,
            ended,
            forget_at_ms,
        } => {
            w.u8(3);
            w.u64(token.as_u64());
            w.u8(lease_end_tag(ended));
            w.u64(forget_at_ms);
        }
        DedupState::WaitEnded {
            ended,
            forget_at_ms,
        } => {
            w.u8(4);
            w.u8(wait_end_tag(ended));
            w.u64(forget_at_ms);
        }
    }
}

fn read_dedup(r: &mut Reader) -> Result<(DedupKey, DedupEntry), DecodeError> {
    let key = DedupKey::new(&r.name()?, &r.owner()?, &r.request_id()?);
    let lease_id = r.lease()?;
    let lease_ttl_ms = r.ms(MAX_STORED_MS)?;
    let state = match r.u8()? {
        1 => DedupState::Waiting,
        2 => DedupState::Held {
            token: FencingToken::from_u64(r.u64()?),
        },
        3 => DedupState::Ended {
            token: FencingToken::from_u64(r.u64()?),
            ended: lease_end_from(r.u8()?)?,
            forget_at_ms: r.ms(MAX_STORED_MS)?,
        },
        4 => DedupState::WaitEnded {
            ended: wait_end_from(r.u8()?)?,
            forget_at_ms: r.ms(MAX_STORED_MS)?,
        },
        tag => {
            return Err(DecodeError::BadTag {
                what: "dedup state",
                tag,
            })
        }
    };
    Ok((
        key,
        DedupEntry {
            lease_id,
            lease_ttl_ms,
            state,
        },
    ))
}

fn read_slots(r: &mut Reader) -> Result<SlotSet, DecodeError> {
    let mut words = [0u64; SLOT_COUNT as usize / 64];
    for word in words.iter_mut() {
        *word = r.u64()?;
    }
    SlotSet::from_words(words).ok_or_else(|| DecodeError::Invalid("slot out of range".into()))
}

/// The lock state of some slots, as moved from one shard to another.
pub(crate) struct Export {
    /// Highest token among the moved holders and dedup entries.
    pub max_token: FencingToken,
    pub records: Vec<(ResourceName, Record)>,
    pub dedup: Vec<(DedupKey, DedupEntry)>,
}

pub(crate) fn encode_export(export: &Export) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + export.records.len() * 128));
    let level = RecordLevel::needed(export.records.iter().map(|(_, r)| r));
    let version = match level {
        RecordLevel::Base => EXPORT_VERSION,
        RecordLevel::Values => EXPORT_VERSION_WITH_VALUES,
        RecordLevel::Modes => EXPORT_VERSION_WITH_MODES,
    };
    w.0.extend_from_slice(EXPORT_MAGIC);
    w.0.extend_from_slice(&version.to_be_bytes());
    w.u64(export.max_token.as_u64());
    w.u32(export.records.len() as u32);
    for (name, record) in &export.records {
        write_record(&mut w, name, record, level);
    }
    w.u32(export.dedup.len() as u32);
    for (key, entry) in &export.dedup {
        write_dedup(&mut w, key, entry);
    }
    w.0
}

pub(crate) fn decode_export(bytes: &[u8]) -> Result<Export, DecodeError> {
    let mut r = Reader(bytes);
    if r.take(4)? != EXPORT_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = u16::from_be_bytes(r.take(2)?.try_into().expect("2 bytes"));
    let level = match version {
        EXPORT_VERSION => RecordLevel::Base,
        EXPORT_VERSION_WITH_VALUES => RecordLevel::Values,
        EXPORT_VERSION_WITH_MODES => RecordLevel::Modes,
        _ => return Err(DecodeError::UnsupportedVersion(version.into())),
    };
    let max_token = FencingToken::from_u64(r.u64()?);
    let n = r.count(RECORD_MIN_BYTES)?;
    let mut records = Vec::with_capacity(n);
    for _ in 0..n {
        records.push(read_record(&mut r, level)?);
    }
    let n = r.count(DEDUP_MIN_BYTES)?;
    let mut dedup = Vec::with_capacity(n);
    for _ in 0..n {
        dedup.push(read_dedup(&mut r)?);
    }
    r.finish()?;
    Ok(Export {
        max_token,
        records,
        dedup,
    })
}
