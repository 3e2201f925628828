//! The `NodeControl` service: the node-local half of operator actions. Each
//! call does one thing on this node's store (propose to a shard it leads,
//! change a shard's membership, start or delete a replica) and answers with
//! a typed error — NOT_LEADER with a hint included — when it cannot. The
//! orchestration lives in `fencelock_controller::ops` (reaching this
//! service through [`crate::ops::GrpcNodes`]).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use fencelock_placement::{PlacementCommand, PlacementMap, PlacementReply};
use fencelock_statemachine::{Command, Reply};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::errors::ServerError;
use crate::internal::node_control_server::{NodeControl, NodeControlServer};
use crate::internal::{
    ChangeMembershipRequest, ControlAck, CreatePeerRequest, DestroyPeerRequest, GetMapRequest,
    MapSnapshot, MembershipChangeKind, NodeStatus, ProposeMetaRequest, ProposeMetaResponse,
    ProposeShardRequest, ProposeShardResponse, ReplicaStatus, StatusRequest, TransferLeaderRequest,
};
use crate::metrics::Metrics;
use crate::router::Router;
use crate::store::{
    MembershipChange, PeerInit, Responder, ShardStatus, StoreError, StoreMsg, StoreSender,
};

#[derive(Clone)]
pub struct NodeControlImpl {
    node_id: u64,
    store: StoreSender,
    router: Arc<Router>,
    status: Arc<Mutex<Vec<ShardStatus>>>,
    /// Read by `Status`: what the client-facing services answered.
    metrics: Arc<Metrics>,
    /// The placement format `Status` reports (`max_placement_format`).
    placement_format: u32,
}

impl NodeControlImpl {
    pub fn new(
        node_id: u64,
        store: StoreSender,
        router: Arc<Router>,
        status: Arc<Mutex<Vec<ShardStatus>>>,
        metrics: Arc<Metrics>,
        placement_format: u32,
    ) -> Self {
        debug_assert!(
            (fencelock_placement::FIRST_PLACEMENT_FORMAT..=fencelock_placement::PLACEMENT_FORMAT)
                .contains(&placement_format),
            "validated by the config: {placement_format}"
        );
        NodeControlImpl {
            node_id,
            store,
            router,
            status,
            metrics,
            placement_format,
        }
    }

    pub fn into_server(self) -> NodeControlServer<Self> {
        NodeControlServer::new(self)
    }

    /// Sends `msg` to the store and awaits its answer.
    async fn ask<T>(
        &self,
        msg: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> StoreMsg,
    ) -> Result<T, ServerError> {
        let (tx, rx) = oneshot::channel();
        self.store.try_send(msg(tx)).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => ServerError::ServerBusy,
            crossbeam_channel::TrySendError::Disconnected(_) => ServerError::ShuttingDown,
        })?;
        rx.await
            .map_err(|_| ServerError::ShuttingDown)?
            .map_err(ServerError::from)
    }
}

fn bad(field: &'static str, reason: impl Into<String>) -> ServerError {
    ServerError::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

pub fn replica_status(s: &ShardStatus) -> ReplicaStatus {
    ReplicaStatus {
        shard_id: s.shard_id,
        leader_id: s.leader_id,
        term: s.term,
        is_leader: s.is_leader,
        applied_index: s.applied_index,
        commit_index: s.commit_index,
        epoch: s.epoch,
        held_locks: s.held as u64,
        waiters: s.waiters as u64,
        voters: s.voters.clone(),
        learners: s.learners.clone(),
        owned_slots: s.owned_slots,
        pending_exports: s.pending_exports.clone(),
        snapshots_installed: s.snapshots_installed,
        hot: s
            .hot
            .iter()
            .map(|h| crate::internal::HotEntry {
                resource: h.resource.clone(),
                acquires: h.acquires,
                contended: h.contended,
                overcount: h.overcount,
            })
            .collect(),
    }
}

/// The wire answer to a placement command: the map after it applied, and
/// the ids and epoch the reply names.
pub fn meta_response(reply: &PlacementReply, map: &PlacementMap) -> ProposeMetaResponse {
    let mut out = ProposeMetaResponse {
        map: map.snapshot(),
        ..Default::default()
    };
    match *reply {
        PlacementReply::ShardCreated { shard_id, epoch }
        | PlacementReply::EpochAdvanced { shard_id, epoch } => {
            out.shard_id = shard_id;
            out.epoch = epoch;
        }
        PlacementReply::MigrationBegun {
            migration_id,
            epoch,
        } => {
            out.migration_id = migration_id;
            out.epoch = epoch;
        }
        PlacementReply::MigrationCommitted {
            migration_id,
            to_shard: shard_id,
            epoch,
        }
        | PlacementReply::MigrationRolledBack {
            migration_id,
            from_shard: shard_id,
            epoch,
        }
        | PlacementReply::SplitBegun {
            shard_id,
            migration_id,
            epoch,
        } => {
            out.migration_id = migration_id;
            out.shard_id = shard_id;
            out.epoch = epoch;
        }
        PlacementReply::MigrationAborted { migration_id } => out.migration_id = migration_id,
        PlacementReply::NodeAdded | PlacementReply::NodeRemoved | PlacementReply::Updated => {}
    }
    out
}

/// The wire answer to a resharding command.
pub fn shard_response(reply: Reply) -> ProposeShardResponse {
    match reply {
        Reply::Exported {
            data,
            resources,
            clock_ms,
        } => ProposeShardResponse {
            data,
            resources,
            export_clock_ms: clock_ms,
            ..Default::default()
        },
        Reply::Imported { resources } => ProposeShardResponse {
            resources,
            ..Default::default()
        },
        Reply::MigrationClosed {
            pending_export,
            owns_slots,
            epoch,
            later_migration,
        } => ProposeShardResponse {
            has_pending_export: pending_export.is_some(),
            pending_export_slots: pending_export
                .map(|s| s.iter().collect())
                .unwrap_or_default(),
            owns_slots,
            epoch,
            later_migration,
            ..Default::default()
        },
        _ => ProposeShardResponse::default(),
    }
}

/// The state machine's reply to `command` as carried by `response` (the
/// inverse of [`shard_response`]).
pub fn shard_reply(command: &Command, response: ProposeShardResponse) -> Reply {
    match command {
        Command::ExportSlots { .. } => Reply::Exported {
            data: response.data,
            resources: response.resources,
            clock_ms: response.export_clock_ms,
        },
        Command::ImportSlots { .. } => Reply::Imported {
            resources: response.resources,
        },
        Command::CloseMigration { .. } => Reply::MigrationClosed {
            pending_export: response.has_pending_export.then(|| {
                (response.pending_export_slots.iter().copied())
                    .filter(|s| *s < fencelock_statemachine::SLOT_COUNT)
                    .collect()
            }),
            owns_slots: response.owns_slots,
            epoch: response.epoch,
            later_migration: response.later_migration,
        },
        _ => Reply::ExportDropped { existed: true },
    }
}

#[tonic::async_trait]
impl NodeControl for NodeControlImpl {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<NodeStatus>, Status> {
        let replicas = self
            .status
            .lock()
            .map(|s| s.iter().map(replica_status).collect())
            .unwrap_or_default();
        Ok(Response::new(NodeStatus {
            node_id: self.node_id,
            replicas,
            map_version: self.router.map_version(),
            requests: Some(self.metrics.requests.totals()),
            placement_format: self.placement_format,
        }))
    }

    async fn get_map(&self, _: Request<GetMapRequest>) -> Result<Response<MapSnapshot>, Status> {
        Ok(Response::new(match self.router.map() {
            Some(map) => MapSnapshot {
                map: map.snapshot(),
                version: map.version(),
            },
            None => MapSnapshot::default(),
        }))
    }

    async fn propose_meta(
        &self,
        request: Request<ProposeMetaRequest>,
    ) -> Result<Response<ProposeMetaResponse>, Status> {
        let command = PlacementCommand::decode(&request.into_inner().command)
            .map_err(|e| bad("command", e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        self.store
            .try_send(StoreMsg::ProposeMeta { command, tx })
            .map_err(|_| ServerError::ServerBusy)?;
        let (reply, map) = rx
            .await
            .map_err(|_| ServerError::ShuttingDown)?
            .map_err(ServerError::from)?;
        Ok(Response::new(meta_response(&reply, &map)))
    }

    async fn propose_shard(
        &self,
        request: Request<ProposeShardRequest>,
    ) -> Result<Response<ProposeShardResponse>, Status> {
        let req = request.into_inner();
        let command = Command::decode(&req.command).map_err(|e| bad("command", e.to_string()))?;
        if !matches!(
            command,
            Command::ExportSlots { .. }
                | Command::ImportSlots { .. }
                | Command::DropExport { .. }
                | Command::CloseMigration { .. }
        ) {
            return Err(bad("command", "only resharding commands are accepted here").into());
        }
        let reply = self
            .ask(|tx| StoreMsg::Propose {
                shard_id: req.shard_id,
                command,
                responder: Responder::Reply(tx),
                caller: None,
            })
            .await?;
        Ok(Response::new(shard_response(reply)))
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> Result<Response<ControlAck>, Status> {
        let req = request.into_inner();
        let change = match MembershipChangeKind::try_from(req.change) {
            Ok(MembershipChangeKind::AddLearner) => MembershipChange::AddLearner,
            Ok(MembershipChangeKind::AddVoter) => MembershipChange::AddVoter,
            Ok(MembershipChangeKind::Remove) => MembershipChange::Remove,
            _ => return Err(bad("change", "unknown membership change").into()),
        };
        if req.node_id == 0 {
            return Err(bad("node_id", "must be a node id (≥ 1)").into());
        }
        self.ask(|tx| StoreMsg::ChangeMembership {
            shard_id: req.shard_id,
            change,
            node_id: req.node_id,
            tx,
        })
        .await?;
        Ok(Response::new(ControlAck {}))
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<ControlAck>, Status> {
        let req = request.into_inner();
        self.ask(|tx| StoreMsg::TransferLeader {
            shard_id: req.shard_id,
            to: req.to_node_id,
            tx,
        })
        .await?;
        Ok(Response::new(ControlAck {}))
    }

    async fn adopt_epoch(
        &self,
        request: Request<fencelock_api::internal::AdoptEpochRequest>,
    ) -> Result<Response<ControlAck>, Status> {
        let req = request.into_inner();
        // Only an epoch the map handed this shard: a stray one would mint
        // tokens another shard generation may use too.
        let handed = self
            .router
            .map()
            .and_then(|m| m.shard(req.shard_id).map(|s| s.epoch));
        if handed != Some(req.epoch) {
            // Most likely this node's map lags the one that handed it out.
            return Err(ServerError::Routing(format!(
                "this node's placement map gives shard {} epoch {:?}, not {}: retry once it catches up",
                req.shard_id, handed, req.epoch
            ))
            .into());
        }
        self.ask(|tx| StoreMsg::AdoptEpoch {
            shard_id: req.shard_id,
            epoch: req.epoch,
            tx,
        })
        .await?;
        Ok(Response::new(ControlAck {}))
    }

    async fn create_peer(
        &self,
        request: Request<CreatePeerRequest>,
    ) -> Result<Response<ControlAck>, Status> {
        let req = request.into_inner();
        let init = if req.new_shard_voters.is_empty() {
            PeerInit::Empty
        } else {
            let voters: BTreeSet<u64> = req.new_shard_voters.iter().copied().collect();
            if req.epoch == 0 {
                return Err(bad("epoch", "a new shard needs its epoch").into());
            }
            PeerInit::NewShard {
                voters,
                epoch: req.epoch,
            }
        };
        self.ask(|tx| StoreMsg::CreatePeer {
            shard_id: req.shard_id,
            init,
            tx,
        })
        .await?;
        Ok(Response::new(ControlAck {}))
    }

    async fn destroy_peer(
        &self,
        request: Request<DestroyPeerRequest>,
    ) -> Result<Response<ControlAck>, Status> {
        let req = request.into_inner();
        self.ask(|tx| StoreMsg::DestroyPeer {
            shard_id: req.shard_id,
            removed: req.removed_from_shard,
            tx,
        })
        .await?;
        Ok(Response::new(ControlAck {}))
    }
}
