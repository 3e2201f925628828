//! The operator status page, read from a node's admin port two ways:
//! as a plain HTTP client sees it (no script runs: everything must already
//! be in the server's answer, charts included), and in headless Chromium
//! (Debian's `chromium`) after its script refreshed the page a few times.
//! Both must show the cluster as the admin API reports it — nodes, shard
//! leaders and epochs, lock and waiter counts, the hottest resource — and
//! charts of request rates, latency, locks and leaders per node.

use crate::common;
use crate::ops_support;

use std::process::Command;
use std::time::Duration;

use common::{acquire, acquire_req, get, Cluster};
use fencelock_api::v1::ListShardsRequest;

/// Virtual time Chromium gives the page's script: long enough for
/// several refreshes at the page's 2 s interval.
const PAGE_TIME_BUDGET_MS: u64 = 7_000;

/// `GET path` over plain HTTP/1.1, as curl fetches it: (code, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let (code, head, body) = ops_support::http_get(addr, path).await;
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "expected a sized body: {head}"
    );
    (code, body)
}

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

/// The value of attribute `name` in the first element after `marker`.
fn attribute<'a>(dom: &'a str, marker: &str, name: &str) -> &'a str {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in the page:\n{dom}"));
    let tag_end = dom[at..].find('>').unwrap() + at;
    let tag = &dom[at..tag_end];
    let key = format!("{name}=\"");
    let start = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    let end = tag[start..].find('"').unwrap() + start;
    &tag[start..end]
}

/// What both readings of the page must show.
fn assert_page_shows_the_cluster(dom: &str, shards: &[fencelock_api::v1::Shard]) {
    assert_eq!(
        text_after(dom, "id=\"error\""),
        "",
        "the page reported an error"
    );
    assert_eq!(text_after(dom, "id=\"served-by\""), "2");
    assert_eq!(text_after(dom, "id=\"total-locks\""), "5");
    assert_eq!(text_after(dom, "id=\"total-waiters\""), "0");
    assert_eq!(text_after(dom, "id=\"total-nodes\""), "3");
    assert_eq!(
        text_after(dom, "id=\"total-shards\""),
        shards.len().to_string()
    );
    for id in 1..=3 {
        assert_eq!(cell(dom, &format!("data-node=\"{id}\""), "state"), "up");
    }
    let leaders: usize = (1..=3)
        .map(|id| {
            cell(dom, &format!("data-node=\"{id}\""), "leaders")
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert_eq!(leaders, shards.len());
    for s in shards {
        let row = format!("data-shard=\"{}\"", s.shard_id);
        assert_eq!(cell(dom, &row, "leader"), s.leader_node_id.to_string());
        assert_eq!(cell(dom, &row, "epoch"), s.epoch.to_string());
        assert_eq!(cell(dom, &row, "held"), s.held_locks.to_string());
        assert_eq!(cell(dom, &row, "waiters"), "0");
        assert_eq!(cell(dom, &row, "replicas").matches('(').count(), 3);
    }
    // acme/page-0: one grant and six refused attempts.
    assert_eq!(text_after(dom, "data-field=\"resource\""), "acme/page-0");
    let acquires: u64 = text_after(dom, "data-field=\"acquires\"").parse().unwrap();
    assert!(acquires >= 7, "{acquires}");

    // The charts: drawn from at least one sampling interval in which
    // requests were answered; the leader bars add up to every shard.
    let chart = |id: &str, attr: &str| attribute(dom, &format!("data-chart=\"{id}\""), attr);
    for id in ["requests", "latency", "locks"] {
        let points: usize = chart(id, "data-points").parse().unwrap();
        assert!(points >= 1, "chart {id} has no points:\n{dom}");
    }
    let rate: f64 = chart("requests", "data-now").parse().unwrap_or(0.0);
    let latency_ms: f64 = chart("latency", "data-now").parse().unwrap_or(0.0);
    assert!(
        rate > 0.0 && latency_ms > 0.0,
        "rate {rate}, p99 {latency_ms}"
    );
    assert_eq!(chart("locks", "data-now"), "5");
    assert_eq!(chart("leaders", "data-now"), shards.len().to_string());
    assert!(dom.matches("<polyline").count() + dom.matches("<circle").count() >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_page_renders_the_cluster_and_its_charts_on_the_server_and_refreshes_in_a_browser() {
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
    let shards = settled_shards(&cluster).await;

    // The charts need a sampling interval (2 s) with requests in it and
    // the locks held: keep answering reads until the newest one shows both.
    let admin_addr = cluster.nodes[&2].admin_addr().unwrap();
    ops_support::eventually(Duration::from_secs(20), || async {
        let _ = get(&cluster, 3, "acme/page-1").await;
        let (code, body) = http_get(admin_addr, "/status.json").await;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let last = v["series"].as_array().and_then(|s| s.last()).cloned();
        match last {
            Some(p)
                if code == 200
                    && p["requests_per_s"].as_f64().unwrap_or(0.0) > 0.0
                    && p["held_locks"] == 5 =>
            {
                Ok(())
            }
            _ => Err(format!("{code}: {}", v["series"])),
        }
    })
    .await;

    // As curl sees it: no script ran, and everything is there.
    let (code, page) = http_get(admin_addr, "/").await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(text_after(&page, "id=\"refreshes\""), "0");
    assert!(page.contains("<noscript><meta http-equiv=\"refresh\""));
    assert_page_shows_the_cluster(&page, &shards);

    // In a browser, the script swaps in fresh copies without an error. The
    // browser takes seconds; on a loaded machine a shard may elect a new
    // leader meanwhile (the page then rightly shows the new one, or no
    // locks for a shard between leaders), so the reading is compared with
    // the cluster as listed right before it, up to three times.
    let url = format!("http://{admin_addr}/");
    for attempt in 1..=3 {
        let shards = settled_shards(&cluster).await;
        let url = url.clone();
        let dom = tokio::task::spawn_blocking(move || render(&url))
            .await
            .unwrap();
        let refreshes: u32 = text_after(&dom, "id=\"refreshes\"").parse().unwrap();
        assert!(refreshes >= 2, "the page refreshed {refreshes} times");
        let shown = std::panic::catch_unwind(|| assert_page_shows_the_cluster(&dom, &shards));
        match shown {
            Ok(()) => return,
            Err(e) if attempt == 3 => std::panic::resume_unwind(e),
            Err(_) => eprintln!("attempt {attempt}: the cluster changed under the browser; again"),
        }
    }
}

/// The shards as the admin API lists them, once all five locks are
/// published (the store publishes once per Raft tick).
async fn settled_shards(cluster: &Cluster) -> Vec<fencelock_api::v1::Shard> {
    ops_support::eventually(Duration::from_secs(10), || async {
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
    .await
}
