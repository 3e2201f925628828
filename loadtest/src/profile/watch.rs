//! `watch` (fencelock only): many watchers of a few busy resources.
//!
//! `lock_clients` callers per busy resource loop: acquire (waiting in the
//! queue if another client holds it), hold `hold_ms`, release; every grant
//! and release is a change that the resource's watchers are told of. With
//! one client per resource (the default) no acquire waits, so acquire
//! latency is one commit's. The profile runs that
//! same lock load twice, `phase_s` seconds each:
//!
//! 1. **without watchers**: the baseline lock ops/s and acquire latency;
//! 2. **with `watchers` watch streams** (lock.proto `Watch`, through the
//!    Rust client's `Client::watch`) spread evenly over the busy resources,
//!    all of them streaming before the phase starts.
//!
//! The ratio of the two phases is the cost of the watchers to lock
//! throughput. In phase 2 every GRANTED and RELEASED event is matched to
//! the lock client's answer by resource, fencing token and kind; its
//! **delivery latency** ([`Op::Delivery`]) runs from the moment that answer
//! arrived at the lock client to the moment the watcher received the event
//! (an event that arrives first counts as 0 and as `early`). A watcher the
//! server cuts (SERVER_BUSY: it fell behind) or whose stream ends watches
//! again after the last revision it received, as the client docs say.
//!
//! Memory stays bounded: a change is forgotten once every watcher of its
//! resource has received it, or [`FORGET_AFTER_S`] after it was made (the
//! watchers that had not received it by then count as `missed`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock_client::proto::{Reason, Revision, WatchEventKind};
use fencelock_client::{Client, ClientConfig, ClientError};
use serde::Serialize;

use super::{resource_name, RunContext};
use crate::error::BenchError;
use crate::outcome::{Op, Outcome};
use crate::stats::{Recorder, Summary};

pub const DEFAULT_WATCHERS: u32 = 1_000;
pub const DEFAULT_WATCH_RESOURCES: u32 = 8;
/// One lock client per resource: its acquires never wait, so their latency
/// is the commit's, which is what the watchers may slow.
pub const DEFAULT_LOCK_CLIENTS: u32 = 1;
/// About 40 changes per second per busy resource.
pub const DEFAULT_HOLD_MS: u64 = 20;
pub const DEFAULT_PHASE_S: u64 = 20;
/// Watch streams per `fencelock_client::Client` (each has its own
/// connections; a node allows 1,024 streams per connection).
pub const DEFAULT_WATCHERS_PER_CLIENT: u32 = 100;
/// A change not yet received by every watcher this long after it was made
/// is forgotten; the watchers still missing it count as `missed`.
pub const FORGET_AFTER_S: u64 = 10;
/// How long every watcher may take to receive its first event (the state
/// now) before phase 2 starts without the rest.
const READY_TIMEOUT_S: u64 = 60;
/// After phase 2's lock load stops, how long the last deliveries may take.
const DRAIN_TIMEOUT_S: u64 = 5;
const TTL_MS: u64 = 30_000;
const WAIT_MS: u64 = 10_000;

#[derive(Clone, Debug, Serialize)]
pub struct WatchConfig {
    pub watchers: u32,
    /// Busy resources the watchers and lock clients share.
    pub resources: u32,
    /// Closed-loop lock callers per busy resource.
    pub lock_clients: u32,
    pub hold_ms: u64,
    /// Seconds of each phase.
    pub phase_s: u64,
    pub watchers_per_client: u32,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            watchers: DEFAULT_WATCHERS,
            resources: DEFAULT_WATCH_RESOURCES,
            lock_clients: DEFAULT_LOCK_CLIENTS,
            hold_ms: DEFAULT_HOLD_MS,
            phase_s: DEFAULT_PHASE_S,
            watchers_per_client: DEFAULT_WATCHERS_PER_CLIENT,
        }
    }
}

/// The lock load of one phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseFigures {
    /// Successful acquires + releases per second.
    pub lock_ops_per_s: f64,
    pub acquire_p50_ms: f64,
    pub acquire_p99_ms: f64,
    pub release_p99_ms: f64,
    /// Acquires and releases that failed.
    pub failed: u64,
}

impl PhaseFigures {
    fn of(summary: &Summary) -> PhaseFigures {
        let acquire = summary.ops.get(&Op::Acquire);
        let release = summary.ops.get(&Op::Release);
        PhaseFigures {
            lock_ops_per_s: acquire.map_or(0.0, |s| s.ok_per_s)
                + release.map_or(0.0, |s| s.ok_per_s),
            acquire_p50_ms: acquire.map_or(0.0, |s| s.p50_ms),
            acquire_p99_ms: acquire.map_or(0.0, |s| s.p99_ms),
            release_p99_ms: release.map_or(0.0, |s| s.p99_ms),
            failed: acquire.map_or(0, |s| s.failed()) + release.map_or(0, |s| s.failed()),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchFindings {
    pub watchers: u32,
    pub resources: u32,
    pub lock_clients: u32,
    /// Phase 1: the lock load alone.
    pub without_watchers: PhaseFigures,
    /// Phase 2: the same lock load with every watcher streaming.
    pub with_watchers: PhaseFigures,
    /// Phase 2 lock ops/s over phase 1's (1.0 = no cost).
    pub lock_ops_ratio: f64,
    /// Phase 2 acquire p99 over phase 1's.
    pub acquire_p99_ratio: f64,
    /// Watchers that received their first event before phase 2, and how
    /// long the last of them took from the start of the watches.
    pub watchers_ready: u32,
    pub ready_ms: f64,
    /// Events received by all watchers in phase 2, and per second.
    pub events: u64,
    pub events_per_s: f64,
    /// GRANTED and RELEASED changes the lock clients were answered in
    /// phase 2.
    pub changes: u64,
    /// Deliveries owed: each change times the watchers of its resource.
    pub deliveries_expected: u64,
    /// Events matched to a change (latency recorded as `delivery`).
    pub delivered: u64,
    /// ... of which arrived before the lock client's answer (counted 0).
    pub delivered_early: u64,
    /// Owed deliveries not received within [`FORGET_AFTER_S`] (must be 0).
    pub missed: u64,
    /// GRANTED/RELEASED events matching no answered change (a grant whose
    /// answer was lost, or a delivery after the change was forgotten).
    pub unmatched: u64,
    /// Streams the server ended with SERVER_BUSY (the watcher fell behind).
    pub cut_server_busy: u64,
    /// Other stream ends that were resumed (node stopped, moved shard).
    pub resumed: u64,
    /// STATE events with `gap` (changes the node no longer had).
    pub gaps: u64,
    /// Watches that could not be started or ended with an error that is
    /// not resumed.
    pub watch_errors: u64,
    /// A few of those errors.
    pub error_samples: Vec<String>,
}

/// One change, identified as both its lock client and its watchers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ChangeKey {
    resource: u32,
    token: i64,
    granted: bool,
}

struct Change {
    first_seen: Instant,
    /// When the lock client's answer arrived.
    answered: Option<Instant>,
    delivered: u32,
    /// Deliveries received before the answer.
    early: u32,
}

/// The changes of phase 2 that some watcher has yet to receive.
struct Tracker {
    recorder: Arc<Recorder>,
    watchers_of: Vec<u32>,
    changes: Mutex<HashMap<ChangeKey, Change>>,
    counts: Mutex<WatchFindings>,
    events: AtomicU64,
}

impl Tracker {
    fn new(recorder: Arc<Recorder>, watchers_of: Vec<u32>) -> Tracker {
        Tracker {
            recorder,
            watchers_of,
            changes: Mutex::new(HashMap::new()),
            counts: Mutex::new(WatchFindings::default()),
            events: AtomicU64::new(0),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, WatchFindings> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changes(&self) -> std::sync::MutexGuard<'_, HashMap<ChangeKey, Change>> {
        self.changes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn owed(&self, key: &ChangeKey) -> u32 {
        self.watchers_of[key.resource as usize]
    }

    /// A lock client's answer for `key` arrived at `at`.
    fn answered(&self, key: ChangeKey, at: Instant) {
        let owed = self.owed(&key);
        {
            let mut counts = self.counts();
            counts.changes += 1;
            counts.deliveries_expected += u64::from(owed);
        }
        let mut changes = self.changes();
        let change = changes.entry(key).or_insert_with(|| Change {
            first_seen: at,
            answered: None,
            delivered: 0,
            early: 0,
        });
        change.answered = Some(at);
        if change.early > 0 {
            let mut counts = self.counts();
            counts.delivered += u64::from(change.early);
            counts.delivered_early += u64::from(change.early);
        }
        for _ in 0..change.early {
            self.recorder
                .record(Op::Delivery, at, at, Outcome::Ok, None);
        }
        if change.delivered >= owed {
            changes.remove(&key);
        }
    }

    /// A watcher received the event of `key` at `at`.
    fn delivered(&self, key: ChangeKey, at: Instant) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let owed = self.owed(&key);
        let mut changes = self.changes();
        let change = changes.entry(key).or_insert_with(|| Change {
            first_seen: at,
            answered: None,
            delivered: 0,
            early: 0,
        });
        change.delivered += 1;
        match change.answered {
            Some(answered) => {
                self.counts().delivered += 1;
                self.recorder
                    .record(Op::Delivery, answered, at, Outcome::Ok, None);
                if change.delivered >= owed {
                    changes.remove(&key);
                }
            }
            None => change.early += 1,
        }
    }

    /// Forgets changes older than `age` (all of them with `Duration::ZERO`)
    /// and counts what they still owed.
    fn forget(&self, age: Duration) {
        let now = Instant::now();
        let mut stale = Vec::new();
        self.changes().retain(|key, change| {
            let keep = now.duration_since(change.first_seen) < age;
            if !keep {
                stale.push((*key, change.answered.is_some(), change.delivered));
            }
            keep
        });
        let mut counts = self.counts();
        for (key, answered, delivered) in stale {
            if answered {
                counts.missed += u64::from(self.owed(&key).saturating_sub(delivered));
            } else {
                counts.unmatched += u64::from(delivered);
            }
        }
    }

    fn pending(&self) -> usize {
        self.changes().len()
    }

    fn note_error(&self, message: String) {
        let mut counts = self.counts();
        counts.watch_errors += 1;
        if counts.error_samples.len() < 5 {
            counts.error_samples.push(message);
        }
    }
}

pub async fn run(ctx: &RunContext, config: &WatchConfig) -> Result<WatchFindings, BenchError> {
    if config.resources == 0 || config.lock_clients == 0 || config.watchers < config.resources {
        return Err(BenchError::InvalidArgument(
            "watch: need at least one busy resource, one lock client per resource and one \
             watcher per resource"
                .to_owned(),
        ));
    }
    let names: Vec<String> = (0..config.resources)
        .map(|r| resource_name("watch", r))
        .collect();

    // Phase 1: the lock load alone.
    if ctx.progress {
        eprintln!("watch: phase 1, lock load without watchers");
    }
    let baseline = Arc::new(Recorder::new());
    lock_load(ctx, config, &names, &baseline, None).await;
    let without_watchers = PhaseFigures::of(&baseline.summary());

    // Start the watchers; wait until every one has its first event.
    let watchers_of: Vec<u32> = (0..config.resources)
        .map(|r| {
            (config.watchers / config.resources) + u32::from(r < config.watchers % config.resources)
        })
        .collect();
    let tracker = Arc::new(Tracker::new(ctx.recorder.clone(), watchers_of));
    let per_client = config.watchers_per_client.max(1);
    let mut clients = Vec::new();
    for _ in 0..config.watchers.div_ceil(per_client) {
        clients.push(
            Client::connect(ctx.endpoints.clone(), ClientConfig::default())
                .await
                .map_err(|e| BenchError::InvalidArgument(format!("watch client: {e}")))?,
        );
    }
    let ready = Arc::new(tokio::sync::Semaphore::new(0));
    let recording = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    let mut watchers = Vec::new();
    for w in 0..config.watchers {
        let resource = w % config.resources;
        watchers.push(tokio::spawn(watcher(
            clients[(w / per_client) as usize].clone(),
            resource,
            names[resource as usize].clone(),
            tracker.clone(),
            ready.clone(),
            recording.clone(),
        )));
    }
    let ready_wait = tokio::time::timeout(
        Duration::from_secs(READY_TIMEOUT_S),
        ready.acquire_many(config.watchers),
    )
    .await;
    let ready_ms = started.elapsed().as_secs_f64() * 1000.0;
    let watchers_ready = match ready_wait {
        Ok(Ok(permits)) => {
            permits.forget();
            config.watchers
        }
        _ => config.watchers - ready.available_permits() as u32,
    };
    if ctx.progress {
        eprintln!("watch: {watchers_ready} watchers streaming after {ready_ms:.0} ms; phase 2");
    }

    // Phase 2: the same lock load, every change tracked.
    ctx.recorder.restart();
    tracker.events.store(0, Ordering::Relaxed);
    recording.store(true, Ordering::Relaxed);
    let phase_start = Instant::now();
    let phase = Arc::new(Recorder::new());
    let sweeper = {
        let tracker = tracker.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                tracker.forget(Duration::from_secs(FORGET_AFTER_S));
            }
        })
    };
    lock_load(ctx, config, &names, &phase, Some(&tracker)).await;
    let with_watchers = PhaseFigures::of(&phase.summary());
    let phase_s = phase_start.elapsed().as_secs_f64();
    let events = tracker.events.load(Ordering::Relaxed);
    let drain_until = Instant::now() + Duration::from_secs(DRAIN_TIMEOUT_S);
    while tracker.pending() > 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    recording.store(false, Ordering::Relaxed);
    sweeper.abort();
    for w in &watchers {
        w.abort();
    }
    tracker.forget(Duration::ZERO);

    let mut findings = std::mem::take(&mut *tracker.counts());
    findings.watchers = config.watchers;
    findings.resources = config.resources;
    findings.lock_clients = config.lock_clients;
    findings.lock_ops_ratio =
        with_watchers.lock_ops_per_s / without_watchers.lock_ops_per_s.max(1e-9);
    findings.acquire_p99_ratio =
        with_watchers.acquire_p99_ms / without_watchers.acquire_p99_ms.max(1e-9);
    findings.without_watchers = without_watchers;
    findings.with_watchers = with_watchers;
    findings.watchers_ready = watchers_ready;
    findings.ready_ms = ready_ms;
    findings.events = events;
    findings.events_per_s = events as f64 / phase_s.max(1e-3);
    Ok(findings)
}

/// `lock_clients` closed-loop callers per resource for `phase_s`: acquire
/// (waiting), hold, release. Latencies go to `recorder` (and, in phase 2,
/// to the run's recorder); answers to `tracker`.
async fn lock_load(
    ctx: &RunContext,
    config: &WatchConfig,
    names: &[String],
    recorder: &Arc<Recorder>,
    tracker: Option<&Arc<Tracker>>,
) {
    let end = Instant::now() + Duration::from_secs(config.phase_s);
    recorder.restart();
    let mut tasks = Vec::new();
    for (r, name) in names.iter().enumerate() {
        for _ in 0..config.lock_clients {
            let (ctx, recorder, tracker) = (ctx.clone(), recorder.clone(), tracker.cloned());
            let (name, hold) = (name.clone(), Duration::from_millis(config.hold_ms));
            let resource = r as u32;
            tasks.push(tokio::spawn(async move {
                let record = |op, sent, done, outcome, error: Option<&str>| {
                    recorder.record(op, sent, done, outcome, error);
                    if tracker.is_some() {
                        ctx.recorder.record(op, sent, done, outcome, error);
                    }
                };
                while Instant::now() < end {
                    let sent = Instant::now();
                    let result = ctx
                        .backend
                        .acquire(&name, TTL_MS, WAIT_MS, ctx.op_timeout)
                        .await;
                    let done = Instant::now();
                    let held = match result {
                        Ok(held) => held,
                        Err(e) => {
                            record(Op::Acquire, sent, done, e.outcome, Some(&e.message));
                            continue;
                        }
                    };
                    record(Op::Acquire, sent, done, Outcome::Ok, None);
                    if let Some(t) = &tracker {
                        t.answered(
                            ChangeKey {
                                resource,
                                token: held.token,
                                granted: true,
                            },
                            done,
                        );
                    }
                    tokio::time::sleep(hold).await;
                    let sent = Instant::now();
                    let result = ctx.backend.release(&held, ctx.op_timeout).await;
                    let done = Instant::now();
                    match result {
                        Ok(()) => {
                            record(Op::Release, sent, done, Outcome::Ok, None);
                            if let Some(t) = &tracker {
                                t.answered(
                                    ChangeKey {
                                        resource,
                                        token: held.token,
                                        granted: false,
                                    },
                                    done,
                                );
                            }
                        }
                        Err(e) => record(Op::Release, sent, done, e.outcome, Some(&e.message)),
                    }
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// One watcher: watches `name` and, whenever the stream ends, watches again
/// after the last revision received. Signals `ready` at its first event;
/// reports GRANTED and RELEASED events to `tracker` while `recording`.
async fn watcher(
    client: Client,
    resource: u32,
    name: String,
    tracker: Arc<Tracker>,
    ready: Arc<tokio::sync::Semaphore>,
    recording: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut after: Option<Revision> = None;
    let mut first = true;
    loop {
        let mut stream = match client.watch(&name, after).await {
            Ok(stream) => stream,
            Err(e) => {
                tracker.note_error(format!("watch {name}: {e}"));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(event)) => {
                    let at = Instant::now();
                    after = event.revision.or(after);
                    if first {
                        first = false;
                        ready.add_permits(1);
                    }
                    if !recording.load(Ordering::Relaxed) {
                        continue;
                    }
                    let granted = match event.kind() {
                        WatchEventKind::Granted => true,
                        WatchEventKind::Released => false,
                        WatchEventKind::State => {
                            if event.gap {
                                tracker.counts().gaps += 1;
                            }
                            continue;
                        }
                        _ => {
                            tracker.events.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    tracker.delivered(
                        ChangeKey {
                            resource,
                            token: event.fencing_token,
                            granted,
                        },
                        at,
                    );
                }
                Ok(None) => {
                    tracker.counts().resumed += 1;
                    break;
                }
                Err(status) => {
                    let e = ClientError::from_status(status);
                    if e.reason() == Some(Reason::ServerBusy) {
                        tracker.counts().cut_server_busy += 1;
                    } else if e.resumes_watch() {
                        tracker.counts().resumed += 1;
                    } else {
                        tracker.note_error(format!("watch {name} ended: {e}"));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(token: i64) -> ChangeKey {
        ChangeKey {
            resource: 0,
            token,
            granted: true,
        }
    }

    #[test]
    fn a_change_is_matched_to_each_watcher_and_then_forgotten() {
        let recorder = Arc::new(Recorder::new());
        let tracker = Tracker::new(recorder.clone(), vec![2]);
        let t = Instant::now();
        tracker.answered(key(7), t);
        tracker.delivered(key(7), t + Duration::from_millis(3));
        assert_eq!(tracker.pending(), 1);
        tracker.delivered(key(7), t + Duration::from_millis(5));
        assert_eq!(tracker.pending(), 0, "delivered to both watchers");
        let delivery = &recorder.summary().ops[&Op::Delivery];
        assert_eq!(delivery.outcomes["ok"], 2);
        assert!((delivery.max_ms - 5.0).abs() < 0.1);
    }

    #[test]
    fn early_deliveries_count_zero_and_missing_ones_count_as_missed() {
        let recorder = Arc::new(Recorder::new());
        let tracker = Tracker::new(recorder.clone(), vec![3]);
        let t = Instant::now();
        // One watcher hears of it before the lock client does.
        tracker.delivered(key(1), t);
        tracker.answered(key(1), t + Duration::from_millis(2));
        tracker.delivered(key(1), t + Duration::from_millis(4));
        // A grant nobody answered for.
        tracker.delivered(key(2), t);
        tracker.forget(Duration::ZERO);
        let counts = tracker.counts();
        assert_eq!(counts.changes, 1);
        assert_eq!(counts.deliveries_expected, 3);
        assert_eq!(counts.missed, 1, "the third watcher never received it");
        assert_eq!((counts.delivered, counts.delivered_early), (2, 1));
        assert_eq!(counts.unmatched, 1);
        assert_eq!(recorder.summary().ops[&Op::Delivery].outcomes["ok"], 2);
    }
}
