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
    // Issue 24 item 7: TLS flags against this plaintext cluster are named
    // as the cause.
    let certs = dir.path().join("certs");
    let made = Command::new(bin)
        .args(["dev", "certs", "--nodes", "1", "--tenant", "acme", "--out"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(made.status.success());
    let tls = Command::new(bin)
        .args(["get", "acme/orders/42", "--ca-file"])
        .arg(certs.join("ca.crt"))
        .arg("--cert-file")
        .arg(certs.join("client-acme-client.crt"))
        .arg("--key-file")
        .arg(certs.join("client-acme-client.key"))
        // Without a scheme: with TLS files the CLI dials TLS (an http://
        // URL stays plaintext).
        .args(["--endpoint", &format!("127.0.0.1:{}", base + 1)])
        .output()
        .unwrap();
    assert_eq!(tls.status.code(), Some(3));
    let said = String::from_utf8_lossy(&tls.stderr);
    assert!(said.contains("speaks plaintext"), "{said}");
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

/// What a `fencelock dev` process printed so far (stdout and stderr).
#[derive(Clone, Default)]
struct Printed(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Printed {
    fn follow(&self, stream: impl std::io::Read + Send + 'static) {
        let lines = self.0.clone();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                lines.lock().unwrap().push(line);
            }
        });
    }

    /// The first line containing every one of `parts`, waiting up to 60 s.
    fn wait_for(&self, parts: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(line) = self.find(parts) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no line with {parts:?} in:\n{}",
                self.0.lock().unwrap().join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn find(&self, parts: &[&str]) -> Option<String> {
        let lines = self.0.lock().unwrap();
        lines
            .iter()
            .find(|l| parts.iter().all(|p| l.contains(p)))
            .cloned()
    }
}

/// Sends SIGTERM to a `fencelock dev` when the test ends, however it ends,
/// so a failed test leaves no cluster running (dev stops its nodes).
struct StopOnDrop(u32);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// A `fencelock dev` of three nodes (two shards each, no admin ports) in a
/// temporary directory, its output followed.
struct Dev {
    child: std::process::Child,
    printed: Printed,
    /// The port of node 1.
    base: u16,
    dir: tempfile::TempDir,
    _stop: StopOnDrop,
}

impl Dev {
    fn start(extra: &[&str]) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let base = common::free_ports(3);
        let mut child = Command::new(common::fencelock_bin())
            .args([
                "dev",
                "--nodes",
                "3",
                "--shards",
                "2",
                "--admin-base-port",
                "0",
            ])
            .args(extra)
            .args(["--base-port", &base.to_string(), "--dir"])
            .arg(dir.path().join("cluster"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let printed = Printed::default();
        printed.follow(child.stdout.take().unwrap());
        printed.follow(child.stderr.take().unwrap());
        Dev {
            _stop: StopOnDrop(child.id()),
            child,
            printed,
            base,
            dir,
        }
    }
}

/// The pid `fencelock dev` printed for node `id` ("  node 2  http://...  pid N ...").
fn pid_of(printed: &Printed, id: u64) -> String {
    let line = printed.wait_for(&[&format!("  node {id}  "), " pid "]);
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "pid").unwrap();
    words[at + 1].to_owned()
}

/// Issue 24 item 10: a node that dies is restarted after a back-off, one
/// that exits cleanly is reported as clean and left stopped, and a stop of
/// the whole cluster after that is a clean exit.
#[test]
fn dev_restarts_a_node_that_died_and_leaves_a_cleanly_stopped_one_alone() {
    let Dev {
        mut child,
        printed,
        base,
        dir: _dir,
        _stop,
    } = Dev::start(&[]);
    let dev = &mut child;
    let kill = |signal: &str, pid: &str| {
        assert!(Command::new("kill")
            .args([signal, pid])
            .status()
            .unwrap()
            .success());
    };

    // kill -9: restarted, and its port serves again.
    let pid2 = pid_of(&printed, 2);
    kill("-KILL", &pid2);
    printed.wait_for(&[
        "node 2 exited unexpectedly",
        "restarting it in 1 s",
        "restart 1 of",
    ]);
    let restarted = printed.wait_for(&["restarted node 2 (pid "]);
    assert!(!restarted.contains(&format!("(pid {pid2})")), "{restarted}");
    let node2 = format!("127.0.0.1:{}", base + 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&node2).is_err() {
        assert!(Instant::now() < deadline, "node 2 does not listen again");
        std::thread::sleep(Duration::from_millis(100));
    }

    // SIGTERM from someone else: a clean stop, not restarted.
    kill("-TERM", &pid_of(&printed, 3));
    printed.wait_for(&["node 3 exited cleanly", "left stopped"]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        printed.find(&["restarted node 3"]).is_none(),
        "a cleanly stopped node was restarted"
    );

    // The cluster's own stop: every node stops, and so does dev, cleanly.
    kill("-TERM", &dev.id().to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = dev.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "fencelock dev did not stop");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "{status}: {}",
        printed.0.lock().unwrap().join("\n")
    );
}

/// Issue 24 item 10: `fencelock dev --tls` makes the certificates and
/// configs for mutual TLS, and prints the flags a client needs.
#[test]
fn dev_tls_runs_a_mutual_tls_cluster_that_refuses_plaintext_clients() {
    let bin = &common::fencelock_bin();
    let Dev {
        mut child,
        printed,
        base,
        dir,
        _stop,
    } = Dev::start(&["--tls"]);
    let dev = &mut child;
    printed.wait_for(&["mutual TLS"]);
    let try_line = printed.wait_for(&["try:", "--ca-file"]);
    // The printed command, as a user would paste it.
    let words: Vec<String> = try_line
        .split_whitespace()
        .skip(2) // "try:" and the binary
        .map(str::to_owned)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new(bin).args(&words).output().unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the printed acquire never worked: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // Issue 24 item 7: without the client's certificate the node refuses,
    // and the CLI says why in one line with the fix.
    let endpoint = format!("127.0.0.1:{base}");
    let plain = Command::new(bin)
        .args(["get", "demo/hello", "--endpoint", &endpoint])
        .env_remove("FENCELOCK_TLS_CA_FILE")
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(3));
    let said = String::from_utf8_lossy(&plain.stderr);
    assert!(
        said.contains("expects TLS") && said.contains("--ca-file"),
        "{said}"
    );
    // An admin action that met the TLS mismatch did nothing, and says so.
    let admin = Command::new(bin)
        .args(["admin", "nodes", "--endpoint", &endpoint])
        .output()
        .unwrap();
    assert_eq!(admin.status.code(), Some(3));
    let said = String::from_utf8_lossy(&admin.stderr);
    assert!(
        said.contains("expects TLS") && said.contains("nothing was done"),
        "{said}"
    );
    assert!(!said.contains("OUTCOME_UNKNOWN"), "{said}");
    // A key that is not the certificate's: named before anything is sent.
    let certs = dir.path().join("cluster/certs");
    let swapped = Command::new(bin)
        .args(["get", "demo/hello", "--endpoint", &endpoint, "--ca-file"])
        .arg(certs.join("ca.crt"))
        .arg("--cert-file")
        .arg(certs.join("client-demo-client.crt"))
        .arg("--key-file")
        .arg(certs.join("admin-admin.key"))
        .output()
        .unwrap();
    assert_eq!(swapped.status.code(), Some(2));
    let said = String::from_utf8_lossy(&swapped.stderr);
    assert!(
        said.contains("--key-file") && said.contains("not the private key"),
        "{said}"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &dev.id().to_string()])
        .status();
    let _ = dev.wait();
}
