//! What `make run` starts: `fencelock dev` brings up a local 3-node cluster
//! as separate processes, and the README's one-line acquire works against it.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Three consecutive free ports (what `--base-port` needs).
fn free_base_port() -> u16 {
    for _ in 0..200 {
        let base = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if base > 60_000 {
            continue;
        }
        let all_free = (0..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no three consecutive free ports");
}

#[test]
fn dev_cluster_starts_and_the_readme_acquire_works() {
    let bin = &common::fencelock_bin();
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port();
    let mut dev = Command::new(bin)
        .args([
            "dev",
            "--nodes",
            "3",
            "--shards",
            "4",
            "--base-port",
            &base.to_string(),
            // The default admin ports (9101-9103) may be taken on a shared
            // machine; this test does not use them.
            "--admin-base-port",
            "0",
            "--dir",
        ])
        .arg(dir.path().join("cluster"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{}", base + 1); // any node works
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = loop {
        let out = Command::new(bin)
            .args([
                "acquire",
                "acme/orders/42",
                "--ttl-ms",
                "30000",
                "--output",
                "json",
                "--endpoint",
                &endpoint,
            ])
            .output()
            .unwrap();
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "acquire failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("fencing_token"), "{stdout}");
    // A second acquire of the same resource is refused with exit code 1.
    let again = Command::new(bin)
        .args(["acquire", "acme/orders/42", "--endpoint", &endpoint])
        .output()
        .unwrap();
    assert_eq!(
        again.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // Ctrl-C / SIGTERM stops the whole cluster.
    let _ = Command::new("kill")
        .args(["-TERM", &dev.id().to_string()])
        .status();
    let stopped = Instant::now() + Duration::from_secs(20);
    loop {
        if dev.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            Instant::now() < stopped,
            "fencelock dev did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = dev.kill();
}
