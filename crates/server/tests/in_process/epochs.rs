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
