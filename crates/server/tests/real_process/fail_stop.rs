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

#[test]
fn a_panic_on_the_store_thread_stops_the_whole_node() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = 1\nlisten_addr = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\n\
             peers = [{{ id = 1, addr = \"127.0.0.1:{port}\" }}]\n\
             shard_count = 1\nreplication_factor = 1\n\n[tls]\ninsecure = true\n"
        ),
    )
    .unwrap();
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
