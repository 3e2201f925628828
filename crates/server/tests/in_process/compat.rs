//! Old clients keep working unchanged: an application built against the
//! previous release's contract (`crates/api-compat`, the frozen
//! `proto/fencelock/v1` of `PREVIOUS_RELEASE`) locks, renews and releases
//! on today's nodes, sees today's shared locks and semaphores as held, and
//! can act on refusals whose reasons it has never heard of (their gRPC
//! code and retry advice are in fields it knows).

use crate::common;

use std::time::{Duration, Instant};

use common::calls::{acquire, acquire_req, release};
use common::Cluster;
use fencelock_api::v1::AcquireMode;
use fencelock_api_compat::previous::lock_service_client::LockServiceClient;
use fencelock_api_compat::previous::{
    AcquireRequest, AcquireResponse, ErrorDetail, GetRequest, GetResponse, LeaseState, Reason,
    ReleaseRequest, RenewBatchRequest, RenewRequest, RetryPolicy,
};
use fencelock_api_compat::previous_error_detail;
use tonic::transport::Channel;

/// The refusal an old client reads, with the gRPC code it came with.
#[derive(Debug)]
struct Refused {
    code: tonic::Code,
    detail: ErrorDetail,
}

/// Runs `call` with a client of the previous release, the way such a
/// client retries: on the node a NOT_LEADER hint names, else on the next
/// node, while the refusal is one the old contract says to retry.
async fn old_call<T, F, Fut>(endpoints: &[String], mut call: F) -> Result<T, Refused>
where
    F: FnMut(LockServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut endpoint = endpoints[0].clone();
    let mut attempt = 0;
    loop {
        let status = match LockServiceClient::connect(endpoint.clone()).await {
            Ok(client) => match call(client).await {
                Ok(reply) => return Ok(reply.into_inner()),
                Err(status) => status,
            },
            Err(_) => tonic::Status::unavailable("connect failed"),
        };
        let detail = previous_error_detail(&status).unwrap_or_default();
        let refused = Refused {
            code: status.code(),
            detail,
        };
        // Routing refusals only (nothing decided, or the outcome unknown
        // and the request id makes a retry safe); a refusal about the lock
        // itself (LOCK_HELD, ...) is the answer.
        let routing = matches!(
            refused.detail.reason(),
            Reason::NotLeader
                | Reason::LeaderUnknown
                | Reason::LeaderNotReady
                | Reason::NoQuorum
                | Reason::OutcomeUnknown
                | Reason::ServerBusy
                | Reason::ShuttingDown
                | Reason::EpochNotMatch
                | Reason::ShardNotFound
        );
        let unreachable =
            previous_error_detail(&status).is_none() && status.code() == tonic::Code::Unavailable;
        let retry = refused.detail.retry() != RetryPolicy::Never && (routing || unreachable);
        if !retry || Instant::now() >= deadline {
            return Err(refused);
        }
        match refused.detail.leader.as_ref() {
            Some(l) if refused.detail.reason() == Reason::NotLeader && !l.address.is_empty() => {
                endpoint = format!("http://{}", l.address);
            }
            _ => {
                attempt += 1;
                endpoint = endpoints[attempt % endpoints.len()].clone();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Every node's client endpoint: where an old client may send.
fn endpoints(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes
        .keys()
        .map(|id| cluster.endpoint(*id))
        .collect()
}

fn old_acquire_req(resource: &str, request_id: &str, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.into(),
        request_id: request_id.as_bytes().to_vec(),
        lease_ttl_ms: 10_000,
        wait_timeout_ms: wait_ms,
    }
}

async fn old_acquire(
    endpoints: &[String],
    req: AcquireRequest,
) -> Result<AcquireResponse, Refused> {
    old_call(endpoints, |mut c| {
        let req = req.clone();
        async move { c.acquire(req).await }
    })
    .await
}

async fn old_get(endpoints: &[String], resource: &str) -> GetResponse {
    let req = GetRequest {
        resource: resource.into(),
    };
    old_call(endpoints, |mut c| {
        let req = req.clone();
        async move { c.get(req).await }
    })
    .await
    .expect("get")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_of_the_previous_release_locks_renews_and_releases_on_todays_nodes() {
    let cluster = Cluster::start(3, |_| {}).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    let nodes = endpoints(&cluster);
    let resource = "acme/compat/orders";

    let first = old_acquire(&nodes, old_acquire_req(resource, "old-1", 0))
        .await
        .expect("granted");
    assert!(first.fencing_token > 0);
    assert_eq!(first.lease_state(), LeaseState::Held);
    assert_eq!(first.lease_ttl_ms, 10_000);
    assert!(!first.deduplicated);

    // The reply was lost: the retry with the same request id is the same
    // lease, never a second one.
    let again = old_acquire(&nodes, old_acquire_req(resource, "old-1", 0))
        .await
        .expect("deduplicated");
    assert!(again.deduplicated);
    assert_eq!(again.lease_id, first.lease_id);
    assert_eq!(again.fencing_token, first.fencing_token);

    let read = old_get(&nodes, resource).await;
    assert!(read.held);
    assert_eq!(read.fencing_token, first.fencing_token);
    assert_eq!(read.last_token, first.fencing_token);

    let renew = RenewRequest {
        resource: resource.into(),
        lease_id: first.lease_id.clone(),
        lease_ttl_ms: 10_000,
    };
    let renewed = old_call(&nodes, |mut c| {
        let renew = renew.clone();
        async move { c.renew(renew).await }
    })
    .await
    .expect("renewed");
    assert_eq!(renewed.lease_ttl_ms, 10_000);
    assert!(renewed.expires_at_ms > 0);
    let batch = RenewBatchRequest {
        items: vec![renew.clone()],
    };
    let results = old_call(&nodes, |mut c| {
        let batch = batch.clone();
        async move { c.renew_batch(batch).await }
    })
    .await
    .expect("batch renewed")
    .results;
    assert_eq!(results.len(), 1);
    assert!(
        matches!(
            results[0].outcome,
            Some(fencelock_api_compat::previous::renew_result::Outcome::Renewed(_))
        ),
        "{results:?}"
    );

    // A stale lease id touches nothing; the holder's own releases it.
    let release_with = |lease_id: Vec<u8>| ReleaseRequest {
        resource: resource.into(),
        lease_id,
    };
    let stale = release_with(vec![7u8; first.lease_id.len()]);
    let released = old_call(&nodes, |mut c| {
        let stale = stale.clone();
        async move { c.release(stale).await }
    })
    .await;
    assert!(
        !released.as_ref().is_ok_and(|r| r.released),
        "a stale lease id released the lock: {released:?}"
    );
    assert!(old_get(&nodes, resource).await.held);
    let own = release_with(first.lease_id.clone());
    let released = old_call(&nodes, |mut c| {
        let own = own.clone();
        async move { c.release(own).await }
    })
    .await
    .expect("released");
    assert!(released.released);
    assert!(!old_get(&nodes, resource).await.held);

    let second = old_acquire(&nodes, old_acquire_req(resource, "old-2", 0))
        .await
        .expect("granted again");
    assert!(second.fencing_token > first.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_of_the_previous_release_sees_shared_holders_and_semaphores_as_held() {
    let cluster = Cluster::start(3, |_| {}).await;
    cluster
        .wait_for_cluster_format(fencelock_placement::MODES_FORMAT, Duration::from_secs(20))
        .await;
    let nodes = endpoints(&cluster);
    let table = "acme/compat/table";
    let mut shared = acquire_req(table, "new-r-1", 10_000, 0);
    shared.mode = AcquireMode::Shared as i32;
    let reader = acquire(&cluster, 1, shared).await.expect("a shared holder");

    // An old client's acquire is exclusive: refused beside a reader, with a
    // reason it knows.
    let refused = old_acquire(&nodes, old_acquire_req(table, "old-w-1", 0))
        .await
        .expect_err("a reader holds it");
    assert_eq!(refused.detail.reason(), Reason::LockHeld, "{refused:?}");
    let read = old_get(&nodes, table).await;
    assert!(read.held, "a shared lock is held to an old client");
    assert_eq!(read.fencing_token, reader.fencing_token);

    // Waiting, it is granted once the reader leaves, with a larger token.
    let waiting = {
        let nodes = nodes.clone();
        tokio::spawn(
            async move { old_acquire(&nodes, old_acquire_req(table, "old-w-2", 10_000)).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(release(&cluster, 1, table, &reader.lease_id).await.unwrap());
    let writer = waiting.await.unwrap().expect("granted after the reader");
    assert!(writer.fencing_token > reader.fencing_token);

    // A semaphore: an old client's exclusive acquire is a mode mismatch, a
    // reason it has never heard of; the code and the retry advice it knows
    // say not to retry.
    let pool = "acme/compat/pool";
    let mut permit = acquire_req(pool, "new-p-1", 10_000, 0);
    permit.mode = AcquireMode::Semaphore as i32;
    permit.permits = 2;
    acquire(&cluster, 2, permit).await.expect("a permit");
    let refused = old_acquire(&nodes, old_acquire_req(pool, "old-p-1", 0))
        .await
        .expect_err("a semaphore is not an exclusive lock");
    assert!(
        Reason::try_from(refused.detail.reason).is_err(),
        "MODE_MISMATCH is new since the previous release: {refused:?}"
    );
    assert_eq!(
        refused.detail.reason,
        fencelock_api::v1::Reason::ModeMismatch as i32
    );
    assert_eq!(refused.code, tonic::Code::FailedPrecondition);
    assert_eq!(refused.detail.retry(), RetryPolicy::Never);
    assert!(old_get(&nodes, pool).await.held);
}
