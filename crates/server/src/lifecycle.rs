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

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use fencelock_controller::handoff::LedShard;

use crate::ops::Ops;
use crate::store::ShardStatus;

/// The gRPC services whose health is reported, besides the node as a whole
/// (the empty service name).
pub const HEALTH_SERVICES: &[&str] = &["fencelock.v1.LockService", "fencelock.v1.AdminService"];

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
/// serving ([`fencelock_controller::handoff`]). Returns the shards still
/// led here when it stops (at `deadline`, or when no other voter serves).
pub async fn move_leaderships_away(
    node_id: u64,
    status: &Mutex<Vec<ShardStatus>>,
    ops: &Ops,
    deadline: Instant,
) -> Vec<u64> {
    let led_here = || -> Vec<LedShard> {
        status
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|r| r.leader_id == node_id)
                    .map(|r| LedShard {
                        shard_id: r.shard_id,
                        voters: r.voters.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    fencelock_controller::handoff::move_leaderships_away(node_id, led_here, ops, deadline).await
}

/// The shared handle the service and node keep.
pub type SharedLifecycle = Arc<Lifecycle>;
