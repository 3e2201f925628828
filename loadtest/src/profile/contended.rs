//! `contended`: a few hot resources, each with a queue of waiting callers,
//! closed loop.
//!
//! `clients_per_resource` callers per hot resource loop: acquire with a
//! wait (joining the resource's queue), hold for `hold_ms`, release. This
//! measures what the brief asks of hot locks:
//!
//! * **hand-off**: from the holder *sending* its release to the next waiter
//!   *receiving* its grant ([`Op::Handoff`]). A good hand-off costs one
//!   commit — the release's — since the grant to the next waiter is made by
//!   the same apply; compare with the release latency (one commit round
//!   trip) measured in the same run.
//! * **FIFO order**: grants per resource should follow the order the
//!   waiters asked in. A grant counts as an inversion when a waiter that
//!   sent its acquire more than [`FIFO_SLACK_MS`] later was granted first
//!   (the slack covers requests crossing on the wire).
//! * **fencing tokens** must rise with every grant of a resource; a grant
//!   whose token is not above the previous one is counted (must be 0).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{resource_name, RunContext};
use crate::error::BenchError;
use crate::outcome::{Op, Outcome};

pub const DEFAULT_HOT_RESOURCES: u32 = 4;
pub const DEFAULT_CLIENTS_PER_RESOURCE: u32 = 8;
pub const DEFAULT_HOLD_MS: u64 = 10;
pub const DEFAULT_WAIT_MS: u64 = 10_000;
pub const DEFAULT_TTL_MS: u64 = 30_000;
pub const DEFAULT_DURATION_S: u64 = 30;
/// How much later a waiter may have sent its acquire and still be granted
/// before an earlier one without counting as a FIFO inversion.
pub const FIFO_SLACK_MS: u64 = 5;

#[derive(Clone, Debug, Serialize)]
pub struct ContendedConfig {
    pub hot_resources: u32,
    pub clients_per_resource: u32,
    pub hold_ms: u64,
    pub wait_ms: u64,
    pub ttl_ms: u64,
    pub duration_s: u64,
}

impl Default for ContendedConfig {
    fn default() -> Self {
        ContendedConfig {
            hot_resources: DEFAULT_HOT_RESOURCES,
            clients_per_resource: DEFAULT_CLIENTS_PER_RESOURCE,
            hold_ms: DEFAULT_HOLD_MS,
            wait_ms: DEFAULT_WAIT_MS,
            ttl_ms: DEFAULT_TTL_MS,
            duration_s: DEFAULT_DURATION_S,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ContendedFindings {
    pub grants: u64,
    /// Grants that jumped the queue (see the module docs).
    pub fifo_inversions: u64,
    /// Grants whose token was not above the resource's previous grant's.
    pub token_regressions: u64,
}

/// One grant, as the caller saw it.
#[derive(Clone, Copy, Debug)]
struct Grant {
    sent: Instant,
    granted: Instant,
    token: i64,
}

/// Per hot resource: when its holder sent the release the next grant
/// follows, and every grant.
#[derive(Default)]
struct HotState {
    release_sent: Option<Instant>,
    grants: Vec<Grant>,
}

pub async fn run(
    ctx: &RunContext,
    config: &ContendedConfig,
) -> Result<ContendedFindings, BenchError> {
    if config.hot_resources == 0 || config.clients_per_resource < 2 {
        return Err(BenchError::InvalidArgument(
            "contended: need at least one hot resource and two clients per resource".to_owned(),
        ));
    }
    let hot: Vec<Arc<Mutex<HotState>>> =
        (0..config.hot_resources).map(|_| Arc::default()).collect();
    let end = Instant::now() + Duration::from_secs(config.duration_s);
    ctx.recorder.restart();
    let progress = ctx.progress.then(|| {
        crate::progress::spawn(
            ctx.recorder.clone(),
            Duration::from_secs(config.duration_s),
            None,
            Arc::new(|| "closed loop".to_owned()),
        )
    });
    let mut tasks = Vec::new();
    for (r, state) in hot.iter().enumerate() {
        for _ in 0..config.clients_per_resource {
            tasks.push(tokio::spawn(client(
                ctx.clone(),
                config.clone(),
                resource_name("hot", r as u32),
                state.clone(),
                end,
            )));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Some(p) = progress {
        p.abort();
    }
    let mut findings = ContendedFindings::default();
    for state in &hot {
        let state = state.lock().unwrap_or_else(|e| e.into_inner());
        let (inversions, regressions) = check_order(&state.grants);
        findings.grants += state.grants.len() as u64;
        findings.fifo_inversions += inversions;
        findings.token_regressions += regressions;
    }
    Ok(findings)
}

/// One caller looping on one hot resource until `end`.
async fn client(
    ctx: RunContext,
    config: ContendedConfig,
    resource: String,
    state: Arc<Mutex<HotState>>,
    end: Instant,
) {
    while Instant::now() < end {
        let sent = Instant::now();
        let result = ctx
            .backend
            .acquire(&resource, config.ttl_ms, config.wait_ms, ctx.op_timeout)
            .await;
        let granted = Instant::now();
        let held = match result {
            Ok(held) => held,
            Err(e) => {
                ctx.recorder
                    .record(Op::Acquire, sent, granted, e.outcome, Some(&e.message));
                continue;
            }
        };
        ctx.recorder
            .record(Op::Acquire, sent, granted, Outcome::Ok, None);
        {
            let mut st = lock(&state);
            if let Some(release_sent) = st.release_sent.take() {
                ctx.recorder
                    .record(Op::Handoff, release_sent, granted, Outcome::Ok, None);
            }
            st.grants.push(Grant {
                sent,
                granted,
                token: held.token,
            });
        }
        tokio::time::sleep(Duration::from_millis(config.hold_ms)).await;
        let release_sent = Instant::now();
        lock(&state).release_sent = Some(release_sent);
        let result = ctx.backend.release(&held, ctx.op_timeout).await;
        let done = Instant::now();
        match result {
            Ok(()) => ctx
                .recorder
                .record(Op::Release, release_sent, done, Outcome::Ok, None),
            Err(e) => {
                lock(&state).release_sent = None;
                ctx.recorder
                    .record(Op::Release, release_sent, done, e.outcome, Some(&e.message));
            }
        }
    }
}

fn lock(state: &Mutex<HotState>) -> std::sync::MutexGuard<'_, HotState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts FIFO inversions and token regressions in one resource's grants.
fn check_order(grants: &[Grant]) -> (u64, u64) {
    let mut by_grant = grants.to_vec();
    by_grant.sort_by_key(|g| g.granted);
    let slack = Duration::from_millis(FIFO_SLACK_MS);
    let mut inversions = 0;
    let mut regressions = 0;
    let mut latest_sent: Option<Instant> = None;
    let mut last_token: Option<i64> = None;
    for g in &by_grant {
        if latest_sent.is_some_and(|latest| g.sent + slack < latest) {
            inversions += 1;
        }
        latest_sent = Some(latest_sent.map_or(g.sent, |l| l.max(g.sent)));
        if last_token.is_some_and(|t| g.token <= t) {
            regressions += 1;
        }
        last_token = Some(g.token);
    }
    (inversions, regressions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(base: Instant, sent_ms: u64, granted_ms: u64, token: i64) -> Grant {
        Grant {
            sent: base + Duration::from_millis(sent_ms),
            granted: base + Duration::from_millis(granted_ms),
            token,
        }
    }

    #[test]
    fn grants_in_asking_order_with_rising_tokens_are_clean() {
        let t = Instant::now();
        let grants = [grant(t, 0, 10, 1), grant(t, 2, 20, 2), grant(t, 3, 30, 3)];
        assert_eq!(check_order(&grants), (0, 0));
    }

    #[test]
    fn a_late_asker_granted_first_is_an_inversion_and_a_lower_token_a_regression() {
        let t = Instant::now();
        // Asked at 100 ms but granted before the one that asked at 0.
        let grants = [grant(t, 100, 10, 5), grant(t, 0, 20, 4)];
        assert_eq!(check_order(&grants), (1, 1));
    }
}
