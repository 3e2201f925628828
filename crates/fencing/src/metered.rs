//! Prometheus metrics for the protected side (feature `prometheus`).
//!
//! A stale-token rejection is the fencing mechanism doing its job: a holder
//! that was paused or cut off past its lease tried to write after a newer
//! holder did. Each one is worth seeing on a dashboard — a steady rate
//! means clients hold locks too close to their TTL or pause for long — but
//! the lock service cannot see them: they happen in the protected system.
//! [`Metered`] wraps any [`FenceStore`] and counts every outcome into
//! metrics the protected system's process exports next to its own.
//!
//! Names follow the lock service's (`fencelock_<subsystem>_<what>_total`);
//! labels come from a fixed set, never a resource name.

use std::future::Future;

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use crate::{FenceError, FenceStore, FencedValue};

/// Name of the counter of refused stale tokens.
pub const REJECTIONS_METRIC: &str = "fencelock_fencing_token_rejections_total";
/// Name of the counter of fenced calls by operation and outcome.
pub const CALLS_METRIC: &str = "fencelock_fencing_calls_total";

/// The metrics of one protected system (share one value among its stores).
#[derive(Clone, Debug)]
pub struct FenceMetrics {
    rejections: IntCounter,
    calls: IntCounterVec,
}

impl FenceMetrics {
    /// New, unregistered metrics.
    pub fn new() -> FenceMetrics {
        let rejections = IntCounter::with_opts(Opts::new(
            REJECTIONS_METRIC,
            "Writes and checks refused because their fencing token was lower than one \
             already accepted for the resource (a superseded holder tried to write).",
        ))
        .expect("constant metric options are valid");
        let calls = IntCounterVec::new(
            Opts::new(
                CALLS_METRIC,
                "Fenced calls by operation (write, check, read) and outcome (ok, stale, \
                 invalid, error).",
            ),
            &["op", "outcome"],
        )
        .expect("constant metric options are valid");
        FenceMetrics { rejections, calls }
    }

    /// Adds both metrics to `registry`. Fails if they are registered there
    /// already (register one [`FenceMetrics`] per registry).
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.rejections.clone()))?;
        registry.register(Box::new(self.calls.clone()))?;
        Ok(())
    }

    /// Stale-token rejections counted so far.
    pub fn rejections(&self) -> u64 {
        self.rejections.get()
    }

    /// Calls of `op` that ended with `outcome` (labels as in [`CALLS_METRIC`]).
    pub fn calls(&self, op: &str, outcome: &str) -> u64 {
        self.calls.with_label_values(&[op, outcome]).get()
    }

    fn observe<T>(&self, op: &'static str, result: &Result<T, FenceError>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(FenceError::StaleToken { .. }) => {
                self.rejections.inc();
                "stale"
            }
            Err(
                FenceError::InvalidToken { .. }
                | FenceError::InvalidResource { .. }
                | FenceError::ValueTooLarge { .. },
            ) => "invalid",
            Err(_) => "error",
        };
        self.calls.with_label_values(&[op, outcome]).inc();
    }
}

impl Default for FenceMetrics {
    fn default() -> Self {
        FenceMetrics::new()
    }
}

/// A [`FenceStore`] that counts every call's outcome into [`FenceMetrics`]
/// and otherwise behaves exactly as the store it wraps (it passes the same
/// conformance suite).
#[derive(Debug)]
pub struct Metered<S> {
    inner: S,
    metrics: FenceMetrics,
}

impl<S: FenceStore> Metered<S> {
    /// Wraps `inner`, counting into `metrics`.
    pub fn new(inner: S, metrics: FenceMetrics) -> Metered<S> {
        Metered { inner, metrics }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: FenceStore> FenceStore for Metered<S> {
    fn write(
        &self,
        resource: &str,
        token: i64,
        value: &[u8],
    ) -> impl Future<Output = Result<(), FenceError>> + Send {
        let call = self.inner.write(resource, token, value);
        async move {
            let result = call.await;
            self.metrics.observe("write", &result);
            result
        }
    }

    fn check_and_record(
        &self,
        resource: &str,
        token: i64,
    ) -> impl Future<Output = Result<(), FenceError>> + Send {
        let call = self.inner.check_and_record(resource, token);
        async move {
            let result = call.await;
            self.metrics.observe("check", &result);
            result
        }
    }

    fn read(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencedValue>, FenceError>> + Send {
        let call = self.inner.read(resource);
        async move {
            let result = call.await;
            self.metrics.observe("read", &result);
            result
        }
    }

    fn rejections(&self) -> u64 {
        self.inner.rejections()
    }
}
