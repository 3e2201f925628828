//! Hostile input for the decoders every replica runs on bytes from the
//! network or the disk: Raft entry commands, snapshots and migration
//! exports. Whatever the bytes, decoding returns a value or a `DecodeError`
//! — never a panic — and whatever decodes is canonical (encodes back to the
//! same bytes) and keeps every table invariant.
//!
//! Inputs: random bytes, and mutations (bit flips, cuts, splices) of valid
//! encodings, which reach much deeper into the decoders than random bytes.
//! The seeds under `tests/corpus/` are replayed first on every run; they
//! are encodings of real tables and commands (regenerate them with
//! `FENCELOCK_WRITE_CORPUS=1 cargo test -p fencelock-statemachine --test
//! hostile_bytes`).

use std::path::PathBuf;

use fencelock_statemachine::*;
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;

fn ctx(index: u64) -> ApplyContext {
    ApplyContext {
        index,
        term: 1,
        epoch: 1,
        now_ms: T0 + index,
    }
}

/// Valid commands of every kind.
fn commands() -> Vec<Command> {
    let r = |s: &str| ResourceName::parse(s).unwrap();
    vec![
        Command::LeaderChanged {
            clock_offset_allowance_ms: 500,
        },
        Command::Acquire {
            owner: Owner::anonymous(),
            resource: r("acme/a"),
            request_id: RequestId::new(b"req-1".to_vec()).unwrap(),
            lease_id: LeaseId([1; 16]),
            lease_ttl_ms: 10_000,
            wait_timeout_ms: 5_000,
            value: fencelock_statemachine::HolderValue::none(),
            mode: fencelock_statemachine::AcquireMode::Exclusive,
        },
        Command::Renew {
            owner: Owner::anonymous(),
            resource: r("acme/a"),
            lease_id: LeaseId([1; 16]),
            lease_ttl_ms: 10_000,
        },
        Command::RenewBatch {
            owner: Owner::anonymous(),
            items: vec![RenewItem {
                resource: r("beta/b"),
                lease_id: LeaseId([2; 16]),
                lease_ttl_ms: 20_000,
            }],
        },
        Command::Release {
            owner: Owner::anonymous(),
            resource: r("acme/a"),
            lease_id: LeaseId([1; 16]),
        },
        Command::Cancel {
            resource: r("acme/a"),
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

/// A table with holders, waiters, dedup entries and a pending export.
fn busy_table() -> LockTable {
    let mut t = LockTable::new(Limits::default()).unwrap();
    let mut index = 0;
    let mut apply = |t: &mut LockTable, c: Command| {
        index += 1;
        t.apply(&c, &ctx(index))
    };
    apply(&mut t, commands()[0].clone());
    for i in 0..6u8 {
        apply(
            &mut t,
            Command::Acquire {
                owner: Owner::anonymous(),
                resource: ResourceName::parse(&format!("acme/r{}", i % 3)).unwrap(),
                request_id: RequestId::new(vec![b'q', i]).unwrap(),
                lease_id: LeaseId([i + 1; 16]),
                lease_ttl_ms: 10_000,
                wait_timeout_ms: 60_000,
                value: fencelock_statemachine::HolderValue::none(),
                mode: fencelock_statemachine::AcquireMode::Exclusive,
            },
        );
    }
    let slot = slot_of(&ResourceName::parse("acme/r0").unwrap());
    apply(
        &mut t,
        Command::ExportSlots {
            migration_id: 1,
            slots: [slot].into_iter().collect(),
        },
    );
    t
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// The seeds: file name prefix says which decoder they feed.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = commands()
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("command-{i:02}.bin"), c.encode()))
        .collect();
    out.push(("snapshot-busy.bin".into(), busy_table().snapshot()));
    out.push((
        "snapshot-empty.bin".into(),
        LockTable::new(Limits::default()).unwrap().snapshot(),
    ));
    let export = busy_table()
        .apply(
            &Command::ExportSlots {
                migration_id: 1,
                slots: [slot_of(&ResourceName::parse("acme/r0").unwrap())]
                    .into_iter()
                    .collect(),
            },
            &ctx(100),
        )
        .reply;
    if let Ok(Reply::Exported { data, .. }) = export {
        out.push(("export-r0.bin".into(), data));
    }
    out
}

/// Feeds `bytes` to the decoder its kind names; panics only on a broken
/// promise (non-canonical decode, invariant broken), never on bad bytes.
fn feed(kind: &str, bytes: &[u8]) {
    if kind.starts_with("command") {
        if let Ok(c) = Command::decode(bytes) {
            assert_eq!(c.encode(), bytes, "non-canonical command {c:?}");
        }
    } else if kind.starts_with("snapshot") {
        if let Ok(t) = LockTable::restore(bytes) {
            t.check_invariants().unwrap();
            assert_eq!(t.snapshot(), bytes, "non-canonical snapshot");
        }
    } else {
        // An export only ever enters a table through ImportSlots, which
        // must refuse whatever does not fit, changing nothing.
        let mut t = LockTable::with_slots(Limits::default(), SlotSet::EMPTY).unwrap();
        t.apply(
            &Command::LeaderChanged {
                clock_offset_allowance_ms: 0,
            },
            &ctx(1),
        );
        let out = t.apply(
            &Command::ImportSlots {
                migration_id: 1,
                epoch: 2,
                slots: SlotSet::full(),
                data: bytes.to_vec(),
                clock_offset_allowance_ms: 0,
                export_clock_ms: Some(1_700_000_000_000),
            },
            &ctx(2),
        );
        t.check_invariants().unwrap();
        if out.reply.is_err() {
            assert_eq!(t.held_count(), 0);
        }
    }
}

#[test]
fn the_committed_corpus_replays_without_panics() {
    let dir = corpus_dir();
    if std::env::var_os("FENCELOCK_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/corpus exists") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        feed(&name, &bytes);
        n += 1;
    }
    assert!(n >= 10, "the corpus has only {n} inputs");
}

/// One way to damage a valid encoding.
#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Cut { at: usize },
    Insert { at: usize, byte: u8 },
    Set { at: usize, byte: u8 },
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        match *m {
            Mutation::Flip { at, bit } => {
                let i = at % bytes.len();
                bytes[i] ^= 1 << (bit % 8);
            }
            Mutation::Cut { at } => bytes.truncate(at % bytes.len()),
            Mutation::Insert { at, byte } => {
                let i = at % (bytes.len() + 1);
                bytes.insert(i, byte);
            }
            Mutation::Set { at, byte } => {
                let i = at % bytes.len();
                bytes[i] = byte;
            }
        }
    }
    bytes
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        any::<usize>().prop_map(|at| Mutation::Cut { at }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        (
            any::<usize>(),
            prop_oneof![Just(0u8), Just(0xff), any::<u8>()]
        )
            .prop_map(|(at, byte)| Mutation::Set { at, byte }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn random_bytes_never_panic_any_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        feed("command", &bytes);
        feed("snapshot", &bytes);
        feed("export", &bytes);
    }

    #[test]
    fn damaged_valid_encodings_never_panic_and_decode_canonically(
        seed in 0usize..64,
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let seeds = seeds();
        let (name, bytes) = &seeds[seed % seeds.len()];
        feed(name, &mutate(bytes.clone(), &mutations));
    }
}
