//! Lock calls against a [`Cluster`] the way a careful client makes them:
//! NOT_LEADER hints followed, transient refusals retried on other nodes.

use std::time::{Duration, Instant};

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{
    AcquireRequest, AcquireResponse, ErrorDetail, GetRequest, GetResponse, Reason, ReleaseRequest,
    RenewRequest, RenewResponse,
};
use tonic::transport::Channel;

use crate::Cluster;

/// Runs `call` against `start_node`, following NOT_LEADER hints and retrying
/// retryable refusals until `within` runs out. Returns the last error.
pub async fn with_leader<T, F, Fut>(
    cluster: &Cluster,
    start_node: u64,
    within: Duration,
    call: F,
) -> Result<T, ErrorDetail>
where
    F: FnMut(LockServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let running: Vec<String> = cluster
        .nodes
        .keys()
        .map(|id| cluster.endpoint(*id))
        .collect();
    call_endpoints(&cluster.endpoint(start_node), &running, within, call).await
}

/// Runs `call` against `first`, following NOT_LEADER hints and otherwise
/// trying `endpoints` in turn on transient refusals (no leader yet, no
/// quorum, unknown outcome, unreachable) until `within` runs out.
pub async fn call_endpoints<T, F, Fut>(
    first: &str,
    endpoints: &[String],
    within: Duration,
    mut call: F,
) -> Result<T, ErrorDetail>
where
    F: FnMut(LockServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + within;
    let mut endpoint = first.to_string();
    let mut attempt = 0usize;
    loop {
        let connect = LockServiceClient::connect(endpoint.clone());
        let result = match tokio::time::timeout(Duration::from_secs(1), connect).await {
            Ok(Ok(client)) => call(client).await,
            _ => Err(tonic::Status::unavailable("connect failed")),
        };
        let status = match result {
            Ok(v) => return Ok(v),
            Err(status) => status,
        };
        let detail = ErrorDetail::from_status(&status).unwrap_or_else(|| ErrorDetail {
            reason: Reason::Unspecified as i32,
            message: status.message().to_string(),
            ..Default::default()
        });
        let retryable = matches!(
            detail.reason(),
            Reason::NotLeader
                | Reason::LeaderUnknown
                | Reason::LeaderNotReady
                | Reason::NoQuorum
                | Reason::OutcomeUnknown
                | Reason::Unspecified
                | Reason::ServerBusy
                | Reason::ShuttingDown
                | Reason::EpochNotMatch
                | Reason::ShardNotFound
        );
        if !retryable || Instant::now() >= deadline {
            return Err(detail);
        }
        match detail.leader.as_ref().map(|l| l.address.clone()) {
            Some(addr) if detail.reason() == Reason::NotLeader && !addr.is_empty() => {
                endpoint = format!("http://{addr}");
            }
            _ => {
                attempt += 1;
                endpoint = endpoints[attempt % endpoints.len()].clone();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

pub fn acquire_req(resource: &str, request_id: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.into(),
        request_id: request_id.as_bytes().to_vec(),
        lease_ttl_ms: ttl_ms,
        wait_timeout_ms: wait_ms,
        value: Vec::new(),
        ..Default::default()
    }
}

pub async fn acquire(
    cluster: &Cluster,
    node: u64,
    req: AcquireRequest,
) -> Result<AcquireResponse, ErrorDetail> {
    with_leader(cluster, node, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.acquire(req).await.map(|r| r.into_inner()) }
    })
    .await
}

pub async fn get(cluster: &Cluster, node: u64, resource: &str) -> Result<GetResponse, ErrorDetail> {
    let req = GetRequest {
        resource: resource.into(),
    };
    with_leader(cluster, node, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.get(req).await.map(|r| r.into_inner()) }
    })
    .await
}

pub async fn renew(
    cluster: &Cluster,
    node: u64,
    resource: &str,
    lease_id: &[u8],
) -> Result<RenewResponse, ErrorDetail> {
    let req = RenewRequest {
        resource: resource.into(),
        lease_id: lease_id.to_vec(),
        lease_ttl_ms: 0,
    };
    with_leader(cluster, node, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.renew(req).await.map(|r| r.into_inner()) }
    })
    .await
}

pub async fn release(
    cluster: &Cluster,
    node: u64,
    resource: &str,
    lease_id: &[u8],
) -> Result<bool, ErrorDetail> {
    let req = ReleaseRequest {
        resource: resource.into(),
        lease_id: lease_id.to_vec(),
    };
    with_leader(cluster, node, Duration::from_secs(15), |mut c| {
        let req = req.clone();
        async move { c.release(req).await.map(|r| r.into_inner().released) }
    })
    .await
}
