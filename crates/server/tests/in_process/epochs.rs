//! A shard whose token positions run low moves to a new epoch handed out by
//! the placement controller, and its tokens keep rising (docs/safety.md,
//! "Fencing tokens", exhaustion). In production the node's epoch task runs
//! the advance when fewer than `EPOCH_ADVANCE_POSITIONS_LEFT` positions
//! are left; reaching that takes 2^39 log entries, so the test runs the
//! same advance with a threshold every shard is below.

use crate::common;

use std::time::Duration;

use common::{acquire, acquire_req, release, Cluster};
use fencelock_statemachine::{FencingToken, ResourceName};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_low_on_token_positions_moves_to_a_new_epoch_from_the_placement_controller() {
    let cluster = Cluster::start(3, |_| {}).await;
    let resource = "acme/epochs";
    let name = ResourceName::parse(resource).unwrap();
    let first = acquire(&cluster, 1, acquire_req(resource, "first", 60_000, 0))
        .await
        .expect("granted");
    let first_token = FencingToken::from_u64(first.fencing_token as u64);
    let shard_id = cluster.nodes[&1].router().shard_of(&name).unwrap();
    let leader = cluster.leader_of(shard_id).expect("a leader");
    let node = &cluster.nodes[&leader];
    let before = node
        .shard_status()
        .into_iter()
        .find(|s| s.shard_id == shard_id)
        .expect("the leader reports the shard");
    assert_eq!(before.epoch, first_token.epoch());
    assert!(
        before.token_positions_left > fencelock_server::store::EPOCH_ADVANCE_POSITIONS_LEFT,
        "a young shard is not low: {before:?}"
    );

    // Nothing happens above the threshold.
    let none = node.advance_epochs(1).await;
    assert!(none.is_empty(), "{none:?}");

    let advanced = node.advance_epochs(u64::MAX).await;
    let epoch = match advanced.iter().find(|(s, _)| *s == shard_id) {
        Some((_, Ok(epoch))) => *epoch,
        other => panic!("shard {shard_id} did not advance: {other:?} in {advanced:?}"),
    };
    assert!(epoch > before.epoch, "{epoch} after {}", before.epoch);
    // The controller recorded the epoch it handed out.
    let map = cluster.nodes[&leader].router().map().expect("a map");
    assert_eq!(map.shard(shard_id).expect("the shard").epoch, epoch);
    // Every replica applies the entry that started it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for (id, n) in &cluster.nodes {
        loop {
            let at = n
                .shard_status()
                .into_iter()
                .find(|s| s.shard_id == shard_id)
                .map(|s| (s.epoch, s.token_positions_left));
            if at.is_some_and(|(e, _)| e == epoch) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {id} is at {at:?}, not at epoch {epoch}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // The held lease keeps its token; the next grant is in the new epoch,
    // above every token of the old one.
    assert!(release(&cluster, 1, resource, &first.lease_id)
        .await
        .unwrap());
    let second = acquire(&cluster, 1, acquire_req(resource, "second", 60_000, 0))
        .await
        .expect("granted");
    let second_token = FencingToken::from_u64(second.fencing_token as u64);
    assert_eq!(second_token.epoch(), epoch);
    assert!(second_token > first_token);
}

/// After a restore from backup (or a rebuild after losing every replica)
/// the cluster's counters may be below tokens the protected systems have
/// seen: `admin raise-epochs` puts every shard's tokens above a floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raised_epochs_put_every_new_token_above_the_highest_one_seen() {
    use fencelock_api::v1::RaiseEpochsRequest;
    let cluster = Cluster::start(3, |c| c.shard_count = 4).await;
    let held = acquire(&cluster, 1, acquire_req("acme/raise-held", "h", 600_000, 0))
        .await
        .expect("granted");
    // A protected system saw this token from the cluster's earlier life.
    let seen = FencingToken::new(900, 77).as_i64();
    let mut admin = cluster.admin(2).await;
    let refused = admin
        .raise_epochs(RaiseEpochsRequest::default())
        .await
        .expect_err("a floor is required");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    let raised = admin
        .raise_epochs(RaiseEpochsRequest {
            above_token: seen,
            above_epoch: 0,
        })
        .await
        .expect("raised")
        .into_inner();
    assert_eq!(raised.above_epoch, 900);
    assert_eq!(raised.shards.len(), 4, "{raised:?}");
    assert!(raised.shards.iter().all(|s| s.epoch > 900), "{raised:?}");
    // Run again: nothing left to do, no epoch spent.
    let again = admin
        .raise_epochs(RaiseEpochsRequest {
            above_token: seen,
            above_epoch: 0,
        })
        .await
        .expect("raised again")
        .into_inner();
    assert_eq!(again.shards, raised.shards);

    // The lock held across the raise keeps its token; every new grant, on
    // every shard, is above the floor.
    let read = common::get(&cluster, 3, "acme/raise-held")
        .await
        .expect("read");
    assert!(read.held);
    assert_eq!(read.fencing_token, held.fencing_token);
    let mut shards = std::collections::BTreeSet::new();
    for i in 0..100 {
        if shards.len() == 4 {
            break;
        }
        let resource = format!("acme/raised-{i}");
        let grant = acquire(&cluster, 1 + i % 3, acquire_req(&resource, "r", 5_000, 0))
            .await
            .expect("granted");
        assert!(
            grant.fencing_token > seen,
            "{resource}: {}",
            grant.fencing_token
        );
        release(&cluster, 1, &resource, &grant.lease_id)
            .await
            .expect("released");
        shards.insert(grant.shard_id);
    }
    assert_eq!(shards.len(), 4);
}
