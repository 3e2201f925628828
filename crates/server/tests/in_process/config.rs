//! The node config file: defaults, one refusal per bad value (naming the key
//! and the allowed range), unknown keys, membership rules, and the example
//! files under `deploy/dev/`.

use std::path::{Path, PathBuf};

use fencelock_server::config::{ConfigError, LockConfig, NodeConfig, RaftConfig};
use fencelock_statemachine::Limits;

/// The smallest valid file: identity only.
const MINIMAL: &str = r#"
node_id = 1
listen_addr = "127.0.0.1:7001"
data_dir = "/tmp/fencelock-test/node1"
peers = [
  { id = 1, addr = "127.0.0.1:7001" },
  { id = 2, addr = "127.0.0.1:7002" },
  { id = 3, addr = "127.0.0.1:7003" },
]
tls = { insecure = true }
"#;

/// `MINIMAL` plus `extra` TOML (top-level keys, or one section: `peers` is
/// an inline array, so both may follow it).
fn with(extra: &str) -> String {
    format!("{MINIMAL}\n{extra}\n")
}

fn invalid(text: &str) -> ConfigError {
    match NodeConfig::from_toml_str(text) {
        Ok(config) => panic!("accepted:\n{text}\n{config:#?}"),
        Err(e) => e,
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn a_minimal_file_gets_every_default() {
    let config = NodeConfig::from_toml_str(MINIMAL).unwrap();
    assert_eq!(config.node_id, 1);
    assert_eq!(config.listen_addr, "127.0.0.1:7001");
    assert_eq!(config.advertise_addr, None);
    assert_eq!(config.advertise(), "127.0.0.1:7001");
    assert_eq!(config.data_dir, PathBuf::from("/tmp/fencelock-test/node1"));
    assert_eq!(config.shard_count, 8);
    assert_eq!(config.raft, RaftConfig::default());
    assert_eq!(config.lock, LockConfig::default());

    let r = &config.raft;
    assert_eq!(r.tick_interval_ms, 100);
    assert_eq!(r.election_ticks, 10);
    assert_eq!(r.heartbeat_ticks, 2);
    assert_eq!(r.proposal_timeout_ms, 5_000);
    assert_eq!(r.max_commands_per_entry, 256);
    assert_eq!(r.snapshot_interval_entries, 10_000);
    assert_eq!(r.store_queue_depth, 65_536);
    assert_eq!(r.peer_queue_depth, 8_192);
    assert_eq!(r.clock_offset_allowance_ms, 500);
    assert_eq!(r.election_timeout(), std::time::Duration::from_secs(1));

    assert_eq!(config.lock.default_lease_ttl_ms, 30_000);
    assert_eq!(config.limits(), Limits::default());

    let peers = config.peer_map();
    assert_eq!(peers.len(), 3);
    assert_eq!(peers[&2], "127.0.0.1:7002");
}

#[test]
fn every_key_can_be_set() {
    let text = with(
        r#"
advertise_addr = "127.0.0.1:7001"
shard_count = 16

[raft]
tick_interval_ms = 50
election_ticks = 20
heartbeat_ticks = 3
proposal_timeout_ms = 3000
max_commands_per_entry = 64
snapshot_interval_entries = 5000
store_queue_depth = 4096
peer_queue_depth = 1024
clock_offset_allowance_ms = 250

[lock]
default_lease_ttl_ms = 10000
min_lease_ttl_ms = 500
max_lease_ttl_ms = 60000
max_wait_timeout_ms = 30000
max_hold_ms = 3600000
max_waiters_per_resource = 16
max_waiters_per_tenant = 100
dedup_retention_ms = 60000
max_dedup_entries = 1000
max_records = 2000
max_retired_per_tick = 128
"#,
    );
    let config = NodeConfig::from_toml_str(&text).unwrap();
    assert_eq!(config.shard_count, 16);
    assert_eq!(config.raft.heartbeat_ticks, 3);
    assert_eq!(config.raft.clock_offset_allowance_ms, 250);
    assert_eq!(config.lock.default_lease_ttl_ms, 10_000);
    assert_eq!(
        config.limits(),
        Limits {
            min_lease_ttl_ms: 500,
            max_lease_ttl_ms: 60_000,
            max_wait_timeout_ms: 30_000,
            max_hold_ms: 3_600_000,
            max_waiters_per_resource: 16,
            max_waiters_per_tenant: 100,
            max_held_per_tenant: 100_000,
            dedup_retention_ms: 60_000,
            max_dedup_entries: 1_000,
            max_records: 2_000,
            max_retired_per_tick: 128,
        }
    );
}

/// One bad value each: the refusal names the key (dotted) and the allowed
/// range (or rule).
#[test]
fn each_invalid_value_is_refused_naming_its_key_and_range() {
    // (TOML to append to MINIMAL, key, text the message must contain)
    let cases: &[(&str, &str, &str)] = &[
        ("shard_count = 0", "shard_count", "1..=256"),
        ("shard_count = 257", "shard_count", "1..=256"),
        (
            "[raft]\ntick_interval_ms = 9",
            "raft.tick_interval_ms",
            "10..=1000",
        ),
        (
            "[raft]\ntick_interval_ms = 1001",
            "raft.tick_interval_ms",
            "10..=1000",
        ),
        (
            "[raft]\nelection_ticks = 4",
            "raft.election_ticks",
            "5..=100",
        ),
        (
            "[raft]\nelection_ticks = 101",
            "raft.election_ticks",
            "5..=100",
        ),
        (
            "[raft]\nheartbeat_ticks = 0",
            "raft.heartbeat_ticks",
            "1..=5",
        ),
        (
            "[raft]\nheartbeat_ticks = 6",
            "raft.heartbeat_ticks",
            "1..=5",
        ),
        (
            "[raft]\nelection_ticks = 20\nheartbeat_ticks = 11",
            "raft.heartbeat_ticks",
            "1..=10",
        ),
        (
            "[raft]\nproposal_timeout_ms = 99",
            "raft.proposal_timeout_ms",
            "100..=60000",
        ),
        (
            "[raft]\nproposal_timeout_ms = 60001",
            "raft.proposal_timeout_ms",
            "100..=60000",
        ),
        (
            "[raft]\nmax_commands_per_entry = 0",
            "raft.max_commands_per_entry",
            "1..=4096",
        ),
        (
            "[raft]\nmax_commands_per_entry = 4097",
            "raft.max_commands_per_entry",
            "1..=4096",
        ),
        (
            "[raft]\nsnapshot_interval_entries = 99",
            "raft.snapshot_interval_entries",
            "100..=1000000",
        ),
        (
            "[raft]\nsnapshot_interval_entries = 1000001",
            "raft.snapshot_interval_entries",
            "100..=1000000",
        ),
        (
            "[raft]\nstore_queue_depth = 1023",
            "raft.store_queue_depth",
            "1024..=1048576",
        ),
        (
            "[raft]\nstore_queue_depth = 1048577",
            "raft.store_queue_depth",
            "1024..=1048576",
        ),
        (
            "[raft]\npeer_queue_depth = 63",
            "raft.peer_queue_depth",
            "64..=1048576",
        ),
        (
            "[raft]\nclock_offset_allowance_ms = 60001",
            "raft.clock_offset_allowance_ms",
            "0..=60000",
        ),
        (
            "[lock]\ndefault_lease_ttl_ms = 999",
            "lock.default_lease_ttl_ms",
            "1000..=600000",
        ),
        (
            "[lock]\ndefault_lease_ttl_ms = 600001",
            "lock.default_lease_ttl_ms",
            "1000..=600000",
        ),
        (
            "[lock]\nmin_lease_ttl_ms = 0",
            "lock.min_lease_ttl_ms",
            "1..=",
        ),
        (
            "[lock]\nmin_lease_ttl_ms = 700000\ndefault_lease_ttl_ms = 700000",
            "lock.max_lease_ttl_ms",
            "700000..=604800000",
        ),
        (
            "[lock]\nmax_lease_ttl_ms = 604800001",
            "lock.max_lease_ttl_ms",
            "..=604800000",
        ),
        (
            "[lock]\nmax_wait_timeout_ms = 86400001",
            "lock.max_wait_timeout_ms",
            "0..=86400000",
        ),
        (
            "[lock]\nmax_hold_ms = 599999",
            "lock.max_hold_ms",
            "600000..=2592000000",
        ),
        (
            "[lock]\nmax_hold_ms = 2592000001",
            "lock.max_hold_ms",
            "600000..=2592000000",
        ),
        (
            "[lock]\nmax_waiters_per_resource = 0",
            "lock.max_waiters_per_resource",
            "1..=",
        ),
        (
            "[lock]\nmax_waiters_per_tenant = 0",
            "lock.max_waiters_per_tenant",
            "1..=",
        ),
        (
            "[lock]\ndedup_retention_ms = 86400001",
            "lock.dedup_retention_ms",
            "0..=86400000",
        ),
        (
            "[lock]\nmax_dedup_entries = 0",
            "lock.max_dedup_entries",
            "1..=",
        ),
        ("[lock]\nmax_records = 0", "lock.max_records", "1..="),
        (
            "[lock]\nmax_retired_per_tick = 0",
            "lock.max_retired_per_tick",
            "1..=",
        ),
        (
            "advertise_addr = \"127.0.0.1\"",
            "advertise_addr",
            "host:port",
        ),
        (
            "advertise_addr = \"127.0.0.1:0\"",
            "advertise_addr",
            "1..=65535",
        ),
        (
            "advertise_addr = \"127.0.0.1:7009\"",
            "advertise_addr",
            "must be equal",
        ),
    ];
    for (extra, key, range) in cases {
        let err = invalid(&with(extra));
        assert_eq!(err.key(), Some(*key), "{extra:?}: {err}");
        let message = err.to_string();
        assert!(message.contains(key), "{extra:?}: {message}");
        assert!(
            message.contains(range),
            "{extra:?}: {message:?} should contain {range:?}"
        );
    }
}

/// Identity fields that are not appended but replaced.
#[test]
fn bad_identity_values_are_refused_naming_their_key() {
    let cases: &[(&str, &str, &str, &str)] = &[
        ("node_id = 1", "node_id = 0", "node_id", "at least 1"),
        (
            "listen_addr = \"127.0.0.1:7001\"",
            "listen_addr = \"localhost\"",
            "listen_addr",
            "ip:port",
        ),
        (
            "data_dir = \"/tmp/fencelock-test/node1\"",
            "data_dir = \"\"",
            "data_dir",
            "empty",
        ),
        (
            "{ id = 2, addr = \"127.0.0.1:7002\" }",
            "{ id = 0, addr = \"127.0.0.1:7002\" }",
            "peers[1].id",
            "at least 1",
        ),
        (
            "{ id = 2, addr = \"127.0.0.1:7002\" }",
            "{ id = 3, addr = \"127.0.0.1:7002\" }",
            "peers[2].id",
            "unique",
        ),
        (
            "{ id = 2, addr = \"127.0.0.1:7002\" }",
            "{ id = 2, addr = \"127.0.0.1:7003\" }",
            "peers[2].addr",
            "unique",
        ),
        (
            "{ id = 2, addr = \"127.0.0.1:7002\" }",
            "{ id = 2, addr = \"127.0.0.1\" }",
            "peers[1].addr",
            "host:port",
        ),
        (
            "{ id = 2, addr = \"127.0.0.1:7002\" }",
            "{ id = 2, addr = \"::1:7002\" }",
            "peers[1].addr",
            "brackets",
        ),
    ];
    for (from, to, key, needle) in cases {
        assert!(MINIMAL.contains(from), "{from}");
        let err = invalid(&MINIMAL.replacen(from, to, 1));
        assert_eq!(err.key(), Some(*key), "{to:?}: {err}");
        let message = err.to_string();
        assert!(
            message.contains(needle),
            "{to:?}: {message:?} should contain {needle:?}"
        );
    }
}

#[test]
fn peers_must_include_this_node() {
    let err = invalid(&MINIMAL.replacen("node_id = 1", "node_id = 4", 1));
    assert_eq!(err.key(), Some("peers"));
    assert!(err.to_string().contains("node_id = 4"), "{err}");

    let err = invalid(&MINIMAL.replacen("  { id = 1, addr = \"127.0.0.1:7001\" },\n", "", 1));
    assert_eq!(err.key(), Some("peers"), "{err}");
}

#[test]
fn peers_hold_one_to_seven_members() {
    let none = r#"
node_id = 1
listen_addr = "127.0.0.1:7001"
data_dir = "/tmp/x"
peers = []
"#;
    let err = invalid(none);
    assert_eq!(err.key(), Some("peers"));
    assert!(err.to_string().contains("1..=7"), "{err}");

    let peers: Vec<String> = (1..=8)
        .map(|id| format!("{{ id = {id}, addr = \"127.0.0.1:{}\" }}", 7000 + id))
        .collect();
    let eight = format!(
        "node_id = 1\nlisten_addr = \"127.0.0.1:7001\"\ndata_dir = \"/tmp/x\"\npeers = [{}]\n",
        peers.join(", ")
    );
    let err = invalid(&eight);
    assert_eq!(err.key(), Some("peers"));
    assert!(err.to_string().contains("1..=7 members, got 8"), "{err}");

    // A single-node cluster is fine.
    let one = r#"
node_id = 1
listen_addr = "127.0.0.1:7001"
data_dir = "/tmp/x"
peers = [{ id = 1, addr = "127.0.0.1:7001" }]
tls = { insecure = true }
"#;
    NodeConfig::from_toml_str(one).unwrap();
}

#[test]
fn advertise_addr_may_differ_from_a_wildcard_listen_addr() {
    let text = MINIMAL
        .replacen(
            "listen_addr = \"127.0.0.1:7001\"",
            "listen_addr = \"0.0.0.0:7001\"\nadvertise_addr = \"node1.example:7001\"",
            1,
        )
        .replacen("127.0.0.1:7001\" }", "node1.example:7001\" }", 1);
    let config = NodeConfig::from_toml_str(&text).unwrap();
    assert_eq!(config.advertise(), "node1.example:7001");
    assert_eq!(config.peer_map()[&1], "node1.example:7001");
    assert_eq!(
        config.listen_socket_addr().unwrap(),
        "0.0.0.0:7001".parse().unwrap()
    );
}

#[test]
fn unknown_keys_are_refused_by_name() {
    for (extra, name) in [
        ("shard_cont = 4", "shard_cont"),
        ("[raft]\nelection_tick = 10", "election_tick"),
        ("[lock]\nmax_ttl_ms = 10", "max_ttl_ms"),
        ("[metrics]\nport = 9000", "metrics"),
    ] {
        let err = invalid(&with(extra));
        assert!(matches!(err, ConfigError::Parse { .. }), "{extra}: {err:?}");
        assert!(err.to_string().contains(name), "{extra}: {err}");
    }
    let err = invalid(&MINIMAL.replacen(
        "{ id = 2, addr = \"127.0.0.1:7002\" }",
        "{ id = 2, addr = \"127.0.0.1:7002\", zone = \"a\" }",
        1,
    ));
    assert!(err.to_string().contains("zone"), "{err}");
}

#[test]
fn wrong_types_and_missing_identity_are_parse_errors() {
    let err = invalid(&with("[raft]\nelection_ticks = \"ten\""));
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
    assert!(err.to_string().contains("election_ticks"), "{err}");

    let err = invalid(&with("[raft]\nelection_ticks = -1"));
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");

    let err = invalid(&MINIMAL.replacen("node_id = 1\n", "", 1));
    assert!(err.to_string().contains("node_id"), "{err}");

    let err = invalid("this is = not [toml");
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
}

#[test]
fn load_reads_a_file_and_resolves_a_relative_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node1.toml");
    std::fs::write(
        &path,
        MINIMAL.replacen("\"/tmp/fencelock-test/node1\"", "\"data/node1\"", 1),
    )
    .unwrap();
    let config = NodeConfig::load(&path).unwrap();
    assert_eq!(config.data_dir, dir.path().join("data/node1"));

    let err = NodeConfig::load(dir.path().join("missing.toml")).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("missing.toml"), "{err}");

    std::fs::write(&path, with("[raft]\nelectionticks = 3")).unwrap();
    let err = NodeConfig::load(&path).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("node1.toml"), "{message}");
    assert!(message.contains("electionticks"), "{message}");
}

#[test]
fn for_test_is_valid_and_fast() {
    let peers: Vec<(u64, String)> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", 17000 + id)))
        .collect();
    let config = NodeConfig::for_test(2, "/tmp/fencelock-test/2", peers.clone());
    config.validate().unwrap();
    assert_eq!(config.node_id, 2);
    assert_eq!(config.listen_addr, "127.0.0.1:17002");
    assert_eq!(config.peer_map().len(), 3);
    assert!(config.raft.tick_interval_ms <= 20);
    assert!(config.raft.election_timeout() <= std::time::Duration::from_millis(200));
}

#[test]
#[should_panic(expected = "not in peers")]
fn for_test_refuses_a_node_outside_the_peers() {
    NodeConfig::for_test(9, "/tmp/x", [(1, "127.0.0.1:7001")]);
}

#[test]
fn validate_catches_changes_made_in_code() {
    let mut config = NodeConfig::from_toml_str(MINIMAL).unwrap();
    config.raft.election_ticks = 3;
    assert_eq!(
        config.validate().unwrap_err().key(),
        Some("raft.election_ticks")
    );
}

/// The examples in `deploy/dev/` parse, validate, form one cluster, and
/// agree on every setting that must be equal on all nodes.
#[test]
fn deploy_dev_examples_are_valid() {
    let dir = repo_root().join("deploy/dev");
    let mut configs = Vec::new();
    for id in 1..=3u64 {
        let path = dir.join(format!("node{id}.toml"));
        let config = NodeConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(config.node_id, id, "{}", path.display());
        assert!(config.data_dir.starts_with(&dir), "{:?}", config.data_dir);
        configs.push(config);
    }
    let first = &configs[0];
    for config in &configs[1..] {
        assert_eq!(config.peer_map(), first.peer_map());
        assert_eq!(config.shard_count, first.shard_count);
        assert_eq!(config.raft, first.raft);
        assert_eq!(config.lock, first.lock);
        assert_ne!(config.data_dir, first.data_dir);
        assert_ne!(config.listen_addr, first.listen_addr);
    }
    // node1.toml spells out every default, so it documents them truly.
    assert_eq!(first.raft, RaftConfig::default());
    assert_eq!(first.lock, LockConfig::default());
}

/// The smallest file without any `[tls]` section: what an operator who has
/// not thought about security writes.
const NO_TLS: &str = r#"
node_id = 1
listen_addr = "127.0.0.1:7001"
data_dir = "/tmp/fencelock-test/node1"
peers = [{ id = 1, addr = "127.0.0.1:7001" }]
"#;

#[test]
fn a_config_without_tls_or_insecure_is_refused_naming_the_key() {
    let err = invalid(NO_TLS);
    assert_eq!(err.key(), Some("tls"));
    let text = err.to_string();
    assert!(
        text.contains("tls.ca_file") && text.contains("tls.insecure = true"),
        "{text}"
    );
}

#[test]
fn partial_tls_is_refused_naming_the_missing_file() {
    let err = invalid(&format!(
        "{NO_TLS}\n[tls]\nca_file = \"ca.crt\"\ncert_file = \"node.crt\"\n"
    ));
    assert_eq!(err.key(), Some("tls.key_file"));
}

#[test]
fn insecure_and_tls_files_together_are_refused() {
    let err = invalid(&format!(
        "{NO_TLS}\n[tls]\ninsecure = true\nca_file = \"ca.crt\"\n"
    ));
    assert_eq!(err.key(), Some("tls.insecure"));
}

#[test]
fn tls_files_are_relative_to_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node1.toml");
    std::fs::write(
        &path,
        format!(
            "{NO_TLS}\n[tls]\nca_file = \"tls/ca.crt\"\ncert_file = \"tls/node-1.crt\"\nkey_file = \"/abs/node-1.key\"\n"
        ),
    )
    .unwrap();
    let config = NodeConfig::load(&path).unwrap();
    assert_eq!(config.tls.ca_file, Some(dir.path().join("tls/ca.crt")));
    assert_eq!(
        config.tls.cert_file,
        Some(dir.path().join("tls/node-1.crt"))
    );
    assert_eq!(config.tls.key_file, Some(PathBuf::from("/abs/node-1.key")));
}

#[test]
fn edge_limits_are_range_checked_by_name() {
    for (extra, key) in [
        ("max_message_bytes = 1024", "edge.max_message_bytes"),
        ("max_message_bytes = 1073741824", "edge.max_message_bytes"),
        ("max_concurrent_streams = 0", "edge.max_concurrent_streams"),
        ("max_connections = 1", "edge.max_connections"),
        (
            "max_connections_per_source = 0",
            "edge.max_connections_per_source",
        ),
        ("handshake_timeout_ms = 10", "edge.handshake_timeout_ms"),
        ("tenant_burst = 0", "edge.tenant_burst"),
    ] {
        let err = invalid(&with(&format!("[edge]\n{extra}")));
        assert_eq!(err.key(), Some(key), "{extra}");
    }
    let err = invalid(&with("[lock]\nmax_held_per_tenant = 0"));
    assert_eq!(err.key(), Some("lock.max_held_per_tenant"));
}
