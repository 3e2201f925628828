//! The public `AdminService`: inspection from the placement map plus every
//! node's observed status, and operator actions run by [`Ops`].

use fencelock_api::v1::admin_service_server::{AdminService, AdminServiceServer};
use fencelock_api::v1::{
    reshard_request, scheduler_request, AddNodeRequest, AddNodeResponse, BalanceRequest,
    BalanceResponse, DrainNodeRequest, DrainNodeResponse, HotResource, HotResourcesRequest,
    HotResourcesResponse, ListNodesRequest, ListNodesResponse, ListShardsRequest,
    ListShardsResponse, MoveReplicaRequest, MoveReplicaResponse, Node, NodeState, Replica,
    ReplicaRole, ReshardRequest, ReshardResponse, SchedulerRequest, SchedulerResponse, Shard,
    SlotRange, TransferLeaderRequest, TransferLeaderResponse, UndrainNodeRequest,
    UndrainNodeResponse,
};
use fencelock_placement::{NodeState as PlacedState, META_SHARD_ID, SLOT_COUNT};
use tonic::{Request, Response, Status};

use crate::errors::ServerError;
use fencelock_controller::ControllerError;

use crate::ops::Ops;

pub use crate::validate::{DEFAULT_HOT_LIMIT, MAX_HOT_LIMIT};

pub struct AdminServiceImpl {
    ops: Ops,
    /// Actions that change placement run one at a time on a node: two moves
    /// of one shard interleaving their steps would fight over its
    /// configuration. (Safety never depends on this — every step is a
    /// checked Raft or placement command — only progress does.)
    one_at_a_time: tokio::sync::Mutex<()>,
    /// The thresholds `scheduler plan` decides with (this node's
    /// `[controller]` section; every node should have the same one).
    act: fencelock_controller::act::ActConfig,
}

impl AdminServiceImpl {
    pub fn new(ops: Ops, act: fencelock_controller::act::ActConfig) -> Self {
        AdminServiceImpl {
            ops,
            one_at_a_time: tokio::sync::Mutex::new(()),
            act,
        }
    }

    /// The gRPC service over one shared instance: the admin HTTP port
    /// answers through the same one, so its actions take the same turn.
    pub fn into_server(self: std::sync::Arc<Self>) -> AdminServiceServer<Self> {
        AdminServiceServer::from_arc(self)
    }
}

/// An operator action's failure as the admin API answers it. A call to
/// another node that broke off leaves what that node did unknown, so the
/// answer says OUTCOME_UNKNOWN and what to do about it.
fn detailed(error: ControllerError) -> Status {
    crate::ops::status_of(error.or_outcome_unknown(
        0,
        "the action may be partly done: look with `fencelock admin shards` and run it again \
         (every step checks what is already done); an interrupted migration is finished by \
         the meta leader on its own",
    ))
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Status {
    ServerError::InvalidArgument {
        field,
        reason: reason.into(),
    }
    .into()
}

#[tonic::async_trait]
impl AdminService for AdminServiceImpl {
    async fn list_nodes(
        &self,
        _: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        let map = self.ops.fresh_map().await.map_err(detailed)?;
        let statuses = self.ops.statuses(&map).await;
        let nodes = map
            .nodes()
            .map(|n| {
                let status = statuses.get(&n.node_id);
                let state = match (status, n.state) {
                    (None, _) => NodeState::Down,
                    (Some(_), PlacedState::Up) => NodeState::Up,
                    (Some(_), PlacedState::Draining) => NodeState::Draining,
                    (Some(_), PlacedState::Drained) => NodeState::Drained,
                    (Some(_), PlacedState::Down) => NodeState::Down,
                };
                Node {
                    node_id: n.node_id,
                    address: n.addr.clone(),
                    state: state as i32,
                    marked_down: n.state == PlacedState::Down,
                    replica_count: map.shards_on_node(n.node_id).len() as u32,
                    leader_count: status
                        .map(|s| s.replicas.iter().filter(|r| r.is_leader).count() as u32)
                        .unwrap_or(0),
                }
            })
            .collect();
        Ok(Response::new(ListNodesResponse {
            nodes,
            map_version: map.version(),
        }))
    }

    async fn list_shards(
        &self,
        request: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsResponse>, Status> {
        let wanted = request.into_inner().shard_ids;
        // What this node knows, without first asking every node for a newer
        // map (each unreachable one would cost a timeout): its own map (its
        // meta replica's, or the last one fetched), else a fresh one.
        let map = match self.ops.router().map() {
            Some(map) => map,
            None => self.ops.fresh_map().await.map_err(detailed)?,
        };
        let statuses = self
            .ops
            .statuses_within(&map, crate::ops::LIST_STATUS_TIMEOUT)
            .await;
        let unreachable_node_ids = map
            .nodes()
            .map(|n| n.node_id)
            .filter(|n| !statuses.contains_key(n))
            .collect();
        let mut shards = Vec::new();
        for placed in map.shards() {
            if !wanted.is_empty() && !wanted.contains(&placed.shard_id) {
                continue;
            }
            let replica_of = |node: u64| {
                statuses.get(&node).and_then(|s| {
                    s.replicas
                        .iter()
                        .find(|r| r.shard_id == placed.shard_id)
                        .cloned()
                })
            };
            let leader = statuses.iter().find_map(|(node, s)| {
                s.replicas
                    .iter()
                    .find(|r| r.shard_id == placed.shard_id && r.is_leader)
                    .map(|r| (*node, r.clone()))
            });
            let (mut voters, mut learners): (Vec<u64>, Vec<u64>) = match &leader {
                Some((_, r)) => (r.voters.clone(), r.learners.clone()),
                None => (placed.replicas.iter().copied().collect(), Vec::new()),
            };
            voters.sort_unstable();
            learners.sort_unstable();
            let replicas = voters
                .iter()
                .map(|n| (*n, ReplicaRole::Voter))
                .chain(learners.iter().map(|n| (*n, ReplicaRole::Learner)))
                .map(|(node_id, role)| Replica {
                    node_id,
                    role: role as i32,
                    applied_index: replica_of(node_id).map(|r| r.applied_index).unwrap_or(0),
                })
                .collect();
            shards.push(Shard {
                shard_id: placed.shard_id,
                // The meta shard mints no token; its table's epoch is a
                // placeholder, so report the map's (0).
                epoch: match &leader {
                    Some((_, r)) if placed.shard_id != META_SHARD_ID => r.epoch,
                    _ => placed.epoch,
                },
                replicas,
                leader_node_id: leader.as_ref().map(|(n, _)| *n).unwrap_or(0),
                slot_ranges: map
                    .slot_ranges_of(placed.shard_id)
                    .into_iter()
                    .map(|(start, end)| SlotRange { start, end })
                    .collect(),
                held_locks: leader.as_ref().map(|(_, r)| r.held_locks).unwrap_or(0),
                waiters: leader.as_ref().map(|(_, r)| r.waiters).unwrap_or(0),
            });
        }
        Ok(Response::new(ListShardsResponse {
            shards,
            slot_count: SLOT_COUNT,
            map_version: map.version(),
            migration_id: map.migration().map(|m| m.id).unwrap_or(0),
            unreachable_node_ids,
        }))
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let _turn = self.one_at_a_time.lock().await;
        let req = request.into_inner();
        let leader = self
            .ops
            .transfer_leader(req.shard_id, req.to_node_id)
            .await
            .map_err(detailed)?;
        Ok(Response::new(TransferLeaderResponse {
            leader_node_id: leader,
        }))
    }

    async fn move_replica(
        &self,
        request: Request<MoveReplicaRequest>,
    ) -> Result<Response<MoveReplicaResponse>, Status> {
        let _turn = self.one_at_a_time.lock().await;
        let req = request.into_inner();
        let map_version = self
            .ops
            .move_replica(req.shard_id, req.from_node_id, req.to_node_id)
            .await
            .map_err(detailed)?;
        Ok(Response::new(MoveReplicaResponse { map_version }))
    }

    async fn balance(
        &self,
        _: Request<BalanceRequest>,
    ) -> Result<Response<BalanceResponse>, Status> {
        let _turn = self.one_at_a_time.lock().await;
        let moved = self.ops.balance().await.map_err(detailed)?;
        let map = self.ops.fresh_map().await.map_err(detailed)?;
        Ok(Response::new(BalanceResponse {
            map_version: map.version(),
            replicas_moved: moved.replicas,
            leaders_moved: moved.leaders,
        }))
    }

    async fn undrain_node(
        &self,
        request: Request<UndrainNodeRequest>,
    ) -> Result<Response<UndrainNodeResponse>, Status> {
        let _turn = self.one_at_a_time.lock().await;
        let map_version = self
            .ops
            .undrain(request.into_inner().node_id)
            .await
            .map_err(detailed)?;
        Ok(Response::new(UndrainNodeResponse { map_version }))
    }

    async fn drain_node(
        &self,
        request: Request<DrainNodeRequest>,
    ) -> Result<Response<DrainNodeResponse>, Status> {
        let _turn = self.one_at_a_time.lock().await;
        let moved = self
            .ops
            .drain(request.into_inner().node_id)
            .await
            .map_err(detailed)?;
        let map = self.ops.fresh_map().await.map_err(detailed)?;
        Ok(Response::new(DrainNodeResponse {
            map_version: map.version(),
            replicas_moved: moved.replicas,
            leaders_moved: moved.leaders,
        }))
    }

    async fn add_node(
        &self,
        request: Request<AddNodeRequest>,
    ) -> Result<Response<AddNodeResponse>, Status> {
        let _turn = self.one_at_a_time.lock().await;
        let req = request.into_inner();
        crate::validate::new_node_id(req.node_id)?;
        let map_version = self
            .ops
            .add_node(req.node_id, req.address)
            .await
            .map_err(detailed)?;
        Ok(Response::new(AddNodeResponse {
            node_id: req.node_id,
            map_version,
        }))
    }

    async fn reshard(
        &self,
        request: Request<ReshardRequest>,
    ) -> Result<Response<ReshardResponse>, Status> {
        let _turn = self.one_at_a_time.lock().await;
        let done = match request.into_inner().action {
            Some(reshard_request::Action::MoveSlots(m)) => {
                let slots = crate::validate::slots_from_ranges(&m.slots)?;
                self.ops
                    .move_slots(m.from_shard_id, m.to_shard_id, slots)
                    .await
                    .map_err(detailed)?
            }
            Some(reshard_request::Action::SplitShard(s)) => self
                .ops
                .split(s.shard_id, s.split_at_slot)
                .await
                .map_err(detailed)?,
            Some(reshard_request::Action::Resume(_)) => self
                .ops
                .resume()
                .await
                .map_err(detailed)?
                .unwrap_or_default(),
            None => return Err(invalid("action", "say what to change")),
        };
        let map = self.ops.fresh_map().await.map_err(detailed)?;
        Ok(Response::new(ReshardResponse {
            map_version: map.version(),
            new_shard_id: done.new_shard_id,
            migration_id: done.migration_id,
            epoch: done.epoch,
            resources_moved: done.resources,
        }))
    }

    async fn scheduler(
        &self,
        request: Request<SchedulerRequest>,
    ) -> Result<Response<SchedulerResponse>, Status> {
        use scheduler_request::Action;
        let pause = match Action::try_from(request.into_inner().action) {
            Ok(Action::Plan) => {
                // One observation: the plan and its map version agree.
                let (round, map_version) =
                    self.ops.plan_round(&self.act).await.map_err(detailed)?;
                let work = &round.work;
                return Ok(Response::new(SchedulerResponse {
                    paused: round.paused,
                    map_version,
                    work: work.kind().to_owned(),
                    reason: fencelock_controller::act::reason(&self.act, work),
                    steps: (0..work.steps())
                        .filter_map(|i| work.describe_step(i))
                        .collect(),
                    unreachable: round.unreachable.into_iter().collect(),
                    down: round.down.into_iter().collect(),
                }));
            }
            Ok(Action::Status) => None,
            Ok(Action::Pause) => Some(true),
            Ok(Action::Resume) => Some(false),
            Err(_) => {
                return Err(ServerError::InvalidArgument {
                    field: "action",
                    reason: "unknown scheduler action".to_owned(),
                }
                .into())
            }
        };
        let (paused, map_version) = self.ops.scheduler(pause).await.map_err(detailed)?;
        Ok(Response::new(SchedulerResponse {
            paused,
            map_version,
            ..SchedulerResponse::default()
        }))
    }

    async fn raise_epochs(
        &self,
        request: Request<fencelock_api::v1::RaiseEpochsRequest>,
    ) -> Result<Response<fencelock_api::v1::RaiseEpochsResponse>, Status> {
        let req = request.into_inner();
        let above_epoch = match (req.above_token, req.above_epoch) {
            (0, 0) => {
                return Err(invalid(
                    "above_token",
                    "give the highest token any protected system has seen",
                ))
            }
            (0, epoch) => epoch,
            (token, 0) => fencelock_controller::epochs::epoch_of_token(token).map_err(detailed)?,
            _ => {
                return Err(invalid(
                    "above_token",
                    "give the highest token seen or an epoch, not both",
                ))
            }
        };
        let _turn = self.one_at_a_time.lock().await;
        let raised = self.ops.raise_epochs(above_epoch).await.map_err(detailed)?;
        Ok(Response::new(fencelock_api::v1::RaiseEpochsResponse {
            shards: raised
                .shards
                .iter()
                .map(|&(shard_id, epoch)| fencelock_api::v1::ShardEpoch { shard_id, epoch })
                .collect(),
            above_epoch,
            map_version: raised.map_version,
        }))
    }

    async fn hot_resources(
        &self,
        request: Request<HotResourcesRequest>,
    ) -> Result<Response<HotResourcesResponse>, Status> {
        let limit = crate::validate::hot_limit(request.into_inner().limit)?;
        let map = self.ops.fresh_map().await.map_err(detailed)?;
        let statuses = self.ops.statuses(&map).await;
        let mut resources = Vec::new();
        let mut led = std::collections::BTreeSet::new();
        for status in statuses.values() {
            for r in status.replicas.iter().filter(|r| r.is_leader) {
                led.insert(r.shard_id);
                resources.extend(r.hot.iter().map(|h| HotResource {
                    resource: h.resource.clone(),
                    shard_id: r.shard_id,
                    acquires: h.acquires,
                    contended: h.contended,
                    overcount: h.overcount,
                }));
            }
        }
        resources.sort_by(|a, b| {
            b.acquires
                .cmp(&a.acquires)
                .then_with(|| a.resource.cmp(&b.resource))
        });
        resources.truncate(limit as usize);
        let shards_missing = map
            .shards()
            .map(|s| s.shard_id)
            .filter(|id| *id != fencelock_placement::META_SHARD_ID && !led.contains(id))
            .collect();
        Ok(Response::new(HotResourcesResponse {
            resources,
            shards_missing,
        }))
    }
}
