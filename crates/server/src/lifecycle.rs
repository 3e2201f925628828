//! The node's lifecycle: serving, draining, stopped.
//!
//! This module owns what clients and orchestrators see of it: the gRPC
//! health status (`grpc.health.v1.Health`, per node), the count of client
//! requests in flight, and the graceful-shutdown sequence that
//! [`Node::shutdown_gracefully`](crate::node::Node::shutdown_gracefully)
//! runs on SIGTERM:
//!
//! 1. **stop accepting**: health turns NOT_SERVING, so load balancers and
//!    health-checking clients stop sending new work here;
//! 2. **transfer leaderships away**: every shard this node leads hands
//!    leadership to another voter, so the shards never wait out an election
//!    timeout for a leader that is gone (requests keep being served or
//!    forwarded meanwhile);
//! 3. **drain**: new client requests are refused with a hint to the shard's
//!    new leader (NOT_LEADER) or SHUTTING_DOWN, both retriable, and the node
//!    waits for the requests already in flight;
//! 4. **flush and exit**: the gRPC server, peer transport and store loop
//!    stop; the store writes its deferred state synchronously before
//!    RocksDB closes, and the audit writer flushes.
//!
//! Every step is bounded by `shutdown.drain_timeout_ms`; a step that runs
//! out of time is logged and the sequence goes on, because an orchestrator
//! will kill a process that does not exit.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::ops::Ops;
use crate::router::Router;
use crate::store::ShardStatus;

/// The gRPC services whose health is reported, besides the node as a whole
/// (the empty service name).
pub const HEALTH_SERVICES: &[&str] = &["fencelock.v1.LockService", "fencelock.v1.AdminService"];

/// One leadership transfer may take this long before the next voter is
/// tried: a transfer completes within an election timeout or not at all.
const TRANSFER_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a peer's health check may take before it counts as not serving.
const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between rounds of handovers: longer than a Raft tick at the
/// slowest allowed setting would be wasteful; this covers the default.
const STATUS_SETTLE: Duration = Duration::from_millis(200);

/// See the module docs.
pub struct Lifecycle {
    health: HealthReporter,
    in_flight: AtomicUsize,
    /// Set by [`Lifecycle::refuse_new`]: the service turns requests away.
    refusing: AtomicBool,
    /// Set by [`Lifecycle::stop_accepting`].
    draining: AtomicBool,
    idle: Notify,
}

/// Counts one client request while it lives.
pub struct InFlight<'a>(&'a Lifecycle);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Lifecycle {
    pub fn new(health: HealthReporter) -> Lifecycle {
        Lifecycle {
            health,
            in_flight: AtomicUsize::new(0),
            refusing: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            idle: Notify::new(),
        }
    }

    async fn set_health(&self, status: ServingStatus) {
        self.health.set_service_status("", status).await;
        for service in HEALTH_SERVICES {
            self.health.set_service_status(*service, status).await;
        }
    }

    /// Reports NOT_SERVING while the node starts (the reporter's own
    /// default is SERVING).
    pub async fn set_starting(&self) {
        self.set_health(ServingStatus::NotServing).await;
    }

    /// Reports SERVING (the node is up and its gRPC server listens).
    pub async fn serving(&self) {
        self.set_health(ServingStatus::Serving).await;
    }

    /// Step 1: health NOT_SERVING.
    pub async fn stop_accepting(&self) {
        self.draining.store(true, Ordering::Release);
        self.set_health(ServingStatus::NotServing).await;
    }

    /// Step 3: new client requests are refused from now on.
    pub fn refuse_new(&self) {
        self.refusing.store(true, Ordering::Release);
    }

    pub fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Counts a request until the guard drops.
    pub fn enter(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self)
    }

    /// Waits until no request is in flight, or `deadline`. Returns whether
    /// the node went idle.
    pub async fn wait_idle(&self, deadline: Instant) -> bool {
        loop {
            // Register before checking, so a drop in between still wakes us.
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }
}

/// Step 2: hands every shard this node leads to another voter that is
/// serving. Returns the shards still led here when it stops: at `deadline`,
/// or at once when no other voter serves (the whole cluster is stopping, or
/// the shard has a single replica), since waiting could not help.
pub async fn move_leaderships_away(
    node_id: u64,
    status: &Mutex<Vec<ShardStatus>>,
    ops: &Ops,
    router: &Router,
    deadline: Instant,
) -> Vec<u64> {
    let led_here = || -> Vec<ShardStatus> {
        status
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|r| r.leader_id == node_id)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    loop {
        let led = led_here();
        if led.is_empty() || Instant::now() >= deadline {
            return led.iter().map(|r| r.shard_id).collect();
        }
        let candidates: BTreeSet<u64> = led
            .iter()
            .flat_map(|r| r.voters.iter().copied())
            .filter(|v| *v != node_id)
            .collect();
        let checks = candidates
            .iter()
            .map(|n| async move { (*n, serving(router, ops.peer_tls(), *n).await) });
        let serving_nodes: BTreeSet<u64> = crate::ops::join_all(checks)
            .await
            .into_iter()
            .filter_map(|(n, ok)| ok.then_some(n))
            .collect();
        let plans: Vec<(u64, Vec<u64>)> = led
            .iter()
            .filter_map(|r| {
                // Spread the shards over the other serving voters (by shard
                // id), then fall back to the rest in order.
                let mut to: Vec<u64> = r
                    .voters
                    .iter()
                    .copied()
                    .filter(|v| serving_nodes.contains(v))
                    .collect();
                if to.is_empty() {
                    return None;
                }
                let first = (r.shard_id as usize) % to.len();
                to.rotate_left(first);
                Some((r.shard_id, to))
            })
            .collect();
        if plans.is_empty() {
            return led.iter().map(|r| r.shard_id).collect();
        }
        let moves = plans.iter().map(|(shard_id, targets)| async move {
            for &to in targets {
                let attempt = ops.transfer_leader(*shard_id, to);
                match tokio::time::timeout(TRANSFER_ATTEMPT_TIMEOUT, attempt).await {
                    Ok(Ok(_)) => {
                        tracing::info!(shard_id, to, "leadership handed over");
                        return;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(shard_id, to, "leader transfer failed: {}", e.message())
                    }
                    Err(_) => tracing::warn!(shard_id, to, "leader transfer timed out"),
                }
                if Instant::now() >= deadline {
                    return;
                }
            }
        });
        let all = crate::ops::join_all(moves);
        let _ = tokio::time::timeout_at(deadline, all).await;
        // This node publishes its status once per Raft tick: give the
        // handovers time to show before looking again.
        tokio::time::sleep(STATUS_SETTLE).await;
    }
}

/// Whether node `node_id` reports SERVING on its gRPC health service (a
/// node that is itself draining, or does not answer in time, does not).
async fn serving(router: &Router, tls: &crate::security::PeerTls, node_id: u64) -> bool {
    use tonic_health::pb::health_check_response::ServingStatus as Wire;
    use tonic_health::pb::health_client::HealthClient;
    let Some(addr) = router.node_addr(node_id) else {
        return false;
    };
    let Ok(endpoint) = tls.endpoint(&addr) else {
        return false;
    };
    let check = async {
        let channel = endpoint.connect().await.ok()?;
        let reply = HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .ok()?;
        Some(reply.into_inner().status() == Wire::Serving)
    };
    matches!(
        tokio::time::timeout(HEALTH_CHECK_TIMEOUT, check).await,
        Ok(Some(true))
    )
}

/// The shared handle the service and node keep.
pub type SharedLifecycle = Arc<Lifecycle>;
