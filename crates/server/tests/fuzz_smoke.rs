//! Fuzz smoke of the server-side decoders and request checks, run by
//! `make test` with the driver of `fencelock_fuzz_targets::smoke` (corpus
//! in `fuzz/corpus/<target>/`, then seeded random and mutated inputs):
//!
//! * `server_requests` — each public request message decoded from bytes,
//!   then the server's own checks (`fencelock_server::validate`) and, for
//!   a refusal, the gRPC status and HTTP response the caller would get;
//! * `log_payload` — Raft entry payloads and shard snapshot data
//!   (`store::decode_payload`, `store::decode_state`): canonical when they
//!   decode;
//! * `raft_batch` — the peer transport's batches (`RaftBatch` of
//!   `RaftEnvelope`s, each a raft-rs message).
//!
//! These need the server crate (and so RocksDB), which the coverage-guided
//! build in `fuzz/` leaves out; it fuzzes the codecs underneath them (lock
//! and placement commands, snapshots, API messages) instead.

use fencelock_api::v1::{
    reshard_request, AcquireRequest, AddNodeRequest, GetRequest, HotResourcesRequest,
    ReleaseRequest, RenewBatchRequest, RenewRequest, ReshardRequest,
};
use fencelock_fuzz_targets::requests::{decode, REQUEST_TYPES};
use fencelock_fuzz_targets::{seeds, smoke};
use fencelock_placement::{PlacementCommand, PlacementMap};
use fencelock_server::errors::ServerError;
use fencelock_server::internal::{RaftBatch, RaftEnvelope};
use fencelock_server::store::{
    decode_payload, decode_state, encode_payload, encode_payload_at_epoch, encode_state, Payload,
};
use fencelock_server::validate;
use fencelock_statemachine::{Limits, LockTable, SlotSet};
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, EntryType, Message, MessageType, Snapshot};

/// Generated inputs per target (each target takes well under a second).
const ITERATIONS: usize = 100_000;

/// A refusal must turn into a detail, a status and an HTTP response
/// without panicking, whatever the request held.
fn refuse(err: ServerError) {
    let detail = err.to_detail();
    let _ = detail.encode_to_vec();
    let status: tonic::Status = err.into();
    let _ = status.into_http::<()>();
}

fn check<T>(result: Result<T, ServerError>) -> Option<T> {
    result.map_err(refuse).ok()
}

/// Same selector as `fencelock_fuzz_targets::requests::api_requests`, so
/// the two targets share seeds.
fn server_requests(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match usize::from(which) % REQUEST_TYPES.len() {
        0 => {
            if let Some(r) = decode::<AcquireRequest>(bytes) {
                check(validate::resource(&r.resource));
                check(validate::request_id(&r.request_id));
            }
        }
        1 => {
            if let Some(r) = decode::<RenewRequest>(bytes) {
                check(validate::resource(&r.resource));
                check(validate::lease_id(&r.lease_id));
            }
        }
        2 => {
            if let Some(r) = decode::<RenewBatchRequest>(bytes) {
                if check(validate::renew_batch_len(r.items.len())).is_some() {
                    for item in &r.items {
                        check(validate::resource(&item.resource));
                        check(validate::lease_id(&item.lease_id));
                    }
                }
            }
        }
        3 => {
            if let Some(r) = decode::<ReleaseRequest>(bytes) {
                check(validate::resource(&r.resource));
                check(validate::lease_id(&r.lease_id));
            }
        }
        4 => {
            if let Some(r) = decode::<GetRequest>(bytes) {
                check(validate::resource(&r.resource));
            }
        }
        5 => {
            if let Some(r) = decode::<AddNodeRequest>(bytes) {
                check(validate::new_node_id(r.node_id));
            }
        }
        9 => {
            if let Some(ReshardRequest {
                action: Some(reshard_request::Action::MoveSlots(m)),
            }) = decode::<ReshardRequest>(bytes)
            {
                if let Some(slots) = check(validate::slots_from_ranges(&m.slots)) {
                    assert!(
                        slots.windows(2).all(|w| w[0] < w[1]),
                        "slots sorted, unique"
                    );
                    assert!(slots.iter().all(|&s| s < fencelock_placement::SLOT_COUNT));
                }
            }
        }
        10 => {
            if let Some(r) = decode::<HotResourcesRequest>(bytes) {
                if let Some(limit) = check(validate::hot_limit(r.limit)) {
                    assert!((1..=validate::MAX_HOT_LIMIT).contains(&limit));
                }
            }
        }
        // The other admin requests carry only ids the operator actions
        // check against the map; decoding them is the whole edge.
        _ => fencelock_fuzz_targets::requests::api_requests(data),
    }
}

/// Even first byte: an entry payload; odd: shard snapshot data.
fn log_payload(data: &[u8]) {
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
                Payload::Placement(commands) => placement_payload(now_ms, commands),
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

/// What the transport's receiving side does with a batch.
fn raft_batch(data: &[u8]) {
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

fn with_selector(selector: u8, bytes: Vec<u8>) -> Vec<u8> {
    let mut out = vec![selector];
    out.extend(bytes);
    out
}

fn map() -> PlacementMap {
    let nodes: Vec<(u64, String)> = (1..=3).map(|i| (i, format!("node-{i}:7000"))).collect();
    PlacementMap::bootstrap(&nodes, 4, 3).expect("valid bootstrap")
}

/// A placement payload as the store writes it (version 2, time stamp,
/// count, then each command with its length).
fn placement_payload(now_ms: u64, commands: &[PlacementCommand]) -> Vec<u8> {
    let mut out = vec![2];
    out.extend_from_slice(&now_ms.to_be_bytes());
    out.extend_from_slice(&(commands.len() as u32).to_be_bytes());
    for c in commands {
        let bytes = c.encode();
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn log_payload_seeds() -> seeds::Seeds {
    let commands = seeds::commands();
    let table = seeds::busy_table();
    let bootstrap = LockTable::bootstrap(Limits::default(), SlotSet::EMPTY, 1, 1).expect("limits");
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
            with_selector(
                0,
                placement_payload(
                    7,
                    &[
                        PlacementCommand::AddNode {
                            node_id: 4,
                            addr: "10.0.0.4:7000".into(),
                        },
                        PlacementCommand::AdvanceEpoch { shard_id: 2 },
                    ],
                ),
            ),
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

fn raft_batch_seeds() -> seeds::Seeds {
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

/// Name (and corpus directory), function, seeds.
type Target = (&'static str, fn(&[u8]), seeds::Seeds);

#[test]
fn server_side_targets_survive_their_corpus_and_generated_inputs() {
    let targets: [Target; 3] = [
        ("server_requests", server_requests, seeds::api_requests()),
        ("log_payload", log_payload, log_payload_seeds()),
        ("raft_batch", raft_batch, raft_batch_seeds()),
    ];
    for (name, run, seeds) in targets {
        let report = smoke::run(name, run, &seeds, ITERATIONS);
        eprintln!(
            "{name}: {} corpus inputs, {} generated, {} ms",
            report.corpus, report.generated, report.millis
        );
    }
}
