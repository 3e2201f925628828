//! Shared locks and semaphores through the gRPC API (lock.proto
//! `AcquireRequest.mode`/`permits`, `GetResponse.holders`): several holders
//! with their own tokens, FIFO across modes, the fixed kind of a resource,
//! and the cluster format that keeps modes off while a member could not
//! read them (docs/operations.md, "Formats").

use crate::common;

use std::time::Duration;

use common::calls::{acquire, acquire_req, get, release, with_leader};
use common::Cluster;
use fencelock_api::v1::{AcquireMode, AcquireRequest, Reason};

fn in_mode(resource: &str, request_id: &str, mode: AcquireMode, permits: u32) -> AcquireRequest {
    let mut req = acquire_req(resource, request_id, 10_000, 0);
    req.mode = mode as i32;
    req.permits = permits;
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_share_a_lock_with_their_own_tokens_and_a_writer_comes_after_them() {
    let cluster = Cluster::start(3, |_| {}).await;
    cluster
        .wait_for_cluster_format(fencelock_placement::MODES_FORMAT, Duration::from_secs(20))
        .await;
    let table = "acme/tables/orders";
    let r1 = acquire(&cluster, 1, in_mode(table, "r-1", AcquireMode::Shared, 0))
        .await
        .expect("first reader");
    let r2 = acquire(&cluster, 2, in_mode(table, "r-2", AcquireMode::Shared, 0))
        .await
        .expect("second reader beside the first");
    assert!(r2.fencing_token > r1.fencing_token);

    let read = get(&cluster, 3, table).await.unwrap();
    assert!(read.held);
    assert_eq!(read.mode, AcquireMode::Shared as i32);
    assert_eq!(read.fencing_token, r1.fencing_token, "the oldest holding");
    assert_eq!(read.last_token, r2.fencing_token, "the newest grant");
    let tokens: Vec<i64> = read.holders.iter().map(|h| h.fencing_token).collect();
    assert_eq!(tokens, [r1.fencing_token, r2.fencing_token]);

    // A writer waits for both readers (here: refused at once, wait 0).
    let refused = with_leader(&cluster, 1, Duration::from_secs(5), |mut c| {
        let req = in_mode(table, "w-1", AcquireMode::Exclusive, 0);
        async move { c.acquire(req).await.map(|r| r.into_inner()) }
    })
    .await
    .expect_err("readers hold it");
    assert_eq!(refused.reason(), Reason::LockHeld, "{refused:?}");

    assert!(release(&cluster, 1, table, &r1.lease_id).await.unwrap());
    assert!(release(&cluster, 2, table, &r2.lease_id).await.unwrap());
    let writer = acquire(
        &cluster,
        3,
        in_mode(table, "w-2", AcquireMode::Exclusive, 0),
    )
    .await
    .expect("free again");
    assert!(writer.fencing_token > r2.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_semaphore_grants_its_permits_and_refuses_another_count_or_a_lock() {
    let cluster = Cluster::start(3, |_| {}).await;
    cluster
        .wait_for_cluster_format(fencelock_placement::MODES_FORMAT, Duration::from_secs(20))
        .await;
    let pool = "acme/pools/db";
    let mut held = Vec::new();
    for i in 0..2 {
        let req = in_mode(pool, &format!("p-{i}"), AcquireMode::Semaphore, 2);
        held.push(acquire(&cluster, 1, req).await.expect("a permit"));
    }
    let full = with_leader(&cluster, 1, Duration::from_secs(5), |mut c| {
        let req = in_mode(pool, "p-3", AcquireMode::Semaphore, 2);
        async move { c.acquire(req).await.map(|r| r.into_inner()) }
    })
    .await
    .expect_err("both permits taken");
    assert_eq!(full.reason(), Reason::LockHeld, "{full:?}");

    for (mode, permits) in [(AcquireMode::Semaphore, 3), (AcquireMode::Exclusive, 0)] {
        let refused = with_leader(&cluster, 1, Duration::from_secs(5), |mut c| {
            let req = in_mode(pool, "other", mode, permits);
            async move { c.acquire(req).await.map(|r| r.into_inner()) }
        })
        .await
        .expect_err("another kind");
        assert_eq!(refused.reason(), Reason::ModeMismatch, "{refused:?}");
        assert!(refused.message.contains("2"), "{}", refused.message);
    }
    let read = get(&cluster, 2, pool).await.unwrap();
    assert_eq!(read.permits, 2);
    assert_eq!(read.holders.len(), 2);

    // The clients' bound is the state machine's.
    assert_eq!(
        fencelock_client::MAX_PERMITS,
        fencelock_statemachine::limits::MAX_HOLDERS_PER_RESOURCE
    );
    // Bad counts never reach the log.
    for (mode, permits) in [
        (AcquireMode::Semaphore, 0),
        (AcquireMode::Semaphore, 1_025),
        (AcquireMode::Shared, 3),
    ] {
        let refused = with_leader(&cluster, 1, Duration::from_secs(5), |mut c| {
            let req = in_mode("acme/pools/other", "bad", mode, permits);
            async move { c.acquire(req).await.map(|r| r.into_inner()) }
        })
        .await
        .expect_err("out of range");
        assert_eq!(refused.reason(), Reason::InvalidPermits, "{refused:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn modes_are_refused_until_every_member_reads_them_and_exclusive_acquires_never_notice() {
    // Node 3 keeps the cluster readable by the release before modes.
    let mut cluster = Cluster::start(3, |c| {
        if c.node_id == 3 {
            c.max_placement_format = fencelock_placement::VALUES_FORMAT;
        }
    })
    .await;
    cluster
        .wait_for_cluster_format(fencelock_placement::VALUES_FORMAT, Duration::from_secs(20))
        .await;
    // Rounds of the controller pass; the format stays below modes.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        cluster.nodes[&1].router().map().unwrap().cluster_format(),
        fencelock_placement::VALUES_FORMAT
    );
    let req = in_mode("acme/shared", "s-1", AcquireMode::Shared, 0);
    let refused = with_leader(&cluster, 1, Duration::from_secs(1), |mut c| {
        let req = req.clone();
        async move { c.acquire(req).await.map(|r| r.into_inner()) }
    })
    .await
    .expect_err("a member cannot read modes");
    assert_eq!(refused.reason(), Reason::FeatureNotEnabled, "{refused:?}");
    assert!(!get(&cluster, 1, "acme/shared").await.unwrap().held);
    acquire(&cluster, 2, acquire_req("acme/plain", "p-1", 10_000, 0))
        .await
        .expect("an exclusive acquire needs no new format");

    // Node 3 upgraded: the controller raises the cluster format by itself.
    cluster.crash(3).await;
    cluster.configs.get_mut(&3).unwrap().max_placement_format =
        fencelock_placement::PLACEMENT_FORMAT;
    cluster.restart(3).await;
    cluster
        .wait_for_cluster_format(fencelock_placement::MODES_FORMAT, Duration::from_secs(20))
        .await;
    let held = acquire(&cluster, 1, req).await.expect("modes are on");
    let read = get(&cluster, 3, "acme/shared").await.unwrap();
    assert_eq!(read.mode, AcquireMode::Shared as i32);
    assert_eq!(read.fencing_token, held.fencing_token);
}
