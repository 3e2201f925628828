//! Watches: a replica's recent changes, streamed to subscribers on its node.
//!
//! Every replica records, at apply, the changes of its shard's resources
//! (a grant, a value replaced, a lease ended) in a bounded log, each under
//! its [`Revision`]: the shard's epoch, the entry's log index and the
//! change's place in that entry. Apply is the same on every replica, so
//! every replica that applied an entry records the same changes under the
//! same revisions, and a watcher can resume on any replica of the shard
//! (after a leader change, a restart of its node) from the last revision it
//! saw: it gets the changes after it, never one twice, in order. Revisions
//! only rise for a resource, across slot moves too (the importing shard's
//! epoch is above every epoch the source had).
//!
//! When the log no longer reaches back to the watcher's revision (evicted,
//! or the replica restarted or installed a snapshot since), the watcher
//! gets the resource's state now, marked as a gap, instead of the changes
//! it missed (etcd answers "compacted" in that case; a lock's state is
//! small enough to send whole).
//!
//! Bounded: [`WATCH_LOG_EVENTS`] and [`WATCH_LOG_BYTES`] per shard,
//! [`WATCH_BUFFER_EVENTS`] per watcher (a watcher that falls further
//! behind is cut with [`WatchEnd::TooSlow`]), [`MAX_WATCHERS_PER_NODE`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use fencelock_statemachine::{
    Event, FencingToken, HolderValue, LeaseEnd, LockTable, LockView, ResourceName,
};
use tokio::sync::mpsc;

/// Changes one shard's replica keeps for resuming watchers.
pub const WATCH_LOG_EVENTS: usize = 4_096;
/// Bytes of values the change log of one shard keeps at most (values are
/// what can make a change large).
pub const WATCH_LOG_BYTES: usize = 4 << 20;
/// Changes queued for one watcher before it counts as too slow and is cut.
pub const WATCH_BUFFER_EVENTS: usize = 256;
/// Watchers one node serves at once.
pub const MAX_WATCHERS_PER_NODE: usize = 10_000;

/// Where a change sits in a shard's history: ordered by epoch, then log
/// index, then its place among the changes of that entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    pub epoch: u64,
    pub index: u64,
    pub seq: u32,
}

/// What happened to a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A lease was granted: its token, expiry (lease clock) and value.
    Granted {
        token: FencingToken,
        expires_at_ms: u64,
        value: HolderValue,
    },
    /// The holder replaced its value.
    ValueChanged {
        token: FencingToken,
        value: HolderValue,
    },
    /// The lease ended (released, expired or cancelled); `held`: another
    /// holding (of a shared lock or a semaphore) still holds after it.
    Ended {
        token: FencingToken,
        ended: LeaseEnd,
        held: bool,
    },
}

/// Whether each event's resource is held right after that event. `table`
/// is the state after all of them, so the holding counts are walked back
/// from there: a grant added one, an end took one away.
fn held_after_each(table: &LockTable, events: &[Event]) -> Vec<bool> {
    let mut holders: HashMap<&ResourceName, usize> = HashMap::new();
    let mut held = vec![false; events.len()];
    for (i, event) in events.iter().enumerate().rev() {
        let (resource, delta): (&ResourceName, isize) = match event {
            Event::Granted { resource, .. } => (resource, 1),
            Event::LeaseEnded { resource, .. } => (resource, -1),
            _ => continue,
        };
        let count = holders
            .entry(resource)
            .or_insert_with(|| table.holders_of(resource));
        held[i] = *count > 0;
        let before = count.checked_add_signed(-delta);
        debug_assert!(before.is_some(), "{resource}: an event for no holding");
        *count = before.unwrap_or(0);
    }
    held
}

/// One change of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub revision: Revision,
    pub resource: ResourceName,
    pub change: Change,
}

/// What a watcher receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchItem {
    /// The resource's state as of `revision` (`view` `None`: free): the
    /// first item of a watch from now, or, with `gap`, instead of changes
    /// this replica no longer has.
    State {
        revision: Revision,
        view: Option<LockView>,
        gap: bool,
    },
    /// Shared with the log and every other watcher of the resource: a
    /// change (and its value, up to 4 KiB) is not copied per watcher.
    Change(Arc<WatchEvent>),
}

/// Why the store stopped feeding a watcher (its stream then ends with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WatchEnd {
    /// Still fed (or the watcher went away).
    Open = 0,
    /// It fell [`WATCH_BUFFER_EVENTS`] changes behind.
    TooSlow = 1,
    /// The resource's slot moved to another shard: watch it there, from
    /// the last revision seen.
    Moved = 2,
    /// This replica was removed or replaced its state from a snapshot:
    /// watch again (here or elsewhere) from the last revision seen.
    Restart = 3,
}

impl WatchEnd {
    fn from_u8(v: u8) -> WatchEnd {
        match v {
            1 => WatchEnd::TooSlow,
            2 => WatchEnd::Moved,
            3 => WatchEnd::Restart,
            _ => WatchEnd::Open,
        }
    }
}

/// The receiving side of a watch.
pub struct WatchStream {
    pub rx: mpsc::Receiver<WatchItem>,
    end: Arc<AtomicU8>,
}

impl WatchStream {
    /// Why the store stopped feeding it (read once `rx` is closed).
    pub fn end(&self) -> WatchEnd {
        WatchEnd::from_u8(self.end.load(Ordering::Acquire))
    }
}

struct Watcher {
    tx: mpsc::Sender<WatchItem>,
    end: Arc<AtomicU8>,
    /// Changes at or before this were seen elsewhere (a watcher resumed on
    /// a replica behind the one it watched before).
    after: Revision,
}

impl Watcher {
    /// Queues `item`; false when the watcher is gone or was cut.
    fn offer(&self, item: WatchItem) -> bool {
        match self.tx.try_send(item) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.end.store(WatchEnd::TooSlow as u8, Ordering::Release);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    fn cut(&self, why: WatchEnd) {
        self.end.store(why as u8, Ordering::Release);
    }
}

/// One replica's change log and the watchers on this node.
#[derive(Default)]
pub(crate) struct WatchHub {
    log: VecDeque<Arc<WatchEvent>>,
    log_bytes: usize,
    /// The log holds every change after this revision.
    complete_after: Revision,
    /// The revision the last recorded change took (for `seq`).
    last: Revision,
    watchers: HashMap<ResourceName, Vec<Watcher>>,
}

/// The revision a table's state is as of: its epoch and applied index,
/// after every change of that entry.
pub(crate) fn current(table: &LockTable) -> Revision {
    Revision {
        epoch: table.epoch(),
        index: table.applied_index(),
        seq: u32::MAX,
    }
}

impl WatchHub {
    /// A hub for a replica whose table starts at `table` (nothing before
    /// it can be replayed).
    pub(crate) fn starting_at(table: &LockTable) -> WatchHub {
        WatchHub {
            complete_after: current(table),
            ..WatchHub::default()
        }
    }

    /// Watchers on this replica.
    pub(crate) fn watcher_count(&self) -> usize {
        self.watchers.values().map(Vec::len).sum()
    }

    /// Records the changes `events` made (applied at `index`, the table
    /// now after them) and hands them to the resources' watchers.
    pub(crate) fn on_events(&mut self, table: &LockTable, index: u64, events: &[Event]) {
        let held_after = held_after_each(table, events);
        for (event, held_after) in events.iter().zip(held_after) {
            let (resource, change) = match event {
                Event::Granted {
                    resource,
                    lease_id,
                    token,
                    expires_at_ms,
                    ..
                } => {
                    // The holder after this command; its value is the
                    // grant's (a waiter's own, kept since it queued).
                    let value = table.value_of(resource, *lease_id).cloned();
                    let value = value.unwrap_or_default();
                    let change = Change::Granted {
                        token: *token,
                        expires_at_ms: *expires_at_ms,
                        value,
                    };
                    (resource, change)
                }
                Event::ValueChanged {
                    resource,
                    lease_id,
                    token,
                } => {
                    let value = table.value_of(resource, *lease_id).cloned();
                    let value = value.unwrap_or_default();
                    let change = Change::ValueChanged {
                        token: *token,
                        value,
                    };
                    (resource, change)
                }
                Event::LeaseEnded {
                    resource,
                    token,
                    ended,
                    ..
                } => (
                    resource,
                    Change::Ended {
                        token: *token,
                        ended: *ended,
                        held: held_after,
                    },
                ),
                Event::WaitEnded { .. } | Event::WaitMoved { .. } => continue,
            };
            let epoch = table.epoch();
            let seq = if self.last.epoch == epoch && self.last.index == index {
                self.last.seq + 1
            } else {
                0
            };
            let revision = Revision { epoch, index, seq };
            debug_assert!(revision > self.last, "revisions only rise");
            self.last = revision;
            let event = Arc::new(WatchEvent {
                revision,
                resource: resource.clone(),
                change,
            });
            self.deliver(&event);
            self.remember(event);
        }
    }

    fn deliver(&mut self, event: &Arc<WatchEvent>) {
        let Some(watchers) = self.watchers.get_mut(&event.resource) else {
            return;
        };
        watchers.retain(|w| w.after >= event.revision || w.offer(WatchItem::Change(event.clone())));
        if watchers.is_empty() {
            self.watchers.remove(&event.resource);
        }
    }

    fn remember(&mut self, event: Arc<WatchEvent>) {
        self.log_bytes += event_bytes(&event);
        self.log.push_back(event);
        while self.log.len() > WATCH_LOG_EVENTS || self.log_bytes > WATCH_LOG_BYTES {
            let Some(oldest) = self.log.pop_front() else {
                break;
            };
            self.log_bytes -= event_bytes(&oldest);
            self.complete_after = oldest.revision;
        }
    }

    /// Starts watching `resource` on this replica: the state now (no
    /// `after`), or every change after `after` still in the log, or, when
    /// the log does not reach back that far, the state now marked as a
    /// gap. Then every change as it applies. `Err` when `node_watchers`
    /// (this node's count) is at [`MAX_WATCHERS_PER_NODE`].
    pub(crate) fn subscribe(
        &mut self,
        table: &LockTable,
        resource: &ResourceName,
        after: Option<Revision>,
        node_watchers: usize,
    ) -> Result<WatchStream, usize> {
        if node_watchers >= MAX_WATCHERS_PER_NODE {
            return Err(MAX_WATCHERS_PER_NODE);
        }
        let (tx, rx) = mpsc::channel(WATCH_BUFFER_EVENTS);
        let end = Arc::new(AtomicU8::new(WatchEnd::Open as u8));
        let now = current(table);
        let state = |gap| WatchItem::State {
            revision: now,
            view: table.view(resource),
            gap,
        };
        let watcher = Watcher {
            tx,
            end: end.clone(),
            after: after.unwrap_or(now),
        };
        let fed = match after {
            None => watcher.offer(state(false)),
            Some(after) if after >= self.complete_after => self
                .log
                .iter()
                .filter(|e| e.resource == *resource && e.revision > after)
                .all(|e| watcher.offer(WatchItem::Change(e.clone()))),
            Some(_) => watcher.offer(state(true)),
        };
        if fed {
            self.watchers
                .entry(resource.clone())
                .or_default()
                .push(watcher);
        }
        Ok(WatchStream { rx, end })
    }

    /// Ends the watches of the resources `moved` says left this shard.
    pub(crate) fn cut_moved(&mut self, moved: impl Fn(&ResourceName) -> bool) {
        self.watchers.retain(|resource, watchers| {
            if moved(resource) {
                watchers.iter().for_each(|w| w.cut(WatchEnd::Moved));
                false
            } else {
                true
            }
        });
    }

    /// Ends every watch and forgets the log (the replica is going away, or
    /// its table was replaced by a snapshot starting at `table`).
    pub(crate) fn restart(&mut self, table: &LockTable) {
        for w in self.watchers.values().flatten() {
            w.cut(WatchEnd::Restart);
        }
        *self = WatchHub::starting_at(table);
    }
}

fn event_bytes(event: &WatchEvent) -> usize {
    let value = match &event.change {
        Change::Granted { value, .. } | Change::ValueChanged { value, .. } => value.len(),
        Change::Ended { .. } => 0,
    };
    std::mem::size_of::<WatchEvent>() + event.resource.as_str().len() + value
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_statemachine::{
        AcquireMode, ApplyContext, Command, LeaseId, Limits, Owner, RequestId,
    };

    struct Shard {
        table: LockTable,
        hub: WatchHub,
        index: u64,
    }

    impl Shard {
        fn new() -> Shard {
            let mut s = Shard {
                table: LockTable::new(Limits::default()).unwrap(),
                hub: WatchHub::default(),
                index: 0,
            };
            s.apply(Command::LeaderChanged {
                clock_offset_allowance_ms: 0,
            });
            s.hub = WatchHub::starting_at(&s.table);
            s
        }

        fn apply(&mut self, c: Command) {
            self.index += 1;
            let ctx = ApplyContext {
                index: self.index,
                term: 1,
                epoch: 1,
                now_ms: 1_000_000,
            };
            let out = self.table.apply(&c, &ctx);
            self.hub.on_events(&self.table, self.index, &out.events);
        }

        fn acquire(&mut self, res: &str, lease: u8, value: &[u8]) {
            self.acquire_in(res, lease, value, AcquireMode::Exclusive);
        }

        fn acquire_in(&mut self, res: &str, lease: u8, value: &[u8], mode: AcquireMode) {
            self.apply(Command::Acquire {
                resource: name(res),
                owner: Owner::anonymous(),
                request_id: RequestId::new(vec![lease]).unwrap(),
                lease_id: LeaseId([lease; 16]),
                lease_ttl_ms: 10_000,
                wait_timeout_ms: 10_000,
                value: HolderValue::new(value.to_vec()).unwrap(),
                mode,
            });
        }

        fn release(&mut self, res: &str, lease: u8) {
            self.apply(Command::Release {
                resource: name(res),
                owner: Owner::anonymous(),
                lease_id: LeaseId([lease; 16]),
            });
        }
    }

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s).unwrap()
    }

    fn drain(stream: &mut WatchStream) -> Vec<WatchItem> {
        let mut items = Vec::new();
        while let Ok(item) = stream.rx.try_recv() {
            items.push(item);
        }
        items
    }

    fn changes(items: &[WatchItem]) -> Vec<(Revision, Change)> {
        items
            .iter()
            .filter_map(|i| match i {
                WatchItem::Change(e) => Some((e.revision, e.change.clone())),
                WatchItem::State { .. } => None,
            })
            .collect()
    }

    #[test]
    fn shared_holders_each_show_their_own_grant_value_and_end_and_held_counts_the_others() {
        let mut s = Shard::new();
        let mut w = s.hub.subscribe(&s.table, &name("acme/t"), None, 0).unwrap();
        s.acquire_in("acme/t", 1, b"reader-1", AcquireMode::Shared);
        s.acquire_in("acme/t", 2, b"reader-2", AcquireMode::Shared);
        s.acquire_in("acme/t", 3, b"writer", AcquireMode::Exclusive); // queues
        s.release("acme/t", 1);
        s.release("acme/t", 2); // ends 2, grants 3 in one entry
        let got = changes(&drain(&mut w));
        let shown: Vec<(&str, &[u8], bool)> = (got.iter())
            .map(|(_, c)| match c {
                Change::Granted { value, .. } => ("granted", value.as_bytes(), true),
                Change::ValueChanged { value, .. } => ("value", value.as_bytes(), true),
                Change::Ended { held, .. } => ("ended", &b""[..], *held),
            })
            .collect();
        assert_eq!(
            shown,
            [
                ("granted", &b"reader-1"[..], true),
                ("granted", &b"reader-2"[..], true),
                ("ended", &b""[..], true),
                ("ended", &b""[..], false),
                ("granted", &b"writer"[..], true),
            ]
        );
    }

    #[test]
    fn a_watcher_gets_the_state_then_every_change_in_order_and_resumes_without_repeats() {
        let mut s = Shard::new();
        let mut w = s.hub.subscribe(&s.table, &name("acme/a"), None, 0).unwrap();
        s.acquire("acme/a", 1, b"leader-1");
        s.acquire("acme/a", 2, b"leader-2"); // queues
        s.acquire("acme/b", 3, b""); // another resource: not seen
        s.release("acme/a", 1); // ends 1, grants 2 in one entry
        let items = drain(&mut w);
        assert!(
            matches!(
                &items[0],
                WatchItem::State {
                    view: None,
                    gap: false,
                    ..
                }
            ),
            "{items:?}"
        );
        let got = changes(&items);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            matches!(&got[0].1, Change::Granted { value, .. } if value.as_bytes() == b"leader-1")
        );
        assert!(matches!(
            &got[1].1,
            Change::Ended {
                ended: LeaseEnd::Released,
                ..
            }
        ));
        assert!(
            matches!(&got[2].1, Change::Granted { value, .. } if value.as_bytes() == b"leader-2")
        );
        // One entry, two changes: same index, rising seq.
        assert_eq!(got[1].0.index, got[2].0.index);
        assert!(got[1].0 < got[2].0 && got[0].0 < got[1].0);

        // A watcher that saw the first change resumes from it: the other
        // two, once each.
        let mut again = s
            .hub
            .subscribe(&s.table, &name("acme/a"), Some(got[0].0), 1)
            .unwrap();
        assert_eq!(changes(&drain(&mut again)), got[1..].to_vec());
        // One that saw everything gets nothing until the next change.
        let mut last = s
            .hub
            .subscribe(&s.table, &name("acme/a"), Some(got[2].0), 2)
            .unwrap();
        assert!(drain(&mut last).is_empty());
        s.release("acme/a", 2);
        assert_eq!(changes(&drain(&mut last)).len(), 1);
        assert_eq!(changes(&drain(&mut again)).len(), 1);
        assert_eq!(changes(&drain(&mut w)).len(), 1);
    }

    #[test]
    fn a_revision_older_than_the_log_gets_the_state_marked_as_a_gap() {
        let mut s = Shard::new();
        let start = current(&s.table);
        s.acquire("acme/a", 1, b"v");
        // A replica that started later (or restarted) has no log before
        // its start.
        s.hub.restart(&s.table);
        let mut w = s
            .hub
            .subscribe(&s.table, &name("acme/a"), Some(start), 0)
            .unwrap();
        match &drain(&mut w)[..] {
            [WatchItem::State {
                view: Some(v),
                gap: true,
                ..
            }] => assert_eq!(v.value.as_bytes(), b"v"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_watcher_that_falls_behind_is_cut_and_others_are_not() {
        let mut s = Shard::new();
        let slow = s.hub.subscribe(&s.table, &name("acme/a"), None, 0).unwrap();
        let mut fast = s.hub.subscribe(&s.table, &name("acme/a"), None, 1).unwrap();
        for i in 0..WATCH_BUFFER_EVENTS {
            s.acquire("acme/a", (i % 200) as u8 + 1, b"");
            s.release("acme/a", (i % 200) as u8 + 1);
            drain(&mut fast);
        }
        assert_eq!(slow.end(), WatchEnd::TooSlow);
        assert_eq!(fast.end(), WatchEnd::Open);
        assert_eq!(s.hub.watcher_count(), 1);
        // The node's cap.
        assert!(s
            .hub
            .subscribe(&s.table, &name("acme/a"), None, MAX_WATCHERS_PER_NODE)
            .is_err());
    }

    #[test]
    fn the_log_keeps_its_bounds() {
        let mut s = Shard::new();
        let big = vec![b'v'; 4096];
        for i in 0..(WATCH_LOG_EVENTS / 2 + 10) {
            let lease = (i % 200) as u8 + 1;
            s.acquire("acme/a", lease, &big);
            s.release("acme/a", lease);
        }
        assert!(s.hub.log.len() <= WATCH_LOG_EVENTS);
        assert!(s.hub.log_bytes <= WATCH_LOG_BYTES);
        assert!(s.hub.complete_after > Revision::default());
    }
}
