//! The clients in the harness process, each a tokio task with its own
//! process id, recording everything.
//!
//! * **Lock clients** pick a resource from a small set (so they contend;
//!   one is a semaphore and one a lock mostly taken shared, [`mode_of`]),
//!   acquire it (sometimes waiting in its queue), write to the fenced
//!   resource with the token while their stop-by deadline has not passed,
//!   sometimes renew, read the lock, re-send the acquire's request id (a
//!   lost reply retried), and release.
//! * **Watchers** follow resources with the `Watch` call, resuming after
//!   the last revision on another node when a stream ends.
//! * **A FIFO prober** builds a queue on its own resource one waiter at a
//!   time, each joining only after a `Get` showed the previous ones queued,
//!   so the FIFO checker can prove the order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::fence_server::FenceClient;
use super::lock_client::LockClient;
use super::recorder::Recorder;
use crate::history::{Mode, ProcessId, WatchSeen};

/// Lease TTL of the lock clients: short, so expiry happens during a run.
pub const CLIENT_TTL_MS: u64 = 3_000;
/// The stop-by deadline, in percent of the TTL the answer granted, after
/// the send of the call that was answered (the client library keeps a
/// similar margin).
pub const STOP_BY_PERCENT: u64 = 90;
/// How long a waiting acquire may queue.
pub const CLIENT_WAIT_MS: u64 = 2_000;
/// Waiters the FIFO prober queues per round.
pub const FIFO_WAITERS: u64 = 3;
/// Pause between FIFO rounds.
pub const FIFO_ROUND_PAUSE_MS: u64 = 3_000;

/// What every client task needs.
#[derive(Clone)]
pub struct Ctx {
    pub endpoints: Vec<String>,
    pub fence_addr: String,
    pub recorder: Recorder,
    pub stop: Arc<AtomicBool>,
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn lock(&self, process: ProcessId) -> LockClient {
        LockClient::new(process, &self.endpoints, self.recorder.clone())
    }

    fn fence(&self, process: ProcessId) -> FenceClient {
        FenceClient::new(process, self.fence_addr.clone(), self.recorder.clone())
    }
}

/// The permits of the lock clients' semaphore (their last resource).
pub const SEMAPHORE_PERMITS: u32 = 2;

/// How lock clients acquire the `i`th of `n` resources with their `n`th
/// request: the last resource is a semaphore of [`SEMAPHORE_PERMITS`], the
/// one before it a lock taken shared two times in three and exclusive
/// otherwise, the rest exclusive locks (all of them with fewer than four
/// resources). The windows checker holds each to what its mode allows.
pub fn mode_of(i: usize, n: usize, request: u64) -> Mode {
    if n < 4 || i + 2 < n {
        Mode::Exclusive
    } else if i + 1 == n {
        Mode::Semaphore(SEMAPHORE_PERMITS)
    } else if request.is_multiple_of(3) {
        Mode::Exclusive
    } else {
        Mode::Shared
    }
}

/// One lock client until `ctx.stop`.
pub async fn lock_client(ctx: Ctx, process: ProcessId, resources: Vec<String>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ process.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut lock = ctx.lock(process);
    let mut fence = ctx.fence(process);
    let mut n = 0u64;
    while !ctx.stopped() {
        n += 1;
        let index = rng.random_range(0..resources.len());
        let resource = &resources[index];
        let mode = mode_of(index, resources.len(), n);
        if rng.random_ratio(1, 8) {
            lock.get(resource).await;
            continue;
        }
        let request_id = format!("c{process}-{n}");
        let wait_ms = if rng.random_ratio(1, 3) {
            CLIENT_WAIT_MS
        } else {
            0
        };
        let sent = Instant::now();
        let Some(grant) = lock
            .acquire_in(resource, &request_id, CLIENT_TTL_MS, wait_ms, mode)
            .await
        else {
            tokio::time::sleep(Duration::from_millis(rng.random_range(20..200))).await;
            continue;
        };
        // The stop-by deadline, as the client library computes it: from the
        // send of the call that was answered, for the TTL the answer
        // granted (never the one asked for), minus a margin.
        let stop_by_after = |sent: Instant, ttl_ms: u64| {
            sent + Duration::from_millis(ttl_ms * STOP_BY_PERCENT / 100)
        };
        let mut stop_by = stop_by_after(sent, grant.ttl_ms);
        for i in 0..rng.random_range(1..=3u64) {
            if Instant::now() >= stop_by {
                break;
            }
            // Only an exclusive holder writes: the fenced resource orders
            // one writer's tokens (docs/fencing.md).
            if mode.is_exclusive() {
                fence
                    .write(resource, grant.token, &format!("c{process}-{n}-{i}"))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(10..120))).await;
            if rng.random_ratio(1, 3) {
                let sent = Instant::now();
                if let Some(ttl_ms) = lock.renew(resource, &grant.lease_id, CLIENT_TTL_MS).await {
                    // A client keeps the longest deadline it was given.
                    stop_by = stop_by.max(stop_by_after(sent, ttl_ms));
                }
            }
        }
        if rng.random_ratio(1, 6) {
            lock.get(resource).await;
        }
        if rng.random_ratio(1, 8) {
            // A lost reply retried: the same request id must return the
            // same lease (the dedup checker verifies it).
            lock.acquire_in(resource, &request_id, CLIENT_TTL_MS, wait_ms, mode)
                .await;
        }
        lock.release(resource, &grant.lease_id).await;
    }
}

/// Rounds of: a holder takes `resource`; waiters join one at a time, each
/// after a `Get` shows the queue grew; the holder releases; each waiter,
/// once granted, releases. Process ids `first_process..` are used, one per
/// role.
pub async fn fifo_prober(ctx: Ctx, first_process: ProcessId, resource: String) {
    let mut holder = ctx.lock(first_process);
    let mut observer = ctx.lock(first_process + 1);
    let mut round = 0u64;
    while !ctx.stopped() {
        round += 1;
        let request_id = format!("f{first_process}-{round}");
        let Some(grant) = holder.acquire(&resource, &request_id, 10_000, 0).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let mut waiters = Vec::new();
        for w in 0..FIFO_WAITERS {
            let mut client = ctx.lock(first_process + 2 + w);
            let queued = resource.clone();
            let request_id = format!("f{first_process}-{round}-w{w}");
            waiters.push(tokio::spawn(async move {
                if let Some(g) = client.acquire(&queued, &request_id, 3_000, 15_000).await {
                    client.release(&queued, &g.lease_id).await;
                }
            }));
            // Wait until the queue shows this waiter. If it never does
            // (a fault), the FIFO checker simply proves nothing about this
            // round: it only uses queues a get pinned down.
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                match observer.get(&resource).await {
                    Some((_, _, queued)) if u64::from(queued) > w => break,
                    _ => tokio::time::sleep(Duration::from_millis(30)).await,
                }
            }
        }
        holder.release(&resource, &grant.lease_id).await;
        for w in waiters {
            let _ = w.await;
        }
        tokio::time::sleep(Duration::from_millis(FIFO_ROUND_PAUSE_MS)).await;
    }
}

/// Follows `resource` with the `Watch` call until `ctx.stop`, recording
/// every event; when a stream ends (its node stopped, a partition, too
/// slow) it watches again after the last revision received, on the next
/// node. The watch checker holds the whole run's events to the history.
pub async fn watcher(ctx: Ctx, process: ProcessId, resource: String) {
    use fencelock_api::v1::lock_service_client::LockServiceClient;
    use fencelock_api::v1::{Revision, WatchEventKind, WatchRequest};
    let mut after: Option<Revision> = None;
    let mut node = process as usize;
    while !ctx.stopped() {
        node += 1;
        let endpoint = &ctx.endpoints[node % ctx.endpoints.len()];
        let url = if endpoint.starts_with("http") {
            endpoint.clone()
        } else {
            format!("http://{endpoint}")
        };
        let stream = async {
            let mut client = LockServiceClient::connect(url).await.ok()?;
            let request = WatchRequest {
                resource: resource.clone(),
                after,
            };
            client.watch(request).await.ok().map(|r| r.into_inner())
        };
        let Ok(Some(mut events)) = tokio::time::timeout(Duration::from_secs(2), stream).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), events.message()).await;
            let event = match next {
                Ok(Ok(Some(event))) => event,
                // No event for a while: look at the stop flag, go on.
                Err(_) if !ctx.stopped() => continue,
                _ => break,
            };
            let Some(revision) = event.revision else {
                break;
            };
            let kind = match event.kind() {
                WatchEventKind::State => "state",
                WatchEventKind::Granted => "granted",
                WatchEventKind::ValueChanged => "value_changed",
                WatchEventKind::Released => "released",
                WatchEventKind::Expired => "expired",
                WatchEventKind::Cancelled => "cancelled",
                WatchEventKind::Unspecified => "unspecified",
            };
            ctx.recorder.watched(
                process,
                WatchSeen {
                    resource: resource.clone(),
                    revision: (revision.epoch, revision.index, revision.seq),
                    kind: kind.to_owned(),
                    token: event.fencing_token,
                    holders: event.holders.iter().map(|h| h.fencing_token).collect(),
                    gap: event.gap,
                },
            );
            after = Some(revision);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
