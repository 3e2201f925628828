//! `seed`: the brief's steady state, open loop.
//!
//! Acquires arrive at `acquire_rate_per_s`, each on a resource picked at
//! random among those the benchmark does not hold (so every acquire is
//! uncontended, and a conflict means a lease was lost or leaked). Each lease
//! is held for a random time around `held / rate` seconds (uniform in
//! [0.5, 1.5] of the mean), which by Little's law keeps about `held` leases
//! alive; it is renewed every `renew_interval_ms`, starting at a random
//! phase (the jitter real clients use), so renewals arrive at
//! `held / renew interval` per second; then released. With the defaults:
//! 100,000 resources, 20,000 held, 2,000 acquires, ~2,000 renews and ~2,000
//! releases per second, 30 s leases renewed every 10 s.
//!
//! Every request's latency counts from its scheduled time. A warm-up fills
//! the held set before the measured window opens; when it closes, the
//! leases still held are left to expire by their TTL (on given endpoints,
//! up to `held` leases linger for one TTL).
//!
//! The capacity scenario is this profile plus [`ScheduledEvent`]s (kill a
//! replica, bring it back) run at fixed offsets into the measured window.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

use super::{resource_name, FreeSet, RunContext};
use crate::error::BenchError;
use crate::outcome::{Op, Outcome};
use crate::schedule::OpenLoop;

/// The brief's design inputs.
pub const DEFAULT_RESOURCES: u32 = 100_000;
pub const DEFAULT_HELD: u32 = 20_000;
pub const DEFAULT_ACQUIRE_RATE_PER_S: f64 = 2_000.0;
pub const DEFAULT_TTL_MS: u64 = 30_000;
pub const DEFAULT_RENEW_INTERVAL_MS: u64 = 10_000;
/// Long enough to fill the held set (the longest hold is 1.5 × the mean).
pub const DEFAULT_WARMUP_S: u64 = 15;
pub const DEFAULT_DURATION_S: u64 = 60;

#[derive(Clone, Debug, Serialize)]
pub struct SeedConfig {
    pub resources: u32,
    /// Leases held at steady state.
    pub held: u32,
    pub acquire_rate_per_s: f64,
    pub ttl_ms: u64,
    pub renew_interval_ms: u64,
    pub warmup_s: u64,
    pub duration_s: u64,
}

impl Default for SeedConfig {
    fn default() -> Self {
        SeedConfig {
            resources: DEFAULT_RESOURCES,
            held: DEFAULT_HELD,
            acquire_rate_per_s: DEFAULT_ACQUIRE_RATE_PER_S,
            ttl_ms: DEFAULT_TTL_MS,
            renew_interval_ms: DEFAULT_RENEW_INTERVAL_MS,
            warmup_s: DEFAULT_WARMUP_S,
            duration_s: DEFAULT_DURATION_S,
        }
    }
}

impl SeedConfig {
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::InvalidArgument(format!("seed: {m}")));
        if self.held == 0 || self.held >= self.resources {
            return bad("held must be in 1..resources");
        }
        if self.renew_interval_ms == 0 || self.renew_interval_ms >= self.ttl_ms {
            return bad("renew interval must be in 1..ttl");
        }
        if self.duration_s == 0 {
            return bad("duration must be at least 1 s");
        }
        Ok(())
    }

    /// Mean time a lease is held.
    fn mean_hold(&self) -> Duration {
        Duration::from_secs_f64(f64::from(self.held) / self.acquire_rate_per_s)
    }
}

/// Something to do at a fixed offset into the measured window (the
/// capacity scenario's replica kill and restart). Runs on a blocking thread.
pub struct ScheduledEvent {
    pub at: Duration,
    pub label: String,
    pub action: Box<dyn FnOnce() -> Result<(), String> + Send>,
}

/// When an event ran, and how it went.
#[derive(Clone, Debug, Serialize)]
pub struct EventRecord {
    /// Seconds into the measured window.
    pub t_s: f64,
    pub label: String,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SeedFindings {
    /// Leases held when the measured window closed.
    pub held_at_end: usize,
    /// Acquires that could not be scheduled because every resource was
    /// taken (raise `resources`).
    pub starved: u64,
    pub events: Vec<EventRecord>,
}

struct Shared {
    ctx: RunContext,
    config: SeedConfig,
    free: FreeSet,
    held: AtomicUsize,
    stop: watch::Receiver<bool>,
}

/// Runs the profile; measurements go to `ctx.recorder`.
pub async fn run(
    ctx: &RunContext,
    config: &SeedConfig,
    events: Vec<ScheduledEvent>,
) -> Result<SeedFindings, BenchError> {
    config.validate()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        config: config.clone(),
        free: FreeSet::new(config.resources),
        held: AtomicUsize::new(0),
        stop: stop_rx,
    });
    let start = Instant::now();
    let window_start = start + Duration::from_secs(config.warmup_s);
    let end = window_start + Duration::from_secs(config.duration_s);

    let recorder = ctx.recorder.clone();
    let opens = tokio::spawn(async move {
        tokio::time::sleep_until(window_start.into()).await;
        recorder.restart();
    });
    let records = Arc::new(Mutex::new(Vec::new()));
    let event_task = {
        let records = records.clone();
        tokio::spawn(async move {
            for event in events {
                tokio::time::sleep_until((window_start + event.at).into()).await;
                let t_s = window_start.elapsed().as_secs_f64();
                let error = tokio::task::spawn_blocking(event.action)
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r)
                    .err();
                records
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(EventRecord {
                        t_s,
                        label: event.label,
                        error,
                    });
            }
        })
    };
    let progress = ctx.progress.then(|| {
        let shared = shared.clone();
        crate::progress::spawn(
            ctx.recorder.clone(),
            Duration::from_secs(config.duration_s),
            Some(window_start),
            Arc::new(move || format!("held {}", shared.held.load(Ordering::Relaxed))),
        )
    });

    let mut pacer = OpenLoop::new(config.acquire_rate_per_s, start, end)?;
    let mut starved = 0;
    while let Some(due) = pacer.tick().await {
        let Some(index) = shared.free.take() else {
            starved += 1;
            continue;
        };
        tokio::spawn(lease(shared.clone(), index, due));
    }
    let held_at_end = shared.held.load(Ordering::Relaxed);
    let _ = opens.await;
    event_task.abort();
    if let Some(p) = progress {
        p.abort();
    }
    // Measured window over: lease tasks stop at their next event and leave
    // their leases to expire by TTL; requests already in flight finish.
    let _ = stop_tx.send(true);
    let drain_deadline = Instant::now() + ctx.op_timeout;
    while shared.held.load(Ordering::Relaxed) > 0 && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = std::mem::take(&mut *records.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(SeedFindings {
        held_at_end,
        starved,
        events,
    })
}

/// A resource whose lease may still be held (an acquire or release with an
/// unknown end) becomes free again only after the TTL has surely passed.
fn put_back_later(shared: &Arc<Shared>, index: u32) {
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(shared.config.ttl_ms)).await;
        shared.free.put_back(index);
    });
}

/// Resolves once the measured window has closed.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The borrow `wait_for` returns must not live across later awaits.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// One lease's life: acquire at `due`, renew on schedule, release.
async fn lease(shared: Arc<Shared>, index: u32, due: Instant) {
    let ctx = &shared.ctx;
    let config = &shared.config;
    let name = resource_name("seed", index);
    let held = {
        let _slot = ctx.in_flight.acquire().await;
        let result = ctx
            .backend
            .acquire(&name, config.ttl_ms, 0, ctx.op_timeout)
            .await;
        let done = Instant::now();
        match result {
            Ok(held) => {
                ctx.recorder
                    .record(Op::Acquire, due, done, Outcome::Ok, None);
                held
            }
            Err(e) => {
                ctx.recorder
                    .record(Op::Acquire, due, done, e.outcome, Some(&e.message));
                if e.outcome == Outcome::Conflict {
                    shared.free.put_back(index);
                } else {
                    put_back_later(&shared, index);
                }
                return;
            }
        }
    };
    shared.held.fetch_add(1, Ordering::Relaxed);
    let granted = Instant::now();
    let mean = config.mean_hold().as_secs_f64();
    let release_at = due + Duration::from_secs_f64(mean * rand::random_range(0.5..1.5));
    let interval = Duration::from_millis(config.renew_interval_ms);
    let mut next_renew = granted + interval.mul_f64(rand::random_range(0.0..1.0));
    let mut stop = shared.stop.clone();
    let released_cleanly = loop {
        let releasing = release_at <= next_renew;
        let at = if releasing { release_at } else { next_renew };
        tokio::select! {
            () = tokio::time::sleep_until(at.into()) => {}
            // The window has closed: the lease is left to expire. Releasing
            // every held lease at once would put a burst on the target
            // while the last measured requests are still in flight.
            () = stopped(&mut stop) => break false,
        }
        let _slot = ctx.in_flight.acquire().await;
        if releasing {
            let result = ctx.backend.release(&held, ctx.op_timeout).await;
            let done = Instant::now();
            match &result {
                Ok(()) => ctx
                    .recorder
                    .record(Op::Release, at, done, Outcome::Ok, None),
                Err(e) => ctx
                    .recorder
                    .record(Op::Release, at, done, e.outcome, Some(&e.message)),
            }
            break result.is_ok();
        }
        let result = ctx.backend.renew(&held, ctx.op_timeout).await;
        let done = Instant::now();
        match result {
            Ok(()) => ctx.recorder.record(Op::Renew, at, done, Outcome::Ok, None),
            Err(e) => {
                ctx.recorder
                    .record(Op::Renew, at, done, e.outcome, Some(&e.message));
                if e.outcome == Outcome::Conflict {
                    // The lease is gone: nothing to release.
                    break false;
                }
            }
        }
        next_renew += interval;
    };
    shared.held.fetch_sub(1, Ordering::Relaxed);
    if released_cleanly {
        shared.free.put_back(index);
    } else {
        put_back_later(&shared, index);
    }
}
