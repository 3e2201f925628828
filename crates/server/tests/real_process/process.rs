//! Real-process test (slow, few): three `fencelock serve` processes on
//! loopback. The leader is killed with SIGKILL under a stream of acquires;
//! every acknowledged grant must still be there afterwards.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{AcquireRequest, ErrorDetail, GetRequest};

fn write_config(dir: &Path, id: u64, ports: &[u16]) -> std::path::PathBuf {
    let peers: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{{ id = {}, addr = \"127.0.0.1:{p}\" }}", i + 1))
        .collect();
    let text = format!(
        "node_id = {id}\nlisten_addr = \"127.0.0.1:{}\"\ndata_dir = \"{}\"\npeers = [{}]\nshard_count = 4\n\n[raft]\ntick_interval_ms = 50\nelection_ticks = 10\nproposal_timeout_ms = 2000\n\n[tls]\ninsecure = true\n",
        ports[id as usize - 1],
        dir.join(format!("data{id}")).display(),
        peers.join(", ")
    );
    let path = dir.join(format!("node{id}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn spawn(dir: &Path, id: u64) -> common::Proc {
    let log = std::fs::File::create(dir.join(format!("node{id}.log"))).unwrap();
    let child = Command::new(common::fencelock_bin())
        .args(["serve", "--config"])
        .arg(dir.join(format!("node{id}.toml")))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("fencelock starts");
    common::Proc(child)
}

/// Follows leader hints from `endpoints[0]`, trying the others in turn.
async fn call<T, F, Fut>(endpoints: &[String], within: Duration, f: F) -> Result<T, ErrorDetail>
where
    F: FnMut(LockServiceClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    common::call_endpoints(&endpoints[0], endpoints, within, f).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_the_leader_under_load_loses_no_acknowledged_grant() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let endpoints: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    for id in 1..=3 {
        write_config(dir.path(), id, &ports);
    }
    let mut procs: Vec<Option<common::Proc>> =
        (1..=3).map(|id| Some(spawn(dir.path(), id))).collect();

    // Ready when a Get is answered.
    let get = |r: &str| GetRequest {
        resource: r.to_string(),
    };
    call(&endpoints, Duration::from_secs(30), |mut c| {
        let req = get("acme/probe");
        async move { c.get(req).await }
    })
    .await
    .expect("cluster becomes ready");

    // The leader of the probe's shard is the node that answers it directly.
    let mut leader = None;
    for (i, e) in endpoints.iter().enumerate() {
        let mut c = LockServiceClient::connect(e.clone()).await.unwrap();
        if c.get(get("acme/probe")).await.is_ok() {
            leader = Some(i);
        }
    }
    let leader = leader.expect("some node leads the probe's shard");

    // A stream of acquires; the leader dies a second in.
    let stream_endpoints = endpoints.clone();
    let stream = tokio::spawn(async move {
        let mut acked = Vec::new();
        let started = Instant::now();
        let mut i = 0u64;
        while started.elapsed() < Duration::from_secs(5) {
            let resource = format!("acme/stream-{i}");
            let req = AcquireRequest {
                resource: resource.clone(),
                request_id: format!("req-{i}").into_bytes(),
                lease_ttl_ms: 120_000,
                wait_timeout_ms: 0,
                value: Vec::new(),
                ..Default::default()
            };
            let r = call(&stream_endpoints, Duration::from_secs(10), |mut c| {
                let req = req.clone();
                async move { c.acquire(req).await }
            })
            .await;
            if let Ok(resp) = r {
                acked.push((resource, resp.into_inner().fencing_token));
            }
            i += 1;
        }
        acked
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut victim = procs[leader].take().unwrap();
    victim.0.kill().unwrap(); // SIGKILL
    let _ = victim.0.wait();
    std::mem::forget(victim);

    let acked = stream.await.unwrap();
    assert!(
        acked.len() > 10,
        "too few grants to mean anything: {}",
        acked.len()
    );
    let survivors: Vec<String> = endpoints
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, e)| e.clone())
        .collect();
    for (resource, token) in &acked {
        let g = call(&survivors, Duration::from_secs(20), |mut c| {
            let req = get(resource);
            async move { c.get(req).await }
        })
        .await
        .unwrap_or_else(|e| panic!("get {resource}: {e:?}"))
        .into_inner();
        assert!(g.held, "{resource} acknowledged but lost after kill -9");
        assert_eq!(g.fencing_token, *token, "{resource} token changed");
    }

    // The killed node restarts from its RocksDB and serves again.
    procs[leader] = Some(spawn(dir.path(), leader as u64 + 1));
    let (resource, token) = &acked[0];
    let g = call(
        &[endpoints[leader].clone()],
        Duration::from_secs(30),
        |mut c| {
            let req = get(resource);
            async move { c.get(req).await }
        },
    )
    .await;
    // The restarted node answers itself or points at the leader; either way
    // the grant is there.
    let g = match g {
        Ok(g) => g.into_inner(),
        Err(_) => call(&endpoints, Duration::from_secs(20), |mut c| {
            let req = get(resource);
            async move { c.get(req).await }
        })
        .await
        .unwrap()
        .into_inner(),
    };
    assert_eq!(g.fencing_token, *token);
}
