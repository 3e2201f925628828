//! Slot migration under forced interleavings (docs/safety.md, "Slot
//! migration"): the real migration protocol (`fencelock_controller::reshard`)
//! drives the simulated stores, and at one chosen step the proposal's
//! answer is lost, the leader that took it dies before or after
//! replicating it, leadership moves away, a delayed copy of it lands late,
//! or the orchestrator itself dies. Whatever happened, once the protocol
//! (and, after an orchestrator's death, `resume`) has run, the map and the
//! shards agree: every moved resource is served by exactly the shard the
//! map routes it to, its lease still held, and no shard keeps an export.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use fencelock_api::v1::Reason;
use fencelock_controller::reshard::{self, Cluster, Resharded};
use fencelock_controller::ControllerError;
use fencelock_multiraft::StoreError;
use fencelock_multiraft::{PeerInit, Responder, ShardStatus, StoreMsg};
use fencelock_placement::{PlacementCommand, PlacementMap, META_SHARD_ID};
use fencelock_statemachine::{
    slot_of, AcquireStatus, Command, LeaseId, LockError, Owner, Reply, RequestId, ResourceName,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::oneshot;
use tokio::sync::oneshot::error::TryRecvError;

use super::world::{Ev, World, NODES};

/// A step of a migration, as the proposal that carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    Begin,
    Export,
    Import,
    Close,
    /// The source importing its own export back (a roll-back).
    TakeBack,
    Drop,
    Commit,
    RollBack,
    Abort,
}

/// What happens to the proposal of the chosen step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It commits, but the answer never reaches the orchestrator.
    AnswerLost,
    /// The leader sends it to its followers and dies before it learns that
    /// it committed; the next leader commits it.
    LeaderDiesAfterReplicating,
    /// The leader dies before it sends it anywhere: it is lost.
    LeaderDiesBeforeReplicating,
    /// Leadership moves to another replica right after the proposal.
    LeaderMoves,
    /// The shard answers with a refusal (as if the target were full), and a
    /// delayed copy of the proposal reaches the leader later.
    RefusedThenDelayedCopyLands,
    /// The orchestrator dies right after sending it (it commits).
    OrchestratorDies,
}

/// A sim time after which a call without an answer reports an unknown
/// outcome (the store's proposal timeout is 5 s).
const CALL_TIMEOUT_MS: u64 = 6_000;
/// Simulated ms between tries of a step, and how many tries it gets.
const PAUSE_MS: u64 = 200;
const MAX_TRIES: u32 = 30;
/// A crashed leader comes back after this.
const RESTART_AFTER_MS: u64 = 1_500;
/// The delayed copy of a refused proposal arrives after this.
const DELAYED_COPY_MS: u64 = 400;
const LEASE_TTL_MS: u64 = 120_000;

/// Runs the world's own events until `done` or `ms` simulated ms passed.
pub fn run_until(world: &mut World, ms: u64, mut done: impl FnMut(&World) -> bool) {
    let end = world.now_ms + ms;
    while !done(world) && world.peek_time().is_some_and(|at| at <= end) {
        match world.pop() {
            Some(Ev::Deliver {
                from,
                to,
                envelopes,
            }) => world.deliver(from, to, envelopes),
            Some(Ev::Tick { node, generation }) => world.tick(node, generation),
            Some(Ev::Restart { node }) => world.start(node),
            Some(Ev::Heal { links }) => world.heal(links),
            Some(Ev::WriteLands { node, generation }) => world.land_write(node, generation),
            Some(Ev::Request { node, msg }) => world.step(node, vec![*msg], false),
            Some(Ev::ClientWake { .. } | Ev::Nemesis | Ev::HealAll) | None => {}
        }
    }
}

pub fn run_for(world: &mut World, ms: u64) {
    run_until(world, ms, |_| false);
}

/// How a reply channel ended up.
enum Got<T> {
    Answer(T),
    /// The node dropped it (crashed, or shut the request down).
    Closed,
    /// Nothing within the time given.
    Nothing,
}

/// Runs the world until `rx` has an answer or `ms` passed.
fn receive<T>(world: &mut World, ms: u64, rx: &mut oneshot::Receiver<T>) -> Got<T> {
    let mut got = Got::Nothing;
    run_until(world, ms, |_| {
        if matches!(got, Got::Nothing) {
            got = match rx.try_recv() {
                Ok(v) => Got::Answer(v),
                Err(TryRecvError::Closed) => Got::Closed,
                Err(TryRecvError::Empty) => Got::Nothing,
            };
        }
        !matches!(got, Got::Nothing)
    });
    if matches!(got, Got::Nothing) {
        got = match rx.try_recv() {
            Ok(v) => Got::Answer(v),
            Err(TryRecvError::Closed) => Got::Closed,
            Err(TryRecvError::Empty) => Got::Nothing,
        };
    }
    got
}

/// Polls a future that never waits (every `SimCluster` call runs the world
/// synchronously until it has its answer).
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the simulated cluster never waits"),
    }
}

/// The migration protocol's view of the simulated cluster, with one forced
/// fate for the first proposal of one step.
pub struct SimCluster<'w> {
    world: RefCell<&'w mut World>,
    forced: Cell<Option<(At, Fate)>>,
    /// The orchestrator died: every call fails from then on.
    dead: Cell<bool>,
    /// Source shard of each migration (to tell a take-back from an import).
    sources: RefCell<BTreeMap<u64, u64>>,
    /// After a forced leader death: the shard's status under its next
    /// leader (what the lost proposal did).
    pub after_fate: RefCell<Option<ShardStatus>>,
    pub log: RefCell<Vec<String>>,
}

fn transport_error() -> ControllerError {
    // What the gRPC node calls report when the node serving the call goes
    // away (tonic's UNKNOWN "transport error", decoded; which node it was
    // does not matter here).
    ControllerError::Unanswered {
        node_id: 0,
        message: "Unknown: transport error".into(),
        retriable: false,
    }
}

fn outcome_unknown(shard_id: u64) -> ControllerError {
    wire(StoreError::OutcomeUnknown { shard_id })
}

impl<'w> SimCluster<'w> {
    pub fn new(world: &'w mut World, forced: Option<(At, Fate)>) -> SimCluster<'w> {
        SimCluster {
            world: RefCell::new(world),
            forced: Cell::new(forced),
            dead: Cell::new(false),
            sources: RefCell::default(),
            after_fate: RefCell::default(),
            log: RefCell::default(),
        }
    }

    /// Whether the forced fate fired.
    pub fn fired(&self) -> bool {
        self.forced.get().is_none()
    }

    fn note(&self, line: String) {
        let now = self.world.borrow().now_ms;
        self.log.borrow_mut().push(format!("{now} ms {line}"));
    }

    fn take_fate(&self, at: At) -> Option<Fate> {
        match self.forced.get() {
            Some((step, fate)) if step == at => {
                self.forced.set(None);
                Some(fate)
            }
            _ => None,
        }
    }

    fn shard_step(&self, shard_id: u64, command: &Command) -> Option<At> {
        match command {
            Command::ExportSlots { migration_id, .. } => {
                self.sources.borrow_mut().insert(*migration_id, shard_id);
                Some(At::Export)
            }
            Command::ImportSlots { migration_id, .. } => {
                if self.sources.borrow().get(migration_id) == Some(&shard_id) {
                    Some(At::TakeBack)
                } else {
                    Some(At::Import)
                }
            }
            Command::DropExport { .. } => Some(At::Drop),
            Command::CloseMigration { .. } => Some(At::Close),
            _ => None,
        }
    }

    /// Sends `msg` (built around `tx`) to the leader of `shard_id` and lets
    /// `fate` happen to it; the answer, or what the orchestrator would see.
    fn call<T>(
        &self,
        shard_id: u64,
        fate: Option<Fate>,
        msg: StoreMsg,
        mut rx: oneshot::Receiver<Result<T, StoreError>>,
        copy: impl FnOnce() -> StoreMsg,
    ) -> Result<T, ControllerError> {
        let mut world = self.world.borrow_mut();
        let Some(leader) = world.leaders().get(&shard_id).copied() else {
            return Err(wire(StoreError::LeaderUnknown { shard_id }));
        };
        let followers: Vec<u64> = (1..=NODES).filter(|n| *n != leader).collect();
        let now = world.now_ms;
        match fate {
            None | Some(Fate::AnswerLost) | Some(Fate::OrchestratorDies) => {
                world.step(leader, vec![msg], false);
            }
            Some(Fate::LeaderDiesAfterReplicating) => {
                // Followers' acks are cut until the leader dies: it never
                // learns the entry committed.
                let acks: Vec<(u64, u64)> = followers.iter().map(|f| (*f, leader)).collect();
                world.partition(acks, now + 40);
                world.step(leader, vec![msg], false);
                run_for(&mut world, 40);
                world.crash(leader);
                world.schedule(now + RESTART_AFTER_MS, Ev::Restart { node: leader });
            }
            Some(Fate::LeaderDiesBeforeReplicating) => {
                let out: Vec<(u64, u64)> = followers.iter().map(|f| (leader, *f)).collect();
                world.partition(out, now + 1);
                world.step(leader, vec![msg], false);
                world.crash(leader);
                world.schedule(now + RESTART_AFTER_MS, Ev::Restart { node: leader });
            }
            Some(Fate::LeaderMoves) => {
                world.step(leader, vec![msg], false);
                let (tx, _rx) = oneshot::channel();
                let to = followers[0];
                world.step(
                    leader,
                    vec![StoreMsg::TransferLeader { shard_id, to, tx }],
                    false,
                );
            }
            Some(Fate::RefusedThenDelayedCopyLands) => {
                drop(msg);
                world.schedule(
                    now + DELAYED_COPY_MS,
                    Ev::Request {
                        node: leader,
                        msg: Box::new(copy()),
                    },
                );
                return Err(wire(StoreError::Lock(LockError::MigrationRefused {
                    reason: "forced refusal (the target is full, say)".into(),
                })));
            }
        }
        let answer = match receive(&mut world, CALL_TIMEOUT_MS, &mut rx) {
            Got::Answer(result) => result.map_err(wire),
            Got::Closed => Err(transport_error()),
            Got::Nothing => Err(outcome_unknown(shard_id)),
        };
        match fate {
            Some(Fate::AnswerLost) => Err(outcome_unknown(shard_id)),
            Some(Fate::LeaderDiesAfterReplicating | Fate::LeaderDiesBeforeReplicating) => {
                // Record what the next leader holds once it serves.
                let next_leader = |w: &World| w.leaders().contains_key(&shard_id);
                run_until(&mut world, 3_000, next_leader);
                run_for(&mut world, 300);
                *self.after_fate.borrow_mut() = world
                    .statuses()
                    .into_iter()
                    .find(|(_, s)| s.shard_id == shard_id && s.is_leader)
                    .map(|(_, s)| s);
                Err(transport_error())
            }
            Some(Fate::OrchestratorDies) => {
                self.dead.set(true);
                Err(transport_error())
            }
            _ => answer,
        }
    }

    fn meta_step(command: &PlacementCommand) -> Option<At> {
        match command {
            PlacementCommand::BeginMigration { .. } | PlacementCommand::BeginSplit { .. } => {
                Some(At::Begin)
            }
            PlacementCommand::CommitMigration { .. } => Some(At::Commit),
            PlacementCommand::RollBackMigration { .. } => Some(At::RollBack),
            PlacementCommand::AbortMigration { .. } => Some(At::Abort),
            _ => None,
        }
    }
}

impl Cluster for SimCluster<'_> {
    async fn propose_shard(
        &self,
        shard_id: u64,
        command: Command,
    ) -> Result<Reply, ControllerError> {
        if self.dead.get() {
            return Err(transport_error());
        }
        let fate = self.shard_step(shard_id, &command).and_then(|at| {
            let fate = self.take_fate(at);
            if let Some(fate) = fate {
                self.note(format!("{at:?} on shard {shard_id}: forced {fate:?}"));
            }
            fate
        });
        let (tx, rx) = oneshot::channel();
        let msg = StoreMsg::Propose {
            shard_id,
            command: command.clone(),
            responder: Responder::Reply(tx),
            caller: None,
        };
        let copy = || StoreMsg::Propose {
            shard_id,
            command: command.clone(),
            responder: Responder::None,
            caller: None,
        };
        let answer = self.call(shard_id, fate, msg, rx, copy);
        self.note(format!(
            "shard {shard_id} {}: {}",
            short(&command),
            match &answer {
                Ok(r) => short_reply(r),
                Err(e) => e.to_string(),
            }
        ));
        answer
    }

    async fn propose_meta(
        &self,
        command: PlacementCommand,
    ) -> Result<Arc<PlacementMap>, ControllerError> {
        if self.dead.get() {
            return Err(transport_error());
        }
        let fate = Self::meta_step(&command).and_then(|at| {
            let fate = self.take_fate(at);
            if let Some(fate) = fate {
                self.note(format!("{at:?} on the map: forced {fate:?}"));
            }
            fate
        });
        let (tx, rx) = oneshot::channel();
        let msg = StoreMsg::ProposeMeta {
            command: command.clone(),
            tx,
        };
        let copy = || {
            let (tx, _rx) = oneshot::channel();
            StoreMsg::ProposeMeta {
                command: command.clone(),
                tx,
            }
        };
        let answer = self
            .call(META_SHARD_ID, fate, msg, rx, copy)
            .map(|(_, map)| Arc::new(map));
        self.note(format!(
            "map {command:?}: {}",
            match &answer {
                Ok(map) => format!("ok, version {}", map.version()),
                Err(e) => e.to_string(),
            }
        ));
        answer
    }

    async fn map(&self) -> Result<Arc<PlacementMap>, ControllerError> {
        if self.dead.get() {
            return Err(transport_error());
        }
        self.world
            .borrow()
            .map()
            .ok_or_else(|| wire(StoreError::LeaderUnknown { shard_id: 0 }))
    }

    async fn start_replica(
        &self,
        node_id: u64,
        shard_id: u64,
        voters: BTreeSet<u64>,
        epoch: u64,
    ) -> Result<(), ControllerError> {
        if self.dead.get() {
            return Err(transport_error());
        }
        let mut world = self.world.borrow_mut();
        let (tx, mut rx) = oneshot::channel();
        world.step(
            node_id,
            vec![StoreMsg::CreatePeer {
                shard_id,
                init: PeerInit::NewShard { voters, epoch },
                tx,
            }],
            false,
        );
        match rx.try_recv() {
            Ok(result) => result.map_err(wire),
            Err(_) => Err(transport_error()),
        }
    }

    async fn pending_exports(&self) -> BTreeMap<u64, Vec<u64>> {
        let mut out = BTreeMap::new();
        for (_, s) in self.world.borrow().statuses() {
            if s.is_leader && s.shard_id != META_SHARD_ID && !s.pending_exports.is_empty() {
                out.insert(s.shard_id, s.pending_exports.clone());
            }
        }
        out
    }

    async fn pause(&self, tries: u32) -> bool {
        if self.dead.get() || tries > MAX_TRIES {
            return false;
        }
        run_for(&mut self.world.borrow_mut(), PAUSE_MS);
        true
    }

    fn clock_offset_allowance_ms(&self) -> u64 {
        super::world::CLOCK_OFFSET_ALLOWANCE_MS
    }

    async fn reads_import_at_clock(&self, _shard_id: u64) -> bool {
        // Every simulated node runs this build.
        true
    }
}

fn short(command: &Command) -> String {
    match command {
        Command::ExportSlots { migration_id, .. } => format!("ExportSlots({migration_id})"),
        Command::ImportSlots {
            migration_id,
            epoch,
            ..
        } => format!("ImportSlots({migration_id}, epoch {epoch})"),
        Command::DropExport { migration_id } => format!("DropExport({migration_id})"),
        Command::CloseMigration { migration_id, .. } => format!("CloseMigration({migration_id})"),
        other => format!("{other:?}"),
    }
}

fn short_reply(reply: &Reply) -> String {
    match reply {
        Reply::Exported { resources, .. } => format!("exported {resources}"),
        other => format!("{other:?}"),
    }
}

// ----- the scenario -----

/// A held lease that must survive the migration, wherever it ends.
struct Held {
    resource: ResourceName,
    lease_id: LeaseId,
}

/// Three nodes, every shard led, and leases held on resources of shard 1.
fn setup(seed: u64) -> (World, Vec<Held>) {
    let mut world = World::new(StdRng::seed_from_u64(seed), None);
    run_for(&mut world, 3_000);
    let map = world.map().expect("a map");
    let mut held = Vec::new();
    for i in 0.. {
        if held.len() == 3 {
            break;
        }
        let resource = ResourceName::parse(&format!("sim/reshard-{i}")).expect("valid");
        if map.shard_of_slot(slot_of(&resource)) != 1 {
            continue;
        }
        let lease_id = LeaseId([i as u8 + 1; 16]);
        let reply = ask(
            &mut world,
            1,
            Command::Acquire {
                resource: resource.clone(),
                owner: Owner::anonymous(),
                request_id: RequestId::new(format!("req-{i}").into_bytes()).expect("valid"),
                lease_id,
                lease_ttl_ms: LEASE_TTL_MS,
                wait_timeout_ms: 0,
                value: fencelock_statemachine::HolderValue::none(),
                mode: fencelock_statemachine::AcquireMode::Exclusive,
            },
        );
        match reply {
            Ok(Reply::Acquire(a)) if matches!(a.status, AcquireStatus::Held { .. }) => {}
            other => panic!("acquire of {resource}: {other:?}"),
        }
        held.push(Held { resource, lease_id });
    }
    (world, held)
}

/// Proposes `command` to the leader of `shard_id`, retrying until a
/// leader answers (for the test's own requests; no faults).
fn ask(world: &mut World, shard_id: u64, command: Command) -> Result<Reply, StoreError> {
    for _ in 0..50 {
        let Some(leader) = world.leaders().get(&shard_id).copied() else {
            run_for(world, 100);
            continue;
        };
        let answer = match &command {
            Command::Acquire { resource, .. } => {
                let (tx, rx) = oneshot::channel();
                let responder = Responder::Acquire {
                    resource: resource.clone(),
                    tx,
                };
                exchange(world, leader, shard_id, &command, responder, rx)
                    .map(|a| a.map(Reply::Acquire))
            }
            _ => {
                let (tx, rx) = oneshot::channel();
                exchange(world, leader, shard_id, &command, Responder::Reply(tx), rx)
            }
        };
        match answer {
            Some(answer) if !retry_later(&answer) => return answer,
            _ => run_for(world, 200),
        }
    }
    panic!("shard {shard_id} never answered {command:?}");
}

/// One proposal at `leader`; its answer, if one came within 3 s.
fn exchange<T>(
    world: &mut World,
    leader: u64,
    shard_id: u64,
    command: &Command,
    responder: Responder,
    mut rx: oneshot::Receiver<Result<T, StoreError>>,
) -> Option<Result<T, StoreError>> {
    let msg = StoreMsg::Propose {
        shard_id,
        command: command.clone(),
        responder,
        caller: None,
    };
    world.step(leader, vec![msg], false);
    match receive(world, 3_000, &mut rx) {
        Got::Answer(answer) => Some(answer),
        Got::Closed | Got::Nothing => None,
    }
}

/// Answers that say "not here, not now" rather than anything about the lock.
fn retry_later(answer: &Result<Reply, StoreError>) -> bool {
    matches!(
        answer,
        Err(StoreError::NotLeader { .. }
            | StoreError::LeaderUnknown { .. }
            | StoreError::LeaderNotReady { .. }
            | StoreError::OutcomeUnknown { .. }
            | StoreError::ShuttingDown
            | StoreError::Lock(LockError::LeaderNotReady { .. }))
    )
}

/// Heals everything and runs `resume` (a new orchestrator, as the meta
/// leader would) until the map has no migration open and no shard keeps an
/// export.
fn settle_with_resume(world: &mut World, log: &mut Vec<String>) {
    world.heal_all();
    run_for(world, 3_000);
    for _ in 0..5 {
        let cluster = SimCluster::new(world, None);
        let result = block_on(reshard::resume(&cluster));
        log.extend(cluster.log.borrow().iter().cloned());
        log.push(format!("resume: {result:?}"));
        run_for(world, 1_000);
        let open = world.map().and_then(|m| m.migration().cloned());
        let kept: Vec<(u64, Vec<u64>)> = world
            .statuses()
            .into_iter()
            .filter(|(_, s)| s.is_leader && !s.pending_exports.is_empty())
            .map(|(_, s)| (s.shard_id, s.pending_exports))
            .collect();
        if open.is_none() && kept.is_empty() {
            return;
        }
        log.push(format!(
            "after resume: open {open:?}, kept exports {kept:?}"
        ));
    }
}

/// The end state every interleaving must reach: the map has no migration
/// open, no shard keeps an export, and each held lease is alive at exactly
/// the shard the map routes its resource to (renewed there, refused as
/// `WrongShard` by the other shards).
fn check_one_owner(world: &mut World, held: &[Held], log: &[String]) {
    if std::env::var_os("FENCELOCK_SIM_LOG").is_some() {
        println!("{}\n", log.join("\n"));
    }
    let map = world.map().expect("a map");
    let context = || log.join("\n  ");
    assert!(
        map.migration().is_none(),
        "a migration is still open: {:?}\n  {}",
        map.migration(),
        context()
    );
    for (node, s) in world.statuses() {
        assert!(
            !s.is_leader || s.pending_exports.is_empty(),
            "shard {} (leader on node {node}) keeps exports {:?}\n  {}",
            s.shard_id,
            s.pending_exports,
            context()
        );
    }
    let data_shards: Vec<u64> = map
        .shards()
        .map(|s| s.shard_id)
        .filter(|id| *id != META_SHARD_ID)
        .collect();
    for h in held {
        let owner = map.shard_of_slot(slot_of(&h.resource));
        for &shard_id in &data_shards {
            let answer = ask(
                world,
                shard_id,
                Command::Renew {
                    resource: h.resource.clone(),
                    owner: Owner::anonymous(),
                    lease_id: h.lease_id,
                    lease_ttl_ms: LEASE_TTL_MS,
                },
            );
            if shard_id == owner {
                assert!(
                    matches!(answer, Ok(Reply::Renewed(_))),
                    "{} is routed to shard {owner}, which answers {answer:?}\n  {}",
                    h.resource,
                    context()
                );
            } else {
                assert!(
                    matches!(answer, Err(StoreError::Lock(LockError::WrongShard { .. }))),
                    "{} is routed to shard {owner}, but shard {shard_id} answers {answer:?}\n  {}",
                    h.resource,
                    context()
                );
            }
        }
    }
}

fn slots_of(held: &[Held]) -> Vec<u32> {
    let slots: BTreeSet<u32> = held.iter().map(|h| slot_of(&h.resource)).collect();
    slots.into_iter().collect()
}

/// What one forced run produced.
pub struct Moved {
    /// The orchestrator's own result.
    pub result: Result<Resharded, ControllerError>,
    /// The shard's status under the next leader, after a forced death.
    pub after_fate: Option<ShardStatus>,
}

/// Moves the held resources' slots from shard 1 to shard 2 with `fate`
/// forced at `at`, then lets `resume` finish; checks the end state.
pub fn move_with(seed: u64, at: At, fate: Fate) -> Moved {
    let (mut world, held) = setup(seed);
    let slots = slots_of(&held);
    let mut log = Vec::new();
    let (result, fired, after_fate) = {
        let cluster = SimCluster::new(&mut world, Some((at, fate)));
        let result = block_on(reshard::move_slots(&cluster, 1, 2, slots));
        log.extend(cluster.log.borrow().iter().cloned());
        let after_fate = cluster.after_fate.borrow().clone();
        (result, cluster.fired(), after_fate)
    };
    log.push(format!("orchestrator: {result:?}"));
    assert!(fired, "{at:?} never happened\n  {}", log.join("\n  "));
    settle_with_resume(&mut world, &mut log);
    check_one_owner(&mut world, &held, &log);
    Moved { result, after_fate }
}

fn is_reason(error: &ControllerError, reason: Reason) -> bool {
    error.detail().is_some_and(|d| d.reason() == reason)
}

// ----- the interleavings -----

/// Issue 17, item 3: the export commits, its answer is lost. The slots must
/// not stay with a source that no longer serves them.
#[test]
fn an_export_whose_answer_is_lost_still_ends_in_one_owner() {
    let moved = move_with(21, At::Export, Fate::AnswerLost);
    let result = moved.result;
    assert!(
        result.is_ok(),
        "retrying the export finishes it: {result:?}"
    );
}

/// Item 3 as reported: the source's leader dies after replicating the
/// export, which the next leader commits.
#[test]
fn an_export_committed_by_the_next_leader_still_ends_in_one_owner() {
    let moved = move_with(22, At::Export, Fate::LeaderDiesAfterReplicating);
    let after = moved.after_fate.expect("shard 1 has a next leader");
    assert_eq!(
        after.pending_exports,
        vec![1],
        "the next leader committed the export"
    );
    assert!(moved.result.is_ok(), "{:?}", moved.result);
}

/// Issue 17, item 4: the import commits, its answer is lost. Rolling back
/// would leave both shards serving the slots.
#[test]
fn an_import_whose_answer_is_lost_still_ends_in_one_owner() {
    let moved = move_with(23, At::Import, Fate::AnswerLost);
    assert!(moved.result.is_ok(), "{:?}", moved.result);
}

#[test]
fn an_import_committed_by_the_next_leader_still_ends_in_one_owner() {
    let moved = move_with(24, At::Import, Fate::LeaderDiesAfterReplicating);
    let done = moved.result.expect("the migration commits");
    let after = moved.after_fate.expect("shard 2 has a next leader");
    assert_eq!(
        after.epoch, done.epoch,
        "the next leader committed the import"
    );
}

/// The target refuses the import (full, say) and a delayed copy of the
/// import reaches it afterwards: the copy must not apply after the
/// orchestrator decided to give the slots back (the shard-side check that
/// the migration is still open).
#[test]
fn a_delayed_import_after_a_refusal_never_makes_a_second_owner() {
    let moved = move_with(25, At::Import, Fate::RefusedThenDelayedCopyLands);
    let e = moved.result.expect_err("the migration was rolled back");
    assert!(is_reason(&e, Reason::PlacementConflict), "{e:?}");
}

/// Every step of a migration (and of its roll-back) meets every fate; the
/// end state is always consistent.
#[test]
fn a_leader_change_or_lost_answer_at_every_step_ends_in_one_owner() {
    let fates = [
        Fate::AnswerLost,
        Fate::LeaderDiesAfterReplicating,
        Fate::LeaderDiesBeforeReplicating,
        Fate::LeaderMoves,
        Fate::OrchestratorDies,
    ];
    let mut seed = 100;
    for at in [At::Begin, At::Export, At::Import, At::Commit, At::Drop] {
        for fate in fates {
            seed += 1;
            let _ = move_with(seed, at, fate);
        }
    }
}

/// The same for the roll-back path: the import is refused (and a delayed
/// copy lands), then a fate strikes a step of the roll-back.
#[test]
fn a_leader_change_or_lost_answer_during_a_roll_back_ends_in_one_owner() {
    let fates = [
        Fate::AnswerLost,
        Fate::LeaderDiesAfterReplicating,
        Fate::LeaderDiesBeforeReplicating,
        Fate::LeaderMoves,
        Fate::OrchestratorDies,
    ];
    let mut seed = 200;
    for at in [At::Close, At::TakeBack, At::RollBack] {
        for fate in fates {
            seed += 1;
            let (mut world, held) = setup(seed);
            let slots = slots_of(&held);
            let mut log = Vec::new();
            {
                // The refusal comes first; the fate under test is armed
                // for the roll-back step once it fired.
                let cluster = SimCluster::new(
                    &mut world,
                    Some((At::Import, Fate::RefusedThenDelayedCopyLands)),
                );
                let armed = ArmAfter::new(&cluster, at, fate);
                let result = block_on(reshard::move_slots(&armed, 1, 2, slots));
                log.extend(cluster.log.borrow().iter().cloned());
                log.push(format!("orchestrator: {result:?}"));
            }
            settle_with_resume(&mut world, &mut log);
            check_one_owner(&mut world, &held, &log);
        }
    }
}

/// Wraps a cluster: once its forced fate fired, arms `(at, fate)`.
struct ArmAfter<'a, 'w> {
    inner: &'a SimCluster<'w>,
    next: Cell<Option<(At, Fate)>>,
}

impl<'a, 'w> ArmAfter<'a, 'w> {
    fn new(inner: &'a SimCluster<'w>, at: At, fate: Fate) -> Self {
        ArmAfter {
            inner,
            next: Cell::new(Some((at, fate))),
        }
    }

    fn arm(&self) {
        if self.inner.fired() {
            if let Some(next) = self.next.take() {
                self.inner.forced.set(Some(next));
            }
        }
    }
}

impl Cluster for ArmAfter<'_, '_> {
    async fn propose_shard(
        &self,
        shard_id: u64,
        command: Command,
    ) -> Result<Reply, ControllerError> {
        self.arm();
        self.inner.propose_shard(shard_id, command).await
    }
    async fn propose_meta(
        &self,
        command: PlacementCommand,
    ) -> Result<Arc<PlacementMap>, ControllerError> {
        self.arm();
        self.inner.propose_meta(command).await
    }
    async fn map(&self) -> Result<Arc<PlacementMap>, ControllerError> {
        self.inner.map().await
    }
    async fn start_replica(
        &self,
        node_id: u64,
        shard_id: u64,
        voters: BTreeSet<u64>,
        epoch: u64,
    ) -> Result<(), ControllerError> {
        self.inner
            .start_replica(node_id, shard_id, voters, epoch)
            .await
    }
    async fn pending_exports(&self) -> BTreeMap<u64, Vec<u64>> {
        self.inner.pending_exports().await
    }
    async fn pause(&self, tries: u32) -> bool {
        self.inner.pause(tries).await
    }
    fn clock_offset_allowance_ms(&self) -> u64 {
        self.inner.clock_offset_allowance_ms()
    }
    async fn reads_import_at_clock(&self, shard_id: u64) -> bool {
        self.inner.reads_import_at_clock(shard_id).await
    }
}

/// The exact state the orchestrator before these rules left behind (issue
/// 17, item 3): the export applied, then the migration was aborted in the
/// map, so the map routes the slots to a source that does not serve them.
/// `resume` gives the source its export back at a fresh epoch.
#[test]
fn resume_gives_back_an_export_an_aborted_migration_left_behind() {
    let (mut world, held) = setup(31);
    let slots = slots_of(&held);
    let mut log = Vec::new();
    {
        let cluster = SimCluster::new(&mut world, None);
        let map = block_on(cluster.propose_meta(PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: slots.clone(),
        }))
        .expect("begun");
        let m = map.migration().cloned().expect("open");
        let exported = block_on(cluster.propose_shard(
            1,
            Command::ExportSlots {
                migration_id: m.id,
                slots: slots.iter().copied().collect(),
            },
        ));
        assert!(
            matches!(exported, Ok(Reply::Exported { .. })),
            "{exported:?}"
        );
        block_on(cluster.propose_meta(PlacementCommand::AbortMigration { migration_id: m.id }))
            .expect("aborted");
        log.extend(cluster.log.borrow().iter().cloned());
    }
    settle_with_resume(&mut world, &mut log);
    check_one_owner(&mut world, &held, &log);
}

/// An orchestrator working from a stale map: migration 1 (shard 1 → 2)
/// committed but its export was never dropped, then migration 2 moved the
/// slots on to shard 3. Finishing migration 1 again — its import is now
/// refused by shard 2 — must not give the slots back to shard 1: shard 2
/// says it has taken part in a later migration, so nothing is decided.
#[test]
fn a_stale_orchestrator_never_gives_back_slots_that_moved_on() {
    let (mut world, held) = setup(41);
    let slots = slots_of(&held);
    let slot_set: fencelock_statemachine::SlotSet = slots.iter().copied().collect();
    let mut log = Vec::new();
    {
        let cluster = SimCluster::new(&mut world, None);
        let begun = block_on(cluster.propose_meta(PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: slots.clone(),
        }))
        .expect("begun");
        let stale = begun.migration().cloned().expect("open");
        let data = match block_on(cluster.propose_shard(
            1,
            Command::ExportSlots {
                migration_id: stale.id,
                slots: slot_set,
            },
        )) {
            Ok(Reply::Exported { data, .. }) => data,
            other => panic!("export: {other:?}"),
        };
        let imported = block_on(cluster.propose_shard(
            2,
            Command::ImportSlots {
                migration_id: stale.id,
                epoch: stale.epoch,
                slots: slot_set,
                data,
                clock_offset_allowance_ms: super::world::CLOCK_OFFSET_ALLOWANCE_MS,
                export_clock_ms: None,
            },
        ));
        assert!(
            matches!(imported, Ok(Reply::Imported { .. })),
            "{imported:?}"
        );
        block_on(cluster.propose_meta(PlacementCommand::CommitMigration {
            migration_id: stale.id,
        }))
        .expect("committed");
        // (No DropExport: its answer, say, never came.) The slots move on.
        let on = block_on(reshard::move_slots(&cluster, 2, 3, slots.clone()));
        assert!(on.is_ok(), "{on:?}");
        let again = block_on(reshard::finish(&cluster, &stale));
        log.extend(cluster.log.borrow().iter().cloned());
        log.push(format!("stale orchestrator: {again:?}"));
        assert!(again.is_err(), "{}", log.join("\n  "));
    }
    settle_with_resume(&mut world, &mut log);
    check_one_owner(&mut world, &held, &log);
    let map = world.map().expect("a map");
    for slot in slots {
        assert_eq!(map.shard_of_slot(slot), 3, "{}", log.join("\n  "));
    }
}

/// Issue 17, item 5: a split whose orchestrator dies after the new shard
/// exists is finished by `resume` — one new shard, serving the slots — and
/// never leaves an empty shard behind.
#[test]
fn a_split_interrupted_at_any_step_is_finished_by_resume() {
    for (i, at) in [At::Begin, At::Export, At::Import, At::Commit]
        .into_iter()
        .enumerate()
    {
        let (mut world, held) = setup(300 + i as u64);
        let before = world.map().expect("a map");
        let upper: Vec<u32> = before.slots_of(1).split_off(before.slots_of(1).len() / 2);
        let mut log = Vec::new();
        {
            let cluster = SimCluster::new(&mut world, Some((at, Fate::OrchestratorDies)));
            let result = block_on(reshard::split(&cluster, 1, upper.clone()));
            log.extend(cluster.log.borrow().iter().cloned());
            log.push(format!("orchestrator: {result:?}"));
        }
        settle_with_resume(&mut world, &mut log);
        let after = world.map().expect("a map");
        let new_shards: Vec<u64> = after
            .shards()
            .map(|s| s.shard_id)
            .filter(|id| before.shard(*id).is_none())
            .collect();
        assert_eq!(
            new_shards.len(),
            1,
            "{at:?}: one new shard, got {new_shards:?}\n  {}",
            log.join("\n  ")
        );
        assert_eq!(
            after.slots_of(new_shards[0]),
            upper,
            "{at:?}: the new shard serves the upper half\n  {}",
            log.join("\n  ")
        );
        check_one_owner(&mut world, &held, &log);
    }
}

/// A store error as a node's gRPC edge answers it (the store's own wire
/// mapping, which the server answers with), decoded as the controller's
/// node calls decode it.
fn wire(e: StoreError) -> ControllerError {
    e.to_detail().into()
}
