//! The node's Prometheus metrics.
//!
//! This module owns the node's metric registry and every metric in it. Names
//! follow `fencelock_<subsystem>_<what>_<unit>` (base units: seconds;
//! counters end in `_total`). No label ever carries a resource name: label
//! values come from small fixed sets (operation, outcome, shard id); the
//! hottest resources are an admin call (`fencelock admin hot`) instead.
//!
//! One registry per node, not the process-global default: the in-process
//! cluster tests run three nodes in one process.
//!
//! Three kinds of sources, each as cheap as its path needs:
//! * the request path ([`RequestMetrics`]) updates counters and histograms
//!   resolved once at start: a few atomic adds per request, no label lookup;
//! * the store loop owns thread-local copies ([`StoreMetrics`]) and flushes
//!   them once per Raft tick, so the hot loop touches no shared memory for
//!   a metric;
//! * gauges that describe state (per-shard locks, waiters, leadership,
//!   queue depths, transport counters) are read at scrape time from what the
//!   node already publishes ([`NodeSnapshot`], [`Metrics::render`]).
//!
//! * [`requests`] — the request path's counters and histograms;
//! * [`state`] — the scrape-time gauges and [`NodeSnapshot`];
//! * [`controller`] — the controller's own moves;
//! * the store loop's metrics are `fencelock-multiraft`'s ([`StoreMetrics`]);
//! * here: the registry, the build info and the connection refusals.

mod controller;
mod requests;
mod state;

use std::sync::Mutex;

use prometheus::{Encoder, IntCounter, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

pub use controller::ControllerMetrics;
pub use requests::{Op, Outcome, RequestMetrics, RequestTimer};
use state::StateGauges;
pub use state::{resident_bytes, NodeSnapshot};

use crate::security::conn::Refusal;
pub use crate::store::metrics::StoreMetrics;
use crate::store::metrics::{counter_vec, StoreHandles};

/// The node's registry and every metric handle; see the module docs.
pub struct Metrics {
    registry: Registry,
    pub requests: RequestMetrics,
    store: StoreHandles,
    state: StateGauges,
    /// Connections the gRPC port closed unserved, in `Refusal::ALL` order.
    connections_refused: [IntCounter; 3],
    /// The controller's own moves, as this node made them while leading
    /// the meta shard.
    pub controller: ControllerMetrics,
    /// Scrapes rebuild the per-shard gauges and advance the mirrored
    /// counters; one at a time, so two scrapes never interleave the two.
    scrape: Mutex<()>,
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("unique name");
    g
}

/// A count or size as an integer gauge's value (Prometheus gauges are
/// signed): saturates instead of wrapping to a negative number.
fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn shard_gauge(registry: &Registry, name: &str, help: &str) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), &["shard"]).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("unique name");
    g
}

impl Metrics {
    /// A registry with every metric of node `node_id` (a constant `node`
    /// label, so metrics of several nodes can be told apart even when a
    /// scraper does not add an instance label).
    pub fn new(node_id: u64) -> Metrics {
        let registry = Registry::new_custom(
            None,
            Some(std::iter::once(("node".to_owned(), node_id.to_string())).collect()),
        )
        .expect("valid registry");
        let r = &registry;

        let requests = RequestMetrics::register(r);
        let store = StoreHandles::register(r);
        let state = StateGauges::register(r);
        let info = IntGaugeVec::new(
            Opts::new(
                "fencelock_build_info",
                "Always 1; the `version` label is the running binary's version.",
            ),
            &["version"],
        )
        .expect("valid gauge");
        r.register(Box::new(info.clone())).expect("unique name");
        info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);

        let refused_vec = counter_vec(
            r,
            "fencelock_connections_refused_total",
            "Connections the gRPC port closed before serving a call, by reason: max_connections, per_source (edge.max_connections_per_source), handshake_timeout.",
            &["reason"],
        );
        let connections_refused =
            Refusal::ALL.map(|why| refused_vec.with_label_values(&[why.label()]));

        let controller = ControllerMetrics::register(r);

        Metrics {
            registry,
            requests,
            store,
            state,
            connections_refused,
            controller,
            scrape: Mutex::new(()),
        }
    }

    /// The counters of the gRPC port's connection refusals, for
    /// `security::conn::Refusals`.
    pub fn connection_refusals(&self) -> [IntCounter; 3] {
        self.connections_refused.clone()
    }

    /// Thread-local accumulators for the store loop.
    pub fn store_locals(&self) -> StoreMetrics {
        self.store.locals()
    }

    /// The Prometheus text exposition of every metric, with the state
    /// gauges taken from `snapshot`.
    pub fn render(&self, snapshot: &NodeSnapshot) -> String {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        self.state.refresh(snapshot);
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding of valid metrics");
        String::from_utf8(out).expect("text exposition is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ShardStatus;
    use fencelock_api::v1::Reason;

    #[test]
    fn every_reason_has_an_outcome_class_and_names_follow_the_convention() {
        let m = Metrics::new(1);
        let text = m.render(&NodeSnapshot {
            shards: vec![ShardStatus {
                shard_id: 3,
                is_leader: true,
                held: 7,
                dedup_entries: 11,
                snapshot_bytes: 4096,
                ..Default::default()
            }],
            engine_memory: fencelock_storage::EngineMemory {
                memtable_bytes: 1 << 20,
                ..Default::default()
            },
            resident_bytes: 5 << 20,
            ..Default::default()
        });
        for line in [
            "fencelock_shard_locks_held{shard=\"3\",node=\"1\"} 7",
            "fencelock_shard_dedup_entries{shard=\"3\",node=\"1\"} 11",
            "fencelock_shard_snapshot_bytes{shard=\"3\",node=\"1\"} 4096",
            "fencelock_storage_memtable_bytes{node=\"1\"} 1048576",
            "fencelock_process_resident_memory_bytes{node=\"1\"} 5242880",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut parts = line.split_whitespace().skip(2);
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(name.starts_with("fencelock_"), "{name}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{name}");
            } else {
                assert!(!name.ends_with("_total"), "{name}");
            }
        }
        // Every reason maps somewhere (the match is exhaustive) and the
        // retriable ones are not reported as conflicts.
        assert_eq!(Outcome::of_reason(Reason::NotLeader), Outcome::Unavailable);
        assert_eq!(Outcome::of_reason(Reason::LockHeld), Outcome::Conflict);
        assert_eq!(Outcome::of_reason(Reason::OutcomeUnknown), Outcome::Unknown);
    }

    #[test]
    fn an_abandoned_request_counts_as_cancelled() {
        let m = Metrics::new(1);
        drop(m.requests.start(Op::Acquire));
        m.requests.start(Op::Renew).finish(Outcome::Ok);
        let text = m.render(&NodeSnapshot::default());
        assert!(text.contains(
            "fencelock_service_requests_total{op=\"acquire\",outcome=\"cancelled\",node=\"1\"} 1"
        ));
        assert!(text.contains(
            "fencelock_service_requests_total{op=\"renew\",outcome=\"ok\",node=\"1\"} 1"
        ));
    }
}
