//! The multi-Raft store loop.
//!
//! One thread owns every shard replica on this node: its raft-rs `RawNode`
//! (over a `ShardStorage` on the node's single RocksDB) and its `LockTable`.
//! Each iteration of the loop:
//!
//! 1. blocks until something happens — a request, Raft messages from a peer,
//!    or a tick of the Raft timer (no sleep-polling);
//! 2. drains what else is queued (bounded), so many requests share the
//!    iteration;
//! 3. proposes each shard's queued commands as few Raft entries (up to
//!    `max_commands_per_entry` commands each), stamped with the leader's time;
//! 4. collects every shard's `Ready`, stages all of them into **one**
//!    `WriteBatch`, sends the leaders' appends, applies the entries already
//!    committed (answering the requests whose entries applied) and advances
//!    the `RawNode`s without waiting for the disk;
//! 5. hands the batch to the writer thread when the previous one has
//!    landed (one synced write for every shard: group commit); when it
//!    lands, the acknowledgements and votes that needed it leave.
//!
//! Replies come from apply: a request is answered only after its entry was
//! committed by a majority and applied. Waiting acquires stay registered
//! until an event from a later apply (grant, timeout, cancel) ends them.
//!
//! All I/O goes through the seams in [`io`]: the engine, where Raft messages
//! go ([`PeerSink`]) and the time ([`Clock`]). [`Store::run`] is the
//! event-driven loop production uses; it hands each iteration's input to
//! [`Store::step`], which a deterministic simulation calls directly
//! (docs/testing.md, "Deterministic simulation").
//!
//! # Where things are
//!
//! * [`store`] — the loop: [`Store`] opens every replica ([`Store::open`]),
//!   waits for work, and runs one iteration per wake-up ([`Store::step`]).
//! * [`msg`] — what the loop is sent ([`StoreMsg`]) and who waits for each
//!   command ([`Responder`]).
//! * [`replica`] — one shard replica on this node and what the loop
//!   publishes of it ([`ShardStatus`]).
//! * [`propose`] — queued commands become few Raft entries.
//! * [`ready`] — every shard's `Ready` staged into one batch, messages
//!   sent, committed entries applied; what a landed write releases.
//! * [`write`] — the write path: one batch in flight at a time, on a
//!   writer thread ([`WriteMode`]).
//! * [`apply`] — committed entries applied, requests answered, waiters,
//!   orphans and reads.
//! * [`membership`] — bootstrap, creating and destroying replicas,
//!   configuration changes.
//! * [`snapshot`] and [`compaction`] — state-machine snapshots: when, the
//!   table frozen on the loop and encoded on the snapshot thread, saving.
//! * [`payload`] — the entry payload and snapshot codecs (`fencelock-codec`,
//!   a pure crate of their own so the fuzzer reaches them).
//! * [`io`] — the seams: engine, [`PeerSink`], [`Clock`].
//! * [`config`], [`error`], [`metrics`], [`audit`], [`observe`], [`hot`] —
//!   the loop's configuration, error type, metrics, audit log, what it
//!   tells operators at apply, and the hot-resource tally.

mod apply;
pub mod audit;
mod compaction;
mod config;
mod error;
mod hot;
mod io;
mod membership;
pub mod metrics;
mod msg;
mod observe;
/// The entry payload and snapshot codecs live in `fencelock-codec`.
pub use fencelock_codec as payload;
mod propose;
mod ready;
mod replica;
#[cfg(feature = "simulation")]
mod sim;
mod snapshot;
mod store;
#[cfg(test)]
mod tests;
pub mod watch;
mod write;

pub use config::{RaftConfig, StoreConfig};
pub use error::StoreError;
pub use hot::{HotEntry, HOT_REPORTED_PER_SHARD};
pub use io::{wall_ms, Clock, Envelope, PeerSink, StoreIo, SystemClock};
pub use msg::{
    AcquireResult, Caller, MembershipChange, MetaResult, PeerInit, ReadReply, ReplyResult,
    Responder, StoreMsg, StoreSender,
};
pub use observe::Observers;
pub use payload::{
    decode_payload, decode_state, encode_frozen_state, encode_payload, encode_payload_at_epoch,
    encode_state, Payload,
};
pub use replica::ShardStatus;
#[cfg(feature = "simulation")]
pub use sim::{LeaderCommit, SimFault};
pub use store::Store;
pub use write::WriteMode;

/// Requests and messages drained per loop iteration before proposing: bounds
/// the latency one iteration adds while still batching under load.
pub(crate) const MAX_MSGS_PER_ITERATION: usize = 4_096;

/// Raft ticks a leader waits for a replica to take a snapshot it was sent
/// before sending it again. raft-rs holds a replica in its "snapshot"
/// state, sending it nothing, until the snapshot is reported done or
/// failed; a snapshot message lost on the way (the transport dropped it,
/// or it reached a node that had not created the replica yet) would
/// otherwise stall that replica forever.
pub(crate) const SNAPSHOT_RESEND_TICKS: u32 = 30;

/// How often, per proposal timeout, a ready leader looks for waiters whose
/// callers are not connected to it (see [`sweep_orphans`]).
pub(crate) const ORPHAN_SCANS_PER_GRACE: u32 = 4;

/// Entries kept in the log behind the latest snapshot (at most half the
/// snapshot interval), so a follower that is only a little behind catches up
/// from the log rather than by snapshot.
pub(crate) const LOG_KEEP_BEHIND_SNAPSHOT: u64 = 1_000;

/// A shard that leads with fewer token positions left in its epoch than
/// this asks the placement controller for a new epoch (`Node`'s epoch
/// task). Every log entry of the shard uses a position, not only grants:
/// at 10,000 entries per second this leaves about ten months, ample for a
/// retried hand-over, of the 2^40 - 2^36 positions an epoch grants before
/// refusing acquires (`TOKEN_SPACE_EXHAUSTED`).
pub const EPOCH_ADVANCE_POSITIONS_LEFT: u64 = 1 << 38;
