//! The progress line printed while a profile runs: elapsed time, requests
//! per second and last-second p99 per operation, failures so far, and a
//! profile-specific note (held leases, the current step). On a terminal it
//! rewrites one line; into a pipe or file it prints a line every few
//! seconds.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::outcome::Op;
use crate::stats::Recorder;

/// How often the line is refreshed on a terminal.
const TERMINAL_REFRESH_MS: u64 = 1_000;
/// How often a line is printed when stderr is not a terminal.
const LOG_REFRESH_MS: u64 = 5_000;

/// A profile-specific note for the line.
pub type Note = Arc<dyn Fn() -> String + Send + Sync>;

/// Prints progress until aborted. `window` is the measured window's length,
/// starting at `window_start` (now, if `None`).
pub fn spawn(
    recorder: Arc<Recorder>,
    window: Duration,
    window_start: Option<Instant>,
    note: Note,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let terminal = std::io::stderr().is_terminal();
        let every = Duration::from_millis(if terminal {
            TERMINAL_REFRESH_MS
        } else {
            LOG_REFRESH_MS
        });
        let start = window_start.unwrap_or_else(Instant::now);
        let mut last: Vec<(Op, u64)> = Vec::new();
        let mut last_at = Instant::now();
        loop {
            tokio::time::sleep(every).await;
            let now = Instant::now();
            let dt = now.duration_since(last_at).as_secs_f64().max(1e-3);
            last_at = now;
            let rows = recorder.progress();
            let mut line = if now < start {
                format!("[warm-up {:>3.0}s]", (start - now).as_secs_f64())
            } else {
                format!(
                    "[{:>4.0}s/{:.0}s]",
                    now.duration_since(start).as_secs_f64(),
                    window.as_secs_f64()
                )
            };
            let mut failed_total = 0;
            for (op, ok, failed, p99) in &rows {
                let before = last.iter().find(|(o, _)| o == op).map_or(0, |(_, n)| *n);
                let rate = ok.saturating_sub(before) as f64 / dt;
                failed_total += failed;
                line.push_str(&format!(" {} {rate:>6.0}/s", op.name()));
                if let Some(p99) = p99 {
                    line.push_str(&format!(" p99 {p99:.1}ms"));
                }
            }
            last = rows.iter().map(|(op, ok, _, _)| (*op, *ok)).collect();
            line.push_str(&format!(" | failed {failed_total} | {}", note()));
            let mut err = std::io::stderr().lock();
            if terminal {
                let _ = write!(err, "\r\x1b[2K{line}");
            } else {
                let _ = writeln!(err, "{line}");
            }
            let _ = err.flush();
        }
    })
}
