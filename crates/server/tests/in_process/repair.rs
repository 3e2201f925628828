//! The controller acting by itself: a node that stays unreachable for
//! `controller.node_down_after_ms` has its replicas replaced on live nodes
//! by the meta shard's leader, with no operator action; with repair off or
//! the scheduler paused, nothing moves; with `controller.balance`, an added
//! node fills up and the cluster settles.

use crate::common;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;

const DOWN_AFTER_MS: u64 = 2_000;
const DATA_SHARDS: u32 = 8;

/// Voters of every shard as its leader reports them (shards without a
/// leader among the running nodes are absent).
fn voters(cluster: &Cluster) -> BTreeMap<u64, BTreeSet<u64>> {
    let mut out = BTreeMap::new();
    for node in cluster.nodes.values() {
        for s in node.shard_status() {
            if s.is_leader {
                out.insert(s.shard_id, s.voters.iter().copied().collect());
            }
        }
    }
    out
}

/// The node holding the most replicas that does not lead the meta shard
/// (so the controller that repairs is not the one that dies; a dying meta
/// leader is the chaos tests' business).
fn victim(cluster: &Cluster) -> u64 {
    let meta_leader = cluster.leader_of(fencelock_placement::META_SHARD_ID);
    let all = voters(cluster);
    (1..=5u64)
        .filter(|n| Some(*n) != meta_leader)
        .max_by_key(|n| (all.values().filter(|v| v.contains(n)).count(), *n))
        .expect("a node")
}

async fn five_nodes(repair: bool) -> Cluster {
    Cluster::start(5, |c| {
        c.shard_count = DATA_SHARDS;
        c.controller.repair = repair;
        c.controller.node_down_after_ms = DOWN_AFTER_MS;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_nodes_replicas_are_replaced_on_live_nodes_without_an_operator() {
    let mut cluster = five_nodes(true).await;
    let before = voters(&cluster);
    assert_eq!(before.len(), DATA_SHARDS as usize + 1);
    let dead = victim(&cluster);
    let held = before.values().filter(|v| v.contains(&dead)).count();
    assert!(held > 0, "node {dead} holds no replica: {before:?}");
    let lock = acquire(&cluster, 1, acquire_req("acme/repair", "r1", 600_000, 0))
        .await
        .expect("granted");
    cluster.crash(dead).await;

    // Down after DOWN_AFTER_MS, then one move after another.
    wait_repaired(&cluster, dead, before.len()).await;
    // The shards kept their data and their tokens.
    let live = *cluster.nodes.keys().next().unwrap();
    let read = get(&cluster, live, "acme/repair").await.expect("read");
    assert!(read.held);
    assert_eq!(read.fencing_token, lock.fencing_token);
    let next = acquire(
        &cluster,
        live,
        acquire_req("acme/after-repair", "r2", 60_000, 0),
    )
    .await
    .expect("the repaired cluster serves");
    assert!(next.fencing_token > 0);

    // The map says DOWN, so a new meta leader resumes from it; the dry run
    // shows nothing left to do.
    let node = node_entry(&cluster, live, dead).await;
    assert!(node.marked_down, "{node:?}");
    assert_eq!(node.state, fencelock_api::v1::NodeState::Down as i32);
    // (The last move records its replica set in the map just after its
    // voters changed.)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let plan = plan(&cluster, live).await;
        assert_eq!(plan.down, vec![dead]);
        if plan.work == "nothing" {
            break;
        }
        assert!(Instant::now() < deadline, "still planned: {plan:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The replaced node comes back: it is not let back in as the voter it
    // was, and the shards keep serving. Holding nothing, it is UP again.
    let repaired = voters(&cluster);
    cluster.restart(dead).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let node = node_entry(&cluster, live, dead).await;
        if !node.marked_down && node.state == fencelock_api::v1::NodeState::Up as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "never UP again: {node:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    assert_eq!(voters(&cluster), repaired, "the old voter is not back");
    let again = acquire(
        &cluster,
        dead,
        acquire_req("acme/after-return", "r3", 60_000, 0),
    )
    .await
    .expect("served through the returned node");
    assert!(again.fencing_token > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_repair_off_a_dead_nodes_replicas_stay_where_they_are() {
    let mut cluster = five_nodes(false).await;
    let before = voters(&cluster);
    let dead = victim(&cluster);
    cluster.crash(dead).await;
    tokio::time::sleep(Duration::from_millis(DOWN_AFTER_MS + 4_000)).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    assert_eq!(voters(&cluster), before, "nothing moved");
}

async fn scheduler(
    cluster: &Cluster,
    node: u64,
    action: fencelock_api::v1::scheduler_request::Action,
) -> bool {
    let response = cluster
        .admin(node)
        .await
        .scheduler(fencelock_api::v1::SchedulerRequest {
            action: action as i32,
        })
        .await
        .expect("scheduler call");
    response.into_inner().paused
}

/// `node_id` as `admin nodes` lists it, asked of node `asker`.
async fn node_entry(cluster: &Cluster, asker: u64, node_id: u64) -> fencelock_api::v1::Node {
    let nodes = cluster
        .admin(asker)
        .await
        .list_nodes(fencelock_api::v1::ListNodesRequest::default())
        .await
        .expect("list nodes")
        .into_inner()
        .nodes;
    nodes
        .into_iter()
        .find(|n| n.node_id == node_id)
        .expect("a member")
}

/// The controller's dry run (`admin scheduler plan`), asked of `node`.
async fn plan(cluster: &Cluster, node: u64) -> fencelock_api::v1::SchedulerResponse {
    let action = fencelock_api::v1::scheduler_request::Action::Plan;
    cluster
        .admin(node)
        .await
        .scheduler(fencelock_api::v1::SchedulerRequest {
            action: action as i32,
        })
        .await
        .expect("scheduler plan")
        .into_inner()
}

/// Waits until no shard has a voter on `dead` and every shard has three,
/// for at most the bound: `node_down_after_ms` + 60 s.
async fn wait_repaired(cluster: &Cluster, dead: u64, shards: usize) {
    let within = Duration::from_millis(DOWN_AFTER_MS) + Duration::from_secs(60);
    let deadline = Instant::now() + within;
    loop {
        let now = voters(cluster);
        if now.len() == shards && now.values().all(|v| v.len() == 3 && !v.contains(&dead)) {
            return;
        }
        assert!(Instant::now() < deadline, "not repaired: {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_controller_moves_nothing_and_a_resumed_one_repairs() {
    use fencelock_api::v1::scheduler_request::Action;
    let mut cluster = five_nodes(true).await;
    let before = voters(&cluster);
    let dead = victim(&cluster);
    let asker = (1..=5).find(|n| *n != dead).unwrap();
    assert!(!scheduler(&cluster, asker, Action::Status).await);
    assert!(scheduler(&cluster, asker, Action::Pause).await);
    // The flag is in the map, not in the leader's memory: a new meta
    // leader obeys it too.
    let meta = fencelock_placement::META_SHARD_ID;
    let old_meta = cluster.leader_of(meta).expect("a meta leader");
    let meta_voters = voters(&cluster)[&meta].clone();
    if let Some(&to) = meta_voters.iter().find(|n| **n != old_meta && **n != dead) {
        cluster
            .admin(asker)
            .await
            .transfer_leader(fencelock_api::v1::TransferLeaderRequest {
                shard_id: meta,
                to_node_id: to,
            })
            .await
            .expect("meta leadership moves");
        // Status is published once per Raft tick.
        let deadline = Instant::now() + Duration::from_secs(5);
        while cluster.leader_of(meta) != Some(to) {
            assert!(
                Instant::now() < deadline,
                "node {to} never led the meta shard"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    cluster.crash(dead).await;
    tokio::time::sleep(Duration::from_millis(DOWN_AFTER_MS + 4_000)).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    assert_eq!(voters(&cluster), before, "paused: nothing moved");
    // Not even marked down: the dry run sees it unreachable, nothing else.
    assert!(!node_entry(&cluster, asker, dead).await.marked_down);
    let dry = plan(&cluster, asker).await;
    assert!(dry.paused);
    assert_eq!(dry.unreachable, vec![dead]);
    assert_eq!(dry.work, "nothing");
    // Any node answers with the replicated flag.
    let other = (1..=5).rev().find(|n| *n != dead).unwrap();
    assert!(scheduler(&cluster, other, Action::Status).await);

    assert!(!scheduler(&cluster, asker, Action::Resume).await);
    wait_repaired(&cluster, dead, before.len()).await;
}

/// Replicas and leaderships per node, from the shards' leaders.
fn loads(cluster: &Cluster) -> (BTreeMap<u64, usize>, BTreeMap<u64, usize>) {
    let mut replicas: BTreeMap<u64, usize> = cluster.nodes.keys().map(|n| (*n, 0)).collect();
    let mut leaders = replicas.clone();
    for (id, node) in &cluster.nodes {
        for s in node.shard_status() {
            if s.is_leader {
                *leaders.entry(*id).or_default() += 1;
                for v in &s.voters {
                    *replicas.entry(*v).or_default() += 1;
                }
            }
        }
    }
    (replicas, leaders)
}

fn spread(counts: &BTreeMap<u64, usize>) -> usize {
    counts.values().max().unwrap_or(&0) - counts.values().min().unwrap_or(&0)
}

async fn map_version(cluster: &Cluster, node: u64) -> u64 {
    cluster
        .admin(node)
        .await
        .list_nodes(fencelock_api::v1::ListNodesRequest::default())
        .await
        .expect("list nodes")
        .into_inner()
        .map_version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_added_node_fills_up_by_itself_and_the_cluster_settles() {
    let mut cluster = Cluster::start(3, |c| {
        c.shard_count = DATA_SHARDS;
        c.controller.balance = true;
    })
    .await;
    // A fourth node that joins the running cluster, added by an operator
    // while the scheduler is paused: the dry run shows the moves to it, and
    // nothing moves until the resume.
    use fencelock_api::v1::scheduler_request::Action;
    assert!(scheduler(&cluster, 1, Action::Pause).await);
    let addr4 = cluster
        .start_joining(4, |c| c.controller.balance = true)
        .await;
    cluster
        .admin(1)
        .await
        .add_node(fencelock_api::v1::AddNodeRequest {
            address: addr4,
            node_id: 4,
        })
        .await
        .expect("add node");
    let dry = plan(&cluster, 2).await;
    assert_eq!(dry.work, "balance", "{dry:?}");
    assert!(!dry.steps.is_empty());
    assert!(
        dry.steps.iter().all(|s| s.ends_with("to node 4")),
        "{:?}",
        dry.steps
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(loads(&cluster).0[&4], 0, "a dry run moves nothing");
    assert!(!scheduler(&cluster, 1, Action::Resume).await);

    // Replicas and leaderships move to node 4 with no `admin balance`.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (replicas, leaders) = loads(&cluster);
        if spread(&replicas) <= 1 && leaders[&4] > 0 && replicas[&4] > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not balanced: replicas {replicas:?}, leaders {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And then it settles: no further move for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = map_version(&cluster, 1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(map_version(&cluster, 1).await, settled, "still moving");
    let (replicas, _) = loads(&cluster);
    assert!(spread(&replicas) <= 1, "{replicas:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_over_the_lock_threshold_splits_by_itself_and_tokens_keep_rising() {
    const THRESHOLD: u64 = 20;
    let cluster = Cluster::start(3, |c| {
        c.shard_count = 1;
        c.controller.split_above_locks = THRESHOLD;
    })
    .await;
    // Thirty locks, all in the one data shard.
    let mut held = Vec::new();
    for i in 0..30 {
        let resource = format!("acme/hot-range-{i}");
        let grant = acquire(
            &cluster,
            1,
            acquire_req(&resource, &format!("s{i}"), 600_000, 0),
        )
        .await
        .expect("granted");
        assert_eq!(grant.shard_id, 1);
        held.push((resource, grant));
    }
    // The controller splits shard 1 once (each half holds under the
    // threshold afterwards); every lock is still held, with its token.
    let deadline = Instant::now() + Duration::from_secs(60);
    let moved = loop {
        let mut moved = Vec::new();
        for (resource, grant) in &held {
            if let Ok(read) = get(&cluster, 2, resource).await {
                assert!(read.held, "{resource} lost");
                assert_eq!(read.fencing_token, grant.fencing_token, "{resource}");
                if read.shard_id != 1 {
                    moved.push((resource.clone(), grant.clone(), read.shard_id));
                }
            }
        }
        if !moved.is_empty() {
            break moved;
        }
        assert!(Instant::now() < deadline, "shard 1 was not split");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(moved.iter().all(|(_, _, shard)| *shard == 2), "{moved:?}");
    // A moved resource's next grant gets a higher token than any before.
    let (resource, grant, _) = &moved[0];
    assert!(release(&cluster, 1, resource, &grant.lease_id)
        .await
        .expect("released"));
    let again = acquire(&cluster, 1, acquire_req(resource, "again", 60_000, 0))
        .await
        .expect("granted again");
    let highest = held.iter().map(|(_, g)| g.fencing_token).max().unwrap();
    assert!(
        again.fencing_token > highest,
        "{} <= {highest}",
        again.fencing_token
    );
    // And it settles: one split only (the halves are under the threshold).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let shards = cluster
        .admin(1)
        .await
        .list_shards(fencelock_api::v1::ListShardsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .shards;
    assert_eq!(shards.len(), 3, "meta + two data shards: {shards:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_leading_two_busy_shards_hands_one_off_by_itself() {
    let cluster = Cluster::start(3, |c| {
        c.shard_count = 6;
        c.controller.balance = true;
    })
    .await;
    // Once leaderships have settled (the count balance is done) and stayed
    // so for longer than a rate window without load, two data shards led
    // by one node (six over three nodes: some node leads two).
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    let leaders_now = || (0..=6u64).map(|s| cluster.leader_of(s)).collect::<Vec<_>>();
    let mut last = leaders_now();
    let mut stable_since = Instant::now();
    let window = Duration::from_millis(fencelock_controller::rates::RATE_WINDOW_MS);
    while stable_since.elapsed() < window + Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = leaders_now();
        if now != last || now.contains(&None) {
            last = now;
            stable_since = Instant::now();
        }
    }
    let mut led: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for shard in 1..=6u64 {
        if let Some(leader) = cluster.leader_of(shard) {
            led.entry(leader).or_default().push(shard);
        }
    }
    let (&busy, shards) = led
        .iter()
        .find(|(_, s)| s.len() >= 2)
        .expect("a node leading two data shards");
    let hot = [shards[0], shards[1]];
    // Resource names in each hot shard, found by asking.
    let mut names: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for i in 0.. {
        if hot
            .iter()
            .all(|s| names.get(s).is_some_and(|n| n.len() >= 4))
        {
            break;
        }
        let resource = format!("acme/busy-{i}");
        let grant = acquire(
            &cluster,
            1,
            acquire_req(&resource, &format!("find-{i}"), 5_000, 0),
        )
        .await
        .expect("granted");
        release(&cluster, 1, &resource, &grant.lease_id)
            .await
            .expect("released");
        if hot.contains(&grant.shard_id) {
            names.entry(grant.shard_id).or_default().push(resource);
        }
    }
    // Acquire-release loops on both: the busy node leads all the writes.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (k, resource) in names.values().flatten().cloned().enumerate() {
        let mut client = cluster.client(1 + (k as u64 % 3)).await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let req = acquire_req(&resource, &format!("{resource}-{n}"), 5_000, 0);
                if let Ok(grant) = client.acquire(req).await {
                    let release = fencelock_api::v1::ReleaseRequest {
                        resource: resource.clone(),
                        lease_id: grant.into_inner().lease_id,
                    };
                    let _ = client.release(release).await;
                }
            }
        }));
    }
    // The controller measures write rates over 5 s windows, then moves one
    // of the two leaderships to another replica.
    let deadline = Instant::now() + Duration::from_secs(45);
    let moved = loop {
        let leaders = hot.map(|s| cluster.leader_of(s));
        if leaders.iter().any(|l| l.is_some_and(|l| l != busy)) {
            break leaders;
        }
        assert!(
            Instant::now() < deadline,
            "node {busy} still leads both {hot:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    assert!(
        moved.contains(&Some(busy)),
        "one hot shard moved, the other stayed: {moved:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_node_that_returns_is_refilled_from_its_stale_copies_and_every_shard_serves() {
    let mut cluster = Cluster::start(5, |c| {
        c.shard_count = DATA_SHARDS;
        c.controller.node_down_after_ms = DOWN_AFTER_MS;
        c.controller.balance = true;
    })
    .await;
    let before = voters(&cluster);
    let dead = victim(&cluster);
    let live = (1..=5).find(|n| *n != dead).unwrap();
    let first = acquire(&cluster, live, acquire_req("acme/return", "r1", 60_000, 0))
        .await
        .expect("granted");
    cluster.crash(dead).await;
    wait_repaired(&cluster, dead, before.len()).await;
    release(&cluster, live, "acme/return", &first.lease_id)
        .await
        .expect("released");

    // Back with its old copies of the shards it held: UP once it holds
    // nothing, then balancing gives it replicas again — some of them of
    // shards it still has a stale copy of, which Raft catches up.
    cluster.restart(dead).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (replicas, _) = loads(&cluster);
        if replicas[&dead] > 0 && spread(&replicas) <= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "not refilled: {replicas:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // (A move under way has a fourth voter for a moment.)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = voters(&cluster);
        if now.len() == before.len() && now.values().all(|v| v.len() == 3) {
            break;
        }
        assert!(Instant::now() < deadline, "voters {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It held the most replicas before and holds its even share now: of
    // nine shards, some are ones it has a stale copy of.
    let held_before: BTreeSet<u64> = before
        .iter()
        .filter(|(_, v)| v.contains(&dead))
        .map(|(s, _)| *s)
        .collect();
    let held_now: BTreeSet<u64> = voters(&cluster)
        .iter()
        .filter(|(_, v)| v.contains(&dead))
        .map(|(s, _)| *s)
        .collect();
    assert!(
        !held_before.is_disjoint(&held_now),
        "before {held_before:?}, now {held_now:?}"
    );
    // Every shard serves, through the returned node too, and the first
    // resource's next token is above the one granted before the crash.
    let again = acquire(&cluster, dead, acquire_req("acme/return", "r2", 60_000, 0))
        .await
        .expect("granted again");
    assert!(again.fencing_token > first.fencing_token);
    let mut shards = BTreeSet::new();
    for i in 0..200 {
        if shards.len() == DATA_SHARDS as usize {
            break;
        }
        let resource = format!("acme/after-return-{i}");
        let grant = acquire(
            &cluster,
            dead,
            acquire_req(&resource, &format!("a{i}"), 5_000, 0),
        )
        .await
        .expect("every shard serves");
        shards.insert(grant.shard_id);
    }
    assert_eq!(shards.len(), DATA_SHARDS as usize, "{shards:?}");
}
