//! The node's configuration file.
//!
//! A node reads one TOML file (`fencelock serve --config PATH`). Only the
//! node's identity has no default: `node_id`, `listen_addr`, `data_dir` and
//! `peers`, and the `[tls]` section must either name the TLS files or say
//! `insecure = true` (development only). Everything else has a default
//! chosen for the design load in the brief, and every value is range-checked before the node starts: a typo is
//! refused (`deny_unknown_fields`) and a bad value is refused with the
//! dotted key (`raft.election_ticks`) and the allowed range, never clamped.
//!
//! ```toml
//! node_id = 1
//! listen_addr = "127.0.0.1:7001"
//! data_dir = "/var/lib/fencelock"
//! peers = [
//!   { id = 1, addr = "127.0.0.1:7001" },
//!   { id = 2, addr = "127.0.0.1:7002" },
//!   { id = 3, addr = "127.0.0.1:7003" },
//! ]
//!
//! [raft]
//! tick_interval_ms = 100
//!
//! [lock]
//! default_lease_ttl_ms = 30000
//!
//! [tls]
//! ca_file = "/etc/fencelock/tls/ca.crt"
//! cert_file = "/etc/fencelock/tls/node-1.crt"
//! key_file = "/etc/fencelock/tls/node-1.key"
//! ```
//!
//! The `[lock]` section must be identical on every node: the limits are
//! part of every shard's replicated state, and replicas applying different
//! rules to the same log would disagree.
//!
//! Any key may be overridden by an environment variable
//! (`FENCELOCK_RAFT_TICK_INTERVAL_MS=50`) or a `--set raft.tick_interval_ms=50`
//! flag ([`overrides`]); [`NodeConfig::load_with`] applies them before
//! validating. `docs/configuration.md` documents every key with its default
//! (a test checks that it does).

mod controller;
mod ops;
pub mod overrides;
mod security;

pub use controller::{ControllerConfig, MAX_NODE_DOWN_AFTER_MS, MIN_NODE_DOWN_AFTER_MS};
pub use ops::{
    AuditConfig, AuditTargetKind, LogConfig, LogFormat, ShutdownConfig, MAX_DRAIN_TIMEOUT_MS,
};
pub use overrides::Override;
pub use security::{EdgeConfig, TlsConfig, MAX_MESSAGE_BYTES_LIMIT, MIN_MESSAGE_BYTES};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencelock_statemachine::limits::MAX_CLOCK_OFFSET_ALLOWANCE_MS;
use fencelock_statemachine::Limits;
use serde::{Deserialize, Serialize};

/// Most members a cluster may start with. Raft groups of more than seven
/// replicas pay more in write fan-out than they gain in fault tolerance.
pub const MAX_PEERS: usize = 7;
/// Most shards a node may be configured with.
pub const MAX_SHARDS: u32 = 256;
/// Largest config file read, in bytes. A config is a few kilobytes; anything
/// near this is the wrong file.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;
/// Longest group-commit window, in µs. Beyond a few milliseconds the wait
/// costs more commit latency than the fsyncs it saves.
pub const MAX_GROUP_COMMIT_WINDOW_US: u64 = 20_000;

/// One node's configuration. Build it with [`NodeConfig::load`],
/// [`NodeConfig::from_toml_str`] (both validate) or [`NodeConfig::for_test`];
/// call [`NodeConfig::validate`] after changing fields in code.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's id in the cluster, at least 1. Must appear in `peers`.
    pub node_id: u64,
    /// The `ip:port` the node binds. It serves both the client API and peer
    /// (Raft) traffic.
    pub listen_addr: String,
    /// The `host:port` other nodes and clients use to reach this node: what
    /// NOT_LEADER hints name. Defaults to `listen_addr`. Must equal this
    /// node's entry in `peers`, because other nodes hint clients with the
    /// address they know this node by.
    #[serde(default)]
    pub advertise_addr: Option<String>,
    /// The `ip:port` of the admin HTTP endpoint: Prometheus metrics at
    /// `/metrics`, the operator status page at `/`, `/healthz`. Off when
    /// absent (the default). Must differ from `listen_addr`.
    #[serde(default)]
    pub admin_listen_addr: Option<String>,
    /// Where the node keeps its RocksDB store. In a file loaded with
    /// [`NodeConfig::load`], a relative path is relative to the file's
    /// directory.
    pub data_dir: PathBuf,
    /// The static initial member list, this node included: 1 to
    /// [`MAX_PEERS`] members with unique ids and addresses.
    pub peers: Vec<PeerConfig>,
    /// Number of data shards (Raft groups) the cluster starts with,
    /// 1..=[`MAX_SHARDS`]. Used only when the cluster bootstraps; afterwards
    /// the placement map decides (`fencelock admin reshard` splits shards).
    #[serde(default = "default_shard_count")]
    pub shard_count: u32,
    /// Replicas per shard when the cluster bootstraps, 1..=7 (default 3;
    /// at most the number of `peers`). Used only at bootstrap, like
    /// `shard_count`; afterwards the placement map decides.
    #[serde(default = "default_replication_factor")]
    pub replication_factor: u32,
    /// Start as a new, empty member of a running cluster (default false):
    /// bootstrap nothing and wait for `fencelock admin add-node` and replica
    /// moves. `peers` then lists this node and at least one running member.
    #[serde(default)]
    pub join: bool,
    /// The newest placement-log format this node says it reads, reported to
    /// the controller (1..=[`fencelock_placement::PLACEMENT_FORMAT`], the
    /// default). Commands of a newer format than some member reports are
    /// refused cluster-wide. Setting it to 1 on upgraded nodes keeps every
    /// committed entry readable by the previous release, so a downgrade
    /// stays possible until it is removed (docs/operations.md, "Upgrades").
    #[serde(default = "default_max_placement_format")]
    pub max_placement_format: u32,
    /// Raft timing and the store loop's bounds.
    #[serde(default)]
    pub raft: RaftConfig,
    /// Lease defaults and the state machine's limits.
    #[serde(default)]
    pub lock: LockConfig,
    /// Log output: filter and format.
    #[serde(default)]
    pub log: LogConfig,
    /// The audit log: where, and whether renewals are included.
    #[serde(default)]
    pub audit: AuditConfig,
    /// Graceful shutdown bounds.
    #[serde(default)]
    pub shutdown: ShutdownConfig,
    /// Mutual TLS, or explicitly none (`insecure = true`, development).
    #[serde(default)]
    pub tls: TlsConfig,
    /// Limits on what callers can make the node do: message sizes,
    /// streams, connections, per-tenant request rate.
    #[serde(default)]
    pub edge: EdgeConfig,
    /// What the placement controller does by itself (repair).
    #[serde(default)]
    pub controller: ControllerConfig,
}

/// One member of the initial cluster.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// The member's node id, at least 1.
    pub id: u64,
    /// The member's advertised `host:port` (its `advertise_addr`).
    pub addr: String,
}

/// The `[raft]` section: the store loop's tuning, owned by the store.
pub use fencelock_multiraft::RaftConfig;

/// The `[lock]` section: the default lease TTL and every field of
/// [`Limits`], with the same defaults.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LockConfig {
    /// TTL of a lease whose acquire asks for 0 (default 30000 ms). Must lie
    /// within `min_lease_ttl_ms..=max_lease_ttl_ms`.
    pub default_lease_ttl_ms: u64,
    /// See [`Limits::min_lease_ttl_ms`].
    pub min_lease_ttl_ms: u64,
    /// See [`Limits::max_lease_ttl_ms`].
    pub max_lease_ttl_ms: u64,
    /// See [`Limits::max_wait_timeout_ms`].
    pub max_wait_timeout_ms: u64,
    /// See [`Limits::max_hold_ms`].
    pub max_hold_ms: u64,
    /// See [`Limits::max_waiters_per_resource`].
    pub max_waiters_per_resource: u32,
    /// See [`Limits::max_waiters_per_tenant`].
    pub max_waiters_per_tenant: u32,
    /// See [`Limits::max_held_per_tenant`].
    pub max_held_per_tenant: u32,
    /// See [`Limits::dedup_retention_ms`].
    pub dedup_retention_ms: u64,
    /// See [`Limits::max_dedup_entries`].
    pub max_dedup_entries: u32,
    /// See [`Limits::max_records`].
    pub max_records: u32,
    /// See [`Limits::max_retired_per_tick`].
    pub max_retired_per_tick: u32,
}

impl Default for LockConfig {
    fn default() -> Self {
        let Limits {
            min_lease_ttl_ms,
            max_lease_ttl_ms,
            max_wait_timeout_ms,
            max_hold_ms,
            max_waiters_per_resource,
            max_waiters_per_tenant,
            max_held_per_tenant,
            dedup_retention_ms,
            max_dedup_entries,
            max_records,
            max_retired_per_tick,
        } = Limits::default();
        LockConfig {
            default_lease_ttl_ms: 30_000,
            min_lease_ttl_ms,
            max_lease_ttl_ms,
            max_wait_timeout_ms,
            max_hold_ms,
            max_waiters_per_resource,
            max_waiters_per_tenant,
            max_held_per_tenant,
            dedup_retention_ms,
            max_dedup_entries,
            max_records,
            max_retired_per_tick,
        }
    }
}

impl LockConfig {
    /// The state machine's limits (validated by [`NodeConfig::validate`]).
    pub fn limits(&self) -> Limits {
        Limits {
            min_lease_ttl_ms: self.min_lease_ttl_ms,
            max_lease_ttl_ms: self.max_lease_ttl_ms,
            max_wait_timeout_ms: self.max_wait_timeout_ms,
            max_hold_ms: self.max_hold_ms,
            max_waiters_per_resource: self.max_waiters_per_resource,
            max_waiters_per_tenant: self.max_waiters_per_tenant,
            max_held_per_tenant: self.max_held_per_tenant,
            dedup_retention_ms: self.dedup_retention_ms,
            max_dedup_entries: self.max_dedup_entries,
            max_records: self.max_records,
            max_retired_per_tick: self.max_retired_per_tick,
        }
    }
}

fn default_replication_factor() -> u32 {
    3
}

fn default_max_placement_format() -> u32 {
    fencelock_placement::PLACEMENT_FORMAT
}

fn default_shard_count() -> u32 {
    8
}

/// Why a configuration was refused.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The text is not TOML, has an unknown key, or a value of the wrong
    /// type. The message names the key and shows the offending line.
    #[error("{}{message}", origin(path))]
    Parse {
        path: Option<PathBuf>,
        message: String,
    },
    /// A value is out of range or inconsistent with another one.
    #[error("invalid `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

fn origin(path: &Option<PathBuf>) -> String {
    match path {
        Some(path) => format!("{}: ", path.display()),
        None => String::new(),
    }
}

impl ConfigError {
    /// The dotted key of an invalid value (`raft.election_ticks`,
    /// `peers[2].addr`); `None` for read and parse errors.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }

    fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// Refuses `value` outside `min..=max`, naming `key` and the range.
fn check_range<T: PartialOrd + Display>(
    key: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    check_range_because(key, value, min, max, "")
}

/// [`check_range`] for a range that depends on other keys: `because` says
/// which (for example " (from lock.min_lease_ttl_ms)").
fn check_range_because<T: PartialOrd + Display>(
    key: &str,
    value: T,
    min: T,
    max: T,
    because: &str,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::invalid(
            key,
            format!("must be in {min}..={max}{because}, got {value}"),
        ));
    }
    Ok(())
}

/// Checks a `host:port` address (IPv6 hosts in brackets), as dialed by
/// peers and clients.
fn check_host_port(key: &str, addr: &str) -> Result<(), ConfigError> {
    let bad = |why: &str| {
        ConfigError::invalid(
            key,
            format!("must be `host:port` with a port in 1..=65535 ({why}), got {addr:?}"),
        )
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() || host.contains(char::is_whitespace) || host.contains('/') {
        return Err(bad("bad host"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(bad("IPv6 hosts go in brackets"));
    }
    match port.parse::<u16>() {
        Ok(port) if port > 0 => Ok(()),
        _ => Err(bad("bad port")),
    }
}

impl NodeConfig {
    /// Parses and validates a configuration.
    pub fn from_toml_str(text: &str) -> Result<NodeConfig, ConfigError> {
        let config = parse(text, None)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates the file at `path`. A relative `data_dir`
    /// is taken relative to the file's directory, so the node finds the same
    /// data whatever directory it was started from.
    pub fn load(path: impl AsRef<Path>) -> Result<NodeConfig, ConfigError> {
        Self::load_with(path, &[])
    }

    /// [`NodeConfig::load`] with `overrides` (environment, flags) applied
    /// over the file, in order, before validation. Relative paths in the
    /// file (`data_dir`, `audit.path`) are relative to the file's
    /// directory; relative paths in overrides to the current directory.
    pub fn load_with(
        path: impl AsRef<Path>,
        overrides: &[Override],
    ) -> Result<NodeConfig, ConfigError> {
        let path = path.as_ref();
        let read_error = |source| ConfigError::Read {
            path: path.to_owned(),
            source: Arc::new(source),
        };
        let len = std::fs::metadata(path).map_err(read_error)?.len();
        if len > MAX_CONFIG_FILE_BYTES {
            return Err(ConfigError::Parse {
                path: Some(path.to_owned()),
                message: format!(
                    "file is {len} bytes, more than the {MAX_CONFIG_FILE_BYTES} a config may have"
                ),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_error)?;
        let parse_error = |message: String| ConfigError::Parse {
            path: Some(path.to_owned()),
            message,
        };
        let base = path.parent().unwrap_or(Path::new(""));
        let config = if overrides.is_empty() {
            // Straight from the text: errors point at the offending line.
            let mut config = parse(&text, Some(path))?;
            let tls = &mut config.tls;
            for p in [
                Some(&mut config.data_dir),
                config.audit.path.as_mut(),
                tls.ca_file.as_mut(),
                tls.cert_file.as_mut(),
                tls.key_file.as_mut(),
            ]
            .into_iter()
            .flatten()
            {
                if p.is_relative() && !p.as_os_str().is_empty() {
                    *p = base.join(&*p);
                }
            }
            config
        } else {
            Self::parse_with(&text, base, overrides, parse_error)?
        };
        config.validate().map_err(|e| match e {
            // Say where an overridden bad value came from.
            ConfigError::Invalid { key, reason } => {
                match overrides.iter().rev().find(|o| o.key == key) {
                    Some(o) => ConfigError::Invalid {
                        reason: format!("{reason} (set by {})", o.source),
                        key,
                    },
                    None => ConfigError::Invalid { key, reason },
                }
            }
            other => other,
        })?;
        Ok(config)
    }

    /// Parses `text` as a table, applies `overrides`, then reads the
    /// configuration from the result.
    fn parse_with(
        text: &str,
        base: &Path,
        overrides: &[Override],
        parse_error: impl Fn(String) -> ConfigError,
    ) -> Result<NodeConfig, ConfigError> {
        let mut table: toml::Table = toml::from_str(text)
            .map_err(|e: toml::de::Error| parse_error(e.to_string().trim_end().to_owned()))?;
        resolve_relative(&mut table, "data_dir", None, base);
        resolve_relative(&mut table, "path", Some("audit"), base);
        for key in ["ca_file", "cert_file", "key_file"] {
            resolve_relative(&mut table, key, Some("tls"), base);
        }
        overrides::apply(&mut table, overrides)?;
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                let sources: Vec<&str> = overrides.iter().map(|o| o.source.as_str()).collect();
                parse_error(format!(
                    "{} (after overrides from {})",
                    e.to_string().trim_end(),
                    sources.join(", ")
                ))
            })
    }

    /// Checks every value; the error names the first bad key and its allowed
    /// range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_identity()?;
        check_range("shard_count", self.shard_count, 1, MAX_SHARDS)?;
        check_range("replication_factor", self.replication_factor, 1, 7)?;
        check_range(
            "max_placement_format",
            self.max_placement_format,
            fencelock_placement::FIRST_PLACEMENT_FORMAT,
            fencelock_placement::PLACEMENT_FORMAT,
        )?;
        self.validate_raft()?;
        self.validate_lock()?;
        self.log.validate()?;
        self.audit.validate()?;
        self.shutdown.validate()?;
        self.tls.validate()?;
        self.edge.validate()?;
        self.controller.validate()
    }

    /// Where the audit log goes.
    pub fn audit_target(&self) -> fencelock_multiraft::audit::AuditTarget {
        self.audit.target()
    }

    fn validate_identity(&self) -> Result<(), ConfigError> {
        if self.node_id == 0 {
            return Err(ConfigError::invalid(
                "node_id",
                "must be at least 1 (node ids start at 1), got 0",
            ));
        }
        if self.listen_addr.parse::<SocketAddr>().is_err() {
            return Err(ConfigError::invalid(
                "listen_addr",
                format!(
                    "must be `ip:port` (for example \"0.0.0.0:7001\"), got {:?}",
                    self.listen_addr
                ),
            ));
        }
        if let Some(advertise) = &self.advertise_addr {
            check_host_port("advertise_addr", advertise)?;
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("data_dir", "must not be empty"));
        }
        if let Some(admin) = &self.admin_listen_addr {
            let parsed = admin.parse::<SocketAddr>().map_err(|_| {
                ConfigError::invalid(
                    "admin_listen_addr",
                    format!("must be `ip:port` (for example \"0.0.0.0:9100\"), got {admin:?}"),
                )
            })?;
            let same_port = self
                .listen_addr
                .parse::<SocketAddr>()
                .is_ok_and(|l| l.port() == parsed.port() && l.port() != 0);
            if same_port {
                return Err(ConfigError::invalid(
                    "admin_listen_addr",
                    format!(
                        "must use another port than listen_addr ({}), got {admin:?}",
                        self.listen_addr
                    ),
                ));
            }
        }

        if self.peers.is_empty() || self.peers.len() > MAX_PEERS {
            return Err(ConfigError::invalid(
                "peers",
                format!(
                    "must list 1..={MAX_PEERS} members, got {}",
                    self.peers.len()
                ),
            ));
        }
        let mut ids = BTreeSet::new();
        let mut addrs = BTreeSet::new();
        for (i, peer) in self.peers.iter().enumerate() {
            if peer.id == 0 {
                return Err(ConfigError::invalid(
                    format!("peers[{i}].id"),
                    "must be at least 1 (node ids start at 1), got 0",
                ));
            }
            check_host_port(&format!("peers[{i}].addr"), &peer.addr)?;
            if !ids.insert(peer.id) {
                return Err(ConfigError::invalid(
                    format!("peers[{i}].id"),
                    format!("node id {} is listed twice; ids must be unique", peer.id),
                ));
            }
            if !addrs.insert(peer.addr.as_str()) {
                return Err(ConfigError::invalid(
                    format!("peers[{i}].addr"),
                    format!(
                        "address {:?} is listed twice; addresses must be unique",
                        peer.addr
                    ),
                ));
            }
        }
        let Some(me) = self.peers.iter().find(|p| p.id == self.node_id) else {
            return Err(ConfigError::invalid(
                "peers",
                format!(
                    "must include this node (node_id = {}), has ids {ids:?}",
                    self.node_id
                ),
            ));
        };
        if me.addr != self.advertise() {
            let source = if self.advertise_addr.is_some() {
                "advertise_addr"
            } else {
                "listen_addr (advertise_addr is not set)"
            };
            return Err(ConfigError::invalid(
                "advertise_addr",
                format!(
                    "this node's peers entry says {:?} but its {source} is {:?}; \
                     they must be equal, because other nodes send clients to the peers address",
                    me.addr,
                    self.advertise()
                ),
            ));
        }
        Ok(())
    }

    fn validate_raft(&self) -> Result<(), ConfigError> {
        let r = &self.raft;
        check_range("raft.tick_interval_ms", r.tick_interval_ms, 10, 1_000)?;
        check_range("raft.election_ticks", r.election_ticks, 5, 100)?;
        // At least two heartbeats per election timeout, so one lost
        // heartbeat does not start an election.
        let max_heartbeat = r.election_ticks / 2;
        if r.heartbeat_ticks < 1 || r.heartbeat_ticks > max_heartbeat {
            return Err(ConfigError::invalid(
                "raft.heartbeat_ticks",
                format!(
                    "must be in 1..={max_heartbeat} (at most half of raft.election_ticks = {}), got {}",
                    r.election_ticks, r.heartbeat_ticks
                ),
            ));
        }
        check_range(
            "raft.proposal_timeout_ms",
            r.proposal_timeout_ms,
            100,
            60_000,
        )?;
        check_range(
            "raft.max_commands_per_entry",
            r.max_commands_per_entry,
            1,
            4_096,
        )?;
        check_range(
            "raft.snapshot_interval_entries",
            r.snapshot_interval_entries,
            100,
            1_000_000,
        )?;
        check_range(
            "raft.store_queue_depth",
            r.store_queue_depth,
            1_024,
            1_048_576,
        )?;
        check_range("raft.peer_queue_depth", r.peer_queue_depth, 64, 1_048_576)?;
        check_range(
            "raft.clock_offset_allowance_ms",
            r.clock_offset_allowance_ms,
            0,
            MAX_CLOCK_OFFSET_ALLOWANCE_MS,
        )?;
        check_range(
            "raft.group_commit_window_us",
            r.group_commit_window_us,
            0,
            MAX_GROUP_COMMIT_WINDOW_US,
        )
    }

    fn validate_lock(&self) -> Result<(), ConfigError> {
        const DAY_MS: u64 = 24 * 3_600_000;
        let l = &self.lock;
        // Explicit ranges first, so the message names the range; they mirror
        // `Limits::validate`, which runs last as the authority.
        check_range("lock.min_lease_ttl_ms", l.min_lease_ttl_ms, 1, 7 * DAY_MS)?;
        check_range_because(
            "lock.max_lease_ttl_ms",
            l.max_lease_ttl_ms,
            l.min_lease_ttl_ms,
            7 * DAY_MS,
            " (at least lock.min_lease_ttl_ms, at most 7 days)",
        )?;
        check_range_because(
            "lock.default_lease_ttl_ms",
            l.default_lease_ttl_ms,
            l.min_lease_ttl_ms,
            l.max_lease_ttl_ms,
            " (lock.min_lease_ttl_ms..=lock.max_lease_ttl_ms)",
        )?;
        check_range("lock.max_wait_timeout_ms", l.max_wait_timeout_ms, 0, DAY_MS)?;
        check_range_because(
            "lock.max_hold_ms",
            l.max_hold_ms,
            l.max_lease_ttl_ms,
            30 * DAY_MS,
            " (at least lock.max_lease_ttl_ms, at most 30 days)",
        )?;
        check_range(
            "lock.max_waiters_per_resource",
            l.max_waiters_per_resource,
            1,
            1_000_000,
        )?;
        check_range(
            "lock.max_waiters_per_tenant",
            l.max_waiters_per_tenant,
            1,
            10_000_000,
        )?;
        check_range(
            "lock.max_held_per_tenant",
            l.max_held_per_tenant,
            1,
            100_000_000,
        )?;
        check_range("lock.dedup_retention_ms", l.dedup_retention_ms, 0, DAY_MS)?;
        check_range(
            "lock.max_dedup_entries",
            l.max_dedup_entries,
            1,
            100_000_000,
        )?;
        check_range("lock.max_records", l.max_records, 1, 100_000_000)?;
        check_range(
            "lock.max_retired_per_tick",
            l.max_retired_per_tick,
            1,
            1_000_000,
        )?;
        l.limits()
            .validate()
            .map_err(|e| ConfigError::invalid(format!("lock.{}", e.field), e.reason))
    }

    /// The state machine's limits from the `[lock]` section.
    pub fn limits(&self) -> Limits {
        self.lock.limits()
    }

    /// What the store loop needs of this configuration.
    pub fn store_config(&self) -> fencelock_multiraft::StoreConfig {
        fencelock_multiraft::StoreConfig {
            node_id: self.node_id,
            initial_members: self.peer_map(),
            shard_count: self.shard_count,
            replication_factor: self.replication_factor,
            join: self.join,
            limits: self.limits(),
            raft: self.raft.clone(),
        }
    }

    /// Node id → advertised address of every initial member, this node
    /// included.
    pub fn peer_map(&self) -> BTreeMap<u64, String> {
        self.peers.iter().map(|p| (p.id, p.addr.clone())).collect()
    }

    /// The address other nodes and clients reach this node at:
    /// `advertise_addr`, else `listen_addr`.
    pub fn advertise(&self) -> &str {
        self.advertise_addr.as_deref().unwrap_or(&self.listen_addr)
    }

    /// `listen_addr` parsed.
    pub fn listen_socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen_addr.parse().map_err(|_| {
            ConfigError::invalid(
                "listen_addr",
                format!("must be `ip:port`, got {:?}", self.listen_addr),
            )
        })
    }

    /// A valid configuration for in-process tests: node `node_id` of
    /// `peers` (id → `ip:port`, this node included; it listens on its own
    /// entry), data under `data_dir`, 4 shards, and fast timings: 20 ms
    /// ticks (elections after 200–400 ms), 2 s proposal timeout, 100 ms
    /// clock-offset allowance, snapshots every 1000 entries. Lock limits are
    /// the defaults. Adjust fields and call [`NodeConfig::validate`] again
    /// if needed.
    ///
    /// Panics if `node_id` is not in `peers` or the result does not
    /// validate.
    pub fn for_test(
        node_id: u64,
        data_dir: impl Into<PathBuf>,
        peers: impl IntoIterator<Item = (u64, impl Into<String>)>,
    ) -> NodeConfig {
        let peers: Vec<PeerConfig> = peers
            .into_iter()
            .map(|(id, addr)| PeerConfig {
                id,
                addr: addr.into(),
            })
            .collect();
        let listen_addr = peers
            .iter()
            .find(|p| p.id == node_id)
            .unwrap_or_else(|| panic!("for_test: node {node_id} is not in peers {peers:?}"))
            .addr
            .clone();
        let config = NodeConfig {
            node_id,
            listen_addr,
            advertise_addr: None,
            admin_listen_addr: None,
            data_dir: data_dir.into(),
            peers,
            shard_count: 4,
            replication_factor: 3,
            join: false,
            max_placement_format: default_max_placement_format(),
            raft: RaftConfig::for_test(),
            lock: LockConfig::default(),
            log: LogConfig::default(),
            audit: AuditConfig::default(),
            // Tests stop nodes often; a bounded, short drain keeps them fast.
            shutdown: ShutdownConfig {
                drain_timeout_ms: 5_000,
            },
            // In-process tests run without TLS (tests/real_process/security.rs covers it).
            tls: TlsConfig {
                insecure: true,
                ..TlsConfig::default()
            },
            edge: EdgeConfig::default(),
            controller: ControllerConfig::default(),
        };
        if let Err(e) = config.validate() {
            panic!("for_test: the test config does not validate: {e}");
        }
        config
    }
}

fn parse(text: &str, path: Option<&Path>) -> Result<NodeConfig, ConfigError> {
    toml::from_str(text).map_err(|e: toml::de::Error| ConfigError::Parse {
        path: path.map(Path::to_owned),
        message: e.to_string().trim_end().to_owned(),
    })
}

/// Makes the relative path at `key` (in `section`, or top-level) relative to
/// `base` instead of the current directory.
fn resolve_relative(table: &mut toml::Table, key: &str, section: Option<&str>, base: &Path) {
    let holder = match section {
        Some(name) => match table.get_mut(name).and_then(|v| v.as_table_mut()) {
            Some(t) => t,
            None => return,
        },
        None => table,
    };
    if let Some(toml::Value::String(p)) = holder.get_mut(key) {
        let path = Path::new(p.as_str());
        if path.is_relative() && !p.is_empty() {
            *p = base.join(path).to_string_lossy().into_owned();
        }
    }
}
