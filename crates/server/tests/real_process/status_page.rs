//! The operator status page, loaded in headless Chromium (Debian's
//! `chromium`) from a node's admin port: after its script ran and refreshed
//! a few times, the page must show the cluster as the admin API reports it —
//! nodes, shard leaders and epochs, lock and waiter counts, the hottest
//! resource.

use crate::common;
use crate::ops_support;

use std::process::Command;
use std::time::Duration;

use common::{acquire, acquire_req, Cluster};
use fencelock_api::v1::ListShardsRequest;

/// Virtual time Chromium gives the page's script: long enough for
/// several refreshes at the page's 2 s interval.
const PAGE_TIME_BUDGET_MS: u64 = 7_000;

/// The page's DOM after its script ran, as Chromium serialized it.
fn render(url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    // The flags that work on this machine: no sandbox as root, and no
    // background networking (the machine's closed network refuses it).
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={PAGE_TIME_BUDGET_MS}"))
        .arg("--dump-dom")
        .arg(url)
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "chromium not found; install it with: deploy/scripts/ensure-deps.sh \
             (or: sudo apt-get install -y chromium)"
        ),
        Err(e) => panic!("chromium: {e}"),
    };
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The text of the first element after `marker` (e.g. `id="served-by"`).
fn text_after<'a>(dom: &'a str, marker: &str) -> &'a str {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in the page:\n{dom}"));
    let rest = &dom[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find('<').unwrap() + start;
    &rest[start..end]
}

/// The cell `field` of the table row marked `row` (e.g. `data-shard="2"`).
fn cell<'a>(dom: &'a str, row: &str, field: &str) -> &'a str {
    let at = dom
        .find(row)
        .unwrap_or_else(|| panic!("no row {row} in the page:\n{dom}"));
    let end = dom[at..].find("</tr>").unwrap() + at;
    text_after(&dom[at..end], &format!("data-field=\"{field}\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_page_shows_nodes_shards_leaders_locks_and_the_hottest_resource() {
    let cluster = Cluster::start(3, |c| {
        c.admin_listen_addr = Some("127.0.0.1:0".into());
    })
    .await;
    for i in 0..5 {
        acquire(
            &cluster,
            1,
            acquire_req(&format!("acme/page-{i}"), &format!("p-{i}"), 60_000, 0),
        )
        .await
        .unwrap();
    }
    for i in 0..6 {
        let _ = acquire(
            &cluster,
            2,
            acquire_req("acme/page-0", &format!("hot-{i}"), 60_000, 0),
        )
        .await;
    }
    // The page reads what the admin API answers; wait until the store
    // published the locks (once per Raft tick).
    let shards = ops_support::eventually(Duration::from_secs(10), || async {
        let mut admin = cluster.admin(1).await;
        let r = admin
            .list_shards(ListShardsRequest::default())
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let held: u64 = r.shards.iter().map(|s| s.held_locks).sum();
        if held == 5 {
            Ok(r.shards)
        } else {
            Err(format!("{held} held"))
        }
    })
    .await;

    let admin_addr = cluster.nodes[&2].admin_addr().unwrap();
    let url = format!("http://{admin_addr}/");
    let dom = tokio::task::spawn_blocking(move || render(&url))
        .await
        .unwrap();

    assert_eq!(
        text_after(&dom, "id=\"error\""),
        "",
        "the page reported an error"
    );
    assert_eq!(text_after(&dom, "id=\"served-by\""), "2");
    let refreshes: u32 = text_after(&dom, "id=\"refreshes\"").parse().unwrap();
    assert!(refreshes >= 2, "the page refreshed {refreshes} times");
    assert_eq!(text_after(&dom, "id=\"total-locks\""), "5");
    assert_eq!(text_after(&dom, "id=\"total-waiters\""), "0");
    assert_eq!(text_after(&dom, "id=\"total-nodes\""), "3");
    assert_eq!(
        text_after(&dom, "id=\"total-shards\""),
        shards.len().to_string()
    );
    for id in 1..=3 {
        assert_eq!(cell(&dom, &format!("data-node=\"{id}\""), "state"), "up");
    }
    let leaders: usize = (1..=3)
        .map(|id| {
            cell(&dom, &format!("data-node=\"{id}\""), "leaders")
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert_eq!(leaders, shards.len());
    for s in &shards {
        let row = format!("data-shard=\"{}\"", s.shard_id);
        assert_eq!(cell(&dom, &row, "leader"), s.leader_node_id.to_string());
        assert_eq!(cell(&dom, &row, "epoch"), s.epoch.to_string());
        assert_eq!(cell(&dom, &row, "held"), s.held_locks.to_string());
        assert_eq!(cell(&dom, &row, "waiters"), "0");
        assert_eq!(cell(&dom, &row, "replicas").matches('(').count(), 3);
    }
    // acme/page-0: one grant and six refused attempts.
    assert_eq!(text_after(&dom, "data-field=\"resource\""), "acme/page-0");
    let acquires: u64 = text_after(&dom, "data-field=\"acquires\"").parse().unwrap();
    assert!(acquires >= 7, "{acquires}");
}
