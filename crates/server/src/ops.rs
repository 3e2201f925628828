//! The operator actions' gRPC binding: [`GrpcNodes`] implements the
//! controller's [`NodeApi`] over each node's `NodeControl` service (and
//! its gRPC health), so `fencelock-controller` runs them without knowing
//! about gRPC. The actions themselves live in `fencelock_controller::ops`.
//!
//! Conversions happen here, in one place: a status that carries an
//! `ErrorDetail` is the node's typed answer
//! ([`ControllerError::Detailed`]); one without broke off
//! ([`ControllerError::Unanswered`], retriable when the transport says so);
//! and [`status_of`] turns a controller error back into a gRPC status for
//! the admin API.

use std::sync::Arc;

use fencelock_api::v1::ErrorDetail;
use fencelock_controller::nodes::NodeApi;
use fencelock_controller::ControllerError;
use fencelock_placement::PlacementError;
use fencelock_statemachine::{Command, Reply};
use tonic::transport::Channel;

use crate::errors::ServerError;
use crate::internal::node_control_client::NodeControlClient;
use crate::internal::{
    ChangeMembershipRequest, CreatePeerRequest, DestroyPeerRequest, GetMapRequest, MapSnapshot,
    MembershipChangeKind, NodeStatus, ProposeMetaRequest, ProposeMetaResponse, ProposeShardRequest,
    StatusRequest, TransferLeaderRequest,
};
use crate::peers::PeerChannels;
use crate::router::Router;

pub use fencelock_controller::ops::{join_all, Moved, Resharded, LIST_STATUS_TIMEOUT};

/// The operator actions as this node runs them.
pub type Ops = fencelock_controller::ops::Ops<GrpcNodes>;

/// The operator actions of a node whose route table is `router`, calling
/// other nodes over `peers`.
pub fn new(router: Arc<Router>, peers: Arc<PeerChannels>, clock_offset_allowance_ms: u64) -> Ops {
    let nodes = Arc::new(GrpcNodes {
        router: router.clone(),
        peers,
    });
    Ops::new(router, nodes, clock_offset_allowance_ms)
}

/// A controller error as the admin API answers it.
pub fn status_of(error: ControllerError) -> tonic::Status {
    error.to_detail().to_status()
}

/// The controller's node calls over gRPC.
pub struct GrpcNodes {
    router: Arc<Router>,
    peers: Arc<PeerChannels>,
}

impl GrpcNodes {
    fn control(&self, node_id: u64) -> Result<NodeControlClient<Channel>, ControllerError> {
        let addr = self
            .router
            .node_addr(node_id)
            .ok_or(PlacementError::UnknownNode { node_id })?;
        let channel = self.peers.channel(&addr).map_err(|e| match e {
            ServerError::Internal(message) => ControllerError::Internal(message),
            other => ControllerError::Internal(other.to_string()),
        })?;
        Ok(NodeControlClient::new(channel))
    }
}

/// A failed call to `node_id`, decoded: its typed answer, or a call that
/// broke off.
fn decoded(node_id: u64, status: tonic::Status) -> ControllerError {
    match ErrorDetail::from_status(&status) {
        Some(detail) => detail.into(),
        None => ControllerError::Unanswered {
            node_id,
            message: format!("{:?}: {}", status.code(), status.message()),
            retriable: matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
        },
    }
}

impl NodeApi for GrpcNodes {
    async fn status(&self, node_id: u64) -> Result<NodeStatus, ControllerError> {
        let mut c = self.control(node_id)?;
        let resp = c.status(StatusRequest {}).await;
        resp.map(|r| r.into_inner())
            .map_err(|e| decoded(node_id, e))
    }

    async fn adopt_epoch(
        &self,
        node_id: u64,
        shard_id: u64,
        epoch: u64,
    ) -> Result<(), ControllerError> {
        let mut c = self.control(node_id)?;
        let request = fencelock_api::internal::AdoptEpochRequest { shard_id, epoch };
        let resp = c.adopt_epoch(request).await;
        resp.map(|_| ()).map_err(|e| decoded(node_id, e))
    }

    async fn get_map(&self, node_id: u64) -> Result<MapSnapshot, ControllerError> {
        let mut c = self.control(node_id)?;
        let resp = c.get_map(GetMapRequest {}).await;
        resp.map(|r| r.into_inner())
            .map_err(|e| decoded(node_id, e))
    }

    async fn propose_meta(
        &self,
        node_id: u64,
        command: Vec<u8>,
    ) -> Result<ProposeMetaResponse, ControllerError> {
        let mut c = self.control(node_id)?;
        let resp = c.propose_meta(ProposeMetaRequest { command }).await;
        resp.map(|r| r.into_inner())
            .map_err(|e| decoded(node_id, e))
    }

    async fn propose_shard(
        &self,
        node_id: u64,
        shard_id: u64,
        command: &Command,
    ) -> Result<Reply, ControllerError> {
        let mut c = self.control(node_id)?;
        let request = ProposeShardRequest {
            shard_id,
            command: command.encode(),
        };
        let resp = c.propose_shard(request).await;
        resp.map(|r| crate::control::shard_reply(command, r.into_inner()))
            .map_err(|e| decoded(node_id, e))
    }

    async fn change_membership(
        &self,
        node_id: u64,
        shard_id: u64,
        change: MembershipChangeKind,
        member: u64,
    ) -> Result<(), ControllerError> {
        let mut c = self.control(node_id)?;
        let request = ChangeMembershipRequest {
            shard_id,
            change: change as i32,
            node_id: member,
        };
        let resp = c.change_membership(request).await;
        resp.map(|_| ()).map_err(|e| decoded(node_id, e))
    }

    async fn transfer_leader(
        &self,
        node_id: u64,
        shard_id: u64,
        to: u64,
    ) -> Result<(), ControllerError> {
        let mut c = self.control(node_id)?;
        let request = TransferLeaderRequest {
            shard_id,
            to_node_id: to,
        };
        let resp = c.transfer_leader(request).await;
        resp.map(|_| ()).map_err(|e| decoded(node_id, e))
    }

    async fn create_peer(
        &self,
        node_id: u64,
        request: CreatePeerRequest,
    ) -> Result<(), ControllerError> {
        let mut c = self.control(node_id)?;
        let resp = c.create_peer(request).await;
        resp.map(|_| ()).map_err(|e| decoded(node_id, e))
    }

    async fn destroy_peer(
        &self,
        node_id: u64,
        request: DestroyPeerRequest,
    ) -> Result<(), ControllerError> {
        let mut c = self.control(node_id)?;
        let resp = c.destroy_peer(request).await;
        resp.map(|_| ()).map_err(|e| decoded(node_id, e))
    }

    async fn is_serving(&self, node_id: u64) -> bool {
        use tonic_health::pb::health_check_response::ServingStatus as Wire;
        use tonic_health::pb::health_client::HealthClient;
        let Some(addr) = self.router.node_addr(node_id) else {
            return false;
        };
        let Ok(endpoint) = self.peers.tls().endpoint(&addr) else {
            return false;
        };
        let Ok(channel) = endpoint.connect().await else {
            return false;
        };
        let request = tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        };
        match HealthClient::new(channel).check(request).await {
            Ok(reply) => reply.into_inner().status() == Wire::Serving,
            Err(_) => false,
        }
    }
}
