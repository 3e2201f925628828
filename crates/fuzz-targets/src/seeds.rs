//! Seed inputs for every target, made from real encodings. They are
//! written to `fuzz/corpus/<target>/seed-*` by the smoke test with
//! `FENCELOCK_WRITE_CORPUS=1` and replayed from there on every run.

use std::collections::BTreeSet;

use fencelock_api::v1::{
    reshard_request, AcquireRequest, AddNodeRequest, DrainNodeRequest, GetRequest,
    HotResourcesRequest, ListShardsRequest, MoveReplicaRequest, MoveSlots, ReleaseRequest,
    RenewBatchRequest, RenewRequest, ReshardRequest, SlotRange, SplitShard, TransferLeaderRequest,
};
use fencelock_placement::{NodeState, PlacementCommand, PlacementMap};
use fencelock_statemachine::{
    slot_of, ApplyContext, Command, LeaseId, Limits, LockTable, Owner, RenewItem, Reply, RequestId,
    ResourceName, SlotSet,
};
use prost::Message;

use crate::smoke::Rng;

pub type Seeds = Vec<(String, Vec<u8>)>;

const T0: u64 = 1_700_000_000_000;

fn ctx(index: u64) -> ApplyContext {
    ApplyContext {
        index,
        term: 1,
        epoch: 1,
        now_ms: T0 + index * 100,
    }
}

fn name(s: &str) -> ResourceName {
    ResourceName::parse(s).expect("valid seed name")
}

fn owner() -> Owner {
    Owner::new("spiffe://fencelock/tenant/acme/w1").expect("valid owner")
}

/// One command of every kind.
pub fn commands() -> Vec<Command> {
    vec![
        Command::LeaderChanged {
            clock_offset_allowance_ms: 500,
        },
        Command::Acquire {
            resource: name("acme/a"),
            owner: owner(),
            request_id: RequestId::new(b"req-1".to_vec()).expect("short id"),
            lease_id: LeaseId([1; 16]),
            lease_ttl_ms: 10_000,
            wait_timeout_ms: 5_000,
            value: fencelock_statemachine::HolderValue::none(),
            mode: fencelock_statemachine::AcquireMode::Exclusive,
        },
        Command::Renew {
            resource: name("acme/a"),
            owner: Owner::anonymous(),
            lease_id: LeaseId([1; 16]),
            lease_ttl_ms: 10_000,
        },
        Command::RenewBatch {
            owner: owner(),
            items: vec![
                RenewItem {
                    resource: name("beta/b"),
                    lease_id: LeaseId([2; 16]),
                    lease_ttl_ms: 20_000,
                },
                RenewItem {
                    resource: name("acme/a/b:c"),
                    lease_id: LeaseId([3; 16]),
                    lease_ttl_ms: 0,
                },
            ],
        },
        Command::Release {
            resource: name("acme/a"),
            owner: owner(),
            lease_id: LeaseId([1; 16]),
        },
        Command::Cancel {
            resource: name("acme/a"),
            lease_id: LeaseId([3; 16]),
            attempt: 2,
        },
        Command::Tick,
        Command::ExportSlots {
            migration_id: 4,
            slots: [1u32, 2, 900].into_iter().collect(),
        },
        Command::ImportSlots {
            migration_id: 5,
            epoch: 9,
            slots: [7u32].into_iter().collect(),
            data: vec![0, 1, 2],
            clock_offset_allowance_ms: 100,
            export_clock_ms: None,
        },
        Command::ImportSlots {
            migration_id: 6,
            epoch: 10,
            slots: [8u32].into_iter().collect(),
            data: vec![3, 4],
            clock_offset_allowance_ms: 100,
            export_clock_ms: Some(1_700_000_000_000),
        },
        Command::DropExport { migration_id: 4 },
    ]
}

/// A table with holders, waiters and dedup entries.
pub fn busy_table() -> LockTable {
    let mut t = LockTable::new(Limits::default()).expect("default limits");
    let mut index = 1;
    t.apply(
        &Command::LeaderChanged {
            clock_offset_allowance_ms: 500,
        },
        &ctx(index),
    );
    for i in 0..8u8 {
        index += 1;
        t.apply(
            &Command::Acquire {
                resource: name(&format!("acme/r{}", i % 3)),
                owner: if i.is_multiple_of(2) {
                    owner()
                } else {
                    Owner::anonymous()
                },
                request_id: RequestId::new(vec![b'q', i]).expect("short id"),
                lease_id: LeaseId([i + 1; 16]),
                lease_ttl_ms: 10_000,
                wait_timeout_ms: 60_000,
                value: fencelock_statemachine::HolderValue::none(),
                mode: fencelock_statemachine::AcquireMode::Exclusive,
            },
            &ctx(index),
        );
    }
    index += 1;
    t.apply(
        &Command::Release {
            resource: name("acme/r2"),
            owner: owner(),
            lease_id: LeaseId([3; 16]),
        },
        &ctx(index),
    );
    t
}

fn export_of(table: &mut LockTable, resource: &str, index: u64) -> Option<Vec<u8>> {
    let out = table.apply(
        &Command::ExportSlots {
            migration_id: 1,
            slots: [slot_of(&name(resource))].into_iter().collect(),
        },
        &ctx(index),
    );
    match out.reply {
        Ok(Reply::Exported { data, .. }) => Some(data),
        _ => None,
    }
}

fn numbered(prefix: &str, items: impl IntoIterator<Item = Vec<u8>>) -> Seeds {
    items
        .into_iter()
        .enumerate()
        .map(|(i, bytes)| (format!("{prefix}-{i:02}.bin"), bytes))
        .collect()
}

pub fn command_decode() -> Seeds {
    numbered("command", commands().iter().map(Command::encode))
}

pub fn snapshot_decode() -> Seeds {
    let mut exporting = busy_table();
    let _ = export_of(&mut exporting, "acme/r0", 20);
    vec![
        ("busy.bin".into(), busy_table().snapshot()),
        ("exporting.bin".into(), exporting.snapshot()),
        (
            "empty.bin".into(),
            LockTable::new(Limits::default())
                .expect("limits")
                .snapshot(),
        ),
        (
            "bootstrap.bin".into(),
            LockTable::bootstrap(Limits::default(), [3u32, 4].into_iter().collect(), 7, 1)
                .expect("limits")
                .snapshot(),
        ),
    ]
}

pub fn export_import() -> Seeds {
    let mut out = Vec::new();
    for (i, resource) in ["acme/r0", "acme/r1"].into_iter().enumerate() {
        if let Some(data) = export_of(&mut busy_table(), resource, 20) {
            out.push((format!("export-{i:02}.bin"), data));
        }
    }
    let mut empty = LockTable::with_slots(Limits::default(), SlotSet::full()).expect("limits");
    empty.apply(
        &Command::LeaderChanged {
            clock_offset_allowance_ms: 0,
        },
        &ctx(1),
    );
    if let Some(data) = export_of(&mut empty, "zeta/none", 2) {
        out.push(("export-empty.bin".into(), data));
    }
    out
}

fn rich_map() -> PlacementMap {
    use PlacementCommand::*;
    let nodes: Vec<(u64, String)> = (1..=5).map(|i| (i, format!("node-{i}:7000"))).collect();
    let mut map = PlacementMap::bootstrap(&nodes, 4, 3).expect("valid bootstrap");
    for cmd in [
        AddNode {
            node_id: 9,
            addr: "[::1]:7009".into(),
        },
        SetNodeState {
            node_id: 9,
            state: NodeState::Drained,
        },
        SetNodeState {
            node_id: 5,
            state: NodeState::Draining,
        },
        CreateShard {
            replicas: [1, 2, 3].into(),
        },
        BeginMigration {
            from_shard: 1,
            to_shard: 5,
            slots: vec![0, 4, 8],
        },
        CommitMigration { migration_id: 1 },
        AdvanceEpoch { shard_id: 2 },
        BeginMigration {
            from_shard: 3,
            to_shard: 1,
            slots: vec![520, 524],
        },
    ] {
        // A refused step would quietly drop the migrating and draining
        // states this seed exists to cover.
        map.apply(&cmd).expect("every rich_map step applies");
    }
    map
}

fn placement_commands() -> Vec<PlacementCommand> {
    use PlacementCommand::*;
    vec![
        AddNode {
            node_id: 7,
            addr: "h:1".into(),
        },
        RemoveNode { node_id: 7 },
        SetNodeState {
            node_id: 7,
            state: NodeState::Draining,
        },
        SetReplicas {
            shard_id: 3,
            replicas: [1, 2, 5].into(),
        },
        CreateShard {
            replicas: BTreeSet::new(),
        },
        BeginMigration {
            from_shard: 1,
            to_shard: 2,
            slots: vec![9, 3],
        },
        CommitMigration { migration_id: 4 },
        AbortMigration { migration_id: 4 },
        AdvanceEpoch { shard_id: 2 },
    ]
}

pub(crate) fn with_selector(selector: u8, bytes: Vec<u8>) -> Vec<u8> {
    let mut out = vec![selector];
    out.extend(bytes);
    out
}

pub fn placement_decode() -> Seeds {
    let mut out = numbered(
        "command",
        placement_commands()
            .iter()
            .map(|c| with_selector(0, c.encode())),
    );
    out.push((
        "map-rich.bin".into(),
        with_selector(1, rich_map().snapshot()),
    ));
    let small = PlacementMap::bootstrap(&[(1, "a:1".into())], 1, 1).expect("valid bootstrap");
    out.push(("map-small.bin".into(), with_selector(1, small.snapshot())));
    out
}

/// Pseudo-random scripts of a few lengths: every byte string is a valid
/// script for the structured targets.
fn scripts(salt: u64) -> Seeds {
    let mut rng = Rng::new(0x005c_2197 ^ salt);
    [48usize, 160, 600, 2_000]
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let mut bytes = rng.bytes(n);
            // Small limits and the first LeaderChanged (see the targets).
            bytes[0] = 1;
            (format!("script-{i:02}.bin"), bytes)
        })
        .collect()
}

pub fn lock_table_apply() -> Seeds {
    scripts(1)
}

pub fn placement_apply() -> Seeds {
    scripts(2)
}

pub fn api_requests() -> Seeds {
    let lease = vec![7u8; 16];
    let messages: Vec<Vec<u8>> = vec![
        AcquireRequest {
            resource: "acme/orders/42".into(),
            request_id: b"0123456789abcdef".to_vec(),
            lease_ttl_ms: 30_000,
            wait_timeout_ms: 5_000,
            value: Vec::new(),
            ..Default::default()
        }
        .encode_to_vec(),
        RenewRequest {
            resource: "acme/orders/42".into(),
            lease_id: lease.clone(),
            lease_ttl_ms: 0,
        }
        .encode_to_vec(),
        RenewBatchRequest {
            items: vec![
                RenewRequest {
                    resource: "acme/a".into(),
                    lease_id: lease.clone(),
                    lease_ttl_ms: 10_000,
                },
                RenewRequest {
                    resource: "Bad/Name".into(),
                    lease_id: vec![1, 2, 3],
                    lease_ttl_ms: 0,
                },
            ],
        }
        .encode_to_vec(),
        ReleaseRequest {
            resource: "zeta/x:y.z".into(),
            lease_id: lease,
        }
        .encode_to_vec(),
        GetRequest {
            resource: "acme/a".into(),
        }
        .encode_to_vec(),
        AddNodeRequest {
            address: "10.0.0.4:7000".into(),
            node_id: 4,
        }
        .encode_to_vec(),
        DrainNodeRequest { node_id: 2 }.encode_to_vec(),
        TransferLeaderRequest {
            shard_id: 1,
            to_node_id: 3,
        }
        .encode_to_vec(),
        MoveReplicaRequest {
            shard_id: 2,
            from_node_id: 1,
            to_node_id: 4,
        }
        .encode_to_vec(),
        ReshardRequest {
            action: Some(reshard_request::Action::MoveSlots(MoveSlots {
                from_shard_id: 1,
                to_shard_id: 2,
                slots: vec![
                    SlotRange { start: 0, end: 9 },
                    SlotRange {
                        start: 1000,
                        end: 1023,
                    },
                ],
            })),
        }
        .encode_to_vec(),
        HotResourcesRequest { limit: 50 }.encode_to_vec(),
        ListShardsRequest {
            shard_ids: vec![1, 2, 3],
        }
        .encode_to_vec(),
    ];
    let mut out: Seeds = messages
        .into_iter()
        .enumerate()
        .map(|(i, bytes)| (format!("request-{i:02}.bin"), with_selector(i as u8, bytes)))
        .collect();
    out.push((
        "request-split.bin".into(),
        with_selector(
            9,
            ReshardRequest {
                action: Some(reshard_request::Action::SplitShard(SplitShard {
                    shard_id: 3,
                    split_at_slot: 512,
                })),
            }
            .encode_to_vec(),
        ),
    ));
    out
}

/// The seeds of the target called `name`.
pub fn for_target(name: &str) -> Seeds {
    match name {
        "command_decode" => command_decode(),
        "snapshot_decode" => snapshot_decode(),
        "export_import" => export_import(),
        "placement_decode" => placement_decode(),
        "lock_table_apply" => lock_table_apply(),
        "placement_apply" => placement_apply(),
        "api_requests" => api_requests(),
        "log_payload" => crate::store::log_payload_seeds(),
        "raft_batch" => crate::store::raft_batch_seeds(),
        _ => Vec::new(),
    }
}
