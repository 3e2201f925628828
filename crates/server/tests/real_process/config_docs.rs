//! docs/configuration.md documents every configuration key with its real
//! default, and the override names cover exactly the keys the file has.
//! Also: environment and `--set` overrides through `fencelock config
//! check`, as an operator would use them.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use fencelock_server::config::overrides::{SECTIONS, TOP_LEVEL_KEYS};
use fencelock_server::config::NodeConfig;

const MINIMAL: &str = r#"
node_id = 1
listen_addr = "127.0.0.1:7001"
data_dir = "/tmp/fencelock-doc-test"
peers = [{ id = 1, addr = "127.0.0.1:7001" }]
"#;

/// What makes [`MINIMAL`] start: a node needs TLS files or an explicit
/// insecure mode. Kept apart so that the defaults read from `MINIMAL` are
/// the real ones.
const DEV_TLS: &str = "tls = { insecure = true }\n";

fn docs() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Dotted key → TOML rendering of its value, for every key present in
/// `config` serialized (absent options are not listed).
fn flatten(config: &NodeConfig) -> BTreeMap<String, String> {
    let value = toml::Value::try_from(config).expect("config serializes");
    let mut out = BTreeMap::new();
    for (key, v) in value.as_table().unwrap() {
        match v {
            toml::Value::Table(section) => {
                for (k, v) in section {
                    out.insert(format!("{key}.{k}"), v.to_string());
                }
            }
            other => {
                out.insert(key.clone(), other.to_string());
            }
        }
    }
    out
}

/// The doc's table rows: key → default cell.
fn documented() -> BTreeMap<String, String> {
    docs()
        .lines()
        .filter_map(|line| {
            let mut cells = line.split('|').map(str::trim).skip(1);
            let key = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
            let default = cells.next()?;
            Some((key.to_owned(), default.trim_matches('`').to_owned()))
        })
        .collect()
}

#[test]
fn every_config_key_is_documented_with_its_default() {
    // Parsed without validation: the real defaults (a node would refuse to
    // start on them until [tls] is configured).
    let defaults: NodeConfig = toml::from_str(MINIMAL).unwrap();
    // Every optional key set, so that the serialized form lists all keys.
    let mut all = defaults.clone();
    all.tls.ca_file = Some("/etc/fencelock/ca.crt".into());
    all.tls.cert_file = Some("/etc/fencelock/node.crt".into());
    all.tls.key_file = Some("/etc/fencelock/node.key".into());
    all.advertise_addr = Some("127.0.0.1:7001".into());
    all.admin_listen_addr = Some("127.0.0.1:9101".into());
    all.audit.path = Some("/tmp/audit.log".into());
    let every_key = flatten(&all);
    let default_values = flatten(&defaults);
    let docs = documented();
    let required: Vec<&str> = MINIMAL
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim()))
        .collect();
    for key in every_key.keys() {
        let Some(cell) = docs.get(key) else {
            panic!("docs/configuration.md has no row for `{key}`");
        };
        if required.contains(&key.as_str()) {
            assert_eq!(cell, "required", "`{key}`");
        } else if let Some(default) = default_values.get(key) {
            assert_eq!(
                cell, default,
                "`{key}`: documented default differs from the code's"
            );
        } else {
            assert_eq!(cell, "unset", "`{key}` has no default value");
        }
    }
    for key in docs.keys() {
        assert!(
            every_key.contains_key(key),
            "docs/configuration.md documents `{key}`, which the config does not have"
        );
    }
}

#[test]
fn override_names_cover_exactly_the_config_file_keys() {
    let mut all = NodeConfig::from_toml_str(&format!("{MINIMAL}{DEV_TLS}")).unwrap();
    all.advertise_addr = Some("127.0.0.1:7001".into());
    all.admin_listen_addr = Some("127.0.0.1:9101".into());
    let value = toml::Value::try_from(&all).unwrap();
    let table = value.as_table().unwrap();
    let mut top: Vec<&str> = table
        .iter()
        .filter(|(_, v)| !v.is_table())
        .map(|(k, _)| k.as_str())
        .collect();
    let mut sections: Vec<&str> = table
        .iter()
        .filter(|(_, v)| v.is_table())
        .map(|(k, _)| k.as_str())
        .collect();
    let mut want_top = TOP_LEVEL_KEYS.to_vec();
    let mut want_sections = SECTIONS.to_vec();
    for v in [&mut top, &mut sections, &mut want_top, &mut want_sections] {
        v.sort();
    }
    assert_eq!(top, want_top);
    assert_eq!(sections, want_sections);
}

fn config_check(
    dir: &std::path::Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> (bool, String, String) {
    let path = dir.join("node.toml");
    std::fs::write(
        &path,
        format!("{MINIMAL}{DEV_TLS}").replace("/tmp/fencelock-doc-test", "data"),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(common::fencelock_bin());
    cmd.args(["config", "check"]).arg(&path).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn environment_and_set_flags_override_the_file_and_bad_values_name_their_source() {
    let dir = tempfile::tempdir().unwrap();
    // Flags beat the environment, which beats the file.
    let (ok, out, err) = config_check(
        dir.path(),
        &[
            ("FENCELOCK_RAFT_TICK_INTERVAL_MS", "50"),
            ("FENCELOCK_ADMIN_LISTEN_ADDR", "127.0.0.1:9101"),
            ("FENCELOCK_SHUTDOWN_DRAIN_TIMEOUT_MS", "1000"),
            // Another tool's variable: ignored.
            ("FENCELOCK_ENDPOINT", "http://127.0.0.1:1"),
        ],
        &["--set", "shutdown.drain_timeout_ms=3000", "--print"],
    );
    assert!(ok, "{err}");
    let printed: toml::Value = toml::from_str(out.split_once('\n').unwrap().1).unwrap();
    assert_eq!(printed["raft"]["tick_interval_ms"].as_integer(), Some(50));
    assert_eq!(
        printed["admin_listen_addr"].as_str(),
        Some("127.0.0.1:9101")
    );
    assert_eq!(
        printed["shutdown"]["drain_timeout_ms"].as_integer(),
        Some(3000)
    );
    // The file's relative data_dir is relative to the file.
    assert_eq!(
        printed["data_dir"].as_str().map(PathBuf::from),
        Some(dir.path().join("data"))
    );

    let (ok, _, err) = config_check(dir.path(), &[("FENCELOCK_RAFT_ELECTION_TICKS", "2")], &[]);
    assert!(!ok);
    assert!(
        err.contains("raft.election_ticks") && err.contains("5..=100"),
        "{err}"
    );
    assert!(err.contains("FENCELOCK_RAFT_ELECTION_TICKS"), "{err}");

    let (ok, _, err) = config_check(dir.path(), &[("FENCELOCK_RAFT_TICKS", "2")], &[]);
    assert!(!ok);
    assert!(
        err.contains("ticks") && err.contains("FENCELOCK_RAFT_TICKS"),
        "{err}"
    );

    let (ok, _, err) = config_check(dir.path(), &[], &["--set", "log.format=yaml"]);
    assert!(!ok);
    assert!(err.contains("yaml"), "{err}");

    let (ok, _, err) = config_check(dir.path(), &[], &["--set", "audit.target=file"]);
    assert!(!ok);
    assert!(err.contains("audit.path"), "{err}");
}
