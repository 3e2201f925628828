//! The simulated cluster: three nodes running the real `Store`, a network
//! of in-flight Raft batches, simulated time, and the nemesis.
//!
//! Everything happens on one thread, in the order of one event queue keyed
//! by (simulated ms, sequence number); every choice — latency, loss,
//! duplication, long delays, partitions, crashes, how much unsynced data a
//! crash keeps, tick timing, the clients' moves — comes from one seeded
//! RNG. So a seed is a complete, exact replay.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock_multiraft::audit::AuditLog;
use fencelock_multiraft::metrics::StoreHandles;
use fencelock_multiraft::{
    Clock, Observers, PeerSink, ShardStatus, SimFault, Store, StoreIo, StoreMsg, WriteMode,
};
use fencelock_multiraft::{Envelope, StoreConfig};
use fencelock_nemesis::check::Verdict;
use fencelock_placement::PlacementMap;
use fencelock_router::Router;
use fencelock_storage::engine::IterCallback;
use fencelock_storage::{keys, Cf, Engine, MemEngine, WriteBatch};
use rand::rngs::StdRng;
use rand::Rng;

/// Nodes in the cluster; every shard has a replica on each.
pub const NODES: u64 = 3;
/// Data shards (the meta shard comes on top).
pub const DATA_SHARDS: u32 = 3;
/// One Raft tick; the driver spreads each node's ticks around it.
pub const TICK_MS: u64 = 20;
/// A node's tick interval varies within this percentage either way, so
/// elections (fixed at `election_ticks` ticks) still spread out.
const TICK_JITTER_PERCENT: u64 = 30;
/// Each node's wall clock is off true time by up to this, either way.
pub const MAX_CLOCK_SKEW_MS: u64 = 150;
/// The configured bound on clock offset between two nodes: the skews above
/// never exceed it (assumption A1 in docs/safety.md holds).
pub const CLOCK_OFFSET_ALLOWANCE_MS: u64 = 2 * MAX_CLOCK_SKEW_MS;
/// Simulated time zero on the nodes' wall clocks.
const SIM_EPOCH_WALL_MS: u64 = 1_700_000_000_000;
/// Network latency of a Raft batch, ms (inclusive range).
const LATENCY_MS: (u64, u64) = (1, 6);
/// A delayed batch (reordered behind later ones), ms.
const LONG_DELAY_MS: (u64, u64) = (30, 400);
/// Per-mille chances of a batch being lost, duplicated, delayed long.
const DROP_PER_MILLE: u32 = 15;
const DUPLICATE_PER_MILLE: u32 = 15;
const LONG_DELAY_PER_MILLE: u32 = 30;
/// How long a node's write takes to land, ms (the store hands its batch to
/// the disk and goes on stepping meanwhile): usually a fast disk...
const WRITE_MS: (u64, u64) = (0, 4);
/// ...and sometimes a stalled one, per mille of writes.
const SLOW_WRITE_MS: (u64, u64) = (20, 250);
const SLOW_WRITE_PER_MILLE: u32 = 50;
/// Applied entries between snapshots: low, so log compaction and snapshot
/// catch-up of a restarted node happen within a run.
const SNAPSHOT_INTERVAL_ENTRIES: u64 = 100;

/// How far a `clock-step` fault moves a node's wall clock, either way, ms:
/// seconds, far past the allowance (assumption A1 broken on purpose; lease
/// safety must not need it).
pub const CLOCK_STEP_MS: (i64, i64) = (1_000, 6_000);

/// The documented bound on a clock's rate error (docs/safety.md, A2): 1%.
pub const DRIFT_BOUND_PPM: i64 = 10_000;

/// The nodes' clock: this node's own reading of simulated time — true
/// time run at the node's rate error (`clock-drift`; exact until one) —
/// with the wall clock `skew_ms` off it (`clock-step`).
struct SimClock {
    base: Instant,
    now_ms: Arc<AtomicU64>,
    skew_ms: AtomicI64,
    drift: Mutex<Drift>,
}

/// A clock's rate error since `true_at_ms`, when it read `local_at_ms`.
#[derive(Default)]
struct Drift {
    ppm: i64,
    true_at_ms: u64,
    local_at_ms: u64,
}

impl SimClock {
    /// Simulated ms since the start as this node's clocks count them.
    fn local_ms(&self) -> u64 {
        let true_ms = self.now_ms.load(Ordering::Relaxed);
        let Ok(d) = self.drift.lock() else {
            return true_ms;
        };
        let since = i128::from(true_ms.saturating_sub(d.true_at_ms));
        let local_since = since * (1_000_000 + i128::from(d.ppm)) / 1_000_000;
        d.local_at_ms + u64::try_from(local_since).unwrap_or(0)
    }

    /// Runs the clocks `ppm` fast (negative: slow) from now on; they never
    /// go back.
    fn set_rate(&self, ppm: i64) {
        let local_ms = self.local_ms();
        if let Ok(mut d) = self.drift.lock() {
            *d = Drift {
                ppm,
                true_at_ms: self.now_ms.load(Ordering::Relaxed),
                local_at_ms: local_ms,
            };
        }
    }
}

impl Clock for SimClock {
    fn wall_ms(&self) -> u64 {
        let now = SIM_EPOCH_WALL_MS + self.local_ms();
        now.saturating_add_signed(self.skew_ms.load(Ordering::Relaxed))
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.local_ms())
    }
}

/// A node's disk: a crash-mode [`MemEngine`] that can also die in the
/// middle of a synced write. Armed, the next synced write reaches the page
/// cache only (a crash keeps it only as it keeps any unsynced write) and
/// fails, so the store stops right there: after what it may send before
/// persisting (a leader's appends) went out, before anything that needs
/// the write durable (acknowledgements, applies, answers).
struct SimDisk {
    inner: MemEngine,
    die_at_next_sync: AtomicBool,
}

impl Engine for SimDisk {
    fn get(&self, cf: Cf, key: &[u8]) -> fencelock_storage::Result<Option<Vec<u8>>> {
        self.inner.get(cf, key)
    }

    fn write(&self, batch: &WriteBatch, sync: bool) -> fencelock_storage::Result<()> {
        if sync && !batch.is_empty() && self.die_at_next_sync.swap(false, Ordering::Relaxed) {
            self.inner.write(batch, false)?;
            // Which error does not matter: the store stops on any failed
            // write.
            return Err(fencelock_storage::Error::Poisoned);
        }
        self.inner.write(batch, sync)
    }

    fn iterate(
        &self,
        cf: Cf,
        start: &[u8],
        end: &[u8],
        f: &mut IterCallback<'_>,
    ) -> fencelock_storage::Result<()> {
        self.inner.iterate(cf, start, end, f)
    }
}

/// Captures what a store sends; the world routes it after each step.
#[derive(Default)]
struct CaptureSink {
    out: Mutex<Vec<(u64, Vec<Envelope>)>>,
}

impl PeerSink for CaptureSink {
    fn send(&self, to: u64, envelopes: Vec<Envelope>) {
        if let Ok(mut out) = self.out.lock() {
            out.push((to, envelopes));
        }
    }

    fn add_peer(&self, _node_id: u64, _addr: &str) {}
}

pub struct Node {
    pub id: u64,
    config: StoreConfig,
    /// Survives crashes; only what was synced survives a crash.
    engine: Arc<SimDisk>,
    /// When armed to die in a synced write: how long it stays down then.
    down_after_dying_ms: Option<u64>,
    clock: Arc<SimClock>,
    sink: Arc<CaptureSink>,
    status: Arc<Mutex<Vec<ShardStatus>>>,
    /// The running store's view of the placement map.
    router: Option<Arc<Router>>,
    pub store: Option<Store>,
    /// Tick events of an earlier incarnation are ignored.
    generation: u64,
    /// Requests handed to the store's next step, whatever step that is
    /// ([`World::hand_to_next_step`]).
    next_step: Vec<StoreMsg>,
    /// The landing of the store's write in flight is scheduled.
    write_scheduled: bool,
    /// The disk takes writes but lands none until unstalled.
    disk_stalled: bool,
}

/// What happens at a point of simulated time.
pub enum Ev {
    Deliver {
        from: u64,
        to: u64,
        envelopes: Vec<Envelope>,
    },
    /// A client request reaching a node.
    Request {
        node: u64,
        // Boxed: a message is large next to the other events.
        msg: Box<StoreMsg>,
    },
    Tick {
        node: u64,
        generation: u64,
    },
    Restart {
        node: u64,
    },
    /// The end of one partition fault: these cut links are restored.
    Heal {
        links: Vec<(u64, u64)>,
    },
    ClientWake {
        client: usize,
    },
    Nemesis,
    /// The end of the fault phase: every fault healed.
    HealAll,
    /// The write a node's store handed to its disk lands (in this
    /// incarnation of the node only).
    WriteLands {
        node: u64,
        generation: u64,
    },
}

pub struct World {
    pub now_ms: u64,
    time: Arc<AtomicU64>,
    base: Instant,
    pub rng: StdRng,
    queue: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    pub nodes: Vec<Node>,
    /// Directed links cut, with how many faults cut each.
    cut: BTreeMap<(u64, u64), u32>,
    fault: Option<SimFault>,
    pub stats: Stats,
    /// The durability property's verdict (see
    /// `check_commits_are_durable_on_a_majority`), reported with the
    /// history checkers'.
    pub durability: Verdict,
    /// Whether a durability violation is left in [`World::durability`] for
    /// the caller to report (the seeded runs); otherwise it panics at once
    /// (the scenario tests, which report no verdicts).
    pub report_durability: bool,
    /// How fast or slow a `clock-drift` fault runs a node's clocks, ppm
    /// (the documented bound unless a test breaks it on purpose).
    pub drift_ppm: i64,
}

/// What the run did, for the report.
#[derive(Default, Debug, Clone)]
pub struct Stats {
    pub steps: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed: u64,
    pub crashes: u64,
    /// Crashes in the middle of a synced write (counted in `crashes` too).
    pub died_in_sync: u64,
    pub lost_unsynced_writes: u64,
    pub partitions: u64,
    pub transfers: u64,
    /// Batches handed to a disk, and how many of them landed slowly.
    pub writes: u64,
    pub slow_writes: u64,
    /// Snapshots whose encoding came back (at a write's landing).
    pub snapshots_encoded: u64,
}

fn node_config(id: u64) -> StoreConfig {
    let peers: Vec<(u64, String)> = (1..=NODES)
        .map(|n| (n, format!("10.0.0.{n}:7000")))
        .collect();
    let mut config = StoreConfig::for_test(id, peers.iter().map(|(id, addr)| (*id, addr.as_str())));
    config.shard_count = DATA_SHARDS;
    config.raft.tick_interval_ms = TICK_MS;
    config.raft.snapshot_interval_entries = SNAPSHOT_INTERVAL_ENTRIES;
    config.raft.clock_offset_allowance_ms = CLOCK_OFFSET_ALLOWANCE_MS;
    config.limits.min_lease_ttl_ms = 100;
    validate(&config);
    config
}

/// The store's own checks of a configuration (the lock limits; the node's
/// file-level range checks belong to the server, which the simulation does
/// not build).
fn validate(config: &StoreConfig) {
    if let Err(e) = config.limits.validate() {
        panic!("simulation config does not validate: {e}");
    }
}

impl World {
    pub fn new(rng: StdRng, fault: Option<SimFault>) -> World {
        World::with_config(rng, fault, |_| {})
    }

    /// A world whose nodes' configs are changed by `tweak` (validated).
    pub fn with_config(
        rng: StdRng,
        fault: Option<SimFault>,
        tweak: impl Fn(&mut StoreConfig),
    ) -> World {
        let mut world = World {
            now_ms: 0,
            time: Arc::new(AtomicU64::new(0)),
            base: Instant::now(),
            rng,
            queue: BTreeMap::new(),
            seq: 0,
            nodes: Vec::new(),
            cut: BTreeMap::new(),
            fault,
            stats: Stats::default(),
            durability: Verdict::new("durable"),
            report_durability: false,
            drift_ppm: DRIFT_BOUND_PPM,
        };
        for id in 1..=NODES {
            let skew = world
                .rng
                .random_range(-(MAX_CLOCK_SKEW_MS as i64)..=MAX_CLOCK_SKEW_MS as i64);
            let mut config = node_config(id);
            tweak(&mut config);
            validate(&config);
            world.nodes.push(Node {
                id,
                config,
                engine: Arc::new(SimDisk {
                    inner: MemEngine::with_crash_mode(),
                    die_at_next_sync: AtomicBool::new(false),
                }),
                down_after_dying_ms: None,
                clock: Arc::new(SimClock {
                    base: world.base,
                    now_ms: world.time.clone(),
                    skew_ms: AtomicI64::new(skew),
                    drift: Mutex::default(),
                }),
                sink: Arc::default(),
                status: Arc::default(),
                router: None,
                store: None,
                generation: 0,
                next_step: Vec::new(),
                write_scheduled: false,
                disk_stalled: false,
            });
            world.start(id);
        }
        world
    }

    /// The placement the nodes bootstrap with: which shard serves a slot.
    pub fn bootstrap_config() -> StoreConfig {
        node_config(1)
    }

    pub fn schedule(&mut self, at_ms: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at_ms.max(self.now_ms), self.seq), ev);
    }

    /// The next event, with time advanced to it.
    pub fn pop(&mut self) -> Option<Ev> {
        let ((at, _), ev) = self.queue.pop_first()?;
        self.now_ms = at;
        self.time.store(at, Ordering::Relaxed);
        Some(ev)
    }

    pub fn peek_time(&self) -> Option<u64> {
        self.queue.first_key_value().map(|((at, _), _)| *at)
    }

    fn node(&mut self, id: u64) -> &mut Node {
        &mut self.nodes[(id - 1) as usize]
    }

    /// Steps node `id`'s wall clock by `by_ms` (forward or back), as an
    /// operator's `date -s` or a broken NTP server would; returns the
    /// node's new skew from true time.
    pub fn step_wall_clock(&mut self, id: u64, by_ms: i64) -> i64 {
        let clock = &self.node(id).clock;
        clock.skew_ms.fetch_add(by_ms, Ordering::Relaxed) + by_ms
    }

    /// Runs node `id`'s clocks (monotonic and wall) `ppm` fast, or slow
    /// when negative, from now on (`clock-drift`); 0 gives back the true
    /// rate. Time already counted stays counted.
    pub fn set_clock_rate(&mut self, id: u64, ppm: i64) {
        self.node(id).clock.set_rate(ppm);
    }

    /// Nodes started from now on (restarts included) run without the
    /// world's deliberate bug; the running ones keep it.
    pub fn start_without_fault_from_now(&mut self) {
        self.fault = None;
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[(id - 1) as usize].store.is_some()
    }

    pub fn up_count(&self) -> usize {
        self.nodes.iter().filter(|n| n.store.is_some()).count()
    }

    /// Opens node `id`'s store over its engine (a restart after a crash).
    pub fn start(&mut self, id: u64) {
        let fault = self.fault;
        let node = self.node(id);
        if node.store.is_some() {
            return;
        }
        let io = StoreIo {
            engine: node.engine.clone(),
            sink: node.sink.clone(),
            clock: node.clock.clone(),
            fixed_election_timeout: true,
            write_mode: WriteMode::Driven,
        };
        // The inbox is unused: the world hands messages to `step` itself.
        let (_tx, inbox) = crossbeam_channel::unbounded();
        let router = Arc::new(Router::new(node.config.peer_map()));
        let obs = Observers {
            metrics: StoreHandles::register(&prometheus::Registry::new()).locals(),
            audit: AuditLog::disabled(),
        };
        node.router = Some(router.clone());
        let mut store = match Store::open_with(
            node.config.clone(),
            io,
            inbox,
            node.status.clone(),
            router,
            obs,
        ) {
            Ok(store) => store,
            Err(e) => panic!("node {id} does not reopen from its synced state: {e}"),
        };
        if let Some(fault) = fault {
            store.inject_fault(fault);
        }
        node.store = Some(store);
        node.generation += 1;
        node.write_scheduled = false;
        let generation = node.generation;
        let first = self.rng.random_range(1..=TICK_MS);
        self.schedule(
            self.now_ms + first,
            Ev::Tick {
                node: id,
                generation,
            },
        );
    }

    /// Kills node `id` like SIGKILL: the store is dropped (everyone waiting
    /// on it sees a closed channel), and the engine keeps its synced writes
    /// plus a random prefix of the unsynced ones.
    pub fn crash(&mut self, id: u64) {
        let unsynced = self.node(id).engine.inner.unsynced_writes().unwrap_or(0);
        let keep = self.rng.random_range(0..=unsynced);
        let node = self.node(id);
        let Some(store) = node.store.take() else {
            return;
        };
        drop(store);
        // Requests not yet handed over die with the node's connections.
        node.next_step.clear();
        node.sink.out.lock().map(|mut o| o.clear()).ok();
        node.engine.die_at_next_sync.store(false, Ordering::Relaxed);
        node.down_after_dying_ms = None;
        let lost = node.engine.inner.crash(keep).unwrap_or(0);
        self.stats.crashes += 1;
        self.stats.lost_unsynced_writes += lost as u64;
    }

    /// Arms node `id` to die in the middle of its next synced write (see
    /// [`SimDisk`]), to be restarted `down_ms` after that. Returns false
    /// when the node is down.
    pub fn crash_in_next_sync(&mut self, id: u64, down_ms: u64) -> bool {
        let node = self.node(id);
        if node.store.is_none() {
            return false;
        }
        node.engine.die_at_next_sync.store(true, Ordering::Relaxed);
        node.down_after_dying_ms = Some(down_ms);
        true
    }

    /// Property: a leader never counts an entry committed — and so never
    /// applies it or answers a client from it — before a majority of the
    /// shard's voters has it durable: their synced state holds that very
    /// entry, or a log compacted past it (applied, so the same entry).
    /// With send-before-persist and the asynchronous write path the
    /// majority may be the followers without the leader (whose own write
    /// may land later). Checked after every step of node `id`, against
    /// its commit index right then (`Store::leader_commits`).
    fn check_commits_are_durable_on_a_majority(&mut self, id: u64) {
        let mut checked = 0;
        let mut problems = Vec::new();
        let node = &self.nodes[(id - 1) as usize];
        let Some(store) = node.store.as_ref() else {
            return;
        };
        for commit in store.leader_commits() {
            let Some(entry) = commit.entry else {
                // Compacted on the leader itself: applied long ago.
                continue;
            };
            let key = keys::log_key(commit.shard_id, commit.commit_index);
            let after = keys::log_key(commit.shard_id, commit.commit_index + 1);
            let end = keys::log_key(commit.shard_id, u64::MAX);
            let durable = (commit.voters.iter())
                .filter(|v| {
                    let disk = &self.nodes[(**v - 1) as usize].engine.inner;
                    match disk.durable_get(Cf::Raft, &key) {
                        Ok(Some(bytes)) => bytes == entry,
                        Ok(None) => disk
                            .durable_has_any(Cf::Raft, &after, &end)
                            .unwrap_or(false),
                        Err(_) => false,
                    }
                })
                .count();
            checked += 1;
            if durable * 2 <= commit.voters.len() {
                problems.push(format!(
                    "at {} ms node {id} leads shard {} with commit index {} durable on only {durable} of voters {:?}",
                    self.now_ms, commit.shard_id, commit.commit_index, commit.voters
                ));
            }
        }
        self.durability.checked += checked;
        if !self.report_durability {
            assert!(problems.is_empty(), "{problems:?}");
        }
        for problem in problems {
            self.durability.fail(problem);
        }
    }

    /// Disarms every node's pending death in a synced write.
    fn disarm_all(&mut self) {
        for node in &mut self.nodes {
            node.engine.die_at_next_sync.store(false, Ordering::Relaxed);
            node.down_after_dying_ms = None;
        }
    }

    /// A clean stop (deferred writes flushed, waiters told) and restart.
    pub fn restart_cleanly(&mut self, id: u64) {
        if let Some(store) = self.node(id).store.take() {
            store.close();
        }
        self.node(id).next_step.clear();
        self.route_from(id);
        self.start(id);
    }

    /// Hands `msg` to node `id`'s next store step (its next tick at the
    /// latest), without a step or an event of its own: for requests that
    /// change nothing in Raft (a watch), so that adding them leaves the
    /// seed's schedule as it was. Dropped, closing its answer channel, if
    /// the node goes down first.
    pub fn hand_to_next_step(&mut self, id: u64, msg: StoreMsg) {
        if self.is_up(id) {
            self.node(id).next_step.push(msg);
        }
    }

    /// Runs one store iteration on node `id` (nothing if it is down: the
    /// messages are dropped, closing any client's answer channel), then
    /// routes what it sent.
    pub fn step(&mut self, id: u64, msgs: Vec<StoreMsg>, tick: bool) {
        let node = self.node(id);
        let Some(store) = node.store.as_mut() else {
            return;
        };
        let msgs = if node.next_step.is_empty() {
            msgs
        } else {
            let mut handed = std::mem::take(&mut node.next_step);
            handed.extend(msgs);
            handed
        };
        let stepped = catch_unwind(AssertUnwindSafe(|| store.step(msgs, tick)));
        self.stats.steps += 1;
        if stepped.is_err() {
            // The store stops the node on a failed write (its fail-stop
            // rule). Only an armed disk fails here; anything else is a bug.
            let Some(down_ms) = self.node(id).down_after_dying_ms.take() else {
                panic!("node {id}'s store panicked without a disk fault");
            };
            // What left before the write is on the wire; then the node dies.
            self.route_from(id);
            self.stats.died_in_sync += 1;
            self.crash(id);
            self.schedule(self.now_ms + down_ms, Ev::Restart { node: id });
            return;
        }
        self.route_from(id);
        self.schedule_write(id);
        // After every step, not only at ticks: an answer leaves in the step
        // that applied its entry, and nothing past the commit index applies.
        self.check_commits_are_durable_on_a_majority(id);
    }

    /// Schedules the landing of the batch node `id`'s store handed to its
    /// disk, at a random later time: writes land in their own time, while
    /// the stores go on stepping, and in any order across nodes.
    fn schedule_write(&mut self, id: u64) {
        let node = self.node(id);
        let pending = node.store.as_ref().is_some_and(Store::write_pending);
        if !pending || node.write_scheduled || node.disk_stalled {
            return;
        }
        node.write_scheduled = true;
        let generation = node.generation;
        let delay = if self.rng.random_range(0..1000u32) < SLOW_WRITE_PER_MILLE {
            self.stats.slow_writes += 1;
            self.rng.random_range(SLOW_WRITE_MS.0..=SLOW_WRITE_MS.1)
        } else {
            self.rng.random_range(WRITE_MS.0..=WRITE_MS.1)
        };
        self.stats.writes += 1;
        self.schedule(
            self.now_ms + delay,
            Ev::WriteLands {
                node: id,
                generation,
            },
        );
    }

    /// Stalls node `id`'s disk (`true`): the write in flight and every
    /// later one wait until it is unstalled (`false`), then land as usual.
    pub fn stall_disk(&mut self, id: u64, stalled: bool) {
        self.node(id).disk_stalled = stalled;
        if !stalled {
            self.schedule_write(id);
        }
    }

    /// Whether node `id` has a write in flight that has not landed.
    pub fn write_in_flight(&self, id: u64) -> bool {
        let node = &self.nodes[(id - 1) as usize];
        node.store.as_ref().is_some_and(Store::write_pending)
    }

    /// Node `id`'s write lands: the disk writes the batch, and the store's
    /// next step handles the landing (a failed write stops the node there).
    ///
    /// Snapshots being encoded come back at random later landings too
    /// (half the time at each), so a replica's table moves on, and a
    /// leader's snapshot may be installed, while its own is encoded.
    pub fn land_write(&mut self, id: u64, generation: u64) {
        let snapshot_back = self.rng.random_range(0..2u32) == 0;
        let node = self.node(id);
        if node.generation != generation {
            return;
        }
        node.write_scheduled = false;
        let Some(store) = node.store.as_mut() else {
            return;
        };
        store.complete_write();
        if snapshot_back && store.complete_snapshot() {
            self.stats.snapshots_encoded += 1;
        }
        self.step(id, Vec::new(), false);
    }

    fn route_from(&mut self, from: u64) {
        let out = match self.node(from).sink.out.lock() {
            Ok(mut out) => std::mem::take(&mut *out),
            Err(_) => return,
        };
        for (to, envelopes) in out {
            if self.is_cut(from, to) {
                self.stats.dropped += 1;
                continue;
            }
            let fate = self.rng.random_range(0..1000u32);
            if fate < DROP_PER_MILLE {
                self.stats.dropped += 1;
                continue;
            }
            if fate < DROP_PER_MILLE + DUPLICATE_PER_MILLE {
                self.stats.duplicated += 1;
                let later = self.now_ms + self.rng.random_range(LATENCY_MS.0..=LONG_DELAY_MS.1);
                self.schedule(
                    later,
                    Ev::Deliver {
                        from,
                        to,
                        envelopes: envelopes.clone(),
                    },
                );
            }
            let latency = if fate >= 1000 - LONG_DELAY_PER_MILLE {
                self.stats.delayed += 1;
                self.rng.random_range(LONG_DELAY_MS.0..=LONG_DELAY_MS.1)
            } else {
                self.rng.random_range(LATENCY_MS.0..=LATENCY_MS.1)
            };
            self.schedule(
                self.now_ms + latency,
                Ev::Deliver {
                    from,
                    to,
                    envelopes,
                },
            );
        }
    }

    pub fn deliver(&mut self, from: u64, to: u64, envelopes: Vec<Envelope>) {
        // A link cut while the batch was in flight loses it too.
        if self.is_cut(from, to) || !self.is_up(to) {
            self.stats.dropped += 1;
            return;
        }
        self.stats.delivered += 1;
        self.step(to, vec![StoreMsg::Raft { envelopes }], false);
    }

    pub fn tick(&mut self, id: u64, generation: u64) {
        if self.node(id).generation != generation || !self.is_up(id) {
            return;
        }
        self.step(id, Vec::new(), true);
        let spread = TICK_MS * TICK_JITTER_PERCENT / 100;
        let next = self
            .rng
            .random_range(TICK_MS - spread..=TICK_MS + spread)
            .max(1);
        self.schedule(
            self.now_ms + next,
            Ev::Tick {
                node: id,
                generation,
            },
        );
    }

    fn is_cut(&self, from: u64, to: u64) -> bool {
        self.cut.get(&(from, to)).is_some_and(|n| *n > 0)
    }

    /// Cuts `links` until `heal_at_ms`.
    pub fn partition(&mut self, links: Vec<(u64, u64)>, heal_at_ms: u64) {
        for link in &links {
            *self.cut.entry(*link).or_default() += 1;
        }
        self.stats.partitions += 1;
        self.schedule(heal_at_ms, Ev::Heal { links });
    }

    pub fn heal(&mut self, links: Vec<(u64, u64)>) {
        for link in links {
            if let Some(n) = self.cut.get_mut(&link) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.cut.remove(&link);
                }
            }
        }
    }

    /// Every partition healed, every node running.
    pub fn heal_all(&mut self) {
        self.cut.clear();
        self.disarm_all();
        for id in 1..=NODES {
            self.set_clock_rate(id, 0);
        }
        for id in 1..=NODES {
            self.start(id);
        }
    }

    /// The shard leaders the nodes last published (on their ticks):
    /// shard → leader node, as claimed by an up node leading it.
    pub fn leaders(&self) -> BTreeMap<u64, u64> {
        let mut leaders = BTreeMap::new();
        for node in &self.nodes {
            if node.store.is_none() {
                continue;
            }
            if let Ok(status) = node.status.lock() {
                for s in status.iter().filter(|s| s.is_leader) {
                    leaders.insert(s.shard_id, node.id);
                }
            }
        }
        leaders
    }

    /// The newest placement map an up node has applied.
    pub fn map(&self) -> Option<Arc<PlacementMap>> {
        self.nodes
            .iter()
            .filter(|n| n.store.is_some())
            .filter_map(|n| n.router.as_ref()?.map())
            .max_by_key(|m| m.version())
    }

    /// What every up node last published about each of its replicas.
    pub fn statuses(&self) -> Vec<(u64, ShardStatus)> {
        let mut out = Vec::new();
        for node in self.nodes.iter().filter(|n| n.store.is_some()) {
            if let Ok(status) = node.status.lock() {
                out.extend(status.iter().map(|s| (node.id, s.clone())));
            }
        }
        out
    }

    /// The node leading the most shards, if any.
    pub fn busiest_leader(&self) -> Option<u64> {
        let mut count: BTreeMap<u64, usize> = BTreeMap::new();
        for node in self.leaders().values() {
            *count.entry(*node).or_default() += 1;
        }
        count
            .into_iter()
            .max_by_key(|(node, n)| (*n, std::cmp::Reverse(*node)))
            .map(|(node, _)| node)
    }
}
