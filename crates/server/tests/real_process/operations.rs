//! Operations, in process: metrics on the admin port, gRPC health and
//! reflection, graceful shutdown, the audit log and hot resources, on a
//! real three-node cluster (RocksDB, gRPC on loopback).

use crate::common;
use crate::ops_support;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{acquire, acquire_req, release, renew, Cluster};
use fencelock_api::v1::HotResourcesRequest;
use ops_support::{eventually, http_get, parse_metrics, sum};

/// A cluster whose nodes serve the admin HTTP port on a free port.
async fn cluster_with_admin_ports() -> Cluster {
    Cluster::start(3, |c| {
        c.admin_listen_addr = Some("127.0.0.1:0".into());
    })
    .await
}

async fn scrape(cluster: &Cluster, id: u64) -> Vec<ops_support::Sample> {
    let addr = cluster.nodes[&id].admin_addr().expect("admin port enabled");
    let (status, head, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    parse_metrics(&body)
}

async fn scrape_all(cluster: &Cluster) -> Vec<ops_support::Sample> {
    let mut all = Vec::new();
    for id in cluster.nodes.keys() {
        all.extend(scrape(cluster, *id).await);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_snapshot_taken_is_timed_so_operators_see_its_stall() {
    let cluster = Cluster::start(3, |c| {
        c.admin_listen_addr = Some("127.0.0.1:0".into());
        c.raft.snapshot_interval_entries = 100;
    })
    .await;
    // Sequential acquires: one entry each, spread over the shards, until a
    // shard's applied index crosses its (phased) snapshot point.
    let mut taken = 0.0;
    for i in 0..2_000 {
        let r = format!("acme/snap-{i}");
        acquire(&cluster, 1, acquire_req(&r, &format!("s-{i}"), 60_000, 0))
            .await
            .unwrap();
        if i % 50 == 49 {
            taken = sum(
                &scrape_all(&cluster).await,
                "fencelock_raft_snapshots_total",
                &[("kind", "taken")],
            );
            if taken > 0.0 {
                break;
            }
        }
    }
    assert!(taken > 0.0, "no snapshot within 2000 acquires");
    // Counter and histogram are flushed at the same tick (a scrape may fall
    // between the two): on every node, each snapshot taken has exactly one
    // duration observation.
    for id in cluster.nodes.keys() {
        eventually(Duration::from_secs(10), || async {
            let node = scrape(&cluster, *id).await;
            let timed = sum(
                &node,
                "fencelock_store_snapshot_duration_seconds_count",
                &[],
            );
            let taken = sum(
                &node,
                "fencelock_raft_snapshots_total",
                &[("kind", "taken")],
            );
            if timed == taken {
                Ok(())
            } else {
                Err(format!("node {id}: {timed} timed, {taken} taken"))
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_requests_commits_fsyncs_and_locks_per_shard_without_resource_labels() {
    let cluster = cluster_with_admin_ports().await;
    let mut leases = Vec::new();
    for i in 0..20 {
        let r = format!("acme/metrics-{i}");
        let a = acquire(&cluster, 1, acquire_req(&r, &format!("m-{i}"), 60_000, 0))
            .await
            .unwrap();
        leases.push((r, a.lease_id));
    }
    for (r, lease) in &leases[..5] {
        assert!(release(&cluster, 2, r, lease).await.unwrap());
    }
    renew(&cluster, 3, &leases[10].0, &leases[10].1)
        .await
        .unwrap();
    // A conflict: someone else's acquire of a held resource.
    let refused = acquire(&cluster, 1, acquire_req(&leases[12].0, "other", 60_000, 0)).await;
    assert!(refused.is_err());

    // The store publishes status and flushes its thread-local metrics once
    // per Raft tick: wait until everything above has shown up.
    let samples = eventually(Duration::from_secs(10), || async {
        let s = scrape_all(&cluster).await;
        let seen = [
            sum(&s, "fencelock_shard_locks_held", &[]),
            sum(&s, "fencelock_lock_events_total", &[("event", "granted")]),
            sum(&s, "fencelock_lock_events_total", &[("event", "released")]),
            sum(&s, "fencelock_store_fsync_commands_sum", &[]).min(26.0),
            sum(
                &s,
                "fencelock_raft_propose_commit_duration_seconds_count",
                &[],
            )
            .min(26.0),
            // Each node publishes its own elections at its next tick.
            sum(&s, "fencelock_raft_leader_changes_total", &[]).min(5.0),
        ];
        if seen == [15.0, 20.0, 5.0, 26.0, 26.0, 5.0] {
            Ok(s)
        } else {
            Err(format!(
                "held, granted, released, commands, commits, leader changes: {seen:?}"
            ))
        }
    })
    .await;

    let ok = |op: &str| {
        sum(
            &samples,
            "fencelock_service_requests_total",
            &[("op", op), ("outcome", "ok")],
        )
    };
    assert!(ok("acquire") >= 20.0, "acquires: {}", ok("acquire"));
    assert!(ok("release") >= 5.0);
    assert!(ok("renew") >= 1.0);
    assert!(
        sum(
            &samples,
            "fencelock_service_requests_total",
            &[("op", "acquire"), ("outcome", "conflict")]
        ) >= 1.0
    );
    assert!(
        sum(
            &samples,
            "fencelock_service_request_duration_seconds_count",
            &[("op", "acquire")]
        ) >= 21.0
    );
    // Every synced write is measured, and entries and commands ride on them.
    assert!(
        sum(
            &samples,
            "fencelock_store_fsync_duration_seconds_count",
            &[]
        ) > 0.0
    );
    assert!(sum(&samples, "fencelock_store_fsync_entries_sum", &[]) > 0.0);
    // Every node measures its loop's iterations and its writer's synced
    // writes (the fsyncs run on the writer thread, off the loop: the
    // loop's busy time does not include them).
    for id in cluster.nodes.keys() {
        let node = scrape(&cluster, *id).await;
        for metric in [
            "fencelock_store_iteration_duration_seconds_count",
            "fencelock_store_fsync_duration_seconds_count",
        ] {
            assert!(sum(&node, metric, &[]) > 0.0, "node {id}: no {metric}");
        }
    }
    assert!(sum(&samples, "fencelock_store_fsync_commands_sum", &[]) >= 26.0);
    assert!(
        sum(
            &samples,
            "fencelock_raft_propose_commit_duration_seconds_count",
            &[]
        ) >= 26.0
    );
    assert!(
        sum(
            &samples,
            "fencelock_raft_commit_apply_duration_seconds_count",
            &[]
        ) > 0.0
    );
    // Each of the 4 data shards and the meta shard got a leader.
    assert!(sum(&samples, "fencelock_raft_leader_changes_total", &[]) >= 5.0);
    assert_eq!(sum(&samples, "fencelock_shard_is_leader", &[]), 5.0);
    assert_eq!(
        sum(
            &samples,
            "fencelock_lock_events_total",
            &[("event", "granted")]
        ),
        20.0
    );
    assert_eq!(
        sum(
            &samples,
            "fencelock_lock_events_total",
            &[("event", "released")]
        ),
        5.0
    );
    assert_eq!(
        sum(&samples, "fencelock_raft_shards_without_leader", &[]),
        0.0
    );
    // Resource names never become labels.
    for s in &samples {
        for (k, v) in &s.labels {
            assert!(!v.contains("acme/"), "{} has {k}={v}", s.name);
        }
    }
    for id in 1..=3 {
        let node = id.to_string();
        assert!(samples
            .iter()
            .any(|s| s.name == "fencelock_build_info" && s.label("node") == Some(&node)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_says_serving_and_reflection_lists_the_public_services() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let cluster = Cluster::start(3, |_| {}).await;
    for service in ["", "fencelock.v1.LockService", "fencelock.v1.AdminService"] {
        let channel = tonic::transport::Channel::from_shared(cluster.endpoint(2))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }

    let channel = tonic::transport::Channel::from_shared(cluster.endpoint(1))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected answer {answer:?}");
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "fencelock.v1.LockService",
        "fencelock.v1.AdminService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(want), "{want} missing from {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_hands_every_leadership_over_and_fails_no_request() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    // The node leading the most shards goes.
    let mut led = std::collections::BTreeMap::<u64, usize>::new();
    for (id, node) in &cluster.nodes {
        led.insert(
            *id,
            node.shard_status().iter().filter(|s| s.is_leader).count(),
        );
    }
    let (&victim, &count) = led.iter().max_by_key(|(_, n)| **n).unwrap();
    assert!(count >= 1);

    // Clients keep acquiring and releasing through every node meanwhile.
    let endpoints: Vec<String> = (1..=3).map(|id| cluster.endpoint(id)).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4u64 {
        let endpoints = endpoints.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let (mut done, mut failed) = (0u64, Vec::new());
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let first = endpoints[((w + i) % 3) as usize].clone();
                let req = acquire_req(
                    &format!("acme/drain-{w}-{i}"),
                    &format!("d-{w}-{i}"),
                    30_000,
                    0,
                );
                let r =
                    common::call_endpoints(&first, &endpoints, Duration::from_secs(15), |mut c| {
                        let req = req.clone();
                        async move { c.acquire(req).await.map(|r| r.into_inner()) }
                    })
                    .await;
                match r {
                    Ok(_) => done += 1,
                    Err(e) => failed.push(e),
                }
                i += 1;
            }
            (done, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let node = cluster.nodes.remove(&victim).unwrap();
    let report = node.shutdown_gracefully().await;
    assert!(report.leaderships_left.is_empty(), "{report:?}");
    assert!(report.drained, "{report:?}");
    // The others lead everything (the hand-over made them leaders before
    // the node stopped; no election timeout was needed).
    cluster.wait_for_leaders(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for w in workers {
        let (done, failed) = w.await.unwrap();
        assert!(
            failed.is_empty(),
            "requests failed beyond retries: {failed:?}"
        );
        total += done;
    }
    assert!(total > 10, "too few requests to mean anything: {total}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_log_records_grants_hand_offs_releases_and_expiries_with_their_callers() {
    let cluster = Cluster::start(3, |c| {
        c.audit.target = fencelock_server::config::AuditTargetKind::File;
        c.audit.path = Some(c.data_dir.with_extension("audit.log"));
    })
    .await;
    let r = "acme/audited";
    let holder = acquire(&cluster, 1, acquire_req(r, "h1", 60_000, 0))
        .await
        .unwrap();
    // A waiter queues behind it and gets the lock when the holder releases.
    let waiter = {
        let cluster_endpoints: Vec<String> = (1..=3).map(|id| cluster.endpoint(id)).collect();
        tokio::spawn(async move {
            let req = acquire_req(r, "w1", 60_000, 10_000);
            common::call_endpoints(
                &cluster_endpoints[1],
                &cluster_endpoints,
                Duration::from_secs(15),
                |mut c| {
                    let req = req.clone();
                    async move { c.acquire(req).await.map(|r| r.into_inner()) }
                },
            )
            .await
        })
    };
    // The waiter is queued when the shard shows one waiter.
    eventually(Duration::from_secs(10), || async {
        let waiting: usize = cluster
            .nodes
            .values()
            .flat_map(|n| n.shard_status())
            .filter(|s| s.is_leader)
            .map(|s| s.waiters)
            .sum();
        if waiting == 1 {
            Ok(())
        } else {
            Err(format!("{waiting} waiters"))
        }
    })
    .await;
    assert!(release(&cluster, 2, r, &holder.lease_id).await.unwrap());
    let granted = waiter.await.unwrap().expect("the waiter gets the lock");
    assert!(granted.fencing_token > holder.fencing_token);
    // A short lease left to expire.
    acquire(&cluster, 1, acquire_req("acme/expiring", "e1", 1_000, 0))
        .await
        .unwrap();

    let lines = eventually(Duration::from_secs(15), || async {
        let mut lines = Vec::new();
        for config in cluster.configs.values() {
            let path = config.audit.path.clone().unwrap();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            lines.extend(text.lines().map(str::to_owned));
        }
        if lines.iter().any(|l| l.contains("\"expired\"")) {
            Ok(lines)
        } else {
            Err(format!("no expiry yet in {lines:?}"))
        }
    })
    .await;
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let find = |event: &str, resource: &str| {
        events
            .iter()
            .find(|v| v["event"] == event && v["resource"] == resource)
            .unwrap_or_else(|| panic!("no {event} of {resource} in {lines:#?}"))
            .clone()
    };
    let first = find("granted", r);
    assert_eq!(first["token"], holder.fencing_token);
    assert_eq!(first["lease"], hex::encode(&holder.lease_id[..4]));
    assert!(first["caller"].as_str().unwrap().starts_with("127.0.0.1:"));
    find("queued", r);
    let released = find("released", r);
    assert!(released["caller"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    let handed = find("granted_from_queue", r);
    assert_eq!(handed["token"], granted.fencing_token);
    let expired = find("expired", "acme/expiring");
    assert_eq!(expired["caller"], "-");
    // Each change once: followers write nothing.
    let grants = events
        .iter()
        .filter(|v| v["event"] == "granted" && v["resource"] == r)
        .count();
    assert_eq!(grants, 1);
    // Never a whole lease id.
    for line in &lines {
        assert!(!line.contains(&hex::encode(&holder.lease_id)), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hot_resources_lists_the_most_acquired_resource_first() {
    let cluster = Cluster::start(3, |_| {}).await;
    for i in 0..12 {
        let a = acquire(
            &cluster,
            1,
            acquire_req("acme/hot", &format!("hot-{i}"), 60_000, 0),
        )
        .await
        .unwrap();
        // Contention: a second caller finds it held.
        let _ = acquire(
            &cluster,
            2,
            acquire_req("acme/hot", &format!("x-{i}"), 60_000, 0),
        )
        .await;
        release(&cluster, 1, "acme/hot", &a.lease_id).await.unwrap();
    }
    for i in 0..3 {
        acquire(
            &cluster,
            1,
            acquire_req(&format!("acme/cold-{i}"), &format!("c-{i}"), 60_000, 0),
        )
        .await
        .unwrap();
    }
    let hot = eventually(Duration::from_secs(10), || async {
        let mut admin = cluster.admin(3).await;
        let r = admin
            .hot_resources(HotResourcesRequest { limit: 3 })
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        // Each shard's leader publishes its tally once per Raft tick.
        match r.resources.first() {
            Some(h) if h.resource == "acme/hot" && h.acquires >= 24 && r.resources.len() == 3 => {
                Ok(r)
            }
            _ => Err(format!("{r:?}")),
        }
    })
    .await;
    assert_eq!(hot.resources.len(), 3);
    assert!(hot.resources[0].contended >= 12);
    assert!(hot.shards_missing.is_empty());

    // The same through the CLI.
    let out = tokio::process::Command::new(common::fencelock_bin())
        .args([
            "admin",
            "hot",
            "--limit",
            "2",
            "--output",
            "json",
            "--endpoint",
        ])
        .arg(cluster.endpoint(2))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["resources"][0]["resource"], "acme/hot");
    assert_eq!(v["resources"].as_array().unwrap().len(), 2);
}
