//! Targets on the store's own codecs: what a node writes into Raft entries
//! and snapshots (`fencelock-codec`) and the peer transport's batches of
//! raft-rs messages. All pure, so the coverage-guided build reaches them.

use fencelock_api::internal::{RaftBatch, RaftEnvelope};
use fencelock_codec::{
    decode_payload, decode_state, encode_payload, encode_payload_at_epoch,
    encode_placement_payload, encode_state, Payload,
};
use fencelock_placement::{PlacementCommand, PlacementMap};
use fencelock_statemachine::{Limits, LockTable, SlotSet};
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, EntryType, Message, MessageType, Snapshot};

use crate::seeds::{self, with_selector, Seeds};

/// Even first byte: an entry payload; odd: shard snapshot data. What
/// decodes must re-encode to the same bytes (one spelling per payload),
/// and a restored table must keep its invariants.
pub fn log_payload(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    if which.is_multiple_of(2) {
        if let Ok((now_ms, payload)) = decode_payload(bytes) {
            let again = match &payload {
                Payload::Locks(commands) => encode_payload(now_ms, commands),
                Payload::LocksAtEpoch { epoch, commands } => {
                    encode_payload_at_epoch(now_ms, *epoch, commands)
                }
                Payload::Placement(commands) => encode_placement_payload(now_ms, commands),
            };
            assert_eq!(again, bytes, "non-canonical payload");
        }
    } else if let Ok((table, map)) = decode_state(bytes) {
        if let Err(broken) = table.check_invariants() {
            panic!("restored table breaks an invariant: {broken}");
        }
        assert_eq!(
            encode_state(&table, map.as_ref()),
            bytes,
            "non-canonical state"
        );
    }
}

/// The peer transport's `RaftBatch` (prost) and each envelope's raft-rs
/// message (rust-protobuf): what parses re-encodes and parses back equal.
pub fn raft_batch(data: &[u8]) {
    let Ok(batch) = RaftBatch::decode(data) else {
        return;
    };
    for envelope in &batch.messages {
        if let Ok(msg) = Message::parse_from_bytes(&envelope.message) {
            let again = msg.write_to_bytes().expect("a parsed message encodes");
            let back = Message::parse_from_bytes(&again).expect("re-encoded message parses");
            assert_eq!(back, msg, "raft message does not round-trip");
        }
    }
}

fn map() -> PlacementMap {
    let nodes: Vec<(u64, String)> = (1..=3).map(|i| (i, format!("node-{i}:7000"))).collect();
    PlacementMap::bootstrap(&nodes, 4, 3).expect("valid bootstrap")
}

/// Payloads and snapshots as the store writes them.
pub fn log_payload_seeds() -> Seeds {
    let commands = seeds::commands();
    let table = seeds::busy_table();
    let bootstrap = LockTable::bootstrap(Limits::default(), SlotSet::EMPTY, 1, 1).expect("limits");
    let placement = [
        PlacementCommand::AddNode {
            node_id: 4,
            addr: "10.0.0.4:7000".into(),
        },
        PlacementCommand::AdvanceEpoch { shard_id: 2 },
    ];
    vec![
        (
            "payload-locks.bin".into(),
            with_selector(0, encode_payload(1_700_000_000_000, &commands)),
        ),
        (
            "payload-one.bin".into(),
            with_selector(0, encode_payload(5, &commands[1..2])),
        ),
        (
            "payload-placement.bin".into(),
            with_selector(0, encode_placement_payload(7, &placement)),
        ),
        (
            "state-busy.bin".into(),
            with_selector(1, encode_state(&table, None)),
        ),
        (
            "state-meta.bin".into(),
            with_selector(1, encode_state(&bootstrap, Some(&map()))),
        ),
    ]
}

fn raft_message(kind: MessageType, entries: usize, snapshot: bool) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(kind);
    m.set_from(1);
    m.set_to(2);
    m.set_term(3);
    m.set_log_term(3);
    m.set_index(10);
    m.set_commit(9);
    let batch: Vec<Entry> = (0..entries)
        .map(|i| {
            let mut e = Entry::default();
            e.set_entry_type(EntryType::EntryNormal);
            e.set_term(3);
            e.set_index(11 + i as u64);
            e.set_data(encode_payload(1_700_000_000_000, &seeds::commands()[..2]).into());
            e
        })
        .collect();
    m.set_entries(batch.into());
    if snapshot {
        let mut s = Snapshot::default();
        s.set_data(encode_state(&seeds::busy_table(), None).into());
        let meta = s.mut_metadata();
        meta.set_index(9);
        meta.set_term(3);
        let mut conf = ConfState::default();
        conf.set_voters(vec![1, 2, 3]);
        meta.set_conf_state(conf);
        m.set_snapshot(s);
    }
    m.write_to_bytes().expect("message encodes")
}

/// Batches as the transport sends them: appends, a snapshot, votes.
pub fn raft_batch_seeds() -> Seeds {
    let batch = |messages: Vec<(u64, Vec<u8>)>| {
        RaftBatch {
            from_node: 1,
            messages: messages
                .into_iter()
                .map(|(shard_id, message)| RaftEnvelope { shard_id, message })
                .collect(),
        }
        .encode_to_vec()
    };
    vec![
        (
            "append.bin".into(),
            batch(vec![
                (1, raft_message(MessageType::MsgAppend, 2, false)),
                (2, raft_message(MessageType::MsgHeartbeat, 0, false)),
            ]),
        ),
        (
            "snapshot.bin".into(),
            batch(vec![(3, raft_message(MessageType::MsgSnapshot, 0, true))]),
        ),
        (
            "votes.bin".into(),
            batch(vec![
                (0, raft_message(MessageType::MsgRequestVote, 0, false)),
                (1, raft_message(MessageType::MsgAppendResponse, 0, false)),
            ]),
        ),
    ]
}
