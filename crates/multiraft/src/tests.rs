//! Store-loop unit tests on one node over an in-memory engine, driven one
//! [`Store::step`] at a time with a clock the test advances.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_statemachine::{Command, LeaseId, Owner, ResourceName};
use fencelock_storage::MemEngine;

use super::audit::AuditLog;
use super::metrics::StoreHandles;
use fencelock_placement::META_SHARD_ID;
use fencelock_router::Router;
use fencelock_storage::WriteBatch;
use raft::prelude::{Entry, Message};
use tokio::sync::oneshot;

use super::*;
use crate::replica::Peer;

thread_local! {
    /// The staging [`staged_or_die`] is told was refused (this thread only).
    static REFUSE: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// A refusal for the staging of `what`, if a test armed one.
pub(super) fn refusal(what: &str) -> Option<fencelock_storage::Error> {
    let armed = REFUSE.with(Cell::get)?;
    (armed == what).then(|| fencelock_storage::Error::InvalidState {
        shard_id: 0,
        reason: format!("the test refuses {what}"),
    })
}

struct TestClock {
    base: Instant,
    ms: AtomicU64,
}

impl Clock for TestClock {
    fn wall_ms(&self) -> u64 {
        1_700_000_000_000 + self.ms.load(Ordering::Relaxed)
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.ms.load(Ordering::Relaxed))
    }
}

struct NullSink;

impl PeerSink for NullSink {
    fn send(&self, _to: u64, _envelopes: Vec<Envelope>) {}
    fn add_peer(&self, _node_id: u64, _addr: &str) {}
}

/// The apply path relies on committed entries following the applied index
/// without a hole; it checks that where it applies them and stops with
/// both numbers if not.
#[test]
fn a_gap_between_the_applied_index_and_the_next_committed_entry_stops_the_store() {
    let mut node = OneNode::start();
    node.propose_entry();
    let applied = node.data().applied_index;
    let gap = Entry {
        index: applied + 2,
        term: node.data().applied_term,
        ..Default::default()
    };
    let store = &mut node.store;
    let peer = store.peers.get_mut(&DATA_SHARD).expect("the data shard");
    let mut batch = WriteBatch::new();
    let mut obs = crate::observe::ApplyObs {
        metrics: &mut store.obs.metrics,
        audit: &store.obs.audit,
        clock: store.time.as_ref(),
        committed_at: Instant::now(),
        #[cfg(feature = "simulation")]
        sim_fault: None,
    };
    let panic = catch_unwind(AssertUnwindSafe(|| {
        crate::apply::apply_entries(peer, vec![gap], &mut batch, &mut obs)
    }))
    .expect_err("applying across a gap must stop the store");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "committed entry {} does not follow the applied index {applied}",
            applied + 2
        )),
        "{message}"
    );
}

/// The data shard of the one-node cluster (shard 0 is the meta shard).
const DATA_SHARD: u64 = 1;

struct OneNode {
    store: Store,
    clock: Arc<TestClock>,
}

impl OneNode {
    /// A one-node cluster (meta shard and one data shard, one replica
    /// each) whose shards lead and are ready.
    fn start() -> OneNode {
        let mut config = StoreConfig::for_test(1, [(1, "10.0.0.1:7000")]);
        config.shard_count = 1;
        config.replication_factor = 1;
        // Below what a config file may say: snapshots (and compactions, 5
        // entries behind them) come quickly here.
        config.raft.snapshot_interval_entries = 10;
        let clock = Arc::new(TestClock {
            base: Instant::now(),
            ms: AtomicU64::new(0),
        });
        let io = StoreIo {
            engine: Arc::new(MemEngine::new()),
            sink: Arc::new(NullSink),
            clock: clock.clone(),
            fixed_election_timeout: true,
            write_mode: WriteMode::Inline,
        };
        let (_tx, inbox) = crossbeam_channel::unbounded();
        let router = Arc::new(Router::new(config.peer_map()));
        let obs = Observers {
            metrics: StoreHandles::register(&prometheus::Registry::new()).locals(),
            audit: AuditLog::disabled(),
        };
        let store = Store::open_with(config, io, inbox, Arc::default(), router, obs)
            .expect("the store opens");
        let mut node = OneNode { store, clock };
        for _ in 0..100 {
            node.tick();
            if node.store.peers.values().all(Peer::is_ready_leader) {
                return node;
            }
        }
        panic!("the one-node shards did not become ready leaders");
    }

    fn tick(&mut self) {
        let ms = self.store.config.raft.tick_interval_ms;
        self.clock.ms.fetch_add(ms, Ordering::Relaxed);
        self.store.step(Vec::new(), true);
    }

    fn step(&mut self, msg: StoreMsg) {
        self.store.step(vec![msg], false);
    }

    /// One entry on the data shard (a renew of nothing: refused, applied).
    fn propose_entry(&mut self) {
        let msg = Self::entry();
        self.step(msg);
    }

    fn entry() -> StoreMsg {
        Self::answered_entry().0
    }

    /// [`OneNode::entry`] with the receiver of its answer.
    fn answered_entry() -> (StoreMsg, oneshot::Receiver<ReplyResult>) {
        let (tx, rx) = oneshot::channel();
        let msg = StoreMsg::Propose {
            shard_id: DATA_SHARD,
            command: Command::Renew {
                resource: ResourceName::parse("unit/entry").expect("valid"),
                owner: Owner::anonymous(),
                lease_id: LeaseId([7; 16]),
                lease_ttl_ms: 1_000,
            },
            responder: Responder::Reply(tx),
            caller: None,
        };
        (msg, rx)
    }

    fn data(&self) -> &Peer {
        &self.store.peers[&DATA_SHARD]
    }
}

/// Runs `f` with the staging of `what` refused; returns the panic message,
/// if `f` panicked.
fn with_refusal(what: &'static str, f: impl FnOnce()) -> Option<String> {
    REFUSE.with(|r| r.set(Some(what)));
    let result = catch_unwind(AssertUnwindSafe(f));
    REFUSE.with(|r| r.set(None));
    let payload = result.err()?;
    Some(
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    )
}

#[test]
fn a_refused_hard_state_entries_or_applied_index_stops_the_node() {
    for what in ["the hard state", "log entries", "the applied index"] {
        let mut node = OneNode::start();
        let panic = with_refusal(what, || node.propose_entry());
        let message = panic.unwrap_or_else(|| panic!("refusing {what} did not stop the node"));
        assert!(message.contains(what), "{what}: {message}");
    }
}

#[test]
fn a_refused_snapshot_or_compaction_stops_the_node() {
    for what in ["a snapshot", "a log compaction"] {
        let mut node = OneNode::start();
        let panic = with_refusal(what, || {
            // Past the interval of 10 and past the entries kept behind a
            // snapshot (5): a snapshot and a compaction are due.
            for _ in 0..30 {
                node.propose_entry();
            }
        });
        let message = panic.unwrap_or_else(|| panic!("refusing {what} did not stop the node"));
        assert!(message.contains(what), "{what}: {message}");
    }
}

#[test]
fn a_configuration_change_raft_applied_is_never_answered_as_failed() {
    let mut node = OneNode::start();
    let (tx, mut rx) = oneshot::channel();
    let change = StoreMsg::ChangeMembership {
        shard_id: DATA_SHARD,
        change: MembershipChange::AddLearner,
        node_id: 2,
        tx,
    };
    let panic = with_refusal("a configuration", || node.step(change));
    // Either the node stopped, or the change did not happen: never an
    // error answered for a change raft-rs applied.
    let learners = node.store.peers[&DATA_SHARD]
        .raw
        .raft
        .prs()
        .conf()
        .to_conf_state()
        .learners;
    let answer = rx.try_recv();
    assert!(
        panic.is_some(),
        "the staging was refused and the node went on: answer {answer:?}, learners {learners:?}"
    );
}

#[test]
fn a_refused_configuration_change_is_answered_and_changes_nothing() {
    let mut node = OneNode::start();
    // Removing the only voter: raft-rs refuses it before changing anything.
    let (tx, mut rx) = oneshot::channel();
    node.step(StoreMsg::ChangeMembership {
        shard_id: DATA_SHARD,
        change: MembershipChange::Remove,
        node_id: 1,
        tx,
    });
    let answer = rx.try_recv().expect("answered at apply");
    assert!(answer.is_err(), "{answer:?}");
    let voters = node.store.peers[&DATA_SHARD]
        .raw
        .raft
        .prs()
        .conf()
        .to_conf_state()
        .voters;
    assert_eq!(voters, vec![1]);
    node.propose_entry();
    node.tick();
    assert!(node.store.peers[&DATA_SHARD].is_ready_leader());
}

/// A shard without a ready in the iteration that writes its deferred
/// snapshot and compaction must see them before raft-rs reads its storage.
///
/// The data shard has a learner (node 2, never running: what it is sent
/// is dropped) that needs a snapshot. One iteration applies an entry that
/// makes the shard save a snapshot and compact its log into the deferred
/// batch, and ends there (its second round, with nothing to do, would
/// have written that batch at once). The next iteration has work only for
/// the meta shard: it writes the batch, the data shard has no ready. Then
/// the learner's heartbeat response arrives, and raft-rs, answering it,
/// reads the data shard's storage for the snapshot to send (`term`,
/// `snapshot`). Before every written shard was marked persisted, that read
/// found the old snapshot's metadata replaced on disk and raft-rs stopped
/// the node.
#[test]
fn a_learner_is_sent_the_snapshot_a_ready_less_iteration_wrote() {
    let mut node = OneNode::start();
    let (tx, mut rx) = oneshot::channel();
    node.step(StoreMsg::ChangeMembership {
        shard_id: DATA_SHARD,
        change: MembershipChange::AddLearner,
        node_id: 2,
        tx,
    });
    assert!(matches!(rx.try_recv(), Ok(Ok(()))), "the learner was added");
    // Past the first snapshots and compactions, so the log is truncated.
    for _ in 0..25 {
        node.propose_entry();
    }
    // An iteration's first round only: entries until one of them makes the
    // shard take a snapshot (frozen, encoded at once in this mode, and
    // staged into the deferred batch with a compaction behind it when
    // collected).
    let before = node.data().last_snapshot_index;
    for _ in 0..20 {
        node.store.handle(OneNode::entry());
        node.store.collect_writes();
        node.store.flush_proposals();
        assert!(node.store.process_readies(), "the entry made a ready");
        node.store.collect_snapshots();
        if node.data().last_snapshot_index > before {
            break;
        }
        // Not yet: the rest of that iteration writes what it staged and
        // handles the landing.
        for _ in 0..4 {
            node.store.hand_over_write();
            node.store.collect_writes();
            node.store.process_readies();
        }
    }
    let taken = node.data().last_snapshot_index;
    assert!(taken > before, "a snapshot was staged");
    assert!(node.data().raw.store().has_staged());
    // The next iteration: only the meta shard has work (a read).
    let (tx, _read) = oneshot::channel();
    node.step(StoreMsg::Read {
        shard_id: META_SHARD_ID,
        resource: ResourceName::parse("unit/read").expect("valid"),
        tx,
    });
    // The learner answers a heartbeat: raft-rs sends it a snapshot, read
    // from the storage.
    let term = node.data().raw.raft.term;
    let mut msg = Message::default();
    msg.set_msg_type(raft::prelude::MessageType::MsgHeartbeatResponse);
    msg.from = 2;
    msg.to = 1;
    msg.term = term;
    node.step(StoreMsg::Raft {
        envelopes: vec![Envelope {
            shard_id: DATA_SHARD,
            msg,
        }],
    });
    let learner = node.data().raw.raft.prs().get(2).expect("learner progress");
    assert_eq!(
        learner.state,
        raft::ProgressState::Snapshot,
        "the learner is being sent the snapshot"
    );
    assert_eq!(learner.pending_snapshot, taken);
    assert_eq!(
        node.data().raw.store().snapshot_info().map(|s| s.index),
        Some(taken),
        "the written snapshot is what the storage shows"
    );
}

/// A disk whose writes wait while the gate is closed.
struct GatedEngine {
    inner: MemEngine,
    closed: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    /// Every write panics (a bug in the engine, say).
    panic_on_write: std::sync::atomic::AtomicBool,
}

impl GatedEngine {
    fn set_closed(&self, closed: bool) {
        *self.closed.lock().expect("gate") = closed;
        self.opened.notify_all();
    }
}

impl fencelock_storage::Engine for GatedEngine {
    fn get(
        &self,
        cf: fencelock_storage::Cf,
        key: &[u8],
    ) -> fencelock_storage::Result<Option<Vec<u8>>> {
        self.inner.get(cf, key)
    }

    fn write(&self, batch: &WriteBatch, sync: bool) -> fencelock_storage::Result<()> {
        assert!(
            !self.panic_on_write.load(Ordering::Relaxed),
            "the engine panics"
        );
        let mut closed = self.closed.lock().expect("gate");
        while *closed {
            closed = self.opened.wait(closed).expect("gate");
        }
        drop(closed);
        self.inner.write(batch, sync)
    }

    fn iterate(
        &self,
        cf: fencelock_storage::Cf,
        start: &[u8],
        end: &[u8],
        f: &mut fencelock_storage::engine::IterCallback<'_>,
    ) -> fencelock_storage::Result<()> {
        self.inner.iterate(cf, start, end, f)
    }
}

/// A one-node cluster's store on a [`GatedEngine`], writing on its writer
/// thread, to run with [`Store::run`].
fn threaded_one_node(
    inbox: crossbeam_channel::Receiver<StoreMsg>,
    status: Arc<std::sync::Mutex<Vec<crate::ShardStatus>>>,
) -> (Store, Arc<GatedEngine>) {
    let mut config = StoreConfig::for_test(1, [(1, "10.0.0.1:7000")]);
    config.shard_count = 1;
    config.replication_factor = 1;
    let engine = Arc::new(GatedEngine {
        inner: MemEngine::new(),
        closed: std::sync::Mutex::new(false),
        opened: std::sync::Condvar::new(),
        panic_on_write: std::sync::atomic::AtomicBool::new(false),
    });
    let io = StoreIo {
        engine: engine.clone(),
        sink: Arc::new(NullSink),
        clock: Arc::new(SystemClock),
        fixed_election_timeout: true,
        write_mode: WriteMode::Thread,
    };
    let router = Arc::new(Router::new(config.peer_map()));
    let obs = Observers {
        metrics: StoreHandles::register(&prometheus::Registry::new()).locals(),
        audit: AuditLog::disabled(),
    };
    let store = Store::open_with(config, io, inbox, status, router, obs).expect("the store opens");
    (store, engine)
}

/// A writer thread that panics inside a write stops the node like a failed
/// write (the loop does not wait for a landing that never comes).
#[test]
fn a_panic_in_the_writer_thread_stops_the_loop() {
    let (tx, inbox) = crossbeam_channel::bounded(64);
    let (store, engine) = threaded_one_node(inbox, Arc::default());
    // Every write from now on panics on the writer thread.
    engine.panic_on_write.store(true, Ordering::Relaxed);
    let looping = std::thread::spawn(move || store.run());
    let _ = tx.send(OneNode::entry());
    let stopped = looping.join().expect_err("the loop stops");
    let message = (stopped.downcast_ref::<String>().cloned()).unwrap_or_default();
    assert!(
        message.contains("writer thread panicked"),
        "stopped with: {message}"
    );
}

/// Back-pressure (docs/architecture.md, "The write path"): while the disk
/// holds a write, the loop stages the next batch; once that batch is over
/// its limit the loop waits for the disk instead of taking more, so its
/// bounded inbox fills (the server answers SERVER_BUSY) rather than the
/// node's memory growing. When the disk comes back, every request queued
/// is answered.
#[test]
fn a_stalled_disk_fills_the_inbox_instead_of_memory_and_everything_is_answered_after() {
    const INBOX: usize = 8;
    let (tx, inbox) = crossbeam_channel::bounded(INBOX);
    let status: Arc<std::sync::Mutex<Vec<crate::ShardStatus>>> = Arc::default();
    let (mut store, engine) = threaded_one_node(inbox, status.clone());
    // One entry's worth: the second batch staged behind a write in flight
    // is already over it.
    store.writes.max_staged_bytes = 1;
    let looping = std::thread::spawn(move || store.run());
    let ready = Instant::now();
    let all_lead = |s: &[crate::ShardStatus]| !s.is_empty() && s.iter().all(|s| s.is_leader);
    while !all_lead(&status.lock().expect("status")) {
        assert!(ready.elapsed() < Duration::from_secs(20), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }

    engine.set_closed(true);
    let mut answers = Vec::new();
    let mut refused = 0;
    for _ in 0..(INBOX * 8) {
        let (msg, rx) = OneNode::answered_entry();
        match tx.try_send(msg) {
            Ok(()) => answers.push(rx),
            Err(crossbeam_channel::TrySendError::Full(_)) => refused += 1,
            Err(e) => panic!("the loop is gone: {e}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        refused > 0,
        "the inbox never filled: the loop kept taking requests behind a stalled disk"
    );
    assert!(
        answers.len() <= INBOX + 3,
        "{} requests taken",
        answers.len()
    );

    engine.set_closed(false);
    for mut rx in answers {
        let started = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(answer) => {
                    // Applied: the renew of a lease nobody holds is
                    // refused by the table, not by the store.
                    assert!(
                        matches!(answer, Ok(_) | Err(StoreError::Lock(_))),
                        "answered as applied: {answer:?}"
                    );
                    break;
                }
                Err(oneshot::error::TryRecvError::Empty) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(20),
                        "never answered"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("dropped unanswered: {e}"),
            }
        }
    }
    let _ = tx.send(StoreMsg::Shutdown);
    looping.join().expect("the loop stops cleanly");
}

impl OneNode {
    /// An acquire of a resource of its own on the data shard: each one
    /// adds a record and a remembered acquire to the table.
    fn acquire_entry(i: u32) -> StoreMsg {
        let (tx, _rx) = oneshot::channel();
        StoreMsg::Propose {
            shard_id: DATA_SHARD,
            command: Command::Acquire {
                resource: ResourceName::parse(&format!("unit/r{i}")).expect("valid"),
                owner: Owner::anonymous(),
                request_id: fencelock_statemachine::RequestId::new(format!("q{i}")).expect("ok"),
                lease_id: LeaseId([(i % 250) as u8 + 1; 16]),
                lease_ttl_ms: 60_000,
                wait_timeout_ms: 0,
                value: Default::default(),
                mode: Default::default(),
            },
            responder: Responder::Reply(tx),
            caller: None,
        }
    }

    /// One round of an iteration that leaves encoded snapshots where the
    /// snapshot thread put them (as if it were still encoding).
    fn round_without_snapshots(&mut self) {
        self.store.collect_writes();
        self.store.flush_proposals();
        self.store.process_readies();
        self.store.hand_over_write();
        self.store.collect_writes();
    }

    /// Acquires until the data shard starts a snapshot; returns the bytes
    /// its table encoded to at that moment.
    fn until_a_snapshot_starts(&mut self, first: u32) -> Vec<u8> {
        for i in first..first + 40 {
            self.store.handle(OneNode::acquire_entry(i));
            for _ in 0..4 {
                self.round_without_snapshots();
                if self.data().snapshot_in_flight.is_some() {
                    return self.data().table.snapshot();
                }
            }
        }
        panic!("no snapshot started in 40 entries (interval 10)");
    }
}

/// Issue 19, item 3: the loop freezes the table and goes on; the bytes
/// saved when the encoding comes back are the table as it was frozen, not
/// as it is by then, and one snapshot per replica is in flight at a time.
#[test]
fn a_snapshot_encoded_off_the_loop_saves_the_table_as_it_was_frozen() {
    let mut node = OneNode::start();
    let before = node.data().last_snapshot_index;
    let at_freeze = node.until_a_snapshot_starts(0);
    let in_flight = node.data().snapshot_in_flight.expect("started");
    // The table moves on, past another interval, while it is encoded.
    for i in 100..125 {
        node.store.handle(OneNode::acquire_entry(i));
        node.round_without_snapshots();
    }
    assert!(node.data().applied_index > in_flight.index + 10);
    assert_eq!(
        node.data().snapshot_in_flight,
        Some(in_flight),
        "one at a time"
    );
    assert_eq!(node.data().last_snapshot_index, before, "nothing saved yet");
    assert!(node.store.collect_snapshots());
    assert_eq!(node.data().last_snapshot_index, in_flight.index);
    assert_eq!(node.data().snapshot_in_flight, None);
    node.store.flush_deferred();
    let saved = (node.data().raw.store().state_machine_snapshot())
        .expect("readable")
        .expect("a snapshot");
    assert_eq!(saved.get_metadata().index, in_flight.index);
    let (table, _) = decode_state(saved.get_data()).expect("decodes");
    assert_eq!(table.snapshot(), at_freeze, "the table as frozen");
    assert_ne!(
        node.data().table.snapshot(),
        at_freeze,
        "the table moved on"
    );
    // And the next one starts at once: it was due long ago.
    node.store.handle(OneNode::acquire_entry(200));
    node.round_without_snapshots();
    assert!(node.data().snapshot_in_flight.is_some());
}

/// An encoding that comes back to a replica created anew since (its
/// predecessor's bytes), or after a newer snapshot was staged meanwhile
/// (a leader's, not yet durable), is dropped: neither saved over the
/// newer state nor fatal.
#[test]
fn a_snapshot_that_comes_back_stale_is_dropped_not_saved() {
    let mut node = OneNode::start();
    let before = node.data().last_snapshot_index;
    node.until_a_snapshot_starts(0);
    // A replica created anew has nothing in flight.
    node.store
        .peers
        .get_mut(&DATA_SHARD)
        .expect("data shard")
        .snapshot_in_flight = None;
    assert!(node.store.collect_snapshots());
    assert_eq!(node.data().last_snapshot_index, before, "not saved");

    let at = node.data().last_snapshot_index;
    node.until_a_snapshot_starts(300);
    let in_flight = node.data().snapshot_in_flight.expect("started");
    for i in 400..405 {
        node.store.handle(OneNode::acquire_entry(i));
        node.round_without_snapshots();
    }
    // A newer snapshot is staged before the encoding comes back.
    let store = &mut node.store;
    let peer = store.peers.get_mut(&DATA_SHARD).expect("data shard");
    let newer = peer.applied_index;
    assert!(newer > in_flight.index && in_flight.index > at);
    let cs = peer.raw.raft.prs().conf().to_conf_state();
    let data = encode_state(&peer.table, None);
    let staged = peer.raw.mut_store().save_state_machine_snapshot(
        newer,
        peer.applied_term,
        &cs,
        &data,
        &mut store.deferred,
    );
    assert_eq!(staged.map_err(|e| e.to_string()), Ok(()));
    assert!(node.store.collect_snapshots());
    assert_eq!(node.data().snapshot_in_flight, None);
    node.store.flush_deferred();
    let saved = node.data().raw.store().snapshot_info().expect("a snapshot");
    assert_eq!(saved.index, newer, "the newer snapshot stays");
}
