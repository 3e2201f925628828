//! Overrides of the config file from the environment and the command line.
//!
//! Precedence: the file, then `FENCELOCK_<SECTION>_<KEY>` environment
//! variables, then `--set section.key=value` flags. An override replaces
//! one key's value before the configuration is parsed and validated, so an
//! overridden value is checked exactly like a value in the file, and an
//! error names the override that set it.
//!
//! Environment names: `FENCELOCK_` + the dotted key upper-cased with `_`
//! for `.`: `raft.tick_interval_ms` is `FENCELOCK_RAFT_TICK_INTERVAL_MS`,
//! `admin_listen_addr` is `FENCELOCK_ADMIN_LISTEN_ADDR`. A variable that
//! starts with a section's prefix (`FENCELOCK_RAFT_`) must name a key of
//! that section (a typo is an error). Other `FENCELOCK_` variables that
//! name no top-level key belong to other tools (`FENCELOCK_ENDPOINT` of
//! the client commands, for one) and are ignored.
//!
//! Values are read as TOML (`50`, `true`, `[{ id = 1, addr = "a:1" }]`);
//! anything that is not a TOML value is taken as a string, so
//! `FENCELOCK_DATA_DIR=/var/lib/fencelock` needs no quotes.

use super::ConfigError;

/// Prefix of every environment override.
pub const ENV_PREFIX: &str = "FENCELOCK_";
/// The config file's sections.
pub const SECTIONS: &[&str] = &[
    "raft",
    "lock",
    "log",
    "audit",
    "shutdown",
    "tls",
    "edge",
    "controller",
];
/// The config file's top-level keys (checked against the struct by a test).
pub const TOP_LEVEL_KEYS: &[&str] = &[
    "node_id",
    "listen_addr",
    "advertise_addr",
    "admin_listen_addr",
    "data_dir",
    "peers",
    "shard_count",
    "replication_factor",
    "join",
    "max_placement_format",
];

/// One key's value from outside the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// The dotted key (`raft.tick_interval_ms`).
    pub key: String,
    /// The value as given.
    pub value: String,
    /// Where it came from (`FENCELOCK_RAFT_TICK_INTERVAL_MS`, `--set`).
    pub source: String,
}

/// The overrides among `vars` (name, value), in name order.
pub fn from_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<Override> {
    let mut out: Vec<Override> = vars
        .into_iter()
        .filter_map(|(name, value)| {
            let rest = name.strip_prefix(ENV_PREFIX)?.to_ascii_lowercase();
            let key = SECTIONS
                .iter()
                .find_map(|s| {
                    rest.strip_prefix(s)
                        .and_then(|k| k.strip_prefix('_'))
                        .map(|k| format!("{s}.{k}"))
                })
                .or_else(|| {
                    TOP_LEVEL_KEYS
                        .contains(&rest.as_str())
                        .then(|| rest.clone())
                })?;
            Some(Override {
                key,
                value,
                source: name,
            })
        })
        .collect();
    out.sort_by(|a, b| a.source.cmp(&b.source));
    out
}

/// Parses one `--set key=value` argument.
pub fn parse_set(arg: &str) -> Result<Override, ConfigError> {
    let Some((key, value)) = arg.split_once('=') else {
        return Err(ConfigError::invalid(
            "--set",
            format!("must be `key=value` (for example raft.tick_interval_ms=50), got {arg:?}"),
        ));
    };
    let key = key.trim();
    let known = match key.split_once('.') {
        Some((section, k)) => SECTIONS.contains(&section) && !k.is_empty() && !k.contains('.'),
        None => TOP_LEVEL_KEYS.contains(&key),
    };
    if !known {
        return Err(ConfigError::invalid(
            "--set",
            format!(
                "{key:?} is not a config key (top-level keys: {}; sections: {})",
                TOP_LEVEL_KEYS.join(", "),
                SECTIONS.join(", ")
            ),
        ));
    }
    Ok(Override {
        key: key.to_owned(),
        value: value.to_owned(),
        source: format!("--set {key}"),
    })
}

/// A TOML value if `text` is one, else `text` as a string.
fn value_of(text: &str) -> toml::Value {
    let trimmed = text.trim();
    toml::from_str::<toml::Table>(&format!("v = {trimmed}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// Sets every override in `table` (the parsed file), in order.
pub(super) fn apply(table: &mut toml::Table, overrides: &[Override]) -> Result<(), ConfigError> {
    for o in overrides {
        let value = value_of(&o.value);
        match o.key.split_once('.') {
            None => {
                table.insert(o.key.clone(), value);
            }
            Some((section, key)) => {
                let entry = table
                    .entry(section.to_owned())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                let Some(section_table) = entry.as_table_mut() else {
                    return Err(ConfigError::invalid(
                        section,
                        format!("must be a table to take {} from {}", o.key, o.source),
                    ));
                };
                section_table.insert(key.to_owned(), value);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn environment_names_map_to_dotted_keys_and_foreign_variables_are_ignored() {
        let got = from_env(vars(&[
            ("FENCELOCK_RAFT_TICK_INTERVAL_MS", "50"),
            ("FENCELOCK_ADMIN_LISTEN_ADDR", "0.0.0.0:9100"),
            ("FENCELOCK_ENDPOINT", "http://x:1"),
            ("FENCELOCK_TOKEN", "5"),
            ("FENCELOCK_LOG_FORMAT", "json"),
            ("PATH", "/bin"),
        ]));
        let keys: Vec<&str> = got.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(
            keys,
            ["admin_listen_addr", "log.format", "raft.tick_interval_ms"]
        );
    }

    #[test]
    fn values_are_toml_when_they_parse_and_strings_otherwise() {
        assert_eq!(value_of("50"), toml::Value::Integer(50));
        assert_eq!(value_of("true"), toml::Value::Boolean(true));
        assert_eq!(
            value_of("/var/lib/fencelock"),
            toml::Value::String("/var/lib/fencelock".into())
        );
        assert_eq!(
            value_of("0.0.0.0:7001"),
            toml::Value::String("0.0.0.0:7001".into())
        );
        assert!(value_of(r#"[{ id = 1, addr = "a:1" }]"#).is_array());
    }

    #[test]
    fn set_flags_must_name_a_key() {
        assert_eq!(
            parse_set("raft.tick_interval_ms=50").unwrap().key,
            "raft.tick_interval_ms"
        );
        assert!(parse_set("node_id=3").is_ok());
        for bad in ["raft.tick_interval_ms", "nope=1", "raft=1", "bogus.key=1"] {
            let e = parse_set(bad).unwrap_err();
            assert_eq!(e.key(), Some("--set"), "{bad}");
        }
    }
}
