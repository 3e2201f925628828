//! `saturate`: the highest lock-operation rate a target sustains with
//! acquire p99 under a bound.
//!
//! Open loop, in steps: each step offers `rate` lock operations per second
//! as uncontended acquire → release pairs (an acquire and its release are
//! two lock operations, both committed) on random free resources, for
//! `step_s` seconds. A step *holds* when acquire p99 stays within
//! `p99_bound_ms`, at most [`MAX_FAILED_RATIO`] of requests fail, and the
//! target completes at least [`MIN_DELIVERED_RATIO`] of what was offered.
//! The rate grows by `growth` per step until a step fails; a failed step is
//! run once more at the same rate (`confirm_misses`), so that one stall of a
//! shared host cannot end the search: only a rate that fails twice in a row
//! is a miss. Then one step halfway between the last good rate and the
//! missed one narrows the answer. The result is the highest rate that held.
//!
//! Open loop matters here: past capacity, queues grow and the latency
//! counted from the schedule explodes, so the boundary is sharp. A
//! closed-loop run would instead settle at capacity with flattering
//! latency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{resource_name, FreeSet, RunContext};
use crate::error::BenchError;
use crate::outcome::{Op, Outcome};
use crate::schedule::OpenLoop;
use crate::stats::Recorder;

/// Lock operations per second of the first step.
pub const DEFAULT_START_RATE_PER_S: f64 = 500.0;
/// Factor between steps.
pub const DEFAULT_GROWTH: f64 = 1.5;
pub const DEFAULT_STEP_S: u64 = 10;
/// The brief's bound on uncontended acquire p99.
pub const DEFAULT_P99_BOUND_MS: f64 = 200.0;
pub const DEFAULT_MAX_STEPS: u32 = 12;
/// Repeats of a failed step before its rate counts as missed.
pub const DEFAULT_CONFIRM_MISSES: u32 = 1;
/// Closed loop: callers of the first step, and the most of any step.
pub const DEFAULT_START_CLIENTS: u32 = 4;
pub const DEFAULT_MAX_CLIENTS: u32 = 1_024;
/// Resources to pick from: enough that picks rarely wait for a free one.
const RESOURCES: u32 = 100_000;
/// Failed requests a holding step may have, as a share of all.
pub const MAX_FAILED_RATIO: f64 = 0.01;
/// Share of the offered operations a holding step must complete.
pub const MIN_DELIVERED_RATIO: f64 = 0.9;
/// Leases of the pairs (released at once; the TTL only matters if a
/// release is lost).
const TTL_MS: u64 = 30_000;

/// How load is offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LoadMode {
    /// A rate per second, whatever the target's latency (the default).
    Open,
    /// A number of callers, each starting its next pair when the last one
    /// ended; doubles per step up to `max_clients`.
    Closed,
}

#[derive(Clone, Debug, Serialize)]
pub struct SaturateConfig {
    pub mode: LoadMode,
    /// Closed loop: callers in the first and the last step.
    pub start_clients: u32,
    pub max_clients: u32,
    pub start_rate_per_s: f64,
    pub growth: f64,
    pub step_s: u64,
    pub p99_bound_ms: f64,
    /// Most rates tried while growing (repeats not counted).
    pub max_steps: u32,
    /// Open loop: how often a failed step is repeated at the same rate
    /// before the rate counts as missed.
    pub confirm_misses: u32,
}

impl Default for SaturateConfig {
    fn default() -> Self {
        SaturateConfig {
            mode: LoadMode::Open,
            start_clients: DEFAULT_START_CLIENTS,
            max_clients: DEFAULT_MAX_CLIENTS,
            start_rate_per_s: DEFAULT_START_RATE_PER_S,
            growth: DEFAULT_GROWTH,
            step_s: DEFAULT_STEP_S,
            p99_bound_ms: DEFAULT_P99_BOUND_MS,
            max_steps: DEFAULT_MAX_STEPS,
            confirm_misses: DEFAULT_CONFIRM_MISSES,
        }
    }
}

/// One step's result.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// Offered lock operations per second.
    pub offered_per_s: f64,
    /// Completed (successful) lock operations per second.
    pub delivered_per_s: f64,
    pub acquire_p50_ms: f64,
    pub acquire_p99_ms: f64,
    pub release_p99_ms: f64,
    pub failed: u64,
    pub held: bool,
    /// Successful lock operations (acquires and releases) in the step.
    pub lock_ops: u64,
    /// The nodes' CPU time over the step per successful lock operation,
    /// µs, summed over the nodes (`None`: not this run's processes).
    pub server_cpu_us_per_lock_op: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SaturateFindings {
    pub steps: Vec<Step>,
    /// The highest offered rate that held, in lock operations per second
    /// (0 if even the first step failed).
    pub best_ops_per_s: f64,
}

pub async fn run(
    ctx: &RunContext,
    config: &SaturateConfig,
) -> Result<SaturateFindings, BenchError> {
    if config.growth <= 1.0 || config.start_rate_per_s <= 0.0 || config.step_s == 0 {
        return Err(BenchError::InvalidArgument(
            "saturate: need growth > 1, a positive start rate and step".to_owned(),
        ));
    }
    let free = Arc::new(FreeSet::new(RESOURCES));
    if config.mode == LoadMode::Closed {
        return run_closed(ctx, config, &free).await;
    }
    let mut findings = SaturateFindings::default();
    while let Some(rate) = next_rate(config, &findings.steps) {
        let step = run_step(ctx, config, &free, rate).await?;
        findings.steps.push(step);
    }
    findings.best_ops_per_s = best_held(&findings.steps);
    Ok(findings)
}

/// The open-loop search as a function of the steps so far: the rate of the
/// next step, or `None` when the search is over (see the module docs).
fn next_rate(config: &SaturateConfig, steps: &[Step]) -> Option<f64> {
    let Some(last) = steps.last() else {
        return Some(config.start_rate_per_s);
    };
    // The first rate that failed `confirm_misses + 1` times in a row.
    let missed = steps
        .windows(config.confirm_misses as usize + 1)
        .filter(|w| {
            w.iter()
                .all(|s| !s.held && s.offered_per_s == w[0].offered_per_s)
        })
        .map(|w| w[0].offered_per_s)
        .next();
    match missed {
        // Failed, not yet confirmed: repeat the rate.
        None if !last.held => Some(last.offered_per_s),
        None => {
            let rates_tried = distinct_rates(steps);
            (rates_tried < config.max_steps).then_some(last.offered_per_s * config.growth)
        }
        Some(bad) => {
            // The last rate that held before the miss; the middle step
            // does not move it (one narrowing step, not a bisection).
            let first_bad = steps
                .iter()
                .position(|s| s.offered_per_s == bad)
                .unwrap_or(steps.len());
            let good = best_held(&steps[..first_bad]);
            if good <= 0.0 || good >= bad {
                return None;
            }
            let middle = (good + bad) / 2.0;
            let (held, failed) = steps
                .iter()
                .filter(|s| s.offered_per_s == middle)
                .fold((false, 0u32), |(h, f), s| {
                    (h || s.held, f + u32::from(!s.held))
                });
            (!held && failed <= config.confirm_misses).then_some(middle)
        }
    }
}

/// Distinct offered rates among `steps`.
fn distinct_rates(steps: &[Step]) -> u32 {
    let mut rates: Vec<f64> = steps.iter().map(|s| s.offered_per_s).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    rates.len() as u32
}

/// The highest offered rate of a step that held (0 if none did).
fn best_held(steps: &[Step]) -> f64 {
    steps
        .iter()
        .filter(|s| s.held)
        .map(|s| s.offered_per_s)
        .fold(0.0, f64::max)
}

/// Closed loop: doubles the callers per step; the result is the best
/// delivered rate among the steps that held.
async fn run_closed(
    ctx: &RunContext,
    config: &SaturateConfig,
    free: &Arc<FreeSet>,
) -> Result<SaturateFindings, BenchError> {
    let mut findings = SaturateFindings::default();
    let mut clients = config.start_clients.max(1);
    for _ in 0..config.max_steps {
        let step_recorder = Arc::new(Recorder::new());
        let cpu_before = ctx.server_cpu_now();
        let start = Instant::now();
        let end = start + Duration::from_secs(config.step_s);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..clients {
            let (ctx, free, step_recorder) = (ctx.clone(), free.clone(), step_recorder.clone());
            tasks.spawn(async move {
                while Instant::now() < end {
                    let Some(index) = free.take() else { break };
                    pair(&ctx, &free, &step_recorder, index, Instant::now()).await;
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        // A closed loop offers exactly what it delivers: judged on latency
        // and failures only (rate 0).
        let mut step = judge(config, &step_recorder, start, 0.0);
        step.offered_per_s = step.delivered_per_s;
        step.server_cpu_us_per_lock_op = cpu_per_op(cpu_before, ctx.server_cpu_now(), &step);
        if ctx.progress {
            eprintln!(
                "saturate (closed, {clients} callers): {:.0} ops/s, acquire p99 {:.1} ms -> {}",
                step.delivered_per_s,
                step.acquire_p99_ms,
                if step.held { "held" } else { "FAILED" }
            );
        }
        let held = step.held;
        if held {
            findings.best_ops_per_s = findings.best_ops_per_s.max(step.delivered_per_s);
        }
        findings.steps.push(step);
        if !held || clients >= config.max_clients {
            break;
        }
        clients = (clients * 2).min(config.max_clients);
    }
    Ok(findings)
}

/// One acquire → release pair on free resource `index`, due at `due`.
async fn pair(
    ctx: &RunContext,
    free: &FreeSet,
    step_recorder: &Recorder,
    index: u32,
    due: Instant,
) {
    let record = |op, due, outcome, error: Option<&str>| {
        let done = Instant::now();
        ctx.recorder.record(op, due, done, outcome, error);
        step_recorder.record(op, due, done, outcome, error);
    };
    let _slot = ctx.in_flight.acquire().await;
    let name = resource_name("saturate", index);
    match ctx.backend.acquire(&name, TTL_MS, 0, ctx.op_timeout).await {
        Ok(held) => {
            record(Op::Acquire, due, Outcome::Ok, None);
            let sent = Instant::now();
            match ctx.backend.release(&held, ctx.op_timeout).await {
                Ok(()) => {
                    record(Op::Release, sent, Outcome::Ok, None);
                    free.put_back(index);
                }
                Err(e) => record(Op::Release, sent, e.outcome, Some(&e.message)),
            }
        }
        Err(e) => {
            record(Op::Acquire, due, e.outcome, Some(&e.message));
            if e.outcome == Outcome::Conflict {
                free.put_back(index);
            }
        }
    }
}

/// Turns a step's measurements into a [`Step`].
fn judge(config: &SaturateConfig, step_recorder: &Recorder, start: Instant, rate: f64) -> Step {
    let summary = step_recorder.summary();
    let elapsed_s = start.elapsed().as_secs_f64().max(config.step_s as f64);
    let acquire = summary.ops.get(&Op::Acquire);
    let release = summary.ops.get(&Op::Release);
    let ok = |s: Option<&crate::stats::OpSummary>| {
        s.map_or(0, |s| s.outcomes.get("ok").copied().unwrap_or(0))
    };
    let total: u64 = summary.ops.values().map(|s| s.total).sum();
    let failed = summary.failed();
    let lock_ops = ok(acquire) + ok(release);
    let delivered_per_s = lock_ops as f64 / elapsed_s;
    let acquire_p99_ms = acquire.map_or(f64::INFINITY, |s| s.p99_ms);
    let held = acquire_p99_ms <= config.p99_bound_ms
        && (failed as f64) <= MAX_FAILED_RATIO * total.max(1) as f64
        && delivered_per_s >= MIN_DELIVERED_RATIO * rate;
    Step {
        offered_per_s: rate,
        delivered_per_s,
        acquire_p50_ms: acquire.map_or(0.0, |s| s.p50_ms),
        acquire_p99_ms,
        release_p99_ms: release.map_or(0.0, |s| s.p99_ms),
        failed,
        held,
        lock_ops,
        server_cpu_us_per_lock_op: None,
    }
}

/// CPU µs per successful lock operation of `step`, from the nodes' CPU
/// seconds at its start and end.
fn cpu_per_op(before: Option<f64>, after: Option<f64>, step: &Step) -> Option<f64> {
    let (before, after) = (before?, after?);
    (step.lock_ops > 0).then(|| (after - before).max(0.0) * 1e6 / step.lock_ops as f64)
}

/// Offers `rate` lock ops/s for one step; the step's measurements also go
/// to `ctx.recorder` (the whole profile's view).
async fn run_step(
    ctx: &RunContext,
    config: &SaturateConfig,
    free: &Arc<FreeSet>,
    rate: f64,
) -> Result<Step, BenchError> {
    let step_recorder = Arc::new(Recorder::new());
    let cpu_before = ctx.server_cpu_now();
    let start = Instant::now();
    let end = start + Duration::from_secs(config.step_s);
    // Each pair is two operations.
    let mut pacer = OpenLoop::new(rate / 2.0, start, end)?;
    let progress = ctx.progress.then(|| {
        crate::progress::spawn(
            step_recorder.clone(),
            Duration::from_secs(config.step_s),
            None,
            Arc::new(move || format!("step at {rate:.0} ops/s")),
        )
    });
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(due) = pacer.tick().await {
        let Some(index) = free.take() else {
            continue;
        };
        let (ctx, free, step_recorder) = (ctx.clone(), free.clone(), step_recorder.clone());
        tasks.spawn(async move { pair(&ctx, &free, &step_recorder, index, due).await });
    }
    // Requests still in flight belong to this step: wait for them, so their
    // latency is counted and the next step starts clean.
    while tasks.join_next().await.is_some() {}
    if let Some(p) = progress {
        p.abort();
    }
    let mut step = judge(config, &step_recorder, start, rate);
    step.server_cpu_us_per_lock_op = cpu_per_op(cpu_before, ctx.server_cpu_now(), &step);
    let held = step.held;
    if ctx.progress {
        eprintln!(
            "\nsaturate: offered {:.0} ops/s, delivered {:.0}, acquire p99 {:.1} ms, failed {} -> {}",
            step.offered_per_s,
            step.delivered_per_s,
            step.acquire_p99_ms,
            step.failed,
            if held { "held" } else { "FAILED" }
        );
    }
    Ok(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rate: f64, held: bool) -> Step {
        Step {
            offered_per_s: rate,
            delivered_per_s: rate,
            acquire_p50_ms: 1.0,
            acquire_p99_ms: if held { 10.0 } else { 500.0 },
            release_p99_ms: 1.0,
            failed: 0,
            held,
            lock_ops: rate as u64,
            server_cpu_us_per_lock_op: None,
        }
    }

    #[test]
    fn a_steps_cpu_per_op_is_the_nodes_cpu_over_its_successful_ops() {
        let s = step(400.0, true);
        let per_op = cpu_per_op(Some(10.0), Some(10.02), &s).unwrap();
        assert!((per_op - 50.0).abs() < 1e-6, "{per_op}");
        assert_eq!(cpu_per_op(None, Some(1.0), &s), None);
        let idle = Step { lock_ops: 0, ..s };
        assert_eq!(cpu_per_op(Some(1.0), Some(2.0), &idle), None);
    }

    /// Runs the search against a target whose outcome at each call is
    /// given by `holds(rate, attempt_at_that_rate)`.
    fn search(config: &SaturateConfig, holds: impl Fn(f64, u32) -> bool) -> (Vec<Step>, f64) {
        let mut steps: Vec<Step> = Vec::new();
        while let Some(rate) = next_rate(config, &steps) {
            assert!(steps.len() < 64, "the search must end: {steps:?}");
            let attempt = steps.iter().filter(|s| s.offered_per_s == rate).count() as u32;
            steps.push(step(rate, holds(rate, attempt)));
        }
        let best = best_held(&steps);
        (steps, best)
    }

    fn rates(steps: &[Step]) -> Vec<f64> {
        steps.iter().map(|s| s.offered_per_s).collect()
    }

    fn config() -> SaturateConfig {
        SaturateConfig {
            start_rate_per_s: 1_000.0,
            growth: 2.0,
            ..SaturateConfig::default()
        }
    }

    #[test]
    fn one_stall_does_not_end_the_search() {
        // 4,000 ops/s fails once (a stall), then holds; capacity is 10,000.
        let (steps, best) = search(&config(), |rate, attempt| {
            rate <= 10_000.0 && !(rate == 4_000.0 && attempt == 0)
        });
        assert_eq!(
            rates(&steps),
            vec![
                1_000.0, 2_000.0, 4_000.0, 4_000.0, 8_000.0, 16_000.0, 16_000.0, 12_000.0, 12_000.0
            ]
        );
        assert_eq!(best, 8_000.0);
    }

    #[test]
    fn a_rate_that_fails_twice_is_missed_and_the_middle_is_tried() {
        let (steps, best) = search(&config(), |rate, _| rate <= 5_000.0);
        assert_eq!(
            rates(&steps),
            vec![1_000.0, 2_000.0, 4_000.0, 8_000.0, 8_000.0, 6_000.0, 6_000.0]
        );
        assert_eq!(best, 4_000.0);
        // The middle holding ends the search at once.
        let (steps, best) = search(&config(), |rate, _| rate <= 6_000.0);
        assert_eq!(steps.last().map(|s| s.offered_per_s), Some(6_000.0));
        assert_eq!(best, 6_000.0);
    }

    #[test]
    fn without_confirmation_the_first_failure_is_a_miss() {
        let config = SaturateConfig {
            confirm_misses: 0,
            ..config()
        };
        let (steps, best) = search(&config, |rate, attempt| !(rate == 4_000.0 && attempt == 0));
        assert_eq!(rates(&steps), vec![1_000.0, 2_000.0, 4_000.0, 3_000.0]);
        assert_eq!(best, 3_000.0);
    }

    #[test]
    fn the_search_stops_after_max_steps_rates_or_a_failed_start() {
        let config = SaturateConfig {
            max_steps: 3,
            ..config()
        };
        let (steps, best) = search(&config, |_, _| true);
        assert_eq!(steps.len(), 3);
        assert_eq!(best, 4_000.0);
        let (steps, best) = search(&config, |_, _| false);
        assert_eq!(
            steps.len(),
            2,
            "the start rate is confirmed, then nothing is left"
        );
        assert_eq!(best, 0.0);
    }
}
