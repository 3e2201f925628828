//! The Rust client library (`fencelock-client`) against a real in-process
//! three-node cluster: real RocksDB, real gRPC on loopback sockets. Each
//! test is one promise the library makes to its users.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use fencelock_api::v1::Reason;
use fencelock_client::{Client, ClientConfig, LeaseStatus, LockGuard, LostReason};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Quick retries: the in-process cluster elects in a few hundred ms.
fn test_config() -> ClientConfig {
    ClientConfig {
        call_timeout_ms: 15_000,
        attempt_timeout_ms: 1_000,
        connect_timeout_ms: 500,
        backoff_base_ms: 20,
        backoff_max_ms: 200,
        ..ClientConfig::default()
    }
}

fn endpoints(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes
        .keys()
        .map(|id| cluster.endpoint(*id))
        .collect()
}

async fn client_for(cluster: &Cluster) -> Client {
    Client::connect(endpoints(cluster), test_config())
        .await
        .unwrap()
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The node leading the shard of `resource`.
async fn leader_for(cluster: &Cluster, resource: &str) -> u64 {
    let shard = get(cluster, 1, resource).await.unwrap().shard_id;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(leader) = cluster.leader_of(shard) {
            return leader;
        }
        assert!(Instant::now() < deadline, "shard {shard} has no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn the_client_batch_limit_is_the_servers() {
    assert_eq!(
        fencelock_client::MAX_RENEW_BATCH,
        fencelock_statemachine::limits::MAX_RENEW_BATCH
    );
    assert_eq!(
        fencelock_client::MAX_REQUEST_ID_LEN,
        fencelock_statemachine::limits::MAX_REQUEST_ID_LEN
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_is_renewed_in_the_background_and_released_and_tokens_rise_across_holders() {
    let cluster = Cluster::start(3, |_| {}).await;
    let client = client_for(&cluster).await;
    let r = "acme/client/renewed";

    let first = client.acquire(r, 1_500, 0).await.unwrap();
    let first_expiry = first.expires_at_ms();
    let first_stop_by = first.stop_by();
    // Past two TTLs: only the background renewals keep it.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(first.is_held());
    assert!(first.stop_by() > first_stop_by + Duration::from_millis(1_500));
    assert!(first.expires_at_ms() > first_expiry + 1_500);
    let g = get(&cluster, 1, r).await.unwrap();
    assert!(g.held);
    assert_eq!(g.fencing_token, first.token());
    assert!(client.stats().renewed_items >= 4, "{:?}", client.stats());

    // Someone else waits; the release hands the lock over.
    let other = client_for(&cluster).await;
    let waiting = tokio::spawn(async move { other.acquire(r, 1_500, 10_000).await });
    wait_for(
        "the second acquirer to queue",
        Duration::from_secs(5),
        async || get(&cluster, 1, r).await.unwrap().queue_length == 1,
    )
    .await;
    let first_token = first.token();
    assert!(first.release().await.unwrap());
    let second = waiting.await.unwrap().unwrap();
    let second_token = second.token();
    assert!(
        second_token > first_token,
        "{second_token} <= {first_token}"
    );
    assert!(second.release().await.unwrap());
    assert!(!get(&cluster, 1, r).await.unwrap().held);

    // A third holder, after the resource was free, still gets a higher one.
    let third = client.acquire(r, 1_500, 0).await.unwrap();
    assert!(third.token() > second_token);
    third.release().await.unwrap();
}

/// A TCP proxy in front of one node that can lose the replies of one
/// connection: the requests reach the node, nothing comes back, then the
/// connection is cut.
struct LossyProxy {
    address: String,
    lose_next_reply: Arc<AtomicBool>,
    lost_chunks: Arc<AtomicU64>,
}

/// How long a connection that loses its replies stays open before it is
/// cut: longer than the node needs to commit the request.
const LOSS_WINDOW: Duration = Duration::from_millis(400);

impl LossyProxy {
    async fn start(upstream: String) -> LossyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let lose_next_reply = Arc::new(AtomicBool::new(false));
        let lost_chunks = Arc::new(AtomicU64::new(0));
        let (lose, lost) = (lose_next_reply.clone(), lost_chunks.clone());
        tokio::spawn(async move {
            loop {
                let Ok((downstream, _)) = listener.accept().await else {
                    return;
                };
                let Ok(upstream) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(Self::relay(
                    downstream,
                    upstream,
                    lose.clone(),
                    lost.clone(),
                ));
            }
        });
        LossyProxy {
            address,
            lose_next_reply,
            lost_chunks,
        }
    }

    async fn relay(
        downstream: TcpStream,
        upstream: TcpStream,
        lose: Arc<AtomicBool>,
        lost: Arc<AtomicU64>,
    ) {
        let (mut down_read, mut down_write) = downstream.into_split();
        let (mut up_read, mut up_write) = upstream.into_split();
        let requests = tokio::io::copy(&mut down_read, &mut up_write);
        let replies = async {
            let mut buf = vec![0u8; 64 * 1024];
            let mut losing_since: Option<Instant> = None;
            loop {
                let read = match losing_since {
                    Some(since) => {
                        let left = LOSS_WINDOW.saturating_sub(since.elapsed());
                        match tokio::time::timeout(left, up_read.read(&mut buf)).await {
                            Ok(read) => read,
                            Err(_) => return, // cut the connection
                        }
                    }
                    None => up_read.read(&mut buf).await,
                };
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if losing_since.is_none() && lose.swap(false, Ordering::SeqCst) {
                    losing_since = Some(Instant::now());
                }
                if losing_since.is_some() {
                    lost.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                if down_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = requests => {}
            () = replies => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_whose_reply_was_lost_is_retried_into_the_same_single_lease() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/client/lost-reply";
    let leader = leader_for(&cluster, r).await;
    let proxy = LossyProxy::start(cluster.configs[&leader].listen_addr.clone()).await;
    let client = Client::connect(vec![proxy.address.clone()], test_config())
        .await
        .unwrap();
    // Open the connection, then lose whatever the node sends back next:
    // the acquire's reply.
    client.get(r).await.unwrap();
    proxy.lose_next_reply.store(true, Ordering::SeqCst);

    let guard = client.acquire(r, 30_000, 0).await.unwrap();
    assert!(
        proxy.lost_chunks.load(Ordering::SeqCst) > 0,
        "no reply was lost"
    );
    // The retry (same request id) got the first attempt's grant back: a new
    // grant would have been refused with LOCK_HELD, since the first attempt
    // holds the resource.
    assert!(
        guard.deduplicated(),
        "the retry was not answered from dedup"
    );
    assert!(client.stats().retries > 0);
    let g = get(&cluster, 1, r).await.unwrap();
    assert!(g.held);
    assert_eq!(g.fencing_token, guard.token());
    assert_eq!(g.last_token, guard.token(), "exactly one grant");
    // Nobody else can have it.
    let other = client_for(&cluster).await;
    let err = other.acquire(r, 30_000, 0).await.unwrap_err();
    assert_eq!(err.reason(), Some(Reason::LockHeld), "{err:?}");
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_fires_by_the_stop_by_deadline_when_every_node_is_down() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    let client = client_for(&cluster).await;
    let guard = client
        .acquire("acme/client/cut-off", 2_000, 0)
        .await
        .unwrap();
    let mut status = guard.subscribe();
    let lost = guard.lost();
    let watcher = tokio::spawn(async move {
        let reason = lost.await;
        (reason, Instant::now(), wall_ms())
    });
    // Let a renewal through, so the deadline comes from a renewal.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(client.stats().renewed_items >= 1);
    for id in [1, 2, 3] {
        cluster.crash(id).await;
    }
    let (reason, lost_at, lost_at_wall_ms) = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("lost fires")
        .unwrap();
    assert_eq!(reason, LostReason::Unconfirmed);
    // The deadline of the last confirmed renewal, which lost is final for.
    let stop_by = guard.stop_by();
    assert!(lost_at >= stop_by);
    assert!(
        lost_at <= stop_by + Duration::from_millis(100),
        "{:?} late",
        lost_at - stop_by
    );
    // The application was told to stop before the servers could consider
    // the lease over (one machine, so the wall clocks agree).
    let server_expiry_ms = guard.expires_at_ms();
    assert!(
        lost_at_wall_ms < server_expiry_ms,
        "lost at {lost_at_wall_ms}, lease ended at {server_expiry_ms}"
    );
    // The watch says so too, within the keeper's pass.
    tokio::time::timeout(
        Duration::from_millis(200),
        status.wait_for(|s| matches!(s, LeaseStatus::Lost(_))),
    )
    .await
    .expect("the watch turns Lost")
    .unwrap();
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_fires_at_once_when_the_lease_is_released_from_under_the_holder() {
    let cluster = Cluster::start(3, |_| {}).await;
    let client = client_for(&cluster).await;
    let r = "acme/client/taken";
    let guard = client.acquire(r, 3_000, 0).await.unwrap();
    assert!(release(&cluster, 2, r, guard.lease_id()).await.unwrap());
    let released_at = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost fires");
    assert_eq!(reason, LostReason::NotHeld);
    // At the next renewal (about a third of the TTL), well before the
    // deadline.
    assert!(released_at.elapsed() < Duration::from_millis(1_500));
    assert!(Instant::now() < guard.stop_by());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_a_waiting_acquire_removes_the_waiter_from_the_queue() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/client/queue";
    let holder_client = client_for(&cluster).await;
    let holder = holder_client.acquire(r, 30_000, 0).await.unwrap();

    // The second acquirer waits, then gives up by dropping its future.
    let quitter = client_for(&cluster).await;
    let waiting = tokio::spawn(async move { quitter.acquire(r, 30_000, 60_000).await });
    wait_for("the waiter to queue", Duration::from_secs(5), async || {
        get(&cluster, 1, r).await.unwrap().queue_length == 1
    })
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    wait_for(
        "the waiter to leave the queue",
        Duration::from_secs(5),
        async || get(&cluster, 1, r).await.unwrap().queue_length == 0,
    )
    .await;

    // The third acquirer is next in line: it gets the lock as soon as the
    // holder lets go, not after a ghost waiter's turn.
    let third_client = client_for(&cluster).await;
    let third = tokio::spawn(async move { third_client.acquire(r, 30_000, 30_000).await });
    wait_for(
        "the third acquirer to queue",
        Duration::from_secs(5),
        async || get(&cluster, 1, r).await.unwrap().queue_length == 1,
    )
    .await;
    let holder_token = holder.token();
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let third: LockGuard = third.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < Duration::from_secs(1),
        "granted {:?} after the release",
        released_at.elapsed()
    );
    assert!(third.token() > holder_token);
    assert_eq!(get(&cluster, 1, r).await.unwrap().queue_length, 0);
    third.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_leases_of_one_client_are_renewed_in_shared_batches() {
    let cluster = Cluster::start(3, |_| {}).await;
    let client = client_for(&cluster).await;
    let acquires: Vec<_> = (0..30)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .acquire(&format!("acme/client/many-{i}"), 1_500, 0)
                    .await
            })
        })
        .collect();
    let mut guards = Vec::new();
    for acquire in acquires {
        guards.push(acquire.await.unwrap().unwrap());
    }
    assert_eq!(client.held_leases(), 30);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    for guard in &guards {
        assert!(guard.is_held(), "{guard:?}");
        let g = get(&cluster, 1, guard.resource()).await.unwrap();
        assert!(
            g.held && g.fencing_token == guard.token(),
            "{guard:?}: {g:?}"
        );
    }
    let stats = client.stats();
    assert!(stats.renewed_items >= 30 * 4, "{stats:?}");
    assert!(
        stats.renew_batch_calls * 3 <= stats.renewed_items,
        "renewals were not batched: {stats:?}"
    );
    assert_eq!(stats.leases_lost, 0);
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
    assert_eq!(client.held_leases(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_given_only_a_follower_reaches_the_leader() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/client/follower";
    let leader = leader_for(&cluster, r).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let client = Client::connect(vec![cluster.endpoint(follower)], test_config())
        .await
        .unwrap();
    let guard = client.acquire(r, 5_000, 0).await.unwrap();
    assert_eq!(client.get(r).await.unwrap().fencing_token, guard.token());
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_lease_survives_the_crash_of_its_shard_leader() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    let client = client_for(&cluster).await;
    let r = "acme/client/failover";
    let guard = client.acquire(r, 5_000, 0).await.unwrap();
    let leader = leader_for(&cluster, r).await;
    cluster.crash(leader).await;
    // Two TTLs: renewals must find the new leader to keep the lease.
    tokio::time::sleep(Duration::from_millis(10_000)).await;
    assert!(guard.is_held(), "{guard:?}, {:?}", client.stats());
    let survivor = (1..=3).find(|id| *id != leader).unwrap();
    let g = get(&cluster, survivor, r).await.unwrap();
    assert!(g.held);
    assert_eq!(g.fencing_token, guard.token());
    assert!(guard.release().await.unwrap());
}

/// The election helper: candidates lead one at a time in campaign order,
/// each publishing its address; `leader` and `observe` show who leads with
/// the token its writes carry; a resign hands over to the next candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn candidates_lead_one_at_a_time_and_observers_see_each_leader_with_its_token() {
    use fencelock_api::v1::WatchEventKind;
    let cluster = Cluster::start(3, |_| {}).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    let client = client_for(&cluster).await;
    let election = client.election("acme/election/db-primary");
    // Values wait for the cluster format (a round or two of the controller).
    cluster
        .wait_for_cluster_format(fencelock_placement::VALUES_FORMAT, Duration::from_secs(20))
        .await;
    let first = election
        .campaign("10.0.0.1:5432", 5_000)
        .await
        .expect("campaign");
    let leader = election.leader().await.unwrap().expect("someone leads");
    assert_eq!(leader.value, b"10.0.0.1:5432");
    assert_eq!(leader.fencing_token, first.token());

    let mut observed = election.observe(None).await.unwrap();
    let state = observed.message().await.unwrap().unwrap();
    assert_eq!(state.kind, WatchEventKind::State as i32);
    assert_eq!(state.fencing_token, first.token());

    // A second candidate waits in the queue until the first resigns.
    let second_election = election.clone();
    let second =
        tokio::spawn(async move { second_election.campaign("10.0.0.2:5432", 5_000).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!second.is_finished(), "the second candidate waits");
    assert!(first.release().await.unwrap(), "the first resigns");
    let second = second.await.unwrap().expect("the second leads");
    assert!(second.token() > leader.fencing_token);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), observed.message())
            .await
            .expect("an event")
            .unwrap()
            .unwrap();
        seen.push((event.kind, event.fencing_token, event.value));
    }
    assert_eq!(seen[0].0, WatchEventKind::Released as i32);
    assert_eq!(seen[0].1, leader.fencing_token);
    assert_eq!(
        seen[1],
        (
            WatchEventKind::Granted as i32,
            second.token(),
            b"10.0.0.2:5432".to_vec()
        )
    );
    let now = election.leader().await.unwrap().unwrap();
    assert_eq!(now.value, b"10.0.0.2:5432");
    // Proclaim: a new address, the same term.
    assert_eq!(
        second.proclaim(b"10.0.0.2:6432").await.unwrap(),
        second.token()
    );
    assert_eq!(
        election.leader().await.unwrap().unwrap().value,
        b"10.0.0.2:6432"
    );
    assert!(second.release().await.unwrap());
    assert_eq!(election.leader().await.unwrap(), None);
}
