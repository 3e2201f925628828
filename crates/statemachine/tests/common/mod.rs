//! A shard replica driven by hand, for the state-machine tests that need
//! only one table (tests/values.rs, tests/modes.rs): one entry per
//! command, term 1, the table's own epoch. After every command the command
//! must survive its log encoding and (unless `check_each_step` is off) the
//! table its invariants and its snapshot round trip.

use fencelock_statemachine::*;

pub const T0: u64 = 1_700_000_000_000;

pub struct Shard {
    pub table: LockTable,
    pub index: u64,
    pub now_ms: u64,
    /// Check the invariants and round-trip the snapshot after every
    /// command (off for a test that fills a table to a budget: that would
    /// walk and encode the whole table once per command).
    pub check_each_step: bool,
}

impl Shard {
    /// A shard owning every slot.
    pub fn new() -> Shard {
        Shard::with_slots(SlotSet::full())
    }

    pub fn with_slots(slots: SlotSet) -> Shard {
        Shard::of(LockTable::with_slots(Limits::default(), slots).unwrap())
    }

    #[allow(dead_code)] // not every test file needs other limits
    pub fn with_limits(limits: Limits) -> Shard {
        Shard::of(LockTable::new(limits).unwrap())
    }

    /// `table` at `T0`, its leader ready.
    fn of(table: LockTable) -> Shard {
        let mut s = Shard {
            table,
            index: 0,
            now_ms: T0,
            check_each_step: true,
        };
        s.apply(Command::LeaderChanged {
            clock_offset_allowance_ms: 0,
        })
        .unwrap();
        s
    }

    pub fn apply_full(&mut self, c: Command) -> Outcome {
        self.index += 1;
        let ctx = ApplyContext {
            index: self.index,
            term: 1,
            epoch: self.table.epoch().max(1),
            now_ms: self.now_ms,
        };
        let out = self.table.apply(&c, &ctx);
        assert_eq!(Command::decode(&c.encode()), Ok(c));
        if self.check_each_step {
            assert_eq!(self.table.check_invariants(), Ok(()));
            let restored = LockTable::restore(&self.table.snapshot()).unwrap();
            assert_eq!(restored.snapshot(), self.table.snapshot());
        }
        out
    }

    pub fn apply(&mut self, c: Command) -> Result<Reply, LockError> {
        self.apply_full(c).reply
    }

    /// Moves `res`'s slot from this shard to a new one (epoch 9), with the
    /// migration's two commands; returns the target.
    pub fn move_slot_of(&mut self, res: &str) -> Shard {
        let mut moved = SlotSet::default();
        moved.insert(slot_of(&name(res)));
        let data = match self.apply(Command::ExportSlots {
            migration_id: 1,
            slots: moved,
        }) {
            Ok(Reply::Exported { data, .. }) => data,
            other => panic!("{other:?}"),
        };
        let mut target = Shard::with_slots(SlotSet::default());
        target
            .apply(Command::ImportSlots {
                migration_id: 1,
                epoch: 9,
                slots: moved,
                data,
                clock_offset_allowance_ms: 0,
                export_clock_ms: None,
            })
            .unwrap();
        target
    }
}

pub fn name(s: &str) -> ResourceName {
    ResourceName::parse(s).unwrap()
}

/// The version a table's snapshot is written in.
pub fn snapshot_version(table: &LockTable) -> u16 {
    let bytes = table.snapshot();
    u16::from_be_bytes([bytes[4], bytes[5]])
}
