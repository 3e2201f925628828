//! fencelock through its public gRPC API, routed like a smart client.
//!
//! Routing: at start the driver reads the placement from the admin API —
//! which shard owns each of the 1024 slots, which node leads each shard,
//! and the nodes' addresses — and sends each request straight to its
//! shard's leader, marked so the server answers NOT_LEADER (with a hint)
//! instead of forwarding. That is what `fencelock-client` converges to
//! after its first answers; doing it up front keeps the warm-up short for
//! 100,000 resources. Later changes are learned from NOT_LEADER hints only:
//! the admin API is never asked on the request path (it asks every node,
//! and after a crash it would wait on the dead one). A node that could not
//! be reached is avoided for [`DOWN_FOR_MS`], hints naming it included.
//!
//! Mapping: acquire = `Acquire` (one request id for all retries of one
//! acquire, so a retry after an unknown outcome returns the original grant);
//! renew = `Renew`; release = `Release`. Every one of them is committed by
//! a majority before it is answered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fencelock_api::v1::admin_service_client::AdminServiceClient;
use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{
    AcquireRequest, ErrorDetail, LeaseState, ListNodesRequest, ListShardsRequest, Reason,
    ReleaseRequest, RenewRequest, TransferLeaderRequest,
};
use fencelock_statemachine::{slot_of, ResourceName, SLOT_COUNT};
use tonic::transport::Channel;
use tonic::Code;

use super::{
    channel, host_port, out_of_time, remaining, Backoff, Held, LeaseRef, ServerCounters,
    READY_TIMEOUT_MS,
};
use crate::error::BenchError;
use crate::outcome::{OpError, Outcome};

/// The metadata key that asks a node to serve a request itself (answering
/// NOT_LEADER with a hint) rather than forward it.
const SERVE_HERE_HEADER: &str = fencelock_api::headers::FORWARDED_HEADER;
/// Redirects one attempt may follow before it re-reads the placement.
const MAX_REDIRECTS: u32 = 3;
/// Duration histogram of a node's synced RocksDB writes (one per store-loop
/// iteration with Raft work), served on its admin HTTP port when it has
/// one: `_count` is the number of fsyncs.
pub const FSYNC_METRIC: &str = "fencelock_store_fsync_duration_seconds";
/// How long a node that could not be reached is skipped before it is tried
/// again.
pub const DOWN_FOR_MS: u64 = 1_000;
/// Lease TTL of the readiness probe's lock.
const PROBE_TTL_MS: u64 = 1_000;

/// Where requests go: slot → shard, shard → endpoint index.
#[derive(Default)]
struct Routes {
    slot_shard: Vec<u64>,
    shard_endpoint: HashMap<u64, usize>,
    /// Every shard the placement lists, led or not.
    shards: usize,
}

struct Inner {
    endpoints: Vec<String>,
    /// `conns` clients per endpoint.
    clients: Vec<Vec<LockServiceClient<Channel>>>,
    admin: Vec<AdminServiceClient<Channel>>,
    routes: RwLock<Routes>,
    round_robin: AtomicUsize,
    metrics_urls: Vec<String>,
    /// Per endpoint: until when (ms since `epoch`) it counts as down.
    down_until_ms: Vec<AtomicU64>,
    epoch: Instant,
}

#[derive(Clone)]
pub struct FencelockDriver {
    inner: Arc<Inner>,
}

/// What one attempt's failure means for the operation.
enum Next {
    /// Retry at once at this endpoint (a leader hint).
    Redirect(usize),
    /// Retry after a backoff: at another endpoint (`Some`, the node could
    /// not be reached) or wherever the routes then say.
    Backoff(OpError, Option<usize>),
    /// The operation has ended with this outcome.
    Done(OpError),
}

impl FencelockDriver {
    pub async fn connect(
        endpoints: &[String],
        conns: usize,
        metrics_urls: Vec<String>,
    ) -> Result<FencelockDriver, BenchError> {
        if endpoints.is_empty() {
            return Err(BenchError::InvalidArgument("no endpoints".to_owned()));
        }
        let mut clients = Vec::new();
        let mut admin = Vec::new();
        for endpoint in endpoints {
            let mut per = Vec::new();
            for _ in 0..conns.max(1) {
                per.push(LockServiceClient::new(channel(endpoint)?));
            }
            clients.push(per);
            admin.push(AdminServiceClient::new(channel(endpoint)?));
        }
        Ok(FencelockDriver {
            inner: Arc::new(Inner {
                endpoints: endpoints.iter().map(|e| host_port(e).to_owned()).collect(),
                clients,
                admin,
                routes: RwLock::new(Routes::default()),
                round_robin: AtomicUsize::new(0),
                metrics_urls,
                down_until_ms: endpoints.iter().map(|_| AtomicU64::new(0)).collect(),
                epoch: Instant::now(),
            }),
        })
    }

    /// Reads the placement from the first node that answers. Returns
    /// whether every shard has a leader among the endpoints.
    async fn refresh_routes(&self) -> Result<bool, String> {
        let mut last = String::from("no endpoint answered");
        for admin in &self.inner.admin {
            let mut admin = admin.clone();
            let shards = match admin.list_shards(ListShardsRequest::default()).await {
                Ok(r) => r.into_inner(),
                Err(e) => {
                    last = e.message().to_owned();
                    continue;
                }
            };
            let nodes = match admin.list_nodes(ListNodesRequest::default()).await {
                Ok(r) => r.into_inner(),
                Err(e) => {
                    last = e.message().to_owned();
                    continue;
                }
            };
            let node_endpoint: HashMap<u64, usize> = nodes
                .nodes
                .iter()
                .filter_map(|n| {
                    let addr = host_port(&n.address);
                    let index = self.inner.endpoints.iter().position(|e| e == addr)?;
                    Some((n.node_id, index))
                })
                .collect();
            let mut routes = Routes {
                slot_shard: vec![0; SLOT_COUNT as usize],
                shard_endpoint: HashMap::new(),
                shards: shards.shards.len(),
            };
            let mut all_led = true;
            for shard in &shards.shards {
                for range in &shard.slot_ranges {
                    for slot in range.start..=range.end.min(SLOT_COUNT - 1) {
                        routes.slot_shard[slot as usize] = shard.shard_id;
                    }
                }
                match node_endpoint.get(&shard.leader_node_id) {
                    Some(&index) => {
                        routes.shard_endpoint.insert(shard.shard_id, index);
                    }
                    None => all_led = false,
                }
            }
            *self.inner.routes.write().unwrap_or_else(|e| e.into_inner()) = routes;
            return Ok(all_led);
        }
        Err(last)
    }

    pub async fn wait_ready(&self) -> Result<(), BenchError> {
        let started = Instant::now();
        let limit = Duration::from_millis(READY_TIMEOUT_MS);
        let mut last_error = String::new();
        while started.elapsed() < limit {
            match self.refresh_routes().await {
                Ok(true) => {
                    // Every shard has a leader: one write proves the path.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    match self
                        .acquire("bench/ready-probe", PROBE_TTL_MS, 0, deadline)
                        .await
                    {
                        Ok(held) => {
                            let _ = self.release(&held, deadline).await;
                            return Ok(());
                        }
                        Err(e) if e.outcome == Outcome::Conflict => return Ok(()),
                        Err(e) => last_error = e.to_string(),
                    }
                }
                Ok(false) => last_error = "some shard has no leader yet".to_owned(),
                Err(e) => last_error = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(BenchError::NotReady {
            waited_ms: READY_TIMEOUT_MS,
            last_error,
        })
    }

    fn now_ms(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64
    }

    fn mark_down(&self, endpoint: usize) {
        self.inner.down_until_ms[endpoint].store(self.now_ms() + DOWN_FOR_MS, Ordering::Relaxed);
    }

    fn is_down(&self, endpoint: usize) -> bool {
        self.inner.down_until_ms[endpoint].load(Ordering::Relaxed) > self.now_ms()
    }

    /// The first endpoint after `endpoint` that is not down (or the next
    /// one, if all are).
    fn next_live(&self, endpoint: usize) -> usize {
        let n = self.inner.endpoints.len();
        (1..=n)
            .map(|k| (endpoint + k) % n)
            .find(|&i| !self.is_down(i))
            .unwrap_or((endpoint + 1) % n)
    }

    /// `endpoint`, or a live one instead if it is down.
    fn live(&self, endpoint: usize) -> usize {
        if self.is_down(endpoint) {
            self.next_live(endpoint)
        } else {
            endpoint
        }
    }

    /// The endpoint to try first for `resource`.
    fn route(&self, resource: &str) -> usize {
        let routes = self.inner.routes.read().unwrap_or_else(|e| e.into_inner());
        let shard = ResourceName::parse(resource)
            .ok()
            .and_then(|name| routes.slot_shard.get(slot_of(&name) as usize).copied());
        shard
            .and_then(|s| routes.shard_endpoint.get(&s).copied())
            .unwrap_or_else(|| {
                self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % self.inner.endpoints.len()
            })
    }

    fn learn(&self, shard_id: u64, endpoint: usize) {
        let mut routes = self.inner.routes.write().unwrap_or_else(|e| e.into_inner());
        routes.shard_endpoint.insert(shard_id, endpoint);
    }

    fn client(&self, endpoint: usize) -> LockServiceClient<Channel> {
        let per = &self.inner.clients[endpoint];
        let i = self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % per.len();
        per[i].clone()
    }

    fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        request.metadata_mut().insert(
            SERVE_HERE_HEADER,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        request
    }

    /// Classifies a failed attempt at `endpoint`.
    fn classify(&self, status: &tonic::Status, endpoint: usize) -> Next {
        let Some(detail) = ErrorDetail::from_status(status) else {
            return match status.code() {
                Code::DeadlineExceeded => {
                    Next::Done(OpError::new(Outcome::Timeout, status.message()))
                }
                Code::Unavailable | Code::Unknown | Code::Cancelled => {
                    // A node that cannot be reached: avoid it for a while.
                    self.mark_down(endpoint);
                    let next = self.next_live(endpoint);
                    Next::Backoff(
                        OpError::new(
                            Outcome::Unavailable,
                            format!(
                                "{} (endpoint {})",
                                status.message(),
                                self.inner.endpoints[endpoint]
                            ),
                        ),
                        Some(next),
                    )
                }
                _ => Next::Done(OpError::new(Outcome::Unknown, status.to_string())),
            };
        };
        let message = format!("{:?}: {}", detail.reason(), detail.message);
        match detail.reason() {
            Reason::LockHeld
            | Reason::WaitTimedOut
            | Reason::WaitCancelled
            | Reason::LeaseNotHeld
            | Reason::HoldLimitReached
            | Reason::QueueFull
            | Reason::TenantWaitersExceeded
            | Reason::TenantQuotaExceeded => Next::Done(OpError::new(Outcome::Conflict, message)),
            Reason::NotLeader => {
                let hinted = detail.leader.as_ref().and_then(|l| {
                    let addr = host_port(&l.address);
                    self.inner.endpoints.iter().position(|e| e == addr)
                });
                match hinted {
                    // The node asked still follows a leader that is gone:
                    // another node may know the new one.
                    Some(index) if self.is_down(index) => Next::Backoff(
                        OpError::new(Outcome::Unavailable, message),
                        Some(self.next_live(endpoint)),
                    ),
                    Some(index) => {
                        self.learn(detail.shard_id, index);
                        Next::Redirect(index)
                    }
                    None => Next::Backoff(OpError::new(Outcome::Unavailable, message), None),
                }
            }
            Reason::OutcomeUnknown => Next::Backoff(OpError::new(Outcome::Unknown, message), None),
            Reason::LeaderUnknown
            | Reason::NoQuorum
            | Reason::LeaderNotReady
            | Reason::ServerBusy
            | Reason::ShuttingDown
            | Reason::EpochNotMatch
            | Reason::ShardNotFound
            | Reason::TokenSpaceExhausted
            | Reason::LeaseIdCollision
            | Reason::RateLimited => {
                Next::Backoff(OpError::new(Outcome::Unavailable, message), None)
            }
            _ => Next::Done(OpError::new(Outcome::Unavailable, message)),
        }
    }

    /// Runs `attempt` at the resource's leader until it succeeds, ends, or
    /// `deadline` passes, following hints and backing off on refusals.
    async fn run<T, F, Fut>(
        &self,
        resource: &str,
        deadline: Instant,
        mut attempt: F,
    ) -> Result<(T, bool), OpError>
    where
        F: FnMut(LockServiceClient<Channel>, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let mut endpoint = self.live(self.route(resource));
        let mut backoff = Backoff::new();
        let mut redirects = 0;
        let mut last: Option<OpError> = None;
        // Whether an earlier attempt may have taken effect.
        let mut uncertain = false;
        loop {
            let Some(left) = remaining(deadline) else {
                return Err(out_of_time(last));
            };
            match attempt(self.client(endpoint), left).await {
                Ok(value) => return Ok((value, uncertain)),
                Err(status) => match self.classify(&status, endpoint) {
                    Next::Done(e) => return Err(e),
                    Next::Redirect(next) if redirects < MAX_REDIRECTS => {
                        redirects += 1;
                        endpoint = next;
                    }
                    Next::Redirect(_) => {
                        redirects = 0;
                        last = Some(OpError::new(Outcome::Unavailable, "too many redirects"));
                        if !backoff.wait(deadline).await {
                            return Err(out_of_time(last));
                        }
                        endpoint = self.live(self.route(resource));
                    }
                    Next::Backoff(e, elsewhere) => {
                        uncertain |= matches!(e.outcome, Outcome::Unknown | Outcome::Unavailable);
                        last = Some(e);
                        if !backoff.wait(deadline).await {
                            return Err(out_of_time(last));
                        }
                        endpoint = match elsewhere {
                            Some(next) => next,
                            None => self.live(self.route(resource)),
                        };
                    }
                },
            }
        }
    }

    pub async fn acquire(
        &self,
        resource: &str,
        ttl_ms: u64,
        wait_ms: u64,
        deadline: Instant,
    ) -> Result<Held, OpError> {
        let request = AcquireRequest {
            resource: resource.to_owned(),
            request_id: rand::random::<[u8; 16]>().to_vec(),
            lease_ttl_ms: ttl_ms,
            wait_timeout_ms: wait_ms,
            value: Vec::new(),
            ..Default::default()
        };
        let (response, _) = self
            .run(resource, deadline, |mut client, left| {
                let request = Self::request(request.clone(), left);
                async move { client.acquire(request).await.map(|r| r.into_inner()) }
            })
            .await?;
        if response.lease_state() != LeaseState::Held {
            return Err(OpError::new(
                Outcome::Conflict,
                format!("granted lease already ended: {:?}", response.lease_state()),
            ));
        }
        Ok(Held {
            resource: resource.to_owned(),
            token: response.fencing_token,
            lease: LeaseRef::Fencelock {
                lease_id: response.lease_id,
            },
        })
    }

    fn lease_id(held: &Held) -> Result<&[u8], OpError> {
        match &held.lease {
            LeaseRef::Fencelock { lease_id } => Ok(lease_id),
            LeaseRef::Etcd { .. } => Err(OpError::new(Outcome::Unknown, "not a fencelock lease")),
        }
    }

    pub async fn renew(&self, held: &Held, deadline: Instant) -> Result<(), OpError> {
        let request = RenewRequest {
            resource: held.resource.clone(),
            lease_id: Self::lease_id(held)?.to_vec(),
            lease_ttl_ms: 0,
        };
        self.run(&held.resource, deadline, |mut client, left| {
            let request = Self::request(request.clone(), left);
            async move { client.renew(request).await.map(|r| r.into_inner()) }
        })
        .await
        .map(|_| ())
    }

    pub async fn release(&self, held: &Held, deadline: Instant) -> Result<(), OpError> {
        let request = ReleaseRequest {
            resource: held.resource.clone(),
            lease_id: Self::lease_id(held)?.to_vec(),
        };
        let (response, uncertain) = self
            .run(&held.resource, deadline, |mut client, left| {
                let request = Self::request(request.clone(), left);
                async move { client.release(request).await.map(|r| r.into_inner()) }
            })
            .await?;
        // `released = false` after an uncertain attempt is that attempt's
        // success seen from the retry.
        if response.released || uncertain {
            Ok(())
        } else {
            Err(OpError::new(
                Outcome::Conflict,
                "release found the lease no longer held",
            ))
        }
    }

    pub async fn busiest_leader(&self) -> Option<usize> {
        self.refresh_routes().await.ok()?;
        let routes = self.inner.routes.read().unwrap_or_else(|e| e.into_inner());
        let mut led = vec![0usize; self.inner.endpoints.len()];
        for &index in routes.shard_endpoint.values() {
            led[index] += 1;
        }
        (0..led.len()).max_by_key(|&i| led[i])
    }

    /// The index (in the endpoint list) of the node that leads the shard of
    /// `resource`, read from the admin API now.
    pub async fn leader_of(&self, resource: &str) -> Option<usize> {
        self.refresh_routes().await.ok()?;
        let name = ResourceName::parse(resource).ok()?;
        let routes = self.inner.routes.read().unwrap_or_else(|e| e.into_inner());
        let shard = *routes.slot_shard.get(slot_of(&name) as usize)?;
        routes.shard_endpoint.get(&shard).copied()
    }

    /// The node id of endpoint `index`, from the admin API.
    async fn node_id_of(&self, index: usize) -> Result<u64, String> {
        let mut admin = self.inner.admin[index].clone();
        let nodes = admin
            .list_nodes(ListNodesRequest::default())
            .await
            .map_err(|e| e.message().to_owned())?
            .into_inner();
        let endpoint = &self.inner.endpoints[index];
        nodes
            .nodes
            .iter()
            .find(|n| host_port(&n.address) == endpoint)
            .map(|n| n.node_id)
            .ok_or_else(|| format!("no node has the address {endpoint}"))
    }

    /// Hands the leadership of every shard to the node of endpoint `index`
    /// (through that node's admin API); returns how many shards it leads
    /// after, and of how many. Routes are read again afterwards.
    pub async fn lead_all_on(&self, index: usize) -> Result<(usize, usize), String> {
        let node = self.node_id_of(index).await?;
        let mut admin = self.inner.admin[index].clone();
        let shards = admin
            .list_shards(ListShardsRequest::default())
            .await
            .map_err(|e| e.message().to_owned())?
            .into_inner()
            .shards;
        let mut failed = Vec::new();
        for shard in shards.iter().filter(|s| s.leader_node_id != node) {
            let moved = admin
                .transfer_leader(TransferLeaderRequest {
                    shard_id: shard.shard_id,
                    to_node_id: node,
                })
                .await;
            if let Err(e) = moved {
                failed.push(format!("shard {}: {}", shard.shard_id, e.message()));
            }
        }
        self.refresh_routes().await?;
        if !failed.is_empty() {
            return Err(format!(
                "leadership not moved to node {node}: {}",
                failed.join("; ")
            ));
        }
        self.shards_led_by(index)
            .await
            .ok_or_else(|| "the placement could not be read".to_owned())
    }

    /// How many shards the node of endpoint `index` leads, and of how many,
    /// read from the admin API now.
    pub async fn shards_led_by(&self, index: usize) -> Option<(usize, usize)> {
        self.refresh_routes().await.ok()?;
        let routes = self.inner.routes.read().unwrap_or_else(|e| e.into_inner());
        let led = routes
            .shard_endpoint
            .values()
            .filter(|&&i| i == index)
            .count();
        Some((led, routes.shards))
    }

    pub async fn counters(&self) -> ServerCounters {
        let mut counters = ServerCounters::default();
        for admin in &self.inner.admin {
            if let Ok(r) = admin
                .clone()
                .list_shards(ListShardsRequest::default())
                .await
            {
                let entries = r
                    .into_inner()
                    .shards
                    .iter()
                    .map(|s| {
                        s.replicas
                            .iter()
                            .map(|r| r.applied_index)
                            .max()
                            .unwrap_or(0)
                    })
                    .sum();
                counters.raft_entries = Some(entries);
                break;
            }
        }
        counters
            .scrape_fsyncs(&self.inner.metrics_urls, FSYNC_METRIC)
            .await;
        counters
    }
}
