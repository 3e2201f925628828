//! Data directories written by the previous release open in this build,
//! with every lock and token they held (#23 item 3).
//!
//! `crates/server/tests/fixtures/previous-release.tar.gz` holds the data
//! directories and configs of a 3-node cluster of the previous release
//! (`PREVIOUS_RELEASE` in the Makefile), stopped gracefully while holding
//! the locks listed in its `locks.txt`; `make-previous-release.sh` beside it
//! wrote it. The nodes listen on fixed ports (17101-17103, below the
//! ephemeral range) because the placement map they saved keeps each node's
//! address.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{GetRequest, RenewRequest};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/previous-release.tar.gz"
);
const ENDPOINTS: [&str; 3] = [
    "http://127.0.0.1:17101",
    "http://127.0.0.1:17102",
    "http://127.0.0.1:17103",
];

/// How long one call may retry (leader elections after the restart).
const WITHIN: Duration = Duration::from_secs(30);

fn endpoints() -> Vec<String> {
    ENDPOINTS.iter().map(|e| e.to_string()).collect()
}

/// The nodes, killed when the test ends however it ends.
struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One lock the previous release held: resource, lease id, token.
struct Held {
    resource: String,
    lease_id: Vec<u8>,
    token: i64,
}

fn locks(dir: &Path) -> Vec<Held> {
    let text = std::fs::read_to_string(dir.join("locks.txt")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (resource, json) = line.split_once(' ').unwrap();
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            Held {
                resource: resource.to_owned(),
                lease_id: hex::decode(v["lease_id"].as_str().unwrap()).unwrap(),
                token: v["fencing_token"].as_i64().unwrap(),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_written_by_the_previous_release_opens_with_every_lock_and_token() {
    let dir = tempfile::tempdir().unwrap();
    let untar = Command::new("tar")
        .args(["-xzf", FIXTURE, "-C"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(untar.success(), "tar -xzf {FIXTURE}: {untar}");
    for id in 1..=3 {
        // The node refuses a data directory others can read; tar keeps
        // the mode it was written with, which a checkout may not.
        use std::os::unix::fs::PermissionsExt;
        let data = dir.path().join(format!("data{id}"));
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let held = locks(dir.path());
    assert!(held.len() >= 5, "the fixture lists its locks");

    let mut nodes = Nodes(Vec::new());
    for id in 1..=3 {
        let log = std::fs::File::create(dir.path().join(format!("node{id}.log"))).unwrap();
        nodes.0.push(
            Command::new(common::fencelock_bin())
                .args(["serve", "--config"])
                .arg(format!("node{id}.toml"))
                .current_dir(dir.path())
                .env(
                    "FENCELOCK_ADMIN_LISTEN_ADDR",
                    format!("127.0.0.1:{}", common::free_port()),
                )
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }
    let logs = || {
        (1..=3)
            .map(|id| {
                std::fs::read_to_string(dir.path().join(format!("node{id}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n---\n")
    };

    // Every lock the previous release held is held, with its token, and
    // its holder can renew it with the lease id it was given.
    for h in &held {
        let deadline = Instant::now() + Duration::from_secs(60);
        let got = loop {
            let mut answer = None;
            for endpoint in ENDPOINTS {
                if let Ok(mut c) = LockServiceClient::connect(endpoint).await {
                    let req = GetRequest {
                        resource: h.resource.clone(),
                    };
                    if let Ok(r) = c.get(req).await {
                        answer = Some(r.into_inner());
                        break;
                    }
                }
            }
            if let Some(a) = answer {
                break a;
            }
            assert!(
                Instant::now() < deadline,
                "the upgraded cluster never answered for {}:\n{}",
                h.resource,
                logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(got.held, "{} is no longer held: {got:?}", h.resource);
        assert_eq!(got.fencing_token, h.token, "{}", h.resource);
        let renewed = common::call_endpoints(ENDPOINTS[0], &endpoints(), WITHIN, |mut c| {
            let req = RenewRequest {
                resource: h.resource.clone(),
                lease_id: h.lease_id.clone(),
                lease_ttl_ms: 0,
            };
            async move { c.renew(req).await.map(|r| r.into_inner()) }
        })
        .await;
        assert!(renewed.is_ok(), "{}: {renewed:?}\n{}", h.resource, logs());
    }

    // The lock released before the upgrade is free, and its next grant's
    // token is above every token its shard handed out before the upgrade
    // (tokens rise per shard: the epoch is the token's top bits).
    let epoch_of =
        |token: i64| fencelock_statemachine::FencingToken::from_u64(token as u64).epoch();
    let granted = common::call_endpoints(ENDPOINTS[0], &endpoints(), WITHIN, |mut c| {
        let req = common::acquire_req("fixture/f", "after-upgrade", 10_000, 0);
        async move { c.acquire(req).await.map(|r| r.into_inner()) }
    })
    .await
    .unwrap_or_else(|e| panic!("acquire after the upgrade: {e:?}\n{}", logs()));
    let highest = held
        .iter()
        .map(|h| h.token)
        .filter(|t| epoch_of(*t) == epoch_of(granted.fencing_token))
        .max()
        .expect("the fixture holds a lock in every shard");
    assert!(granted.fencing_token > highest, "{granted:?} vs {highest}");
}
