//! The security sections of the node configuration: `[tls]` and `[edge]`
//! (docs/security.md). Each may differ between nodes, except that every
//! node's certificate must come from the same CA.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{check_range, ConfigError};

/// Largest gRPC message a node accepts or sends. The biggest legitimate
/// message is a migration export (2 MiB, `MAX_MIGRATION_DATA_BYTES`) or a
/// Raft batch; 16 MiB leaves room without letting one request eat memory.
pub const MAX_MESSAGE_BYTES_LIMIT: usize = 16 << 20;
/// Smallest `edge.max_message_bytes`: a full renew batch (1024 items of a
/// 256-byte name and a lease id) must fit.
pub const MIN_MESSAGE_BYTES: usize = 512 << 10;

/// The `[tls]` section. TLS is on when the three files are set; a node
/// without them refuses to start unless `insecure = true` says, explicitly,
/// that this is a development setup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Run without TLS: no encryption, no authentication, every caller may
    /// do everything. For development only (default false).
    pub insecure: bool,
    /// The CA certificate(s), PEM, that signed every node, client and
    /// admin certificate. Relative paths are relative to the config file.
    pub ca_file: Option<PathBuf>,
    /// This node's certificate, PEM: URI SAN `spiffe://fencelock/node/<id>`
    /// plus the DNS names / IPs it is dialed by.
    pub cert_file: Option<PathBuf>,
    /// This node's private key, PEM.
    pub key_file: Option<PathBuf>,
}

impl TlsConfig {
    /// Whether TLS is configured (the files are set).
    pub fn enabled(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.insecure && self.enabled() {
            return Err(ConfigError::invalid(
                "tls.insecure",
                "must not be true when tls.ca_file, tls.cert_file or tls.key_file is set; \
                 choose TLS or insecure mode",
            ));
        }
        if self.insecure {
            return Ok(());
        }
        for (key, value) in [
            ("tls.ca_file", &self.ca_file),
            ("tls.cert_file", &self.cert_file),
            ("tls.key_file", &self.key_file),
        ] {
            match value {
                None if !self.enabled() => {
                    return Err(ConfigError::invalid(
                        "tls",
                        "TLS is not configured: set tls.ca_file, tls.cert_file and tls.key_file \
                         (see docs/security.md; `fencelock dev certs` makes a dev CA), or set \
                         tls.insecure = true to run without TLS for development",
                    ))
                }
                None => {
                    return Err(ConfigError::invalid(
                        key,
                        "must be set: TLS needs tls.ca_file, tls.cert_file and tls.key_file",
                    ))
                }
                Some(p) if p.as_os_str().is_empty() => {
                    return Err(ConfigError::invalid(key, "must not be empty"))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// The `[edge]` section: limits on what one caller can make a node do.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    /// Largest gRPC message decoded or encoded, in bytes,
    /// 524288..=16777216 (default 4194304).
    pub max_message_bytes: usize,
    /// Most concurrent HTTP/2 streams (calls) per connection, 1..=100000
    /// (default 1024).
    pub max_concurrent_streams: u32,
    /// Most open client and peer connections to the gRPC port, 16..=1000000
    /// (default 10000). Further connections are closed at once.
    pub max_connections: usize,
    /// Most open connections to the gRPC port from one source IP address,
    /// 1..=1000000 (default 1000): one misbehaving host cannot take every
    /// place. Further connections from it are closed at once.
    pub max_connections_per_source: usize,
    /// A new connection to the gRPC port must send its first bytes (the
    /// HTTP/2 preface or a TLS ClientHello) within this many milliseconds,
    /// or it is closed; 100..=600000 (default 10000).
    pub handshake_timeout_ms: u64,
    /// Requests per second one tenant may send to this node, sustained;
    /// 0 turns the limit off (default 0). Counted where the client called,
    /// not again where a request is forwarded.
    pub tenant_requests_per_sec: u64,
    /// Requests one tenant may send at once above the sustained rate,
    /// 1..=1000000 (default 1000).
    pub tenant_burst: u64,
    /// Free bytes the data directory's file system must keep: below it the
    /// node refuses new acquires on the shards it leads (`SERVER_BUSY`,
    /// saying why) until a quarter more than this is free again, so the
    /// disk never fills under Raft's own writes (renewals, releases,
    /// expiry, elections go on). 0..=1099511627776 (default 268435456, 256
    /// MiB); 0 turns the check off.
    pub min_free_disk_bytes: u64,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            max_message_bytes: 4 << 20,
            max_concurrent_streams: 1_024,
            max_connections: 10_000,
            max_connections_per_source: 1_000,
            handshake_timeout_ms: 10_000,
            tenant_requests_per_sec: 0,
            tenant_burst: 1_000,
            min_free_disk_bytes: 256 << 20,
        }
    }
}

impl EdgeConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "edge.max_message_bytes",
            self.max_message_bytes,
            MIN_MESSAGE_BYTES,
            MAX_MESSAGE_BYTES_LIMIT,
        )?;
        check_range(
            "edge.max_concurrent_streams",
            self.max_concurrent_streams,
            1,
            100_000,
        )?;
        check_range("edge.max_connections", self.max_connections, 16, 1_000_000)?;
        check_range(
            "edge.max_connections_per_source",
            self.max_connections_per_source,
            1,
            1_000_000,
        )?;
        check_range(
            "edge.handshake_timeout_ms",
            self.handshake_timeout_ms,
            100,
            600_000,
        )?;
        check_range(
            "edge.tenant_requests_per_sec",
            self.tenant_requests_per_sec,
            0,
            10_000_000,
        )?;
        check_range("edge.tenant_burst", self.tenant_burst, 1, 1_000_000)?;
        check_range(
            "edge.min_free_disk_bytes",
            self.min_free_disk_bytes,
            0,
            1 << 40,
        )
    }
}
