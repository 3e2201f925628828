//! When requests start.
//!
//! [`OpenLoop`] hands out due times at a fixed rate, independent of how
//! long earlier requests take: a request starts at its due time even if a
//! hundred before it are still waiting. Each request's latency is counted
//! from its due time, so if the harness itself falls behind (or waits for an
//! in-flight slot), that delay is charged to the measurement instead of
//! silently thinning the load — the "coordinated omission" that makes
//! closed-loop tools report flattering percentiles during a stall.
//!
//! Closed-loop load (a fixed number of workers, each starting its next
//! request when the last one ends) is what the `contended` profile and
//! `--mode closed` use; it measures what a fixed population of callers
//! sees, and is how saturation throughput is found.

use std::time::{Duration, Instant};

use crate::error::BenchError;

/// Highest rate the pacer accepts: beyond it a 2-core machine measures only
/// the harness.
pub const MAX_RATE_PER_S: f64 = 1_000_000.0;

/// Due times at `rate_per_s` from `start` until `end`.
#[derive(Debug)]
pub struct OpenLoop {
    interval: Duration,
    next: Instant,
    end: Instant,
    issued: u64,
}

impl OpenLoop {
    pub fn new(rate_per_s: f64, start: Instant, end: Instant) -> Result<OpenLoop, BenchError> {
        if !(rate_per_s > 0.0 && rate_per_s <= MAX_RATE_PER_S) {
            return Err(BenchError::InvalidArgument(format!(
                "rate must be in (0, {MAX_RATE_PER_S}] per second, got {rate_per_s}"
            )));
        }
        Ok(OpenLoop {
            interval: Duration::from_secs_f64(1.0 / rate_per_s),
            next: start,
            end,
            issued: 0,
        })
    }

    /// Waits until the next request is due and returns its due time, or
    /// `None` once the schedule has ended. When the caller is behind, due
    /// times in the past come back at once, one per call, so the backlog is
    /// sent rather than skipped.
    pub async fn tick(&mut self) -> Option<Instant> {
        let due = self.next_due()?;
        tokio::time::sleep_until(due.into()).await;
        Some(due)
    }

    /// The next due time without waiting (for tests and planning).
    pub fn next_due(&mut self) -> Option<Instant> {
        if self.next >= self.end {
            return None;
        }
        let due = self.next;
        self.issued += 1;
        self.next = due + self.interval;
        Some(due)
    }

    /// Due times handed out so far.
    pub fn issued(&self) -> u64 {
        self.issued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_times_follow_the_rate_not_the_caller() {
        let start = Instant::now();
        let mut pacer = OpenLoop::new(100.0, start, start + Duration::from_secs(1)).unwrap();
        let mut dues = Vec::new();
        while let Some(due) = pacer.next_due() {
            dues.push(due);
        }
        assert_eq!(dues.len(), 100);
        assert_eq!(dues[0], start);
        assert_eq!(dues[10] - dues[0], Duration::from_millis(100));
    }

    #[test]
    fn a_rate_of_zero_is_refused() {
        let now = Instant::now();
        assert!(OpenLoop::new(0.0, now, now).is_err());
        assert!(OpenLoop::new(f64::NAN, now, now).is_err());
    }

    #[tokio::test]
    async fn a_late_caller_gets_every_past_due_time_not_a_skip() {
        let start = Instant::now() - Duration::from_secs(1);
        let mut pacer = OpenLoop::new(10.0, start, start + Duration::from_secs(2)).unwrap();
        for k in 0..10u32 {
            let due = pacer.tick().await.unwrap();
            assert_eq!(due, start + Duration::from_millis(100) * k);
        }
        assert_eq!(pacer.issued(), 10);
    }
}
