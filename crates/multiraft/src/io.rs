//! The store loop's seams to the outside world: where Raft messages go
//! ([`PeerSink`]), what time it is ([`Clock`]), and the bundle of both plus
//! the storage engine that [`super::Store::open_with`] takes ([`StoreIo`]).
//!
//! Production wires the gRPC transport, the system clock and RocksDB
//! (`Store::open`). The deterministic simulation (`crates/nemesis/tests/
//! simulation.rs`) wires a sink that captures messages, a clock it advances
//! itself and a `MemEngine` that can forget unsynced writes, and drives the
//! same store code one [`super::Store::step`] at a time.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use fencelock_storage::Engine;

use raft::prelude::Message;

/// One Raft message for one shard.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The shard (Raft group) the message belongs to.
    pub shard_id: u64,
    /// The Raft message itself.
    pub msg: Message,
}

/// Where the store loop sends Raft messages for other nodes (the peer
/// transport in production).
pub trait PeerSink: Send + Sync {
    /// Queues `envelopes` for node `to`; never blocks. Delivery is best
    /// effort: Raft retransmits what is lost.
    fn send(&self, to: u64, envelopes: Vec<Envelope>);

    /// Learns the address of node `node_id` (from the placement map).
    fn add_peer(&self, node_id: u64, addr: &str);
}

/// The store loop's view of time.
pub trait Clock: Send + Sync {
    /// Wall time in ms since the Unix epoch: where the lease clock of a
    /// table never stamped starts (a later leader never reads it; see
    /// `lease_clock_start`).
    fn wall_ms(&self) -> u64;

    /// Monotonic time: lease time within a term, proposal and read
    /// timeouts, metrics.
    fn now(&self) -> Instant;
}

/// The real clocks of the machine.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Everything the store loop does I/O through.
pub struct StoreIo {
    /// The node's key-value engine (every shard's storage shares it).
    pub engine: Arc<dyn Engine>,
    /// Outgoing Raft messages.
    pub sink: Arc<dyn PeerSink>,
    pub clock: Arc<dyn Clock>,
    /// raft-rs draws each election timeout from the thread RNG, which no
    /// seed controls. A driver that must replay exactly sets this: every
    /// timeout is then exactly `election_ticks`, and the driver's own
    /// seeded tick timing spreads the elections instead. Production: false.
    pub fixed_election_timeout: bool,
    /// How batches reach the disk: a writer thread in production
    /// ([`crate::WriteMode`]).
    pub write_mode: crate::WriteMode,
}

/// This node's wall clock, in ms since the Unix epoch.
pub fn wall_ms() -> u64 {
    SystemClock.wall_ms()
}
