//! The keeper: one background task per client that renews every held lease
//! at about a third of its TTL, in `RenewBatch` calls grouped by the node
//! each lease's shard is routed to, and declares a lease lost when its
//! stop-by deadline passes unconfirmed.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{renew_result, Reason, RenewBatchRequest, RenewRequest, RenewResponse};
use tokio::sync::{oneshot, Notify};

use crate::client::Inner;
use crate::config::MAX_RENEW_BATCH;
use crate::error::LostReason;
use crate::lease::{jittered_renew_interval, renew_backoff, LeaseEntry};
use crate::retry::{classify, classify_detail, Advice, Failure};

/// How long the keeper sleeps with no lease due (it is woken early when a
/// lease is added).
const IDLE_WAKE: Duration = Duration::from_secs(60);

/// Shortest sleep between two passes, so that a burst of wake-ups does not
/// make the keeper scan its leases in a tight loop. Small next to any TTL
/// (at least a second): a lease is declared lost this late at worst, and
/// [`LockGuard::lost`](crate::LockGuard::lost) has its own exact timer.
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(5);

/// Slowest attempt of a renewal, as a fraction of the shortest TTL in the
/// batch: a hung node must not eat the time of the retries.
const RENEW_ATTEMPT_TTL_DIVISOR: u32 = 3;

/// Runs until the client and all its guards are gone.
pub(crate) async fn run(inner: Weak<Inner>, wake: Arc<Notify>, mut stop: oneshot::Receiver<()>) {
    loop {
        let next_pass = {
            // Hold the client only during a pass, so dropping the last
            // client and guard ends the keeper.
            let Some(inner) = inner.upgrade() else {
                return;
            };
            pass(&inner, Instant::now())
        };
        let next_pass = next_pass.max(Instant::now() + MIN_PASS_INTERVAL);
        tokio::select! {
            _ = &mut stop => return,
            () = wake.notified() => {}
            () = tokio::time::sleep_until(next_pass.into()) => {}
        }
    }
}

/// Declares overdue leases lost, sends the renewals that are due, and
/// returns when the next pass is needed.
fn pass(inner: &Arc<Inner>, now: Instant) -> Instant {
    let leases: Vec<Arc<LeaseEntry>> = inner.leases().values().cloned().collect();
    let mut next = now + IDLE_WAKE;
    let mut due: HashMap<String, Vec<Arc<LeaseEntry>>> = HashMap::new();
    for lease in leases {
        if !lease.is_held() {
            continue;
        }
        let mut timing = lease.timing();
        if now >= timing.stop_by {
            drop(timing);
            inner.lose(&lease, LostReason::Unconfirmed);
            continue;
        }
        next = next.min(timing.stop_by);
        if timing.in_flight || !timing.renewable {
            continue;
        }
        // Wake for the due time, but take along every lease already
        // eligible then: that is what fills the batches.
        if now < timing.eligible_at() {
            next = next.min(timing.due_at());
            continue;
        }
        timing.in_flight = true;
        drop(timing);
        let url = inner.router.target_for_shard(lease.shard_id);
        due.entry(url).or_default().push(lease);
    }
    for (url, leases) in due {
        for chunk in leases.chunks(MAX_RENEW_BATCH) {
            tokio::spawn(renew_batch(inner.clone(), url.clone(), chunk.to_vec()));
        }
    }
    next
}

/// Renews `leases` with one `RenewBatch` call to `url` and records each
/// outcome.
async fn renew_batch(inner: Arc<Inner>, url: String, leases: Vec<Arc<LeaseEntry>>) {
    let items: Vec<RenewRequest> = leases
        .iter()
        .map(|lease| RenewRequest {
            resource: lease.resource.clone(),
            lease_id: lease.lease_id.clone(),
            lease_ttl_ms: 0,
        })
        .collect();
    let shortest_ttl_ms = leases
        .iter()
        .map(|lease| lease.timing().lease_ttl_ms)
        .min()
        .unwrap_or(0);
    let attempt_timeout = inner
        .config()
        .attempt_timeout()
        .min(Duration::from_millis(shortest_ttl_ms) / RENEW_ATTEMPT_TTL_DIVISOR)
        .max(Duration::from_millis(1));
    inner
        .stats
        .renew_batch_calls
        .fetch_add(1, Ordering::Relaxed);

    let outcome = match inner.router.channel(&url) {
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
        Ok(channel) => {
            let mut request = tonic::Request::new(RenewBatchRequest { items });
            request.set_timeout(attempt_timeout);
            let sent_at = Instant::now();
            let mut client = LockServiceClient::new(channel);
            let call = client.renew_batch(request);
            match tokio::time::timeout(attempt_timeout, call).await {
                Ok(Ok(response)) => Ok((sent_at, response.into_inner().results)),
                Ok(Err(status)) => Err(status),
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "no renewal answer from {url} within {} ms",
                    attempt_timeout.as_millis()
                ))),
            }
        }
    };
    match outcome {
        Ok((sent_at, results)) if results.len() == leases.len() => {
            for (lease, result) in leases.iter().zip(results) {
                match result.outcome {
                    Some(renew_result::Outcome::Renewed(renewed)) => {
                        renew_succeeded(&inner, lease, sent_at, &renewed, &url)
                    }
                    Some(renew_result::Outcome::Error(detail)) => {
                        let code = detail.code();
                        renew_failed(&inner, lease, classify_detail(detail, code), &url);
                    }
                    None => renew_failed(
                        &inner,
                        lease,
                        classify(&tonic::Status::internal("renew result without an outcome")),
                        &url,
                    ),
                }
            }
        }
        Ok((_, results)) => {
            let status = tonic::Status::internal(format!(
                "{} renew results for {} items",
                results.len(),
                leases.len()
            ));
            for lease in &leases {
                renew_failed(&inner, lease, classify(&status), &url);
            }
        }
        Err(status) => {
            let failure = classify(&status);
            for lease in &leases {
                renew_failed(&inner, lease, failure.clone(), &url);
            }
        }
    }
    inner.keeper_wake.notify_one();
}

/// A confirmed renewal: the stop-by deadline restarts from when it was sent.
fn renew_succeeded(
    inner: &Inner,
    lease: &LeaseEntry,
    sent_at: Instant,
    renewed: &RenewResponse,
    url: &str,
) {
    inner.stats.renewed_items.fetch_add(1, Ordering::Relaxed);
    inner
        .router
        .learn(Some(&lease.resource), lease.shard_id, url);
    let mut timing = lease.timing();
    timing.in_flight = false;
    if !lease.is_held() {
        // Lost is final: a renewal answered after the deadline passed does
        // not move the deadline the application was told.
        return;
    }
    timing.retry_at = None;
    // The deadline counts the time this answer granted, whatever was asked
    // for: near the hold limit it is less than the lease's TTL.
    let granted_ms = renewed.lease_ttl_ms;
    let stop_by =
        sent_at + Duration::from_millis(granted_ms) - inner.config().stop_by_margin(granted_ms);
    timing.stop_by = timing.stop_by.max(stop_by);
    // The renew cadence follows the granted time too (0 would mean renewing
    // without pause: keep the previous cadence; the deadline stays put).
    if granted_ms > 0 {
        timing.lease_ttl_ms = granted_ms;
    }
    let ttl_ms = timing.lease_ttl_ms;
    timing.backoff = renew_backoff(inner, ttl_ms);
    timing.expires_at_ms = timing.expires_at_ms.max(renewed.expires_at_ms);
    timing.next_renew_at = sent_at + jittered_renew_interval(ttl_ms);
    let (stop_by, expires_at_ms) = (timing.stop_by, timing.expires_at_ms);
    drop(timing);
    lease.publish_held(stop_by, expires_at_ms);
}

/// A renewal that failed: lost for good on LEASE_NOT_HELD, no more tries on
/// another definitive refusal, otherwise a retry (rerouted as the error
/// says) before the stop-by deadline.
fn renew_failed(inner: &Inner, lease: &LeaseEntry, failure: Failure, url: &str) {
    inner.stats.renew_failures.fetch_add(1, Ordering::Relaxed);
    let reason = failure.detail.as_ref().map(|d| d.reason());
    let mut timing = lease.timing();
    timing.in_flight = false;
    if reason == Some(Reason::LeaseNotHeld) {
        drop(timing);
        inner.lose(lease, LostReason::NotHeld);
        return;
    }
    if failure.advice == Advice::Fail {
        // HOLD_LIMIT_REACHED and the like: the lease is good until its
        // stop-by deadline and cannot be extended.
        timing.renewable = false;
        drop(timing);
        tracing::warn!(
            resource = %lease.resource,
            error = %failure.summary,
            "the lease cannot be renewed; it will count as lost at its stop-by deadline"
        );
        return;
    }
    let delay = timing.backoff.delay(failure.advice);
    timing.retry_at = Some(Instant::now() + delay);
    drop(timing);
    let shard = failure
        .detail
        .as_ref()
        .map(|d| d.shard_id)
        .filter(|&s| s != 0)
        .unwrap_or(lease.shard_id);
    inner
        .router
        .reroute(&failure.reroute, Some(&lease.resource), Some(shard), url);
    tracing::debug!(
        resource = %lease.resource,
        error = %failure.summary,
        retry_in_ms = delay.as_millis() as u64,
        "renewal failed; retrying"
    );
}
