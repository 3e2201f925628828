//! A node that panics stops whole (fail-stop): a panic on the store thread
//! must not leave a process that accepts calls it can never answer.
//!
//! Needs the `fencelock` binary built with the `failpoints` feature, which
//! `cargo test --workspace` does (the nemesis crate's dev-dependency turns
//! it on; docs/testing.md "Failpoints").

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A one-node, one-shard cluster's config in `dir`, and its port.
fn single_node_config(dir: &std::path::Path) -> (std::path::PathBuf, u16) {
    let port = common::free_port();
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = 1\nlisten_addr = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\n\
             peers = [{{ id = 1, addr = \"127.0.0.1:{port}\" }}]\n\
             shard_count = 1\nreplication_factor = 1\n\n[tls]\ninsecure = true\n"
        ),
    )
    .unwrap();
    (config, port)
}

#[test]
fn a_panic_on_the_store_thread_stops_the_whole_node() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _port) = single_node_config(dir.path());
    let stderr_path = dir.path().join("stderr.log");
    // The first synced write of a Ready panics on the store thread.
    let mut child = Command::new(common::fencelock_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .env("FAILPOINTS", "store::after_persist=panic")
        .env(
            "FENCELOCK_ADMIN_LISTEN_ADDR",
            format!("127.0.0.1:{}", common::free_port()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            panic!(
                "the node kept running after its store thread panicked \
                 (or the binary lacks the `failpoints` feature: build with \
                 `cargo test --workspace`):\n{log}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(log.contains("panicked"), "{log}");
    assert!(log.contains("fail-stop"), "{log}");
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}\n{log}");
}

/// The disk-fault layer of the nemesis (an LD_PRELOAD library wrapping
/// fsync, fdatasync and sync_file_range), built with `cc` into `dir`.
fn disk_fault_layer(dir: &std::path::Path) -> std::path::PathBuf {
    let source = dir.join("diskfault.c");
    let library = dir.join("libdiskfault.so");
    std::fs::write(&source, include_str!("../../../nemesis/faults/diskfault.c")).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .expect("cc runs (the RocksDB build needs it too)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    library
}

/// The PostgreSQL fsync lesson: after a failed fsync nothing is known about
/// what the disk holds, so the node stops instead of answering; restarted
/// on a healthy disk, it serves what it had made durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_fsync_fails_stops_without_answering_and_restarts_from_its_data() {
    use fencelock_api::v1::lock_service_client::LockServiceClient;
    use fencelock_api::v1::GetRequest;

    let dir = tempfile::tempdir().unwrap();
    let layer = disk_fault_layer(dir.path());
    let control = dir.path().join("disk.fault");
    std::fs::write(&control, "").unwrap();
    let (config, port) = single_node_config(dir.path());
    let stderr_path = dir.path().join("stderr.log");
    let start = || {
        Command::new(common::fencelock_bin())
            .args(["serve", "--config"])
            .arg(&config)
            .env("LD_PRELOAD", &layer)
            .env("FENCELOCK_DISK_FAULT_FILE", &control)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap()
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut child = start();
    // Granted while the disk is healthy.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut client, granted) = loop {
        if let Ok(mut c) = LockServiceClient::connect(endpoint.clone()).await {
            if let Ok(r) = c
                .acquire(common::acquire_req("acme/durable", "r1", 600_000, 0))
                .await
            {
                break (c, r.into_inner());
            }
        }
        assert!(Instant::now() < deadline, "the node never granted a lock");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The disk fails every fsync from now on: the next write is never
    // acknowledged, and the node stops.
    std::fs::write(&control, "eio").unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        client.acquire(common::acquire_req("acme/after-eio", "r2", 600_000, 0)),
    )
    .await;
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "a write was acknowledged after its fsync failed: {answer:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!(
                "the node kept running on a disk whose fsync fails:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(log.contains("RocksDB write failed"), "{log}");
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}\n{log}");

    // Healthy again, restarted from the same data: the lock granted before
    // is still held, with its token.
    std::fs::write(&control, "").unwrap();
    let mut child = start();
    let deadline = Instant::now() + Duration::from_secs(30);
    let held = loop {
        if let Ok(mut c) = LockServiceClient::connect(endpoint.clone()).await {
            if let Ok(r) = c
                .get(GetRequest {
                    resource: "acme/durable".into(),
                })
                .await
            {
                break r.into_inner();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the restarted node never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    child.kill().unwrap();
    let _ = child.wait();
    assert!(held.held, "{held:?}");
    assert_eq!(held.fencing_token, granted.fencing_token);
}
