//! Operator actions: the orchestration behind `fencelock admin`.
//!
//! Runs on whichever node received the admin call and drives the cluster
//! through [`NodeApi`] calls (the internal `NodeControl` service) to the
//! nodes involved.
//! Each step observes the cluster first and does only what is missing
//! (neon's reconciler idea, in miniature): a replica move checks the shard's
//! current voters and learners before each membership change, a migration is
//! recorded in the placement map before it starts and every shard-side step
//! is idempotent by migration id. An interrupted action is finished by
//! running it again.
//!
//! What to move where comes from the pure planner in `fencelock-placement`;
//! this module only executes. Errors are [`ControllerError`]s; the server's
//! edge turns them into gRPC statuses.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_api::internal::{
    CreatePeerRequest, DestroyPeerRequest, MembershipChangeKind, NodeStatus, ProposeMetaResponse,
    ReplicaStatus,
};
use fencelock_api::v1::{ErrorDetail, Reason};
use fencelock_placement::{
    plan_balance, plan_drain, Action, ClusterView, Migration, NodeState, PlacementCommand,
    PlacementError, PlacementMap, META_SHARD_ID,
};
use fencelock_router::Router;
use fencelock_statemachine::{Command, Reply};

use crate::error::{ControllerError, Result};
use crate::nodes::NodeApi;
use crate::reshard;

/// How long one step (finding a leader, a proposal, a catch-up, a leader
/// transfer) may take before the action fails with what it has done.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a waiting step looks at the cluster again. Operator actions
/// wait on other nodes' progress, which they can only observe by asking.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// A status call to a node that does not answer in this long counts it as
/// down for planning.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a listing (`ListShards`) waits for each node's status. An
/// operator lists shards exactly when something is down; the answer comes
/// from what answered in this long and names the nodes that did not.
pub const LIST_STATUS_TIMEOUT: Duration = Duration::from_millis(750);

/// What one executed plan did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    pub replicas: u32,
    pub leaders: u32,
}

pub use crate::reshard::Resharded;

/// The planner's view of `map` with what `statuses` observed: each shard's
/// serving leader, and every member that did not answer as down.
pub(crate) fn view_of(map: &PlacementMap, statuses: &BTreeMap<u64, NodeStatus>) -> ClusterView {
    let mut leaders = BTreeMap::new();
    for (node_id, st) in statuses {
        for r in st.replicas.iter().filter(|r| r.is_leader) {
            leaders.insert(r.shard_id, *node_id);
        }
    }
    let mut view = ClusterView::from_map(map, &leaders);
    view.down = map
        .nodes()
        .map(|n| n.node_id)
        .filter(|n| !statuses.contains_key(n))
        .collect();
    view
}

/// The operator actions over the nodes `N` reaches.
pub struct Ops<N> {
    router: Arc<Router>,
    nodes: Arc<N>,
    clock_offset_allowance_ms: u64,
    /// Migrations driven from this node run one at a time (an admin call
    /// and the meta leader's own resume). Safety never depends on it.
    reshard_turn: Arc<tokio::sync::Mutex<()>>,
}

// Not derived: `N` itself need not be `Clone` (it is shared).
impl<N> Clone for Ops<N> {
    fn clone(&self) -> Self {
        Ops {
            router: self.router.clone(),
            nodes: self.nodes.clone(),
            clock_offset_allowance_ms: self.clock_offset_allowance_ms,
            reshard_turn: self.reshard_turn.clone(),
        }
    }
}

fn timeout_err(what: impl std::fmt::Display) -> ControllerError {
    ControllerError::StepTimedOut {
        what: what.to_string(),
        within: STEP_TIMEOUT,
    }
}

fn unknown_shard(shard_id: u64) -> ControllerError {
    ControllerError::Placement(PlacementError::UnknownShard { shard_id })
}

impl<N: NodeApi> Ops<N> {
    pub fn new(router: Arc<Router>, nodes: Arc<N>, clock_offset_allowance_ms: u64) -> Ops<N> {
        Ops {
            router,
            nodes,
            clock_offset_allowance_ms,
            reshard_turn: Arc::default(),
        }
    }

    /// This node's route table (its newest placement map).
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// How this node reaches the others.
    pub fn nodes(&self) -> &Arc<N> {
        &self.nodes
    }

    /// The status of `node_id`, or `None` when it does not answer in time.
    pub async fn node_status(&self, node_id: u64) -> Option<NodeStatus> {
        self.node_status_within(node_id, STATUS_TIMEOUT).await
    }

    async fn node_status_within(&self, node_id: u64, timeout: Duration) -> Option<NodeStatus> {
        match tokio::time::timeout(timeout, self.nodes.status(node_id)).await {
            Ok(Ok(status)) => Some(status),
            _ => None,
        }
    }

    /// The newest placement map any reachable node knows (installed in this
    /// node's router too).
    pub async fn fresh_map(&self) -> Result<Arc<PlacementMap>> {
        for (node_id, _) in self.router.all_nodes() {
            let call = self.nodes.get_map(node_id);
            if let Ok(Ok(snap)) = tokio::time::timeout(STATUS_TIMEOUT, call).await {
                if snap.version > self.router.map_version() {
                    if let Ok(map) = PlacementMap::restore(&snap.map) {
                        self.router.offer_map(map);
                    }
                }
            }
        }
        self.router.map().ok_or(ControllerError::LeaderUnknown {
            shard_id: META_SHARD_ID,
        })
    }

    /// Every member's status, by node id (absent: did not answer).
    pub async fn statuses(&self, map: &PlacementMap) -> BTreeMap<u64, NodeStatus> {
        self.statuses_within(map, STATUS_TIMEOUT).await
    }

    /// Every member's status, asked of all at once, each waited for at most
    /// `timeout` (absent: did not answer in time).
    pub async fn statuses_within(
        &self,
        map: &PlacementMap,
        timeout: Duration,
    ) -> BTreeMap<u64, NodeStatus> {
        let calls = map.nodes().map(|n| {
            let node_id = n.node_id;
            async move { (node_id, self.node_status_within(node_id, timeout).await) }
        });
        let mut out = BTreeMap::new();
        for (node_id, status) in join_all(calls).await {
            if let Some(s) = status {
                out.insert(node_id, s);
            }
        }
        out
    }

    /// The serving leader of `shard_id` and its replica status, waiting for
    /// an election if there is none.
    pub async fn leader(&self, shard_id: u64) -> Result<(u64, ReplicaStatus)> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let map = self.router.map();
            let mut candidates = self.router.candidates(shard_id);
            if let Some(map) = &map {
                candidates.extend(map.nodes().map(|n| n.node_id));
            }
            let mut seen = BTreeSet::new();
            for node_id in candidates {
                if !seen.insert(node_id) {
                    continue;
                }
                let Some(status) = self.node_status(node_id).await else {
                    continue;
                };
                if let Some(r) = status
                    .replicas
                    .iter()
                    .find(|r| r.shard_id == shard_id && r.is_leader)
                {
                    self.router.note_leader(shard_id, node_id);
                    return Ok((node_id, r.clone()));
                }
            }
            if Instant::now() >= deadline {
                return Err(timeout_err(format!(
                    "finding the leader of shard {shard_id}"
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Runs `call` against the leader of `shard_id`, retrying while
    /// leadership moves.
    async fn at_leader<T, F, Fut>(&self, shard_id: u64, call: F) -> Result<T>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let (leader, _) = self.leader(shard_id).await?;
            match call(leader).await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retriable() && Instant::now() < deadline => {
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Proposes a placement command to the meta shard. Not retried on an
    /// unknown outcome: the caller decides from the map what happened. A
    /// command newer than the first release's format is refused unless
    /// every member reads it ([`crate::formats`]).
    pub async fn propose_meta(&self, command: PlacementCommand) -> Result<ProposeMetaResponse> {
        if command.format() > fencelock_placement::FIRST_PLACEMENT_FORMAT {
            let map = self.fresh_map().await?;
            let reported: BTreeMap<u64, u32> = self
                .statuses_within(&map, LIST_STATUS_TIMEOUT)
                .await
                .into_iter()
                .map(|(node_id, s)| (node_id, s.placement_format))
                .collect();
            crate::formats::check_readable(&command, &map, &reported)?;
        }
        let bytes = command.encode();
        let resp = self
            .at_leader(META_SHARD_ID, |leader| {
                self.nodes.propose_meta(leader, bytes.clone())
            })
            .await?;
        if let Ok(map) = PlacementMap::restore(&resp.map) {
            self.router.offer_map(map);
        }
        Ok(resp)
    }

    /// Applies one membership change at the shard's leader and waits until
    /// the leader's published status shows it (status is published once per
    /// Raft tick, so a step right after the change could read the old one).
    async fn change_membership(
        &self,
        shard_id: u64,
        change: MembershipChangeKind,
        node_id: u64,
    ) -> Result<ReplicaStatus> {
        self.at_leader(shard_id, |leader| {
            self.nodes
                .change_membership(leader, shard_id, change, node_id)
        })
        .await?;
        let done = |s: &ReplicaStatus| match change {
            MembershipChangeKind::AddLearner => s.learners.contains(&node_id),
            MembershipChangeKind::AddVoter => s.voters.contains(&node_id),
            _ => !s.voters.contains(&node_id) && !s.learners.contains(&node_id),
        };
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let (_, status) = self.leader(shard_id).await?;
            if done(&status) {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(timeout_err(format!(
                    "membership change {change:?} of node {node_id} in shard {shard_id}"
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Moves leadership of `shard_id` to `to` and waits until it serves.
    pub async fn transfer_leader(&self, shard_id: u64, to: u64) -> Result<u64> {
        // Arguments are checked against the map before waiting on anything:
        // a shard or node that does not exist is refused at once.
        let map = self.fresh_map().await?;
        if map.shard(shard_id).is_none() {
            return Err(unknown_shard(shard_id));
        }
        if map.node(to).is_none() {
            return Err(PlacementError::UnknownNode { node_id: to }.into());
        }
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let (leader, status) = self.leader(shard_id).await?;
            if leader == to {
                return Ok(to);
            }
            if !status.voters.contains(&to) {
                return Err(PlacementError::NotAReplica {
                    shard_id,
                    node_id: to,
                }
                .into());
            }
            let _ = self.nodes.transfer_leader(leader, shard_id, to).await;
            // A transfer completes within an election timeout or is
            // abandoned by raft; ask again until the deadline.
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                tokio::time::sleep(POLL_INTERVAL).await;
                if let Some(s) = self.node_status(to).await {
                    if s.replicas
                        .iter()
                        .any(|r| r.shard_id == shard_id && r.is_leader)
                    {
                        self.router.note_leader(shard_id, to);
                        return Ok(to);
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(timeout_err(format!(
                    "moving leadership of shard {shard_id} to node {to}"
                )));
            }
        }
    }

    /// Moves the replica of `shard_id` on `from` to `to`: learner, catch
    /// up, promote, leadership away from `from`, remove, destroy, record.
    pub async fn move_replica(&self, shard_id: u64, from: u64, to: u64) -> Result<u64> {
        let map = self.fresh_map().await?;
        if map.shard(shard_id).is_none() {
            return Err(unknown_shard(shard_id));
        }
        match map.node(to) {
            Some(n) if n.state == NodeState::Up => {}
            Some(n) => {
                return Err(PlacementError::NodeNotUp {
                    node_id: to,
                    state: n.state,
                }
                .into())
            }
            None => return Err(PlacementError::UnknownNode { node_id: to }.into()),
        }
        let (_, status) = self.leader(shard_id).await?;
        let is_member =
            |s: &ReplicaStatus, n: u64| s.voters.contains(&n) || s.learners.contains(&n);
        if !is_member(&status, from) && !status.voters.contains(&to) {
            return Err(PlacementError::NotAReplica {
                shard_id,
                node_id: from,
            }
            .into());
        }
        if from == to {
            return Ok(map.version());
        }
        // 1. A learner on `to`.
        if !is_member(&status, to) {
            let request = CreatePeerRequest {
                shard_id,
                ..Default::default()
            };
            self.nodes.create_peer(to, request).await?;
            self.change_membership(shard_id, MembershipChangeKind::AddLearner, to)
                .await?;
        }
        // 2. Caught up: applied what the leader had committed.
        let (_, status) = self.leader(shard_id).await?;
        if !status.voters.contains(&to) {
            let target = status.commit_index;
            let deadline = Instant::now() + STEP_TIMEOUT;
            loop {
                let applied = self
                    .node_status(to)
                    .await
                    .and_then(|s| s.replicas.into_iter().find(|r| r.shard_id == shard_id))
                    .map(|r| r.applied_index)
                    .unwrap_or(0);
                if applied >= target {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(timeout_err(format!(
                        "catching up shard {shard_id} on node {to} (applied {applied} of {target})"
                    )));
                }
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            // 3. Promote.
            self.change_membership(shard_id, MembershipChangeKind::AddVoter, to)
                .await?;
        }
        // 4. Leadership off `from`.
        let (leader, status) = self.leader(shard_id).await?;
        if leader == from {
            self.transfer_leader(shard_id, to).await?;
        }
        // 5. Remove `from`.
        if is_member(&status, from) {
            self.change_membership(shard_id, MembershipChangeKind::Remove, from)
                .await?;
        }
        // 6. Its data goes: the leader no longer lists `from` (step 5 waited
        // for that). A node that is down keeps an inert copy; it holds no
        // vote in the shard any more.
        let request = DestroyPeerRequest {
            shard_id,
            removed_from_shard: true,
        };
        let _ = self.nodes.destroy_peer(from, request).await;
        // 7. Record what the shard's configuration now is.
        let (_, status) = self.leader(shard_id).await?;
        let mut replicas: BTreeSet<u64> = status.voters.iter().copied().collect();
        // The status may lag the removal by a tick; the removal is done.
        replicas.remove(&from);
        replicas.insert(to);
        let resp = self
            .propose_meta(PlacementCommand::SetReplicas { shard_id, replicas })
            .await?;
        Ok(map_version(&resp))
    }

    /// The newest map and every member's status (absent: did not answer),
    /// asked once; the input of every plan.
    pub(crate) async fn observe(&self) -> Result<(Arc<PlacementMap>, BTreeMap<u64, NodeStatus>)> {
        let map = self.fresh_map().await?;
        let statuses = self.statuses(&map).await;
        Ok((map, statuses))
    }

    pub(crate) async fn view(&self) -> Result<ClusterView> {
        let (map, statuses) = self.observe().await?;
        Ok(view_of(&map, &statuses))
    }

    pub(crate) async fn execute(&self, plan: Vec<Action>) -> Result<Moved> {
        let mut moved = Moved::default();
        for action in plan {
            match action {
                Action::MoveReplica { shard_id, from, to } => {
                    self.move_replica(shard_id, from, to).await?;
                    moved.replicas += 1;
                }
                Action::TransferLeader { shard_id, to } => {
                    self.transfer_leader(shard_id, to).await?;
                    moved.leaders += 1;
                }
            }
        }
        Ok(moved)
    }

    /// Balances replicas, then leaderships, over the Up nodes.
    pub async fn balance(&self) -> Result<Moved> {
        let view = self.view().await?;
        self.execute(plan_balance(&view)).await
    }

    /// Empties `node_id` of replicas and leaderships.
    pub async fn drain(&self, node_id: u64) -> Result<Moved> {
        // Plan first (the planner plans as if the node were draining): a
        // drain it refuses changes nothing, the node stays as it was.
        let view = self.view().await?;
        let before = view.nodes.get(&node_id).copied();
        plan_drain(&view, node_id)?;
        self.propose_meta(PlacementCommand::SetNodeState {
            node_id,
            state: NodeState::Draining,
        })
        .await?;
        // The map may have changed in between: plan again on the new one.
        let view = self.view().await?;
        let plan = match plan_drain(&view, node_id) {
            Ok(plan) => plan,
            Err(e) => {
                if before == Some(NodeState::Up) {
                    // Nothing moved yet: put the node back as it was.
                    self.propose_meta(PlacementCommand::SetNodeState {
                        node_id,
                        state: NodeState::Up,
                    })
                    .await?;
                }
                return Err(e.into());
            }
        };
        let moved = self.execute(plan).await?;
        self.propose_meta(PlacementCommand::SetNodeState {
            node_id,
            state: NodeState::Drained,
        })
        .await?;
        Ok(moved)
    }

    /// Makes a draining or drained node UP again (cancels a drain). Moves
    /// nothing: `balance` brings replicas back.
    pub async fn undrain(&self, node_id: u64) -> Result<u64> {
        let resp = self
            .propose_meta(PlacementCommand::SetNodeState {
                node_id,
                state: NodeState::Up,
            })
            .await?;
        Ok(map_version(&resp))
    }

    /// Moves `slots` from shard `from` to shard `to` (after finishing any
    /// migration left in progress). See [`crate::reshard`].
    pub async fn move_slots(&self, from: u64, to: u64, slots: Vec<u32>) -> Result<Resharded> {
        let _turn = self.reshard_turn.lock().await;
        if let Some(done) = self
            .finish_open(|m| {
                !m.new_shard && m.from_shard == from && m.to_shard == to && m.slots == slots
            })
            .await?
        {
            return Ok(done);
        }
        reshard::move_slots(self, from, to, slots).await
    }

    /// Finishes the migration the map has open, if any, and drops or gives
    /// back what earlier ones left (see [`reshard::resume`]).
    pub async fn resume(&self) -> Result<Option<Resharded>> {
        let _turn = self.reshard_turn.lock().await;
        reshard::resume(self).await
    }

    /// [`Self::resume`], unless a resharding action runs on this node now
    /// (`None` then): the meta leader's own look never queues behind, or
    /// ahead of, an operator's action, which finishes open migrations
    /// first anyway.
    pub async fn resume_unless_busy(&self) -> Result<Option<Resharded>> {
        let Ok(_turn) = self.reshard_turn.try_lock() else {
            return Ok(None);
        };
        reshard::resume(self).await
    }

    /// Finishes the open migration, if any; its result if `same` says it is
    /// the one the caller was about to begin.
    async fn finish_open(&self, same: impl Fn(&Migration) -> bool) -> Result<Option<Resharded>> {
        let map = self.fresh_map().await?;
        let Some(m) = map.migration().cloned() else {
            return Ok(None);
        };
        let done = reshard::finish(self, &m).await;
        if same(&m) {
            return done.map(Some);
        }
        done?;
        Ok(None)
    }

    /// Splits `shard_id`: a new shard on the same nodes takes its slots from
    /// `at_slot` on (0: the upper half). The new shard and the migration to
    /// it are one placement decision, so a split interrupted anywhere is an
    /// open migration that `resume` (or re-running the split) finishes.
    pub async fn split(&self, shard_id: u64, at_slot: u32) -> Result<Resharded> {
        let _turn = self.reshard_turn.lock().await;
        let map = self.fresh_map().await?;
        if map.shard(shard_id).is_none() {
            return Err(unknown_shard(shard_id));
        }
        let owned = map.slots_of(shard_id);
        let at = if at_slot == 0 {
            owned.get(owned.len() / 2).copied().unwrap_or(0)
        } else {
            at_slot
        };
        let upper: Vec<u32> = owned.iter().copied().filter(|&s| s >= at).collect();
        // A split of this shard left open (its new shard already made) is
        // finished rather than begun again.
        if let Some(done) = self
            .finish_open(|m| m.new_shard && m.from_shard == shard_id && m.slots == upper)
            .await?
        {
            return Ok(done);
        }
        if upper.is_empty() || upper.len() == owned.len() {
            return Err(ControllerError::InvalidArgument {
                field: "split_at_slot",
                reason: format!(
                    "shard {shard_id} must own slots on both sides of slot {at} (it owns {} slots)",
                    owned.len()
                ),
            });
        }
        reshard::split(self, shard_id, upper).await
    }

    /// Records a new, running, empty node in the map.
    pub async fn add_node(&self, node_id: u64, addr: String) -> Result<u64> {
        let resp = self
            .propose_meta(PlacementCommand::AddNode { node_id, addr })
            .await?;
        Ok(map_version(&resp))
    }
}

impl<N: NodeApi> Ops<N> {
    /// One attempt of a shard command for [`reshard`], unbounded in time.
    async fn propose_shard_once(&self, shard_id: u64, command: Command) -> Result<Reply> {
        // No leader in time is not an answer of the shard.
        let (leader, _) = self
            .leader(shard_id)
            .await
            .map_err(|_| ControllerError::LeaderUnknown { shard_id })?;
        self.nodes
            .propose_shard(leader, shard_id, &command)
            .await
            .map_err(|e| {
                e.or_outcome_unknown(
                    shard_id,
                    &format!("proposing to shard {shard_id} at node {leader}"),
                )
            })
    }

    /// One attempt of a placement command for [`reshard`], unbounded in time.
    async fn propose_meta_once(&self, command: PlacementCommand) -> Result<Arc<PlacementMap>> {
        let resp = Ops::propose_meta(self, command)
            .await
            .map_err(|e| e.or_outcome_unknown(META_SHARD_ID, "proposing to the map"))?;
        let map = PlacementMap::restore(&resp.map)
            .map_err(|e| ControllerError::Internal(format!("map in a meta answer: {e}")))?;
        Ok(Arc::new(map))
    }
}

/// Pauses between tries of a migration step: 50 ms doubling to 1 s, about
/// [`STEP_TIMEOUT`] in all when every attempt is answered.
const RESHARD_MAX_TRIES: u32 = 35;
/// One attempt of a migration step (finding the leader included) gets this
/// long; no answer in time is an unknown outcome, tried again. Bounds a
/// step at about `RESHARD_MAX_TRIES × (this + 1 s)` even against a node
/// that keeps the connection open and never answers.
const RESHARD_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs one attempt of a migration step within [`RESHARD_ATTEMPT_TIMEOUT`].
async fn one_attempt<T>(
    shard_id: u64,
    what: &str,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(RESHARD_ATTEMPT_TIMEOUT, call).await {
        Ok(answer) => answer,
        Err(_) => Err(ErrorDetail {
            shard_id,
            ..ErrorDetail::new(
                Reason::OutcomeUnknown,
                format!("{what}: no answer within {RESHARD_ATTEMPT_TIMEOUT:?}"),
            )
        }
        .into()),
    }
}

impl<N: NodeApi> reshard::Cluster for Ops<N> {
    async fn propose_shard(&self, shard_id: u64, command: Command) -> Result<Reply> {
        let what = format!("proposing to shard {shard_id}");
        one_attempt(shard_id, &what, self.propose_shard_once(shard_id, command)).await
    }

    async fn propose_meta(&self, command: PlacementCommand) -> Result<Arc<PlacementMap>> {
        one_attempt(
            META_SHARD_ID,
            "proposing to the map",
            self.propose_meta_once(command),
        )
        .await
    }

    async fn map(&self) -> Result<Arc<PlacementMap>> {
        self.fresh_map().await
    }

    async fn start_replica(
        &self,
        node_id: u64,
        shard_id: u64,
        voters: BTreeSet<u64>,
        epoch: u64,
    ) -> Result<()> {
        let what = format!("starting shard {shard_id}'s replica on node {node_id}");
        let request = CreatePeerRequest {
            shard_id,
            new_shard_voters: voters.into_iter().collect(),
            epoch,
        };
        let call = async {
            self.nodes
                .create_peer(node_id, request)
                .await
                .map_err(|e| e.or_outcome_unknown(shard_id, &format!("node {node_id}")))
        };
        one_attempt(shard_id, &what, call).await
    }
    async fn pending_exports(&self) -> BTreeMap<u64, Vec<u64>> {
        let Some(map) = self.router.map() else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for status in self.statuses(&map).await.into_values() {
            for r in status.replicas {
                if r.is_leader && r.shard_id != META_SHARD_ID && !r.pending_exports.is_empty() {
                    out.insert(r.shard_id, r.pending_exports);
                }
            }
        }
        out
    }

    async fn pause(&self, tries: u32) -> bool {
        if tries > RESHARD_MAX_TRIES {
            return false;
        }
        let step = POLL_INTERVAL.saturating_mul(1 << tries.min(5));
        tokio::time::sleep(step.min(Duration::from_secs(1))).await;
        true
    }

    fn clock_offset_allowance_ms(&self) -> u64 {
        self.clock_offset_allowance_ms
    }

    async fn reads_import_at_clock(&self, shard_id: u64) -> bool {
        let Ok(map) = self.fresh_map().await else {
            return false;
        };
        let Some(shard) = map.shard(shard_id) else {
            return false;
        };
        let calls = shard
            .replicas
            .iter()
            .map(|&node_id| self.node_status_within(node_id, LIST_STATUS_TIMEOUT));
        crate::formats::all_read(
            join_all(calls)
                .await
                .iter()
                .map(|s| s.as_ref().map(|s| s.placement_format)),
            fencelock_placement::IMPORT_AT_CLOCK_FORMAT,
        )
    }
}

fn map_version(resp: &ProposeMetaResponse) -> u64 {
    PlacementMap::restore(&resp.map)
        .map(|m| m.version())
        .unwrap_or(0)
}

/// Awaits every future concurrently, keeping their order.
pub async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = (0..handles.len()).map(|_| None).collect();
    let mut pending: Vec<(usize, std::pin::Pin<Box<F>>)> =
        handles.into_iter().enumerate().collect();
    std::future::poll_fn(|cx| {
        pending.retain_mut(|(i, fut)| match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(out) => {
                outputs[*i] = Some(out);
                false
            }
            std::task::Poll::Pending => true,
        });
        if pending.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().map(|o| o.expect("ready")).collect()
}
