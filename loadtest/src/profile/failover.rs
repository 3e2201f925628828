//! `failover` (fencelock only): how long an election goes without a leader
//! when something fails.
//!
//! `elections` elections (resources `bench/election/eN`), each with
//! `candidates` campaigners and one observer: the campaigners queue FIFO
//! for the lease with their value, as `Election::campaign` does; the
//! observer follows the election with `Election::observe` (a watch,
//! resumed after the last revision when its stream ends). The campaigners
//! keep their own lease alive here (`acquire_unguarded` +
//! `renew_unguarded` every third of the TTL) instead of a `LockGuard`, so
//! that a crash can be modelled: renewals stop and nothing is released.
//! The profile then repeats, round robin over the elections:
//!
//! * **(a) leader crash**: right after a successful renewal, the leader
//!   stops renewing (its process "died"; it queues again as a restarted
//!   process would). Measured: crash → the observer receives the next
//!   leader's GRANTED event, and → `Election::leader` first names the next
//!   leader. Dominated by the TTL: the lease must run out first.
//! * **(b) node killed**: the fencelock node leading the election's shard
//!   is killed (SIGKILL) and, at the same moment, the leader resigns
//!   (releases), so the hand-over has to go through the shard's new Raft
//!   leader. Measured: kill → `leader()` answers again (the election is
//!   served), → the observer receives the next leader's GRANTED, → the
//!   next leader is read. The node is restarted and the cluster settles
//!   before the next repetition.
//!
//! A GRANTED event whose token is not above the observer's previous one is
//! counted as a token regression (must be 0).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock_client::proto::{LeaseState, Reason, Revision, WatchEventKind};
use fencelock_client::{AcquireOptions, Client, ClientConfig, ClientError, MAX_WAIT_TIMEOUT_MS};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

use super::RunContext;
use crate::cluster::LocalCluster;
use crate::error::BenchError;

pub const DEFAULT_ELECTIONS: u32 = 3;
pub const DEFAULT_CANDIDATES: u32 = 3;
pub const DEFAULT_ELECTION_TTL_MS: u64 = 3_000;
pub const DEFAULT_REPS: u32 = 5;
/// How long one repetition may take to see its next leader, on top of the
/// TTL.
const REP_TIMEOUT_S: u64 = 30;
/// Pause between `leader()` reads while waiting for the next leader.
const POLL_MS: u64 = 10;
/// Pause after a killed node is back and every shard has a leader.
const SETTLE_MS: u64 = 1_000;

#[derive(Clone, Debug, Serialize)]
pub struct FailoverConfig {
    pub elections: u32,
    pub candidates: u32,
    /// Lease TTL of the campaigners.
    pub ttl_ms: u64,
    /// Repetitions of each of (a) and (b); `kill_reps` 0 needs no local
    /// cluster.
    pub crash_reps: u32,
    pub kill_reps: u32,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig {
            elections: DEFAULT_ELECTIONS,
            candidates: DEFAULT_CANDIDATES,
            ttl_ms: DEFAULT_ELECTION_TTL_MS,
            crash_reps: DEFAULT_REPS,
            kill_reps: DEFAULT_REPS,
        }
    }
}

/// One repetition. Times are in ms from the crash or kill.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FailoverRep {
    pub election: String,
    /// (b): the node killed (1-based).
    pub killed_node: Option<usize>,
    /// (b): the first answer of `leader()` after the kill.
    pub served_ms: Option<f64>,
    /// The observer received the next leader's GRANTED event.
    pub observed_ms: Option<f64>,
    /// `leader()` first named the next leader.
    pub leader_read_ms: Option<f64>,
    pub error: Option<String>,
}

/// p50 and max of one figure over the repetitions that measured it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Spread {
    pub samples: usize,
    pub p50_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl Spread {
    fn of(values: impl Iterator<Item = Option<f64>>) -> Spread {
        let mut v: Vec<f64> = values.flatten().collect();
        v.sort_by(f64::total_cmp);
        Spread {
            samples: v.len(),
            p50_ms: v.get(v.len().saturating_sub(1) / 2).copied(),
            max_ms: v.last().copied(),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct FailoverFindings {
    pub elections: u32,
    pub candidates: u32,
    pub ttl_ms: u64,
    pub crash: Vec<FailoverRep>,
    pub kill: Vec<FailoverRep>,
    pub crash_observed: Spread,
    pub crash_leader_read: Spread,
    pub kill_served: Spread,
    pub kill_observed: Spread,
    pub kill_leader_read: Spread,
    /// GRANTED events whose token was not above the previous one.
    pub token_regressions: u64,
    /// Repetitions that did not see a next leader in time.
    pub failed_reps: u64,
}

enum Command {
    /// Renew once more, answer when that renewal was confirmed, then stop
    /// renewing without releasing.
    Crash(oneshot::Sender<Instant>),
    /// Release now.
    Resign,
}

struct Holding {
    token: i64,
    commands: mpsc::UnboundedSender<Command>,
}

/// What the controller knows of one election.
struct ElectionState {
    name: String,
    holder: Mutex<Option<Holding>>,
    /// The latest GRANTED event the observer received: token, when.
    granted: watch::Sender<(i64, Option<Instant>)>,
    regressions: AtomicU64,
}

impl ElectionState {
    fn holder(&self) -> std::sync::MutexGuard<'_, Option<Holding>> {
        self.holder.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub async fn run(
    ctx: &RunContext,
    config: &FailoverConfig,
    cluster: Option<&Arc<Mutex<LocalCluster>>>,
) -> Result<FailoverFindings, BenchError> {
    if config.elections == 0 || config.candidates < 2 {
        return Err(BenchError::InvalidArgument(
            "failover: need at least one election and two candidates".to_owned(),
        ));
    }
    if config.kill_reps > 0 && cluster.is_none() {
        return Err(BenchError::InvalidArgument(
            "failover kills nodes, so it needs a local cluster (drop --endpoints, or \
             --kill-reps 0)"
                .to_owned(),
        ));
    }
    let connect = || async {
        Client::connect(ctx.endpoints.clone(), ClientConfig::default())
            .await
            .map_err(|e| BenchError::InvalidArgument(format!("election client: {e}")))
    };
    let mut tasks = Vec::new();
    let mut elections = Vec::new();
    for e in 0..config.elections {
        let state = Arc::new(ElectionState {
            name: format!("{}/election/e{e}", super::TENANT),
            holder: Mutex::new(None),
            granted: watch::Sender::new((0, None)),
            regressions: AtomicU64::new(0),
        });
        tasks.push(tokio::spawn(observer(connect().await?, state.clone())));
        for c in 0..config.candidates {
            tasks.push(tokio::spawn(candidate(
                connect().await?,
                state.clone(),
                format!("candidate-{c}"),
                config.ttl_ms,
            )));
        }
        elections.push(state);
    }
    let reader = connect().await?;

    let mut findings = FailoverFindings {
        elections: config.elections,
        candidates: config.candidates,
        ttl_ms: config.ttl_ms,
        ..FailoverFindings::default()
    };
    let timeout = Duration::from_millis(config.ttl_ms) + Duration::from_secs(REP_TIMEOUT_S);
    for rep in 0..config.crash_reps {
        let state = &elections[rep as usize % elections.len()];
        let result = crash_rep(&reader, state, timeout).await;
        if ctx.progress {
            eprintln!("failover (a) leader crash: {result:?}");
        }
        findings.crash.push(result);
    }
    for rep in 0..config.kill_reps {
        let state = &elections[rep as usize % elections.len()];
        let Some(cluster) = cluster else { break };
        let result = kill_rep(ctx, &reader, state, cluster, timeout).await;
        if ctx.progress {
            eprintln!("failover (b) shard leader node killed: {result:?}");
        }
        findings.kill.push(result);
    }
    for t in &tasks {
        t.abort();
    }

    findings.crash_observed = Spread::of(findings.crash.iter().map(|r| r.observed_ms));
    findings.crash_leader_read = Spread::of(findings.crash.iter().map(|r| r.leader_read_ms));
    findings.kill_served = Spread::of(findings.kill.iter().map(|r| r.served_ms));
    findings.kill_observed = Spread::of(findings.kill.iter().map(|r| r.observed_ms));
    findings.kill_leader_read = Spread::of(findings.kill.iter().map(|r| r.leader_read_ms));
    findings.token_regressions = elections
        .iter()
        .map(|e| e.regressions.load(Ordering::Relaxed))
        .sum();
    findings.failed_reps = findings
        .crash
        .iter()
        .chain(&findings.kill)
        .filter(|r| r.error.is_some())
        .count() as u64;
    Ok(findings)
}

fn ms_since(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64() * 1000.0
}

/// Waits until the election has a holder whose GRANTED the observer has
/// received; returns its token and command channel.
async fn wait_stable(
    state: &ElectionState,
    timeout: Duration,
) -> Result<(i64, mpsc::UnboundedSender<Command>), String> {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        let observed = state.granted.borrow().0;
        if let Some(h) = state.holder().as_ref() {
            if h.token == observed {
                return Ok((h.token, h.commands.clone()));
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    Err(format!("{}: no observed leader in time", state.name))
}

/// Waits until the observer receives a GRANTED with a token above `token`.
async fn wait_next_granted(
    state: &ElectionState,
    token: i64,
    timeout: Duration,
) -> Option<Instant> {
    let mut rx = state.granted.subscribe();
    tokio::time::timeout(timeout, async {
        loop {
            if let (t, Some(at)) = *rx.borrow_and_update() {
                if t > token {
                    return Some(at);
                }
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Reads `leader()` from `t0` on: when it first answered, and when it first
/// named a leader other than `token`'s.
fn poll_leader(
    reader: &Client,
    name: &str,
    token: i64,
    timeout: Duration,
) -> tokio::task::JoinHandle<(Option<Instant>, Option<Instant>)> {
    let election = reader.election(name);
    tokio::spawn(async move {
        let until = Instant::now() + timeout;
        let mut served = None;
        while Instant::now() < until {
            if let Ok(leader) = election.leader().await {
                let now = Instant::now();
                served.get_or_insert(now);
                if leader.is_some_and(|l| l.fencing_token > token) {
                    return (served, Some(now));
                }
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        (served, None)
    })
}

async fn crash_rep(reader: &Client, state: &ElectionState, timeout: Duration) -> FailoverRep {
    let mut rep = FailoverRep {
        election: state.name.clone(),
        ..FailoverRep::default()
    };
    let (token, commands) = match wait_stable(state, timeout).await {
        Ok(h) => h,
        Err(e) => {
            rep.error = Some(e);
            return rep;
        }
    };
    let (tx, rx) = oneshot::channel();
    let _ = commands.send(Command::Crash(tx));
    let Ok(t0) = rx.await else {
        rep.error = Some("the leader was gone before it crashed".to_owned());
        return rep;
    };
    let poller = poll_leader(reader, &state.name, token, timeout);
    let seen = wait_next_granted(state, token, timeout).await;
    let (_, read) = poller.await.unwrap_or((None, None));
    rep.observed_ms = seen.map(|t| ms_since(t0, t));
    rep.leader_read_ms = read.map(|t| ms_since(t0, t));
    if seen.is_none() {
        rep.error = Some("no next leader observed in time".to_owned());
    }
    rep
}

async fn kill_rep(
    ctx: &RunContext,
    reader: &Client,
    state: &ElectionState,
    cluster: &Arc<Mutex<LocalCluster>>,
    timeout: Duration,
) -> FailoverRep {
    let mut rep = FailoverRep {
        election: state.name.clone(),
        ..FailoverRep::default()
    };
    let (token, commands) = match wait_stable(state, timeout).await {
        Ok(h) => h,
        Err(e) => {
            rep.error = Some(e);
            return rep;
        }
    };
    let Some(index) = ctx.backend.leader_of(&state.name).await else {
        rep.error = Some("the shard's leader is not known".to_owned());
        return rep;
    };
    let victim = index + 1;
    rep.killed_node = Some(victim);
    let t0 = Instant::now();
    let killed = cluster
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .kill(victim);
    if let Err(e) = killed {
        rep.error = Some(e.to_string());
        return rep;
    }
    let _ = commands.send(Command::Resign);
    let poller = poll_leader(reader, &state.name, token, timeout);
    let seen = wait_next_granted(state, token, timeout).await;
    let (served, read) = poller.await.unwrap_or((None, None));
    rep.served_ms = served.map(|t| ms_since(t0, t));
    rep.observed_ms = seen.map(|t| ms_since(t0, t));
    rep.leader_read_ms = read.map(|t| ms_since(t0, t));
    if seen.is_none() {
        rep.error = Some("no next leader observed in time".to_owned());
    }
    let restarted = cluster
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .restart(victim);
    if let Err(e) = restarted {
        rep.error.get_or_insert(e.to_string());
        return rep;
    }
    if let Err(e) = ctx.backend.wait_ready().await {
        rep.error.get_or_insert(format!("after the restart: {e}"));
    }
    tokio::time::sleep(Duration::from_millis(SETTLE_MS)).await;
    rep
}

/// One campaigner: queues for the lease, holds it (renewing it itself)
/// until told to crash or resign or the lease is lost, and queues again.
async fn candidate(client: Client, state: Arc<ElectionState>, value: String, ttl_ms: u64) {
    let renew_every = Duration::from_millis(ttl_ms / 3);
    loop {
        let options = AcquireOptions {
            lease_ttl_ms: ttl_ms,
            wait_timeout_ms: MAX_WAIT_TIMEOUT_MS,
            value: value.clone().into_bytes(),
            ..AcquireOptions::default()
        };
        let response = match client.acquire_unguarded(&state.name, options).await {
            Ok((response, _)) if response.lease_state() == LeaseState::Held => response,
            Ok(_) => continue,
            Err(e) => {
                if !e.is_lock_held() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let (tx, mut commands) = mpsc::unbounded_channel();
        let token = response.fencing_token;
        *state.holder() = Some(Holding {
            token,
            commands: tx,
        });
        let lease_id = response.lease_id;
        loop {
            tokio::select! {
                () = tokio::time::sleep(renew_every) => {
                    match client.renew_unguarded(&state.name, &lease_id, 0).await {
                        Err(e) if e.reason() == Some(Reason::LeaseNotHeld) => break,
                        _ => {}
                    }
                }
                command = commands.recv() => {
                    match command {
                        // Crash just after a confirmed renewal, so the
                        // lease has its whole TTL left.
                        Some(Command::Crash(reply))
                            if client.renew_unguarded(&state.name, &lease_id, 0).await.is_ok() =>
                        {
                            let _ = reply.send(Instant::now());
                        }
                        Some(Command::Resign) => {
                            let _ = client.release_unguarded(&state.name, &lease_id).await;
                        }
                        Some(Command::Crash(_)) | None => {}
                    }
                    break;
                }
            }
        }
        let mut holder = state.holder();
        if holder.as_ref().is_some_and(|h| h.token == token) {
            *holder = None;
        }
    }
}

/// Follows the election, resuming after the last revision; publishes every
/// GRANTED event to the controller.
async fn observer(client: Client, state: Arc<ElectionState>) {
    let election = client.election(state.name.clone());
    let mut after: Option<Revision> = None;
    let mut last_token = 0;
    loop {
        let mut stream = match election.observe(after).await {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(event)) => {
                    let at = Instant::now();
                    after = event.revision.or(after);
                    if event.kind() == WatchEventKind::Granted {
                        if event.fencing_token <= last_token {
                            state.regressions.fetch_add(1, Ordering::Relaxed);
                        }
                        last_token = event.fencing_token;
                        state.granted.send_replace((event.fencing_token, Some(at)));
                    } else if event.kind() == WatchEventKind::State && event.held {
                        // The leader when the watch started (or after a
                        // gap): already granted.
                        last_token = last_token.max(event.fencing_token);
                        state.granted.send_if_modified(|g| {
                            let newer = event.fencing_token > g.0;
                            if newer {
                                *g = (event.fencing_token, Some(at));
                            }
                            newer
                        });
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    if !ClientError::from_status(status).resumes_watch() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
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

    #[test]
    fn spread_takes_the_median_and_max_of_what_was_measured() {
        let s = Spread::of([Some(3.0), None, Some(1.0), Some(2.0)].into_iter());
        assert_eq!((s.samples, s.p50_ms, s.max_ms), (3, Some(2.0), Some(3.0)));
        assert_eq!(Spread::of(std::iter::empty()).p50_ms, None);
    }
}
