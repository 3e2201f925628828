//! The deterministic simulation of the multi-Raft layer (docs/testing.md,
//! "Deterministic simulation"): the real `Store` of three nodes, driven
//! one `step` at a time by a seeded event loop, with simulated clients
//! whose history the nemesis checkers judge.
//!
//! * [`world`] — nodes, network, simulated time, crashes and partitions.
//! * [`clients`] — the lock clients and the fenced resource; the history.
//! * [`watchers`] — watchers following four of the clients' resources
//!   (two exclusive locks, the shared lock, the semaphore) across node
//!   crashes and restarts; what they receive goes into the history for
//!   the watch checker.
//! * this module — one run of one seed: the nemesis schedule, the heal,
//!   and the verdicts.

pub mod attempts;
pub mod clients;
pub mod leader_clock;
pub mod lease_time;
pub mod orphans;
pub mod reshard;
pub mod slow_disk;
pub mod watchers;
pub mod world;

use fencelock_multiraft::{SimFault, StoreMsg};
use fencelock_nemesis::check::{self, CheckConfig, Status, Verdict};
use fencelock_nemesis::fence::{FenceMode, FencedResource};
use fencelock_nemesis::history::{Event, History, Phase};
use fencelock_placement::PlacementMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use clients::Clients;
use fencelock_statemachine::{slot_of, ResourceName};
use watchers::Watchers;
use world::{Ev, Stats, World, NODES};

/// Simulated clients.
const CLIENTS: usize = 6;
/// Time between nemesis actions, ms.
const NEMESIS_GAP_MS: (u64, u64) = (200, 1_200);
/// How long a crashed node stays down / a partition lasts, ms.
const FAULT_HOLD_MS: (u64, u64) = (100, 2_500);
/// After the heal, every resource in use must see a success within this.
pub const LIVENESS_BOUND_MS: u64 = 4_000;
/// Search budget per resource for the linearizability checker: enough for
/// most runs; an exhausted budget is reported, not failed.
const LINEAR_MAX_STEPS: u64 = 100_000;

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seed: u64,
    /// Simulated ms of faults and load.
    pub fault_ms: u64,
    /// Simulated ms of load after everything healed.
    pub heal_ms: u64,
    /// A deliberate store bug (the broken variant).
    pub store_fault: Option<SimFault>,
    /// `Unchecked`: the protected resource skips the token check.
    pub fence: FenceMode,
    /// How far a `clock-drift` fault runs a node's clocks off true time,
    /// ppm: the documented bound (1%) unless a test breaks it on purpose.
    pub drift_ppm: i64,
}

impl SimOptions {
    pub fn new(seed: u64) -> SimOptions {
        SimOptions {
            seed,
            fault_ms: 10_000,
            heal_ms: LIVENESS_BOUND_MS + 500,
            store_fault: None,
            fence: FenceMode::Checked,
            drift_ppm: world::DRIFT_BOUND_PPM,
        }
    }
}

/// What one run produced.
pub struct SimRun {
    pub events: Vec<Event>,
    pub history: History,
    pub verdicts: Vec<Verdict>,
    pub stats: Stats,
    /// Nemesis actions, in order (also in the history).
    pub faults: Vec<String>,
    /// Watch streams opened (first watches and resumptions).
    pub watch_streams: u64,
}

impl SimRun {
    /// Failed verdicts (an exhausted linearizability budget is not one).
    pub fn failures(&self) -> Vec<&Verdict> {
        self.verdicts
            .iter()
            .filter(|v| match v.status {
                Status::Pass => false,
                Status::Fail => true,
                Status::Inconclusive => v.checker != "linear",
            })
            .collect()
    }

    pub fn passed(&self) -> bool {
        self.failures().is_empty()
    }
}

fn nemesis_event(
    world: &World,
    events: &mut Vec<Event>,
    fault: &str,
    phase: Phase,
    detail: String,
) {
    events.push(Event::Nemesis {
        time_ns: world.now_ms * 1_000_000,
        fault: fault.into(),
        phase,
        detail,
    });
}

/// One nemesis action, chosen by the RNG.
fn nemesis(world: &mut World, events: &mut Vec<Event>, faults: &mut Vec<String>) {
    let now = world.now_ms;
    let hold = world.rng.random_range(FAULT_HOLD_MS.0..=FAULT_HOLD_MS.1);
    let roll = world.rng.random_range(0..100u32);
    let mut note = |world: &World, events: &mut Vec<Event>, kind: &str, detail: String| {
        faults.push(format!("{now} ms {kind}: {detail}"));
        nemesis_event(world, events, kind, Phase::Start, detail);
    };
    match roll {
        // Crash a node (the busiest leader half of the time); at most two
        // down at once, so a majority is lost only sometimes.
        0..=29 => {
            let target = if roll < 15 {
                world.busiest_leader()
            } else {
                Some(world.rng.random_range(1..=NODES))
            };
            let Some(id) = target.filter(|id| world.is_up(*id)) else {
                return;
            };
            if world.up_count() <= 1 {
                return;
            }
            // A third of the leader crashes happen inside the leader's next
            // synced write: its appends already left (send before persist),
            // its own copy may be lost.
            if roll < 5 {
                if world.crash_in_next_sync(id, hold) {
                    note(
                        world,
                        events,
                        "crash-in-sync",
                        format!("node {id} at its next synced write, down {hold} ms"),
                    );
                }
                return;
            }
            world.crash(id);
            note(world, events, "crash", format!("node {id}, down {hold} ms"));
            world.schedule(now + hold, Ev::Restart { node: id });
        }
        // Isolate one node (the busiest leader half of the time).
        30..=54 => {
            let target = if roll < 42 {
                world.busiest_leader()
            } else {
                Some(world.rng.random_range(1..=NODES))
            };
            let Some(id) = target else {
                return;
            };
            let links: Vec<(u64, u64)> = (1..=NODES)
                .filter(|n| *n != id)
                .flat_map(|n| [(id, n), (n, id)])
                .collect();
            note(world, events, "isolate", format!("node {id} for {hold} ms"));
            world.partition(links, now + hold);
        }
        // Cut one direction of one link.
        55..=64 => {
            let from = world.rng.random_range(1..=NODES);
            let to = (from % NODES) + 1;
            note(
                world,
                events,
                "cut-link",
                format!("{from}->{to} for {hold} ms"),
            );
            world.partition(vec![(from, to)], now + hold);
        }
        // Hand a shard's leadership to another replica.
        65..=79 => {
            let leaders: Vec<(u64, u64)> = world.leaders().into_iter().collect();
            if leaders.is_empty() {
                return;
            }
            let (shard_id, leader) = leaders[world.rng.random_range(0..leaders.len())];
            let to = (leader + world.rng.random_range(0..NODES - 1)) % NODES + 1;
            let (tx, _rx) = tokio::sync::oneshot::channel();
            world.stats.transfers += 1;
            note(
                world,
                events,
                "transfer-leader",
                format!("shard {shard_id} from {leader} to {to}"),
            );
            world.step(
                leader,
                vec![StoreMsg::TransferLeader { shard_id, to, tx }],
                false,
            );
        }
        // A clean restart (deferred writes flushed first).
        80..=84 => {
            let id = world.rng.random_range(1..=NODES);
            if world.is_up(id) {
                note(world, events, "restart", format!("node {id}"));
                world.restart_cleanly(id);
            }
        }
        // Step a node's wall clock by seconds, forward or back (the
        // busiest leader's half of the time, so it is likely to be elected
        // again soon after a crash or a transfer): lease time must not
        // move with it.
        85..=92 => {
            let target = if roll < 89 {
                world.busiest_leader()
            } else {
                Some(world.rng.random_range(1..=NODES))
            };
            let Some(id) = target else {
                return;
            };
            let size = world
                .rng
                .random_range(world::CLOCK_STEP_MS.0..=world::CLOCK_STEP_MS.1);
            let by = if world.rng.random_bool(0.6) {
                size
            } else {
                -size
            };
            let skew = world.step_wall_clock(id, by);
            note(
                world,
                events,
                "clock-step",
                format!("node {id} by {by} ms (now {skew} ms off)"),
            );
        }
        // Run a node's clocks fast or slow (the busiest leader's, mostly:
        // a leader ends leases by its own clock) until everything heals.
        93..=96 => {
            let target = if roll < 95 {
                world.busiest_leader()
            } else {
                Some(world.rng.random_range(1..=NODES))
            };
            let Some(id) = target else {
                return;
            };
            let ppm = if world.rng.random_bool(0.7) {
                world.drift_ppm
            } else {
                -world.drift_ppm
            };
            world.set_clock_rate(id, ppm);
            note(
                world,
                events,
                "clock-drift",
                format!("node {id}'s clocks run {ppm:+} ppm"),
            );
        }
        _ => {}
    }
}

/// Runs one seed to the end and checks its history.
pub fn run(options: &SimOptions) -> SimRun {
    let mut world = World::new(StdRng::seed_from_u64(options.seed), options.store_fault);
    world.report_durability = true;
    world.drift_ppm = options.drift_ppm;
    let config = World::bootstrap_config();
    let nodes: Vec<(u64, String)> = config.peer_map().into_iter().collect();
    let map = match PlacementMap::bootstrap(
        &nodes,
        config.shard_count,
        config.replication_factor as usize,
    ) {
        Ok(map) => map,
        Err(e) => panic!("bootstrap map: {e}"),
    };
    let mut clients = Clients::new(CLIENTS, FencedResource::new(options.fence), |slot| {
        map.shard_of_slot(slot)
    });
    let mut watchers = Watchers::new(options.seed, &watchers::watched_resources(), |name| {
        let name = ResourceName::parse(name).expect("a valid resource name");
        map.shard_of_slot(slot_of(&name))
    });
    let mut faults = Vec::new();
    clients.start(&mut world);
    let first = world.rng.random_range(NEMESIS_GAP_MS.0..=NEMESIS_GAP_MS.1);
    world.schedule(first, Ev::Nemesis);
    world.schedule(options.fault_ms, Ev::HealAll);
    let end_at = options.fault_ms + options.heal_ms;
    let mut healed = false;
    while world.peek_time().is_some_and(|at| at < end_at) {
        let Some(ev) = world.pop() else {
            break;
        };
        match ev {
            Ev::Deliver {
                from,
                to,
                envelopes,
            } => world.deliver(from, to, envelopes),
            Ev::Request { node, msg } => world.step(node, vec![*msg], false),
            Ev::Tick { node, generation } => world.tick(node, generation),
            Ev::Restart { node } => world.start(node),
            Ev::Heal { links } => world.heal(links),
            Ev::WriteLands { node, generation } => world.land_write(node, generation),
            Ev::ClientWake { client } => clients.on_wake(&mut world, client),
            Ev::Nemesis => {
                if !healed {
                    nemesis(&mut world, &mut clients.events, &mut faults);
                    let gap = world.rng.random_range(NEMESIS_GAP_MS.0..=NEMESIS_GAP_MS.1);
                    world.schedule(world.now_ms + gap, Ev::Nemesis);
                }
            }
            Ev::HealAll => {
                healed = true;
                world.heal_all();
                nemesis_event(
                    &world,
                    &mut clients.events,
                    "heal",
                    Phase::HealAll,
                    String::new(),
                );
            }
        }
        clients.poll(&mut world);
        watchers.poll(&mut world, &mut clients.events);
    }
    clients.stop();
    let events = std::mem::take(&mut clients.events);
    let history = match History::from_events(&events) {
        Ok(h) => h,
        Err(e) => panic!("seed {}: malformed history: {e:?}", options.seed),
    };
    let check_config = CheckConfig {
        liveness_bound_ms: LIVENESS_BOUND_MS,
        linear_max_steps: LINEAR_MAX_STEPS,
        ..CheckConfig::default()
    };
    let mut verdicts = check::check_all(&history, &check_config);
    verdicts.push(world.durability.clone());
    SimRun {
        events,
        history,
        verdicts,
        stats: world.stats.clone(),
        faults,
        watch_streams: watchers.opened,
    }
}
