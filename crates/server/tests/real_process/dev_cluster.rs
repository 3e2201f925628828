//! What `make run` starts: `fencelock dev` brings up a local 3-node cluster
//! as separate processes, and the README's one-line acquire works against it.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn dev_cluster_starts_and_the_readme_acquire_works() {
    let bin = &common::fencelock_bin();
    let dir = tempfile::tempdir().unwrap();
    let base = common::free_ports(3);
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
    assert!(
        stdout.contains("\"expires_at_ms\":"),
        "JSON keeps milliseconds: {stdout}"
    );
    // People read times: "expires_at  in 29.9 s (2026-...Z)", "lease_ttl  30 s".
    let human = Command::new(bin)
        .args([
            "acquire",
            "acme/orders/43",
            "--ttl-ms",
            "30000",
            "--endpoint",
            &endpoint,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&human.stdout);
    assert!(human.status.success(), "{stdout}");
    let expires = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("expires_at "))
        .unwrap_or_else(|| panic!("no expires_at line: {stdout}"));
    assert!(
        expires.contains(" in ") && expires.trim_end().ends_with("Z)"),
        "{expires}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("lease_ttl ") && l.trim_end().ends_with(" s")),
        "{stdout}"
    );
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

/// `make install` puts the `fencelock` binary of crates/cli on PATH (cargo's
/// bin directory, or PREFIX/bin), and the README's examples call it by name,
/// not by a path into the build directory. (A dry run: a real install is a
/// release build, which `make test` does not pay for.)
#[test]
fn make_install_puts_fencelock_on_the_path_and_the_readme_calls_it_by_name() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("make")
        .args(["-n", "install", "PREFIX=/opt/fencelock-test"])
        .current_dir(&repo)
        .output()
        .expect("make runs");
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{plan} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let install = plan
        .lines()
        .find(|l| l.contains("cargo install"))
        .unwrap_or_else(|| panic!("no cargo install in `make -n install`: {plan}"));
    for part in [
        "--locked",
        "--path crates/cli",
        "--bin fencelock",
        "--root /opt/fencelock-test",
    ] {
        assert!(install.contains(part), "{part} missing: {install}");
    }
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    assert!(
        readme.contains("make install"),
        "README does not say `make install`"
    );
    assert!(
        !readme.contains("target/release/fencelock "),
        "README calls fencelock by a build-directory path"
    );
}
