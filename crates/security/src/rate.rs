//! Per-tenant request rate limits at the service edge: one token bucket per
//! tenant per node. Time is passed in (`now_ms`), so the buckets are plain
//! arithmetic and unit-testable; the service passes the wall clock.

use std::collections::HashMap;
use std::sync::Mutex;

/// Most tenants tracked at once per node. Beyond it, buckets that are full
/// again (idle tenants) are forgotten first; a forgotten tenant starts
/// again with a full bucket, which is what an idle one has anyway.
pub const MAX_TRACKED_TENANTS: usize = 100_000;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Tokens, in thousandths, so refills of a fraction of a token per
    /// millisecond add up exactly.
    milli_tokens: u64,
    updated_ms: u64,
}

/// Token buckets: `rate_per_sec` requests per second sustained, `burst`
/// at once. A rate of 0 turns limiting off.
#[derive(Debug)]
pub struct TenantRateLimiter {
    rate_per_sec: u64,
    burst: u64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl TenantRateLimiter {
    pub fn new(rate_per_sec: u64, burst: u64) -> TenantRateLimiter {
        TenantRateLimiter {
            rate_per_sec,
            burst: burst.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn rate_per_sec(&self) -> u64 {
        self.rate_per_sec
    }

    /// Takes one token from `tenant`'s bucket at time `now_ms`; `Err` with
    /// the milliseconds until a token is due when the bucket is empty.
    pub fn admit(&self, tenant: &str, now_ms: u64) -> Result<(), u64> {
        if self.rate_per_sec == 0 {
            return Ok(());
        }
        let full = self.burst * 1_000;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_TRACKED_TENANTS && !buckets.contains_key(tenant) {
            let rate = self.rate_per_sec;
            buckets.retain(|_, b| refilled(b, now_ms, rate, full) < full);
            if buckets.len() >= MAX_TRACKED_TENANTS {
                // Every tracked tenant is busy: refuse newcomers rather
                // than grow without bound.
                return Err(1_000 / self.rate_per_sec.max(1));
            }
        }
        let bucket = buckets.entry(tenant.to_owned()).or_insert(Bucket {
            milli_tokens: full,
            updated_ms: now_ms,
        });
        bucket.milli_tokens = refilled(bucket, now_ms, self.rate_per_sec, full);
        bucket.updated_ms = bucket.updated_ms.max(now_ms);
        if bucket.milli_tokens >= 1_000 {
            bucket.milli_tokens -= 1_000;
            Ok(())
        } else {
            // rate tokens per second = rate milli-tokens per millisecond.
            let missing = 1_000 - bucket.milli_tokens;
            Err(missing.div_ceil(self.rate_per_sec))
        }
    }
}

/// The bucket's milli-tokens at `now_ms` (a clock going back adds none).
fn refilled(bucket: &Bucket, now_ms: u64, rate_per_sec: u64, full: u64) -> u64 {
    let elapsed = now_ms.saturating_sub(bucket.updated_ms);
    bucket
        .milli_tokens
        .saturating_add(elapsed.saturating_mul(rate_per_sec))
        .min(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_admitted_then_the_rate_holds() {
        let l = TenantRateLimiter::new(10, 3);
        for _ in 0..3 {
            l.admit("acme", 1_000).unwrap();
        }
        // Empty: the next token is due in 100 ms at 10/s.
        assert_eq!(l.admit("acme", 1_000), Err(100));
        assert_eq!(l.admit("acme", 1_050), Err(50));
        l.admit("acme", 1_100).unwrap();
        assert!(l.admit("acme", 1_100).is_err());
    }

    #[test]
    fn one_tenant_exhausted_does_not_affect_another() {
        let l = TenantRateLimiter::new(1, 1);
        l.admit("acme", 0).unwrap();
        assert!(l.admit("acme", 0).is_err());
        l.admit("beta", 0).unwrap();
    }

    #[test]
    fn the_bucket_refills_only_to_the_burst() {
        let l = TenantRateLimiter::new(100, 2);
        l.admit("acme", 0).unwrap();
        // An hour idle still gives only `burst` tokens.
        for _ in 0..2 {
            l.admit("acme", 3_600_000).unwrap();
        }
        assert!(l.admit("acme", 3_600_000).is_err());
    }

    #[test]
    fn a_clock_going_back_adds_no_tokens() {
        let l = TenantRateLimiter::new(10, 1);
        l.admit("acme", 10_000).unwrap();
        assert!(l.admit("acme", 5_000).is_err());
    }

    #[test]
    fn rate_zero_means_unlimited() {
        let l = TenantRateLimiter::new(0, 1);
        for _ in 0..1_000 {
            l.admit("acme", 0).unwrap();
        }
    }
}
