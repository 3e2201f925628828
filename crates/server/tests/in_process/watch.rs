//! Watches (lock.proto `Watch`): a resource's state, then every change in
//! order, from any replica; resumed on another node from the last revision
//! seen, with nothing missed and nothing twice.

use crate::common;

use std::time::{Duration, Instant};

use common::calls::{acquire, acquire_req, release, with_leader};
use common::Cluster;
use fencelock_api::v1::{ProclaimRequest, Revision, WatchEvent, WatchEventKind, WatchRequest};
use tonic::Streaming;

const RESOURCE: &str = "acme/watched/primary";

async fn watch(cluster: &Cluster, node: u64, after: Option<Revision>) -> Streaming<WatchEvent> {
    let mut client = cluster.client(node).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let request = WatchRequest {
            resource: RESOURCE.into(),
            after,
        };
        match client.watch(request).await {
            Ok(stream) => return stream.into_inner(),
            // The node's map or replica may still be on its way.
            Err(status) if Instant::now() < deadline => {
                let _ = status;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("watch on node {node}: {status}"),
        }
    }
}

async fn next(stream: &mut Streaming<WatchEvent>) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event within 10 s")
        .expect("the stream stays open")
        .expect("not ended")
}

async fn nothing_within(stream: &mut Streaming<WatchEvent>, wait: Duration) {
    if let Ok(got) = tokio::time::timeout(wait, stream.message()).await {
        panic!("expected no event, got {got:?}");
    }
}

fn kind(event: &WatchEvent) -> WatchEventKind {
    WatchEventKind::try_from(event.kind).unwrap()
}

fn key(r: &Option<Revision>) -> (u64, u64, u32) {
    let r = r.as_ref().expect("every event has a revision");
    (r.epoch, r.index, r.seq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_sees_every_change_in_order_and_resumes_on_another_node_without_repeats() {
    let cluster = Cluster::start(3, |_| {}).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    cluster
        .wait_for_cluster_format(fencelock_placement::VALUES_FORMAT, Duration::from_secs(20))
        .await;

    let mut first = watch(&cluster, 2, None).await;
    let state = next(&mut first).await;
    assert_eq!(kind(&state), WatchEventKind::State);
    assert!(!state.held && !state.gap, "{state:?}");

    let mut req = acquire_req(RESOURCE, "w-1", 10_000, 0);
    req.value = b"10.0.0.1:7000".to_vec();
    let held = acquire(&cluster, 1, req).await.expect("granted");
    let proclaim = ProclaimRequest {
        resource: RESOURCE.into(),
        lease_id: held.lease_id.clone(),
        value: b"10.0.0.1:7001".to_vec(),
    };
    with_leader(&cluster, 1, Duration::from_secs(15), |mut c| {
        let req = proclaim.clone();
        async move { c.proclaim(req).await.map(|r| r.into_inner()) }
    })
    .await
    .expect("proclaimed");
    assert!(release(&cluster, 1, RESOURCE, &held.lease_id)
        .await
        .unwrap());

    let granted = next(&mut first).await;
    assert_eq!(kind(&granted), WatchEventKind::Granted);
    assert_eq!(granted.fencing_token, held.fencing_token);
    assert_eq!(granted.value, b"10.0.0.1:7000");
    let changed = next(&mut first).await;
    assert_eq!(kind(&changed), WatchEventKind::ValueChanged);
    assert_eq!(changed.value, b"10.0.0.1:7001");
    assert_eq!(changed.fencing_token, held.fencing_token);
    let released = next(&mut first).await;
    assert_eq!(kind(&released), WatchEventKind::Released);
    assert!(!released.held);
    assert!(key(&state.revision) < key(&granted.revision));
    assert!(key(&granted.revision) < key(&changed.revision));
    assert!(key(&changed.revision) < key(&released.revision));

    // A watcher that saw only the grant resumes on another node: the two
    // changes after it, with the same revisions, and nothing else.
    let mut resumed = watch(&cluster, 3, granted.revision).await;
    let again = next(&mut resumed).await;
    assert_eq!(kind(&again), WatchEventKind::ValueChanged);
    assert_eq!(again.revision, changed.revision);
    let again = next(&mut resumed).await;
    assert_eq!(kind(&again), WatchEventKind::Released);
    assert_eq!(again.revision, released.revision);
    nothing_within(&mut resumed, Duration::from_millis(500)).await;

    // One that saw everything, on the third node, waits for the next
    // change, as do the others.
    let mut caught_up = watch(&cluster, 1, released.revision).await;
    nothing_within(&mut caught_up, Duration::from_millis(300)).await;
    let second = acquire(&cluster, 1, acquire_req(RESOURCE, "w-2", 10_000, 0))
        .await
        .expect("granted");
    for stream in [&mut first, &mut resumed, &mut caught_up] {
        let event = next(stream).await;
        assert_eq!(kind(&event), WatchEventKind::Granted);
        assert_eq!(event.fencing_token, second.fencing_token);
        assert!(event.value.is_empty());
        assert!(key(&event.revision) > key(&released.revision));
    }
}
