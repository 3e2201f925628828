//! CPU time and memory of a process, from `/proc` (Linux).

use serde::Serialize;

/// One reading of a process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ProcSample {
    /// User + system CPU time since the process started, in seconds.
    pub cpu_s: f64,
    /// Resident memory now, in KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident memory since the process started, in KiB (`VmHWM`).
    pub peak_rss_kib: u64,
}

/// Clock ticks per second of `/proc/<pid>/stat` times.
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        // The value on every Linux in practice.
        100.0
    }
}

/// Reads `pid`'s CPU time and memory, or `None` if it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let cpu_ticks = cpu_ticks(&stat)?;
    Some(ProcSample {
        cpu_s: cpu_ticks as f64 / ticks_per_s(),
        rss_kib: status_kib(&status, "VmRSS:").unwrap_or(0),
        peak_rss_kib: status_kib(&status, "VmHWM:").unwrap_or(0),
    })
}

/// utime + stime from a `/proc/<pid>/stat` line. The command name (field 2)
/// may contain spaces and parentheses, so fields are counted after its last
/// `)`: utime and stime are then the 12th and 13th.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_fields_are_found_after_a_name_with_spaces_and_parens() {
        let stat =
            "1234 (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 1 2 3";
        assert_eq!(cpu_ticks(stat), Some(300));
    }

    #[test]
    fn this_process_can_be_sampled() {
        let me = sample(std::process::id()).expect("own /proc entry");
        assert!(me.peak_rss_kib >= me.rss_kib);
        assert!(me.rss_kib > 0);
    }
}
