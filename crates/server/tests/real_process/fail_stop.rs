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

/// Waits (at most 30 s) for `child` to exit and returns its status; kills it
/// and fails with its stderr if it keeps running.
fn wait_for_exit(
    child: &mut std::process::Child,
    stderr: &std::path::Path,
    why: &str,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            let _ = child.wait();
            panic!(
                "{why}:\n{}",
                std::fs::read_to_string(stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The largest RocksDB log file (`*.log`) under the node's `data/db`.
fn largest_log(data_dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::read_dir(data_dir.join("db"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .expect("the node wrote a log file")
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A broken record in the middle of the node's log (a bad sector, a
/// misdirected write): RocksDB's default recovery would have opened without
/// everything after it, grants and votes the node acknowledged. The node
/// refuses instead, names the file and the recovery, and exits 6 so a
/// supervisor does not restart it in a loop; the refusal itself lost
/// nothing (the intact copy still opens with every lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_log_is_damaged_refuses_to_start_naming_the_file() {
    use fencelock_api::v1::lock_service_client::LockServiceClient;
    use fencelock_api::v1::GetRequest;

    let dir = tempfile::tempdir().unwrap();
    let (config, port) = single_node_config(dir.path());
    let stderr_path = dir.path().join("stderr.log");
    let start = || {
        Command::new(common::fencelock_bin())
            .args(["serve", "--config"])
            .arg(&config)
            .env(
                "FENCELOCK_ADMIN_LISTEN_ADDR",
                format!("127.0.0.1:{}", common::free_port()),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap()
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let connect = || async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(c) = LockServiceClient::connect(endpoint.clone()).await {
                return c;
            }
            assert!(
                Instant::now() < deadline,
                "the node never answered:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };

    let mut child = start();
    let mut client = connect().await;
    let mut tokens = Vec::new();
    for i in 0..40 {
        let resource = format!("acme/kept-{i}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let granted = loop {
            let req = common::acquire_req(&resource, &format!("r{i}"), 600_000, 0);
            if let Ok(r) = client.acquire(req).await {
                break r.into_inner();
            }
            assert!(Instant::now() < deadline, "{resource} was never granted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokens.push((resource, granted.fencing_token));
    }
    // A crash, not a clean stop: the log is what holds the grants.
    child.kill().unwrap();
    let _ = child.wait();
    let data = dir.path().join("data");
    let intact = dir.path().join("data.intact");
    copy_dir(&data, &intact);
    {
        use std::os::unix::fs::PermissionsExt;
        // The node refuses a data directory others can read.
        std::fs::set_permissions(&intact, std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    let log = largest_log(&data);
    let len = std::fs::metadata(&log).unwrap().len();
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        f.seek(SeekFrom::Start(len / 2)).unwrap();
        f.write_all(&[0xff; 16]).unwrap();
    }
    let mut child = start();
    let status = wait_for_exit(
        &mut child,
        &stderr_path,
        "the node started on a damaged log",
    );
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert_eq!(status.code(), Some(6), "{status}\n{stderr}");
    let name = log.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        stderr.contains("the data directory is damaged ("),
        "{stderr}"
    );
    assert!(stderr.contains(&name), "does not name {name}:\n{stderr}");
    assert!(
        stderr.contains("Replace a node whose disk was lost"),
        "{stderr}"
    );

    // The intact copy (what the node held before the damage) opens with
    // every lock and its token: refusing lost nothing.
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::rename(&intact, &data).unwrap();
    let mut child = start();
    let mut client = connect().await;
    for (resource, token) in &tokens {
        let deadline = Instant::now() + Duration::from_secs(30);
        let held = loop {
            let req = GetRequest {
                resource: resource.clone(),
            };
            if let Ok(r) = client.get(req).await {
                break r.into_inner();
            }
            assert!(
                Instant::now() < deadline,
                "the restarted node never answered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(held.held, "{resource}: {held:?}");
        assert_eq!(held.fencing_token, *token, "{resource}");
    }
    child.kill().unwrap();
    let _ = child.wait();
}
