//! The one clock every history timestamp comes from.
//!
//! `CLOCK_MONOTONIC` is system-wide on Linux, so the harness and the client
//! processes it starts stamp events on the same time line, and histories
//! recorded by several processes can be merged and compared. It never jumps
//! with wall-clock adjustments, which keeps invoke ≤ complete true.

/// Nanoseconds on the system-wide monotonic clock.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on
    // every Linux the project supports, so the call cannot fail.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Milliseconds as nanoseconds, for comparing TTLs with timestamps.
pub const fn ms_to_ns(ms: u64) -> u64 {
    ms * 1_000_000
}
