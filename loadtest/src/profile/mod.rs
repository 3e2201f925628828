//! The workloads. Each profile drives a [`Backend`] through a
//! [`RunContext`] and leaves its measurements in the context's
//! [`Recorder`]; what a profile learns beyond latencies and outcomes (FIFO
//! order, the saturation steps, the capacity events) comes back as
//! [`ProfileFindings`].

pub mod contended;
pub mod failover;
pub mod saturate;
pub mod seed;
pub mod slow_disk;
pub mod watch;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::driver::Backend;
use crate::stats::Recorder;

/// Requests in flight at once before new ones wait for a slot (their
/// latency still counts from their due time). Bounds the harness's memory
/// when a target stalls.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 8_192;
/// Tenant of every benchmark resource name.
pub const TENANT: &str = "bench";

/// The profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ProfileKind {
    /// The brief's steady state: 100,000 resources, 20,000 held, 2,000
    /// acquires, renews and releases per second.
    Seed,
    /// A few hot resources, each with a queue of waiting callers.
    Contended,
    /// Raise the rate step by step until acquire p99 passes a bound.
    Saturate,
    /// `seed` with one replica killed, log compaction, and its return.
    Capacity,
    /// fencelock only: ~1,000 watchers of a few busy resources; delivery
    /// latency, and lock throughput with and without them.
    Watch,
    /// fencelock only: elections whose leader crashes, and whose shard's
    /// leader node is killed; time until the next leader is seen.
    Failover,
    /// fencelock only: `seed` with every shard led by one node, healthy,
    /// then with that node's syncs slowed (200 ms each).
    SlowDisk,
}

impl ProfileKind {
    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Seed => "seed",
            ProfileKind::Contended => "contended",
            ProfileKind::Saturate => "saturate",
            ProfileKind::Capacity => "capacity",
            ProfileKind::Watch => "watch",
            ProfileKind::Failover => "failover",
            ProfileKind::SlowDisk => "slow-disk",
        }
    }

    /// Profiles of APIs etcd has no counterpart of in the harness (watch
    /// streams of one lock's grants and releases, elections on a fenced
    /// lock), and the slow disk (etcd, a Go program, syncs without libc,
    /// where the disk-fault layer cannot reach): run against fencelock
    /// only.
    pub fn fencelock_only(self) -> bool {
        matches!(
            self,
            ProfileKind::Watch | ProfileKind::Failover | ProfileKind::SlowDisk
        )
    }

    /// Profiles that kill a node or slow its disk: they need a local
    /// cluster of this run's processes.
    pub fn needs_local_cluster(self) -> bool {
        matches!(self, ProfileKind::Capacity | ProfileKind::SlowDisk)
    }
}

/// What every profile needs.
#[derive(Clone)]
pub struct RunContext {
    pub backend: Backend,
    /// The target's client endpoints (`host:port`), for profiles that use
    /// the Rust client.
    pub endpoints: Vec<String>,
    pub recorder: Arc<Recorder>,
    /// Deadline of one operation, retries included.
    pub op_timeout: Duration,
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// Print a progress line while running.
    pub progress: bool,
    /// CPU seconds the target's nodes have used so far, summed (`None`:
    /// the nodes are not this run's processes). For figures per step.
    pub server_cpu_s: Option<Arc<dyn Fn() -> f64 + Send + Sync>>,
}

impl RunContext {
    /// The target's CPU seconds now, if known.
    pub fn server_cpu_now(&self) -> Option<f64> {
        self.server_cpu_s.as_ref().map(|f| f())
    }

    pub fn new(
        backend: Backend,
        endpoints: Vec<String>,
        op_timeout: Duration,
        max_in_flight: usize,
    ) -> RunContext {
        RunContext {
            backend,
            endpoints,
            recorder: Arc::new(Recorder::new()),
            op_timeout,
            in_flight: Arc::new(tokio::sync::Semaphore::new(max_in_flight.max(1))),
            progress: false,
            server_cpu_s: None,
        }
    }
}

/// What a profile found besides latencies and outcome counts.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "profile", rename_all = "snake_case")]
pub enum ProfileFindings {
    Seed(seed::SeedFindings),
    Contended(contended::ContendedFindings),
    Saturate(saturate::SaturateFindings),
    Watch(watch::WatchFindings),
    Failover(failover::FailoverFindings),
    SlowDisk(slow_disk::SlowDiskFindings),
}

/// Resources not held by the benchmark, to pick uncontended acquires from.
pub(crate) struct FreeSet {
    free: Mutex<Vec<u32>>,
}

impl FreeSet {
    pub fn new(count: u32) -> FreeSet {
        FreeSet {
            free: Mutex::new((0..count).collect()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A random free resource, now taken; `None` if all are taken.
    pub fn take(&self) -> Option<u32> {
        let mut free = self.lock();
        if free.is_empty() {
            return None;
        }
        let i = rand::random_range(0..free.len());
        Some(free.swap_remove(i))
    }

    pub fn put_back(&self, index: u32) {
        self.lock().push(index);
    }
}

/// The name of benchmark resource `index` in `space` (a profile's own
/// namespace, so profiles never meet each other's leftovers).
pub fn resource_name(space: &str, index: u32) -> String {
    format!("{TENANT}/{space}/r{index:06}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_set_hands_out_each_resource_once() {
        let set = FreeSet::new(3);
        let mut taken: Vec<u32> = (0..3).map(|_| set.take().unwrap()).collect();
        assert_eq!(set.take(), None);
        taken.sort_unstable();
        assert_eq!(taken, vec![0, 1, 2]);
        set.put_back(1);
        assert_eq!(set.take(), Some(1));
    }

    #[test]
    fn resource_names_are_valid_fencelock_names() {
        let name = resource_name("seed", 42);
        assert_eq!(name, "bench/seed/r000042");
        fencelock_statemachine::ResourceName::parse(&name).unwrap();
    }
}
