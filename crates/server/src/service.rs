//! The public `LockService`: validates requests, routes each to the shard
//! that serves its resource, and turns outcomes into responses and typed
//! errors.
//!
//! Routing: the resource's slot gives the shard (by this node's newest
//! placement map). If this node leads that shard, the store serves it here.
//! Otherwise the request is **forwarded** to the node that does — the
//! leader named by this node's replica, else the shard's replicas in the map
//! — at most [`MAX_FORWARD_HOPS`] times, so a client may send any request to
//! any node. A forwarded request carries [`FORWARDED_HEADER`] and is never
//! forwarded again; a client that routes by itself sets the same header to
//! get NOT_LEADER / EPOCH_NOT_MATCH hints instead. Forwarding is safe to
//! repeat: nothing was proposed where the request was refused, and acquires
//! are deduplicated by `requestId` wherever they land.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::lock_service_server::LockService;
use fencelock_api::v1::ErrorDetail;
use fencelock_api::v1::{
    renew_result, AcquireRequest, AcquireResponse, GetRequest, GetResponse, Holding, LeaseState,
    ProclaimRequest, ProclaimResponse, ReleaseRequest, ReleaseResponse, RenewBatchRequest,
    RenewBatchResponse, RenewRequest, RenewResponse, RenewResult, WatchRequest,
};
use fencelock_statemachine::limits::MAX_RENEW_BATCH;
use fencelock_statemachine::{
    AcquireMode, AcquireStatus, Command, HolderValue, LeaseEnd, LeaseId, LockError, RenewItem,
    Renewed, Reply, RequestId, ResourceName,
};
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::disk_space::DiskSpace;
use crate::errors::ServerError;
use crate::lifecycle::Lifecycle;
use crate::metrics::{Metrics, Op, Outcome};
use crate::peers::PeerChannels;
use crate::router::Router;
use crate::security::rate::TenantRateLimiter;
use crate::security::{identity_of, relayed_of, Identity};
use crate::store::{Caller, Responder, ShardStatus, StoreMsg, StoreSender};
use crate::validate::{lease_id, resource};
use fencelock_api::headers::IDENTITY_HEADER;
use fencelock_placement::{MODES_FORMAT, VALUES_FORMAT};

pub use fencelock_api::headers::{CALLER_HEADER, FORWARDED_HEADER};
/// Nodes one request may be forwarded through: the node the map names,
/// then the leader that node names.
pub const MAX_FORWARD_HOPS: usize = 2;
/// Longest caller value taken from [`CALLER_HEADER`]: an address, not a
/// story (the header is client-settable).
pub const MAX_CALLER_LEN: usize = 64;

tokio::task_local! {
    /// Who the request being served came from (see [`CALLER_HEADER`]).
    static CALLER: Caller;
    /// The identity of the request being served (see [`crate::security`])
    /// and whether another node forwarded it.
    static IDENTITY: (Identity, bool);
}

/// The identity of the request this task serves.
fn current_identity() -> Identity {
    IDENTITY
        .try_with(|(i, _)| i.clone())
        .unwrap_or(Identity::Anonymous)
}

/// Whether the request this task serves was forwarded by another node.
fn current_relayed() -> bool {
    IDENTITY.try_with(|(_, r)| *r).unwrap_or(false)
}

/// What a caller wants to do with a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Acquire (and wait), renew, release.
    Lock,
    /// Get.
    Read,
}

/// The caller of the request this task serves.
fn current_caller() -> Caller {
    CALLER.try_with(|c| c.clone()).unwrap_or(None)
}

/// The request's caller: the client's address, as the forwarding node
/// relayed it or as seen here. (Whether it was forwarded is the gate's
/// verdict, `security::relayed_of`, not this client-settable header.)
fn caller_of<T>(request: &Request<T>) -> Caller {
    let relayed = request
        .metadata()
        .get(CALLER_HEADER)
        .and_then(|v| v.to_str().ok());
    if let Some(addr) = relayed {
        let clean: String = addr
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(MAX_CALLER_LEN)
            .collect();
        return Some(Arc::from(clean));
    }
    request.remote_addr().map(|a| Arc::from(a.to_string()))
}

pub struct LockServiceImpl {
    node_id: u64,
    store: StoreSender,
    router: Arc<Router>,
    peers: Arc<PeerChannels>,
    default_lease_ttl_ms: u64,
    metrics: Arc<Metrics>,
    life: Arc<Lifecycle>,
    /// Per-tenant request rate on this node (`edge.tenant_requests_per_sec`).
    rate: Arc<TenantRateLimiter>,
    /// The data directory's free space (`edge.min_free_disk_bytes`).
    disk: Arc<DiskSpace>,
    /// What the store publishes per shard: here, how far each led shard's
    /// lease clock is behind the wall clock, to show lease times as wall
    /// times.
    shard_status: Arc<std::sync::Mutex<Vec<ShardStatus>>>,
}

impl LockServiceImpl {
    pub fn new(
        node_id: u64,
        store: StoreSender,
        router: Arc<Router>,
        peers: Arc<PeerChannels>,
        default_lease_ttl_ms: u64,
        metrics: Arc<Metrics>,
        life: Arc<Lifecycle>,
    ) -> Self {
        LockServiceImpl {
            node_id,
            store,
            router,
            peers,
            default_lease_ttl_ms,
            metrics,
            life,
            rate: Arc::new(TenantRateLimiter::new(0, 1)),
            disk: DiskSpace::new(0),
            shard_status: Arc::default(),
        }
    }

    /// Shows lease times as wall-clock times from the store's published
    /// status (without it they are left on the lease clock).
    pub fn with_shard_status(mut self, status: Arc<std::sync::Mutex<Vec<ShardStatus>>>) -> Self {
        self.shard_status = status;
        self
    }

    /// `lease_ms` (a time on `shard_id`'s lease clock, 0 = none) as this
    /// node's wall-clock time: the lease clock never follows the wall
    /// clock, and after leader changes it runs behind it
    /// (docs/safety.md, "Time and leases"). Display only: nothing decides
    /// by it.
    fn wall_time(&self, shard_id: u64, lease_ms: u64) -> u64 {
        if lease_ms == 0 {
            return 0;
        }
        let behind = self.shard_status.lock().ok().and_then(|s| {
            s.iter()
                .find(|st| st.shard_id == shard_id && st.is_leader)
                .map(|st| st.lease_clock_behind_wall_ms)
        });
        lease_ms.saturating_add_signed(behind.unwrap_or(0))
    }

    fn renewed(&self, shard_id: u64, r: Renewed) -> RenewResponse {
        RenewResponse {
            expires_at_ms: self.wall_time(shard_id, r.expires_at_ms),
            lease_ttl_ms: r.lease_ttl_ms,
        }
    }

    /// Refuses new acquires on this node's shards while `disk` is low.
    pub fn with_disk_space(mut self, disk: Arc<DiskSpace>) -> Self {
        self.disk = disk;
        self
    }

    /// Limits each tenant's request rate on this node.
    pub fn with_rate_limit(mut self, rate: Arc<TenantRateLimiter>) -> Self {
        self.rate = rate;
        self
    }

    /// Refuses a caller that may not touch `resource`'s tenant, before
    /// anything about the resource is looked up (the refusal reveals
    /// nothing), then counts the request against the tenant's rate where
    /// the client called.
    fn authorize(&self, resource: &ResourceName, access: Access) -> Result<(), ServerError> {
        let identity = current_identity();
        let tenant = resource.tenant();
        let allowed = match access {
            Access::Lock => identity.may_lock(tenant),
            Access::Read => identity.may_read(tenant),
        };
        if !allowed {
            return Err(ServerError::PermissionDenied(
                "the caller's identity may not use this tenant's resources",
            ));
        }
        self.admit(tenant)
    }

    /// Takes one request from `tenant`'s rate budget on this node (not
    /// again for a request another node forwarded: it was counted there;
    /// "forwarded" as the security gate established it, not as the
    /// client-settable headers say).
    fn admit(&self, tenant: &str) -> Result<(), ServerError> {
        if current_relayed() {
            return Ok(());
        }
        self.rate
            .admit(tenant, crate::store::wall_ms())
            .map_err(|retry_after_ms| ServerError::RateLimited {
                limit_per_sec: self.rate.rate_per_sec(),
                retry_after_ms,
            })
    }

    /// Serves one request: counted in flight (for a graceful drain), timed
    /// and classified where the client called (not again where another
    /// node forwarded it), with its caller known to the store (audit).
    async fn measured<T>(
        &self,
        op: Op,
        caller: Caller,
        identity: (Identity, bool),
        call: impl Future<Output = Result<Response<T>, Status>>,
    ) -> Result<Response<T>, Status> {
        let _in_flight = self.life.enter();
        // With TLS the audit trail names who, not just where from.
        let caller = match &identity.0 {
            Identity::Anonymous => caller,
            known => Some(Arc::from(known.uri())),
        };
        // Forwarded (counted where the client called) by the gate's
        // verdict, not by a header a client could set itself.
        let relayed = identity.1;
        let call = CALLER.scope(caller, IDENTITY.scope(identity, call));
        if relayed {
            return call.await;
        }
        let timer = self.metrics.requests.start(op);
        let result = call.await;
        timer.finish_result(&result);
        result
    }

    /// What a draining node answers instead of serving: the shard's leader
    /// when this node knows it (clients and forwarding nodes go there
    /// directly), else SHUTTING_DOWN. Both are retriable.
    fn draining_refusal(&self, shard_id: u64) -> ServerError {
        let leader = self
            .router
            .leader_of(shard_id)
            .filter(|l| *l != self.node_id)
            .and_then(|l| self.router.leader_info(l));
        match leader {
            Some(leader) => ServerError::NotLeader {
                shard_id,
                leader: Some(leader),
            },
            None => ServerError::ShuttingDown,
        }
    }

    fn send(&self, msg: StoreMsg) -> Result<(), ServerError> {
        self.store.try_send(msg).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => ServerError::ServerBusy,
            crossbeam_channel::TrySendError::Disconnected(_) => ServerError::ShuttingDown,
        })
    }

    async fn propose(&self, shard_id: u64, command: Command) -> Result<Reply, ServerError> {
        let (tx, rx) = oneshot::channel();
        self.send(StoreMsg::Propose {
            shard_id,
            command,
            responder: Responder::Reply(tx),
            caller: current_caller(),
        })?;
        rx.await
            .map_err(|_| ServerError::ShuttingDown)?
            .map_err(ServerError::from)
    }

    /// Where to send a request this node refused with `err`, if anywhere.
    fn forward_target(&self, err: &ServerError, shard_id: u64) -> Option<String> {
        match err {
            ServerError::NotLeader {
                leader: Some(l), ..
            } if l.node_id != self.node_id => Some(l.addr.clone()),
            ServerError::ShardNotHere { .. } => self
                .router
                .candidates(shard_id)
                .into_iter()
                .filter(|n| *n != self.node_id)
                .find_map(|n| self.router.node_addr(n)),
            _ => None,
        }
    }

    /// Serves a request for `resource` here, or forwards it. `local` runs it
    /// on this node's replica of a shard; `remote` sends it to another node.
    async fn route<T, L, LF, R, RF>(
        &self,
        forwarding: bool,
        resource: &ResourceName,
        local: L,
        remote: R,
    ) -> Result<Response<T>, Status>
    where
        L: Fn(u64) -> LF,
        LF: Future<Output = Result<T, ServerError>>,
        R: Fn(LockServiceClient<Channel>) -> RF,
        RF: Future<Output = Result<Response<T>, Status>>,
    {
        let mut shard_id = self.router.shard_of(resource).map_err(ServerError::from)?;
        if self.life.is_refusing() {
            return Err(self.refusal(self.draining_refusal(shard_id), shard_id));
        }
        let err = loop {
            match local(shard_id).await {
                Ok(reply) => return Ok(Response::new(reply)),
                // This node's map was stale and has caught up since: route
                // again by the newer map.
                Err(ServerError::Lock(LockError::WrongShard { .. }))
                    if self.router.shard_of(resource).ok() != Some(shard_id) =>
                {
                    shard_id = self.router.shard_of(resource).map_err(ServerError::from)?;
                }
                Err(e) => break e,
            }
        };
        match self.forward_target(&err, shard_id) {
            Some(addr) if forwarding => self.forward(shard_id, addr, remote).await,
            _ => Err(self.refusal(stale_route(err), shard_id)),
        }
    }

    /// The status for a refusal, with the shard and this node's map version
    /// filled in so a routing client knows how fresh a map it needs.
    fn refusal(&self, err: ServerError, shard_id: u64) -> Status {
        let mut detail = with_shard(err, shard_id);
        if matches!(
            detail.reason(),
            fencelock_api::v1::Reason::EpochNotMatch | fencelock_api::v1::Reason::ShardNotFound
        ) {
            detail.map_version = self.router.map_version();
        }
        detail.to_status()
    }

    /// Sends a request on to `addr`, following one more NOT_LEADER hint.
    /// A refusal from the other node comes back as it is; a call that broke
    /// off without an answer (the node is down, the connection dropped) is
    /// OUTCOME_UNKNOWN for `shard_id`, with an `ErrorDetail` like every
    /// other failure (errors.proto): the request may have reached the
    /// leader, so only a retry with the same request id is safe.
    async fn forward<T, R, RF>(
        &self,
        shard_id: u64,
        mut addr: String,
        remote: R,
    ) -> Result<Response<T>, Status>
    where
        R: Fn(LockServiceClient<Channel>) -> RF,
        RF: Future<Output = Result<Response<T>, Status>>,
    {
        let mut hops = 0;
        self.metrics.requests.forwarded();
        loop {
            hops += 1;
            let channel = self.peers.channel(&addr)?;
            match remote(LockServiceClient::new(channel)).await {
                Err(status) if hops < MAX_FORWARD_HOPS => {
                    let next = ErrorDetail::from_status(&status)
                        .and_then(|d| d.leader)
                        .map(|l| l.address)
                        .filter(|a| !a.is_empty() && *a != addr);
                    match next {
                        Some(next) => addr = next,
                        None => return Err(unanswered(status, shard_id, &addr)),
                    }
                }
                other => return other.map_err(|status| unanswered(status, shard_id, &addr)),
            }
        }
    }

    async fn acquire_local(
        &self,
        shard_id: u64,
        wanted: Wanted,
    ) -> Result<AcquireResponse, ServerError> {
        let Wanted {
            resource,
            request_id,
            lease_ttl_ms,
            wait_timeout_ms,
            value,
            mode,
        } = wanted;
        // This node proposes (it leads the shard, or its store answers
        // NOT_LEADER): its own disk takes the new state.
        self.disk.check_acquire()?;
        if !value.is_empty() {
            self.check_cluster_format(VALUES_FORMAT, "holder values")?;
        }
        if mode != AcquireMode::Exclusive {
            self.check_cluster_format(MODES_FORMAT, "shared locks and semaphores")?;
        }
        let (tx, rx) = oneshot::channel();
        self.send(StoreMsg::Propose {
            shard_id,
            command: Command::Acquire {
                resource: resource.clone(),
                owner: current_identity().owner(),
                request_id,
                lease_id: random_lease_id(),
                lease_ttl_ms,
                wait_timeout_ms,
                value,
                mode,
            },
            responder: Responder::Acquire { resource, tx },
            caller: current_caller(),
        })?;
        // If this future is dropped (client went away), the store sees the
        // closed channel and removes the waiter through Raft.
        let reply = rx
            .await
            .map_err(|_| ServerError::ShuttingDown)?
            .map_err(|e| match ServerError::from(e) {
                ServerError::Lock(LockError::LockHeld {
                    holder_expires_at_ms,
                    queue_len,
                }) => ServerError::Lock(LockError::LockHeld {
                    holder_expires_at_ms: self.wall_time(shard_id, holder_expires_at_ms),
                    queue_len,
                }),
                other => other,
            })?;
        let (token, expires_at_ms, ttl, state) = match reply.status {
            AcquireStatus::Held {
                token,
                expires_at_ms,
                lease_ttl_ms,
            } => (token, expires_at_ms, lease_ttl_ms, LeaseState::Held),
            // An ended lease gives its caller no time to work.
            AcquireStatus::Ended { token, ended } => (
                token,
                0,
                0,
                match ended {
                    LeaseEnd::Released => LeaseState::Released,
                    LeaseEnd::Expired => LeaseState::Expired,
                    LeaseEnd::Cancelled => LeaseState::Cancelled,
                },
            ),
            // The store answers waits that ended as errors (finish_acquire).
            AcquireStatus::Queued { .. } | AcquireStatus::WaitEnded(_) => {
                return Err(ServerError::Internal(
                    "acquire answered before it ended".into(),
                ))
            }
        };
        Ok(AcquireResponse {
            lease_id: reply.lease_id.0.to_vec(),
            fencing_token: token.as_i64(),
            expires_at_ms: self.wall_time(shard_id, expires_at_ms),
            lease_ttl_ms: ttl,
            deduplicated: reply.deduplicated,
            lease_state: state as i32,
            shard_id,
            epoch: token.epoch(),
        })
    }

    async fn get_local(
        &self,
        shard_id: u64,
        resource: ResourceName,
    ) -> Result<GetResponse, ServerError> {
        let (tx, rx) = oneshot::channel();
        self.send(StoreMsg::Read {
            shard_id,
            resource,
            tx,
        })?;
        let read = rx
            .await
            .map_err(|_| ServerError::ShuttingDown)?
            .map_err(ServerError::from)?;
        Ok(match read.view {
            Some(v) => GetResponse {
                // Held until a committed command retires the lease. Not
                // `expires_at_ms > this node's clock`: a leader whose clock
                // runs ahead would call a lease ended that the next leader
                // still extends (LeaderChanged), and a later Get would show
                // it held again — found by the deterministic simulation
                // (docs/testing.md).
                held: true,
                fencing_token: v.token.as_i64(),
                expires_at_ms: self.wall_time(shard_id, v.expires_at_ms),
                queue_length: v.queue_len,
                // The newest grant's (holders rise in token order).
                last_token: v.last_token.as_i64(),
                shard_id,
                epoch: read.epoch,
                value: v.value.as_bytes().to_vec(),
                mode: wire_mode(v.mode) as i32,
                permits: v.mode.permits(),
                holders: (v.holders.iter())
                    .map(|h| Holding {
                        fencing_token: h.token.as_i64(),
                        expires_at_ms: self.wall_time(shard_id, h.expires_at_ms),
                        value: h.value.as_bytes().to_vec(),
                        mode: wire_mode(h.mode) as i32,
                    })
                    .collect(),
            },
            None => GetResponse {
                shard_id,
                epoch: read.epoch,
                ..Default::default()
            },
        })
    }

    /// Renews one shard's share of a batch here, or forwards that share.
    async fn renew_group(
        &self,
        forwarding: bool,
        shard_id: u64,
        items: Vec<RenewItem>,
    ) -> Vec<renew_result::Outcome> {
        use renew_result::Outcome;
        let n = items.len();
        let wire_items: Vec<fencelock_api::v1::RenewRequest> = items
            .iter()
            .map(|i| fencelock_api::v1::RenewRequest {
                resource: i.resource.as_str().to_owned(),
                lease_id: i.lease_id.0.to_vec(),
                lease_ttl_ms: i.lease_ttl_ms,
            })
            .collect();
        let proposed = if self.life.is_refusing() {
            Err(self.draining_refusal(shard_id))
        } else {
            let owner = current_identity().owner();
            self.propose(shard_id, Command::RenewBatch { owner, items })
                .await
        };
        let err = match proposed {
            Ok(Reply::RenewedBatch(each)) => {
                return each
                    .into_iter()
                    .map(|r| match r {
                        Ok(ok) => Outcome::Renewed(self.renewed(shard_id, ok)),
                        Err(e) => Outcome::Error(with_shard(ServerError::Lock(e), shard_id)),
                    })
                    .collect()
            }
            Ok(other) => ServerError::Internal(format!("unexpected reply {other:?}")),
            Err(e) => e,
        };
        let target = self.forward_target(&err, shard_id).filter(|_| forwarding);
        let Some(addr) = target else {
            return vec![Outcome::Error(with_shard(err, shard_id)); n];
        };
        let result = self
            .forward(shard_id, addr, |mut client| {
                let items = wire_items.clone();
                async move {
                    client
                        .renew_batch(forwarded(RenewBatchRequest { items }))
                        .await
                }
            })
            .await;
        match result {
            Ok(resp) => {
                let results = resp.into_inner().results;
                if results.len() != n {
                    let e = ServerError::Internal("forwarded batch answered short".into());
                    return vec![Outcome::Error(e.to_detail()); n];
                }
                results
                    .into_iter()
                    .map(|r| {
                        r.outcome.unwrap_or_else(|| {
                            Outcome::Error(ServerError::Internal("empty result".into()).to_detail())
                        })
                    })
                    .collect()
            }
            Err(status) => {
                let detail = ErrorDetail::from_status(&status).unwrap_or_else(|| {
                    ServerError::Internal(status.message().to_owned()).to_detail()
                });
                vec![Outcome::Error(detail); n]
            }
        }
    }
}

fn with_shard(e: ServerError, shard_id: u64) -> ErrorDetail {
    let detail = e.to_detail();
    if detail.shard_id == 0 {
        ErrorDetail { shard_id, ..detail }
    } else {
        detail
    }
}

/// `status` from a forwarded call, with an `ErrorDetail` if it had none.
fn unanswered(status: Status, shard_id: u64, addr: &str) -> Status {
    ErrorDetail::or_outcome_unknown(
        status,
        shard_id,
        &format!("forwarding to the leader of shard {shard_id} at {addr} failed"),
    )
}

/// Marks a request as forwarded: the receiver serves it or refuses it.
fn forwarded<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let caller = current_caller();
    let value = caller.as_deref().unwrap_or("-").parse();
    if let Ok(value) = value {
        request.metadata_mut().insert(CALLER_HEADER, value);
    }
    // The receiving node trusts this only because our certificate is a
    // node's (crate::security::Gate).
    let identity = current_identity();
    if identity != Identity::Anonymous {
        if let Ok(value) = identity.uri().parse() {
            request.metadata_mut().insert(IDENTITY_HEADER, value);
        }
    }
    request
}

fn may_forward<T>(request: &Request<T>) -> bool {
    !request.metadata().contains_key(FORWARDED_HEADER)
}

/// An acquire as the edge checked it, before the shard's leader makes it a
/// command (with a fresh lease id and the caller's owner).
struct Wanted {
    resource: ResourceName,
    request_id: RequestId,
    lease_ttl_ms: u64,
    wait_timeout_ms: u64,
    value: HolderValue,
    mode: AcquireMode,
}

/// The acquire's mode from its wire fields, refused at the edge when it
/// cannot be granted (no log entry for it): an unknown mode, a permit
/// count out of range, or one given with a lock mode.
fn acquire_mode(req: &AcquireRequest) -> Result<AcquireMode, ServerError> {
    use fencelock_api::v1::AcquireMode as Wire;
    let mode = match Wire::try_from(req.mode) {
        Ok(Wire::Exclusive) => AcquireMode::Exclusive,
        Ok(Wire::Shared) => AcquireMode::Shared,
        Ok(Wire::Semaphore) => AcquireMode::Semaphore {
            permits: req.permits,
        },
        Err(_) => {
            return Err(ServerError::InvalidArgument {
                field: "mode",
                reason: format!("unknown acquire mode {}", req.mode),
            })
        }
    };
    if req.permits != 0 && !matches!(mode, AcquireMode::Semaphore { .. }) {
        return Err(ServerError::Lock(LockError::InvalidPermits {
            permits: req.permits,
            max: fencelock_statemachine::limits::MAX_HOLDERS_PER_RESOURCE,
        }));
    }
    mode.validate().map_err(ServerError::Lock)?;
    Ok(mode)
}

pub(crate) fn wire_mode(mode: AcquireMode) -> fencelock_api::v1::AcquireMode {
    use fencelock_api::v1::AcquireMode as Wire;
    match mode {
        AcquireMode::Exclusive => Wire::Exclusive,
        AcquireMode::Shared => Wire::Shared,
        AcquireMode::Semaphore { .. } => Wire::Semaphore,
    }
}

fn random_lease_id() -> LeaseId {
    LeaseId(rand::random())
}

impl LockServiceImpl {
    async fn serve_acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let forwarding = may_forward(&request);
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        resource
            .check_new()
            .map_err(|e| ServerError::Lock(LockError::InvalidResource(e)))?;
        self.authorize(&resource, Access::Lock)?;
        let request_id = RequestId::new(req.request_id.clone()).map_err(ServerError::Lock)?;
        let value = HolderValue::new(req.value.clone()).map_err(ServerError::Lock)?;
        let mode = acquire_mode(&req)?;
        let lease_ttl_ms = if req.lease_ttl_ms == 0 {
            self.default_lease_ttl_ms
        } else {
            req.lease_ttl_ms
        };
        self.route(
            forwarding,
            &resource,
            |shard_id| {
                let wanted = Wanted {
                    resource: resource.clone(),
                    request_id: request_id.clone(),
                    lease_ttl_ms,
                    wait_timeout_ms: req.wait_timeout_ms,
                    value: value.clone(),
                    mode,
                };
                self.acquire_local(shard_id, wanted)
            },
            |mut client| {
                let req = req.clone();
                async move { client.acquire(forwarded(req)).await }
            },
        )
        .await
    }

    async fn serve_renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let forwarding = may_forward(&request);
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        self.authorize(&resource, Access::Lock)?;
        let lease_id = lease_id(&req.lease_id)?;
        let owner = current_identity().owner();
        self.route(
            forwarding,
            &resource,
            |shard_id| {
                let command = Command::Renew {
                    resource: resource.clone(),
                    owner: owner.clone(),
                    lease_id,
                    lease_ttl_ms: req.lease_ttl_ms,
                };
                async move {
                    match self.propose(shard_id, command).await? {
                        Reply::Renewed(r) => Ok(self.renewed(shard_id, r)),
                        other => Err(ServerError::Internal(format!("unexpected reply {other:?}"))),
                    }
                }
            },
            |mut client| {
                let req = req.clone();
                async move { client.renew(forwarded(req)).await }
            },
        )
        .await
    }

    async fn serve_renew_batch(
        &self,
        request: Request<RenewBatchRequest>,
    ) -> Result<Response<RenewBatchResponse>, Status> {
        let forwarding = may_forward(&request);
        let items = request.into_inner().items;
        if items.len() > MAX_RENEW_BATCH {
            return Err(ServerError::Lock(LockError::BatchTooLarge {
                len: items.len(),
                max: MAX_RENEW_BATCH,
            })
            .into());
        }
        // One request against the rate, whatever its size (the batch size
        // is bounded above).
        let identity = current_identity();
        let batch_tenant = identity.tenant().map(str::to_owned).or_else(|| {
            let first = items.first().and_then(|i| resource(&i.resource).ok());
            first.map(|r| r.tenant().to_owned())
        });
        if let Some(tenant) = batch_tenant {
            self.admit(&tenant)?;
        }
        // Invalid items fail alone; valid ones go to their shard as one
        // RenewBatch command per shard. An item of another tenant fails
        // with PERMISSION_DENIED, before its shard is even looked up.
        let mut results: Vec<Option<renew_result::Outcome>> =
            (0..items.len()).map(|_| None).collect();
        let mut per_shard: BTreeMap<u64, Vec<(usize, RenewItem)>> = BTreeMap::new();
        for (i, item) in items.into_iter().enumerate() {
            let parsed = resource(&item.resource)
                .and_then(|r| {
                    if identity.may_lock(r.tenant()) {
                        Ok(r)
                    } else {
                        Err(ServerError::PermissionDenied(
                            "the caller's identity may not use this tenant's resources",
                        ))
                    }
                })
                .and_then(|r| Ok((self.router.shard_of(&r)?, r, lease_id(&item.lease_id)?)));
            match parsed {
                Ok((shard_id, resource, lease_id)) => {
                    per_shard.entry(shard_id).or_default().push((
                        i,
                        RenewItem {
                            resource,
                            lease_id,
                            lease_ttl_ms: item.lease_ttl_ms,
                        },
                    ))
                }
                Err(e) => results[i] = Some(renew_result::Outcome::Error(e.to_detail())),
            }
        }
        // The shards work in parallel.
        let groups = per_shard.into_iter().map(|(shard_id, batch)| {
            let (positions, items): (Vec<usize>, Vec<RenewItem>) = batch.into_iter().unzip();
            async move {
                let outcomes = self.renew_group(forwarding, shard_id, items).await;
                (positions, outcomes)
            }
        });
        for (positions, outcomes) in crate::ops::join_all(groups).await {
            for (pos, r) in positions.into_iter().zip(outcomes) {
                results[pos] = Some(r);
            }
        }
        let results = results
            .into_iter()
            .map(|r| RenewResult {
                outcome: Some(r.expect("every item answered")),
            })
            .collect();
        Ok(Response::new(RenewBatchResponse { results }))
    }

    async fn serve_release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let forwarding = may_forward(&request);
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        self.authorize(&resource, Access::Lock)?;
        let lease_id = lease_id(&req.lease_id)?;
        let owner = current_identity().owner();
        self.route(
            forwarding,
            &resource,
            |shard_id| {
                let command = Command::Release {
                    resource: resource.clone(),
                    owner: owner.clone(),
                    lease_id,
                };
                async move {
                    match self.propose(shard_id, command).await? {
                        Reply::Released { released } => Ok(ReleaseResponse { released }),
                        other => Err(ServerError::Internal(format!("unexpected reply {other:?}"))),
                    }
                }
            },
            |mut client| {
                let req = req.clone();
                async move { client.release(forwarded(req)).await }
            },
        )
        .await
    }

    async fn serve_proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let forwarding = may_forward(&request);
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        self.authorize(&resource, Access::Lock)?;
        let lease_id = lease_id(&req.lease_id)?;
        let value = HolderValue::new(req.value.clone()).map_err(ServerError::Lock)?;
        let owner = current_identity().owner();
        self.route(
            forwarding,
            &resource,
            |shard_id| {
                let command = Command::Proclaim {
                    resource: resource.clone(),
                    owner: owner.clone(),
                    lease_id,
                    value: value.clone(),
                };
                async move {
                    // Checked where it is proposed: this node's map.
                    self.check_cluster_format(VALUES_FORMAT, "holder values")?;
                    match self.propose(shard_id, command).await? {
                        Reply::Proclaimed { token } => Ok(ProclaimResponse {
                            fencing_token: token.as_i64(),
                        }),
                        other => Err(ServerError::Internal(format!("unexpected reply {other:?}"))),
                    }
                }
            },
            |mut client| {
                let req = req.clone();
                async move { client.proclaim(forwarded(req)).await }
            },
        )
        .await
    }

    async fn serve_watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<crate::watch::WatchEvents>, Status> {
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        self.authorize(&resource, Access::Read)?;
        let shard_id = self.router.shard_of(&resource).map_err(ServerError::from)?;
        let after = req.after.map(crate::watch::revision_from_wire);
        let (tx, rx) = oneshot::channel();
        self.send(StoreMsg::Watch {
            shard_id,
            resource,
            after,
            tx,
        })?;
        match rx.await.map_err(|_| ServerError::ShuttingDown)? {
            Ok(stream) => Ok(Response::new(crate::watch::WatchEvents::new(
                stream, shard_id,
            ))),
            // Any replica serves a watch: name one that has the shard.
            Err(crate::store::StoreError::ShardNotHere { .. }) => {
                let leader = self
                    .router
                    .leader_of(shard_id)
                    .and_then(|node_id| self.router.leader_info(node_id));
                Err(self.refusal(ServerError::NotLeader { shard_id, leader }, shard_id))
            }
            Err(e) => Err(self.refusal(e.into(), shard_id)),
        }
    }

    /// Refuses a feature of placement format `needs` until the cluster
    /// format (this node's map) reaches it: a replica still on an older
    /// build would stop at the entry (docs/operations.md, "Formats"). A map
    /// not yet known counts as the first format.
    fn check_cluster_format(&self, needs: u32, feature: &'static str) -> Result<(), ServerError> {
        let current = self
            .router
            .map()
            .map_or(fencelock_placement::FIRST_PLACEMENT_FORMAT, |m| {
                m.cluster_format()
            });
        if current < needs {
            return Err(ServerError::FeatureNotEnabled {
                feature,
                needs,
                current,
            });
        }
        Ok(())
    }

    async fn serve_get(
        &self,
        request: Request<GetRequest>,
    ) -> Result<Response<GetResponse>, Status> {
        let forwarding = may_forward(&request);
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        self.authorize(&resource, Access::Read)?;
        self.route(
            forwarding,
            &resource,
            |shard_id| self.get_local(shard_id, resource.clone()),
            |mut client| {
                let req = req.clone();
                async move { client.get(forwarded(req)).await }
            },
        )
        .await
    }
}

#[tonic::async_trait]
impl LockService for LockServiceImpl {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let caller = caller_of(&request);
        let identity = (identity_of(&request), relayed_of(&request));
        self.measured(Op::Acquire, caller, identity, self.serve_acquire(request))
            .await
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let caller = caller_of(&request);
        let identity = (identity_of(&request), relayed_of(&request));
        self.measured(Op::Renew, caller, identity, self.serve_renew(request))
            .await
    }

    async fn renew_batch(
        &self,
        request: Request<RenewBatchRequest>,
    ) -> Result<Response<RenewBatchResponse>, Status> {
        let caller = caller_of(&request);
        let identity = (identity_of(&request), relayed_of(&request));
        let relayed = identity.1;
        let result = self
            .measured(
                Op::RenewBatch,
                caller,
                identity,
                self.serve_renew_batch(request),
            )
            .await;
        if let (Ok(response), false) = (&result, relayed) {
            for r in &response.get_ref().results {
                self.metrics.requests.batch_item(match &r.outcome {
                    Some(renew_result::Outcome::Renewed(_)) => Outcome::Ok,
                    Some(renew_result::Outcome::Error(d)) => Outcome::of_reason(d.reason()),
                    None => Outcome::Error,
                });
            }
        }
        result
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let caller = caller_of(&request);
        let identity = (identity_of(&request), relayed_of(&request));
        self.measured(Op::Release, caller, identity, self.serve_release(request))
            .await
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let caller = caller_of(&request);
        let identity = (identity_of(&request), relayed_of(&request));
        self.measured(Op::Proclaim, caller, identity, self.serve_proclaim(request))
            .await
    }

    type WatchStream = crate::watch::WatchEvents;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = caller_of(&request);
        let identity = (identity_of(&request), relayed_of(&request));
        self.measured(Op::Watch, caller, identity, self.serve_watch(request))
            .await
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let caller = caller_of(&request);
        let identity = (identity_of(&request), relayed_of(&request));
        self.measured(Op::Get, caller, identity, self.serve_get(request))
            .await
    }
}

/// A lock request routed here by the placement map to a shard this node has
/// no replica of: the map (this node's or the client's) is behind a replica
/// move or a slot migration. That is a stale route, retried after a backoff
/// with a fresher map, not a shard that does not exist — SHARD_NOT_FOUND
/// (retry NEVER) would make a client give up in the middle of a migration.
fn stale_route(err: ServerError) -> ServerError {
    match err {
        ServerError::ShardNotHere { shard_id } => ServerError::Routing(format!(
            "this node has no replica of shard {shard_id}: the shard moved or the \
             placement map is behind; retry with a fresher route"
        )),
        other => other,
    }
}
