//! The soak's steady load: the brief's `seed` shape, scaled down. Acquires
//! arrive open loop at `acquire_rate_per_s` on resources nobody else uses;
//! each lease is held for a random time around `held / rate` seconds (so
//! about `held` leases live at once, by Little's law), renewed every
//! `renew_every_ms`, then released. It is measured (latency per operation,
//! what failed), not recorded: the checked history is the chaos clients'
//! (a few hundred operations a second for hours would be millions of
//! operations to check for nothing the chaos load does not already show).
//!
//! Resources are taken in turn from a ring much larger than the held set,
//! so one is used again only long after its last lease ended: a conflict
//! means a lease outlived its release, or one was granted twice.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::lock_client::LockClient;
use super::recorder::Recorder;
use crate::history::ProcessId;

/// The background's process ids (never in the checked history).
const BACKGROUND_PROCESS: ProcessId = 20_000;
/// Leases in flight at most, as a multiple of `held`: arrivals beyond it
/// are counted as shed instead of piling up tasks while the cluster cannot
/// answer (a partition without a majority).
const MAX_IN_FLIGHT_FACTOR: u32 = 3;

#[derive(Clone, Debug)]
pub struct BackgroundConfig {
    pub acquire_rate_per_s: f64,
    /// Leases alive at steady state.
    pub held: u32,
    /// The ring of resource names (`soak/bg-N`).
    pub resources: u32,
    pub ttl_ms: u64,
    pub renew_every_ms: u64,
}

impl Default for BackgroundConfig {
    /// The brief's `seed` at one twentieth: 100 acquires, ~100 renewals and
    /// 100 releases a second, 1,000 leases of 30 s renewed every 10 s.
    fn default() -> Self {
        BackgroundConfig {
            acquire_rate_per_s: 100.0,
            held: 1_000,
            resources: 10_000,
            ttl_ms: 30_000,
            renew_every_ms: 10_000,
        }
    }
}

impl BackgroundConfig {
    /// Refuses numbers that cannot make the shape they describe.
    pub fn check(&self) -> Result<(), String> {
        if !(self.acquire_rate_per_s > 0.0 && self.acquire_rate_per_s <= 10_000.0) {
            return Err(format!(
                "background acquire rate must be in (0, 10000] per second, got {}",
                self.acquire_rate_per_s
            ));
        }
        if self.held == 0 || self.resources < self.held.saturating_mul(4) {
            return Err(format!(
                "background resources ({}) must be at least 4 × held ({}) so no lease meets another",
                self.resources, self.held
            ));
        }
        if self.renew_every_ms == 0 || self.renew_every_ms * 2 > self.ttl_ms {
            return Err(format!(
                "background renewals every {} ms must be at most half the TTL ({} ms)",
                self.renew_every_ms, self.ttl_ms
            ));
        }
        Ok(())
    }

    fn mean_hold(&self) -> Duration {
        Duration::from_secs_f64(f64::from(self.held) / self.acquire_rate_per_s)
    }
}

/// Latencies of one operation, in microseconds, and how many failed.
#[derive(Clone, Debug, Default)]
pub struct OpStats {
    pub latencies_us: Vec<u64>,
    pub failed: u64,
}

impl OpStats {
    fn record(&mut self, ok: bool, took: Duration) {
        if ok {
            self.latencies_us.push(took.as_micros() as u64);
        } else {
            self.failed += 1;
        }
    }

    /// The `q` quantile (0..=1) in milliseconds, of the successful calls.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let mut sorted = self.latencies_us.clone();
        sorted.sort_unstable();
        let last = sorted.len().checked_sub(1)?;
        let i = ((last as f64) * q).round() as usize;
        Some(sorted[i.min(last)] as f64 / 1_000.0)
    }
}

/// What the background load saw.
#[derive(Clone, Debug, Default)]
pub struct BackgroundReport {
    pub acquire: OpStats,
    pub renew: OpStats,
    pub release: OpStats,
    /// Arrivals dropped because `MAX_IN_FLIGHT_FACTOR × held` leases were
    /// already in flight.
    pub shed: u64,
}

impl std::fmt::Display for BackgroundReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, s) in [
            ("acquire", &self.acquire),
            ("renew", &self.renew),
            ("release", &self.release),
        ] {
            let q = |q| {
                s.quantile_ms(q)
                    .map_or("-".to_owned(), |v| format!("{v:.1}"))
            };
            writeln!(
                f,
                "background {name:<8} ok {:>9}  failed {:>6}  p50 {} ms  p99 {} ms  p99.9 {} ms",
                s.latencies_us.len(),
                s.failed,
                q(0.5),
                q(0.99),
                q(0.999)
            )?;
        }
        writeln!(f, "background shed (too many in flight): {}", self.shed)
    }
}

/// The running background load.
pub struct Background {
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<BackgroundReport>>,
    task: tokio::task::JoinHandle<()>,
}

impl Background {
    pub fn start(cfg: &BackgroundConfig, endpoints: &[String], seed: u64) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(BackgroundReport::default()));
        let task = tokio::spawn(arrivals(
            cfg.clone(),
            LockClient::new(BACKGROUND_PROCESS, endpoints, Recorder::discard()),
            seed,
            stop.clone(),
            report.clone(),
        ));
        Background { stop, report, task }
    }

    /// Stops new arrivals and waits up to `grace` for the leases in flight
    /// to be released.
    pub async fn finish(self, grace: Duration) -> BackgroundReport {
        self.stop.store(true, Ordering::Relaxed);
        let _ = tokio::time::timeout(grace, self.task).await;
        let report = self.report.lock().unwrap_or_else(|e| e.into_inner());
        report.clone()
    }
}

async fn arrivals(
    cfg: BackgroundConfig,
    client: LockClient,
    seed: u64,
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<BackgroundReport>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb4c6_0f3d);
    let in_flight = Arc::new(Semaphore::new((cfg.held * MAX_IN_FLIGHT_FACTOR) as usize));
    let next_resource = Arc::new(AtomicU64::new(0));
    let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / cfg.acquire_rate_per_s));
    // Late ticks are skipped, not bunched: an open loop that falls behind
    // sheds instead of bursting.
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut leases = tokio::task::JoinSet::new();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        every.tick().await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            report.lock().unwrap_or_else(|e| e.into_inner()).shed += 1;
            continue;
        };
        n += 1;
        let index = next_resource.fetch_add(1, Ordering::Relaxed) % u64::from(cfg.resources);
        let hold = cfg.mean_hold().mul_f64(rng.random_range(0.5..1.5));
        let lease = Lease {
            client: client.sharing(BACKGROUND_PROCESS + 1 + n % 1_000, Recorder::discard()),
            resource: format!("soak/bg-{index}"),
            request_id: format!("soak-{seed:x}-{n}"),
            hold,
            cfg: cfg.clone(),
            report: report.clone(),
        };
        leases.spawn(async move {
            lease.run().await;
            drop(permit);
        });
        // Reap finished leases so the set does not grow for hours.
        while leases.try_join_next().is_some() {}
    }
    while leases.join_next().await.is_some() {}
}

struct Lease {
    client: LockClient,
    resource: String,
    request_id: String,
    hold: Duration,
    cfg: BackgroundConfig,
    report: Arc<Mutex<BackgroundReport>>,
}

impl Lease {
    async fn run(mut self) {
        let started = Instant::now();
        let grant = self
            .client
            .acquire(&self.resource, &self.request_id, self.cfg.ttl_ms, 0)
            .await;
        self.note(|r| &mut r.acquire, grant.is_some(), started.elapsed());
        let Some(grant) = grant else { return };
        let release_at = started + self.hold;
        let renew_every = Duration::from_millis(self.cfg.renew_every_ms);
        let mut next_renew = started + renew_every;
        while next_renew < release_at {
            tokio::time::sleep_until(next_renew).await;
            let sent = Instant::now();
            let renewed = self
                .client
                .renew(&self.resource, &grant.lease_id, self.cfg.ttl_ms)
                .await;
            self.note(|r| &mut r.renew, renewed.is_some(), sent.elapsed());
            if renewed.is_none() {
                // Lost (or unknown): a real client stops using it.
                return;
            }
            next_renew += renew_every;
        }
        tokio::time::sleep_until(release_at).await;
        let sent = Instant::now();
        let released = self.client.release(&self.resource, &grant.lease_id).await;
        self.note(|r| &mut r.release, released == Some(true), sent.elapsed());
    }

    fn note(&self, which: fn(&mut BackgroundReport) -> &mut OpStats, ok: bool, took: Duration) {
        let mut report = self.report.lock().unwrap_or_else(|e| e.into_inner());
        which(&mut report).record(ok, took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_seed_shape_and_bad_shapes_are_refused() {
        let cfg = BackgroundConfig::default();
        assert_eq!(cfg.check(), Ok(()));
        assert_eq!(cfg.mean_hold(), Duration::from_secs(10));
        let too_few = BackgroundConfig {
            resources: 2_000,
            ..cfg.clone()
        };
        assert!(too_few.check().unwrap_err().contains("4 × held"));
        let slow_renew = BackgroundConfig {
            renew_every_ms: 20_000,
            ..cfg.clone()
        };
        assert!(slow_renew.check().is_err());
        let zero = BackgroundConfig {
            acquire_rate_per_s: 0.0,
            ..cfg
        };
        assert!(zero.check().is_err());
    }

    #[test]
    fn quantiles_are_of_the_successful_calls() {
        let mut s = OpStats::default();
        assert_eq!(s.quantile_ms(0.99), None);
        for us in 1..=1_000 {
            s.record(true, Duration::from_micros(us * 1_000));
        }
        s.record(false, Duration::from_secs(60));
        assert_eq!(s.failed, 1);
        assert_eq!(s.quantile_ms(0.5), Some(501.0));
        assert_eq!(s.quantile_ms(0.99), Some(990.0));
    }
}
