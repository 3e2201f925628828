//! The lock state machine on arbitrary command sequences.
//!
//! Bytes become a sequence of steps, each a command and the log position
//! it is applied at (index, term, epoch and leader time, which may repeat,
//! jump or go back). Resources, owners, request ids and lease ids come from
//! small pools so that commands collide on the same locks; lease times and
//! waits come from the limits' boundaries or raw bytes. After every step:
//!
//! * the table's own invariant check passes;
//! * its snapshot restores to an equal table that encodes to the same bytes;
//! * every fresh grant has a larger token than every grant before it.
//!
//! Sometimes the run continues on the restored copy instead of the
//! original. At the end a fresh table replays the whole log and must encode
//! to the same bytes (apply is deterministic).
//!
//! The commands are built from a local description ([`Op`]) in one place,
//! [`Op::command`], so a new field in `Command` touches one function here.

use fencelock_statemachine::token::MAX_EPOCH;
use fencelock_statemachine::{
    AcquireStatus, ApplyContext, Command, Event, FencingToken, LeaseId, Limits, LockTable, Owner,
    RenewItem, Reply, RequestId, ResourceName, SlotSet,
};

use crate::decode::check_table;
use crate::input::Input;

/// Steps one input may hold: enough for queues, caps and expiry to matter,
/// small enough that one input stays fast under a coverage-guided fuzzer.
pub const MAX_STEPS: usize = 256;

const T0: u64 = 1_700_000_000_000;

const RESOURCES: [&str; 6] = [
    "acme/a",
    "acme/b",
    "acme/orders/42",
    "zeta/a",
    "zeta/x:y.z",
    "q-1/b_c",
];
const OWNERS: [&str; 3] = [
    "",
    "spiffe://fencelock/tenant/acme/w1",
    "spiffe://fencelock/tenant/zeta/w2",
];
const REQUEST_IDS: usize = 8;
const LEASE_IDS: u8 = 12;

/// Limits small enough for every cap to be reached within one input.
fn small_limits() -> Limits {
    Limits {
        min_lease_ttl_ms: 1_000,
        max_lease_ttl_ms: 40_000,
        max_wait_timeout_ms: 30_000,
        max_hold_ms: 60_000,
        max_waiters_per_resource: 3,
        max_waiters_per_tenant: 4,
        max_held_per_tenant: 3,
        dedup_retention_ms: 20_000,
        max_dedup_entries: 14,
        max_records: 4,
        max_retired_per_tick: 3,
    }
}

/// Limits from raw bytes when they are valid, else the small ones.
fn limits(input: &mut Input) -> Limits {
    match input.u8() % 4 {
        0 => Limits::default(),
        1 | 2 => small_limits(),
        _ => {
            let raw = Limits {
                min_lease_ttl_ms: u64::from(input.u32()),
                max_lease_ttl_ms: u64::from(input.u32()),
                max_wait_timeout_ms: u64::from(input.u32()),
                max_hold_ms: u64::from(input.u32()) * 8,
                max_waiters_per_resource: u32::from(input.u8()),
                max_waiters_per_tenant: u32::from(input.u8()),
                max_held_per_tenant: u32::from(input.u8()),
                dedup_retention_ms: u64::from(input.u32()),
                max_dedup_entries: u32::from(input.u8()),
                max_records: u32::from(input.u8()),
                max_retired_per_tick: u32::from(input.u8()),
            };
            if raw.validate().is_ok() {
                raw
            } else {
                small_limits()
            }
        }
    }
}

/// One command, described with pool indexes and raw numbers.
#[derive(Clone, Debug)]
pub enum Op {
    /// An acquire; some request ids carry a value ([`value_of`]).
    Acquire {
        resource: usize,
        owner: usize,
        request: usize,
        lease: u8,
        ttl_ms: u64,
        wait_ms: u64,
    },
    /// A holder replaces its value ([`value_of`]).
    Proclaim {
        resource: usize,
        owner: usize,
        lease: u8,
        value: usize,
    },
    Renew {
        resource: usize,
        owner: usize,
        lease: u8,
        ttl_ms: u64,
    },
    RenewBatch {
        owner: usize,
        items: Vec<(usize, u8, u64)>,
    },
    Release {
        resource: usize,
        owner: usize,
        lease: u8,
    },
    Cancel {
        resource: usize,
        lease: u8,
        attempt: u32,
    },
    Tick,
    LeaderChanged {
        allowance_ms: u64,
    },
    Export {
        migration: u64,
        slots: SlotSet,
    },
    Import {
        migration: u64,
        epoch: u64,
        slots: SlotSet,
        data: Vec<u8>,
        allowance_ms: u64,
        export_clock_ms: Option<u64>,
    },
    DropExport {
        migration: u64,
    },
}

fn resource(i: usize) -> ResourceName {
    ResourceName::parse(RESOURCES[i]).expect("pool names are valid")
}

fn owner(i: usize) -> Owner {
    Owner::new(OWNERS[i]).expect("pool owners are valid")
}

fn lease(i: u8) -> LeaseId {
    LeaseId([i; 16])
}

/// The holder value numbered `i`: none for most, a short one, and one at
/// the size limit.
/// The acquire mode of request `i` (of `REQUEST_IDS`): half exclusive,
/// then shared, a semaphore of 2 (so kinds clash on one resource), and a
/// permit count out of range.
fn mode_of(i: usize) -> fencelock_statemachine::AcquireMode {
    use fencelock_statemachine::AcquireMode;
    match i % 8 {
        0..=3 => AcquireMode::Exclusive,
        4 | 5 => AcquireMode::Shared,
        6 => AcquireMode::Semaphore { permits: 2 },
        _ => AcquireMode::Semaphore { permits: 0 },
    }
}

fn value_of(i: usize) -> fencelock_statemachine::HolderValue {
    let bytes = match i % 4 {
        0 | 1 => Vec::new(),
        2 => b"10.0.0.1:7000".to_vec(),
        _ => vec![b'v'; fencelock_statemachine::limits::MAX_HOLDER_VALUE_BYTES],
    };
    fencelock_statemachine::HolderValue::new(bytes).expect("within the limit")
}

impl Op {
    /// The state machine command this op describes.
    pub fn command(&self) -> Command {
        match self.clone() {
            Op::Acquire {
                resource: r,
                owner: o,
                request,
                lease: l,
                ttl_ms,
                wait_ms,
            } => Command::Acquire {
                resource: resource(r),
                owner: owner(o),
                request_id: RequestId::new(format!("req-{request}")).expect("short id"),
                lease_id: lease(l),
                lease_ttl_ms: ttl_ms,
                wait_timeout_ms: wait_ms,
                value: value_of(request),
                mode: mode_of(request),
            },
            Op::Proclaim {
                resource: r,
                owner: o,
                lease: l,
                value,
            } => Command::Proclaim {
                resource: resource(r),
                owner: owner(o),
                lease_id: lease(l),
                value: value_of(value),
            },
            Op::Renew {
                resource: r,
                owner: o,
                lease: l,
                ttl_ms,
            } => Command::Renew {
                resource: resource(r),
                owner: owner(o),
                lease_id: lease(l),
                lease_ttl_ms: ttl_ms,
            },
            Op::RenewBatch { owner: o, items } => Command::RenewBatch {
                owner: owner(o),
                items: items
                    .into_iter()
                    .map(|(r, l, ttl_ms)| RenewItem {
                        resource: resource(r),
                        lease_id: lease(l),
                        lease_ttl_ms: ttl_ms,
                    })
                    .collect(),
            },
            Op::Release {
                resource: r,
                owner: o,
                lease: l,
            } => Command::Release {
                resource: resource(r),
                owner: owner(o),
                lease_id: lease(l),
            },
            Op::Cancel {
                resource: r,
                lease: l,
                attempt,
            } => Command::Cancel {
                resource: resource(r),
                lease_id: lease(l),
                attempt,
            },
            Op::Tick => Command::Tick,
            Op::LeaderChanged { allowance_ms } => Command::LeaderChanged {
                clock_offset_allowance_ms: allowance_ms,
            },
            Op::Export { migration, slots } => Command::ExportSlots {
                migration_id: migration,
                slots,
            },
            Op::Import {
                migration,
                epoch,
                slots,
                data,
                allowance_ms,
                export_clock_ms,
            } => Command::ImportSlots {
                migration_id: migration,
                epoch,
                slots,
                data,
                clock_offset_allowance_ms: allowance_ms,
                export_clock_ms,
            },
            Op::DropExport { migration } => Command::DropExport {
                migration_id: migration,
            },
        }
    }
}

/// Lease times around the limits' edges.
fn ttl(input: &mut Input, l: &Limits) -> u64 {
    input.pick_or_raw(&[
        0,
        l.min_lease_ttl_ms,
        l.min_lease_ttl_ms.saturating_sub(1),
        10_000,
        l.max_lease_ttl_ms,
        l.max_lease_ttl_ms.saturating_add(1),
        u64::MAX,
    ])
}

fn wait(input: &mut Input, l: &Limits) -> u64 {
    input.pick_or_raw(&[
        0,
        0,
        1_000,
        l.max_wait_timeout_ms,
        l.max_wait_timeout_ms.saturating_add(1),
        u64::MAX,
    ])
}

/// Slots of some pool resources, sometimes plus one raw slot, or all.
fn slots(input: &mut Input) -> SlotSet {
    let mask = input.u8();
    if mask == 0xff {
        return SlotSet::full();
    }
    let mut set: SlotSet = (0..RESOURCES.len())
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| fencelock_statemachine::slot_of(&resource(i)))
        .collect();
    if mask & 0x80 != 0 {
        set.insert(u32::from(input.u16()) % fencelock_statemachine::SLOT_COUNT);
    }
    set
}

/// What the run remembers between steps to build better inputs.
struct Memory {
    /// Exports this run produced: importing them is the useful case.
    exports: Vec<Vec<u8>>,
}

fn op(input: &mut Input, l: &Limits, memory: &Memory, epoch: u64) -> Op {
    let allowance = |input: &mut Input| input.pick_or_raw(&[0, 500, 60_000, 60_001]);
    match input.u8() % 14 {
        0..=3 => Op::Acquire {
            resource: input.below(RESOURCES.len()),
            owner: input.below(OWNERS.len()),
            request: input.below(REQUEST_IDS),
            lease: input.u8() % LEASE_IDS,
            ttl_ms: ttl(input, l),
            wait_ms: wait(input, l),
        },
        4 | 5 => Op::Renew {
            resource: input.below(RESOURCES.len()),
            owner: input.below(OWNERS.len()),
            lease: input.u8() % LEASE_IDS,
            ttl_ms: ttl(input, l),
        },
        6 => {
            let owner = input.below(OWNERS.len());
            let n = input.below(5);
            let items = (0..n)
                .map(|_| {
                    (
                        input.below(RESOURCES.len()),
                        input.u8() % LEASE_IDS,
                        ttl(input, l),
                    )
                })
                .collect();
            Op::RenewBatch { owner, items }
        }
        7 | 8 => Op::Release {
            resource: input.below(RESOURCES.len()),
            owner: input.below(OWNERS.len()),
            lease: input.u8() % LEASE_IDS,
        },
        9 => Op::Cancel {
            resource: input.below(RESOURCES.len()),
            lease: input.u8() % LEASE_IDS,
            // Mostly the first or second attempt (the ones that can
            // match), sometimes anything.
            attempt: match input.u8() % 4 {
                0 | 1 => 1,
                2 => 2,
                _ => input.u8().into(),
            },
        },
        10 => Op::LeaderChanged {
            allowance_ms: allowance(input),
        },
        11 => Op::Export {
            migration: u64::from(input.u8() % 6),
            slots: slots(input),
        },
        12 => {
            let data = match input.u8() % 4 {
                0 => input.bytes(64).to_vec(),
                n => memory
                    .exports
                    .get(usize::from(n) % memory.exports.len().max(1))
                    .cloned()
                    .unwrap_or_default(),
            };
            Op::Import {
                migration: u64::from(input.u8() % 6),
                epoch: input.pick_or_raw(&[
                    epoch,
                    epoch.saturating_add(1),
                    epoch.saturating_add(2),
                    MAX_EPOCH,
                    0,
                ]),
                slots: slots(input),
                data,
                allowance_ms: allowance(input),
                // None (the older form), near the fuzzed clock either way,
                // or anything at all.
                export_clock_ms: match input.u8() % 4 {
                    0 => None,
                    1 => Some(T0.saturating_add(u64::from(input.u16()) * 100)),
                    2 => Some(T0.saturating_sub(u64::from(input.u16()) * 100)),
                    _ => Some(input.u64()),
                },
            }
        }
        _ => match input.u8() % 4 {
            0 => Op::DropExport {
                migration: u64::from(input.u8() % 6),
            },
            1 => Op::Proclaim {
                resource: input.below(RESOURCES.len()),
                owner: input.below(OWNERS.len()),
                lease: input.u8() % LEASE_IDS,
                value: input.below(4),
            },
            _ => Op::Tick,
        },
    }
}

/// Moves the log position for the next step.
fn advance(input: &mut Input, ctx: &mut ApplyContext) {
    let how = input.u8();
    match how & 0b11 {
        0 | 1 => ctx.index = ctx.index.saturating_add(1),
        2 => {} // coalesced into the previous entry
        _ => match input.u8() % 4 {
            0 => ctx.index = ctx.index.saturating_sub(u64::from(input.u8())),
            1 => ctx.index = u64::from(input.u64() == 0),
            _ => ctx.index = ctx.index.saturating_add(u64::from(input.u16())),
        },
    }
    match (how >> 2) & 0b111 {
        0..=3 => ctx.now_ms = ctx.now_ms.saturating_add(u64::from(input.u8()) * 250),
        4 => ctx.now_ms = ctx.now_ms.saturating_add(u64::from(input.u16()) * 1_000),
        5 => ctx.now_ms = ctx.now_ms.saturating_sub(u64::from(input.u16()) * 100),
        6 => {}
        _ => ctx.now_ms = input.u64(),
    }
    if how & 0x20 != 0 {
        ctx.term = match input.u8() % 8 {
            0 => ctx.term.saturating_sub(1),
            _ => ctx.term.saturating_add(1),
        };
    }
    if how & 0x40 != 0 {
        ctx.epoch = match input.u8() % 8 {
            0 => ctx.epoch.saturating_sub(1),
            1 => input.u64(),
            _ => ctx.epoch.saturating_add(1),
        };
    }
}

/// The target: see the module documentation.
pub fn lock_table_apply(data: &[u8]) {
    // FENCELOCK_FUZZ_TRACE=1 prints every step (to read a saved input).
    let trace = std::env::var_os("FENCELOCK_FUZZ_TRACE").is_some();
    let mut input = Input::new(data);
    let limits = limits(&mut input);
    let mut table = LockTable::new(limits.clone()).expect("limits validated");
    let mut ctx = ApplyContext {
        index: 0,
        term: 1,
        epoch: 1,
        now_ms: T0,
    };
    let mut memory = Memory {
        exports: Vec::new(),
    };
    let mut log: Vec<(Command, ApplyContext)> = Vec::new();
    let mut highest_grant = FencingToken::NONE;
    // Most inputs should get past the first LeaderChanged to reach the
    // interesting states; the first byte's top bit says whether to skip it.
    let mut first = data
        .first()
        .is_some_and(|b| b & 0x80 == 0)
        .then_some(Op::LeaderChanged { allowance_ms: 0 });
    while !input.is_empty() && log.len() < MAX_STEPS {
        advance(&mut input, &mut ctx);
        let op = first
            .take()
            .unwrap_or_else(|| op(&mut input, &limits, &memory, ctx.epoch));
        let command = op.command();
        let outcome = table.apply(&command, &ctx);
        if trace {
            eprintln!("{ctx:?}\n  {command:?}\n  -> {outcome:?}");
        }
        log.push((command, ctx));
        check_table(&table);

        let mut grants: Vec<FencingToken> = outcome
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Granted { token, .. } => Some(*token),
                _ => None,
            })
            .collect();
        match &outcome.reply {
            Ok(Reply::Acquire(a)) if !a.deduplicated => {
                if let AcquireStatus::Held { token, .. } = a.status {
                    grants.push(token);
                }
            }
            Ok(Reply::Exported { data, .. }) => memory.exports.push(data.clone()),
            _ => {}
        }
        // A direct grant shows in the reply and as an event: count it once.
        grants.sort();
        grants.dedup();
        for token in grants {
            assert!(
                token > highest_grant,
                "grant {token} not above earlier grant {highest_grant} at {ctx:?}"
            );
            highest_grant = token;
        }

        let bytes = table.snapshot();
        let restored = match LockTable::restore(&bytes) {
            Ok(t) => t,
            Err(e) => panic!("snapshot of a live table does not restore: {e}"),
        };
        assert_eq!(restored, table, "restored table differs");
        assert_eq!(restored.snapshot(), bytes, "snapshot not stable");
        if input.u8().is_multiple_of(16) {
            // Carry on from the restored copy, as a replica that installed
            // the snapshot would.
            table = restored;
        }
    }
    let mut replay = LockTable::new(limits).expect("limits validated");
    for (command, ctx) in &log {
        replay.apply(command, ctx);
    }
    assert_eq!(
        replay.snapshot(),
        table.snapshot(),
        "replaying the log gave a different table"
    );
}
