//! [`LockGuard`]: one held lease, kept alive in the background, with its
//! stop-by deadline and lost signal.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::client::Inner;
use crate::error::{ClientError, LostReason};
use crate::retry::Backoff;

/// Renew when this fraction of the TTL has passed since the last renewal
/// was sent: 1/3 leaves two more tries before the lease could end.
const RENEW_AT_TTL_DIVISOR: u32 = 3;

/// Jitter of the renew time, in percent of the renew interval either way,
/// so that many leases taken together do not renew in lockstep.
const RENEW_JITTER_PERCENT: u32 = 10;

/// A lease may be renewed this much (as a fraction of its renew interval)
/// before its renew time, so that leases falling due close together share
/// one `RenewBatch` call.
const RENEW_COALESCE_DIVISOR: u32 = 4;

/// Slowest retry of a failed renewal, as a fraction of the TTL: several
/// tries must fit before the stop-by deadline.
const RENEW_RETRY_MAX_TTL_DIVISOR: u32 = 10;

/// How a lease stands, as seen by [`LockGuard::subscribe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseStatus {
    /// Held, as far as the client can tell: protected work is allowed until
    /// `stop_by` (the client's monotonic clock). `expires_at_ms` is the
    /// server's informational expiry (its wall clock).
    Held {
        stop_by: Instant,
        expires_at_ms: u64,
    },
    /// Not held any more, or no longer known to be: stop protected work.
    /// Final: a lost lease never becomes held again.
    Lost(LostReason),
}

/// The renewal bookkeeping of one lease.
pub(crate) struct Timing {
    pub lease_ttl_ms: u64,
    pub expires_at_ms: u64,
    pub stop_by: Instant,
    /// When the next renewal is due (send time of the last one plus about
    /// a third of the TTL).
    pub next_renew_at: Instant,
    /// After a failed renewal: when to try again (overrides
    /// `next_renew_at`).
    pub retry_at: Option<Instant>,
    pub backoff: Backoff,
    /// A renewal of this lease is on the wire.
    pub in_flight: bool,
    /// False once the server refused a renewal for good (for example
    /// HOLD_LIMIT_REACHED): the lease runs out at its stop-by deadline.
    pub renewable: bool,
}

impl Timing {
    /// When this lease's next renewal is due: the keeper wakes for it.
    pub fn due_at(&self) -> Instant {
        self.retry_at.unwrap_or(self.next_renew_at)
    }

    /// From when the keeper may send this lease's next renewal along with
    /// another that is due: a little before its own due time, so leases
    /// falling due close together share a call.
    pub fn eligible_at(&self) -> Instant {
        if let Some(retry_at) = self.retry_at {
            return retry_at;
        }
        let window = renew_interval(self.lease_ttl_ms) / RENEW_COALESCE_DIVISOR;
        self.next_renew_at
            .checked_sub(window)
            .unwrap_or(self.next_renew_at)
    }
}

/// About a third of the TTL.
pub(crate) fn renew_interval(lease_ttl_ms: u64) -> Duration {
    Duration::from_millis(lease_ttl_ms) / RENEW_AT_TTL_DIVISOR
}

/// The renew interval with ±[`RENEW_JITTER_PERCENT`] jitter.
pub(crate) fn jittered_renew_interval(lease_ttl_ms: u64) -> Duration {
    let interval = renew_interval(lease_ttl_ms);
    let spread = interval * RENEW_JITTER_PERCENT / 100;
    interval - spread + crate::retry::jitter_up_to(spread * 2)
}

/// A backoff for renewal retries: never slower than a tenth of the TTL.
pub(crate) fn renew_backoff(inner: &Inner, lease_ttl_ms: u64) -> Backoff {
    let config = inner.config();
    let max = Duration::from_millis(config.backoff_max_ms)
        .min(Duration::from_millis(lease_ttl_ms) / RENEW_RETRY_MAX_TTL_DIVISOR)
        .max(Duration::from_millis(1));
    let base = Duration::from_millis(config.backoff_base_ms).min(max);
    Backoff::new(base, max)
}

/// One held lease, shared by its guard and the keeper.
pub(crate) struct LeaseEntry {
    /// The client-local key of the lease in the keeper's registry.
    pub key: u64,
    pub resource: String,
    pub lease_id: Vec<u8>,
    pub fencing_token: i64,
    pub shard_id: u64,
    pub deduplicated: bool,
    pub request_id: crate::client::RequestId,
    pub timing: Mutex<Timing>,
    pub status: watch::Sender<LeaseStatus>,
}

impl LeaseEntry {
    pub fn timing(&self) -> MutexGuard<'_, Timing> {
        // Timing is plain data updated in one step; a panic elsewhere leaves
        // it usable.
        self.timing.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_held(&self) -> bool {
        matches!(*self.status.borrow(), LeaseStatus::Held { .. })
    }

    /// Moves the lease to lost, unless it already is; returns the status it
    /// had.
    pub fn mark_lost(&self, reason: LostReason) -> LeaseStatus {
        let mut previous = LeaseStatus::Lost(reason);
        self.status.send_if_modified(|status| {
            previous = *status;
            match status {
                LeaseStatus::Held { .. } => {
                    *status = LeaseStatus::Lost(reason);
                    true
                }
                LeaseStatus::Lost(_) => false,
            }
        });
        previous
    }

    /// Publishes a later deadline, unless the lease is already lost.
    pub fn publish_held(&self, stop_by: Instant, expires_at_ms: u64) {
        self.status.send_if_modified(|status| match status {
            LeaseStatus::Held { .. } => {
                *status = LeaseStatus::Held {
                    stop_by,
                    expires_at_ms,
                };
                true
            }
            LeaseStatus::Lost(_) => false,
        });
    }
}

/// An exclusive lease on one resource, kept alive in the background.
///
/// **Using it.** Pass [`token`](Self::token) with every write to the
/// protected system, which must reject tokens lower than the highest it has
/// accepted for the resource. Do protected work only while the lease is
/// held: stop when [`lost`](Self::lost) resolves, which happens at the
/// latest at the [`stop_by`](Self::stop_by) deadline. Call
/// [`release`](Self::release) when done; dropping the guard also releases,
/// best effort, in the background.
///
/// **The stop-by deadline** is computed from the client's own monotonic
/// clock: the instant the acquire or renewal that the server answered was
/// *sent*, plus the granted TTL, minus a margin for clock-rate drift
/// ([`ClientConfig::stop_by_margin_percent`](crate::ClientConfig)). The
/// server started the lease's time no earlier than that send, so the lease
/// cannot have ended (and been granted to anyone else) before the deadline,
/// whatever happened to the replies. A renewal that failed or whose outcome
/// is unknown does not move the deadline.
///
/// **Lost.** The lease counts as lost, for good, when a renewal is answered
/// LEASE_NOT_HELD ([`LostReason::NotHeld`]) or when the stop-by deadline
/// passes without a confirmed renewal ([`LostReason::Unconfirmed`]: no
/// quorum, nodes down, a partition, the hold limit reached, or a client too
/// overloaded to renew). The application must stop protected work then; the
/// fencing token is what protects the resource from a holder that does not
/// stop in time (a paused process cannot stop itself).
pub struct LockGuard {
    entry: Arc<LeaseEntry>,
    inner: Arc<Inner>,
    /// Set once [`release`](Self::release) ran, so drop does nothing more.
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(entry: Arc<LeaseEntry>, inner: Arc<Inner>) -> LockGuard {
        LockGuard {
            entry,
            inner,
            released: false,
        }
    }

    /// The resource this lease holds.
    pub fn resource(&self) -> &str {
        &self.entry.resource
    }

    /// The fencing token of the grant. Send it with every protected write.
    pub fn token(&self) -> i64 {
        self.entry.fencing_token
    }

    /// The lease id (16 bytes): the credential for renewing and releasing.
    /// Keep it secret; never log it.
    pub fn lease_id(&self) -> &[u8] {
        &self.entry.lease_id
    }

    /// The shard that granted the lease.
    pub fn shard_id(&self) -> u64 {
        self.entry.shard_id
    }

    /// True when the grant was learned by a retry of the acquire (its first
    /// reply was lost): the same lease the first attempt was granted.
    pub fn deduplicated(&self) -> bool {
        self.entry.deduplicated
    }

    /// The request id of the logical acquire that was granted this lease
    /// (the one sent on every retry of that acquire).
    pub fn request_id(&self) -> &crate::client::RequestId {
        &self.entry.request_id
    }

    /// The server's expiry of the lease after the last confirmed renewal:
    /// its wall clock, ms since the Unix epoch. Informational; use
    /// [`stop_by`](Self::stop_by) to decide.
    pub fn expires_at_ms(&self) -> u64 {
        self.entry.timing().expires_at_ms
    }

    /// The TTL the server granted, in milliseconds.
    pub fn lease_ttl_ms(&self) -> u64 {
        self.entry.timing().lease_ttl_ms
    }

    /// The conservative deadline on the client's monotonic clock: protected
    /// work must be finished (or abandoned) by then unless a renewal moves
    /// it later. See the type's docs for how it is computed.
    pub fn stop_by(&self) -> Instant {
        self.entry.timing().stop_by
    }

    /// True while the lease is held as far as the client knows and its
    /// stop-by deadline has not passed.
    pub fn is_held(&self) -> bool {
        self.entry.is_held() && Instant::now() < self.stop_by()
    }

    /// Resolves when the lease is lost (or released): see the type's docs.
    /// It resolves at the stop-by deadline at the latest, on its own timer,
    /// even if the background renewer is late. The future does not borrow
    /// the guard, so it can be raced against the protected work:
    ///
    /// ```no_run
    /// # async fn f(guard: fencelock_client::LockGuard) {
    /// tokio::select! {
    ///     reason = guard.lost() => eprintln!("stop: lock lost: {reason}"),
    ///     () = async { /* protected work, passing guard.token() */ } => {}
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut status = self.entry.status.subscribe();
        async move {
            loop {
                let stop_by = match *status.borrow_and_update() {
                    LeaseStatus::Held { stop_by, .. } => stop_by,
                    LeaseStatus::Lost(reason) => return reason,
                };
                tokio::select! {
                    changed = status.changed() => {
                        if changed.is_err() {
                            // The lease's state is gone with its guard.
                            return LostReason::Released;
                        }
                    }
                    () = tokio::time::sleep_until(stop_by.into()) => {
                        // A renewal may have moved the deadline just now.
                        match *status.borrow() {
                            LeaseStatus::Held { stop_by: later, .. } if later > stop_by => {}
                            LeaseStatus::Lost(reason) => return reason,
                            LeaseStatus::Held { .. } => return LostReason::Unconfirmed,
                        }
                    }
                }
            }
        }
    }

    /// A watch of the lease's status: `Held` with each new stop-by deadline,
    /// then `Lost` once. The background renewer turns it to
    /// `Lost(Unconfirmed)` when the deadline passes (within milliseconds);
    /// use [`lost`](Self::lost) where exact timing matters.
    pub fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.entry.status.subscribe()
    }

    /// Calls `on_lost` once, on a tokio task, when the lease is lost
    /// (`NotHeld` or `Unconfirmed`); not when it is released by the
    /// application. Must be called within a tokio runtime.
    pub fn on_lost(&self, on_lost: impl FnOnce(LostReason) + Send + 'static) {
        let lost = self.lost();
        tokio::spawn(async move {
            let reason = lost.await;
            if reason != LostReason::Released {
                on_lost(reason);
            }
        });
    }

    /// Replaces what the lease publishes (an election's "Proclaim": the
    /// leader's new address). The token does not change; it is returned so
    /// the caller can check the lease still speaks for its grant.
    /// `LEASE_NOT_HELD` means the lock is lost.
    pub async fn proclaim(&self, value: &[u8]) -> Result<i64, ClientError> {
        self.inner
            .proclaim_lease(&self.entry.resource, &self.entry.lease_id, value)
            .await
    }

    /// Ends the lease and stops renewing it. `Ok(true)` if this call ended
    /// the holding; `Ok(false)` if the lease no longer held the resource
    /// (it had expired or been released; nothing was changed).
    pub async fn release(mut self) -> Result<bool, ClientError> {
        self.released = true;
        // Stop the renewals first, so none is sent after the release.
        self.inner.forget_lease(self.entry.key);
        let previous = self.entry.mark_lost(LostReason::Released);
        if previous == LeaseStatus::Lost(LostReason::NotHeld) {
            return Ok(false);
        }
        self.inner
            .release_lease(&self.entry.resource, &self.entry.lease_id)
            .await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.inner.forget_lease(self.entry.key);
        let previous = self.entry.mark_lost(LostReason::Released);
        if previous == LeaseStatus::Lost(LostReason::NotHeld) {
            return; // the server already says it is not held
        }
        // Best effort: without a runtime the lease simply expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            let entry = self.entry.clone();
            runtime.spawn(async move {
                if let Err(e) = inner.release_lease(&entry.resource, &entry.lease_id).await {
                    tracing::warn!(
                        resource = %entry.resource,
                        "release of a dropped lock guard failed; the lease will expire: {e}"
                    );
                }
            });
        }
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the lease id: it is a credential.
        f.debug_struct("LockGuard")
            .field("resource", &self.entry.resource)
            .field("token", &self.entry.fencing_token)
            .field("shard_id", &self.entry.shard_id)
            .field("status", &*self.entry.status.borrow())
            .finish()
    }
}
