//! The node's log output (`tracing`), configured by the `[log]` section.
//!
//! Owns how log lines look and which ones are written: the filter is
//! `log.filter` unless the `RUST_LOG` environment variable is set (the
//! usual way to raise verbosity for one run), and the format is `text` or
//! `json` (one object per line with `timestamp`, `level`, `target`,
//! `fields`, for log collectors). Logs go to stderr; stdout carries only
//! the startup line and, with `audit.target = "stdout"`, the audit log.

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// The environment variable that replaces `log.filter`.
pub const LOG_FILTER_ENV: &str = "RUST_LOG";

/// The filter in force: `RUST_LOG` if set and valid, else `log.filter`.
pub fn filter(config: &LogConfig) -> EnvFilter {
    match std::env::var(LOG_FILTER_ENV) {
        Ok(text) if !text.trim().is_empty() => EnvFilter::try_new(&text).unwrap_or_else(|e| {
            eprintln!("warning: ignoring {LOG_FILTER_ENV}={text:?}: {e}");
            EnvFilter::new(&config.filter)
        }),
        _ => EnvFilter::new(&config.filter),
    }
}

/// Installs the global subscriber. Call once, before the node starts; a
/// second call (tests) leaves the first in place.
pub fn init(config: &LogConfig) {
    let filter = filter(config);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(false)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => {
            // Colors only on a terminal: `fencelock dev` and log collectors
            // read the output through pipes.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            builder.with_ansi(ansi).try_init()
        }
    };
}
