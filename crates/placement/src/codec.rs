//! Byte encodings of placement commands (meta shard log entries) and of the
//! map (meta shard snapshots).
//!
//! Hand-written so the bytes are ours to keep stable: a version up front,
//! fields in a fixed order, integers big-endian, sets and maps in ascending
//! order. Decoding accepts only that canonical form (sorted sets, known tags,
//! no trailing bytes), so anything that decodes re-encodes to the same bytes,
//! and it never panics: every bad input is a [`DecodeError`].

use std::collections::{BTreeMap, BTreeSet};

use crate::format::FIRST_PLACEMENT_FORMAT;
use crate::limits::{MAX_NODES, MAX_SHARDS, SLOT_COUNT};
use crate::map::PlacementMap;
use crate::types::*;

const SNAPSHOT_MAGIC: &[u8; 4] = b"FLPM";
/// Version 1: no scheduler flag. Version 2 appends it, and is written only
/// while the scheduler is paused, so a map that was never paused stays
/// readable by nodes that know version 1 only.
const SNAPSHOT_VERSION: u16 = 1;
const SNAPSHOT_VERSION_WITH_SCHEDULER: u16 = 2;
/// Version 2's layout with the scheduler flag always present, then the
/// cluster format; written only once the cluster format is above the
/// first (every member then reads it).
const SNAPSHOT_VERSION_WITH_CLUSTER_FORMAT: u16 = 3;
const COMMAND_VERSION: u8 = 1;

/// Why bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ends before the value does.
    Truncated,
    /// A snapshot does not start with the placement magic.
    BadMagic,
    UnsupportedVersion(u32),
    BadTag {
        what: &'static str,
        tag: u8,
    },
    /// Well-formed bytes describing a value that breaks a rule.
    Invalid(String),
    /// Bytes left over after a complete value.
    TrailingBytes(usize),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "input ends early"),
            DecodeError::BadMagic => write!(f, "not a placement map snapshot"),
            DecodeError::UnsupportedVersion(v) => write!(f, "unsupported encoding version {v}"),
            DecodeError::BadTag { what, tag } => write!(f, "unknown {what} tag {tag}"),
            DecodeError::Invalid(why) => write!(f, "invalid content: {why}"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} unexpected bytes after the value"),
        }
    }
}

impl std::error::Error for DecodeError {}

#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    /// A length prefix. Every length we write is bounded far below `u32`
    /// by the limits; saturating keeps encoding total even for a command
    /// built by hand past them (apply refuses such a command anyway).
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn node_set(&mut self, set: &BTreeSet<u64>) {
        self.len(set.len());
        for &id in set {
            self.u64(id);
        }
    }
    fn state(&mut self, state: NodeState) {
        self.u8(match state {
            NodeState::Up => 1,
            NodeState::Draining => 2,
            NodeState::Drained => 3,
            NodeState::Down => 4,
        });
    }
    fn slots(&mut self, slots: &[u32]) {
        self.len(slots.len());
        for &slot in slots {
            self.u32(slot);
        }
    }
}

struct In<'a>(&'a [u8]);

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    /// A count of items of at least `min_item_bytes` each. Refusing counts
    /// the rest of the input cannot hold keeps corrupt input from making us
    /// reserve memory it does not pay for.
    fn count(&mut self, min_item_bytes: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item_bytes) > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(n)
    }
    fn str(&mut self) -> Result<String, DecodeError> {
        let n = self.count(1)?;
        let raw = self.take(n)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Invalid("string is not UTF-8".into()))
    }
    fn node_set(&mut self) -> Result<BTreeSet<u64>, DecodeError> {
        let n = self.count(8)?;
        let mut set = BTreeSet::new();
        for _ in 0..n {
            let id = self.u64()?;
            // Ascending only: a set has exactly one encoding.
            if set.last().is_some_and(|&last| last >= id) {
                return Err(DecodeError::Invalid("node set not ascending".into()));
            }
            set.insert(id);
        }
        Ok(set)
    }
    fn state(&mut self) -> Result<NodeState, DecodeError> {
        match self.u8()? {
            1 => Ok(NodeState::Up),
            2 => Ok(NodeState::Draining),
            3 => Ok(NodeState::Drained),
            4 => Ok(NodeState::Down),
            tag => Err(DecodeError::BadTag {
                what: "node state",
                tag,
            }),
        }
    }
    fn slots(&mut self) -> Result<Vec<u32>, DecodeError> {
        let n = self.count(4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn finish(self) -> Result<(), DecodeError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

// ----- commands -----

const TAG_ADD_NODE: u8 = 1;
const TAG_REMOVE_NODE: u8 = 2;
const TAG_SET_NODE_STATE: u8 = 3;
const TAG_SET_REPLICAS: u8 = 4;
const TAG_CREATE_SHARD: u8 = 5;
const TAG_BEGIN_MIGRATION: u8 = 6;
const TAG_COMMIT_MIGRATION: u8 = 7;
const TAG_ABORT_MIGRATION: u8 = 8;
const TAG_ADVANCE_EPOCH: u8 = 9;
const TAG_ROLL_BACK_MIGRATION: u8 = 10;
const TAG_BEGIN_SPLIT: u8 = 11;
const TAG_SET_SCHEDULER_PAUSED: u8 = 12;
const TAG_RAISE_EPOCH_FLOOR: u8 = 13;
const TAG_RAISE_CLUSTER_FORMAT: u8 = 14;

impl PlacementCommand {
    /// The meta shard log payload of this command.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Out::default();
        w.u8(COMMAND_VERSION);
        match self {
            PlacementCommand::AddNode { node_id, addr } => {
                w.u8(TAG_ADD_NODE);
                w.u64(*node_id);
                w.str(addr);
            }
            PlacementCommand::RemoveNode { node_id } => {
                w.u8(TAG_REMOVE_NODE);
                w.u64(*node_id);
            }
            PlacementCommand::SetNodeState { node_id, state } => {
                w.u8(TAG_SET_NODE_STATE);
                w.u64(*node_id);
                w.state(*state);
            }
            PlacementCommand::SetReplicas { shard_id, replicas } => {
                w.u8(TAG_SET_REPLICAS);
                w.u64(*shard_id);
                w.node_set(replicas);
            }
            PlacementCommand::CreateShard { replicas } => {
                w.u8(TAG_CREATE_SHARD);
                w.node_set(replicas);
            }
            PlacementCommand::BeginMigration {
                from_shard,
                to_shard,
                slots,
            } => {
                w.u8(TAG_BEGIN_MIGRATION);
                w.u64(*from_shard);
                w.u64(*to_shard);
                w.slots(slots);
            }
            PlacementCommand::CommitMigration { migration_id } => {
                w.u8(TAG_COMMIT_MIGRATION);
                w.u64(*migration_id);
            }
            PlacementCommand::AbortMigration { migration_id } => {
                w.u8(TAG_ABORT_MIGRATION);
                w.u64(*migration_id);
            }
            PlacementCommand::AdvanceEpoch { shard_id } => {
                w.u8(TAG_ADVANCE_EPOCH);
                w.u64(*shard_id);
            }
            PlacementCommand::RollBackMigration { migration_id } => {
                w.u8(TAG_ROLL_BACK_MIGRATION);
                w.u64(*migration_id);
            }
            PlacementCommand::BeginSplit { from_shard, slots } => {
                w.u8(TAG_BEGIN_SPLIT);
                w.u64(*from_shard);
                w.slots(slots);
            }
            PlacementCommand::RaiseEpochFloor { above_epoch } => {
                w.u8(TAG_RAISE_EPOCH_FLOOR);
                w.u64(*above_epoch);
            }
            PlacementCommand::SetSchedulerPaused { paused } => {
                w.u8(TAG_SET_SCHEDULER_PAUSED);
                w.u8(u8::from(*paused));
            }
            PlacementCommand::RaiseClusterFormat { format } => {
                w.u8(TAG_RAISE_CLUSTER_FORMAT);
                w.u32(*format);
            }
        }
        w.0
    }

    /// Decodes a meta shard log payload. Limits (address length, slot
    /// count, ...) are `apply`'s to enforce, with typed errors; decoding only
    /// checks the shape.
    pub fn decode(bytes: &[u8]) -> Result<PlacementCommand, DecodeError> {
        let mut r = In(bytes);
        let version = r.u8()?;
        if version != COMMAND_VERSION {
            return Err(DecodeError::UnsupportedVersion(version.into()));
        }
        let cmd = match r.u8()? {
            TAG_ADD_NODE => PlacementCommand::AddNode {
                node_id: r.u64()?,
                addr: r.str()?,
            },
            TAG_REMOVE_NODE => PlacementCommand::RemoveNode { node_id: r.u64()? },
            TAG_SET_NODE_STATE => PlacementCommand::SetNodeState {
                node_id: r.u64()?,
                state: r.state()?,
            },
            TAG_SET_REPLICAS => PlacementCommand::SetReplicas {
                shard_id: r.u64()?,
                replicas: r.node_set()?,
            },
            TAG_CREATE_SHARD => PlacementCommand::CreateShard {
                replicas: r.node_set()?,
            },
            TAG_BEGIN_MIGRATION => PlacementCommand::BeginMigration {
                from_shard: r.u64()?,
                to_shard: r.u64()?,
                slots: r.slots()?,
            },
            TAG_COMMIT_MIGRATION => PlacementCommand::CommitMigration {
                migration_id: r.u64()?,
            },
            TAG_ABORT_MIGRATION => PlacementCommand::AbortMigration {
                migration_id: r.u64()?,
            },
            TAG_ADVANCE_EPOCH => PlacementCommand::AdvanceEpoch { shard_id: r.u64()? },
            TAG_ROLL_BACK_MIGRATION => PlacementCommand::RollBackMigration {
                migration_id: r.u64()?,
            },
            TAG_BEGIN_SPLIT => PlacementCommand::BeginSplit {
                from_shard: r.u64()?,
                slots: r.slots()?,
            },
            TAG_RAISE_EPOCH_FLOOR => PlacementCommand::RaiseEpochFloor {
                above_epoch: r.u64()?,
            },
            TAG_RAISE_CLUSTER_FORMAT => PlacementCommand::RaiseClusterFormat { format: r.u32()? },
            TAG_SET_SCHEDULER_PAUSED => PlacementCommand::SetSchedulerPaused {
                paused: match r.u8()? {
                    0 => false,
                    1 => true,
                    tag => {
                        return Err(DecodeError::BadTag {
                            what: "scheduler flag",
                            tag,
                        })
                    }
                },
            },
            tag => {
                return Err(DecodeError::BadTag {
                    what: "command",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(cmd)
    }
}

// ----- snapshots -----

impl PlacementMap {
    /// Encodes the whole map. Equal maps give equal bytes, and
    /// `restore(snapshot())` gives back an equal map.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = Out(Vec::with_capacity(128 + SLOT_COUNT as usize * 8));
        w.0.extend_from_slice(SNAPSHOT_MAGIC);
        let version = if self.cluster_format > FIRST_PLACEMENT_FORMAT {
            SNAPSHOT_VERSION_WITH_CLUSTER_FORMAT
        } else if self.scheduler_paused {
            SNAPSHOT_VERSION_WITH_SCHEDULER
        } else {
            SNAPSHOT_VERSION
        };
        w.0.extend_from_slice(&version.to_be_bytes());
        w.u64(self.version);
        w.len(self.replication_factor);
        w.u64(self.next_epoch);
        w.u64(self.next_shard_id);
        w.u64(self.next_migration_id);
        w.len(self.nodes.len());
        for node in self.nodes.values() {
            w.u64(node.node_id);
            w.str(&node.addr);
            w.state(node.state);
        }
        w.len(self.shards.len());
        for shard in self.shards.values() {
            w.u64(shard.shard_id);
            w.u64(shard.epoch);
            w.node_set(&shard.replicas);
        }
        // Fixed length (SLOT_COUNT entries), so no count.
        for &owner in &self.slot_owners {
            w.u64(owner);
        }
        match &self.migration {
            None => w.u8(0),
            Some(m) => {
                // 1: a migration between existing shards, 2: a split's (the
                // target was created for it). Snapshots written before splits
                // were recorded only hold 0 and 1.
                w.u8(if m.new_shard { 2 } else { 1 });
                w.u64(m.id);
                w.u64(m.from_shard);
                w.u64(m.to_shard);
                w.u64(m.epoch);
                w.slots(&m.slots);
            }
        }
        if version == SNAPSHOT_VERSION_WITH_CLUSTER_FORMAT {
            w.u8(u8::from(self.scheduler_paused));
            w.u32(self.cluster_format);
        } else if self.scheduler_paused {
            w.u8(1);
        }
        w.0
    }

    /// Rebuilds a map from [`PlacementMap::snapshot`] bytes and checks every
    /// invariant before handing it out.
    pub fn restore(bytes: &[u8]) -> Result<PlacementMap, DecodeError> {
        let mut r = In(bytes);
        if &r.array::<4>()? != SNAPSHOT_MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u16()?;
        if ![
            SNAPSHOT_VERSION,
            SNAPSHOT_VERSION_WITH_SCHEDULER,
            SNAPSHOT_VERSION_WITH_CLUSTER_FORMAT,
        ]
        .contains(&version)
        {
            return Err(DecodeError::UnsupportedVersion(version.into()));
        }
        let map_version = r.u64()?;
        let replication_factor = r.u32()? as usize;
        let next_epoch = r.u64()?;
        let next_shard_id = r.u64()?;
        let next_migration_id = r.u64()?;

        let node_count = r.count(8 + 4 + 1)?;
        if node_count > MAX_NODES {
            return Err(DecodeError::Invalid(format!("{node_count} nodes")));
        }
        let mut nodes = BTreeMap::new();
        for _ in 0..node_count {
            let node = NodeEntry {
                node_id: r.u64()?,
                addr: r.str()?,
                state: r.state()?,
            };
            if nodes
                .last_key_value()
                .is_some_and(|(&last, _)| last >= node.node_id)
            {
                return Err(DecodeError::Invalid("nodes not ascending".into()));
            }
            nodes.insert(node.node_id, node);
        }

        let shard_count = r.count(8 + 8 + 4)?;
        if shard_count > MAX_SHARDS {
            return Err(DecodeError::Invalid(format!("{shard_count} shards")));
        }
        let mut shards = BTreeMap::new();
        for _ in 0..shard_count {
            let shard = ShardPlacement {
                shard_id: r.u64()?,
                epoch: r.u64()?,
                replicas: r.node_set()?,
            };
            if shards
                .last_key_value()
                .is_some_and(|(&last, _)| last >= shard.shard_id)
            {
                return Err(DecodeError::Invalid("shards not ascending".into()));
            }
            shards.insert(shard.shard_id, shard);
        }

        let slot_owners = (0..SLOT_COUNT)
            .map(|_| r.u64())
            .collect::<Result<Vec<u64>, DecodeError>>()?;

        let migration = match r.u8()? {
            0 => None,
            flag @ (1 | 2) => Some(Migration {
                id: r.u64()?,
                from_shard: r.u64()?,
                to_shard: r.u64()?,
                epoch: r.u64()?,
                slots: r.slots()?,
                new_shard: flag == 2,
            }),
            tag => {
                return Err(DecodeError::BadTag {
                    what: "migration flag",
                    tag,
                })
            }
        };
        // Canonical: version 2 only ever says "paused" (an unpaused map is
        // written as version 1).
        // Version 3 always says both, and only ever a format above the
        // first.
        let scheduler_paused = match version {
            SNAPSHOT_VERSION_WITH_SCHEDULER => match r.u8()? {
                1 => true,
                tag => {
                    return Err(DecodeError::BadTag {
                        what: "scheduler flag",
                        tag,
                    })
                }
            },
            SNAPSHOT_VERSION_WITH_CLUSTER_FORMAT => match r.u8()? {
                0 => false,
                1 => true,
                tag => {
                    return Err(DecodeError::BadTag {
                        what: "scheduler flag",
                        tag,
                    })
                }
            },
            _ => false,
        };
        let cluster_format = if version == SNAPSHOT_VERSION_WITH_CLUSTER_FORMAT {
            let format = r.u32()?;
            if format <= FIRST_PLACEMENT_FORMAT {
                return Err(DecodeError::Invalid(format!(
                    "cluster format {format} in a version 3 snapshot"
                )));
            }
            format
        } else {
            FIRST_PLACEMENT_FORMAT
        };
        r.finish()?;

        let map = PlacementMap {
            version: map_version,
            replication_factor,
            next_epoch,
            next_shard_id,
            next_migration_id,
            nodes,
            shards,
            slot_owners,
            migration,
            scheduler_paused,
            cluster_format,
        };
        map.check_invariants().map_err(DecodeError::Invalid)?;
        Ok(map)
    }
}
