//! Real-process test: a rolling restart of all three `fencelock serve`
//! processes under load. Each node in turn gets SIGTERM (graceful: health
//! NOT_SERVING, leaderships handed over, requests drained, flushed), must
//! exit 0, and is started again from its data before the next one goes.
//!
//! Clients retry retriable refusals (NOT_LEADER, SHUTTING_DOWN, no leader,
//! unavailable, unknown outcome with the same request id) as the client
//! library does; the test counts the requests that still failed after
//! retrying, and there must be none. Every grant's token must also rise per
//! resource across the whole run.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_api::v1::admin_service_client::AdminServiceClient;
use fencelock_api::v1::{ListShardsRequest, ReleaseRequest, RenewRequest};

/// How long one logical request may keep retrying before it counts as
/// failed: longer than a drain, a restart and an election together.
const RETRY_WINDOW: Duration = Duration::from_secs(20);

fn write_config(dir: &Path, id: u64, ports: &[u16]) {
    let peers: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{{ id = {}, addr = \"127.0.0.1:{p}\" }}", i + 1))
        .collect();
    let text = format!(
        "node_id = {id}\nlisten_addr = \"127.0.0.1:{}\"\ndata_dir = \"data{id}\"\n\
         peers = [{}]\nshard_count = 4\n\n\
         [raft]\ntick_interval_ms = 50\nelection_ticks = 10\nproposal_timeout_ms = 2000\n\n\
         [shutdown]\ndrain_timeout_ms = 10000\n\n[tls]\ninsecure = true\n",
        ports[id as usize - 1],
        peers.join(", ")
    );
    std::fs::write(dir.join(format!("node{id}.toml")), text).unwrap();
}

fn spawn(dir: &Path, id: u64) -> common::Proc {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("node{id}.log")))
        .unwrap();
    let child = Command::new(common::fencelock_bin())
        .args(["serve", "--config"])
        .arg(dir.join(format!("node{id}.toml")))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("fencelock starts");
    common::Proc(child)
}

fn log_tail(dir: &Path, id: u64) -> String {
    let text = std::fs::read_to_string(dir.join(format!("node{id}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// SIGTERM, then the exit status (bounded).
fn terminate(proc: &mut common::Proc, within: Duration) -> std::process::ExitStatus {
    let pid = proc.0.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0, "SIGTERM to {pid}");
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = proc.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    attempts: AtomicU64,
    failed: std::sync::Mutex<Vec<String>>,
    /// resource → tokens granted, in order.
    grants: std::sync::Mutex<BTreeMap<String, Vec<i64>>>,
}

/// Runs `call` with retries (see `common::call_endpoints`), counting every
/// attempt; a request that still fails is recorded.
async fn attempt<T, F, Fut>(
    tally: &Tally,
    endpoints: &[String],
    first: usize,
    what: &str,
    mut call: F,
) -> Option<T>
where
    F: FnMut(
        fencelock_api::v1::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    ) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let counted = |c| {
        tally.attempts.fetch_add(1, Ordering::Relaxed);
        call(c)
    };
    match common::call_endpoints(
        &endpoints[first % endpoints.len()],
        endpoints,
        RETRY_WINDOW,
        counted,
    )
    .await
    {
        Ok(v) => {
            tally.ok.fetch_add(1, Ordering::Relaxed);
            Some(v)
        }
        Err(detail) => {
            tally.failed.lock().unwrap().push(format!(
                "{what}: {:?} {}",
                detail.reason(),
                detail.message
            ));
            None
        }
    }
}

/// One client: acquire, renew, release, over its own resources.
async fn worker(w: usize, endpoints: Vec<String>, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let resource = format!("acme/roll-{w}-{}", i % 8);
        let req = common::acquire_req(&resource, &format!("roll-{w}-{i}"), 15_000, 0);
        let granted = attempt(&tally, &endpoints, w + i, "acquire", |mut c| {
            let req = req.clone();
            async move { c.acquire(req).await.map(|r| r.into_inner()) }
        })
        .await;
        if let Some(g) = granted {
            tally
                .grants
                .lock()
                .unwrap()
                .entry(resource.clone())
                .or_default()
                .push(g.fencing_token);
            let renew = RenewRequest {
                resource: resource.clone(),
                lease_id: g.lease_id.clone(),
                lease_ttl_ms: 0,
            };
            attempt(&tally, &endpoints, w + i + 1, "renew", |mut c| {
                let req = renew.clone();
                async move { c.renew(req).await.map(|r| r.into_inner()) }
            })
            .await;
            let release = ReleaseRequest {
                resource,
                lease_id: g.lease_id,
            };
            attempt(&tally, &endpoints, w + i + 2, "release", |mut c| {
                let req = release.clone();
                async move { c.release(req).await.map(|r| r.into_inner()) }
            })
            .await;
        }
        i += 1;
    }
}

/// Waits until every shard has a leader and node `id`'s replicas have
/// caught up with the others (within a few entries of the furthest).
async fn wait_caught_up(endpoint: &str, id: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let ready = async {
            let mut admin = AdminServiceClient::connect(endpoint.to_owned())
                .await
                .ok()?;
            let shards = admin
                .list_shards(ListShardsRequest::default())
                .await
                .ok()?
                .into_inner()
                .shards;
            let all = shards.iter().all(|s| {
                let furthest = s
                    .replicas
                    .iter()
                    .map(|r| r.applied_index)
                    .max()
                    .unwrap_or(0);
                let mine = s.replicas.iter().find(|r| r.node_id == id);
                s.leader_node_id != 0 && mine.is_some_and(|r| r.applied_index + 50 >= furthest)
            });
            all.then_some(())
        };
        if ready.await.is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} did not catch up within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restart_of_every_node_under_load_fails_no_request_beyond_retries() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let endpoints: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    for id in 1..=3 {
        write_config(dir.path(), id, &ports);
    }
    let mut procs: Vec<common::Proc> = (1..=3).map(|id| spawn(dir.path(), id)).collect();
    for id in 1..=3u64 {
        wait_caught_up(&endpoints[0], id, Duration::from_secs(30)).await;
    }

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| tokio::spawn(worker(w, endpoints.clone(), tally.clone(), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    for id in 1..=3u64 {
        let before = tally.ok.load(Ordering::Relaxed);
        let status = {
            let proc = &mut procs[id as usize - 1];
            tokio::task::block_in_place(|| terminate(proc, Duration::from_secs(30)))
        };
        assert!(
            status.success(),
            "node {id} did not stop cleanly ({status}):\n{}",
            log_tail(dir.path(), id)
        );
        let log = std::fs::read_to_string(dir.path().join(format!("node{id}.log"))).unwrap();
        assert!(
            log.contains("every leadership handed over"),
            "node {id} did not hand over its leaderships:\n{}",
            log_tail(dir.path(), id)
        );
        procs[id as usize - 1] = spawn(dir.path(), id);
        let other = &endpoints[(id as usize) % 3];
        wait_caught_up(other, id, Duration::from_secs(60)).await;
        // Work went on while this node was away.
        assert!(tally.ok.load(Ordering::Relaxed) > before);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }

    let ok = tally.ok.load(Ordering::Relaxed);
    let attempts = tally.attempts.load(Ordering::Relaxed);
    let failed = tally.failed.lock().unwrap().clone();
    eprintln!(
        "rolling restart: {ok} requests succeeded, {} attempts retried, {} failed",
        attempts - ok - failed.len() as u64,
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "requests failed beyond retries: {failed:#?}"
    );
    assert!(ok > 100, "too few requests to mean anything: {ok}");
    for (resource, tokens) in tally.grants.lock().unwrap().iter() {
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{resource}: tokens not rising: {tokens:?}"
        );
    }
}
