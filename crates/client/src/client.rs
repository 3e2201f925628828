//! [`Client`]: routed, retried calls; acquire turns a grant into a
//! [`LockGuard`] kept alive by the keeper ([`crate::keeper`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{
    AcquireRequest, AcquireResponse, GetRequest, GetResponse, LeaseState, ProclaimRequest, Reason,
    ReleaseRequest, RenewRequest, RenewResponse, Revision, WatchEvent, WatchRequest,
};
use tokio::sync::{oneshot, watch, Notify};
use tonic::transport::Channel;

use crate::config::{ClientConfig, MAX_WAIT_TIMEOUT_MS};
use crate::error::{ClientError, LostReason};
use crate::lease::{
    jittered_renew_interval, renew_backoff, renew_interval, LeaseEntry, LeaseStatus, LockGuard,
    Timing,
};
use crate::retry::{classify, Advice, Backoff, Failure};
use crate::router::Router;

/// Longest request id the server accepts, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 64;

/// Length of a generated request id: 128 random bits never collide in
/// practice.
const GENERATED_REQUEST_ID_LEN: usize = 16;

/// Times one logical acquire may start over with a fresh request id after
/// its first id's acquire ended without a holding (its wait was cancelled
/// because an earlier attempt's connection dropped, or the grant it learned
/// of had already ended). Nothing is held under the old id then, so a new
/// id cannot make a second lease; the bound keeps a flapping network from
/// looping.
const MAX_ACQUIRE_RESTARTS: u32 = 3;

/// Answers that end an acquire although their retry advice is BACKOFF: they
/// answer the question the caller asked (is the lock free, or did it become
/// free within my wait?), and the advice is for the caller, who decides
/// whether to try again later (see `errors.proto`). Retrying them inside
/// one acquire would silently stretch a zero or bounded wait.
const ACQUIRE_CONTENTION_REASONS: &[Reason] = &[
    Reason::LockHeld,
    Reason::WaitTimedOut,
    Reason::QueueFull,
    Reason::TenantWaitersExceeded,
    Reason::TenantQuotaExceeded,
];

/// The id of one logical acquire: stable across its retries, so a retry
/// whose first attempt was granted gets that grant back instead of a second
/// lease.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(Vec<u8>);

impl RequestId {
    /// 16 random bytes.
    pub fn random() -> RequestId {
        RequestId(rand::random::<[u8; GENERATED_REQUEST_ID_LEN]>().to_vec())
    }

    /// A caller-chosen id: 1 to [`MAX_REQUEST_ID_LEN`] bytes.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<RequestId, ClientError> {
        let bytes = bytes.into();
        if bytes.is_empty() || bytes.len() > MAX_REQUEST_ID_LEN {
            return Err(ClientError::InvalidArgument(format!(
                "request id must be 1..={MAX_REQUEST_ID_LEN} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(RequestId(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RequestId({self})")
    }
}

/// The parameters of [`Client::acquire_with`].
#[derive(Clone, Debug, Default)]
pub struct AcquireOptions {
    /// Lease TTL in ms; 0 = the server's default (30000).
    pub lease_ttl_ms: u64,
    /// How long to wait in the resource's queue if it is held, in ms; 0 =
    /// fail at once with LOCK_HELD. At most [`MAX_WAIT_TIMEOUT_MS`].
    pub wait_timeout_ms: u64,
    /// The request id. `None` (the usual case) generates one. Set it only to
    /// retry an acquire whose outcome is unknown
    /// ([`ClientError::Unavailable`] carries its id): the answer is then the
    /// original grant, never a second one.
    pub request_id: Option<RequestId>,
    /// What the lease publishes while it holds (`Get` returns it; at most
    /// 4096 bytes): for an election, the leader's address. Empty = none.
    /// Refused with FEATURE_NOT_ENABLED while a member of the cluster runs
    /// a build that predates values.
    pub value: Vec<u8>,
    /// Exclusive (the default), shared, or one of a semaphore's permits
    /// ([`AcquireMode`]).
    pub mode: AcquireMode,
}

/// How an acquire holds its resource (docs/fencing.md, "Shared locks and
/// semaphores"). Grants follow the queue in order whatever the mode, so a
/// waiting exclusive acquire is never overtaken by later shared ones. A
/// resource is a lock (exclusive and shared acquires) or a semaphore of one
/// permit count until it is free again; another kind is refused with
/// `MODE_MISMATCH`. Shared and semaphore acquires are refused with
/// FEATURE_NOT_ENABLED while a member of the cluster runs a build that
/// predates them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AcquireMode {
    /// The only holder.
    #[default]
    Exclusive,
    /// One of any number of shared holders, never beside an exclusive one.
    Shared,
    /// One of at most this many holders (1..=[`MAX_PERMITS`]).
    Semaphore(u32),
}

/// The largest permit count of a semaphore (the server refuses more with
/// INVALID_PERMITS).
pub const MAX_PERMITS: u32 = 1_024;

impl AcquireMode {
    /// The wire fields (`AcquireRequest.mode`, `permits`).
    pub fn to_wire(self) -> (crate::proto::AcquireMode, u32) {
        use crate::proto::AcquireMode as Wire;
        match self {
            AcquireMode::Exclusive => (Wire::Exclusive, 0),
            AcquireMode::Shared => (Wire::Shared, 0),
            AcquireMode::Semaphore(permits) => (Wire::Semaphore, permits),
        }
    }
}

/// Counters of a client's activity, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Failed attempts that were retried (all calls).
    pub retries: u64,
    /// `RenewBatch` calls sent by the background renewer.
    pub renew_batch_calls: u64,
    /// Leases renewed successfully by them.
    pub renewed_items: u64,
    /// Renewals that failed (per lease).
    pub renew_failures: u64,
    /// Leases lost (`NotHeld` or `Unconfirmed`).
    pub leases_lost: u64,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub retries: AtomicU64,
    pub renew_batch_calls: AtomicU64,
    pub renewed_items: AtomicU64,
    pub renew_failures: AtomicU64,
    pub leases_lost: AtomicU64,
}

/// A fencelock client: cheap to clone (all clones share connections, routes
/// and the background renewer).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// What a client's clones, guards and keeper share.
pub(crate) struct Inner {
    config: ClientConfig,
    pub(crate) router: Router,
    /// Held leases, by client-local key: what the keeper renews.
    leases: Mutex<HashMap<u64, Arc<LeaseEntry>>>,
    next_lease_key: AtomicU64,
    /// Wakes the keeper (a lease was added, a renewal finished).
    pub(crate) keeper_wake: Arc<Notify>,
    pub(crate) stats: Stats,
    /// Dropped with the last reference to `Inner`: tells the keeper to end.
    _keeper_stop: oneshot::Sender<()>,
}

/// A successful call and when its attempts were sent.
pub(crate) struct Answer<T> {
    pub value: T,
    /// Send time of the first attempt: a write may have taken effect from
    /// then on.
    pub first_sent_at: Instant,
    /// Send time of the attempt that was answered.
    pub last_sent_at: Instant,
    /// The node that answered.
    pub url: String,
}

/// How long one attempt may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptLimit {
    /// At most the configured attempt timeout.
    Bounded,
    /// Up to the call's deadline: a waiting acquire must stay on the wire,
    /// since ending its call removes it from the queue.
    UntilDeadline,
}

impl Client {
    /// A client for the cluster reachable at `endpoints` (`host:port` or
    /// URLs; any nodes of the cluster, at most
    /// [`MAX_ENDPOINTS`](crate::MAX_ENDPOINTS)). Connections are opened
    /// lazily, so this succeeds while the nodes are still starting; a node
    /// that cannot be reached costs a retry at the next. Starts the
    /// background renewer, so it must be called within a tokio runtime.
    pub async fn connect(
        endpoints: Vec<String>,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        config.validate()?;
        let router = Router::with_tls(endpoints, config.connect_timeout(), config.tls.clone())?;
        let (stop_tx, stop_rx) = oneshot::channel();
        let wake = Arc::new(Notify::new());
        let inner = Arc::new(Inner {
            config,
            router,
            leases: Mutex::new(HashMap::new()),
            next_lease_key: AtomicU64::new(1),
            keeper_wake: wake.clone(),
            stats: Stats::default(),
            _keeper_stop: stop_tx,
        });
        tokio::spawn(crate::keeper::run(Arc::downgrade(&inner), wake, stop_rx));
        Ok(Client { inner })
    }

    /// Takes an exclusive lease on `resource`, waiting up to
    /// `wait_timeout_ms` in its queue if it is held (0 = fail at once with
    /// LOCK_HELD); `lease_ttl_ms` 0 = the server's default. Retries routing
    /// and availability failures until the call's deadline
    /// (`call_timeout_ms` + `wait_timeout_ms`) with one request id, so the
    /// retries never make a second lease.
    ///
    /// Dropping the returned future while it waits ends its call, which
    /// removes the waiter from the server's queue.
    pub async fn acquire(
        &self,
        resource: &str,
        lease_ttl_ms: u64,
        wait_timeout_ms: u64,
    ) -> Result<LockGuard, ClientError> {
        self.acquire_with(
            resource,
            AcquireOptions {
                lease_ttl_ms,
                wait_timeout_ms,
                ..AcquireOptions::default()
            },
        )
        .await
    }

    /// [`acquire`](Self::acquire) with every option, including an explicit
    /// request id.
    pub async fn acquire_with(
        &self,
        resource: &str,
        options: AcquireOptions,
    ) -> Result<LockGuard, ClientError> {
        let inner = &self.inner;
        let (deadline, limit) = inner.acquire_deadline(&options)?;
        let explicit_id = options.request_id.is_some();
        let mut request_id = options.request_id.clone().unwrap_or_else(RequestId::random);
        let mut restarts = 0;
        loop {
            let result = inner
                .acquire_call(resource, &options, &request_id, deadline, limit)
                .await;
            // Starting over with a new id is safe only when the old id's
            // acquire is known to hold nothing, and only for ids this client
            // made up (an explicit id asks about that one acquire).
            let may_restart =
                !explicit_id && restarts < MAX_ACQUIRE_RESTARTS && Instant::now() < deadline;
            let answer = match result {
                Ok(answer) => answer,
                Err(ClientError::Rejected(detail))
                    if detail.reason() == Reason::WaitCancelled && may_restart =>
                {
                    tracing::debug!(%resource, "acquire's wait was cancelled by the server; starting over with a new request id");
                    restarts += 1;
                    request_id = RequestId::random();
                    continue;
                }
                Err(e) => return Err(e),
            };
            let response = &answer.value;
            let state = response.lease_state();
            if state != LeaseState::Held {
                if may_restart {
                    tracing::debug!(%resource, ?state, "acquire learned of an ended grant; starting over with a new request id");
                    restarts += 1;
                    request_id = RequestId::random();
                    continue;
                }
                return Err(ClientError::LeaseEnded {
                    state,
                    fencing_token: response.fencing_token,
                });
            }
            return Inner::hold(inner, resource, answer, deadline, request_id).await;
        }
    }

    /// One acquire that this client does not keep: the same routing and
    /// retries with one request id as [`acquire_with`](Self::acquire_with),
    /// but no [`LockGuard`], no renewals and no start-over with a new id.
    /// The server's answer comes back as it is, with the request id used
    /// (a retry with an explicit id may learn of a lease that has ended:
    /// `lease_state` is not HELD then). The lease lives for its TTL unless
    /// renewed ([`renew_unguarded`](Self::renew_unguarded)) or released
    /// ([`release_unguarded`](Self::release_unguarded)) by its id: for
    /// tools such as `fencelock acquire` that hand the lease to someone
    /// else. Anything that protects work should use a guard.
    pub async fn acquire_unguarded(
        &self,
        resource: &str,
        options: AcquireOptions,
    ) -> Result<(AcquireResponse, RequestId), ClientError> {
        let inner = &self.inner;
        let (deadline, limit) = inner.acquire_deadline(&options)?;
        let request_id = options.request_id.clone().unwrap_or_else(RequestId::random);
        let answer = inner
            .acquire_call(resource, &options, &request_id, deadline, limit)
            .await?;
        Ok((answer.value, request_id))
    }

    /// One `Renew` of a lease by its id, with retries until the call's
    /// deadline; `lease_ttl_ms` 0 keeps the lease's TTL. For leases taken
    /// with [`acquire_unguarded`](Self::acquire_unguarded): a guard's lease
    /// is renewed by the client itself.
    pub async fn renew_unguarded(
        &self,
        resource: &str,
        lease_id: &[u8],
        lease_ttl_ms: u64,
    ) -> Result<RenewResponse, ClientError> {
        let request = RenewRequest {
            resource: resource.to_owned(),
            lease_id: lease_id.to_vec(),
            lease_ttl_ms,
        };
        let answer = self
            .inner
            .bounded_call(resource, request, |mut client, request| async move {
                client.renew(request).await
            })
            .await?;
        Ok(answer.value)
    }

    /// Releases a lease by its id, with retries until the call's deadline;
    /// true if it held the lock (release is idempotent: false when it was
    /// already released, expired or superseded).
    pub async fn release_unguarded(
        &self,
        resource: &str,
        lease_id: &[u8],
    ) -> Result<bool, ClientError> {
        self.inner.release_lease(resource, lease_id).await
    }

    /// Replaces the value a lease publishes, by its lease id (for leases
    /// taken with [`acquire_unguarded`](Self::acquire_unguarded); a guard
    /// has [`LockGuard::proclaim`](crate::LockGuard::proclaim)). Answers the
    /// lease's fencing token.
    pub async fn proclaim_unguarded(
        &self,
        resource: &str,
        lease_id: &[u8],
        value: &[u8],
    ) -> Result<i64, ClientError> {
        self.inner.proclaim_lease(resource, lease_id, value).await
    }

    /// A resource's lock state (linearizable read by the shard's leader).
    /// The holder's lease id is never included; its value is.
    pub async fn get(&self, resource: &str) -> Result<GetResponse, ClientError> {
        let request = GetRequest {
            resource: resource.to_owned(),
        };
        let answer = self
            .inner
            .bounded_call(resource, request, |mut client, request| async move {
                client.get(request).await
            })
            .await?;
        self.inner
            .router
            .learn(Some(resource), answer.value.shard_id, &answer.url);
        Ok(answer.value)
    }

    /// Starts watching `resource` (lock.proto `Watch`) on a node with a
    /// replica of its shard, following hints: its state now (`after`
    /// `None`), or the changes after `after` (the last revision received,
    /// when resuming). Retries routing and availability failures until the
    /// call deadline; the stream itself has no deadline. When it ends with
    /// an error, watch again with the last revision received.
    pub async fn watch(
        &self,
        resource: &str,
        after: Option<Revision>,
    ) -> Result<tonic::Streaming<WatchEvent>, ClientError> {
        let request = WatchRequest {
            resource: resource.to_owned(),
            after,
        };
        let deadline = Instant::now() + self.inner.config().call_timeout();
        let answer = self
            .inner
            .call(
                Some(resource),
                None,
                deadline,
                AttemptLimit::Bounded,
                &[],
                // No gRPC deadline on the request: it would end the stream.
                |mut client, _attempt_timeout| {
                    let request = request.clone();
                    async move { client.watch(request).await }
                },
            )
            .await?;
        Ok(answer.value)
    }

    /// The client's counters so far.
    pub fn stats(&self) -> ClientStats {
        let s = &self.inner.stats;
        ClientStats {
            retries: s.retries.load(Ordering::Relaxed),
            renew_batch_calls: s.renew_batch_calls.load(Ordering::Relaxed),
            renewed_items: s.renewed_items.load(Ordering::Relaxed),
            renew_failures: s.renew_failures.load(Ordering::Relaxed),
            leases_lost: s.leases_lost.load(Ordering::Relaxed),
        }
    }

    /// How many leases the client is keeping alive.
    pub fn held_leases(&self) -> usize {
        self.inner.leases().len()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .field("held_leases", &self.held_leases())
            .finish()
    }
}

/// `message` as a request whose gRPC deadline (`grpc-timeout`) is `timeout`,
/// so the server stops working on it when the client stops waiting.
fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

impl Inner {
    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub(crate) fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<LeaseEntry>>> {
        // The registry is a plain map; a panic elsewhere leaves it usable.
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops renewing a lease (released or dropped).
    pub(crate) fn forget_lease(&self, key: u64) {
        self.leases().remove(&key);
    }

    /// Runs one logical call: sends `rpc` to the best known node for
    /// `resource` (or `shard_id`), and on failure follows the error
    /// contract (redirect, back off, try another node) until it succeeds,
    /// fails definitively, or `deadline` passes. `rpc` must send the same
    /// request every time; it gets the attempt's timeout for the request's
    /// gRPC deadline. Answers with a reason in `final_reasons` end the call
    /// whatever their retry advice. Dropping the returned future drops the
    /// call in flight.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        resource: Option<&str>,
        shard_id: Option<u64>,
        deadline: Instant,
        limit: AttemptLimit,
        final_reasons: &[Reason],
        mut rpc: F,
    ) -> Result<Answer<T>, ClientError>
    where
        F: FnMut(LockServiceClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let mut url = match (resource, shard_id) {
            (Some(resource), _) => self.router.target(resource),
            (None, Some(shard_id)) => self.router.target_for_shard(shard_id),
            (None, None) => self.router.target(""),
        };
        let mut backoff = Backoff::new(
            Duration::from_millis(self.config.backoff_base_ms),
            Duration::from_millis(self.config.backoff_max_ms),
        );
        let mut first_sent_at = None;
        let mut attempts = 0u32;
        let mut last: Option<Failure> = None;
        // Whether any attempt got further than a refused TCP connect: only
        // then may the call have taken effect.
        let mut sent = false;
        let unavailable =
            |attempts: u32, last: Option<Failure>, sent: bool| ClientError::Unavailable {
                timeout_ms: u64::try_from(deadline.saturating_duration_since(started).as_millis())
                    .unwrap_or(u64::MAX),
                attempts,
                last_error: last.map_or_else(|| "no attempt fitted".to_owned(), |f| f.summary),
                request_id: None,
                sent,
            };
        loop {
            let now = Instant::now();
            let remaining = deadline.saturating_duration_since(now);
            if remaining.is_zero() {
                return Err(unavailable(attempts, last, sent));
            }
            let attempt_timeout = match limit {
                AttemptLimit::Bounded => remaining.min(self.config.attempt_timeout()),
                AttemptLimit::UntilDeadline => remaining,
            };
            let status = match self.router.channel(&url) {
                // Seeds were checked up front, so this is a hinted address
                // that is not a URI: a failed attempt, tried elsewhere.
                Err(e) => tonic::Status::unavailable(e.to_string()),
                Ok(channel) => {
                    let sent_at = Instant::now();
                    first_sent_at.get_or_insert(sent_at);
                    attempts += 1;
                    let outcome = tokio::time::timeout(
                        attempt_timeout,
                        rpc(LockServiceClient::new(channel), attempt_timeout),
                    )
                    .await;
                    match outcome {
                        Ok(Ok(response)) => {
                            return Ok(Answer {
                                value: response.into_inner(),
                                first_sent_at: first_sent_at.unwrap_or(sent_at),
                                last_sent_at: sent_at,
                                url,
                            })
                        }
                        Ok(Err(status)) => status,
                        // The timeout dropped the call, which cancels it on
                        // the server.
                        Err(_) => tonic::Status::deadline_exceeded(format!(
                            "no answer from {url} within {} ms",
                            attempt_timeout.as_millis()
                        )),
                    }
                }
            };
            let failure = classify(&status);
            sent |= !failure.never_sent;
            let is_final = failure
                .detail
                .as_ref()
                .is_some_and(|d| final_reasons.contains(&d.reason()));
            if failure.advice == Advice::Fail || is_final {
                return Err(ClientError::from_status(status));
            }
            let failed_shard = failure
                .detail
                .as_ref()
                .map(|d| d.shard_id)
                .filter(|&s| s != 0)
                .or(shard_id);
            let next = self
                .router
                .reroute(&failure.reroute, resource, failed_shard, &url);
            let delay = backoff.delay(failure.advice);
            tracing::debug!(
                from = %url,
                to = %next,
                delay_ms = delay.as_millis() as u64,
                error = %failure.summary,
                "retrying"
            );
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
            url = next;
            last = Some(failure);
            if Instant::now() + delay >= deadline {
                return Err(unavailable(attempts, last, sent));
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// The deadline of an acquire (`call_timeout_ms` + its wait) and how
    /// long its attempts may take; refuses a wait over the maximum.
    fn acquire_deadline(
        &self,
        options: &AcquireOptions,
    ) -> Result<(Instant, AttemptLimit), ClientError> {
        if options.wait_timeout_ms > MAX_WAIT_TIMEOUT_MS {
            return Err(ClientError::InvalidArgument(format!(
                "wait_timeout_ms {} is over the maximum {MAX_WAIT_TIMEOUT_MS}",
                options.wait_timeout_ms
            )));
        }
        let deadline = Instant::now()
            + self.config.call_timeout()
            + Duration::from_millis(options.wait_timeout_ms);
        // A waiting acquire must stay on the wire: ending its call removes
        // it from the queue.
        let limit = if options.wait_timeout_ms > 0 {
            AttemptLimit::UntilDeadline
        } else {
            AttemptLimit::Bounded
        };
        Ok((deadline, limit))
    }

    /// One logical acquire under `request_id`: every retry sends the same
    /// request. An unavailable answer carries the id (retrying with it
    /// learns the outcome); a granted one teaches the router the shard.
    async fn acquire_call(
        &self,
        resource: &str,
        options: &AcquireOptions,
        request_id: &RequestId,
        deadline: Instant,
        limit: AttemptLimit,
    ) -> Result<Answer<AcquireResponse>, ClientError> {
        let request = AcquireRequest {
            resource: resource.to_owned(),
            request_id: request_id.as_bytes().to_vec(),
            lease_ttl_ms: options.lease_ttl_ms,
            wait_timeout_ms: options.wait_timeout_ms,
            value: options.value.clone(),
            mode: options.mode.to_wire().0 as i32,
            permits: options.mode.to_wire().1,
        };
        let result = self
            .call(
                Some(resource),
                None,
                deadline,
                limit,
                ACQUIRE_CONTENTION_REASONS,
                |mut client, timeout| {
                    let request = with_timeout(request.clone(), timeout);
                    async move { client.acquire(request).await }
                },
            )
            .await;
        match result {
            Ok(answer) => {
                self.router
                    .learn(Some(resource), answer.value.shard_id, &answer.url);
                Ok(answer)
            }
            Err(ClientError::Unavailable {
                timeout_ms,
                attempts,
                last_error,
                sent,
                ..
            }) => Err(ClientError::Unavailable {
                timeout_ms,
                attempts,
                last_error,
                request_id: Some(request_id.clone()),
                sent,
            }),
            Err(e) => Err(e),
        }
    }

    /// Ends a holding, retrying until the call's deadline.
    /// One `Proclaim`: the lease's new value; answers the lease's token.
    /// Retried like a renew (setting the same value twice changes nothing).
    pub(crate) async fn proclaim_lease(
        &self,
        resource: &str,
        lease_id: &[u8],
        value: &[u8],
    ) -> Result<i64, ClientError> {
        let request = ProclaimRequest {
            resource: resource.to_owned(),
            lease_id: lease_id.to_vec(),
            value: value.to_vec(),
        };
        let answer = self
            .bounded_call(resource, request, |mut client, request| async move {
                client.proclaim(request).await
            })
            .await?;
        Ok(answer.value.fencing_token)
    }

    pub(crate) async fn release_lease(
        &self,
        resource: &str,
        lease_id: &[u8],
    ) -> Result<bool, ClientError> {
        let request = ReleaseRequest {
            resource: resource.to_owned(),
            lease_id: lease_id.to_vec(),
        };
        let answer = self
            .bounded_call(resource, request, |mut client, request| async move {
                client.release(request).await
            })
            .await?;
        Ok(answer.value.released)
    }

    /// [`call`](Self::call) of one request about `resource` with the
    /// configured call deadline and bounded attempts; `rpc` gets the
    /// request with each attempt's gRPC deadline set.
    async fn bounded_call<R, T, F, Fut>(
        &self,
        resource: &str,
        request: R,
        rpc: F,
    ) -> Result<Answer<T>, ClientError>
    where
        R: Clone,
        F: Fn(LockServiceClient<Channel>, tonic::Request<R>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + self.config.call_timeout();
        self.call(
            Some(resource),
            None,
            deadline,
            AttemptLimit::Bounded,
            &[],
            |client, timeout| rpc(client, with_timeout(request.clone(), timeout)),
        )
        .await
    }

    /// Turns a grant into a guard kept alive by the keeper. The stop-by
    /// deadline counts from the acquire's FIRST attempt: the grant may come
    /// from it even when a later attempt brought the answer.
    async fn hold(
        self: &Arc<Inner>,
        resource: &str,
        answer: Answer<AcquireResponse>,
        acquire_deadline: Instant,
        request_id: RequestId,
    ) -> Result<LockGuard, ClientError> {
        let response = answer.value;
        let ttl_ms = response.lease_ttl_ms;
        let sent_at = answer.first_sent_at;
        let mut stop_by =
            sent_at + Duration::from_millis(ttl_ms) - self.config.stop_by_margin(ttl_ms);
        let mut expires_at_ms = response.expires_at_ms;
        let mut next_renew_at = sent_at + jittered_renew_interval(ttl_ms);
        let mut renewed_ttl_ms = ttl_ms;

        // An acquire that waited in the queue (or was retried for long) may
        // have used up much of its deadline although the lease is fresh:
        // renew at once to start from a full one, as lock.proto advises. A
        // deduplicated answer grants only what was left of the original
        // grant (perhaps nothing): renew it at once too.
        if response.deduplicated || Instant::now() >= sent_at + renew_interval(ttl_ms) {
            let deadline = acquire_deadline.max(Instant::now() + self.config.attempt_timeout());
            match self
                .renew_one(resource, &response.lease_id, response.shard_id, deadline)
                .await
            {
                Ok((renew_sent_at, renewed)) => {
                    renewed_ttl_ms = renewed.lease_ttl_ms;
                    stop_by = stop_by.max(
                        renew_sent_at + Duration::from_millis(renewed_ttl_ms)
                            - self.config.stop_by_margin(renewed_ttl_ms),
                    );
                    expires_at_ms = expires_at_ms.max(renewed.expires_at_ms);
                    next_renew_at = renew_sent_at + jittered_renew_interval(renewed_ttl_ms);
                }
                Err(e) if e.reason() == Some(Reason::LeaseNotHeld) => return Err(e),
                Err(e) if Instant::now() >= stop_by => {
                    // Granted, but it cannot be confirmed in time to be of
                    // use: give it back rather than leave it to expire.
                    let inner = self.clone();
                    let (resource, lease_id) = (resource.to_owned(), response.lease_id.clone());
                    tokio::spawn(async move {
                        let _ = inner.release_lease(&resource, &lease_id).await;
                    });
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(%resource, "renewal right after a long acquire failed; the renewer keeps trying: {e}");
                }
            }
        }

        let key = self.next_lease_key.fetch_add(1, Ordering::Relaxed);
        let (status, _) = watch::channel(LeaseStatus::Held {
            stop_by,
            expires_at_ms,
        });
        let entry = Arc::new(LeaseEntry {
            key,
            resource: resource.to_owned(),
            lease_id: response.lease_id,
            fencing_token: response.fencing_token,
            shard_id: response.shard_id,
            deduplicated: response.deduplicated,
            request_id,
            timing: Mutex::new(Timing {
                lease_ttl_ms: renewed_ttl_ms,
                expires_at_ms,
                stop_by,
                next_renew_at,
                retry_at: None,
                backoff: renew_backoff(self, renewed_ttl_ms),
                in_flight: false,
                renewable: true,
            }),
            status,
        });
        self.leases().insert(key, entry.clone());
        self.keeper_wake.notify_one();
        Ok(LockGuard::new(entry, self.clone()))
    }

    /// One `Renew` with retries; returns when the answered attempt was sent.
    async fn renew_one(
        &self,
        resource: &str,
        lease_id: &[u8],
        shard_id: u64,
        deadline: Instant,
    ) -> Result<(Instant, fencelock_api::v1::RenewResponse), ClientError> {
        let request = RenewRequest {
            resource: resource.to_owned(),
            lease_id: lease_id.to_vec(),
            lease_ttl_ms: 0,
        };
        let answer = self
            .call(
                Some(resource),
                Some(shard_id),
                deadline,
                AttemptLimit::Bounded,
                &[],
                |mut client, timeout| {
                    let request = with_timeout(request.clone(), timeout);
                    async move { client.renew(request).await }
                },
            )
            .await?;
        Ok((answer.last_sent_at, answer.value))
    }

    /// Marks a lease lost and counts it; logs why.
    pub(crate) fn lose(&self, entry: &LeaseEntry, reason: LostReason) {
        if matches!(entry.mark_lost(reason), LeaseStatus::Held { .. }) {
            self.stats.leases_lost.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(resource = %entry.resource, token = entry.fencing_token, "lock lost: {reason}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_random_and_bounded() {
        assert_ne!(RequestId::random(), RequestId::random());
        assert_eq!(
            RequestId::random().as_bytes().len(),
            GENERATED_REQUEST_ID_LEN
        );
        assert!(RequestId::from_bytes(Vec::new()).is_err());
        assert!(RequestId::from_bytes(vec![1; MAX_REQUEST_ID_LEN + 1]).is_err());
        let id = RequestId::from_bytes(vec![0xab, 0x01]).unwrap();
        assert_eq!(id.to_string(), "ab01");
    }
}
