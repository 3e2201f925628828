//! Decoders of bytes that arrive from peers or the disk: lock commands
//! (Raft entry payloads), lock table snapshots, migration exports, placement
//! commands and placement map snapshots. Whatever the bytes, decoding
//! returns a value or an error; what decodes is canonical (encodes back to
//! the same bytes) and keeps every invariant, and the decoded state can be
//! worked on without panicking.

use fencelock_placement::{PlacementCommand, PlacementMap};
use fencelock_statemachine::{ApplyContext, Command, Limits, LockTable, SlotSet};

/// `Command::decode`: canonical when it succeeds.
pub fn command_decode(data: &[u8]) {
    if let Ok(command) = Command::decode(data) {
        assert_eq!(command.encode(), data, "non-canonical command {command:?}");
    }
}

/// `LockTable::restore`: a restored table keeps its invariants, encodes back
/// to the same bytes, and takes a tick and a leader change afterwards.
pub fn snapshot_decode(data: &[u8]) {
    let Ok(mut table) = LockTable::restore(data) else {
        return;
    };
    check_table(&table);
    let again = table.snapshot();
    if again != data {
        let at = again.iter().zip(data).take_while(|(a, b)| a == b).count();
        panic!(
            "non-canonical snapshot: {} bytes in, {} out, first difference at byte {at}; \
             restored {table:?}",
            data.len(),
            again.len()
        );
    }
    // Whatever state a snapshot holds, the commands that follow it in the
    // log must apply without panicking: a tick far ahead (every lease and
    // wait due) and a new leader's first entry.
    let epoch = table.epoch().max(1);
    let next = |t: &LockTable, term: u64, ahead_ms: u64| ApplyContext {
        index: t.applied_index().saturating_add(1),
        term,
        epoch,
        now_ms: t.clock_ms().saturating_add(ahead_ms),
    };
    let ctx = next(&table, table.leader_term(), 1);
    table.apply(&Command::Tick, &ctx);
    check_table(&table);
    let ctx = next(&table, table.leader_term().saturating_add(1), 0);
    table.apply(
        &Command::LeaderChanged {
            clock_offset_allowance_ms: 500,
        },
        &ctx,
    );
    check_table(&table);
    let ctx = next(&table, table.leader_term(), 48 * 3_600_000);
    table.apply(&Command::Tick, &ctx);
    check_table(&table);
}

/// A migration export only ever enters a table through `ImportSlots`, which
/// must refuse whatever does not fit and then change nothing.
pub fn export_import(data: &[u8]) {
    let mut table =
        LockTable::with_slots(Limits::default(), SlotSet::EMPTY).expect("default limits are valid");
    let ctx = |index| ApplyContext {
        index,
        term: 1,
        epoch: 1,
        now_ms: 1_700_000_000_000 + index,
    };
    table.apply(
        &Command::LeaderChanged {
            clock_offset_allowance_ms: 0,
        },
        &ctx(1),
    );
    let before = table.clone();
    let out = table.apply(
        &Command::ImportSlots {
            migration_id: 1,
            epoch: 2,
            slots: SlotSet::full(),
            data: data.to_vec(),
            clock_offset_allowance_ms: 0,
            export_clock_ms: None,
        },
        &ctx(2),
    );
    check_table(&table);
    if out.reply.is_err() {
        // A refused import leaves the state as it was, except the applied
        // position and clock (the entry was applied, as a refusal).
        assert_eq!(table.held_count(), before.held_count());
        assert_eq!(table.waiter_count(), before.waiter_count());
        assert_eq!(table.dedup_count(), before.dedup_count());
        assert_eq!(table.owned_slots(), before.owned_slots());
        assert_eq!(table.epoch(), before.epoch());
    }
}

/// First byte even: `PlacementCommand::decode` of the rest; odd:
/// `PlacementMap::restore` of the rest, then commands applied to the
/// restored map.
pub fn placement_decode(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which.is_multiple_of(2) {
        if let Ok(command) = PlacementCommand::decode(rest) {
            assert_eq!(command.encode(), rest, "non-canonical command {command:?}");
        }
        return;
    }
    let Ok(mut map) = PlacementMap::restore(rest) else {
        return;
    };
    map.check_invariants()
        .unwrap_or_else(|e| panic!("restored map breaks an invariant: {e}"));
    assert_eq!(map.snapshot(), rest, "non-canonical placement snapshot");
    let shard = map.shards().map(|s| s.shard_id).max().unwrap_or(1);
    let node = map.nodes().map(|n| n.node_id).max().unwrap_or(1);
    let migration = map.migration().map(|m| m.id).unwrap_or(1);
    let replicas: std::collections::BTreeSet<u64> = map.nodes().map(|n| n.node_id).collect();
    let commands = [
        PlacementCommand::AdvanceEpoch { shard_id: shard },
        PlacementCommand::SetSchedulerPaused {
            paused: !map.scheduler_paused(),
        },
        PlacementCommand::AddNode {
            node_id: node.saturating_add(1),
            addr: "10.0.0.1:7000".into(),
        },
        PlacementCommand::CreateShard { replicas },
        PlacementCommand::CommitMigration {
            migration_id: migration,
        },
        PlacementCommand::AbortMigration {
            migration_id: migration,
        },
        PlacementCommand::BeginMigration {
            from_shard: 1,
            to_shard: shard,
            slots: vec![0, 1],
        },
        PlacementCommand::RemoveNode { node_id: node },
    ];
    for command in &commands {
        crate::placement_apply::apply_checked(&mut map, command);
    }
}

/// The table's own invariant check, as a panic naming what broke.
pub fn check_table(table: &LockTable) {
    if let Err(broken) = table.check_invariants() {
        panic!("lock table invariant broken: {broken}");
    }
}
