//! [`ClientConfig`]: timeouts, backoff and the stop-by margin, with the
//! limits that bound them.

use std::time::Duration;

use crate::error::ClientError;

/// Most seed endpoints a client accepts. A cluster has a handful of nodes;
/// a longer list is almost certainly a configuration mistake, and each seed
/// keeps a connection.
pub const MAX_ENDPOINTS: usize = 16;

/// Most items in one `RenewBatch` call: the server's limit (1024 by default,
/// BATCH_TOO_LARGE above it). Leases beyond it are renewed in further calls.
pub const MAX_RENEW_BATCH: usize = 1024;

/// Longest `wait_timeout_ms` the client sends: the server's default maximum.
/// A longer wait is refused by the client before any call, since the server
/// would refuse it anyway (WAIT_TIMEOUT_OUT_OF_RANGE).
pub const MAX_WAIT_TIMEOUT_MS: u64 = 300_000;

/// Longest acceptable per-call deadline. Bounds how long any call (and any
/// retry loop) can keep a caller waiting.
pub const MAX_CALL_TIMEOUT_MS: u64 = 600_000;

/// Largest stop-by margin, as a percentage of the TTL. Above half the TTL
/// the margin would leave too little of the lease to be useful.
pub const MAX_STOP_BY_MARGIN_PERCENT: u32 = 50;

/// The defaults of [`ClientConfig`].
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_ATTEMPT_TIMEOUT_MS: u64 = 3_000;
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 2_000;
pub const DEFAULT_BACKOFF_BASE_MS: u64 = 50;
pub const DEFAULT_BACKOFF_MAX_MS: u64 = 2_000;
/// A few percent of the TTL covers clock-rate drift between the client and
/// the servers (real clocks drift by parts per million; this leaves room for
/// virtualised clocks and scheduling delays too).
pub const DEFAULT_STOP_BY_MARGIN_PERCENT: u32 = 5;

/// How the client times, retries and protects calls. Every duration is in
/// milliseconds, as in the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Deadline of one logical call (get, release, a non-waiting acquire),
    /// retries included. A waiting acquire gets `wait_timeout_ms` on top, so
    /// that the server's answer arrives before the client gives up.
    pub call_timeout_ms: u64,
    /// Deadline of one attempt of a call that does not wait in a queue, so a
    /// hung node costs one attempt rather than the whole call. Renewals use
    /// at most a third of the lease TTL per attempt.
    pub attempt_timeout_ms: u64,
    /// Deadline of opening a connection to a node.
    pub connect_timeout_ms: u64,
    /// First step of the exponential backoff between retries (when the
    /// server suggests none); doubles per retry up to `backoff_max_ms`, with
    /// jitter.
    pub backoff_base_ms: u64,
    /// Largest backoff step.
    pub backoff_max_ms: u64,
    /// The stop-by margin, as a percentage of the lease TTL: the client
    /// tells the application to stop this long before the lease could end by
    /// its own clock, to cover clock-rate drift (see the crate docs).
    pub stop_by_margin_percent: u32,
    /// Mutual TLS: the CA that signed the servers' certificates and this
    /// client's certificate and key (default none: plaintext, for servers
    /// in insecure dev mode). With it, endpoints without a scheme are
    /// dialed with `https://`.
    pub tls: Option<ClientTls>,
}

/// PEM texts for mutual TLS. The client's certificate carries its identity
/// (`spiffe://fencelock/tenant/<tenant>/<name>`, docs/security.md).
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl ClientTls {
    /// Reads the three PEM files.
    pub fn from_files(
        ca_file: impl AsRef<std::path::Path>,
        cert_file: impl AsRef<std::path::Path>,
        key_file: impl AsRef<std::path::Path>,
    ) -> Result<ClientTls, ClientError> {
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                ClientError::InvalidConfig(format!("tls {what} {}: {e}", path.display()))
            })
        };
        Ok(ClientTls {
            ca_pem: read("CA file", ca_file.as_ref())?,
            cert_pem: read("certificate file", cert_file.as_ref())?,
            key_pem: read("key file", key_file.as_ref())?,
        })
    }

    pub(crate) fn tonic_config(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            call_timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
            attempt_timeout_ms: DEFAULT_ATTEMPT_TIMEOUT_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            backoff_base_ms: DEFAULT_BACKOFF_BASE_MS,
            backoff_max_ms: DEFAULT_BACKOFF_MAX_MS,
            stop_by_margin_percent: DEFAULT_STOP_BY_MARGIN_PERCENT,
            tls: None,
        }
    }
}

impl ClientConfig {
    /// Checks every field against its range; names the first bad one.
    pub fn validate(&self) -> Result<(), ClientError> {
        let bad =
            |field: &str, rule: String| Err(ClientError::InvalidConfig(format!("{field}: {rule}")));
        if self.call_timeout_ms == 0 || self.call_timeout_ms > MAX_CALL_TIMEOUT_MS {
            return bad(
                "call_timeout_ms",
                format!("must be 1..={MAX_CALL_TIMEOUT_MS}"),
            );
        }
        if self.attempt_timeout_ms == 0 || self.attempt_timeout_ms > self.call_timeout_ms {
            return bad(
                "attempt_timeout_ms",
                "must be 1..=call_timeout_ms".to_owned(),
            );
        }
        if self.connect_timeout_ms == 0 || self.connect_timeout_ms > self.call_timeout_ms {
            return bad(
                "connect_timeout_ms",
                "must be 1..=call_timeout_ms".to_owned(),
            );
        }
        if self.backoff_base_ms == 0 || self.backoff_base_ms > self.backoff_max_ms {
            return bad("backoff_base_ms", "must be 1..=backoff_max_ms".to_owned());
        }
        if self.backoff_max_ms > self.call_timeout_ms {
            return bad(
                "backoff_max_ms",
                "must be at most call_timeout_ms".to_owned(),
            );
        }
        if self.stop_by_margin_percent == 0
            || self.stop_by_margin_percent > MAX_STOP_BY_MARGIN_PERCENT
        {
            return bad(
                "stop_by_margin_percent",
                format!("must be 1..={MAX_STOP_BY_MARGIN_PERCENT}"),
            );
        }
        Ok(())
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }

    pub(crate) fn attempt_timeout(&self) -> Duration {
        Duration::from_millis(self.attempt_timeout_ms)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// How much earlier than `sent_at + lease_ttl` the application must stop.
    pub(crate) fn stop_by_margin(&self, lease_ttl_ms: u64) -> Duration {
        let margin_ms = lease_ttl_ms.saturating_mul(u64::from(self.stop_by_margin_percent)) / 100;
        // Never zero: even a tiny TTL gets a margin of at least a millisecond.
        Duration::from_millis(margin_ms.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        ClientConfig::default().validate().unwrap();
    }

    #[test]
    fn each_out_of_range_field_is_named() {
        let cases: Vec<(&str, ClientConfig)> = vec![
            (
                "call_timeout_ms",
                ClientConfig {
                    call_timeout_ms: 0,
                    ..ClientConfig::default()
                },
            ),
            (
                "attempt_timeout_ms",
                ClientConfig {
                    attempt_timeout_ms: DEFAULT_CALL_TIMEOUT_MS + 1,
                    ..ClientConfig::default()
                },
            ),
            (
                "connect_timeout_ms",
                ClientConfig {
                    connect_timeout_ms: 0,
                    ..ClientConfig::default()
                },
            ),
            (
                "backoff_base_ms",
                ClientConfig {
                    backoff_base_ms: DEFAULT_BACKOFF_MAX_MS + 1,
                    ..ClientConfig::default()
                },
            ),
            (
                "stop_by_margin_percent",
                ClientConfig {
                    stop_by_margin_percent: MAX_STOP_BY_MARGIN_PERCENT + 1,
                    ..ClientConfig::default()
                },
            ),
        ];
        for (field, config) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn stop_by_margin_is_a_percentage_of_the_ttl_and_never_zero() {
        let config = ClientConfig::default();
        assert_eq!(config.stop_by_margin(30_000), Duration::from_millis(1_500));
        assert_eq!(config.stop_by_margin(10), Duration::from_millis(1));
    }
}
