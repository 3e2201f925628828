//! The operations sections of the node configuration: `[log]`, `[audit]`
//! and `[shutdown]`. Each may differ between nodes.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{check_range, ConfigError};
use fencelock_multiraft::audit::AuditTarget;

/// Longest graceful shutdown a node may be configured with. Orchestrators
/// kill a process that takes longer than their own grace period (30 s in
/// Kubernetes, 90 s under systemd by default); ten minutes is far beyond
/// any of them.
pub const MAX_DRAIN_TIMEOUT_MS: u64 = 600_000;
/// Longest `log.filter` accepted, in bytes.
pub const MAX_LOG_FILTER_BYTES: usize = 1_024;

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (colored on a terminal).
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The `[log]` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    pub format: LogFormat,
    /// A `tracing` filter (`RUST_LOG` syntax, e.g. `info,fencelock_server=debug`);
    /// default `info`. The `RUST_LOG` environment variable, when set,
    /// replaces it.
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            filter: "info".to_owned(),
        }
    }
}

/// Where the audit log goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditTargetKind {
    /// No audit log (default).
    #[default]
    Off,
    /// Standard output (a container's log stream).
    Stdout,
    /// The file at `audit.path`, appended to.
    File,
}

/// The `[audit]` section.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// `off` (default), `stdout` or `file`.
    pub target: AuditTargetKind,
    /// The file for `target = "file"`; relative paths are relative to the
    /// config file's directory.
    pub path: Option<PathBuf>,
    /// Also write a line per renewal (default false: renewals are most of
    /// the traffic and change no holder).
    pub include_renewals: bool,
}

impl AuditConfig {
    /// Where the sink writes.
    pub fn target(&self) -> AuditTarget {
        match (self.target, &self.path) {
            (AuditTargetKind::Off, _) => AuditTarget::Off,
            (AuditTargetKind::Stdout, _) => AuditTarget::Stdout,
            (AuditTargetKind::File, Some(p)) => AuditTarget::File(p.clone()),
            // Refused by `validate`.
            (AuditTargetKind::File, None) => AuditTarget::Off,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.target == AuditTargetKind::File
            && self.path.as_ref().is_none_or(|p| p.as_os_str().is_empty())
        {
            return Err(ConfigError::invalid(
                "audit.path",
                "must name a file when audit.target = \"file\"",
            ));
        }
        Ok(())
    }
}

/// The `[shutdown]` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// How long a graceful shutdown (SIGTERM) may take in all, 0..=600000 ms
    /// (default 20000): handing leaderships over and draining requests.
    /// Keep it below the orchestrator's kill timeout.
    pub drain_timeout_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            drain_timeout_ms: 20_000,
        }
    }
}

impl ShutdownConfig {
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "shutdown.drain_timeout_ms",
            self.drain_timeout_ms,
            0,
            MAX_DRAIN_TIMEOUT_MS,
        )
    }
}

impl LogConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.filter.len() > MAX_LOG_FILTER_BYTES {
            return Err(ConfigError::invalid(
                "log.filter",
                format!("must be at most {MAX_LOG_FILTER_BYTES} bytes"),
            ));
        }
        tracing_subscriber::EnvFilter::try_new(&self.filter).map_err(|e| {
            ConfigError::invalid(
                "log.filter",
                format!("is not a valid filter ({e}), got {:?}", self.filter),
            )
        })?;
        Ok(())
    }
}
