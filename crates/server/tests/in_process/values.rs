//! Holder values (lock.proto `AcquireRequest.value`, `Proclaim`,
//! `GetResponse.value`): what a holder publishes with its lease, readable by
//! anyone, replaceable only by the lease that holds; and the cluster format
//! that keeps them off while a member could not read them
//! (docs/operations.md, "Formats").

use crate::common;

use std::time::Duration;

use common::calls::{acquire, acquire_req, get, release, with_leader};
use common::Cluster;
use fencelock_api::v1::{ErrorDetail, ProclaimRequest, ProclaimResponse, Reason};

async fn proclaim(
    cluster: &Cluster,
    resource: &str,
    lease_id: &[u8],
    value: &[u8],
) -> Result<ProclaimResponse, ErrorDetail> {
    let req = ProclaimRequest {
        resource: resource.into(),
        lease_id: lease_id.to_vec(),
        value: value.to_vec(),
    };
    with_leader(cluster, 1, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.proclaim(req).await.map(|r| r.into_inner()) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_publishes_a_value_that_get_returns_and_only_the_holder_replaces() {
    let cluster = Cluster::start(3, |_| {}).await;
    cluster
        .wait_for_cluster_format(fencelock_placement::VALUES_FORMAT, Duration::from_secs(20))
        .await;
    let leader = "acme/election/primary";

    let mut req = acquire_req(leader, "campaign-1", 10_000, 0);
    req.value = b"10.0.0.1:7000".to_vec();
    let held = acquire(&cluster, 1, req).await.expect("granted");
    let read = get(&cluster, 2, leader).await.expect("read");
    assert!(read.held);
    assert_eq!(read.value, b"10.0.0.1:7000");
    assert_eq!(read.fencing_token, held.fencing_token);

    // Proclaim: a new value, the same token.
    let proclaimed = proclaim(&cluster, leader, &held.lease_id, b"10.0.0.1:7001")
        .await
        .expect("the holder proclaims");
    assert_eq!(proclaimed.fencing_token, held.fencing_token);
    assert_eq!(
        get(&cluster, 3, leader).await.unwrap().value,
        b"10.0.0.1:7001"
    );

    // A lease that does not hold cannot: nothing changes.
    let refused = proclaim(&cluster, leader, &[7u8; 16], b"usurper")
        .await
        .expect_err("not the holder");
    assert_eq!(refused.reason(), Reason::LeaseNotHeld, "{refused:?}");
    assert_eq!(
        get(&cluster, 1, leader).await.unwrap().value,
        b"10.0.0.1:7001"
    );

    // Too large a value is refused with the bound, before anything changes.
    let too_big = vec![b'x'; fencelock_statemachine::limits::MAX_HOLDER_VALUE_BYTES + 1];
    let refused = proclaim(&cluster, leader, &held.lease_id, &too_big)
        .await
        .expect_err("too large");
    assert_eq!(refused.reason(), Reason::ValueTooLarge, "{refused:?}");
    assert_eq!(refused.field, "value");
    assert_eq!(
        refused.max_allowed,
        fencelock_statemachine::limits::MAX_HOLDER_VALUE_BYTES as u64
    );

    // A queued acquire publishes its own value from its grant on.
    let mut next = acquire_req(leader, "campaign-2", 10_000, 20_000);
    next.value = b"10.0.0.2:7000".to_vec();
    let waiting = {
        let cluster_endpoint = cluster.endpoint(1);
        tokio::spawn(async move {
            let mut c = fencelock_api::v1::lock_service_client::LockServiceClient::connect(
                cluster_endpoint,
            )
            .await
            .unwrap();
            c.acquire(next).await.map(|r| r.into_inner())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(release(&cluster, 1, leader, &held.lease_id).await.unwrap());
    let second = waiting.await.unwrap().expect("granted from the queue");
    assert!(second.fencing_token > held.fencing_token);
    let read = get(&cluster, 2, leader).await.unwrap();
    assert_eq!(read.value, b"10.0.0.2:7000");
    assert_eq!(read.fencing_token, second.fencing_token);

    // Released: nothing is published.
    assert!(release(&cluster, 1, leader, &second.lease_id)
        .await
        .unwrap());
    let read = get(&cluster, 1, leader).await.unwrap();
    assert!(!read.held);
    assert!(read.value.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn values_are_refused_until_every_member_reads_them_and_old_clients_never_notice() {
    // Node 3 keeps the cluster readable by the previous release.
    let mut cluster = Cluster::start(3, |c| {
        if c.node_id == 3 {
            c.max_placement_format = 3;
        }
    })
    .await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    // Rounds of the controller pass; the format stays.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        cluster.nodes[&1].router().map().unwrap().cluster_format(),
        fencelock_placement::FIRST_PLACEMENT_FORMAT
    );
    let mut req = acquire_req("acme/with-value", "v-1", 10_000, 0);
    req.value = b"addr".to_vec();
    let refused = with_leader(&cluster, 1, Duration::from_secs(1), |mut c| {
        let req = req.clone();
        async move { c.acquire(req).await.map(|r| r.into_inner()) }
    })
    .await
    .expect_err("a member cannot read values");
    assert_eq!(refused.reason(), Reason::FeatureNotEnabled, "{refused:?}");
    assert!(
        refused.message.contains("cluster format"),
        "{}",
        refused.message
    );
    assert!(!get(&cluster, 1, "acme/with-value").await.unwrap().held);
    // An acquire without a value (what every older client sends) is served.
    let plain = acquire(&cluster, 2, acquire_req("acme/plain", "p-1", 10_000, 0))
        .await
        .expect("values are not needed");
    let refused = proclaim(&cluster, "acme/plain", &plain.lease_id, b"addr")
        .await
        .expect_err("proclaim needs values too");
    assert_eq!(refused.reason(), Reason::FeatureNotEnabled, "{refused:?}");

    // Node 3 upgraded: the controller raises the cluster format by itself.
    cluster.crash(3).await;
    cluster.configs.get_mut(&3).unwrap().max_placement_format =
        fencelock_placement::PLACEMENT_FORMAT;
    cluster.restart(3).await;
    cluster
        .wait_for_cluster_format(fencelock_placement::VALUES_FORMAT, Duration::from_secs(20))
        .await;
    let held = acquire(&cluster, 1, req).await.expect("values are on");
    assert_eq!(
        get(&cluster, 3, "acme/with-value").await.unwrap().value,
        b"addr"
    );
    assert!(proclaim(&cluster, "acme/plain", &plain.lease_id, b"now")
        .await
        .is_ok());
    assert!(held.fencing_token > 0);
}
