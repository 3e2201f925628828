//! The loop: [`Store`] opens every replica, waits for work (no sleep-polling),
//! and runs one iteration per wake-up: handle messages and landed writes,
//! tick, propose, stage, send, apply, answer, hand the next batch to the
//! writer (see [`crate::write`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use fencelock_placement::{PlacementMap, META_SHARD_ID};
use fencelock_router::Router;
use fencelock_statemachine::{Command, LeaseId, SlotSet};
use fencelock_storage::{Engine, RocksEngine, ShardStorage, WriteBatch};

use crate::apply::{queue_cancel, respond_err, sweep_orphans};
use crate::membership::{bootstrap_batch, bootstrap_table, META_TABLE_EPOCH};
use crate::msg::{MembershipChange, Responder, StoreMsg};
use crate::replica::{fail_peer, Peer, PendingRead, ShardStatus};
use crate::snapshot::resend_lost_snapshots;
#[cfg(feature = "simulation")]
use crate::SimFault;
use crate::{
    Clock, Envelope, Observers, PeerSink, StoreConfig, StoreError, StoreIo, SystemClock,
    HOT_REPORTED_PER_SHARD, MAX_MSGS_PER_ITERATION,
};

/// Rounds of one [`Store::step`] (collect landed writes, propose, stage
/// readies, hand the batch over) before it returns: enough for a write
/// written inline to land, commit and apply within the step.
const MAX_ROUNDS_PER_STEP: usize = 6;

pub struct Store {
    pub(crate) node_id: u64,
    pub(crate) router: Arc<Router>,
    pub(crate) config: StoreConfig,
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) peers: BTreeMap<u64, Peer>,
    pub(crate) transport: Arc<dyn PeerSink>,
    /// Wall and monotonic time (the system clock in production).
    pub(crate) time: Arc<dyn Clock>,
    /// See [`StoreIo::fixed_election_timeout`].
    pub(crate) fixed_election_timeout: bool,
    pub(crate) inbox: Receiver<StoreMsg>,
    pub(crate) next_id: u64,
    pub(crate) status: Arc<std::sync::Mutex<Vec<ShardStatus>>>,
    /// The next batch: every shard's staged `Ready` and the deferred writes
    /// (applied index, snapshots, compactions), handed to the disk when the
    /// batch in flight has landed.
    pub(crate) deferred: WriteBatch,
    /// The write path: what is in flight and what waits for it.
    pub(crate) writes: crate::write::Writes,
    /// The snapshot thread: tables frozen on the loop, encoded off it.
    pub(crate) snapshots: crate::snapshot::Encoder,
    /// Metrics (thread-local, flushed per tick) and the audit sink.
    pub(crate) obs: Observers,
    /// A deliberate bug, armed only by the simulation's broken-variant test.
    #[cfg(feature = "simulation")]
    pub(crate) sim_fault: Option<SimFault>,
}

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
            write_mode: crate::WriteMode::Thread,
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
            write_mode,
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
        let storage_err = StoreError::from_storage;
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
        let writes = crate::write::Writes::new(write_mode, engine.clone(), node_id);
        let mut store = Store {
            writes,
            snapshots: crate::snapshot::Encoder::new(write_mode, node_id),
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

    /// Runs until a `Shutdown` message or until every sender is gone:
    /// blocks on the inbox and the Raft ticker, drains what else is queued
    /// (bounded), and hands it all to one [`Store::step`].
    pub fn run(mut self) {
        let ticker =
            crossbeam_channel::tick(Duration::from_millis(self.config.raft.tick_interval_ms));
        let window = self.config.raft.group_commit_window();
        let mut msgs = Vec::new();
        // When the previous iteration ended.
        let mut last_step_end = std::time::Instant::now();
        let landed = self.writes.done_rx.clone();
        let encoded = self.snapshots.done_rx.clone();
        loop {
            let mut ticked = false;
            crossbeam_channel::select! {
                recv(self.inbox) -> msg => match msg {
                    Ok(StoreMsg::Shutdown) | Err(_) => break,
                    Ok(msg) => msgs.push(msg),
                },
                recv(ticker) -> _ => ticked = true,
                // A write landed: its acknowledgements leave and the next
                // batch goes to the disk (handled in `step`).
                recv(landed) -> done => match done {
                    Ok(done) => self.on_write_landed(done),
                    Err(_) => panic!("fencelock: the writer thread is gone; stopping the node"),
                },
                // A snapshot was encoded: it joins the next batch.
                recv(encoded) -> done => match done {
                    Ok(done) => self.on_snapshot_encoded(done),
                    Err(_) => panic!("fencelock: the snapshot thread is gone; stopping the node"),
                },
            }
            let mut stop = false;
            // Group commit: an iteration that starts moments after the
            // previous one ended would sync a write carrying little. Under
            // load, wait (blocking on the inbox, not polling) until the
            // window since that write has passed, so each fsync carries
            // the requests and peer appends of the whole window. An idle
            // node is past the window already and does not wait.
            // A tick is due now: take what is queued without waiting.
            // (While a write is in flight the window still applies: what
            // arrives in it rides the next batch anyway, and fewer, fuller
            // entries cost less CPU per command.)
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
    /// then, in rounds until nothing moves: handles landed writes, proposes,
    /// stages every ready, sends, applies and answers, and hands the staged
    /// batch to the disk when none is in flight. [`Store::run`] calls it as events arrive; a simulation calls
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
        // Rounds until nothing moves (bounded): a landed write lets raft-rs
        // commit and hands the next batch to the disk; a round can make a
        // shard leader (it then proposes its LeaderChanged entry).
        for _ in 0..MAX_ROUNDS_PER_STEP {
            let landed = self.collect_writes();
            let encoded = self.collect_snapshots();
            // Back-pressure: a slow disk stops the loop here rather than
            // let the next batch grow without bound; its inbox fills and
            // callers are refused SERVER_BUSY.
            if self.writes.in_flight.is_some()
                && self.deferred.size_bytes() > self.writes.max_staged_bytes
            {
                if let Some(done) = self.writes.wait() {
                    self.on_write_landed(done);
                }
            }
            self.flush_proposals();
            let readied = self.process_readies();
            let handed = self.hand_over_write();
            if !landed && !encoded && !readied && !handed {
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

    /// A clean stop: the write in flight lands and everything staged
    /// (entries, applied index, snapshots) is written synced before the
    /// database closes, so a clean
    /// restart replays nothing it had already applied; everyone still
    /// waiting is told the node is shutting down. (Dropping a `Store`
    /// without this is what a crash looks like.)
    pub fn close(mut self) {
        self.flush_deferred();
        self.obs.metrics.flush();
        self.fail_everything(|_| StoreError::ShuttingDown);
    }

    /// Whether a batch waits for the driver's [`Store::complete_write`]
    /// ([`crate::WriteMode::Driven`]).
    pub fn write_pending(&self) -> bool {
        self.writes.held.is_some()
    }

    /// Writes the batch the driver held back ([`crate::WriteMode::Driven`]);
    /// the next [`Store::step`] handles its landing. Returns whether there
    /// was one.
    pub fn complete_write(&mut self) -> bool {
        self.writes.complete_held()
    }

    /// Whether a snapshot waits for the driver's [`Store::complete_snapshot`]
    /// ([`crate::WriteMode::Driven`]).
    pub fn snapshot_pending(&self) -> bool {
        self.snapshots.held()
    }

    /// Encodes the oldest snapshot the driver held back
    /// ([`crate::WriteMode::Driven`]); the next [`Store::step`] saves it
    /// (or drops it, if something newer came meanwhile). Returns whether
    /// there was one.
    pub fn complete_snapshot(&mut self) -> bool {
        self.snapshots.complete_held()
    }

    /// The node this store runs on.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// The clock-offset allowance a new leader's `LeaderChanged` carries.
    pub(crate) fn leader_changed_allowance_ms(&self) -> u64 {
        self.config.raft.clock_offset_allowance_ms
    }

    pub(crate) fn handle(&mut self, msg: StoreMsg) {
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
            StoreMsg::Watch {
                shard_id,
                resource,
                after,
                tx,
            } => {
                let node_watchers = self.peers.values().map(|p| p.watch.watcher_count()).sum();
                let Some(peer) = self.peers.get_mut(&shard_id) else {
                    let _ = tx.send(Err(StoreError::ShardNotHere { shard_id }));
                    return;
                };
                let answer = peer
                    .watch
                    .subscribe(&peer.table, &resource, after, node_watchers)
                    .map_err(|limit| StoreError::TooManyWatchers { limit });
                let _ = tx.send(answer);
            }
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

    /// Hands the meta replica's map to the router (and new node addresses
    /// to the transport) when it is newer than what the router has.
    pub(crate) fn publish_map(&self) {
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
    pub(crate) fn ready_peer(&mut self, shard_id: u64) -> Result<&mut Peer, StoreError> {
        match self.peers.get(&shard_id) {
            None => Err(StoreError::ShardNotHere { shard_id }),
            Some(peer) if !peer.is_ready_leader() => Err(self.leader_hint(shard_id)),
            Some(_) => Ok(self.peers.get_mut(&shard_id).expect("checked above")),
        }
    }

    /// NotLeader with the leader's address, LeaderNotReady, or LeaderUnknown.
    pub(crate) fn leader_hint(&self, shard_id: u64) -> StoreError {
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

    pub(crate) fn next_proposal_id(&mut self) -> u64 {
        // Unique across nodes: a follower never mistakes another node's entry
        // for one of its own proposals.
        self.next_id += 1;
        (self.node_id << 48) | (self.next_id & ((1 << 48) - 1))
    }

    pub(crate) fn on_tick(&mut self) {
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

    pub(crate) fn publish_status(&mut self) {
        let now = self.time.now();
        let wall_ms = self.time.wall_ms();
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
                    lease_clock_behind_wall_ms: p
                        .clock
                        .filter(|_| p.is_leader())
                        .map_or(0, |c| wall_ms as i64 - c.now_ms(now) as i64),
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

    pub(crate) fn fail_everything(&mut self, err: impl Fn(u64) -> StoreError) {
        for peer in self.peers.values_mut() {
            let e = err(peer.shard_id);
            fail_peer(peer, e);
        }
    }
}
