//! The files in deploy/ are checked as far as this machine allows:
//! Prometheus rules and config with `promtool` (and the rules' own unit
//! tests), the dashboard and alerts against the metrics a node really
//! exports, the compose and Kubernetes node configurations against the
//! config validation (with the environment each container sets), and the
//! systemd unit's stop and reload wiring.

use crate::common;
use crate::ops_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use fencelock_server::config::overrides;
use fencelock_server::config::NodeConfig;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(rel: &str) -> String {
    let path = deploy_dir().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs promtool; a missing promtool fails the test with the install command.
fn promtool(args: &[&str]) {
    let out = match Command::new("promtool")
        .args(args)
        .current_dir(deploy_dir().join("prometheus"))
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool not found; install it with: deploy/scripts/ensure-deps.sh \
             (or: sudo apt-get install -y prometheus)"
        ),
        Err(e) => panic!("promtool: {e}"),
    };
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_and_prometheus_config_pass_promtool_and_their_unit_tests() {
    promtool(&["check", "rules", "alerts.yml"]);
    promtool(&["check", "config", "prometheus.yml"]);
    promtool(&["test", "rules", "alerts_test.yml"]);
}

/// Every `fencelock_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("fencelock_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let before = rest[..at].chars().last();
        // Skip words that merely contain the prefix (e.g. `x_fencelock_y`).
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_and_alerts_use_only_metrics_that_a_node_exports() {
    let cluster = common::Cluster::start(3, |c| {
        c.admin_listen_addr = Some("127.0.0.1:0".into());
    })
    .await;
    // Every node's metrics: per-shard lock gauges come from shard leaders
    // only, and one node may lead nothing at the moment it is scraped.
    let mut body = String::new();
    for node in cluster.nodes.values() {
        let (_, _, text) = ops_support::http_get(node.admin_addr().unwrap(), "/metrics").await;
        body.push_str(&text);
    }
    let mut exported = BTreeSet::new();
    for line in body.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut words = line.split_whitespace().skip(2);
        let (name, kind) = (words.next().unwrap(), words.next().unwrap());
        exported.insert(name.to_owned());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                exported.insert(format!("{name}{suffix}"));
            }
        }
    }

    // The protected side's metrics come from the fencing library, exported
    // by the protected system's own process (crates/fencing, `Metered`).
    let fencing = prometheus::Registry::new();
    fencelock_fencing::FenceMetrics::new()
        .register(&fencing)
        .unwrap();
    for family in fencing.gather() {
        exported.insert(family.name().to_owned());
    }

    let dashboard_text = read("grafana/dashboards/fencelock.json");
    let dashboard: Value = serde_json::from_str(&dashboard_text).expect("dashboard is JSON");
    let mut ids = BTreeSet::new();
    let mut exprs = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate panel id"
        );
        assert!(panel["gridPos"]["w"].as_u64().unwrap() > 0);
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "prometheus",
            "{}",
            panel["title"]
        );
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} has no query", panel["title"]);
        for t in targets {
            exprs.push_str(t["expr"].as_str().unwrap());
            exprs.push('\n');
        }
    }
    let datasource = read("grafana/provisioning/datasources/prometheus.yml");
    assert!(datasource.contains("uid: prometheus"));

    for (what, text) in [
        ("grafana/dashboards/fencelock.json", exprs),
        ("prometheus/alerts.yml", read("prometheus/alerts.yml")),
        (
            "prometheus/alerts_test.yml",
            read("prometheus/alerts_test.yml"),
        ),
    ] {
        let used = metric_names(&text);
        assert!(!used.is_empty(), "{what} uses no fencelock metric");
        for name in used {
            assert!(
                exported.contains(&name),
                "{what} uses {name}, which no node exports"
            );
        }
    }
    // Every alert is explained in the runbook.
    let runbook = std::fs::read_to_string(deploy_dir().join("../docs/operations.md")).unwrap();
    for line in read("prometheus/alerts.yml").lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            assert!(
                runbook.contains(name),
                "docs/operations.md does not explain {name}"
            );
        }
    }
}

/// YAML documents as JSON, through Python's PyYAML (on the machine image;
/// the message says how to install it where it is not).
fn yaml_documents(rel: &str) -> Vec<Value> {
    let path = deploy_dir().join(rel);
    let script = "import sys, json, yaml\n\
                  print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| {
            panic!("python3: {e}; install it with: sudo apt-get install -y python3")
        });
    assert!(
        out.status.success(),
        "cannot parse {} as YAML (needs PyYAML: python3 -m pip install pyyaml):\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Loads `toml_text` as node `env`'s container would.
fn load_as(dir: &Path, toml_text: &str, env: &[(String, String)]) -> NodeConfig {
    let path = dir.join("fencelock.toml");
    std::fs::write(&path, toml_text).unwrap();
    let o = overrides::from_env(env.iter().cloned());
    NodeConfig::load_with(&path, &o).unwrap_or_else(|e| panic!("{env:?}: {e}"))
}

#[test]
fn compose_nodes_get_valid_configs_and_prometheus_scrapes_each_of_them() {
    let compose = &yaml_documents("docker-compose.yml")[0];
    let services = compose["services"].as_object().unwrap();
    for want in ["prometheus", "grafana"] {
        assert!(services.contains_key(want), "no {want} service");
    }
    let toml_text = read("compose/fencelock.toml");
    let dir = tempfile::tempdir().unwrap();
    let mut node_ids = BTreeSet::new();
    let mut scrape_targets = BTreeSet::new();
    for (name, svc) in services.iter().filter(|(n, _)| n.starts_with("fencelock")) {
        let env: Vec<(String, String)> = svc["environment"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let config = load_as(dir.path(), &toml_text, &env);
        assert!(node_ids.insert(config.node_id), "{name}: node id reused");
        assert_eq!(config.advertise(), format!("{name}:7001"));
        let admin = config.admin_listen_addr.clone().expect("admin port on");
        assert!(admin.ends_with(":9100"));
        scrape_targets.insert(format!("{name}:9100"));
        let mounts = svc["volumes"].to_string();
        assert!(
            mounts.contains("/etc/fencelock/fencelock.toml"),
            "{name}: {mounts}"
        );
        let grace = svc["stop_grace_period"].as_str().unwrap();
        let grace_s: u64 = grace.trim_end_matches('s').parse().unwrap();
        assert!(
            grace_s * 1000 > config.shutdown.drain_timeout_ms,
            "{name}: grace {grace}"
        );
    }
    assert_eq!(node_ids.len(), 3);
    let prometheus = &yaml_documents("prometheus/prometheus.yml")[0];
    let targets: BTreeSet<String> = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(targets, scrape_targets);
}

#[test]
fn kubernetes_statefulset_pods_get_valid_configs_and_a_disruption_budget_of_one() {
    let docs = yaml_documents("kubernetes/fencelock.yaml");
    let kind = |k: &'static str| docs.iter().filter(move |d| d["kind"] == k);
    let sts = kind("StatefulSet").next().expect("a StatefulSet");
    let pdb = kind("PodDisruptionBudget")
        .next()
        .expect("a PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let headless = kind("Service")
        .find(|s| s["spec"]["clusterIP"] == "None")
        .expect("a headless Service");
    assert_eq!(sts["spec"]["serviceName"], headless["metadata"]["name"]);
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    let replicas = sts["spec"]["replicas"].as_u64().unwrap();
    assert_eq!(replicas, 3);
    let toml_text = kind("ConfigMap").next().unwrap()["data"]["fencelock.toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    let script = container["args"][0].as_str().unwrap();
    let grace_s = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for ordinal in 0..replicas {
        // Run the container's own start script with `fencelock` replaced by
        // a printout of the environment it would see.
        let probe = script.replace(
            "exec fencelock serve --config /etc/fencelock/fencelock.toml",
            "echo \"$FENCELOCK_NODE_ID $FENCELOCK_ADVERTISE_ADDR\"",
        );
        let out = Command::new("sh")
            .args(["-c", &probe])
            .env("HOSTNAME", format!("fencelock-{ordinal}"))
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        let mut words = printed.split_whitespace();
        let env = vec![
            (
                "FENCELOCK_NODE_ID".to_owned(),
                words.next().unwrap().to_owned(),
            ),
            (
                "FENCELOCK_ADVERTISE_ADDR".to_owned(),
                words.next().unwrap().to_owned(),
            ),
        ];
        let config = load_as(dir.path(), &toml_text, &env);
        assert_eq!(config.node_id, ordinal + 1);
        assert!(grace_s * 1000 > config.shutdown.drain_timeout_ms);
    }
}

#[test]
fn systemd_unit_stops_with_sigterm_in_time_and_reloads_the_audit_log() {
    let unit = read("systemd/fencelock.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in the unit"))
            .to_owned()
    };
    assert!(value("ExecStart").contains("fencelock serve --config"));
    assert!(value("ExecReload").contains("-HUP"));
    assert_eq!(value("KillSignal"), "SIGTERM");
    let stop_s: u64 = value("TimeoutStopSec").parse().unwrap();
    let default_drain_ms = fencelock_server::config::ShutdownConfig::default().drain_timeout_ms;
    assert!(stop_s * 1000 > default_drain_ms);
    assert!(read("systemd/fencelock.logrotate").contains("systemctl reload fencelock"));
    // A node that refused a damaged data directory is not restarted in a loop.
    assert_eq!(value("Restart"), "on-failure");
    let prevent: Vec<u8> = value("RestartPreventExitStatus")
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    // 6 is `fencelock serve`'s EXIT_DAMAGED (crates/cli/src/lib.rs; the
    // damaged-directory test in fail_stop.rs checks the process exits so).
    assert!(prevent.contains(&6), "{prevent:?}");
}
