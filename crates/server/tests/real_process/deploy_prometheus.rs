//! The Prometheus files in deploy/ against a real Prometheus server (Debian's
//! `prometheus`, installed by `deploy/scripts/ensure-deps.sh` with promtool)
//! scraping a real three-node cluster: every node's `/metrics` parses and
//! is up, the alert rules load and evaluate without errors, and every query
//! of the Grafana dashboard evaluates (and the overview panels show the
//! cluster). Grafana itself is not on this machine; its provisioning files
//! are checked in `deploy.rs`.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET over HTTP/1.0 (so the answer is never chunked); the body as JSON.
async fn get_json(addr: SocketAddr, path: &str) -> Option<Value> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (_, body) = text.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}

async fn query(addr: SocketAddr, expr: &str) -> Value {
    get_json(
        addr,
        &format!("/api/v1/query?query={}", percent_encode(expr)),
    )
    .await
    .unwrap_or_else(|| panic!("no answer to {expr}"))
}

async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_real_prometheus_scrapes_the_cluster_loads_the_alerts_and_evaluates_every_dashboard_query(
) {
    let cluster = common::Cluster::start(3, |c| {
        c.admin_listen_addr = Some("127.0.0.1:0".into());
    })
    .await;
    // Some traffic, so rates and histograms have samples.
    for i in 0..20 {
        let r = format!("acme/prom-{i}");
        common::acquire(&cluster, 1, common::acquire_req(&r, &r, 60_000, 0))
            .await
            .expect("granted");
    }

    // deploy/prometheus/prometheus.yml with this cluster's admin ports as
    // targets and a fast scrape; everything else (rules file, job name) as
    // shipped.
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(deploy_dir().join("prometheus/prometheus.yml")).unwrap();
    assert!(shipped.contains("job_name: fencelock"), "{shipped}");
    assert!(shipped.contains("- alerts.yml"), "{shipped}");
    std::fs::copy(
        deploy_dir().join("prometheus/alerts.yml"),
        dir.path().join("alerts.yml"),
    )
    .unwrap();
    let targets: Vec<String> = cluster
        .nodes
        .values()
        .map(|n| format!("          - {}", n.admin_addr().expect("admin port on")))
        .collect();
    let mut config = String::new();
    let mut skipping = false;
    for line in shipped.lines() {
        if line.trim_start().starts_with("scrape_interval:")
            || line.trim_start().starts_with("evaluation_interval:")
        {
            let key = line.split(':').next().unwrap();
            config.push_str(&format!("{key}: 1s\n"));
            continue;
        }
        if line.trim() == "- targets:" {
            config.push_str(line);
            config.push('\n');
            config.push_str(&targets.join("\n"));
            config.push('\n');
            skipping = true;
            continue;
        }
        if skipping && line.trim_start().starts_with("- ") {
            continue;
        }
        skipping = false;
        config.push_str(line);
        config.push('\n');
    }
    std::fs::write(dir.path().join("prometheus.yml"), &config).unwrap();

    let port = common::free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let child = match Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "prometheus not found; install it with deploy/scripts/ensure-deps.sh \
             (or: sudo apt-get install -y prometheus)"
        ),
        Err(e) => panic!("prometheus: {e}"),
    };
    let _prometheus = common::Proc(child);
    let log = dir.path().join("prometheus.log");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // Every node is scraped and its exposition parses.
    eventually(Duration::from_secs(60), "targets up", || async {
        let v = get_json(addr, "/api/v1/targets").await.ok_or("no answer")?;
        let active = v["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let up = active.iter().filter(|t| t["health"] == "up").count();
        if active.len() == 3 && up == 3 {
            Ok(())
        } else {
            Err(format!("{up}/{} up: {v}\n{}", active.len(), log_text()))
        }
    })
    .await;

    // The alert rules loaded, and each has been evaluated without an error.
    eventually(Duration::from_secs(30), "rules evaluated", || async {
        let v = get_json(addr, "/api/v1/rules").await.ok_or("no answer")?;
        let groups = v["data"]["groups"].as_array().cloned().unwrap_or_default();
        let rules: Vec<Value> = groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let shipped_alerts = std::fs::read_to_string(deploy_dir().join("prometheus/alerts.yml"))
            .unwrap()
            .matches("- alert: ")
            .count();
        if rules.len() != shipped_alerts {
            return Err(format!("{} of {shipped_alerts} rules loaded", rules.len()));
        }
        for r in &rules {
            if r["health"] != "ok" {
                return Err(format!(
                    "rule {} is {}: {}",
                    r["name"], r["health"], r["lastError"]
                ));
            }
        }
        Ok(())
    })
    .await;

    // Every dashboard query is valid PromQL over the real series.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/dashboards/fencelock.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() > 20, "{} queries", exprs.len());
    for expr in &exprs {
        let v = query(addr, expr).await;
        assert_eq!(v["status"], "success", "{expr}: {v}");
    }

    // The overview shows this cluster: three nodes up, every shard led,
    // the locks taken above held.
    eventually(Duration::from_secs(30), "overview panels", || async {
        let up = query(addr, r#"sum(up{job="fencelock"})"#).await;
        let held = query(addr, "sum(fencelock_shard_locks_held)").await;
        let leaderless = query(
            addr,
            "count(sum by (shard) (fencelock_shard_is_leader) < 1) or vector(0)",
        )
        .await;
        let value = |v: &Value| -> Option<f64> {
            v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
        };
        match (value(&up), value(&held), value(&leaderless)) {
            (Some(u), Some(h), Some(l)) if u == 3.0 && h >= 20.0 && l == 0.0 => Ok(()),
            other => Err(format!("up, held, leaderless = {other:?}")),
        }
    })
    .await;
}
