//! The client against scripted fake nodes on real loopback sockets: routing,
//! the retry contract, batching of renewals, the stop-by deadline and the
//! lost signal, and cancellation. The real cluster is exercised by
//! `crates/server/tests/in_process/client_lib.rs`; these tests pin down behaviour that
//! a real cluster cannot be made to show on demand.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock_client::proto::lock_service_server::{LockService, LockServiceServer};
use fencelock_client::proto::{
    renew_result, AcquireRequest, AcquireResponse, ErrorDetail, GetRequest, GetResponse,
    LeaderHint, LeaseState, ProclaimRequest, ProclaimResponse, Reason, ReleaseRequest,
    ReleaseResponse, RenewBatchRequest, RenewBatchResponse, RenewRequest, RenewResponse,
    RenewResult, WatchEvent, WatchRequest,
};
use fencelock_client::{
    AcquireOptions, Client, ClientConfig, ClientError, LeaseStatus, LostReason, RequestId,
};
use tonic::{Request, Response, Status};

/// The shard every fake node claims the resources belong to.
const SHARD_ID: u64 = 5;

/// What a fake node does, set by each test.
#[derive(Default)]
struct Script {
    /// Answer every call with NOT_LEADER naming this address.
    redirect_to: Option<String>,
    /// Failures returned by the next acquires, in order; then grants.
    acquire_failures: VecDeque<Status>,
    /// How long an acquire takes to answer.
    acquire_delay: Duration,
    /// Acquires never answer (a waiter that is never granted).
    acquire_hangs: bool,
    /// Every renewal item fails with this.
    renew_error: Option<ErrorDetail>,
    /// Renewals start failing with `renew_error` only after this many
    /// successful renewal items.
    renew_errors_after: u64,
    /// The time a deduplicated acquire answer grants (a server answers what
    /// is left of the original grant); `None`: the TTL asked for.
    dedup_grants_ms: Option<u64>,
    /// The time every renewal grants (a server near the hold limit grants
    /// less than asked); `None`: the usual answers.
    renew_grants_ms: Option<u64>,
    /// Single (non-batch) renewals fail with this.
    single_renew_error: Option<ErrorDetail>,
}

#[derive(Default)]
struct Fake {
    script: Mutex<Script>,
    acquires: Mutex<Vec<AcquireRequest>>,
    batch_sizes: Mutex<Vec<usize>>,
    single_renews: AtomicU64,
    renewed_items: AtomicU64,
    releases: Mutex<Vec<ReleaseRequest>>,
    gets: AtomicU64,
    redirects: AtomicU64,
    next_token: AtomicI64,
    /// Set when a hanging acquire's handler is dropped: the client's call
    /// went away.
    waiter_dropped: Arc<AtomicBool>,
    waiter_started: AtomicBool,
}

/// Sets a flag when dropped (with the handler future that owns it).
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct Node(Arc<Fake>);

impl Node {
    fn redirect(&self) -> Result<(), Status> {
        match &self.0.script.lock().unwrap().redirect_to {
            Some(address) => Err({
                self.0.redirects.fetch_add(1, Ordering::SeqCst);
                ErrorDetail {
                    shard_id: SHARD_ID,
                    leader: Some(LeaderHint {
                        node_id: 9,
                        address: address.clone(),
                    }),
                    ..ErrorDetail::new(Reason::NotLeader, "not the leader")
                }
                .to_status()
            }),
            None => Ok(()),
        }
    }
}

/// The lease id a fake node grants to a request id: the same id gets the
/// same lease, like the server's dedup.
fn lease_id_for(request_id: &[u8]) -> Vec<u8> {
    let mut id = vec![0u8; 16];
    for (i, b) in request_id.iter().enumerate() {
        id[i % 16] ^= b;
    }
    id
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tonic::async_trait]
impl LockService for Node {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        self.redirect()?;
        let req = request.into_inner();
        let seen_before = self
            .0
            .acquires
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.request_id == req.request_id);
        self.0.acquires.lock().unwrap().push(req.clone());
        let (failure, delay, hangs) = {
            let mut script = self.0.script.lock().unwrap();
            (
                script.acquire_failures.pop_front(),
                script.acquire_delay,
                script.acquire_hangs,
            )
        };
        if let Some(status) = failure {
            return Err(status);
        }
        if hangs {
            let _flag = DropFlag(self.0.waiter_dropped.clone());
            self.0.waiter_started.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(delay).await;
        let ttl = if req.lease_ttl_ms == 0 {
            30_000
        } else {
            req.lease_ttl_ms
        };
        let dedup_grants_ms = self.0.script.lock().unwrap().dedup_grants_ms;
        let ttl = match dedup_grants_ms {
            Some(left_ms) if seen_before => left_ms,
            _ => ttl,
        };
        Ok(Response::new(AcquireResponse {
            lease_id: lease_id_for(&req.request_id),
            fencing_token: self.0.next_token.fetch_add(1, Ordering::SeqCst) + 1,
            expires_at_ms: now_ms() + ttl,
            lease_ttl_ms: ttl,
            deduplicated: seen_before,
            lease_state: LeaseState::Held as i32,
            shard_id: SHARD_ID,
            epoch: 1,
        }))
    }

    async fn renew(&self, _: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        self.redirect()?;
        self.0.single_renews.fetch_add(1, Ordering::SeqCst);
        let (error, granted_ms) = {
            let script = self.0.script.lock().unwrap();
            (script.single_renew_error.clone(), script.renew_grants_ms)
        };
        if let Some(detail) = error {
            return Err(detail.to_status());
        }
        let granted_ms = granted_ms.unwrap_or(30_000);
        Ok(Response::new(RenewResponse {
            expires_at_ms: now_ms() + granted_ms,
            lease_ttl_ms: granted_ms,
        }))
    }

    async fn renew_batch(
        &self,
        request: Request<RenewBatchRequest>,
    ) -> Result<Response<RenewBatchResponse>, Status> {
        self.redirect()?;
        let items = request.into_inner().items;
        self.0.batch_sizes.lock().unwrap().push(items.len());
        let (error, after, granted_ms) = {
            let script = self.0.script.lock().unwrap();
            (
                script.renew_error.clone(),
                script.renew_errors_after,
                script.renew_grants_ms.unwrap_or(1_200),
            )
        };
        let results = items
            .iter()
            .map(|_| {
                let done = self.0.renewed_items.load(Ordering::SeqCst);
                let outcome = match &error {
                    Some(detail) if done >= after => renew_result::Outcome::Error(detail.clone()),
                    _ => {
                        self.0.renewed_items.fetch_add(1, Ordering::SeqCst);
                        renew_result::Outcome::Renewed(RenewResponse {
                            expires_at_ms: now_ms() + granted_ms,
                            lease_ttl_ms: granted_ms,
                        })
                    }
                };
                RenewResult {
                    outcome: Some(outcome),
                }
            })
            .collect();
        Ok(Response::new(RenewBatchResponse { results }))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        self.redirect()?;
        self.0.releases.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ReleaseResponse { released: true }))
    }

    type WatchStream = tokio_stream::Empty<Result<WatchEvent, Status>>;

    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented(
            "the fake node does not stream changes",
        ))
    }

    async fn proclaim(
        &self,
        _: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        Err(Status::unimplemented(
            "the fake node does not publish values",
        ))
    }

    async fn get(&self, _: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        self.redirect()?;
        self.0.gets.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(GetResponse {
            shard_id: SHARD_ID,
            epoch: 1,
            ..GetResponse::default()
        }))
    }
}

/// Starts a fake node on a loopback port; returns it and its `host:port`.
async fn start_fake() -> (Arc<Fake>, String) {
    let fake = Arc::new(Fake::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let service = LockServiceServer::new(Node(fake.clone()));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (fake, address)
}

fn fast_config() -> ClientConfig {
    ClientConfig {
        call_timeout_ms: 2_000,
        attempt_timeout_ms: 500,
        connect_timeout_ms: 500,
        backoff_base_ms: 10,
        backoff_max_ms: 100,
        ..ClientConfig::default()
    }
}

async fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_leader_hint_is_followed_and_remembered_for_the_resource() {
    let (leader, leader_addr) = start_fake().await;
    let (follower, follower_addr) = start_fake().await;
    follower.script.lock().unwrap().redirect_to = Some(leader_addr.clone());

    let client = Client::connect(vec![follower_addr], fast_config())
        .await
        .unwrap();
    let guard = client.acquire("acme/a", 30_000, 0).await.unwrap();
    assert_eq!(guard.shard_id(), SHARD_ID);
    assert_eq!(follower.redirects.load(Ordering::SeqCst), 1);
    assert_eq!(leader.acquires.lock().unwrap().len(), 1);

    // The route is remembered: the next calls on the resource go straight
    // to the leader.
    client.get("acme/a").await.unwrap();
    assert_eq!(leader.gets.load(Ordering::SeqCst), 1);
    guard.release().await.unwrap();
    assert_eq!(leader.releases.lock().unwrap().len(), 1);
    assert_eq!(follower.redirects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn every_retry_of_one_acquire_sends_the_same_request_id() {
    let (fake, addr) = start_fake().await;
    fake.script.lock().unwrap().acquire_failures = VecDeque::from([
        ErrorDetail::new(Reason::OutcomeUnknown, "leadership changed").to_status(),
        Status::unavailable("connection reset"),
        ErrorDetail::new(Reason::LeaderNotReady, "just elected").to_status(),
    ]);
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/retried", 5_000, 0).await.unwrap();
    let acquires = fake.acquires.lock().unwrap().clone();
    assert_eq!(acquires.len(), 4);
    assert!(acquires
        .iter()
        .all(|a| a.request_id == acquires[0].request_id));
    assert!(
        guard.deduplicated(),
        "the fake answers a repeated id as a retry"
    );
    // A new logical acquire gets a new id.
    drop(guard);
    let _second = client.acquire("acme/other", 5_000, 0).await.unwrap();
    let last = fake
        .acquires
        .lock()
        .unwrap()
        .last()
        .unwrap()
        .request_id
        .clone();
    assert_ne!(last, acquires[0].request_id);
}

#[tokio::test]
async fn an_explicit_request_id_gets_the_original_lease_back() {
    let (fake, addr) = start_fake().await;
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let id = RequestId::from_bytes(b"job-17".to_vec()).unwrap();
    let options = AcquireOptions {
        lease_ttl_ms: 5_000,
        wait_timeout_ms: 0,
        request_id: Some(id.clone()),
        value: Vec::new(),
        ..Default::default()
    };
    let first = client
        .acquire_with("acme/x", options.clone())
        .await
        .unwrap();
    let again = client.acquire_with("acme/x", options).await.unwrap();
    assert_eq!(first.lease_id(), again.lease_id());
    assert!(again.deduplicated());
    let acquires = fake.acquires.lock().unwrap();
    assert!(acquires.iter().all(|a| a.request_id == id.as_bytes()));
}

#[tokio::test]
async fn a_deduplicated_grant_is_renewed_before_acquire_returns() {
    let (fake, addr) = start_fake().await;
    // The first attempt is granted but its answer lost; the retry is
    // answered from the dedup table with what is left of that grant.
    fake.script.lock().unwrap().acquire_failures =
        VecDeque::from([ErrorDetail::new(Reason::OutcomeUnknown, "reply lost").to_status()]);
    fake.script.lock().unwrap().dedup_grants_ms = Some(700);
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/dedup", 10_000, 0).await.unwrap();
    assert!(guard.deduplicated());
    // Renewed at once: the guard starts from the renewal's full deadline,
    // not from the 0.7 s the retry's answer granted.
    assert_eq!(fake.single_renews.load(Ordering::SeqCst), 1);
    assert!(guard.stop_by() > Instant::now() + Duration::from_secs(20));
}

#[tokio::test]
async fn a_deduplicated_grant_with_no_time_left_and_no_renewal_is_refused() {
    let (fake, addr) = start_fake().await;
    {
        let mut script = fake.script.lock().unwrap();
        script.acquire_failures =
            VecDeque::from([ErrorDetail::new(Reason::OutcomeUnknown, "reply lost").to_status()]);
        script.dedup_grants_ms = Some(0);
        script.single_renew_error = Some(ErrorDetail::new(Reason::NoQuorum, "no majority"));
    }
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let err = client
        .acquire("acme/dedup-late", 10_000, 0)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Unavailable { last_error, .. } if last_error.contains("NO_QUORUM")),
        "{err:?}"
    );
    // The lease nobody may use is given back.
    wait_until("the release", Duration::from_secs(2), || {
        !fake.releases.lock().unwrap().is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_renewal_that_grants_less_than_asked_moves_the_deadline_only_that_far() {
    let (fake, addr) = start_fake().await;
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/capped", 3_000, 0).await.unwrap();
    // From now on renewals grant 0 ms (a server at the hold limit grants
    // what is left, down to nothing).
    fake.script.lock().unwrap().renew_grants_ms = Some(0);
    let before = guard.stop_by();
    wait_until("a renewal", Duration::from_secs(3), || {
        fake.renewed_items.load(Ordering::SeqCst) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        guard.stop_by(),
        before,
        "a renewal granting nothing moved the deadline"
    );
    // And the lease is lost at the deadline it had.
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost fires");
    assert_eq!(reason, LostReason::Unconfirmed);
    assert!(Instant::now() >= before);
}

#[tokio::test]
async fn a_never_answer_is_not_retried() {
    let (fake, addr) = start_fake().await;
    fake.script.lock().unwrap().acquire_failures =
        VecDeque::from([ErrorDetail::new(Reason::InvalidResource, "bad name").to_status()]);
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let err = client.acquire("acme/x", 5_000, 0).await.unwrap_err();
    assert_eq!(err.reason(), Some(Reason::InvalidResource));
    assert_eq!(fake.acquires.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn lock_held_and_wait_timed_out_end_the_acquire_without_retrying() {
    let (fake, addr) = start_fake().await;
    // BACKOFF is advice for the caller: the acquire itself ends, or a zero
    // wait would silently become a retry loop.
    fake.script.lock().unwrap().acquire_failures = VecDeque::from([
        ErrorDetail::new(Reason::LockHeld, "held").to_status(),
        ErrorDetail::new(Reason::WaitTimedOut, "waited").to_status(),
    ]);
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let err = client.acquire("acme/x", 5_000, 0).await.unwrap_err();
    assert!(err.is_lock_held());
    assert_eq!(err.reason(), Some(Reason::LockHeld));
    let err = client.acquire("acme/x", 5_000, 100).await.unwrap_err();
    assert_eq!(err.reason(), Some(Reason::WaitTimedOut));
    assert_eq!(fake.acquires.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn retries_stop_at_the_call_deadline_with_the_request_id_to_retry_with() {
    let (fake, addr) = start_fake().await;
    fake.script.lock().unwrap().acquire_failures = (0..1_000)
        .map(|_| ErrorDetail::new(Reason::NoQuorum, "no majority").to_status())
        .collect();
    let config = ClientConfig {
        call_timeout_ms: 600,
        ..fast_config()
    };
    let client = Client::connect(vec![addr], config).await.unwrap();
    let started = Instant::now();
    let err = client.acquire("acme/x", 5_000, 0).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed <= Duration::from_millis(800), "{elapsed:?}");
    let ClientError::Unavailable {
        attempts,
        request_id: Some(id),
        ..
    } = &err
    else {
        panic!("expected Unavailable with a request id, got {err:?}")
    };
    assert!(*attempts >= 3, "{attempts} attempts");
    assert!(err.outcome_unknown());
    assert!(
        matches!(err, ClientError::Unavailable { sent: true, .. }),
        "answered attempts were sent: {err:?}"
    );
    let acquires = fake.acquires.lock().unwrap();
    assert!(acquires.iter().all(|a| a.request_id == id.as_bytes()));
}

#[tokio::test]
async fn an_acquire_that_never_got_a_connection_says_nothing_was_sent() {
    // A port nobody listens on: every attempt is a refused connect.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let config = ClientConfig {
        call_timeout_ms: 600,
        ..fast_config()
    };
    let client = Client::connect(vec![dead], config).await.unwrap();
    let err = client.acquire("acme/x", 5_000, 0).await.unwrap_err();
    let ClientError::Unavailable {
        attempts,
        sent,
        request_id,
        ..
    } = &err
    else {
        panic!("expected Unavailable, got {err:?}")
    };
    assert!(*attempts >= 1, "{err}");
    assert!(!sent, "a refused connect cannot have been granted: {err}");
    assert!(request_id.is_some());
}

#[tokio::test]
async fn an_unreachable_seed_is_skipped_for_the_next_one() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (fake, addr) = start_fake().await;
    let client = Client::connect(vec![dead, addr], fast_config())
        .await
        .unwrap();
    client.acquire("acme/x", 5_000, 0).await.unwrap();
    assert_eq!(fake.acquires.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn stop_by_counts_from_when_the_acquire_was_sent() {
    let (fake, addr) = start_fake().await;
    fake.script.lock().unwrap().acquire_delay = Duration::from_millis(300);
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let before = Instant::now();
    let guard = client.acquire("acme/slow", 10_000, 0).await.unwrap();
    let after = Instant::now();
    assert!(after - before >= Duration::from_millis(300));
    // sent no earlier than `before`, answered 300 ms later: the deadline
    // ignores the 300 ms the reply took, and keeps the 5% margin.
    let margin = Duration::from_millis(500);
    assert!(
        guard.stop_by()
            <= before + Duration::from_millis(10_000) - margin + Duration::from_millis(50)
    );
    assert!(
        guard.stop_by()
            >= before + Duration::from_millis(10_000) - margin - Duration::from_millis(50)
    );
    assert!(guard.is_held());
}

#[tokio::test]
async fn held_leases_are_renewed_together_in_batches() {
    let (fake, addr) = start_fake().await;
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(
            client
                .acquire(&format!("acme/batch-{i}"), 1_200, 0)
                .await
                .unwrap(),
        );
    }
    let first_stop_by: Vec<Instant> = guards.iter().map(|g| g.stop_by()).collect();
    // Three TTLs: without renewals every lease would be lost.
    tokio::time::sleep(Duration::from_millis(3_600)).await;
    for (guard, first) in guards.iter().zip(&first_stop_by) {
        assert!(guard.is_held(), "{guard:?}");
        assert!(guard.stop_by() > *first + Duration::from_millis(2_000));
    }
    assert_eq!(fake.single_renews.load(Ordering::SeqCst), 0);
    let sizes = fake.batch_sizes.lock().unwrap().clone();
    let items: usize = sizes.iter().sum();
    assert!(items >= 20 * 6, "{items} items renewed in {sizes:?}");
    assert!(
        sizes.len() * 4 <= items,
        "leases due together should share calls: {sizes:?}"
    );
    assert_eq!(client.stats().leases_lost, 0);
}

#[tokio::test]
async fn lost_fires_at_once_when_a_renewal_says_the_lease_is_not_held() {
    let (fake, addr) = start_fake().await;
    fake.script.lock().unwrap().renew_error = Some(ErrorDetail::new(
        Reason::LeaseNotHeld,
        "released by someone else",
    ));
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/taken", 3_000, 0).await.unwrap();
    let lost = guard.lost();
    let reason = tokio::time::timeout(Duration::from_millis(2_000), lost)
        .await
        .expect("lost within the first renewal");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(Instant::now() < guard.stop_by(), "well before the deadline");
    assert_eq!(
        *guard.subscribe().borrow(),
        LeaseStatus::Lost(LostReason::NotHeld)
    );
    // A lease the server says is not held is not released on drop.
    drop(guard);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(fake.releases.lock().unwrap().is_empty());
}

#[tokio::test]
async fn lost_fires_at_the_stop_by_deadline_when_renewals_keep_failing() {
    let (fake, addr) = start_fake().await;
    fake.script.lock().unwrap().renew_error = Some(ErrorDetail::new(Reason::NoQuorum, "minority"));
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/cut-off", 1_500, 0).await.unwrap();
    let stop_by = guard.stop_by();
    let (tx, rx) = tokio::sync::oneshot::channel();
    guard.on_lost(move |reason| {
        let _ = tx.send((reason, Instant::now()));
    });
    let reason = guard.lost().await;
    let at = Instant::now();
    assert_eq!(reason, LostReason::Unconfirmed);
    assert!(at >= stop_by, "not before the deadline");
    assert!(
        at <= stop_by + Duration::from_millis(100),
        "{:?} late",
        at - stop_by
    );
    let (callback_reason, callback_at) = rx.await.unwrap();
    assert_eq!(callback_reason, LostReason::Unconfirmed);
    assert!(callback_at <= stop_by + Duration::from_millis(100));
    // The renewer kept trying until then.
    assert!(fake.batch_sizes.lock().unwrap().len() >= 3);
    assert!(!guard.is_held());
    // The renewer's own pass marks it lost too, within milliseconds.
    tokio::time::timeout(
        Duration::from_millis(100),
        guard
            .subscribe()
            .wait_for(|s| *s == LeaseStatus::Lost(LostReason::Unconfirmed)),
    )
    .await
    .expect("the watch turns Lost")
    .unwrap();
    assert_eq!(client.stats().leases_lost, 1);
}

#[tokio::test]
async fn a_renewal_failure_that_recovers_in_time_keeps_the_lease() {
    let (fake, addr) = start_fake().await;
    fake.script.lock().unwrap().renew_error = Some(ErrorDetail::new(Reason::ServerBusy, "busy"));
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/flaky", 1_500, 0).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    fake.script.lock().unwrap().renew_error = None;
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(guard.is_held());
    assert!(client.stats().renew_failures > 0);
}

#[tokio::test]
async fn dropping_a_waiting_acquire_ends_its_call_on_the_server() {
    let (fake, addr) = start_fake().await;
    fake.script.lock().unwrap().acquire_hangs = true;
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.acquire("acme/queue", 5_000, 60_000).await }
    });
    wait_until(
        "the waiter to reach the node",
        Duration::from_secs(2),
        || fake.waiter_started.load(Ordering::SeqCst),
    )
    .await;
    assert!(!fake.waiter_dropped.load(Ordering::SeqCst));
    waiting.abort();
    wait_until(
        "the node to see the call go away",
        Duration::from_secs(2),
        || fake.waiter_dropped.load(Ordering::SeqCst),
    )
    .await;
}

#[tokio::test]
async fn a_waiting_acquire_is_not_cut_short_by_the_attempt_timeout() {
    let (fake, addr) = start_fake().await;
    // Longer than the attempt timeout (500 ms), shorter than the wait.
    fake.script.lock().unwrap().acquire_delay = Duration::from_millis(900);
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/queue", 5_000, 3_000).await.unwrap();
    assert_eq!(fake.acquires.lock().unwrap().len(), 1);
    assert!(!guard.deduplicated());
}

#[tokio::test]
async fn dropping_a_guard_releases_the_lease_in_the_background() {
    let (fake, addr) = start_fake().await;
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/dropped", 5_000, 0).await.unwrap();
    let lease_id = guard.lease_id().to_vec();
    let lost = guard.lost();
    drop(guard);
    assert_eq!(lost.await, LostReason::Released);
    wait_until("the release", Duration::from_secs(2), || {
        !fake.releases.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(fake.releases.lock().unwrap()[0].lease_id, lease_id);
    assert_eq!(client.held_leases(), 0);
}

#[tokio::test]
async fn renewals_stop_after_release() {
    let (fake, addr) = start_fake().await;
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let guard = client.acquire("acme/released", 1_200, 0).await.unwrap();
    assert!(guard.release().await.unwrap());
    let batches = fake.batch_sizes.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(fake.batch_sizes.lock().unwrap().len(), batches);
}

#[tokio::test]
async fn bad_configuration_and_endpoints_are_refused() {
    let err = Client::connect(vec![], ClientConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::InvalidEndpoint { .. }));
    let err = Client::connect(
        vec!["127.0.0.1:1".into()],
        ClientConfig {
            stop_by_margin_percent: 0,
            ..ClientConfig::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::InvalidConfig(_)));
    let client = Client::connect(vec!["127.0.0.1:1".into()], ClientConfig::default())
        .await
        .unwrap();
    let err = client
        .acquire("acme/x", 5_000, fencelock_client::MAX_WAIT_TIMEOUT_MS + 1)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)));
}

#[tokio::test]
async fn an_acquire_that_waited_long_is_renewed_before_it_is_returned() {
    let (fake, addr) = start_fake().await;
    // The grant takes half the TTL (as if it had waited in the queue): the
    // deadline counted from the send would leave little time.
    fake.script.lock().unwrap().acquire_delay = Duration::from_millis(600);
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    let before = Instant::now();
    let guard = client.acquire("acme/waited", 1_200, 5_000).await.unwrap();
    assert_eq!(fake.single_renews.load(Ordering::SeqCst), 1);
    // The fake renews for 30 s: the deadline now counts from the renewal.
    assert!(guard.stop_by() > before + Duration::from_secs(20));
    assert_eq!(guard.lease_ttl_ms(), 30_000);
}

#[tokio::test]
async fn a_wait_cancelled_by_the_server_starts_over_with_a_new_request_id() {
    let (fake, addr) = start_fake().await;
    // What a retry finds when the first attempt's connection dropped and the
    // server removed its waiter: nothing is held under the old id.
    fake.script.lock().unwrap().acquire_failures = VecDeque::from([
        Status::unavailable("connection reset"),
        ErrorDetail::new(Reason::WaitCancelled, "caller went away").to_status(),
    ]);
    let client = Client::connect(vec![addr], fast_config()).await.unwrap();
    client.acquire("acme/requeued", 5_000, 1_000).await.unwrap();
    let ids: Vec<Vec<u8>> = fake
        .acquires
        .lock()
        .unwrap()
        .iter()
        .map(|a| a.request_id.clone())
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[0], ids[1], "the retry keeps the id");
    assert_ne!(ids[1], ids[2], "the new acquire has a new id");

    // With an explicit id the caller asked about that one acquire: no
    // second id is made up.
    fake.script.lock().unwrap().acquire_failures =
        VecDeque::from([ErrorDetail::new(Reason::WaitCancelled, "caller went away").to_status()]);
    let err = client
        .acquire_with(
            "acme/requeued-2",
            AcquireOptions {
                lease_ttl_ms: 5_000,
                wait_timeout_ms: 1_000,
                request_id: Some(RequestId::from_bytes(b"mine".to_vec()).unwrap()),
                value: Vec::new(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.reason(), Some(Reason::WaitCancelled));
}
