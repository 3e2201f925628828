//! What the store loop is sent ([`StoreMsg`]) and who waits for each
//! command's outcome ([`Responder`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use crossbeam_channel::Sender;
use fencelock_placement::{PlacementCommand, PlacementMap, PlacementReply};
use fencelock_statemachine::{AcquireReply, Command, LockView, Reply, ResourceName};
use tokio::sync::oneshot;

use crate::{Envelope, StoreError};

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
    /// Watch `resource` on this node's replica of `shard_id` (any replica:
    /// every one records the same changes), from the state now or after
    /// `after` ([`crate::watch`]).
    Watch {
        shard_id: u64,
        resource: ResourceName,
        after: Option<crate::watch::Revision>,
        tx: oneshot::Sender<Result<crate::watch::WatchStream, StoreError>>,
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

/// The store's side of the channel pair: requests come in here.
pub type StoreSender = Sender<StoreMsg>;
