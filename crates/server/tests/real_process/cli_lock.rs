//! `fencelock lock <resource> -- <command>` as a real process against an
//! in-process three-node cluster: the command gets the token, the lease is
//! released when it exits, and it is stopped when the lock is lost.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use fencelock_client::{Client, ClientConfig};
use tokio::process::Command;

/// Exit code of `fencelock lock` when the lock was lost (see `lock --help`).
const EXIT_LOCK_LOST: i32 = 5;
const EXIT_LOCK: i32 = 1;

fn endpoints(cluster: &Cluster) -> String {
    cluster
        .nodes
        .keys()
        .map(|id| cluster.configs[id].listen_addr.clone())
        .collect::<Vec<_>>()
        .join(",")
}

/// `fencelock <args...>` with no endpoint from the test's environment.
fn fencelock(args: &[&str]) -> Command {
    let mut command = Command::new(common::fencelock_bin());
    command
        .args(args)
        .env_remove("FENCELOCK_ENDPOINT")
        .env_remove("FENCELOCK_ENDPOINTS")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// `fencelock lock <resource> <flags...> -- sh -c <script>`.
fn lock(cluster: &Cluster, resource: &str, flags: &[&str], script: &str) -> Command {
    let endpoints = endpoints(cluster);
    let mut args = vec!["lock", resource, "--endpoints", &endpoints];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    fencelock(&args)
}

async fn wait_for_file(path: &Path, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// True while a process with this pid exists.
fn alive(pid: &str) -> bool {
    std::process::Command::new("kill")
        .args(["-0", pid])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_gets_the_token_and_its_exit_code_and_the_lease_is_released() {
    let cluster = Cluster::start(3, |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("env");
    let script = format!(
        "echo \"$FENCELOCK_TOKEN $FENCELOCK_RESOURCE $FENCELOCK_LEASE_ID\" > {}; exit 7",
        env_file.display()
    );
    let r = "acme/cli/runs";
    let output = lock(&cluster, r, &["--ttl-ms", "2000"], &script)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("acquired acme/cli/runs"), "{stderr}");

    let env = std::fs::read_to_string(&env_file).unwrap();
    let fields: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{env:?}");
    let token: i64 = fields[0].parse().unwrap();
    assert_eq!(fields[1], r);
    assert_eq!(fields[2].len(), 32, "lease id in hex");
    assert!(token > 0);
    let g = get(&cluster, 1, r).await.unwrap();
    assert!(!g.held, "released after the command exited");
    // The next holder gets a higher token.
    let client = Client::connect(
        cluster
            .nodes
            .keys()
            .map(|id| cluster.endpoint(*id))
            .collect(),
        ClientConfig::default(),
    )
    .await
    .unwrap();
    let next = client.acquire(r, 5_000, 0).await.unwrap();
    assert!(next.token() > token);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_is_stopped_when_its_lease_is_released_from_under_it() {
    let cluster = Cluster::start(3, |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("env");
    let stopped_file = dir.path().join("stopped");
    let script = format!(
        "trap 'echo stopped > {stopped}; exit 0' TERM; \
         echo \"$FENCELOCK_LEASE_ID\" > {env}; \
         while true; do sleep 0.05; done",
        stopped = stopped_file.display(),
        env = env_file.display()
    );
    let r = "acme/cli/revoked";
    let child = lock(&cluster, r, &["--ttl-ms", "3000"], &script)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lease_id = wait_for_file(&env_file, Duration::from_secs(15)).await;

    // Someone with the lease id releases it: the next renewal is refused.
    let release = fencelock(&[
        "release",
        r,
        lease_id.trim(),
        "--endpoint",
        &cluster.endpoint(2),
    ])
    .output()
    .await
    .unwrap();
    assert!(release.status.success(), "{:?}", release);
    let released_at = Instant::now();

    let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("fencelock lock exits")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(EXIT_LOCK_LOST), "{stderr}");
    assert!(stderr.contains("LOCK_LOST"), "{stderr}");
    // Stopped at the next renewal (a third of the TTL), not at expiry.
    assert!(released_at.elapsed() < Duration::from_millis(2_500));
    assert_eq!(std::fs::read_to_string(&stopped_file).unwrap(), "stopped\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_that_ignores_sigterm_is_killed_with_everything_it_started() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    // The shell ignores SIGTERM and starts a background sleeper, which must
    // die too: it is in the command's process group.
    let script = format!(
        "trap '' TERM; sleep 300 & echo \"$$ $!\" > {}; while true; do sleep 0.05; done",
        pid_file.display()
    );
    let r = "acme/cli/stubborn";
    let child = lock(
        &cluster,
        r,
        &["--ttl-ms", "2000", "--grace-ms", "500", "--output", "json"],
        &script,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pids = wait_for_file(&pid_file, Duration::from_secs(15)).await;
    let pids: Vec<String> = pids.split_whitespace().map(str::to_owned).collect();
    assert!(pids.iter().all(|p| alive(p)));

    // The whole cluster goes away: no renewal can be confirmed, so the lock
    // is lost at the stop-by deadline.
    for id in [1, 2, 3] {
        cluster.crash(id).await;
    }
    let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("fencelock lock exits")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(EXIT_LOCK_LOST), "{stderr}");
    assert!(stderr.contains("sending SIGKILL"), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap();
    assert!(last.contains(r#""event":"exited""#), "{stdout}");
    assert!(last.contains(r#""lock_lost":true"#), "{stdout}");
    assert!(
        last.contains(r#""lost_reason":"RENEWAL_UNCONFIRMED""#),
        "{stdout}"
    );
    assert!(last.contains(r#""command_signal":9"#), "{stdout}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|p| alive(p)) {
        assert!(Instant::now() < deadline, "{pids:?} still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_lock_fails_with_exit_1_and_the_command_never_runs() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/cli/busy";
    let client = Client::connect(
        cluster
            .nodes
            .keys()
            .map(|id| cluster.endpoint(*id))
            .collect(),
        ClientConfig::default(),
    )
    .await
    .unwrap();
    let holder = client.acquire(r, 30_000, 0).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let output = lock(
        &cluster,
        r,
        &["--output", "json"],
        &format!("touch {}", ran.display()),
    )
    .output()
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(EXIT_LOCK));
    assert!(!ran.exists(), "the command ran without the lock");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains(r#""reason":"LOCK_HELD""#), "{stdout}");
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_output_frames_the_commands_output_with_acquired_and_exited() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/cli/json";
    let output = lock(
        &cluster,
        r,
        &["--output", "json", "--wait-ms", "1000"],
        "echo from-the-command",
    )
    .output()
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].starts_with(
        r#"{"ok":true,"event":"acquired","resource":"acme/cli/json","fencing_token":"#
    ));
    assert_eq!(lines[1], "from-the-command");
    assert!(lines[2].contains(r#""event":"exited""#), "{stdout}");
    assert!(lines[2].contains(r#""exit_code":0"#), "{stdout}");
    assert!(lines[2].contains(r#""released":true"#), "{stdout}");
    assert!(!stdout.contains("lease_id"), "the lease id is a secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_command_exits_127_before_the_lock_is_taken() {
    let cluster = Cluster::start(3, |_| {}).await;
    let endpoints = endpoints(&cluster);
    let r = "acme/cli/missing";
    // A file that exists but is not executable.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let plain = plain.to_str().unwrap();
    for (command, code) in [
        ("/nonexistent/fencelock-test-command", 127),
        ("fencelock-test-command-not-on-path", 127),
        (plain, 126),
    ] {
        let output = fencelock(&["lock", r, "--endpoints", &endpoints, "--", command])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{command}: {stderr}");
        assert!(
            stderr.contains("the lock was not taken"),
            "{command}: {stderr}"
        );
    }
    // Issue 24 item 10: checked before the acquire, so never granted at all.
    let state = get(&cluster, 1, r).await.unwrap();
    assert!(!state.held);
    assert_eq!(
        state.last_token, 0,
        "a grant was made for a command that cannot run"
    );
}

/// Issue 24 item 7: a request that never got a connection cannot have been
/// granted, so neither `lock` nor `acquire` says it may have been.
#[tokio::test]
async fn an_acquire_that_never_reached_a_node_does_not_say_it_may_have_been_granted() {
    // A port nobody listens on.
    let dead = format!("127.0.0.1:{}", common::free_port());
    for args in [
        vec![
            "lock",
            "acme/never/sent",
            "--endpoints",
            &dead,
            "--",
            "true",
        ],
        vec!["acquire", "acme/never/sent", "--endpoint", &dead],
    ] {
        let out = fencelock(&args).output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("may have been granted"),
            "{args:?} claims a grant that cannot have happened: {stderr}"
        );
        assert!(stderr.contains("error:"), "{args:?}: {stderr}");
        assert!(
            stderr.contains("nothing accepts connections at"),
            "{args:?}: {stderr}"
        );
    }
}

/// Issue 24 item 6: every client command takes `--endpoints a,b,c` (and
/// `$FENCELOCK_ENDPOINTS`) and fails over past a node that is down, as
/// `etcdctl --endpoints` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_command_takes_a_list_of_endpoints_and_fails_over_past_a_dead_node() {
    let cluster = Cluster::start(3, |_| {}).await;
    let dead = format!("127.0.0.1:{}", common::free_port());
    let list = format!("{dead},{}", endpoints(&cluster));
    let r = "acme/cli/endpoints";

    let out = fencelock(&["acquire", r, "--output", "json", "--endpoints", &list])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let granted: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let lease_id = granted["lease_id"].as_str().unwrap().to_owned();

    // The same list from the environment.
    for args in [
        vec!["get", r],
        vec!["renew", r, &lease_id],
        vec!["admin", "nodes"],
        vec!["release", r, &lease_id],
    ] {
        let out = fencelock(&args)
            .env("FENCELOCK_ENDPOINTS", &list)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(!get(&cluster, 1, r).await.unwrap().held);

    // Only dead nodes: unavailable, and the admin action says nothing was done.
    let out = fencelock(&["admin", "nodes", "--endpoints", &dead])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing was done"));
}
