//! The Rust client of fencelock: exclusive leases with fencing tokens,
//! routed to the right node, retried safely, and kept alive in the
//! background.
//!
//! ```no_run
//! use fencelock_client::{Client, ClientConfig};
//!
//! # async fn run() -> Result<(), fencelock_client::ClientError> {
//! let client = Client::connect(
//!     vec!["10.0.0.1:7001".into(), "10.0.0.2:7001".into(), "10.0.0.3:7001".into()],
//!     ClientConfig::default(),
//! )
//! .await?;
//! // 30 s lease, wait up to 5 s in the queue if someone holds it.
//! let guard = client.acquire("acme/orders/42", 30_000, 5_000).await?;
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lock lost, stopping: {reason}"),
//!     () = async { /* write to the store, passing guard.token() */ } => {}
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # What the client does for you
//!
//! * **Routing.** Any node of the cluster can be given; the client learns
//!   which shard each resource belongs to and where that shard is served
//!   (from NOT_LEADER leader hints and from successful answers), and sends
//!   later calls there directly. A node that forwards to the leader works
//!   just as well.
//! * **Retries.** Failures follow the error contract of `errors.proto`:
//!   NEVER is never retried; IMMEDIATELY is retried at once (a bounded
//!   number of times); BACKOFF and AFTER wait with exponential backoff and
//!   jitter. Every call has a deadline (`call_timeout_ms`, plus the wait for
//!   an acquire); when it passes the call fails with
//!   [`ClientError::Unavailable`].
//! * **One lease per acquire.** A logical acquire sends one `request_id` on
//!   every retry, so a retry whose first attempt was granted gets that grant
//!   back (`deduplicated`) instead of a second lease.
//! * **Keeping leases alive.** A [`LockGuard`] is renewed in the background
//!   at about a third of its TTL (with jitter); all the leases of one client
//!   that fall due together go out in one `RenewBatch` per node.
//! * **Knowing when to stop.** Each guard has a conservative
//!   [`stop_by`](LockGuard::stop_by) deadline on the client's monotonic
//!   clock and a [`lost`](LockGuard::lost) signal; see [`LockGuard`].
//! * **Cleaning up.** [`LockGuard::release`] ends the lease; dropping a
//!   guard releases it in the background. Dropping a waiting acquire's
//!   future ends its gRPC call, and the server then removes the waiter from
//!   the queue.
//!
//! # Stop-by deadline and lost signal
//!
//! The servers own lease time; the client's clock only decides when to
//! renew and when to stop. The stop-by deadline is the instant the client
//! *sent* the acquire or renewal that the server answered, plus the granted
//! TTL, minus a margin for clock-rate drift
//! ([`ClientConfig::stop_by_margin_percent`], 5% by default). It is never
//! counted from when the reply arrived: the server may have started the
//! lease's time any moment after the send. Failed or uncertain renewals do
//! not move it. When it passes without a confirmed renewal, or a renewal is
//! answered LEASE_NOT_HELD, the lease is lost, for good: [`LockGuard::lost`]
//! resolves, [`LockGuard::subscribe`] shows [`LeaseStatus::Lost`], and
//! [`LockGuard::on_lost`] callbacks run. **The application must stop the
//! protected work then.** Even so, a process can be paused past its deadline
//! without noticing; that is why every protected write must carry the
//! fencing token and the protected system must reject lower ones.

mod client;
mod config;
mod election;
mod error;
mod keeper;
mod lease;
mod retry;
mod router;

pub use client::{
    AcquireMode, AcquireOptions, Client, ClientStats, RequestId, MAX_PERMITS, MAX_REQUEST_ID_LEN,
};
pub use config::{
    ClientConfig, ClientTls, DEFAULT_ATTEMPT_TIMEOUT_MS, DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_MAX_MS, DEFAULT_CALL_TIMEOUT_MS, DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_STOP_BY_MARGIN_PERCENT, MAX_CALL_TIMEOUT_MS, MAX_ENDPOINTS, MAX_RENEW_BATCH,
    MAX_STOP_BY_MARGIN_PERCENT, MAX_WAIT_TIMEOUT_MS,
};
pub use election::{Election, Leader};
pub use error::{ClientError, LostReason};
pub use lease::{LeaseStatus, LockGuard};
pub use retry::MAX_IMMEDIATE_RETRIES;
pub use router::{MAX_CACHED_RESOURCES, MAX_CACHED_SHARDS, MAX_LEARNED_CONNECTIONS};

/// The protocol types, for callers that need the raw messages (for example
/// [`GetResponse`](fencelock_api::v1::GetResponse) from [`Client::get`] or
/// [`Reason`](fencelock_api::v1::Reason) from [`ClientError::reason`]).
pub use fencelock_api::v1 as proto;
