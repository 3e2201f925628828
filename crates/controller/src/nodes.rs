//! The controller's one I/O seam: the node-local steps it asks of each node
//! (the internal `NodeControl` service, plus a health check). The server
//! implements it over gRPC (`fencelock_server::ops::GrpcNodes`), and the
//! in-process and real-process cluster tests drive the actions through it.
//!
//! Every method answers with a decoded [`ControllerError`]: a node's typed
//! refusal is [`ControllerError::Detailed`], a call that broke off without
//! an answer is [`ControllerError::Unanswered`] (never guessed to be a
//! refusal), and a node id the route table does not know is a placement
//! error ([`fencelock_placement::PlacementError::UnknownNode`]).

use std::future::Future;

use fencelock_api::internal::{
    CreatePeerRequest, DestroyPeerRequest, MapSnapshot, MembershipChangeKind, NodeStatus,
    ProposeMetaResponse,
};
use fencelock_statemachine::{Command, Reply};

use crate::error::Result;

/// The node-local calls the operator actions and migrations are made of.
/// Each call addresses one node by id; none retries (the caller decides).
pub trait NodeApi: Send + Sync + 'static {
    /// The node's published status: its replicas, leaders, applied indexes.
    fn status(&self, node_id: u64) -> impl Future<Output = Result<NodeStatus>> + Send;

    /// The newest placement map the node holds.
    fn get_map(&self, node_id: u64) -> impl Future<Output = Result<MapSnapshot>> + Send;

    /// Proposes an encoded placement command at the node (it must lead the
    /// meta shard).
    fn propose_meta(
        &self,
        node_id: u64,
        command: Vec<u8>,
    ) -> impl Future<Output = Result<ProposeMetaResponse>> + Send;

    /// Proposes a shard command at the node (it must lead `shard_id`);
    /// answers with the command's reply.
    fn propose_shard(
        &self,
        node_id: u64,
        shard_id: u64,
        command: &Command,
    ) -> impl Future<Output = Result<Reply>> + Send;

    /// Changes the membership of `shard_id` at the node (its leader).
    fn change_membership(
        &self,
        node_id: u64,
        shard_id: u64,
        change: MembershipChangeKind,
        member: u64,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Has the node (the leader of `shard_id`) start `epoch`, one the map
    /// handed the shard (`AdvanceEpoch`), at a new entry; answers once the
    /// shard mints at it.
    fn adopt_epoch(
        &self,
        node_id: u64,
        shard_id: u64,
        epoch: u64,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Asks the node (the leader of `shard_id`) to hand leadership to `to`.
    fn transfer_leader(
        &self,
        node_id: u64,
        shard_id: u64,
        to: u64,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Starts a replica on the node.
    fn create_peer(
        &self,
        node_id: u64,
        request: CreatePeerRequest,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Deletes a replica on the node.
    fn destroy_peer(
        &self,
        node_id: u64,
        request: DestroyPeerRequest,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Whether the node reports itself serving (not starting, not
    /// draining); `false` when it does not answer.
    fn is_serving(&self, node_id: u64) -> impl Future<Output = bool> + Send;
}
