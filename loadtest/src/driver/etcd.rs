//! etcd through its v3 gRPC API, used the way etcd users take locks.
//!
//! * acquire, no wait: `LeaseGrant(ttl)`, then a `Txn` that puts the lock
//!   key with that lease only if the key does not exist (create revision
//!   0). If the key exists the lease is revoked in the background and the
//!   acquire is a conflict. A retried `Txn` reads the key in its failure
//!   branch and recognises its own lease, so an unknown outcome is resolved
//!   without taking the lock twice.
//! * acquire, waiting: `LeaseGrant`, then `v3lock.Lock(name, lease)`, etcd's
//!   server-side queue on a key prefix (granted in creation-revision
//!   order), under a gRPC deadline of the wait.
//! * renew: one `LeaseKeepAlive` message on a long-lived bidirectional
//!   stream (one stream per connection, shared by all leases on it).
//! * release: `LeaseRevoke`, which deletes the lock key with the lease.
//!
//! Requests go round-robin over the endpoints, as etcd's client balancer
//! does; members forward to the leader. The token of a grant is the
//! revision at which it was made (what etcd users fence with).
//!
//! Note for comparisons: etcd's keep-alive is answered by the leader from
//! memory and is not replicated through Raft (only periodic lease
//! checkpoints are, when enabled), whereas every fencelock renew is a
//! committed log entry.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, Mutex};
use tonic::transport::Channel;
use tonic::Code;

use super::fencelock::DOWN_FOR_MS;
use super::{
    channel, host_port, out_of_time, remaining, Backoff, Held, LeaseRef, ServerCounters,
    READY_TIMEOUT_MS,
};
use crate::error::BenchError;
use crate::outcome::{OpError, Outcome};

/// The generated etcd clients (our subset of etcd's API, `proto/etcdbench`).
pub mod pb {
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    pub mod v3lockpb {
        tonic::include_proto!("v3lockpb");
    }
}

use pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::etcdserverpb::kv_client::KvClient;
use pb::etcdserverpb::lease_client::LeaseClient;
use pb::etcdserverpb::maintenance_client::MaintenanceClient;
use pb::etcdserverpb::request_op::Request as Op;
use pb::etcdserverpb::response_op::Response as OpResponse;
use pb::etcdserverpb::{
    Compare, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest, RequestOp, StatusRequest, TxnRequest,
};
use pb::v3lockpb::lock_client::LockClient;
use pb::v3lockpb::LockRequest;

/// Key prefix of every lock the benchmark takes.
const KEY_PREFIX: &str = "/fencelock-bench/";
/// etcd's WAL fsync duration histogram: `_count` is the number of fsyncs.
pub const FSYNC_METRIC: &str = "etcd_disk_wal_fsync_duration_seconds";
/// Keep-alive requests queued per stream before callers wait.
const KEEPALIVE_QUEUE_DEPTH: usize = 4096;

/// etcd TTLs are whole seconds; round up so a lease never lasts less than
/// asked.
fn ttl_seconds(ttl_ms: u64) -> i64 {
    i64::try_from(ttl_ms.div_ceil(1000).max(1)).unwrap_or(i64::MAX)
}

fn key_of(resource: &str) -> Vec<u8> {
    format!("{KEY_PREFIX}{resource}").into_bytes()
}

/// One connection's clients.
#[derive(Clone)]
struct Conn {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    lock: LockClient<Channel>,
    maintenance: MaintenanceClient<Channel>,
    endpoint: String,
}

type KeepAliveReply = oneshot::Sender<Result<i64, OpError>>;

/// One long-lived keep-alive stream, shared by the leases routed to it.
struct KeepAliveStream {
    conn: Conn,
    /// Open stream: requests in, and a task matching replies by lease id.
    sender: Mutex<Option<mpsc::Sender<(i64, KeepAliveReply)>>>,
}

impl KeepAliveStream {
    /// The sender of a live stream, opening one if needed.
    async fn sender(&self) -> Result<mpsc::Sender<(i64, KeepAliveReply)>, OpError> {
        let mut slot = self.sender.lock().await;
        if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
            return Ok(tx.clone());
        }
        let (req_tx, req_rx) = mpsc::channel::<LeaseKeepAliveRequest>(KEEPALIVE_QUEUE_DEPTH);
        let mut lease = self.conn.lease.clone();
        let (tx, mut rx) = mpsc::channel::<(i64, KeepAliveReply)>(KEEPALIVE_QUEUE_DEPTH);
        tokio::spawn(async move {
            let mut pending: HashMap<i64, VecDeque<KeepAliveReply>> = HashMap::new();
            // etcd sends the stream's headers with its first answer, so the
            // first request must be on its way before the call can open.
            let Some((id, reply)) = rx.recv().await else {
                return;
            };
            if req_tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                return;
            }
            pending.entry(id).or_default().push_back(reply);
            let opened = lease
                .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(req_rx))
                .await;
            let mut replies = match opened {
                Ok(r) => r.into_inner(),
                Err(status) => {
                    let e = status_error(&status);
                    for reply in pending.drain().flat_map(|(_, q)| q) {
                        let _ = reply.send(Err(e.clone()));
                    }
                    return;
                }
            };
            loop {
                tokio::select! {
                    asked = rx.recv() => {
                        let Some((id, reply)) = asked else { break };
                        if req_tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                            let _ = reply.send(Err(OpError::new(Outcome::Unavailable, "keep-alive stream closed")));
                            break;
                        }
                        pending.entry(id).or_default().push_back(reply);
                    }
                    answer = replies.message() => {
                        match answer {
                            Ok(Some(r)) => {
                                if let Some(reply) = pending.get_mut(&r.id).and_then(VecDeque::pop_front) {
                                    let _ = reply.send(Ok(r.ttl));
                                }
                            }
                            Ok(None) => break,
                            Err(status) => {
                                let e = status_error(&status);
                                for reply in pending.drain().flat_map(|(_, q)| q) {
                                    let _ = reply.send(Err(e.clone()));
                                }
                                break;
                            }
                        }
                    }
                }
            }
            for reply in pending.drain().flat_map(|(_, q)| q) {
                let _ = reply.send(Err(OpError::new(
                    Outcome::Unknown,
                    "keep-alive stream ended before the answer",
                )));
            }
        });
        *slot = Some(tx.clone());
        Ok(tx)
    }
}

struct Inner {
    /// `conns` rounds of one connection per endpoint, in endpoint order.
    conns: Vec<Conn>,
    endpoint_count: usize,
    keepalive: Vec<KeepAliveStream>,
    round_robin: AtomicUsize,
    metrics_urls: Vec<String>,
    /// Per connection: until when (ms since `epoch`) its member counts as
    /// unreachable and is skipped.
    down_until_ms: Vec<AtomicU64>,
    epoch: Instant,
}

#[derive(Clone)]
pub struct EtcdDriver {
    inner: Arc<Inner>,
}

/// An etcd failure as an outcome: gRPC codes etcd uses for "no leader",
/// "leader changed", "request timed out" are retryable refusals.
fn status_error(status: &tonic::Status) -> OpError {
    let outcome = match status.code() {
        Code::DeadlineExceeded => Outcome::Timeout,
        Code::NotFound | Code::FailedPrecondition => Outcome::Conflict,
        Code::Unavailable | Code::ResourceExhausted | Code::Aborted => Outcome::Unavailable,
        _ => Outcome::Unknown,
    };
    OpError::new(
        outcome,
        format!("{:?}: {}", status.code(), status.message()),
    )
}

/// A failure to reach the member at all (as opposed to its refusal).
fn is_transport_error(status: &tonic::Status) -> bool {
    status.code() == Code::Unavailable && status.message().contains("transport")
        || status.message().contains("connect")
}

impl EtcdDriver {
    pub fn connect(
        endpoints: &[String],
        conns: usize,
        metrics_urls: Vec<String>,
    ) -> Result<EtcdDriver, BenchError> {
        if endpoints.is_empty() {
            return Err(BenchError::InvalidArgument("no endpoints".to_owned()));
        }
        let mut all = Vec::new();
        for _ in 0..conns.max(1) {
            for endpoint in endpoints {
                let ch = channel(endpoint)?;
                all.push(Conn {
                    kv: KvClient::new(ch.clone()),
                    lease: LeaseClient::new(ch.clone()),
                    lock: LockClient::new(ch.clone()),
                    maintenance: MaintenanceClient::new(ch),
                    endpoint: host_port(endpoint).to_owned(),
                });
            }
        }
        let keepalive = all
            .iter()
            .map(|c| KeepAliveStream {
                conn: c.clone(),
                sender: Mutex::new(None),
            })
            .collect();
        Ok(EtcdDriver {
            inner: Arc::new(Inner {
                conns: all,
                endpoint_count: endpoints.len(),
                keepalive,
                round_robin: AtomicUsize::new(0),
                metrics_urls,
                down_until_ms: (0..conns.max(1) * endpoints.len())
                    .map(|_| AtomicU64::new(0))
                    .collect(),
                epoch: Instant::now(),
            }),
        })
    }

    fn now_ms(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64
    }

    /// The next connection round-robin, skipping members found unreachable
    /// within the last [`DOWN_FOR_MS`] (as etcd's balancer does).
    fn conn(&self) -> (usize, Conn) {
        let n = self.inner.conns.len();
        let start = self.inner.round_robin.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let index = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.inner.down_until_ms[i].load(Ordering::Relaxed) <= now)
            .unwrap_or(start % n);
        (index, self.inner.conns[index].clone())
    }

    fn mark_down(&self, index: usize) {
        self.inner.down_until_ms[index].store(self.now_ms() + DOWN_FOR_MS, Ordering::Relaxed);
    }

    pub async fn wait_ready(&self) -> Result<(), BenchError> {
        let started = Instant::now();
        let mut last_error = String::new();
        while started.elapsed() < Duration::from_millis(READY_TIMEOUT_MS) {
            let mut led = 0;
            for conn in self.inner.conns.iter() {
                match conn.maintenance.clone().status(StatusRequest {}).await {
                    Ok(r) if r.get_ref().leader != 0 => led += 1,
                    Ok(_) => last_error = format!("{}: no leader", conn.endpoint),
                    Err(e) => last_error = format!("{}: {}", conn.endpoint, e.message()),
                }
            }
            if led == self.inner.conns.len() {
                let deadline = Instant::now() + Duration::from_secs(5);
                match self.acquire("bench/ready-probe", 1_000, 0, deadline).await {
                    Ok(held) => {
                        let _ = self.release(&held, deadline).await;
                        return Ok(());
                    }
                    Err(e) if e.outcome == Outcome::Conflict => return Ok(()),
                    Err(e) => last_error = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(BenchError::NotReady {
            waited_ms: READY_TIMEOUT_MS,
            last_error,
        })
    }

    /// Runs `attempt` on successive connections until it succeeds, fails
    /// for good, or `deadline` passes.
    async fn run<T, F, Fut>(&self, deadline: Instant, mut attempt: F) -> Result<T, OpError>
    where
        F: FnMut(Conn, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let mut backoff = Backoff::new();
        let mut last = None;
        loop {
            let Some(left) = remaining(deadline) else {
                return Err(out_of_time(last));
            };
            let (index, conn) = self.conn();
            match attempt(conn, left).await {
                Ok(v) => return Ok(v),
                Err(status) => {
                    let e = status_error(&status);
                    if is_transport_error(&status) {
                        self.mark_down(index);
                    }
                    match e.outcome {
                        Outcome::Unavailable | Outcome::Unknown
                            if status.code() != Code::Cancelled =>
                        {
                            last = Some(e);
                            if !backoff.wait(deadline).await {
                                return Err(out_of_time(last));
                            }
                        }
                        _ => return Err(e),
                    }
                }
            }
        }
    }

    async fn grant(&self, ttl_ms: u64, deadline: Instant) -> Result<i64, OpError> {
        let ttl = ttl_seconds(ttl_ms);
        let response = self
            .run(deadline, |mut conn, left| async move {
                conn.lease
                    .lease_grant(timed(LeaseGrantRequest { ttl, id: 0 }, left))
                    .await
                    .map(|r| r.into_inner())
            })
            .await?;
        if !response.error.is_empty() {
            return Err(OpError::new(Outcome::Unavailable, response.error));
        }
        Ok(response.id)
    }

    /// Revokes a lease nobody will use, without waiting.
    fn abandon(&self, lease_id: i64) {
        let driver = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            let _ = driver.revoke(lease_id, deadline).await;
        });
    }

    pub async fn acquire(
        &self,
        resource: &str,
        ttl_ms: u64,
        wait_ms: u64,
        deadline: Instant,
    ) -> Result<Held, OpError> {
        let lease_id = self.grant(ttl_ms, deadline).await?;
        let key = key_of(resource);
        let result = if wait_ms == 0 {
            self.create_if_absent(&key, lease_id, deadline).await
        } else {
            self.lock_waiting(&key, lease_id, wait_ms, deadline).await
        };
        match result {
            Ok(token) => Ok(Held {
                resource: resource.to_owned(),
                token,
                lease: LeaseRef::Etcd { lease_id },
            }),
            Err(e) => {
                self.abandon(lease_id);
                Err(e)
            }
        }
    }

    /// The put-if-absent transaction; returns the grant's revision.
    async fn create_if_absent(
        &self,
        key: &[u8],
        lease_id: i64,
        deadline: Instant,
    ) -> Result<i64, OpError> {
        let txn = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Create as i32,
                key: key.to_vec(),
                target_union: Some(TargetUnion::CreateRevision(0)),
            }],
            success: vec![RequestOp {
                request: Some(Op::RequestPut(PutRequest {
                    key: key.to_vec(),
                    value: Vec::new(),
                    lease: lease_id,
                })),
            }],
            failure: vec![RequestOp {
                request: Some(Op::RequestRange(RangeRequest {
                    key: key.to_vec(),
                    range_end: Vec::new(),
                    limit: 1,
                })),
            }],
        };
        let response = self
            .run(deadline, |mut conn, left| {
                let txn = txn.clone();
                async move { conn.kv.txn(timed(txn, left)).await.map(|r| r.into_inner()) }
            })
            .await?;
        let revision = response.header.as_ref().map_or(0, |h| h.revision);
        if response.succeeded {
            return Ok(revision);
        }
        // The key exists: ours (an earlier attempt of this acquire went
        // through) or someone else's.
        let holder = response.responses.iter().find_map(|r| match &r.response {
            Some(OpResponse::ResponseRange(range)) => range.kvs.first().cloned(),
            _ => None,
        });
        match holder {
            Some(kv) if kv.lease == lease_id => Ok(kv.create_revision),
            _ => Err(OpError::new(Outcome::Conflict, "lock key exists")),
        }
    }

    /// `v3lock.Lock` under a deadline of the wait; returns the revision.
    async fn lock_waiting(
        &self,
        key: &[u8],
        lease_id: i64,
        wait_ms: u64,
        deadline: Instant,
    ) -> Result<i64, OpError> {
        let wait = Duration::from_millis(wait_ms);
        let (_, mut conn) = self.conn();
        let request = LockRequest {
            name: key.to_vec(),
            lease: lease_id,
        };
        let left = remaining(deadline).unwrap_or_default().min(wait);
        match conn.lock.lock(timed(request, left)).await {
            Ok(r) => Ok(r.into_inner().header.map_or(0, |h| h.revision)),
            Err(s) if s.code() == Code::DeadlineExceeded => {
                Err(OpError::new(Outcome::Conflict, "waited in vain"))
            }
            Err(s) => Err(status_error(&s)),
        }
    }

    fn lease_id(held: &Held) -> Result<i64, OpError> {
        match held.lease {
            LeaseRef::Etcd { lease_id } => Ok(lease_id),
            LeaseRef::Fencelock { .. } => Err(OpError::new(Outcome::Unknown, "not an etcd lease")),
        }
    }

    pub async fn renew(&self, held: &Held, deadline: Instant) -> Result<(), OpError> {
        let lease_id = Self::lease_id(held)?;
        // A lease uses one stream while it works, so its keep-alives stay
        // in order; after a failure the next one (another endpoint), as
        // etcd's client reopens its stream elsewhere.
        let streams = self.inner.keepalive.len();
        let mut index = (lease_id as u64 % streams as u64) as usize;
        let mut backoff = Backoff::new();
        let mut last = None;
        loop {
            let Some(left) = remaining(deadline) else {
                return Err(out_of_time(last));
            };
            let stream = &self.inner.keepalive[index];
            let attempt = async {
                let tx = stream.sender().await?;
                let (reply_tx, reply_rx) = oneshot::channel();
                tx.send((lease_id, reply_tx))
                    .await
                    .map_err(|_| OpError::new(Outcome::Unavailable, "keep-alive stream closed"))?;
                reply_rx
                    .await
                    .map_err(|_| OpError::new(Outcome::Unknown, "keep-alive reply lost"))?
            };
            match tokio::time::timeout(left, attempt).await {
                Err(_) => return Err(out_of_time(last)),
                Ok(Ok(ttl)) if ttl > 0 => return Ok(()),
                Ok(Ok(_)) => return Err(OpError::new(Outcome::Conflict, "lease not found")),
                Ok(Err(e)) if matches!(e.outcome, Outcome::Unavailable | Outcome::Unknown) => {
                    last = Some(e);
                    index = (index + 1) % streams;
                    if !backoff.wait(deadline).await {
                        return Err(out_of_time(last));
                    }
                }
                Ok(Err(e)) => return Err(e),
            }
        }
    }

    async fn revoke(&self, lease_id: i64, deadline: Instant) -> Result<(), OpError> {
        self.run(deadline, |mut conn, left| async move {
            conn.lease
                .lease_revoke(timed(LeaseRevokeRequest { id: lease_id }, left))
                .await
                .map(|_| ())
        })
        .await
    }

    pub async fn release(&self, held: &Held, deadline: Instant) -> Result<(), OpError> {
        self.revoke(Self::lease_id(held)?, deadline).await
    }

    pub async fn busiest_leader(&self) -> Option<usize> {
        // The first connections are one per endpoint, in endpoint order.
        let endpoints = self.inner.endpoint_count;
        for (index, conn) in self.inner.conns.iter().take(endpoints).enumerate() {
            let status = conn
                .maintenance
                .clone()
                .status(StatusRequest {})
                .await
                .ok()?;
            let status = status.into_inner();
            if status.header.as_ref().map(|h| h.member_id) == Some(status.leader) {
                return Some(index);
            }
        }
        None
    }

    pub async fn counters(&self) -> ServerCounters {
        let mut counters = ServerCounters::default();
        // Each member's raft index is the cluster's log length; one
        // member's is enough.
        for conn in &self.inner.conns {
            if let Ok(r) = conn.maintenance.clone().status(StatusRequest {}).await {
                counters.raft_entries = Some(r.into_inner().raft_index);
                break;
            }
        }
        counters
            .scrape_fsyncs(&self.inner.metrics_urls, FSYNC_METRIC)
            .await;
        counters
    }
}

fn timed<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(30_000), 30);
        assert_eq!(ttl_seconds(1_500), 2);
        assert_eq!(ttl_seconds(1), 1);
    }
}
