//! Rolling upgrades and the placement log (docs/operations.md, "Upgrades"):
//! a placement command newer than the first release's format is refused
//! while any member reports an older one — a member still on the previous
//! build, or one pinned with `max_placement_format = 1` to keep a
//! downgrade possible — and nothing changes; once every member reads it,
//! the same command goes through.

use crate::common;

use std::time::Duration;

use common::Cluster;
use fencelock_api::v1::{scheduler_request::Action, ErrorDetail, Reason};
use fencelock_api::v1::{RaiseEpochsRequest, SchedulerRequest};

fn raise() -> RaiseEpochsRequest {
    RaiseEpochsRequest {
        above_token: 0,
        above_epoch: 500,
    }
}

fn pause() -> SchedulerRequest {
    SchedulerRequest {
        action: Action::Pause as i32,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commands_a_member_cannot_read_are_refused_until_every_member_reads_them() {
    let mut cluster = Cluster::start(3, |c| {
        if c.node_id == 3 {
            c.max_placement_format = 1;
        }
    })
    .await;
    let version_before = cluster.nodes[&1].router().map_version();
    let mut admin = cluster.admin(1).await;
    for refused in [
        admin.raise_epochs(raise()).await.map(|_| ()),
        admin.scheduler(pause()).await.map(|_| ()),
    ] {
        let status = refused.expect_err("node 3 reads format 1 only");
        let detail = ErrorDetail::from_status(&status).expect("typed");
        assert_eq!(detail.reason(), Reason::PlacementConflict, "{detail:?}");
        assert!(
            detail.message.contains("upgrade node 3"),
            "the refusal names the node to upgrade: {}",
            detail.message
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        cluster.nodes[&1].router().map_version(),
        version_before,
        "nothing was proposed"
    );

    // Node 3 upgraded (its pin removed), restarted from its data.
    cluster.crash(3).await;
    cluster.configs.get_mut(&3).unwrap().max_placement_format =
        fencelock_placement::PLACEMENT_FORMAT;
    cluster.restart(3).await;
    cluster.wait_for_leaders(Duration::from_secs(20)).await;
    let raised = admin
        .raise_epochs(raise())
        .await
        .expect("every member reads format 2 now")
        .into_inner();
    assert!(raised.shards.iter().all(|s| s.epoch > 500), "{raised:?}");
    assert!(
        admin
            .scheduler(pause())
            .await
            .expect("paused")
            .into_inner()
            .paused
    );
}
