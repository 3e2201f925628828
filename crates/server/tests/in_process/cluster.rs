//! In-process cluster scenarios (fast: real RocksDB, real gRPC on loopback,
//! one process). Each test is one failure case from the brief.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use fencelock_api::v1::{LeaseState, Reason};
use fencelock_server::store::MembershipChange;
use fencelock_statemachine::ResourceName;

/// Waits until `node` has applied as far as `reference` and holds the one
/// lock the scenario left held, and checks it got there by installing a
/// snapshot rather than from the log.
async fn wait_caught_up_by_snapshot(cluster: &Cluster, node: u64, reference: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = cluster.nodes[&node].shard_status();
        let theirs: u64 = cluster.nodes[&reference]
            .shard_status()
            .iter()
            .map(|s| s.applied_index)
            .sum();
        let mine: u64 = st.iter().map(|s| s.applied_index).sum();
        let held: usize = st.iter().map(|s| s.held).sum();
        let installed: u64 = st.iter().map(|s| s.snapshots_installed).sum();
        if held == 1 && mine >= theirs {
            assert!(
                installed > 0,
                "caught up from the log: the test did not exercise snapshots"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} did not catch up: {mine} vs {theirs}, held {held}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn shard_of(cluster: &Cluster, resource: &str) -> u64 {
    let node = cluster.nodes.values().next().unwrap();
    node.router()
        .shard_of(&ResourceName::parse(resource).unwrap())
        .unwrap()
}

/// A request that must be answered where it lands (what a client that does
/// its own routing sends): no forwarding.
fn direct<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        fencelock_server::service::FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_crash_and_reelection_loses_no_acknowledged_grant() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    let mut granted = Vec::new();
    for i in 0..24 {
        let r = format!("acme/job-{i}");
        let a = acquire(&cluster, 1, acquire_req(&r, &format!("req-{i}"), 60_000, 0))
            .await
            .expect("granted");
        granted.push((r, a));
    }
    let victim = cluster
        .leader_of(shard_of(&cluster, &granted[0].0))
        .expect("a leader");
    cluster.crash(victim).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    let alive = *cluster.nodes.keys().next().unwrap();
    for (r, a) in &granted {
        let g = get(&cluster, alive, r).await.expect("get after failover");
        assert!(g.held, "{r} lost its holder after the leader crashed");
        assert_eq!(g.fencing_token, a.fencing_token, "{r} changed token");
        let e = acquire(&cluster, alive, acquire_req(r, "intruder", 60_000, 0))
            .await
            .unwrap_err();
        assert_eq!(e.reason(), Reason::LockHeld, "{r} granted twice");
    }
    // A new grant after the failover gets a larger token than the one the
    // old leader handed out (invariant 2 across leader changes).
    let (r0, a0) = &granted[1];
    assert!(release(&cluster, alive, r0, &a0.lease_id).await.unwrap());
    let next = acquire(
        &cluster,
        alive,
        acquire_req(r0, "after-failover", 60_000, 0),
    )
    .await
    .unwrap();
    assert!(
        next.fencing_token > a0.fencing_token,
        "token went back after failover"
    );
    // The crashed node comes back and the cluster still agrees.
    cluster.restart(victim).await;
    let g = get(&cluster, victim, &granted[0].0).await.unwrap();
    assert_eq!(g.fencing_token, granted[0].1.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn minority_partition_refuses_acquire_and_renew_while_the_majority_serves() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/partitioned";
    let shard = shard_of(&cluster, r);
    let a = acquire(&cluster, 1, acquire_req(r, "a", 60_000, 0))
        .await
        .unwrap();
    let old_leader = cluster.leader_of(shard).unwrap();
    cluster.rules[&old_leader].isolate(old_leader);
    for (id, rules) in &cluster.rules {
        if *id != old_leader {
            rules.block(*id, old_leader);
        }
    }
    // Straight to the isolated node: it must never claim success.
    let mut minority = cluster.client(old_leader).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let acq = minority
            .acquire(acquire_req("acme/other-on-minority", "m", 60_000, 0))
            .await;
        let ren = minority
            .renew(fencelock_api::v1::RenewRequest {
                resource: r.into(),
                lease_id: a.lease_id.clone(),
                lease_ttl_ms: 0,
            })
            .await;
        // The only acceptable answers are refusals (or a shard of that
        // resource led by the majority side being unreachable from here).
        assert!(
            acq.is_err() || shard_of(&cluster, "acme/other-on-minority") != shard,
            "minority granted"
        );
        assert!(ren.is_err(), "minority claimed a renewal");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The majority elects a new leader and serves.
    let majority_node = *cluster.nodes.keys().find(|id| **id != old_leader).unwrap();
    let b = acquire(
        &cluster,
        majority_node,
        acquire_req("acme/on-majority", "b", 60_000, 0),
    )
    .await;
    assert!(b.is_ok(), "majority refused: {b:?}");
    let g = get(&cluster, majority_node, r).await.unwrap();
    assert_eq!(g.fencing_token, a.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn healed_partition_converges() {
    let cluster = Cluster::start(3, |_| {}).await;
    for id in 1..=3 {
        cluster.rules[&id].partition(&[&[1], &[2, 3]]);
    }
    for i in 0..10 {
        acquire(
            &cluster,
            2,
            acquire_req(&format!("acme/heal-{i}"), &format!("h{i}"), 60_000, 0),
        )
        .await
        .unwrap();
    }
    for id in 1..=3 {
        cluster.rules[&id].heal();
    }
    // Node 1 catches up: every shard's applied index matches the leader's.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let applied = |id: u64| -> Vec<u64> {
            cluster.nodes[&id]
                .shard_status()
                .iter()
                .map(|s| s.applied_index)
                .collect()
        };
        let held = |id: u64| -> usize {
            cluster.nodes[&id]
                .shard_status()
                .iter()
                .map(|s| s.held)
                .sum()
        };
        if applied(1) == applied(2) && held(1) == 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 1 did not converge: {:?} vs {:?}",
            applied(1),
            applied(2)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_cluster_restart_recovers_every_grant_from_disk() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    let mut tokens = Vec::new();
    let mut lease_ids = Vec::new();
    for i in 0..12 {
        let r = format!("acme/durable-{i}");
        let a = acquire(&cluster, 1, acquire_req(&r, &format!("d{i}"), 120_000, 0))
            .await
            .unwrap();
        tokens.push((r, a.fencing_token));
        lease_ids.push(a.lease_id);
    }
    for id in 1..=3 {
        cluster.crash(id).await;
    }
    for id in 1..=3 {
        cluster.restart(id).await;
    }
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    for (r, t) in &tokens {
        let g = get(&cluster, 1, r).await.unwrap();
        assert!(g.held && g.fencing_token == *t, "{r} not recovered: {g:?}");
    }
    // Every replica restarted from a snapshot on disk (at least the
    // bootstrap one) and reports its size before taking a new one.
    for id in 1..=3 {
        let status = cluster.nodes[&id].shard_status();
        assert!(!status.is_empty(), "node {id} published no status");
        for st in status {
            assert!(
                st.snapshot_bytes > 0,
                "node {id} shard {}: no snapshot size after restart",
                st.shard_id
            );
        }
    }
    // New grants after the restart get larger tokens.
    let r = &tokens[0].0;
    let a = acquire(
        &cluster,
        1,
        acquire_req(&format!("{r}-next"), "n", 60_000, 0),
    )
    .await
    .unwrap();
    assert!(a.fencing_token > 0);
    // The same resource, released and granted again after the restart, gets
    // a larger token than before it (invariant 2 across restarts).
    assert!(release(&cluster, 1, r, &lease_ids[0]).await.unwrap());
    let again = acquire(&cluster, 1, acquire_req(r, "after-restart", 60_000, 0))
        .await
        .unwrap();
    assert!(
        again.fencing_token > tokens[0].1,
        "token went back after restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lagging_follower_catches_up_by_snapshot_after_log_compaction() {
    let mut cluster = Cluster::start(3, |c| c.raft.snapshot_interval_entries = 100).await;
    let follower = (1..=3)
        .find(|id| {
            cluster.nodes[id]
                .shard_status()
                .iter()
                .all(|s| !s.is_leader)
        })
        .unwrap_or(3);
    let alive = (1..=3).find(|id| *id != follower).unwrap();
    cluster.crash(follower).await;
    // Enough traffic while it is down that every shard snapshots and
    // truncates its log past what the follower has.
    for i in 0..400 {
        let r = format!("acme/snap-{}", i % 40);
        if let Ok(a) = acquire(
            &cluster,
            alive,
            acquire_req(&r, &format!("s{i}"), 60_000, 0),
        )
        .await
        {
            release(&cluster, alive, &r, &a.lease_id).await.unwrap();
        }
    }
    let held_now = acquire(
        &cluster,
        alive,
        acquire_req("acme/snap-held", "keep", 60_000, 0),
    )
    .await
    .unwrap();
    cluster.restart(follower).await;
    wait_caught_up_by_snapshot(&cluster, follower, alive).await;
    let g = get(&cluster, alive, "acme/snap-held").await.unwrap();
    assert_eq!(g.fencing_token, held_now.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquire_committed_but_reply_lost_is_retried_with_the_same_request_id() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/lost-reply";
    let shard = shard_of(&cluster, r);
    let leader = cluster.leader_of(shard).unwrap();
    // The first attempt gives up long before any reply could arrive.
    let mut c = cluster.client(leader).await;
    let _ = tokio::time::timeout(
        Duration::from_micros(50),
        c.acquire(acquire_req(r, "same-id", 60_000, 0)),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = acquire(&cluster, leader, acquire_req(r, "same-id", 60_000, 0))
        .await
        .unwrap();
    let again = acquire(&cluster, leader, acquire_req(r, "same-id", 60_000, 0))
        .await
        .unwrap();
    assert!(again.deduplicated);
    assert_eq!(
        again.lease_id, retry.lease_id,
        "a retry never creates a second lease"
    );
    assert_eq!(again.fencing_token, retry.fencing_token);
    assert_eq!(again.lease_state, retry.lease_state);
    let g = get(&cluster, leader, r).await.unwrap();
    if retry.lease_state == LeaseState::Held as i32 {
        // The first attempt never reached the service: the retry was the
        // acquire, and holds.
        assert_eq!(g.fencing_token, retry.fencing_token);
        return;
    }
    // The first attempt was granted after its caller gave up: nobody could
    // be told, so the service cancelled the grant (no lease is left to a
    // caller that is gone), and the retry learns exactly that, under the
    // original lease id — the id's outcome is final.
    assert!(retry.deduplicated, "{retry:?}");
    assert_eq!(retry.lease_state, LeaseState::Cancelled as i32, "{retry:?}");
    assert_eq!(retry.expires_at_ms, 0, "an ended lease gives no time");
    assert!(!g.held, "nobody holds the lock: {g:?}");
    // The lock is free for a new acquire (a new request id).
    let fresh = acquire(&cluster, leader, acquire_req(r, "new-id", 60_000, 0))
        .await
        .unwrap();
    assert_eq!(fresh.lease_state, LeaseState::Held as i32);
    assert!(fresh.fencing_token > retry.fencing_token);
}

/// lock.proto promises one spelling per lock: a name with a `.` or `..`
/// path segment, which a protected system normalising paths would see as
/// another name's thing, is refused for a new lock (issue 24).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_with_dot_segments_are_refused_for_new_locks() {
    let cluster = Cluster::start(3, |_| {}).await;
    for bad in ["acme/jobs/../x", "acme/./x", "acme/x/.."] {
        let e = acquire(&cluster, 1, acquire_req(bad, "dots", 10_000, 0))
            .await
            .expect_err(bad);
        assert_eq!(e.reason(), Reason::InvalidResource, "{bad}: {e:?}");
        assert!(e.message.contains("`.` or `..`"), "{bad}: {}", e.message);
    }
    acquire(&cluster, 1, acquire_req("acme/jobs..x", "dots", 10_000, 0))
        .await
        .expect("dots inside a segment are fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_never_expires_earlier_than_its_ttl_after_the_last_renew_across_a_leader_change() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/long-job";
    let ttl_ms = 4_000;
    let a = acquire(&cluster, 1, acquire_req(r, "lj", ttl_ms, 0))
        .await
        .unwrap();
    let sent = Instant::now();
    renew(&cluster, 1, r, &a.lease_id).await.unwrap();
    let leader = cluster.leader_of(shard_of(&cluster, r)).unwrap();
    cluster.crash(leader).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    let alive = *cluster.nodes.keys().next().unwrap();
    // Until the TTL since the renew was sent has passed, nobody else gets it.
    while sent.elapsed() < Duration::from_millis(ttl_ms - 300) {
        let e = acquire(
            &cluster,
            alive,
            acquire_req(r, &format!("x{}", sent.elapsed().as_millis()), 60_000, 0),
        )
        .await;
        assert!(
            e.is_err(),
            "granted {}ms after the renew, before its {ttl_ms}ms ttl",
            sent.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Afterwards the lock does become free (expiry is driven by the leader).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if acquire(&cluster, alive, acquire_req(r, "after", 60_000, 0))
            .await
            .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "expired lease never freed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_acquire_is_granted_on_release_and_times_out_otherwise() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/queue";
    let a = acquire(&cluster, 1, acquire_req(r, "first", 60_000, 0))
        .await
        .unwrap();
    let waiter = {
        let leader = cluster.leader_of(shard_of(&cluster, r)).unwrap();
        let mut c = cluster.client(leader).await;
        tokio::spawn(async move { c.acquire(acquire_req(r, "second", 60_000, 10_000)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(release(&cluster, 1, r, &a.lease_id).await.unwrap());
    let b = waiter.await.unwrap().expect("waiter granted").into_inner();
    assert!(b.fencing_token > a.fencing_token);
    let e = acquire(&cluster, 1, acquire_req(r, "third", 60_000, 300))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::WaitTimedOut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_caller_that_disconnects_leaves_the_queue() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/abandoned";
    let a = acquire(&cluster, 1, acquire_req(r, "holder", 60_000, 0))
        .await
        .unwrap();
    let leader = cluster.leader_of(shard_of(&cluster, r)).unwrap();
    let mut c = cluster.client(leader).await;
    let waiter =
        tokio::spawn(async move { c.acquire(acquire_req(r, "gone", 60_000, 30_000)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiter.abort(); // the caller goes away: its RPC is cancelled
    let _ = waiter.await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(release(&cluster, 1, r, &a.lease_id).await.unwrap());
    // Had the waiter stayed queued it would hold the lock now.
    let c2 = acquire(&cluster, 1, acquire_req(r, "next", 60_000, 0)).await;
    assert!(c2.is_ok(), "abandoned waiter was granted: {c2:?}");
    let g = get(&cluster, 1, r).await.unwrap();
    assert_eq!(g.queue_length, 0);
}

/// Applies a replica change to every shard, through each shard's leader.
async fn change_everywhere(cluster: &Cluster, change: MembershipChange, node_id: u64) {
    let shards = cluster.configs.values().next().unwrap().shard_count as u64;
    // Every shard the node holds, the meta shard (0) included.
    for shard_id in 0..=shards {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let result = match cluster.leader_of(shard_id) {
                Some(leader) => {
                    cluster.nodes[&leader]
                        .change_membership(shard_id, change, node_id)
                        .await
                }
                None => Err(fencelock_server::errors::ServerError::LeaderUnknown { shard_id }),
            };
            match result {
                Ok(()) => break,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "{change:?} of node {node_id} in shard {shard_id}: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wiped_follower_is_replaced_and_catches_up_by_snapshot() {
    let mut cluster = Cluster::start(3, |c| c.raft.snapshot_interval_entries = 100).await;
    for i in 0..400 {
        let r = format!("acme/wipe-{}", i % 40);
        if let Ok(a) = acquire(&cluster, 1, acquire_req(&r, &format!("w{i}"), 60_000, 0)).await {
            release(&cluster, 1, &r, &a.lease_id).await.unwrap();
        }
    }
    let held_now = acquire(
        &cluster,
        1,
        acquire_req("acme/wipe-held", "keep", 60_000, 0),
    )
    .await
    .unwrap();
    let wiped = (1..=3)
        .find(|id| {
            cluster.nodes[id]
                .shard_status()
                .iter()
                .all(|s| !s.is_leader)
        })
        .unwrap_or(3);
    cluster.crash(wiped).await;
    cluster.wipe(wiped);
    // Its log is gone, so it may not simply rejoin as the voter it was: the
    // operator removes it, starts it empty, adds it back as a learner (it
    // catches up by snapshot without counting towards any majority), then
    // promotes it.
    change_everywhere(&cluster, MembershipChange::Remove, wiped).await;
    cluster.restart(wiped).await;
    change_everywhere(&cluster, MembershipChange::AddLearner, wiped).await;
    let other = (1..=3).find(|id| *id != wiped).unwrap();
    wait_caught_up_by_snapshot(&cluster, wiped, other).await;
    change_everywhere(&cluster, MembershipChange::AddVoter, wiped).await;
    // A full member again: with one of the other nodes down, its vote is
    // what makes the majority.
    cluster.crash(other).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    let g = get(&cluster, wiped, "acme/wipe-held").await.unwrap();
    assert_eq!(g.fencing_token, held_now.fencing_token);
    assert!(acquire(
        &cluster,
        wiped,
        acquire_req("acme/after-wipe", "aw", 60_000, 0)
    )
    .await
    .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_count_only_matters_at_bootstrap() {
    let mut cluster = Cluster::start(1, |_| {}).await;
    let r = "acme/bootstrap-count";
    let held = acquire(&cluster, 1, acquire_req(r, "b", 60_000, 0))
        .await
        .unwrap();
    cluster.crash(1).await;
    // The placement map decides after bootstrap: a changed shard_count in
    // the file moves nothing, and the lock is where it was.
    let mut config = cluster.configs[&1].clone();
    config.shard_count += 1;
    cluster.configs.insert(1, config);
    cluster.restart(1).await;
    let read = get(&cluster, 1, r).await.unwrap();
    assert!(read.held);
    assert_eq!(read.fencing_token, held.fencing_token);
    assert_eq!(read.shard_id, held.shard_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_renew_answers_each_lease_on_its_own() {
    use fencelock_api::v1::{renew_result::Outcome, RenewBatchRequest, RenewRequest};
    let cluster = Cluster::start(3, |_| {}).await;
    let a = acquire(&cluster, 1, acquire_req("acme/batch-a", "a", 10_000, 0))
        .await
        .unwrap();
    let b = acquire(&cluster, 1, acquire_req("beta/batch-b", "b", 10_000, 0))
        .await
        .unwrap();
    let item = |r: &str, lease: &[u8]| RenewRequest {
        resource: r.into(),
        lease_id: lease.to_vec(),
        lease_ttl_ms: 20_000,
    };
    let req = RenewBatchRequest {
        items: vec![
            item("acme/batch-a", &a.lease_id),
            item("beta/batch-b", &[7; 16]),
            item("Bad Name", &a.lease_id),
            item("beta/batch-b", &b.lease_id),
        ],
    };
    // Leases on several shards: ask any node, following hints is not needed
    // for a batch (each shard's part goes to its leader from here only if
    // this node leads it), so ask every node and keep the best answer.
    let mut best: Option<Vec<Outcome>> = None;
    for id in 1..=3 {
        let mut c = cluster.client(id).await;
        let res = c
            .renew_batch(req.clone())
            .await
            .unwrap()
            .into_inner()
            .results;
        let outcomes: Vec<Outcome> = res.into_iter().map(|r| r.outcome.unwrap()).collect();
        assert_eq!(outcomes.len(), 4, "one result per item, in order");
        match &outcomes[1] {
            Outcome::Error(e) => assert!(
                matches!(
                    e.reason(),
                    Reason::LeaseNotHeld | Reason::NotLeader | Reason::LeaderUnknown
                ),
                "{e:?}"
            ),
            other => panic!("stale lease renewed: {other:?}"),
        }
        match &outcomes[2] {
            Outcome::Error(e) => assert_eq!(e.reason(), Reason::InvalidResource),
            other => panic!("bad name accepted: {other:?}"),
        }
        if matches!(outcomes[0], Outcome::Renewed(_)) {
            best = Some(outcomes);
        }
    }
    let best = best.expect("the leader of acme/batch-a's shard renewed it");
    let Outcome::Renewed(r) = &best[0] else {
        unreachable!()
    };
    assert_eq!(r.lease_ttl_ms, 20_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_never_answers_reads_or_writes_itself() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/follower-read";
    let held = acquire(&cluster, 1, acquire_req(r, "f", 60_000, 0))
        .await
        .unwrap();
    let leader = cluster.leader_of(shard_of(&cluster, r)).unwrap();
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let mut c = cluster.client(follower).await;
    // Sent plainly, the follower forwards to the leader, which answers.
    let read = c
        .get(fencelock_api::v1::GetRequest { resource: r.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.fencing_token, held.fencing_token);
    // Sent direct (a client routing by itself), it refuses with a hint.
    let status = c
        .get(direct(fencelock_api::v1::GetRequest { resource: r.into() }))
        .await
        .unwrap_err();
    let detail = fencelock_api::v1::ErrorDetail::from_status(&status).unwrap();
    assert_eq!(
        detail.reason(),
        Reason::NotLeader,
        "a follower served a read"
    );
    assert_eq!(
        detail.leader.unwrap().address,
        cluster.configs[&leader].listen_addr,
        "the hint names the leader"
    );
    let status = c
        .acquire(direct(acquire_req("acme/follower-read", "g", 60_000, 0)))
        .await
        .unwrap_err();
    let detail = fencelock_api::v1::ErrorDetail::from_status(&status).unwrap();
    assert_eq!(detail.reason(), Reason::NotLeader);
    // Forwarded, the same acquire reaches the leader and meets the holder.
    let status = c
        .acquire(acquire_req("acme/follower-read", "g", 60_000, 0))
        .await
        .unwrap_err();
    let detail = fencelock_api::v1::ErrorDetail::from_status(&status).unwrap();
    assert_eq!(detail.reason(), Reason::LockHeld);
}

/// errors.proto promises an `ErrorDetail` on every failed call. A follower
/// that forwards to a leader which just died gets no answer at all (the
/// connection is refused); it must still answer its client with a detail
/// (OUTCOME_UNKNOWN: a retry with the same request id is safe), not a bare
/// transport error the client cannot route on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forwarding_to_a_dead_leader_answers_with_an_error_detail() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/forward-to-the-dead";
    let shard = shard_of(&cluster, r);
    let leader = cluster.leader_of(shard).unwrap();
    let follower = (1..=3).find(|n| *n != leader).unwrap();
    let mut client = cluster.client(follower).await;
    cluster.crash(leader).await;
    // Until the followers elect (an election timeout, 200 ms or more at the
    // test timings), the follower's replica still names the dead node as
    // leader and forwards there.
    let mut forwarding_failures = 0;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && forwarding_failures < 3 {
        let attempt = client
            .acquire(acquire_req(r, "forward-to-the-dead-1", 5_000, 0))
            .await;
        let Err(status) = attempt else { break }; // a new leader answered
        let detail = fencelock_api::v1::ErrorDetail::from_status(&status).unwrap_or_else(|| {
            panic!("a failed call without an ErrorDetail: {status:?}");
        });
        if status.message().contains("forwarding to the leader") {
            assert_eq!(detail.reason(), Reason::OutcomeUnknown, "{status:?}");
            assert_eq!(detail.shard_id, shard, "{status:?}");
            forwarding_failures += 1;
        }
    }
    assert!(
        forwarding_failures > 0,
        "no call was forwarded to the dead leader: the test did not exercise the case"
    );
}

/// An operator lists shards exactly when a node is down. The listing answers
/// from what the node knows and what answered within its budget, lists every
/// shard, and names the node that did not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listing_shards_with_a_node_down_names_it_and_still_lists_every_shard() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    let shards = cluster.configs[&1].shard_count as usize + 1; // + the meta shard
    let listed = cluster
        .admin(1)
        .await
        .list_shards(fencelock_api::v1::ListShardsRequest::default())
        .await
        .expect("lists")
        .into_inner();
    assert!(listed.unreachable_node_ids.is_empty(), "{listed:?}");
    cluster.crash(3).await;
    let listed = cluster
        .admin(1)
        .await
        .list_shards(fencelock_api::v1::ListShardsRequest::default())
        .await
        .expect("lists with a node down")
        .into_inner();
    assert_eq!(listed.unreachable_node_ids, vec![3], "{listed:?}");
    assert_eq!(listed.shards.len(), shards, "{listed:?}");
    for shard in &listed.shards {
        for replica in shard.replicas.iter().filter(|r| r.node_id == 3) {
            assert_eq!(replica.applied_index, 0, "unknown, not made up: {shard:?}");
        }
    }
}

/// A port clash at start is said as one: not a "storage error" (the first
/// hour, #24), and it names the key, the address and the likely cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_fails_the_start_with_a_listen_error_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut config = fencelock_server::config::NodeConfig::for_test(
        1,
        dir.path().join("n1"),
        [(1, addr.as_str())],
    );
    config.shard_count = 1;
    config.replication_factor = 1;
    let err = match fencelock_server::node::Node::start(config).await {
        Ok(_) => panic!("a node started on a port another socket holds"),
        Err(e) => e,
    };
    assert!(
        matches!(err, fencelock_server::errors::ServerError::Listen(_)),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("listen_addr {addr}")) && text.contains("holds that port"),
        "{text}"
    );
}

fn wall_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A whole-cluster outage: no node can measure how long it lasted without
/// trusting a wall clock, so lease time stands still while every node is
/// down (a lease is never shortened by it) and the shards' lease clocks
/// come back behind the wall clock. Answers still show expiry as wall-clock
/// time: the node converts from the lease clock it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_whole_cluster_outage_leases_are_kept_and_expiry_reads_as_wall_time() {
    const TTL_MS: u64 = 20_000;
    const DOWN_MS: u64 = 3_000;
    let mut cluster = Cluster::start(3, |_| {}).await;
    let granted_at = wall_now_ms();
    let granted = acquire(&cluster, 1, acquire_req("acme/outage", "o1", TTL_MS, 0))
        .await
        .expect("granted");
    let before = get(&cluster, 1, "acme/outage").await.unwrap();
    assert!(before.held);

    for id in 1..=3 {
        cluster.crash(id).await;
    }
    tokio::time::sleep(Duration::from_millis(DOWN_MS)).await;
    for id in 1..=3 {
        cluster.restart(id).await;
    }
    cluster.wait_for_leaders(Duration::from_secs(30)).await;

    let after = get(&cluster, 1, "acme/outage").await.unwrap();
    let now = wall_now_ms();
    assert!(after.held, "{after:?}");
    assert_eq!(after.fencing_token, granted.fencing_token);
    // On the lease clock the expiry is where it was (plus the allowance a
    // new leader adds); on the wall clock it moved out by the outage.
    assert!(
        after.expires_at_ms >= granted_at + TTL_MS + DOWN_MS,
        "expiry {} not shown as wall time after a {DOWN_MS} ms outage (granted at {granted_at})",
        after.expires_at_ms
    );
    // And never more than what the lease can still have: its TTL, the
    // allowance, and the time nobody could measure.
    assert!(
        after.expires_at_ms <= now + TTL_MS + 1_000,
        "expiry {} vs now {now}",
        after.expires_at_ms
    );
}
