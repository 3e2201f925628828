//! Sharding under load: slots, replicas and leaders move while clients take
//! and release locks, and the recorded history is checked for the lock
//! invariants. In-process nodes (real RocksDB, gRPC, transport).

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use fencelock_api::v1::{
    reshard_request, AddNodeRequest, BalanceRequest, DrainNodeRequest, ErrorDetail,
    ListShardsRequest, MoveReplicaRequest, MoveSlots, Reason, ReleaseRequest, ReshardRequest,
    RetryPolicy, SlotRange, SplitShard, TransferLeaderRequest,
};
use fencelock_statemachine::{slot_of, Command, LeaseId, LockError, RequestId, ResourceName};

fn res(name: &str) -> ResourceName {
    ResourceName::parse(name).unwrap()
}

/// One finished lock operation, as the client saw it.
#[derive(Clone, Debug)]
struct Grant {
    resource: String,
    token: i64,
    lease_id: Vec<u8>,
    /// When the acquire was first sent and when its grant was acknowledged.
    invoked: Instant,
    acked: Instant,
    /// When the release was first sent, and whether it released the lease
    /// (false: the lease was gone — lost).
    release_invoked: Option<Instant>,
    released: Option<bool>,
}

#[derive(Default)]
struct History {
    grants: Vec<Grant>,
    /// Errors a client gave up on (the reason), which the brief allows only
    /// if retriable.
    failures: Vec<ErrorDetail>,
    conflicts: u64,
}

/// Retries a call on any node while the error says to retry, up to `within`.
async fn retrying<T, F, Fut>(
    endpoints: &[String],
    start: usize,
    within: Duration,
    mut call: F,
) -> Result<T, ErrorDetail>
where
    F: FnMut(
        fencelock_api::v1::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    ) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let first = &endpoints[start % endpoints.len()];
    call_endpoints(first, endpoints, within, &mut call).await
}

fn is_retriable(d: &ErrorDetail) -> bool {
    d.retry != RetryPolicy::Never as i32
}

/// One client: acquire a random resource (same request id on every retry),
/// hold it briefly, release it. Records everything.
async fn client_loop(
    id: usize,
    endpoints: Vec<String>,
    resources: Vec<String>,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let resource = resources[(id * 7919 + n as usize * 104_729) % resources.len()].clone();
        let request_id = format!("c{id}-{n}");
        let req = acquire_req(&resource, &request_id, 30_000, 0);
        let invoked = Instant::now();
        let result = retrying(
            &endpoints,
            id + n as usize,
            Duration::from_secs(30),
            |mut c| {
                let req = req.clone();
                async move { c.acquire(req).await.map(|r| r.into_inner()) }
            },
        )
        .await;
        let granted = match result {
            Ok(a) => a,
            Err(d) if d.reason() == Reason::LockHeld => {
                history.lock().unwrap().conflicts += 1;
                continue;
            }
            Err(d) => {
                history.lock().unwrap().failures.push(d);
                continue;
            }
        };
        let acked = Instant::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let release = ReleaseRequest {
            resource: resource.clone(),
            lease_id: granted.lease_id.clone(),
        };
        let release_invoked = Instant::now();
        let released = retrying(&endpoints, id, Duration::from_secs(30), |mut c| {
            let release = release.clone();
            async move { c.release(release).await.map(|r| r.into_inner().released) }
        })
        .await;
        let mut h = history.lock().unwrap();
        let released = match released {
            Ok(r) => Some(r),
            Err(d) => {
                h.failures.push(d);
                None
            }
        };
        h.grants.push(Grant {
            resource,
            token: granted.fencing_token,
            lease_id: granted.lease_id,
            invoked,
            acked,
            release_invoked: Some(release_invoked),
            released,
        });
    }
}

/// (a) no two holders overlap, (b) tokens strictly increase in real-time
/// order, (c) no acknowledged lease was lost, (d) only retriable errors.
fn check_history(h: &History) {
    let mut by_resource: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in &h.grants {
        by_resource.entry(&g.resource).or_default().push(g);
    }
    for (resource, mut grants) in by_resource {
        grants.sort_by_key(|g| g.token);
        for w in grants.windows(2) {
            let (a, b) = (w[0], w[1]);
            assert!(
                a.token < b.token,
                "{resource}: token {} granted twice",
                a.token
            );
            // (a) b was granted after a released: b's grant cannot have been
            // acknowledged before a even started to release.
            if a.released == Some(true) {
                let released_at = a.release_invoked.unwrap();
                assert!(
                    b.acked >= released_at,
                    "{resource}: token {} acknowledged while token {} was still held",
                    b.token,
                    a.token
                );
            }
        }
        // (b) real-time order implies token order.
        for a in &grants {
            for b in &grants {
                if a.acked < b.invoked {
                    assert!(
                        a.token < b.token,
                        "{resource}: token {} after {} in real time",
                        b.token,
                        a.token
                    );
                }
            }
        }
    }
    // (c) every lease we were granted was still ours when we released it.
    for g in &h.grants {
        assert_ne!(
            g.released,
            Some(false),
            "lease {} on {} was lost",
            hex::encode(&g.lease_id),
            g.resource
        );
    }
    // (d) clients saw at most retriable errors.
    for d in &h.failures {
        assert!(is_retriable(d), "a client saw a final error: {d:?}");
    }
}

fn slots(ranges: &[(u32, u32)]) -> Vec<SlotRange> {
    ranges
        .iter()
        .map(|&(start, end)| SlotRange { start, end })
        .collect()
}

async fn shard_list(cluster: &Cluster, node: u64) -> fencelock_api::v1::ListShardsResponse {
    cluster
        .admin(node)
        .await
        .list_shards(ListShardsRequest { shard_ids: vec![] })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_lists_the_bootstrap_placement() {
    let cluster = Cluster::start(3, |_| {}).await;
    let list = shard_list(&cluster, 2).await;
    assert_eq!(list.slot_count, 1024);
    let ids: Vec<u64> = list.shards.iter().map(|s| s.shard_id).collect();
    assert_eq!(
        ids,
        vec![0, 1, 2, 3, 4],
        "the meta shard and four data shards"
    );
    let mut covered = 0;
    for s in &list.shards {
        assert_eq!(s.replicas.len(), 3, "shard {} replicas", s.shard_id);
        assert_ne!(s.leader_node_id, 0, "shard {} has a leader", s.shard_id);
        if s.shard_id > 0 {
            assert_eq!(s.epoch, s.shard_id, "bootstrap epoch of shard n is n");
            covered += s
                .slot_ranges
                .iter()
                .map(|r| r.end - r.start + 1)
                .sum::<u32>();
        } else {
            assert!(s.slot_ranges.is_empty(), "the meta shard owns no slots");
            assert_eq!(s.epoch, 0, "the meta shard mints no tokens");
        }
    }
    assert_eq!(covered, 1024, "every slot has exactly one shard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_route_after_a_migration_is_refused_then_served_by_the_new_owner_once() {
    let cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/stale-route";
    let slot = slot_of(&res(r));
    let first = acquire(&cluster, 1, acquire_req(r, "x", 60_000, 0))
        .await
        .unwrap();
    let from = first.shard_id;
    let to = if from == 1 { 2 } else { 1 };
    let moved = cluster
        .admin(3)
        .await
        .reshard(ReshardRequest {
            action: Some(reshard_request::Action::MoveSlots(MoveSlots {
                from_shard_id: from,
                to_shard_id: to,
                slots: slots(&[(slot, slot)]),
            })),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.resources_moved, 1);
    assert!(
        moved.epoch > 4,
        "the target took a fresh epoch: {}",
        moved.epoch
    );

    // A stale route: the old shard's leader is asked directly. It refuses;
    // nothing is applied there.
    let old_leader = cluster.leader_of(from).unwrap();
    let stale = cluster.nodes[&old_leader]
        .propose_to_shard(
            from,
            Command::Acquire {
                owner: fencelock_statemachine::Owner::anonymous(),
                resource: res(r),
                request_id: RequestId::new(b"y".to_vec()).unwrap(),
                lease_id: LeaseId([9; 16]),
                lease_ttl_ms: 60_000,
                wait_timeout_ms: 0,
                value: fencelock_statemachine::HolderValue::none(),
                mode: fencelock_statemachine::AcquireMode::Exclusive,
            },
        )
        .await;
    match stale {
        Err(fencelock_server::errors::ServerError::Lock(LockError::WrongShard {
            slot: s, ..
        })) => {
            assert_eq!(s, slot)
        }
        other => panic!("the old shard answered {other:?}"),
    }
    let detail =
        fencelock_server::errors::ServerError::Lock(LockError::WrongShard { slot, epoch: from })
            .to_detail();
    assert_eq!(detail.reason(), Reason::EpochNotMatch);

    // The retry of the original acquire (same request id) finds the same
    // lease at the new owner: applied once.
    let again = acquire(&cluster, 2, acquire_req(r, "x", 60_000, 0))
        .await
        .unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.lease_id, first.lease_id);
    assert_eq!(again.fencing_token, first.fencing_token);
    assert_eq!(again.shard_id, to);
    // The lock is still held: nobody else gets it.
    let other = acquire(&cluster, 3, acquire_req(r, "z", 60_000, 0)).await;
    assert_eq!(other.unwrap_err().reason(), Reason::LockHeld);
    // The next holder's token is from the new, higher epoch.
    assert!(release(&cluster, 1, r, &first.lease_id).await.unwrap());
    let next = acquire(&cluster, 1, acquire_req(r, "w", 60_000, 0))
        .await
        .unwrap();
    assert!(next.fencing_token > first.fencing_token);
    assert_eq!(next.epoch, moved.epoch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_stay_safe_while_slots_replicas_and_leaders_move() {
    let mut cluster = Cluster::start(3, |_| {}).await;
    // A fourth node that joins the running cluster.
    let addr4 = cluster.start_joining(4, |_| {}).await;

    let endpoints: Vec<String> = (1..=3).map(|id| cluster.endpoint(id)).collect();
    let resources: Vec<String> = (0..48).map(|i| format!("acme/sharded-{i}")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::default()));
    let clients: Vec<_> = (0..6)
        .map(|id| {
            tokio::spawn(client_loop(
                id,
                endpoints.clone(),
                resources.clone(),
                stop.clone(),
                history.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut admin = cluster.admin(1).await;

    // Move a quarter of shard 1's slots to shard 2 (slots 0, 4, 8, ... are
    // shard 1's at bootstrap).
    let moving: Vec<SlotRange> = (0..64u32)
        .map(|i| SlotRange {
            start: i * 4,
            end: i * 4,
        })
        .collect();
    let moved = admin
        .reshard(ReshardRequest {
            action: Some(reshard_request::Action::MoveSlots(MoveSlots {
                from_shard_id: 1,
                to_shard_id: 2,
                slots: moving,
            })),
        })
        .await
        .expect("move slots")
        .into_inner();
    assert!(moved.epoch > 4);

    // Split shard 3.
    let split = admin
        .reshard(ReshardRequest {
            action: Some(reshard_request::Action::SplitShard(SplitShard {
                shard_id: 3,
                split_at_slot: 0,
            })),
        })
        .await
        .expect("split")
        .into_inner();
    assert_eq!(split.new_shard_id, 5);

    // Leadership churn.
    let leader = cluster.leader_of(2).unwrap();
    let to = (1..=3).find(|n| *n != leader).unwrap();
    admin
        .transfer_leader(TransferLeaderRequest {
            shard_id: 2,
            to_node_id: to,
        })
        .await
        .expect("transfer leader");

    // Add node 4 and move a replica of shard 1 onto it.
    admin
        .add_node(AddNodeRequest {
            address: addr4.clone(),
            node_id: 4,
        })
        .await
        .expect("add node");
    admin
        .move_replica(MoveReplicaRequest {
            shard_id: 1,
            from_node_id: 1,
            to_node_id: 4,
        })
        .await
        .expect("move replica");

    // Drain node 2 (its replicas go to nodes 1, 3 and 4), then balance.
    let drained = admin
        .drain_node(DrainNodeRequest { node_id: 2 })
        .await
        .expect("drain")
        .into_inner();
    assert!(drained.replicas_moved > 0);
    // Node 2 deleted each replica when the drain removed it (status is
    // published once per Raft tick).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.nodes[&2].shard_status().is_empty() {
        assert!(
            Instant::now() < deadline,
            "drained node 2 still holds {:?}",
            cluster.nodes[&2]
                .shard_status()
                .iter()
                .map(|s| s.shard_id)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A self-routing client whose map still names drained node 2 is told to
    // retry with a fresher route, not that the shard does not exist
    // (SHARD_NOT_FOUND is retry NEVER: a client would give up mid-drain).
    let mut request = tonic::Request::new(acquire_req("acme/after-drain", "ad-1", 60_000, 0));
    request.metadata_mut().insert(
        fencelock_server::service::FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let refused = cluster
        .client(2)
        .await
        .acquire(request)
        .await
        .expect_err("node 2 has no replica left");
    let detail = ErrorDetail::from_status(&refused).expect("typed refusal");
    assert_eq!(detail.reason(), Reason::EpochNotMatch, "{refused:?}");
    assert!(is_retriable(&detail), "{detail:?}");
    assert!(detail.map_version > 0, "{detail:?}");
    admin.balance(BalanceRequest {}).await.expect("balance");

    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    {
        let h = history.lock().unwrap();
        assert!(
            h.grants.len() > 50,
            "too little load: {} grants",
            h.grants.len()
        );
        check_history(&h);
    }

    // The placement the admin API reports matches the moves.
    let list = shard_list(&cluster, 3).await;
    for s in &list.shards {
        assert!(
            s.replicas.iter().all(|r| r.node_id != 2),
            "shard {} still on drained node 2",
            s.shard_id
        );
        assert_eq!(s.replicas.len(), 3, "shard {} keeps 3 replicas", s.shard_id);
    }
}

/// Issue 17, item 5: a migration whose orchestrator died after the export
/// (the slots then refuse every request) is finished by the meta shard's
/// leader on its own — here a new one, after the old leader's node went
/// away and came back — without any operator command.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_meta_leader_finishes_a_migration_left_open_by_itself() {
    use fencelock_placement::{PlacementCommand, PlacementMap};
    use fencelock_server::internal::node_control_client::NodeControlClient;
    use fencelock_server::internal::ProposeMetaRequest;

    let mut cluster = Cluster::start(3, |_| {}).await;
    let r = "acme/left-open";
    let slot = slot_of(&res(r));
    let held = acquire(&cluster, 1, acquire_req(r, "x", 120_000, 0))
        .await
        .unwrap();
    let from = held.shard_id;
    let to = if from == 1 { 2 } else { 1 };
    // An orchestrator records the migration and exports, then dies.
    let meta_leader = cluster.leader_of(0).unwrap();
    let mut control = NodeControlClient::connect(cluster.endpoint(meta_leader))
        .await
        .unwrap();
    let begun = control
        .propose_meta(ProposeMetaRequest {
            command: PlacementCommand::BeginMigration {
                from_shard: from,
                to_shard: to,
                slots: vec![slot],
            }
            .encode(),
        })
        .await
        .unwrap()
        .into_inner();
    let deadline = Instant::now() + Duration::from_secs(10);
    let source_leader = loop {
        if let Some(leader) = cluster.leader_of(from) {
            break leader;
        }
        assert!(Instant::now() < deadline, "shard {from} has no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let exported = cluster.nodes[&source_leader]
        .propose_to_shard(
            from,
            Command::ExportSlots {
                migration_id: begun.migration_id,
                slots: [slot].into_iter().collect(),
            },
        )
        .await;
    assert!(
        matches!(exported, Ok(fencelock_statemachine::Reply::Exported { .. })),
        "{exported:?}"
    );
    // The meta leader's node goes away and comes back: a new meta leader
    // (or the same one, re-elected) takes over with the migration open.
    cluster.crash(meta_leader).await;
    cluster.restart(meta_leader).await;
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let shards = cluster
            .admin(1 + meta_leader % 3)
            .await
            .list_shards(ListShardsRequest::default())
            .await
            .map(|r| r.into_inner());
        if let Ok(s) = shards {
            if s.migration_id == 0 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "migration {} still open after 45 s",
            begun.migration_id
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Committed: the map routes the slot to the target, which holds the
    // lease; nothing else is needed.
    let routed: std::sync::Arc<PlacementMap> = (cluster.nodes.values())
        .filter_map(|n| n.router().map())
        .max_by_key(|m| m.version())
        .unwrap();
    assert_eq!(routed.shard_of_slot(slot), to);
    let renewed = renew(&cluster, 1, r, &held.lease_id).await;
    assert!(renewed.is_ok(), "{renewed:?}");
}
