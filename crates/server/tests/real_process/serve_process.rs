//! One real `fencelock serve` process: JSON logs, environment overrides,
//! `/healthz`, the audit file reopened on SIGHUP after a rotation, and a
//! clean exit on SIGTERM.

use crate::common;
use crate::ops_support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_logs_json_reopens_its_audit_file_on_sighup_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (port, admin_port) = (common::free_port(), common::free_port());
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = 1\nlisten_addr = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\n\
             peers = [{{ id = 1, addr = \"127.0.0.1:{port}\" }}]\n\
             shard_count = 2\nreplication_factor = 1\n\n[audit]\ntarget = \"file\"\npath = \"audit.log\"\n\n[tls]\ninsecure = true\n"
        ),
    )
    .unwrap();
    let stderr_path = dir.path().join("stderr.log");
    let mut child = Command::new(common::fencelock_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--set", "log.format=json"])
        .env(
            "FENCELOCK_ADMIN_LISTEN_ADDR",
            format!("127.0.0.1:{admin_port}"),
        )
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");

    // Serving once /healthz says so (the environment set the admin port).
    ops_support::eventually(Duration::from_secs(30), || async {
        let probe = tokio::net::TcpStream::connect(admin).await;
        if probe.is_err() {
            return Err("admin port not up".to_owned());
        }
        match ops_support::http_get(admin, "/healthz").await {
            (200, _, _) => Ok(()),
            (code, _, _) => Err(format!("healthz {code}")),
        }
    })
    .await;

    let acquire = |name: &'static str| {
        let endpoint = endpoint.clone();
        async move {
            let req = common::acquire_req(name, name, 60_000, 0);
            common::call_endpoints(
                &endpoint,
                std::slice::from_ref(&endpoint),
                Duration::from_secs(20),
                |mut c| {
                    let req = req.clone();
                    async move { c.acquire(req).await.map(|r| r.into_inner()) }
                },
            )
            .await
            .unwrap()
        }
    };
    acquire("acme/before-rotation").await;
    let audit = dir.path().join("audit.log");
    let rotated = dir.path().join("audit.log.1");
    ops_support::eventually(Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        if text.contains("acme/before-rotation") {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    std::fs::rename(&audit, &rotated).unwrap();
    signal(child.id(), libc::SIGHUP);
    // The reopen is logged once handled; then new lines go to the new file.
    ops_support::eventually(Duration::from_secs(10), || async {
        let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        if log.contains("reopening the audit log") {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
    acquire("acme/after-rotation").await;
    ops_support::eventually(Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        if text.contains("acme/after-rotation") {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    assert!(!std::fs::read_to_string(&rotated)
        .unwrap()
        .contains("after-rotation"));

    signal(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(status.success(), "{status}\n{log}");
    // Every log line is one JSON object with a level and a message.
    let mut messages = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string(), "{line}");
        messages.push(
            v["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    for want in ["node started", "shutting down gracefully", "stopped"] {
        assert!(
            messages.iter().any(|m| m == want),
            "no {want:?} in {messages:?}"
        );
    }
}
