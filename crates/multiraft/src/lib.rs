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
//!    `WriteBatch` and writes it with one synced write (group commit);
//! 5. sends messages, applies committed entries to the lock tables, answers
//!    the requests whose entries applied, and advances the `RawNode`s.
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

pub mod audit;
mod compaction;
mod config;
mod error;
mod hot;
mod io;
pub mod metrics;
mod observe;
mod payload;
#[cfg(feature = "simulation")]
mod sim;
#[cfg(test)]
mod tests;

pub use config::{RaftConfig, StoreConfig};
pub use error::StoreError;
pub use hot::{HotEntry, HOT_REPORTED_PER_SHARD};
pub use io::{Clock, Envelope, PeerSink, StoreIo, SystemClock};
pub use observe::Observers;
pub use payload::{
    decode_payload, decode_state, encode_payload, encode_payload_at_epoch, encode_state, Payload,
};
#[cfg(feature = "simulation")]
pub use sim::SimFault;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fencelock_placement::{PlacementCommand, PlacementMap, PlacementReply, META_SHARD_ID};
use fencelock_statemachine::{
    slot_of, AcquireReply, AcquireStatus, ApplyContext, Command, Event, LeaseId, LockError,
    LockTable, LockView, Reply, ResourceName, SlotSet, WaitEnd,
};
use fencelock_storage::{Engine, RocksEngine, ShardStorage, WriteBatch};
use raft::prelude::{Entry, EntryType, Message};
use raft::{RawNode, StateRole};
use tokio::sync::oneshot;

use fencelock_router::Router;

/// Requests and messages drained per loop iteration before proposing: bounds
/// the latency one iteration adds while still batching under load.
const MAX_MSGS_PER_ITERATION: usize = 4_096;
/// Raft ticks a leader waits for a replica to take a snapshot it was sent
/// before sending it again. raft-rs holds a replica in its "snapshot"
/// state, sending it nothing, until the snapshot is reported done or
/// failed; a snapshot message lost on the way (the transport dropped it,
/// or it reached a node that had not created the replica yet) would
/// otherwise stall that replica forever.
const SNAPSHOT_RESEND_TICKS: u32 = 30;
/// How often, per proposal timeout, a ready leader looks for waiters whose
/// callers are not connected to it (see [`sweep_orphans`]).
const ORPHAN_SCANS_PER_GRACE: u32 = 4;
/// Entries kept in the log behind the latest snapshot (at most half the
/// snapshot interval), so a follower that is only a little behind catches up
/// from the log rather than by snapshot.
const LOG_KEEP_BEHIND_SNAPSHOT: u64 = 1_000;

/// A shard that leads with fewer token positions left in its epoch than
/// this asks the placement controller for a new epoch (`Node`'s epoch
/// task). Every log entry of the shard uses a position, not only grants:
/// at 10,000 entries per second this leaves about ten months, ample for a
/// retried hand-over, of the 2^40 - 2^36 positions an epoch grants before
/// refusing acquires (`TOKEN_SPACE_EXHAUSTED`).
pub const EPOCH_ADVANCE_POSITIONS_LEFT: u64 = 1 << 38;

pub type AcquireResult = Result<AcquireReply, StoreError>;
pub type ReplyResult = Result<Reply, StoreError>;

/// Who waits for the outcome of one command.
pub enum Responder {
    /// Internal commands (ticks, leader changes, cancels).
    None,
    /// Renew, release, cancel, batch renew: answered at apply.
    Reply(oneshot::Sender<ReplyResult>),
    /// Acquire: answered when granted or when the wait ends.
    Acquire {
        resource: ResourceName,
        tx: oneshot::Sender<AcquireResult>,
    },
    /// A configuration change: answered when it applied.
    Done(oneshot::Sender<Result<(), StoreError>>),
    /// A placement command on the meta shard: answered at apply.
    Meta(oneshot::Sender<MetaResult>),
}

pub type MetaResult = Result<(PlacementReply, PlacementMap), StoreError>;

/// Who asked for a command, for the audit log: the client's address as the
/// node that received the call saw it (`None` for the node's own commands).
pub type Caller = Option<Arc<str>>;

/// How a new replica of a shard starts on this node.
#[derive(Clone, Debug)]
pub enum PeerInit {
    /// Empty, waiting for the leader's snapshot (a replica being added to
    /// an existing shard as a learner).
    Empty,
    /// A brand-new shard (a split): every initial replica starts from the
    /// same bootstrap snapshot with these voters, serving no slot yet.
    NewShard { voters: BTreeSet<u64>, epoch: u64 },
}

/// A linearizable read of one resource.
pub struct ReadReply {
    pub view: Option<LockView>,
    pub epoch: u64,
}

/// Everything the store loop reacts to.
pub enum StoreMsg {
    Propose {
        shard_id: u64,
        command: Command,
        responder: Responder,
        caller: Caller,
    },
    Read {
        shard_id: u64,
        resource: ResourceName,
        tx: oneshot::Sender<Result<ReadReply, StoreError>>,
    },
    Raft {
        envelopes: Vec<Envelope>,
    },
    /// Add or remove a replica of one shard (a Raft configuration change).
    ChangeMembership {
        shard_id: u64,
        change: MembershipChange,
        node_id: u64,
        tx: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Propose a placement command to the meta shard (this node must lead it).
    ProposeMeta {
        command: PlacementCommand,
        tx: oneshot::Sender<MetaResult>,
    },
    /// Start a replica of `shard_id` on this node (idempotent).
    CreatePeer {
        shard_id: u64,
        init: PeerInit,
        tx: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Delete this node's replica of `shard_id` and its data (idempotent):
    /// after the replica was removed from the shard's configuration.
    /// `removed`: the caller saw the shard's leader without this node
    /// (otherwise refused while the replica counts itself a member).
    DestroyPeer {
        shard_id: u64,
        removed: bool,
        tx: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Start the shard's next epoch, `epoch`, at a new entry of this node's
    /// ready leader replica of `shard_id`. Only for an epoch the placement
    /// controller handed this shard (`AdvanceEpoch`). Answered when that
    /// entry applied (it carries a `Tick`): `Ticked` once the shard is at
    /// `epoch`, `StaleEpoch` if it was already past it.
    AdoptEpoch {
        shard_id: u64,
        epoch: u64,
        tx: oneshot::Sender<ReplyResult>,
    },
    /// Ask this node's leader replica of `shard_id` to hand leadership to
    /// `to`; answered at once, the transfer completes asynchronously.
    TransferLeader {
        shard_id: u64,
        to: u64,
        tx: oneshot::Sender<Result<(), StoreError>>,
    },
    Shutdown,
}

/// One replica change. A replica that lost its data must be removed and
/// added back (as a learner, then a voter): rejoining under the same id with
/// an empty log could lose committed entries (docs/safety.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    AddVoter,
    AddLearner,
    Remove,
}

/// A proposal in flight.
struct Pending {
    term: u64,
    proposed_at: Instant,
    responders: Vec<Responder>,
    /// Parallel to `responders` for lock commands; empty otherwise.
    callers: Vec<Caller>,
}

/// What `take_pending` found for an entry.
#[derive(Default)]
struct Taken {
    responders: Vec<Responder>,
    callers: Vec<Caller>,
    proposed_at: Option<Instant>,
}

struct PendingRead {
    resource: ResourceName,
    tx: oneshot::Sender<Result<ReadReply, StoreError>>,
    asked_at: Instant,
    /// Set once raft reported the read index.
    index: Option<u64>,
}

/// An acquire waiting in a resource's queue.
struct Waiting {
    resource: ResourceName,
    /// The attempt this caller is (named in the `Cancel` if it goes away).
    attempt: u32,
    tx: oneshot::Sender<AcquireResult>,
    caller: Caller,
}

/// A waiter in the table whose caller is not registered with this leader
/// (see [`sweep_orphans`]).
struct Orphan {
    resource: ResourceName,
    /// Its latest attempt when it was first seen without a caller.
    attempt: u32,
    since: Instant,
}

/// The leader's clock: wall time read once at election plus monotonic time
/// since, so a wall-clock step during a term does not move lease time
/// (assumption A3 in docs/safety.md).
#[derive(Clone, Copy)]
struct LeaderClock {
    wall_ms_at_start: u64,
    started: Instant,
}

impl LeaderClock {
    /// Lease time at monotonic instant `now`.
    fn now_ms(&self, now: Instant) -> u64 {
        self.wall_ms_at_start + now.saturating_duration_since(self.started).as_millis() as u64
    }
}

/// This node's wall clock, in ms since the Unix epoch.
pub fn wall_ms() -> u64 {
    SystemClock.wall_ms()
}

/// One shard replica on this node.
struct Peer {
    shard_id: u64,
    raw: RawNode<ShardStorage<dyn Engine>>,
    table: LockTable,
    /// The placement map, on replicas of the meta shard only.
    placement: Option<PlacementMap>,
    queued: Vec<(Command, Responder, Caller)>,
    meta_queued: Vec<(PlacementCommand, oneshot::Sender<MetaResult>)>,
    /// An epoch to start at the next flush (see `StoreMsg::AdoptEpoch`).
    epoch_queued: Option<(u64, oneshot::Sender<ReplyResult>)>,
    pending: HashMap<u64, Pending>,
    reads: HashMap<u64, PendingRead>,
    waiting: HashMap<LeaseId, Waiting>,
    /// Ready leader: waiters nobody here waits for, since when.
    orphans: BTreeMap<LeaseId, Orphan>,
    /// Ready leader: when it next looks for orphans (`None`: at once).
    next_orphan_scan: Option<Instant>,
    /// How long a waiter may stay without a caller here before the leader
    /// cancels it: the proposal timeout.
    orphan_grace: Duration,
    clock: Option<LeaderClock>,
    /// Propose `LeaderChanged` at the next flush.
    needs_leader_changed: bool,
    /// When this leader last proposed its `LeaderChanged` entry: if it has
    /// not applied within the proposal timeout (dropped during a leadership
    /// transfer, say), it is proposed again rather than leaving the shard
    /// refusing requests forever.
    leader_changed_at: Option<Instant>,
    tick_in_flight: Option<u64>,
    applied_index: u64,
    applied_term: u64,
    last_snapshot_index: u64,
    /// Size of the latest snapshot's data: the saved one the replica
    /// started from, or the last it took or installed.
    last_snapshot_bytes: u64,
    snapshots_installed: u64,
    /// Since when this replica has known no leader.
    leaderless_since: Option<Instant>,
    /// The hottest resources, counted while this replica leads.
    hot: hot::HotCounter,
    /// Leader: ticks each replica has spent waiting for a snapshot
    /// (see [`SNAPSHOT_RESEND_TICKS`]).
    snapshot_wait_ticks: BTreeMap<u64, u32>,
}

impl Peer {
    fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Remembers who waits for the entry proposed with context `id` at
    /// `now`.
    fn track(&mut self, id: u64, responders: Vec<Responder>, now: Instant) {
        self.track_commands(id, responders, Vec::new(), now);
    }

    /// [`Peer::track`] for lock commands, with who asked for each.
    fn track_commands(
        &mut self,
        id: u64,
        responders: Vec<Responder>,
        callers: Vec<Caller>,
        now: Instant,
    ) {
        let term = self.raw.raft.term;
        self.pending.insert(
            id,
            Pending {
                term,
                proposed_at: now,
                responders,
                callers,
            },
        );
    }

    /// Leader whose `LeaderChanged` entry has been applied in its term.
    fn is_ready_leader(&self) -> bool {
        self.is_leader() && self.table.leader_term() == self.raw.raft.term
    }
}

/// Per-shard numbers for tests and admin views.
#[derive(Clone, Debug, Default)]
pub struct ShardStatus {
    pub shard_id: u64,
    pub leader_id: u64,
    pub term: u64,
    pub is_leader: bool,
    pub applied_index: u64,
    pub held: usize,
    /// Dedup entries this replica keeps (live and retained outcomes).
    pub dedup_entries: usize,
    /// Size of the latest snapshot's data: the one this replica started
    /// from, or the last it took or installed.
    pub snapshot_bytes: u64,
    /// Snapshots received from a leader and installed since start.
    pub snapshots_installed: u64,
    pub commit_index: u64,
    pub epoch: u64,
    /// Token positions left in the current epoch before new acquires are
    /// refused (see [`EPOCH_ADVANCE_POSITIONS_LEFT`]).
    pub token_positions_left: u64,
    pub waiters: usize,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// Slots this replica's table serves.
    pub owned_slots: u32,
    pub pending_exports: Vec<u64>,
    /// How long this replica has known no leader (0 while it knows one).
    pub leaderless_ms: u64,
    /// The hottest resources while this replica leads, most acquired first
    /// (at most [`HOT_REPORTED_PER_SHARD`]).
    pub hot: Vec<HotEntry>,
}

pub struct Store {
    node_id: u64,
    router: Arc<Router>,
    config: StoreConfig,
    engine: Arc<dyn Engine>,
    peers: BTreeMap<u64, Peer>,
    transport: Arc<dyn PeerSink>,
    /// Wall and monotonic time (the system clock in production).
    time: Arc<dyn Clock>,
    /// See [`StoreIo::fixed_election_timeout`].
    fixed_election_timeout: bool,
    inbox: Receiver<StoreMsg>,
    next_id: u64,
    status: Arc<std::sync::Mutex<Vec<ShardStatus>>>,
    /// Deferred, unsynced writes (commit index, applied snapshots): flushed
    /// with the next synced batch, or at the end of the iteration.
    deferred: WriteBatch,
    /// Metrics (thread-local, flushed per tick) and the audit sink.
    obs: Observers,
    /// A deliberate bug, armed only by the simulation's broken-variant test.
    #[cfg(feature = "simulation")]
    sim_fault: Option<SimFault>,
}

/// The store's side of the channel pair: requests come in here.
pub type StoreSender = Sender<StoreMsg>;

impl Store {
    /// Opens every shard replica on this node over RocksDB, the peer
    /// transport (`sink`) and the system clock: [`Store::open_with`] in production.
    pub fn open(
        config: StoreConfig,
        engine: Arc<RocksEngine>,
        sink: Arc<dyn PeerSink>,
        inbox: Receiver<StoreMsg>,
        status: Arc<std::sync::Mutex<Vec<ShardStatus>>>,
        router: Arc<Router>,
        obs: Observers,
    ) -> Result<Store, StoreError> {
        let io = StoreIo {
            engine,
            sink,
            clock: Arc::new(SystemClock),
            fixed_election_timeout: false,
        };
        Store::open_with(config, io, inbox, status, router, obs)
    }

    /// Opens every shard replica on this node; a fresh node of the initial
    /// cluster bootstraps them (see [`bootstrap_batch`]), a fresh node with
    /// `join = true` starts with none.
    pub fn open_with(
        config: StoreConfig,
        io: StoreIo,
        inbox: Receiver<StoreMsg>,
        status: Arc<std::sync::Mutex<Vec<ShardStatus>>>,
        router: Arc<Router>,
        obs: Observers,
    ) -> Result<Store, StoreError> {
        use fencelock_storage::meta;
        let StoreIo {
            engine,
            sink,
            clock,
            fixed_election_timeout,
        } = io;
        // Every node a newer map names gets a link, however this node
        // learned the map (its meta replica, an admin action's answer, a
        // fetch from a peer): the router tells the sink.
        {
            let sink = sink.clone();
            router.on_new_map(move |map| {
                for node in map.nodes() {
                    sink.add_peer(node.node_id, &node.addr);
                }
            });
        }
        let storage_err = |e: fencelock_storage::Error| StoreError::Storage(e.to_string());
        let node_id = config.node_id;
        let ident = meta::load_ident(engine.as_ref()).map_err(storage_err)?;
        if ident.is_none() {
            meta::init_store(
                engine.as_ref(),
                meta::NodeIdent {
                    cluster_id: 1,
                    node_id,
                },
            )
            .map_err(storage_err)?;
        } else if ident.as_ref().map(|i| i.node_id) != Some(node_id) {
            return Err(StoreError::Storage(format!(
                "data directory belongs to another node ({ident:?}), not node {node_id}"
            )));
        }
        let mut shards = meta::registered_shards(engine.as_ref()).map_err(storage_err)?;
        if shards.is_empty() && !config.join {
            let nodes: Vec<(u64, String)> = config.peer_map().into_iter().collect();
            let map = PlacementMap::bootstrap(
                &nodes,
                config.shard_count,
                config.replication_factor as usize,
            )
            .map_err(|e| StoreError::Storage(format!("cannot bootstrap the placement map: {e}")))?;
            let mut batch = WriteBatch::new();
            let mut storages = Vec::new();
            for shard in map.shards() {
                if !shard.replicas.contains(&node_id) {
                    continue;
                }
                let (table, placement) = if shard.shard_id == META_SHARD_ID {
                    (
                        bootstrap_table(&config, SlotSet::EMPTY, META_TABLE_EPOCH)?,
                        Some(&map),
                    )
                } else {
                    let slots: SlotSet = map.slots_of(shard.shard_id).into_iter().collect();
                    (bootstrap_table(&config, slots, shard.epoch)?, None)
                };
                let st = bootstrap_batch(
                    &engine,
                    shard.shard_id,
                    &shard.replicas,
                    &table,
                    placement,
                    &mut batch,
                )?;
                storages.push(st);
                shards.push(shard.shard_id);
            }
            engine.write(&batch, true).map_err(storage_err)?;
            for mut st in storages {
                st.on_persisted();
            }
        }
        let mut store = Store {
            node_id,
            router,
            config,
            engine,
            peers: BTreeMap::new(),
            transport: sink,
            time: clock,
            fixed_election_timeout,
            inbox,
            next_id: 1,
            status,
            deferred: WriteBatch::new(),
            obs,
            #[cfg(feature = "simulation")]
            sim_fault: None,
        };
        for shard_id in shards {
            let storage =
                ShardStorage::open(store.engine.clone(), shard_id).map_err(storage_err)?;
            store.add_peer(shard_id, storage)?;
        }
        store.publish_map();
        Ok(store)
    }

    /// Builds the in-memory replica over `storage`: restores its state from
    /// the latest snapshot (every initialized replica has one: the bootstrap
    /// snapshot at least), or starts empty for a replica waiting for one.
    fn add_peer(
        &mut self,
        shard_id: u64,
        storage: ShardStorage<dyn Engine>,
    ) -> Result<(), StoreError> {
        let storage_err = |e: fencelock_storage::Error| StoreError::Storage(e.to_string());
        // The saved snapshot's size is reported as the shard's snapshot
        // bytes from the start, not only after the next one is taken.
        let (table, placement, applied, applied_term, snapshot_bytes) = match storage
            .state_machine_snapshot()
        {
            Ok(Some(snap)) => {
                let (table, placement) = decode_state(snap.get_data())
                    .map_err(|e| StoreError::Storage(format!("shard {shard_id} snapshot: {e}")))?;
                let md = snap.get_metadata();
                let bytes = snap.get_data().len() as u64;
                (table, placement, md.index, md.term, bytes)
            }
            Ok(None) => (
                LockTable::with_slots(self.config.limits(), SlotSet::EMPTY)
                    .map_err(|e| StoreError::Internal(e.to_string()))?,
                None,
                0,
                0,
                0,
            ),
            Err(e) => return Err(storage_err(e)),
        };
        let raft_config = raft::Config {
            id: self.node_id,
            election_tick: self.config.raft.election_ticks as usize,
            heartbeat_tick: self.config.raft.heartbeat_ticks as usize,
            applied,
            // [election_ticks, election_ticks + 1): always election_ticks.
            max_election_tick: if self.fixed_election_timeout {
                self.config.raft.election_ticks as usize + 1
            } else {
                0
            },
            check_quorum: true,
            pre_vote: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_config, storage, &logger)
            .map_err(|e| StoreError::Storage(format!("shard {shard_id}: {e}")))?;
        self.peers.insert(
            shard_id,
            Peer {
                shard_id,
                raw,
                table,
                placement,
                queued: Vec::new(),
                meta_queued: Vec::new(),
                epoch_queued: None,
                pending: HashMap::new(),
                reads: HashMap::new(),
                waiting: HashMap::new(),
                orphans: BTreeMap::new(),
                next_orphan_scan: None,
                orphan_grace: Duration::from_millis(self.config.raft.proposal_timeout_ms),
                clock: None,
                needs_leader_changed: false,
                leader_changed_at: None,
                tick_in_flight: None,
                applied_index: applied,
                applied_term,
                last_snapshot_index: applied,
                last_snapshot_bytes: snapshot_bytes,
                snapshots_installed: 0,
                leaderless_since: None,
                hot: hot::HotCounter::new(self.time.now()),
                snapshot_wait_ticks: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Runs until a `Shutdown` message or until every sender is gone:
    /// blocks on the inbox and the Raft ticker, drains what else is queued
    /// (bounded), and hands it all to one [`Store::step`].
    pub fn run(mut self) {
        let ticker =
            crossbeam_channel::tick(Duration::from_millis(self.config.raft.tick_interval_ms));
        let window = self.config.raft.group_commit_window();
        let mut msgs = Vec::new();
        // When the previous iteration (and so its synced write) ended.
        let mut last_step_end = std::time::Instant::now();
        loop {
            let mut ticked = false;
            crossbeam_channel::select! {
                recv(self.inbox) -> msg => match msg {
                    Ok(StoreMsg::Shutdown) | Err(_) => break,
                    Ok(msg) => msgs.push(msg),
                },
                recv(ticker) -> _ => ticked = true,
            }
            let mut stop = false;
            // Group commit: an iteration that starts moments after the
            // previous one ended would sync a write carrying little. Under
            // load, wait (blocking on the inbox, not polling) until the
            // window since that write has passed, so each fsync carries
            // the requests and peer appends of the whole window. An idle
            // node is past the window already and does not wait.
            // A tick is due now: take what is queued without waiting.
            let deadline = if ticked {
                std::time::Instant::now()
            } else {
                last_step_end + window
            };
            while msgs.len() < MAX_MSGS_PER_ITERATION {
                match self.inbox.recv_deadline(deadline) {
                    Ok(StoreMsg::Shutdown) => {
                        stop = true;
                        break;
                    }
                    Ok(msg) => msgs.push(msg),
                    Err(_) => break,
                }
            }
            self.step(msgs.drain(..), ticked);
            last_step_end = std::time::Instant::now();
            if stop {
                break;
            }
        }
        self.close();
    }

    /// One iteration of the store loop: handles `msgs` in order, then, if
    /// `tick`, one Raft tick of every shard (timeouts, due lease expiry);
    /// then proposes, persists with one synced write, sends, applies and
    /// answers. [`Store::run`] calls it as events arrive; a simulation calls
    /// it directly and so decides when ticks happen. A `Shutdown` among
    /// `msgs` is ignored (stopping is the caller's decision).
    pub fn step(&mut self, msgs: impl IntoIterator<Item = StoreMsg>, tick: bool) {
        let started = self.time.now();
        for msg in msgs {
            self.handle(msg);
        }
        if tick {
            self.on_tick();
        }
        // Two rounds: a round can make a shard leader (it then proposes
        // its LeaderChanged entry) or produce follow-up work.
        for _ in 0..2 {
            self.flush_proposals();
            if !self.process_readies() {
                break;
            }
        }
        self.publish_map();
        let busy = self.time.now().saturating_duration_since(started);
        self.obs
            .metrics
            .iteration_seconds
            .observe(busy.as_secs_f64());
        // Status is for observers (tests, admin views): once per Raft
        // tick is fresh enough and keeps the lock off the busy path.
        if tick {
            self.publish_status();
            self.obs.metrics.flush();
        }
    }

    /// A clean stop: the deferred, unsynced writes (commit index, applied
    /// index, snapshots) go to disk before the database closes, so a clean
    /// restart replays nothing it had already applied; everyone still
    /// waiting is told the node is shutting down. (Dropping a `Store`
    /// without this is what a crash looks like.)
    pub fn close(mut self) {
        let deferred = std::mem::take(&mut self.deferred);
        if !deferred.is_empty() {
            self.write_or_die(&deferred, true);
        }
        self.obs.metrics.flush();
        self.fail_everything(|_| StoreError::ShuttingDown);
    }

    /// The node this store runs on.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// The clock-offset allowance a new leader's `LeaderChanged` carries.
    fn leader_changed_allowance_ms(&self) -> u64 {
        #[cfg(feature = "simulation")]
        if self.sim_fault == Some(SimFault::SkipLeaseExtension) {
            return 0;
        }
        self.config.raft.clock_offset_allowance_ms
    }

    fn handle(&mut self, msg: StoreMsg) {
        match msg {
            StoreMsg::Propose {
                shard_id,
                command,
                responder,
                caller,
            } => match self.ready_peer(shard_id) {
                Ok(peer) => peer.queued.push((command, responder, caller)),
                Err(e) => respond_err(responder, e),
            },
            StoreMsg::Read {
                shard_id,
                resource,
                tx,
            } => {
                let id = self.next_proposal_id();
                let now = self.time.now();
                let peer = match self.ready_peer(shard_id) {
                    Ok(peer) => peer,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                peer.raw.read_index(id.to_be_bytes().to_vec());
                peer.reads.insert(
                    id,
                    PendingRead {
                        resource,
                        tx,
                        asked_at: now,
                        index: None,
                    },
                );
            }
            StoreMsg::Raft { envelopes } => {
                for Envelope { shard_id, msg } in envelopes {
                    if let Some(peer) = self.peers.get_mut(&shard_id) {
                        // Errors here are stale or misdirected messages; Raft
                        // recovers by retransmission.
                        let _ = peer.raw.step(msg);
                    }
                }
            }
            StoreMsg::ChangeMembership {
                shard_id,
                change,
                node_id,
                tx,
            } => {
                let id = self.next_proposal_id();
                let now = self.time.now();
                let peer = match self.ready_peer(shard_id) {
                    Ok(peer) => peer,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let mut cc = raft::prelude::ConfChange::default();
                cc.set_change_type(match change {
                    MembershipChange::AddVoter => raft::prelude::ConfChangeType::AddNode,
                    MembershipChange::AddLearner => raft::prelude::ConfChangeType::AddLearnerNode,
                    MembershipChange::Remove => raft::prelude::ConfChangeType::RemoveNode,
                });
                cc.node_id = node_id;
                match peer.raw.propose_conf_change(id.to_be_bytes().to_vec(), cc) {
                    Ok(()) => peer.track(id, vec![Responder::Done(tx)], now),
                    Err(e) => {
                        let _ = tx.send(Err(StoreError::Internal(format!(
                            "configuration change refused: {e}"
                        ))));
                    }
                }
            }
            StoreMsg::ProposeMeta { command, tx } => match self.ready_peer(META_SHARD_ID) {
                Ok(peer) => peer.meta_queued.push((command, tx)),
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            },
            StoreMsg::CreatePeer { shard_id, init, tx } => {
                let _ = tx.send(self.create_peer(shard_id, init));
            }
            StoreMsg::DestroyPeer {
                shard_id,
                removed,
                tx,
            } => {
                let _ = tx.send(self.destroy_peer(shard_id, removed));
            }
            StoreMsg::AdoptEpoch {
                shard_id,
                epoch,
                tx,
            } => match self.ready_peer(shard_id) {
                Ok(peer) => {
                    if let Some((_, earlier)) = peer.epoch_queued.replace((epoch, tx)) {
                        respond_err(
                            Responder::Reply(earlier),
                            StoreError::Internal("replaced by a later epoch".into()),
                        );
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            },
            StoreMsg::TransferLeader { shard_id, to, tx } => {
                let is_leader = self.peers.get(&shard_id).map(|p| p.is_leader());
                let result = match is_leader {
                    None => Err(StoreError::ShardNotHere { shard_id }),
                    Some(false) => Err(self.leader_hint(shard_id)),
                    Some(true) => {
                        let peer = self.peers.get_mut(&shard_id).expect("checked");
                        peer.raw.transfer_leader(to);
                        Ok(())
                    }
                };
                let _ = tx.send(result);
            }
            StoreMsg::Shutdown => {}
        }
    }

    /// Starts a replica of `shard_id` here; nothing if one exists.
    fn create_peer(&mut self, shard_id: u64, init: PeerInit) -> Result<(), StoreError> {
        if self.peers.contains_key(&shard_id) {
            return Ok(());
        }
        let storage_err = |e: fencelock_storage::Error| StoreError::Storage(e.to_string());
        let mut batch = WriteBatch::new();
        let mut storage = match init {
            PeerInit::Empty => {
                fencelock_storage::meta::register_shard(&mut batch, shard_id);
                ShardStorage::open(self.engine.clone(), shard_id).map_err(storage_err)?
            }
            PeerInit::NewShard { voters, epoch } => {
                if !voters.contains(&self.node_id) {
                    return Err(StoreError::InvalidArgument {
                        field: "voters",
                        reason: format!("node {} is not among {voters:?}", self.node_id),
                    });
                }
                let table = bootstrap_table(&self.config, SlotSet::EMPTY, epoch)?;
                bootstrap_batch(&self.engine, shard_id, &voters, &table, None, &mut batch)?
            }
        };
        self.write_or_die(&batch, true);
        storage.on_persisted();
        self.add_peer(shard_id, storage)
    }

    /// Deletes this node's replica of `shard_id` and everything it stored.
    /// Refused while this replica counts itself a member of the shard's
    /// configuration, unless `removed` (the caller saw the leader's
    /// configuration without this node): deleting a member's data is what
    /// docs/safety.md forbids. A replica never deletes itself on applying
    /// its own removal: a replica re-added later replays that removal from
    /// an older snapshot on its way to the configuration that has it again.
    fn destroy_peer(&mut self, shard_id: u64, removed: bool) -> Result<(), StoreError> {
        let Some(peer) = self.peers.get(&shard_id) else {
            return Ok(());
        };
        let conf = peer.raw.raft.prs().conf().to_conf_state();
        let member = conf.voters.contains(&self.node_id) || conf.learners.contains(&self.node_id);
        if member && !removed {
            return Err(StoreError::InvalidArgument {
                field: "shard_id",
                reason: format!(
                    "node {} is still a member of shard {shard_id}; remove it from the shard first",
                    self.node_id
                ),
            });
        }
        // The replica's deferred writes (a snapshot, a compaction, the
        // commit index) go to disk before its deletion does: written after
        // it, they would bring back records of a replica that no longer
        // exists, for a later replica of the same shard to find.
        self.flush_deferred();
        let mut peer = self.peers.remove(&shard_id).expect("checked");
        fail_peer(&mut peer, StoreError::ShardNotHere { shard_id });
        let mut batch = WriteBatch::new();
        peer.raw
            .mut_store()
            .destroy(&mut batch)
            .map_err(|e| StoreError::Storage(e.to_string()))?;
        fencelock_storage::meta::unregister_shard(&mut batch, shard_id);
        self.write_or_die(&batch, true);
        peer.raw.mut_store().on_persisted();
        tracing::info!(shard_id, "replica destroyed");
        Ok(())
    }

    /// Hands the meta replica's map to the router (and new node addresses
    /// to the transport) when it is newer than what the router has.
    fn publish_map(&self) {
        let Some(map) = self
            .peers
            .get(&META_SHARD_ID)
            .and_then(|p| p.placement.as_ref())
        else {
            return;
        };
        if map.version() <= self.router.map_version() {
            return;
        }
        // The router's listener (see `open_with`) links the map's nodes.
        self.router.offer_map(map.clone());
    }

    /// The shard's replica if it is a leader ready to serve; otherwise the
    /// refusal that tells the caller where to go. The hint is only built on
    /// refusal: the ready path is every request's path.
    fn ready_peer(&mut self, shard_id: u64) -> Result<&mut Peer, StoreError> {
        match self.peers.get(&shard_id) {
            None => Err(StoreError::ShardNotHere { shard_id }),
            Some(peer) if !peer.is_ready_leader() => Err(self.leader_hint(shard_id)),
            Some(_) => Ok(self.peers.get_mut(&shard_id).expect("checked above")),
        }
    }

    /// NotLeader with the leader's address, LeaderNotReady, or LeaderUnknown.
    fn leader_hint(&self, shard_id: u64) -> StoreError {
        let Some(peer) = self.peers.get(&shard_id) else {
            return StoreError::LeaderUnknown { shard_id };
        };
        let leader_id = peer.raw.raft.leader_id;
        if leader_id == 0 {
            return StoreError::LeaderUnknown { shard_id };
        }
        if leader_id == self.node_id {
            // We are the leader but not ready yet.
            return StoreError::LeaderNotReady { shard_id };
        }
        StoreError::NotLeader {
            shard_id,
            leader: self.router.leader_info(leader_id),
        }
    }

    fn next_proposal_id(&mut self) -> u64 {
        // Unique across nodes: a follower never mistakes another node's entry
        // for one of its own proposals.
        self.next_id += 1;
        (self.node_id << 48) | (self.next_id & ((1 << 48) - 1))
    }

    fn on_tick(&mut self) {
        let timeout = Duration::from_millis(self.config.raft.proposal_timeout_ms);
        let now = self.time.now();
        let older = |at: Instant| now.saturating_duration_since(at) > timeout;
        let mut ticks = Vec::new();
        for peer in self.peers.values_mut() {
            peer.raw.tick();
            resend_lost_snapshots(peer);
            // Requests that did not commit in time: the entry may still
            // commit later, so the outcome is unknown (retry by requestId).
            let expired: Vec<u64> = peer
                .pending
                .iter()
                .filter(|(_, p)| older(p.proposed_at))
                .map(|(id, _)| *id)
                .collect();
            for id in expired {
                if let Some(p) = peer.pending.remove(&id) {
                    for r in p.responders {
                        respond_err(
                            r,
                            StoreError::OutcomeUnknown {
                                shard_id: peer.shard_id,
                            },
                        );
                    }
                }
                if peer.tick_in_flight == Some(id) {
                    peer.tick_in_flight = None;
                }
            }
            let stale_reads: Vec<u64> = peer
                .reads
                .iter()
                .filter(|(_, r)| older(r.asked_at))
                .map(|(id, _)| *id)
                .collect();
            for id in stale_reads {
                if let Some(r) = peer.reads.remove(&id) {
                    let _ = r.tx.send(Err(StoreError::NoQuorum {
                        shard_id: peer.shard_id,
                    }));
                }
            }
            // A waiting caller that went away: remove its waiter through Raft.
            // Sorted: the cancels' order in the log must not depend on hash
            // order (a seeded simulation replays it exactly). Only a ready
            // leader proposes; until then the caller stays registered, and
            // if leadership is lost instead, the next leader finds the
            // waiter without a caller and cancels it (`sweep_orphans`).
            if peer.is_ready_leader() {
                let mut gone: Vec<LeaseId> = peer
                    .waiting
                    .iter()
                    .filter(|(_, w)| w.tx.is_closed())
                    .map(|(l, _)| *l)
                    .collect();
                gone.sort_unstable();
                for lease_id in gone {
                    if let Some(w) = peer.waiting.remove(&lease_id) {
                        queue_cancel(peer, w.resource, lease_id, w.attempt, w.caller);
                    }
                }
                sweep_orphans(peer, now, false);
            }
            if peer.is_leader()
                && !peer.is_ready_leader()
                && peer.leader_changed_at.is_none_or(older)
            {
                peer.needs_leader_changed = true;
            }
            if peer.is_ready_leader() && peer.tick_in_flight.is_none() {
                let now_ms = peer.clock.map(|c| c.now_ms(now)).unwrap_or(0);
                if peer.table.next_due_ms().is_some_and(|due| due <= now_ms) {
                    ticks.push(peer.shard_id);
                }
            }
        }
        for shard_id in ticks {
            let peer = self.peers.get_mut(&shard_id).expect("listed above");
            peer.queued.push((Command::Tick, Responder::None, None));
        }
        for peer in self.peers.values_mut() {
            peer.hot.decay(now);
        }
    }

    /// Proposes each shard's queued commands as few entries.
    fn flush_proposals(&mut self) {
        let max = self.config.raft.max_commands_per_entry as usize;
        let allowance = self.leader_changed_allowance_ms();
        let now = self.time.now();
        let wall_ms = self.time.wall_ms();
        let shard_ids: Vec<u64> = self.peers.keys().copied().collect();
        for shard_id in shard_ids {
            let needs_lc = {
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                std::mem::take(&mut peer.needs_leader_changed) && peer.is_leader()
            };
            if needs_lc {
                let id = self.next_proposal_id();
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                let now_ms = peer.clock.map(|c| c.now_ms(now)).unwrap_or(wall_ms);
                let cmd = Command::LeaderChanged {
                    clock_offset_allowance_ms: allowance,
                };
                let data = encode_payload(now_ms, std::slice::from_ref(&cmd));
                if peer.raw.propose(id.to_be_bytes().to_vec(), data).is_ok() {
                    peer.leader_changed_at = Some(now);
                    peer.track(id, vec![Responder::None], now);
                }
            }
            let adopt = {
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                peer.epoch_queued.take()
            };
            if let Some((epoch, tx)) = adopt {
                let id = self.next_proposal_id();
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                let responder = Responder::Reply(tx);
                match peer.clock.filter(|_| peer.is_leader()) {
                    None => respond_err(responder, StoreError::LeaderUnknown { shard_id }),
                    Some(clock) => {
                        // A Tick: the entry must carry a command for the
                        // table to apply at the new epoch, and a Tick
                        // changes nothing that is not due anyway.
                        let data =
                            encode_payload_at_epoch(clock.now_ms(now), epoch, &[Command::Tick]);
                        match peer.raw.propose(id.to_be_bytes().to_vec(), data) {
                            Ok(()) => peer.track_commands(id, vec![responder], vec![None], now),
                            Err(_) => {
                                respond_err(responder, StoreError::LeaderUnknown { shard_id })
                            }
                        }
                    }
                }
            }
            let mut refused_cancels = Vec::new();
            loop {
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                if peer.queued.is_empty() {
                    break;
                }
                let take = peer.queued.len().min(max);
                let chunk: Vec<(Command, Responder, Caller)> = peer.queued.drain(..take).collect();
                let id = self.next_proposal_id();
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                let Some(clock) = peer.clock.filter(|_| peer.is_leader()) else {
                    let hint_err = StoreError::LeaderUnknown { shard_id };
                    for (_, r, _) in chunk {
                        respond_err(r, hint_err.clone());
                    }
                    continue;
                };
                let mut commands = Vec::with_capacity(chunk.len());
                let mut responders = Vec::with_capacity(chunk.len());
                let mut callers = Vec::with_capacity(chunk.len());
                for (command, responder, caller) in chunk {
                    commands.push(command);
                    responders.push(responder);
                    callers.push(caller);
                }
                let is_tick = commands.iter().any(|c| matches!(c, Command::Tick));
                let data = encode_payload(clock.now_ms(now), &commands);
                match peer.raw.propose(id.to_be_bytes().to_vec(), data) {
                    Ok(()) => {
                        if is_tick {
                            peer.tick_in_flight = Some(id);
                        }
                        self.obs.metrics.commands_since_sync += commands.len() as u64;
                        peer.track_commands(id, responders, callers, now);
                    }
                    Err(_) => {
                        // Refused while leading (a leadership transfer in
                        // progress): a cancel for a gone caller is kept for
                        // the next flush; if leadership moves, the next
                        // leader cancels the waiter (`sweep_orphans`).
                        let chunk = commands.into_iter().zip(responders).zip(callers);
                        for ((command, responder), caller) in chunk {
                            match (command, responder) {
                                (command @ Command::Cancel { .. }, Responder::None) => {
                                    refused_cancels.push((command, Responder::None, caller));
                                }
                                (_, r) => respond_err(r, StoreError::LeaderUnknown { shard_id }),
                            }
                        }
                    }
                }
            }
            let peer = self.peers.get_mut(&shard_id).expect("listed");
            peer.queued.append(&mut refused_cancels);
            if peer.meta_queued.is_empty() {
                continue;
            }
            let chunk = std::mem::take(&mut peer.meta_queued);
            let (commands, txs): (Vec<PlacementCommand>, Vec<_>) = chunk.into_iter().unzip();
            let responders: Vec<Responder> = txs.into_iter().map(Responder::Meta).collect();
            let Some(clock) = peer.clock.filter(|_| peer.is_leader()) else {
                for r in responders {
                    respond_err(r, StoreError::LeaderUnknown { shard_id });
                }
                continue;
            };
            let data = payload::encode_placement_payload(clock.now_ms(now), &commands);
            let id = self.next_proposal_id();
            let peer = self.peers.get_mut(&shard_id).expect("listed");
            match peer.raw.propose(id.to_be_bytes().to_vec(), data) {
                Ok(()) => peer.track(id, responders, now),
                Err(_) => {
                    for r in responders {
                        respond_err(r, StoreError::LeaderUnknown { shard_id });
                    }
                }
            }
        }
    }

    /// Handles every shard's `Ready` with one synced write. Returns whether
    /// any shard had one.
    fn process_readies(&mut self) -> bool {
        let mut batch = std::mem::take(&mut self.deferred);
        let mut readies = Vec::new();
        let mut outbox: BTreeMap<u64, Vec<Envelope>> = BTreeMap::new();
        let mut failed = false;
        let mut entries_staged = 0u64;
        let mut snapshots_sent = 0u64;
        for (shard_id, peer) in self.peers.iter_mut() {
            if !peer.raw.has_ready() {
                continue;
            }
            let mut rd = peer.raw.ready();
            if let Some(ss) = rd.ss() {
                let role = ss.raft_state;
                if role == StateRole::Leader && peer.clock.is_none() {
                    self.obs.metrics.leader_changes.inc();
                }
                on_role_change(peer, role, self.time.as_ref());
            }
            entries_staged += rd.entries().len() as u64;
            // A leader may send before persisting (Raft thesis 10.2.1).
            snapshots_sent += queue_messages(&mut outbox, *shard_id, rd.take_messages());
            let store = peer.raw.mut_store();
            let mut snapshot_data = None;
            if !rd.snapshot().is_empty() {
                if store.apply_snapshot(rd.snapshot(), &mut batch).is_err() {
                    failed = true;
                }
                snapshot_data = Some(rd.snapshot().clone());
            }
            if !rd.entries().is_empty() && store.append(rd.entries(), &mut batch).is_err() {
                failed = true;
            }
            if let Some(hs) = rd.hs() {
                if store.set_hard_state(hs, &mut batch).is_err() {
                    failed = true;
                }
            }
            for rs in rd.take_read_states() {
                let id = u64_from_ctx(&rs.request_ctx);
                if let Some(r) = id.and_then(|id| peer.reads.get_mut(&id)) {
                    r.index = Some(rs.index);
                }
            }
            readies.push((*shard_id, rd, snapshot_data, self.time.now()));
        }
        if readies.is_empty() {
            if !batch.is_empty() {
                self.write_or_die(&batch, false);
                self.mark_persisted();
            }
            return false;
        }
        if failed {
            // Staging refused something raft-rs handed us: the node cannot
            // continue safely. Crash rather than guess; restart recovers
            // from the durable state.
            panic!("fencelock: staging a Raft ready failed; stopping the node");
        }
        let synced_at = self.time.now();
        // Failpoints (feature `failpoints`, docs/testing.md): a slow disk on
        // a leader, and a crash (abort: no unwinding, like SIGKILL) with
        // entries durable but nothing sent, applied or answered.
        if self.peers.values().any(Peer::is_leader) {
            fail::fail_point!("store::leader_sync");
        }
        self.write_or_die(&batch, true);
        // Every shard whose staging was in the batch sees it now, not only
        // the shards with a ready: the deferred part carries the snapshot
        // saves and compactions of shards that may be idle this time, and
        // raft-rs may read their storage before their next ready.
        self.mark_persisted();
        fail::fail_point!("store::after_persist", |_| std::process::abort());
        let m = &mut self.obs.metrics;
        m.fsync_seconds.observe(
            self.time
                .now()
                .saturating_duration_since(synced_at)
                .as_secs_f64(),
        );
        m.fsync_entries.observe(entries_staged as f64);
        m.fsync_commands
            .observe(std::mem::take(&mut m.commands_since_sync) as f64);
        self.send_outbox(outbox);
        let mut outbox: BTreeMap<u64, Vec<Envelope>> = BTreeMap::new();
        for (shard_id, mut rd, snapshot, committed_at) in readies {
            let peer = self.peers.get_mut(&shard_id).expect("listed");
            let mut obs = observe::ApplyObs {
                metrics: &mut self.obs.metrics,
                audit: &self.obs.audit,
                clock: self.time.as_ref(),
                committed_at,
            };
            if let Some(snap) = snapshot {
                fail::fail_point!("store::snapshot_install", |_| std::process::abort());
                match decode_state(snap.get_data()) {
                    Ok((table, placement)) => {
                        peer.table = table;
                        peer.placement = placement;
                        peer.applied_index = snap.get_metadata().index;
                        peer.applied_term = snap.get_metadata().term;
                        peer.last_snapshot_index = peer.applied_index;
                        peer.last_snapshot_bytes = snap.get_data().len() as u64;
                        peer.snapshots_installed += 1;
                        obs.metrics.snapshots_installed.inc();
                    }
                    Err(e) => {
                        panic!("fencelock: shard {shard_id} received a corrupt snapshot: {e}")
                    }
                }
            }
            snapshots_sent += queue_messages(&mut outbox, shard_id, rd.take_persisted_messages());
            apply_entries(
                peer,
                rd.take_committed_entries(),
                &mut self.deferred,
                &mut obs,
            );
            let mut light = peer.raw.advance(rd);
            if let Some(commit) = light.commit_index() {
                let staged = peer
                    .raw
                    .mut_store()
                    .set_commit_index(commit, &mut self.deferred);
                staged_or_die(shard_id, "the commit index", staged);
            }
            snapshots_sent += queue_messages(&mut outbox, shard_id, light.take_messages());
            // Entries the light ready commits were learned just now.
            obs.committed_at = self.time.now();
            apply_entries(
                peer,
                light.take_committed_entries(),
                &mut self.deferred,
                &mut obs,
            );
            peer.raw.advance_apply();
            // Informational on disk (restart replays from the snapshot), but
            // it tells operators and tools how far each replica had applied.
            let applied = peer.applied_index;
            if applied > peer.raw.store().applied_index() {
                let staged = peer
                    .raw
                    .mut_store()
                    .set_applied_index(applied, &mut self.deferred);
                staged_or_die(shard_id, "the applied index", staged);
            }
            serve_reads(peer);
            // raft-rs asked for a snapshot newer than the saved one (a
            // replica was added since): take one at the applied index.
            let requested = peer.raw.store().take_snapshot_request();
            let force = requested.is_some_and(|i| peer.applied_index >= i);
            if requested.is_some() && !force {
                // Not applied that far yet: ask again next time.
                peer.raw.store().request_snapshot(requested.unwrap_or(0));
            }
            let interval = self.config.raft.snapshot_interval_entries;
            if snapshot_wanted(peer, interval, force) {
                // Timed only when taken: this runs per shard per iteration.
                let started = self.time.now();
                take_snapshot(peer, interval, &mut self.deferred);
                obs.metrics.snapshots_taken.inc();
                obs.metrics.snapshot_seconds.observe(
                    self.time
                        .now()
                        .saturating_duration_since(started)
                        .as_secs_f64(),
                );
            }
        }
        self.obs.metrics.snapshots_sent.inc_by(snapshots_sent);
        self.send_outbox(outbox);
        true
    }

    /// Makes every shard's staged writes visible to its raft-rs storage:
    /// call right after writing the batch that holds them. Every write the
    /// store stages goes into [`Store::deferred`] or into the batch that
    /// starts from it (a replica's creation and destruction write their own
    /// batch at once), so after that batch is written nothing staged
    /// anywhere is still unwritten. A shard left out would keep a view that
    /// contradicts the disk (entries compacted away, snapshot metadata
    /// replaced) until its next ready, and raft-rs fails on such a read.
    fn mark_persisted(&mut self) {
        for peer in self.peers.values_mut() {
            let store = peer.raw.mut_store();
            if store.has_staged() {
                store.on_persisted();
            }
        }
    }

    /// Writes the deferred batch now (unsynced, like at the end of an
    /// iteration) and makes it visible.
    fn flush_deferred(&mut self) {
        let deferred = std::mem::take(&mut self.deferred);
        if !deferred.is_empty() {
            self.write_or_die(&deferred, false);
        }
        self.mark_persisted();
    }

    fn write_or_die(&self, batch: &WriteBatch, sync: bool) {
        if let Err(e) = self.engine.write(batch, sync) {
            // A failed fsync leaves the disk in an unknown state: the only
            // safe reaction is to stop (the PostgreSQL fsync lesson).
            panic!("fencelock: RocksDB write failed: {e}");
        }
    }

    fn send_outbox(&self, outbox: BTreeMap<u64, Vec<Envelope>>) {
        for (to, envelopes) in outbox {
            self.transport.send(to, envelopes);
        }
    }

    fn publish_status(&mut self) {
        let now = self.time.now();
        for p in self.peers.values_mut() {
            if p.raw.raft.leader_id == 0 {
                p.leaderless_since.get_or_insert(now);
            } else {
                p.leaderless_since = None;
            }
        }
        let status: Vec<ShardStatus> = self
            .peers
            .values()
            .map(|p| {
                let conf = p.raw.raft.prs().conf().to_conf_state();
                ShardStatus {
                    shard_id: p.shard_id,
                    leader_id: p.raw.raft.leader_id,
                    term: p.raw.raft.term,
                    is_leader: p.is_ready_leader(),
                    applied_index: p.applied_index,
                    held: p.table.held_count(),
                    dedup_entries: p.table.dedup_count(),
                    snapshot_bytes: p.last_snapshot_bytes,
                    snapshots_installed: p.snapshots_installed,
                    commit_index: p.raw.raft.raft_log.committed,
                    epoch: p.table.epoch(),
                    token_positions_left: p.table.token_positions_left(),
                    waiters: p.table.waiter_count(),
                    voters: conf.voters.clone(),
                    learners: conf.learners.clone(),
                    owned_slots: p.table.owned_slots().len(),
                    pending_exports: p.table.pending_exports(),
                    leaderless_ms: p
                        .leaderless_since
                        .map(|t| now.duration_since(t).as_millis() as u64)
                        .unwrap_or(0),
                    hot: if p.is_leader() {
                        p.hot.top(HOT_REPORTED_PER_SHARD)
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect();
        for st in &status {
            self.router.note_leader(st.shard_id, st.leader_id);
        }
        if let Ok(mut s) = self.status.lock() {
            *s = status;
        }
    }

    fn fail_everything(&mut self, err: impl Fn(u64) -> StoreError) {
        for peer in self.peers.values_mut() {
            let e = err(peer.shard_id);
            fail_peer(peer, e);
        }
    }
}

/// Answers everything waiting on `peer` with `e`.
fn fail_peer(peer: &mut Peer, e: StoreError) {
    for (_, p) in peer.pending.drain() {
        for r in p.responders {
            respond_err(r, e.clone());
        }
    }
    for (_, r, _) in peer.queued.drain(..) {
        respond_err(r, e.clone());
    }
    for (_, tx) in peer.meta_queued.drain(..) {
        let _ = tx.send(Err(e.clone()));
    }
    if let Some((_, tx)) = peer.epoch_queued.take() {
        let _ = tx.send(Err(e.clone()));
    }
    for (_, r) in peer.reads.drain() {
        let _ = r.tx.send(Err(e.clone()));
    }
    for (_, w) in peer.waiting.drain() {
        let _ = w.tx.send(Err(e.clone()));
    }
}

/// Leader: a replica that has waited [`SNAPSHOT_RESEND_TICKS`] for a
/// snapshot is reported as failed to take it, so raft-rs probes it again
/// and sends a snapshot anew. A replica that did take it answered long
/// before and is out of the snapshot state already; one that is slow to
/// install gets a duplicate, which it ignores.
fn resend_lost_snapshots(peer: &mut Peer) {
    if peer.raw.raft.state != StateRole::Leader {
        peer.snapshot_wait_ticks.clear();
        return;
    }
    let any_waiting = peer
        .raw
        .raft
        .prs()
        .iter()
        .any(|(_, pr)| pr.state == raft::ProgressState::Snapshot);
    if !any_waiting {
        peer.snapshot_wait_ticks.clear();
        return;
    }
    let waiting: Vec<u64> = peer
        .raw
        .raft
        .prs()
        .iter()
        .filter(|(_, pr)| pr.state == raft::ProgressState::Snapshot)
        .map(|(id, _)| *id)
        .collect();
    peer.snapshot_wait_ticks
        .retain(|id, _| waiting.contains(id));
    for id in waiting {
        let ticks = peer.snapshot_wait_ticks.entry(id).or_insert(0);
        *ticks += 1;
        if *ticks >= SNAPSHOT_RESEND_TICKS {
            *ticks = 0;
            peer.raw.report_snapshot(id, raft::SnapshotStatus::Failure);
        }
    }
}

/// Puts `msgs` in `outbox` by destination; returns how many are snapshots.
fn queue_messages(
    outbox: &mut BTreeMap<u64, Vec<Envelope>>,
    shard_id: u64,
    msgs: Vec<Message>,
) -> u64 {
    let mut snapshots = 0;
    for msg in msgs {
        if msg.get_msg_type() == raft::prelude::MessageType::MsgSnapshot {
            snapshots += 1;
        }
        outbox
            .entry(msg.to)
            .or_default()
            .push(Envelope { shard_id, msg });
    }
    snapshots
}

fn on_role_change(peer: &mut Peer, role: StateRole, time: &dyn Clock) {
    if role == StateRole::Leader {
        // Lease time continues from the highest stamp in the log, never
        // earlier, even if this node's wall clock is behind.
        let start = time.wall_ms().max(peer.table.clock_ms());
        peer.clock = Some(LeaderClock {
            wall_ms_at_start: start,
            started: time.now(),
        });
        peer.needs_leader_changed = true;
        return;
    }
    peer.clock = None;
    peer.hot.clear();
    peer.orphans.clear();
    peer.next_orphan_scan = None;
    peer.needs_leader_changed = false;
    peer.leader_changed_at = None;
    peer.tick_in_flight = None;
    // Entries already proposed may still commit under the next leader: their
    // outcome is unknown, and a retry by requestId finds it.
    let shard_id = peer.shard_id;
    for (_, p) in peer.pending.drain() {
        for r in p.responders {
            respond_err(r, StoreError::OutcomeUnknown { shard_id });
        }
    }
    for (_, r, _) in peer.queued.drain(..) {
        respond_err(r, StoreError::LeaderUnknown { shard_id });
    }
    for (_, tx) in peer.meta_queued.drain(..) {
        let _ = tx.send(Err(StoreError::LeaderUnknown { shard_id }));
    }
    if let Some((_, tx)) = peer.epoch_queued.take() {
        let _ = tx.send(Err(StoreError::LeaderUnknown { shard_id }));
    }
    for (_, r) in peer.reads.drain() {
        let _ = r.tx.send(Err(StoreError::LeaderUnknown { shard_id }));
    }
    for (_, w) in peer.waiting.drain() {
        let _ = w.tx.send(Err(StoreError::OutcomeUnknown { shard_id }));
    }
}

fn apply_entries(
    peer: &mut Peer,
    entries: Vec<Entry>,
    batch: &mut WriteBatch,
    obs: &mut observe::ApplyObs<'_>,
) {
    let mut applied_normal = 0u32;
    for entry in entries {
        if entry.index <= peer.applied_index {
            continue;
        }
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
                "fencelock: shard {} entry {} does not decode: {e}",
                peer.shard_id, entry.index
            ),
        };
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
            let responder = responders.next().unwrap_or(Responder::None);
            respond(peer, responder, outcome.reply, caller);
        }
        applied_normal += 1;
    }
    // One clock read per apply pass, not per entry: every entry of the pass
    // is applied by its end.
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
fn apply_placement(peer: &mut Peer, commands: &[PlacementCommand], responders: Vec<Responder>) {
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
fn take_pending(peer: &mut Peer, entry: &Entry) -> Taken {
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

/// Applies a replica change to raft-rs and stages the new configuration.
///
/// The answer is an error only when nothing changed: raft-rs refuses a
/// change before it touches its configuration (and every replica refuses
/// the same entry alike). Once raft-rs applied it, the new configuration
/// must reach the storage; a refused staging stops the node rather than
/// answer "failed" for a change that happened.
fn apply_conf_change(
    peer: &mut Peer,
    entry: &Entry,
    responders: Vec<Responder>,
    batch: &mut WriteBatch,
) {
    use protobuf::Message as _;
    let cc = match raft::prelude::ConfChange::parse_from_bytes(&entry.data) {
        Ok(cc) => cc,
        Err(e) => panic!(
            "fencelock: shard {} configuration change {} does not decode: {e}",
            peer.shard_id, entry.index
        ),
    };
    let result = match peer.raw.apply_conf_change(&cc) {
        Ok(cs) => {
            let staged = peer.raw.mut_store().set_conf_state(&cs, batch);
            staged_or_die(peer.shard_id, "a configuration", staged);
            Ok(())
        }
        Err(e) => Err(StoreError::Internal(format!(
            "configuration change refused: {e}"
        ))),
    };
    for r in responders {
        if let Responder::Done(tx) = r {
            let _ = tx.send(result.clone());
        }
    }
}

fn respond(
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
fn on_event(
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
            Event::LeaseEnded { .. } => None,
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
    }
}

/// Queues the `Cancel` of `attempt` of `lease_id`, whose caller is gone.
/// The state machine ignores it if a later attempt (a retry by request id,
/// which may have been told of the grant) attached since.
fn queue_cancel(
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
fn sweep_orphans(peer: &mut Peer, now: Instant, force: bool) {
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
fn finish_acquire(epoch: u64, reply: AcquireReply) -> AcquireResult {
    match reply.status {
        AcquireStatus::WaitEnded(WaitEnd::TimedOut) => Err(StoreError::WaitTimedOut),
        AcquireStatus::WaitEnded(WaitEnd::Cancelled) => Err(StoreError::WaitCancelled),
        AcquireStatus::WaitEnded(WaitEnd::TokenSpaceExhausted) => {
            Err(StoreError::Lock(LockError::TokenSpaceExhausted { epoch }))
        }
        _ => Ok(reply),
    }
}

fn serve_reads(peer: &mut Peer) {
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

/// Whether the shard should save a state-machine snapshot now: once per
/// `interval` applied entries (at a point of the shard's own, see
/// [`compaction`]), or when `force` (raft-rs needs a snapshot newer than the
/// saved one) and something was applied since.
fn snapshot_wanted(peer: &Peer, interval: u64, force: bool) -> bool {
    let due = compaction::snapshot_due(
        peer.shard_id,
        peer.applied_index,
        peer.last_snapshot_index,
        interval,
    );
    due || (force && peer.applied_index > peer.last_snapshot_index)
}

/// Saves a state-machine snapshot at the applied index and truncates the
/// log behind it.
fn take_snapshot(peer: &mut Peer, interval: u64, batch: &mut WriteBatch) {
    debug_assert!(
        peer.applied_index > peer.last_snapshot_index,
        "snapshot_wanted: nothing applied since the last snapshot"
    );
    let data = encode_state(&peer.table, peer.placement.as_ref());
    // Raft's own view: a configuration change applied in this iteration may
    // not be visible in the storage until its write.
    let cs = peer.raw.raft.prs().conf().to_conf_state();
    let store = peer.raw.mut_store();
    let saved =
        store.save_state_machine_snapshot(peer.applied_index, peer.applied_term, &cs, &data, batch);
    staged_or_die(peer.shard_id, "a snapshot", saved);
    peer.last_snapshot_index = peer.applied_index;
    peer.last_snapshot_bytes = data.len() as u64;
    let keep = LOG_KEEP_BEHIND_SNAPSHOT.min(interval / 2);
    let compact_to = peer.applied_index.saturating_sub(keep);
    if compact_to > store.truncated().0 {
        let compacted = store.compact(compact_to, batch);
        staged_or_die(peer.shard_id, "a log compaction", compacted);
    }
}

/// Checks the staging of one write into a shard's storage. A refusal means
/// the store's view of the shard is not what its storage holds (a bug, or
/// state that raft-rs has already moved past): the node stops, as for a
/// refused `Ready` or a failed write, and restarts from what is on disk,
/// rather than carry on with a write silently missing.
fn staged_or_die(shard_id: u64, what: &str, staged: fencelock_storage::Result<()>) {
    #[cfg(test)]
    let staged = tests::refusal(what).map_or(staged, Err);
    if let Err(e) = staged {
        panic!("fencelock: shard {shard_id}: staging {what} failed ({e}); stopping the node");
    }
}

fn respond_err(responder: Responder, err: StoreError) {
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

fn u64_from_ctx(ctx: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(ctx.try_into().ok()?))
}

/// The meta shard's lock table serves no slot and mints no token; its epoch
/// only satisfies the apply context (which needs one) for its leader-change
/// entries.
const META_TABLE_EPOCH: u64 = 1;
/// Log index of every shard's bootstrap snapshot. Starting the log after a
/// snapshot means a replica added later always begins from a snapshot sent
/// by the leader, never by replaying a log it has no initial state for.
const BOOTSTRAP_INDEX: u64 = 1;
const BOOTSTRAP_TERM: u64 = 1;

fn bootstrap_table(
    config: &StoreConfig,
    slots: SlotSet,
    epoch: u64,
) -> Result<LockTable, StoreError> {
    LockTable::bootstrap(config.limits(), slots, epoch, BOOTSTRAP_INDEX)
        .map_err(|e| StoreError::Internal(e.to_string()))
}

/// Stages a brand-new shard replica into `batch`: registration plus the
/// bootstrap snapshot (identical bytes on every initial replica). Call
/// `on_persisted` on the returned storage after the batch is written.
fn bootstrap_batch(
    engine: &Arc<dyn Engine>,
    shard_id: u64,
    voters: &BTreeSet<u64>,
    table: &LockTable,
    placement: Option<&PlacementMap>,
    batch: &mut WriteBatch,
) -> Result<ShardStorage<dyn Engine>, StoreError> {
    let storage_err = |e: fencelock_storage::Error| StoreError::Storage(e.to_string());
    fencelock_storage::meta::register_shard(batch, shard_id);
    let mut st = ShardStorage::open(engine.clone(), shard_id).map_err(storage_err)?;
    let mut snap = raft::prelude::Snapshot::default();
    snap.set_data(encode_state(table, placement).into());
    let md = snap.mut_metadata();
    md.index = BOOTSTRAP_INDEX;
    md.term = BOOTSTRAP_TERM;
    md.mut_conf_state()
        .set_voters(voters.iter().copied().collect());
    st.apply_snapshot(&snap, batch).map_err(storage_err)?;
    Ok(st)
}
