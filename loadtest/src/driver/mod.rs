//! The systems under test, behind one interface: acquire, renew, release.
//!
//! Each backend behaves like a well-behaved production client of its
//! system: it routes as that system's own client library does, and retries
//! what its error contract says is safe to retry (a lost leader, no quorum,
//! an unknown outcome) until the operation's deadline, so a leader change
//! shows up as latency, and only an operation that could not be done in
//! time counts as a failure. What each backend maps onto which call is in
//! its module docs.

pub mod etcd;
pub mod fencelock;
pub mod http;

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::BenchError;
use crate::outcome::{OpError, Outcome};

/// How long one operation (retries included) may take before it counts as
/// a timeout; a waiting acquire gets its wait on top.
pub const DEFAULT_OP_TIMEOUT_MS: u64 = 10_000;
/// First pause before retrying a refusal; doubles up to the maximum.
const RETRY_BACKOFF_BASE_MS: u64 = 10;
const RETRY_BACKOFF_MAX_MS: u64 = 500;
/// How long a target may take to become ready (elect leaders).
pub const READY_TIMEOUT_MS: u64 = 60_000;

/// Which system a backend talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    Fencelock,
    Etcd,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Fencelock => "fencelock",
            TargetKind::Etcd => "etcd",
        }
    }
}

/// A held lease, as the backend needs it to renew and release.
#[derive(Clone, Debug)]
pub struct Held {
    pub resource: String,
    /// fencelock's fencing token; for etcd, the revision of the grant (what
    /// etcd users fence with).
    pub token: i64,
    pub lease: LeaseRef,
}

#[derive(Clone, Debug)]
pub enum LeaseRef {
    Fencelock { lease_id: Vec<u8> },
    Etcd { lease_id: i64 },
}

/// Counters a server exposes, read before and after a measured window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerCounters {
    /// Raft log entries applied, summed over every Raft group (fencelock:
    /// the leaders' applied indexes from the admin API; etcd: the members'
    /// raft index).
    pub raft_entries: Option<u64>,
    /// Synced (fsync'd) writes of the Raft log, summed over the nodes, when
    /// the system exposes them.
    pub log_fsyncs: Option<u64>,
    /// Seconds spent in those synced writes, summed over the nodes.
    pub log_fsync_s: Option<f64>,
}

impl ServerCounters {
    /// `later - self`, field by field, where both are known.
    pub fn delta(&self, later: &ServerCounters) -> ServerCounters {
        let d = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
        ServerCounters {
            raft_entries: d(self.raft_entries, later.raft_entries),
            log_fsyncs: d(self.log_fsyncs, later.log_fsyncs),
            log_fsync_s: self
                .log_fsync_s
                .zip(later.log_fsync_s)
                .map(|(a, b)| (b - a).max(0.0)),
        }
    }

    /// Reads the fsync histogram `metric` (its `_count` and `_sum`) from
    /// every node's metrics page into `log_fsyncs` and `log_fsync_s`.
    pub(crate) async fn scrape_fsyncs(&mut self, urls: &[String], metric: &str) {
        let (count_name, sum_name) = (format!("{metric}_count"), format!("{metric}_sum"));
        for url in urls {
            let Some(page) = http::get(url).await else {
                continue;
            };
            if let Some(count) = http::sum_metric(&page, &count_name) {
                *self.log_fsyncs.get_or_insert(0) += count as u64;
            }
            if let Some(sum) = http::sum_metric(&page, &sum_name) {
                *self.log_fsync_s.get_or_insert(0.0) += sum;
            }
        }
    }
}

/// One backend, chosen at start.
#[derive(Clone)]
pub enum Backend {
    Fencelock(fencelock::FencelockDriver),
    Etcd(etcd::EtcdDriver),
}

impl Backend {
    /// Connects to `endpoints` (`host:port`) with `conns` connections per
    /// endpoint. `metrics_urls` are scraped for fsync counters, if given.
    pub async fn connect(
        kind: TargetKind,
        endpoints: &[String],
        conns: usize,
        metrics_urls: Vec<String>,
    ) -> Result<Backend, BenchError> {
        Ok(match kind {
            TargetKind::Fencelock => Backend::Fencelock(
                fencelock::FencelockDriver::connect(endpoints, conns, metrics_urls).await?,
            ),
            TargetKind::Etcd => {
                Backend::Etcd(etcd::EtcdDriver::connect(endpoints, conns, metrics_urls)?)
            }
        })
    }

    pub fn kind(&self) -> TargetKind {
        match self {
            Backend::Fencelock(_) => TargetKind::Fencelock,
            Backend::Etcd(_) => TargetKind::Etcd,
        }
    }

    /// Waits until every shard (fencelock) or the cluster (etcd) has a
    /// leader and a first write succeeds.
    pub async fn wait_ready(&self) -> Result<(), BenchError> {
        match self {
            Backend::Fencelock(d) => d.wait_ready().await,
            Backend::Etcd(d) => d.wait_ready().await,
        }
    }

    /// Takes a lease on `resource`; waits up to `wait_ms` in its queue if
    /// it is held (0 = fail at once with a conflict).
    pub async fn acquire(
        &self,
        resource: &str,
        ttl_ms: u64,
        wait_ms: u64,
        op_timeout: Duration,
    ) -> Result<Held, OpError> {
        let deadline = Instant::now() + op_timeout + Duration::from_millis(wait_ms);
        match self {
            Backend::Fencelock(d) => d.acquire(resource, ttl_ms, wait_ms, deadline).await,
            Backend::Etcd(d) => d.acquire(resource, ttl_ms, wait_ms, deadline).await,
        }
    }

    pub async fn renew(&self, held: &Held, op_timeout: Duration) -> Result<(), OpError> {
        let deadline = Instant::now() + op_timeout;
        match self {
            Backend::Fencelock(d) => d.renew(held, deadline).await,
            Backend::Etcd(d) => d.renew(held, deadline).await,
        }
    }

    pub async fn release(&self, held: &Held, op_timeout: Duration) -> Result<(), OpError> {
        let deadline = Instant::now() + op_timeout;
        match self {
            Backend::Fencelock(d) => d.release(held, deadline).await,
            Backend::Etcd(d) => d.release(held, deadline).await,
        }
    }

    /// The index (in the endpoint list) of the node that leads the most
    /// Raft groups, if known.
    pub async fn busiest_leader(&self) -> Option<usize> {
        match self {
            Backend::Fencelock(d) => d.busiest_leader().await,
            Backend::Etcd(d) => d.busiest_leader().await,
        }
    }

    /// The index (in the endpoint list) of the node that leads the shard of
    /// `resource` (fencelock only; etcd has one group, see
    /// [`busiest_leader`](Self::busiest_leader)).
    pub async fn leader_of(&self, resource: &str) -> Option<usize> {
        match self {
            Backend::Fencelock(d) => d.leader_of(resource).await,
            Backend::Etcd(d) => d.busiest_leader().await,
        }
    }

    /// The server's counters now (best effort: unknown fields are `None`).
    pub async fn counters(&self) -> ServerCounters {
        match self {
            Backend::Fencelock(d) => d.counters().await,
            Backend::Etcd(d) => d.counters().await,
        }
    }
}

/// Exponential backoff between retries of one operation.
pub(crate) struct Backoff {
    next_ms: u64,
}

impl Backoff {
    pub fn new() -> Backoff {
        Backoff {
            next_ms: RETRY_BACKOFF_BASE_MS,
        }
    }

    /// Sleeps one step (never past `deadline`); false if the deadline has
    /// passed.
    pub async fn wait(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        // Jitter of up to half a step keeps retrying callers from marching
        // in lockstep after a leader change.
        let jitter = rand::random_range(0..=self.next_ms / 2);
        let step = Duration::from_millis(self.next_ms + jitter).min(deadline - now);
        self.next_ms = (self.next_ms * 2).min(RETRY_BACKOFF_MAX_MS);
        tokio::time::sleep(step).await;
        Instant::now() < deadline
    }
}

/// The outcome of an operation that ran out of time, given the last thing
/// that went wrong.
pub(crate) fn out_of_time(last: Option<OpError>) -> OpError {
    match last {
        Some(e) if e.outcome == Outcome::Unknown || e.outcome == Outcome::Unavailable => {
            OpError::new(
                e.outcome,
                format!("deadline passed; last error: {}", e.message),
            )
        }
        Some(e) => OpError::new(
            Outcome::Timeout,
            format!("deadline passed; last error: {}", e.message),
        ),
        None => OpError::new(Outcome::Timeout, "deadline passed"),
    }
}

/// The time left until `deadline`, or `None` when it has passed.
pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// `host:port` (or a URL) as an `http://` URL.
pub(crate) fn to_url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}

/// `http://host:port/...` or `host:port` → `host:port`.
pub(crate) fn host_port(endpoint: &str) -> &str {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// A lazily connecting channel to `endpoint`.
pub(crate) fn channel(endpoint: &str) -> Result<tonic::transport::Channel, BenchError> {
    let url = to_url(endpoint);
    let ep = tonic::transport::Endpoint::from_shared(url.clone()).map_err(|e| {
        BenchError::InvalidEndpoint {
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
        }
    })?;
    Ok(ep
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        // A dead node is noticed quickly in the capacity scenario.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(3))
        .connect_lazy())
}
