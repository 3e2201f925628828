//! `fencelock admin` against what `make run` starts: real `fencelock dev`
//! processes plus a fourth `fencelock serve` node that joins, driven only
//! through the CLI, as docs/operations.md shows.

use crate::common;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Stops a child process when the test ends, however it ends.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
    }
}

fn fencelock(args: &[&str]) -> Output {
    Command::new(common::fencelock_bin())
        .args(args)
        .output()
        .unwrap()
}

/// Runs an admin command and insists on success; returns stdout.
fn admin(endpoint: &str, args: &[&str]) -> String {
    let mut all = vec!["admin", "--endpoint", endpoint, "--output", "json"];
    all.extend_from_slice(args);
    let out = fencelock(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "fencelock {}: {stdout} {}",
        all.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("{\"ok\":true"), "{stdout}");
    stdout
}

fn acquire_ok(endpoint: &str, resource: &str) -> bool {
    fencelock(&["acquire", resource, "--endpoint", endpoint])
        .status
        .success()
}

#[test]
fn operator_reshapes_a_running_cluster_with_the_admin_cli() {
    let bin = &common::fencelock_bin();
    let dir = tempfile::tempdir().unwrap();
    let base = common::free_ports(4);
    let _dev = Guard(
        Command::new(bin)
            .args([
                "dev",
                "--nodes",
                "3",
                "--shards",
                "4",
                "--base-port",
                &base.to_string(),
                // The default admin ports (9101-9103) may be taken on a
                // shared machine; this test does not use them.
                "--admin-base-port",
                "0",
                "--dir",
            ])
            .arg(dir.path().join("cluster"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let endpoint = format!("http://127.0.0.1:{base}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !acquire_ok(&endpoint, "acme/admin/first") {
        assert!(Instant::now() < deadline, "the dev cluster did not come up");
        std::thread::sleep(Duration::from_millis(300));
    }

    let nodes = admin(&endpoint, &["nodes"]);
    assert_eq!(nodes.matches("\"state\":\"UP\"").count(), 3, "{nodes}");
    let shards = admin(&endpoint, &["shards"]);
    assert_eq!(shards.matches("\"shard_id\":").count(), 5, "{shards}");

    // The controller's own moves: paused and resumed through the map.
    for (action, paused) in [
        ("status", false),
        ("pause", true),
        ("status", true),
        ("resume", false),
    ] {
        let said = admin(&endpoint, &["scheduler", action]);
        assert!(
            said.contains(&format!("\"paused\":{paused}")),
            "{action}: {said}"
        );
    }
    // Recovery without token reuse: every shard above the floor, and the
    // floor is required.
    let raised = admin(&endpoint, &["raise-epochs", "--above-epoch", "50"]);
    assert!(raised.contains("\"above_epoch\":50"), "{raised}");
    assert_eq!(raised.matches("\"epoch\":5").count(), 4, "{raised}");
    let no_floor = fencelock(&["admin", "--endpoint", &endpoint, "raise-epochs"]);
    assert!(!no_floor.status.success());
    // The dry run on a healthy cluster with the default thresholds.
    let plan = admin(&endpoint, &["scheduler", "plan"]);
    for field in [
        "\"work\":\"nothing\"",
        "\"unreachable\":\"-\"",
        "\"down\":\"-\"",
        "\"steps\":[]",
    ] {
        assert!(plan.contains(field), "{field} in {plan}");
    }

    // Issue 24: with three nodes and three replicas per shard a drain has
    // nowhere to go. It is refused and changes nothing: the node stays UP
    // (it used to stay DRAINING for good) and later actions still work.
    let refused = fencelock(&[
        "admin",
        "--endpoint",
        &endpoint,
        "--output",
        "json",
        "drain",
        "--node",
        "2",
    ]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stdout).into_owned()
        + &String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("PLACEMENT_CONFLICT"), "{said}");
    let nodes = admin(&endpoint, &["nodes"]);
    assert_eq!(nodes.matches("\"state\":\"UP\"").count(), 3, "{nodes}");

    // Issue 24: arguments are checked against the map before anything
    // waits (a missing shard used to hang 30 s, then say EPOCH_NOT_MATCH).
    for (args, reason) in [
        (["--shard", "99", "--to", "1"], "SHARD_NOT_FOUND"),
        (["--shard", "1", "--to", "99"], "NODE_NOT_FOUND"),
    ] {
        let mut all = vec!["admin", "--endpoint", &endpoint, "--output", "json"];
        all.push("transfer-leader");
        all.extend_from_slice(&args);
        let out = fencelock(&all);
        assert!(!out.status.success());
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(reason), "{args:?}: {said}");
    }

    // Leadership: to node 1, then to node 2 (at least one is a real move).
    assert!(
        admin(&endpoint, &["transfer-leader", "--shard", "1", "--to", "1"])
            .contains("\"leader\":1")
    );
    assert!(
        admin(&endpoint, &["transfer-leader", "--shard", "1", "--to", "2"])
            .contains("\"leader\":2")
    );

    // Slots: move two of shard 1's slots to shard 2, then split shard 3.
    let moved = admin(
        &endpoint,
        &[
            "reshard", "move", "--from", "1", "--to", "2", "--slots", "0", "--slots", "4",
        ],
    );
    assert!(moved.contains("\"migration_id\":1"), "{moved}");
    let split = admin(&endpoint, &["reshard", "split", "--shard", "3"]);
    assert!(split.contains("\"new_shard_id\":5"), "{split}");

    // A fourth node joins: started empty with `join = true`, then added.
    let addr4 = format!("127.0.0.1:{}", base + 3);
    let mut peers = String::new();
    for id in 1..=3u16 {
        peers.push_str(&format!(
            "  {{ id = {id}, addr = \"127.0.0.1:{}\" }},\n",
            base + id - 1
        ));
    }
    peers.push_str(&format!("  {{ id = 4, addr = \"{addr4}\" }},\n"));
    let config4 = dir.path().join("node4.toml");
    std::fs::write(
        &config4,
        format!(
            "node_id = 4\nlisten_addr = \"{addr4}\"\ndata_dir = \"node4\"\njoin = true\npeers = [\n{peers}]\n\n[tls]\ninsecure = true\n"
        ),
    )
    .unwrap();
    // Its output goes to a file, shown if it does not come up.
    let log4 = dir.path().join("node4.log");
    let mut node4 = Guard(
        Command::new(bin)
            .args(["serve", "--config"])
            .arg(&config4)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log4).unwrap())
            .spawn()
            .unwrap(),
    );
    // Node 4 listens before it is added: a peer channel that met a refused
    // connection reports it once more on its next call.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr4).is_err() {
        let exited = node4.0.try_wait().unwrap();
        if exited.is_some() || Instant::now() >= deadline {
            panic!(
                "node 4 did not start ({}): {}",
                exited.map_or("still running".to_owned(), |s| s.to_string()),
                std::fs::read_to_string(&log4).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    admin(&endpoint, &["add-node", "--id", "4", "--addr", &addr4]);
    admin(
        &endpoint,
        &["move-replica", "--shard", "1", "--from", "1", "--to", "4"],
    );

    // Drain node 2 before "maintenance", then even things out.
    let drained = admin(&endpoint, &["drain", "--node", "2"]);
    assert!(!drained.contains("\"replicas_moved\":0"), "{drained}");
    admin(&endpoint, &["balance"]);
    let nodes = admin(&endpoint, &["nodes"]);
    assert!(nodes.contains("\"node_id\":2,\"address\""), "{nodes}");
    assert!(
        nodes.contains("\"state\":\"DRAINED\",\"replicas\":0"),
        "{nodes}"
    );
    let shards = admin(&endpoint, &["shards"]);
    assert_eq!(shards.matches("\"shard_id\":").count(), 6, "{shards}");

    // Maintenance over: node 2 is UP again and balancing gives it replicas.
    let undrained = admin(&endpoint, &["undrain", "--node", "2"]);
    assert!(undrained.contains("\"node_id\":2"), "{undrained}");
    admin(&endpoint, &["balance"]);
    let nodes = admin(&endpoint, &["nodes"]);
    assert_eq!(nodes.matches("\"state\":\"UP\"").count(), 4, "{nodes}");
    let listed: serde_json::Value = serde_json::from_str(&nodes).unwrap();
    let node2 = listed["nodes"]
        .as_array()
        .and_then(|all| all.iter().find(|n| n["node_id"] == 2))
        .cloned()
        .unwrap_or_else(|| panic!("node 2 listed: {nodes}"));
    assert!(node2["replicas"].as_u64() > Some(0), "{nodes}");

    // The cluster still serves; the first lock is still held.
    assert!(acquire_ok(&endpoint, "acme/admin/after"));
    assert!(!acquire_ok(&endpoint, "acme/admin/first"));

    // Human output is a table.
    let out = fencelock(&["admin", "--endpoint", &endpoint, "shards"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("shard_id"), "{text}");
}
