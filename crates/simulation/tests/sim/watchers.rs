//! Simulated watchers: each follows one of the clients' resources with
//! `StoreMsg::Watch`, records every item it receives as an
//! `Event::Watched` (simulated time), and, when its stream ends (its node
//! crashed or restarted, the replica was restored from a snapshot, a slot
//! moved), watches again after the last revision it received on another
//! node that is up — the rules of the real harness's `watcher`
//! (`src/harness/workload.rs`), stepped instead of awaited. It also drops
//! its stream itself now and then and resumes on any node, so resuming on
//! a replica behind or ahead of the last one (or one whose log no longer
//! reaches back: a `gap` state) happens without a fault too. The watch
//! checker then holds each watcher's whole run to the clients' history.
//!
//! A watch request adds no event and no store step of its own: it rides
//! along with the node's next step ([`World::hand_to_next_step`]), and the
//! watchers draw from their own RNG. So the seed's schedule — every
//! delivery, fault and client move — is the same with watchers as without,
//! and the seeds the other tests name keep their meaning.

use fencelock_multiraft::watch::{Change, Revision, WatchItem, WatchStream};
use fencelock_multiraft::{StoreError, StoreMsg};
use fencelock_nemesis::history::{Event, ProcessId, WatchSeen};
use fencelock_statemachine::{LeaseEnd, ResourceName};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::error::TryRecvError as StreamTryRecvError;
use tokio::sync::oneshot;
use tokio::sync::oneshot::error::TryRecvError;

use super::clients::{resource_name, RESOURCES};
use super::world::{World, NODES};

/// The watchers' process ids start above this (the lock clients count
/// from 1).
pub const WATCHER_PROCESS_BASE: ProcessId = 100;
/// Pause after a stream ended or a watch was refused before watching
/// again, ms (a reconnect's backoff).
const REWATCH_PAUSE_MS: (u64, u64) = (10, 60);
/// How long a watcher keeps a stream at most before it drops it itself (a
/// client restarting, a proxy closing an idle connection) and resumes on
/// a node picked at random, ms: resumptions on a replica behind or ahead
/// of the last one happen without a fault too.
const STREAM_LIFE_MS: (u64, u64) = (500, 3_000);

/// The resources watched, one watcher each: two exclusive locks, the lock
/// mostly taken shared, and the semaphore (`clients::mode_of`), as the
/// chaos harness watches them.
pub fn watched_resources() -> Vec<String> {
    vec![
        resource_name(0),
        resource_name(1),
        resource_name(RESOURCES - 2),
        resource_name(RESOURCES - 1),
    ]
}

enum State {
    /// Watch again at the first event at or after this time.
    Idle { at_ms: u64 },
    /// A watch request on its way to (or waiting in) `node`.
    Opening {
        rx: oneshot::Receiver<Result<WatchStream, StoreError>>,
    },
    /// Receiving, until the stream ends or `until_ms`.
    Open { stream: WatchStream, until_ms: u64 },
}

struct Watcher {
    process: ProcessId,
    resource: String,
    shard_id: u64,
    /// The node watched last.
    node: u64,
    /// The last stream ended (the next watch goes to another node), as
    /// opposed to being dropped by the watcher (any node).
    ended: bool,
    /// The last revision received: a new watch resumes after it.
    after: Option<Revision>,
    state: State,
}

/// Every watcher; what they receive goes into the clients' history.
pub struct Watchers {
    watchers: Vec<Watcher>,
    rng: StdRng,
    /// Streams opened (a first watch or a resumption), for the report.
    pub opened: u64,
}

impl Watchers {
    /// One watcher per resource of `resources`, each on the data shard
    /// `shard_of(resource)` says; `seed` seeds their own RNG.
    pub fn new(seed: u64, resources: &[String], shard_of: impl Fn(&str) -> u64) -> Watchers {
        let watchers = resources
            .iter()
            .enumerate()
            .map(|(i, resource)| Watcher {
                process: WATCHER_PROCESS_BASE + i as u64 + 1,
                resource: resource.clone(),
                shard_id: shard_of(resource),
                // Spread over the nodes: watcher i starts on node i + 1.
                node: i as u64 % NODES + 1,
                ended: false,
                after: None,
                state: State::Idle { at_ms: 0 },
            })
            .collect();
        Watchers {
            watchers,
            // Not the world's RNG: see the module docs.
            rng: StdRng::seed_from_u64(seed ^ 0x5741_5443_4845_5253),
            opened: 0,
        }
    }

    /// After every event: open the watches that are due, take what the
    /// streams received, notice the ones that ended.
    pub fn poll(&mut self, world: &mut World, events: &mut Vec<Event>) {
        for i in 0..self.watchers.len() {
            self.poll_one(world, events, i);
        }
    }

    fn poll_one(&mut self, world: &mut World, events: &mut Vec<Event>, i: usize) {
        let now = world.now_ms;
        let w = &mut self.watchers[i];
        match &mut w.state {
            State::Idle { at_ms } => {
                if now >= *at_ms {
                    self.open(world, i);
                }
            }
            State::Opening { rx } => match rx.try_recv() {
                Err(TryRecvError::Empty) => {}
                Ok(Ok(stream)) => {
                    let life = self.rng.random_range(STREAM_LIFE_MS.0..=STREAM_LIFE_MS.1);
                    w.state = State::Open {
                        stream,
                        until_ms: now + life,
                    };
                    self.opened += 1;
                    // It may have received its first items already.
                    self.poll_one(world, events, i);
                }
                // Refused (no replica there, too many watchers), or the
                // node went down before it answered: try elsewhere.
                Ok(Err(_)) | Err(TryRecvError::Closed) => self.pause(now, i, true),
            },
            State::Open { stream, until_ms } => loop {
                match stream.rx.try_recv() {
                    Ok(item) => {
                        let (revision, seen) = seen(&w.resource, &item);
                        events.push(Event::Watched {
                            process: w.process,
                            time_ns: now * 1_000_000,
                            event: seen,
                        });
                        w.after = Some(revision);
                    }
                    Err(StreamTryRecvError::Empty) => {
                        if now >= *until_ms {
                            // Dropping the stream is all it takes to leave.
                            self.pause(now, i, false);
                        }
                        break;
                    }
                    // The store stopped feeding it (`stream.end()` says
                    // why) or its node went away: every reason means the
                    // same to a watcher — watch again after the last
                    // revision received.
                    Err(StreamTryRecvError::Disconnected) => {
                        self.pause(now, i, true);
                        break;
                    }
                }
            },
        }
    }

    /// Leaves the current stream or watch request (`ended`: it ended or
    /// was refused) and watches again a little later.
    fn pause(&mut self, now: u64, i: usize, ended: bool) {
        let pause = self
            .rng
            .random_range(REWATCH_PAUSE_MS.0..=REWATCH_PAUSE_MS.1);
        let w = &mut self.watchers[i];
        w.state = State::Idle { at_ms: now + pause };
        w.ended = ended;
    }

    /// Watches on a node that is up, picked at random — after an end or a
    /// refusal one other than the last (that one only if no other is up) —
    /// resuming after the last revision received.
    fn open(&mut self, world: &mut World, i: usize) {
        let w = &mut self.watchers[i];
        let up: Vec<u64> = (1..=NODES).filter(|n| world.is_up(*n)).collect();
        let others: Vec<u64> = (up.iter().copied())
            .filter(|n| !w.ended || *n != w.node)
            .collect();
        let choices = if others.is_empty() { &up } else { &others };
        if choices.is_empty() {
            // Nothing up: look again a little later.
            let now = world.now_ms;
            self.pause(now, i, true);
            return;
        }
        let w = &mut self.watchers[i];
        let node = choices[self.rng.random_range(0..choices.len())];
        w.node = node;
        let resource = ResourceName::parse(&w.resource).expect("a valid resource name");
        let (tx, rx) = oneshot::channel();
        world.hand_to_next_step(
            node,
            StoreMsg::Watch {
                shard_id: w.shard_id,
                resource,
                after: w.after,
                tx,
            },
        );
        w.state = State::Opening { rx };
    }
}

/// One received item as the history records it (the wire event's kind,
/// revision, token and gap flag), and its revision.
fn seen(resource: &str, item: &WatchItem) -> (Revision, WatchSeen) {
    let mut holders = Vec::new();
    let (revision, kind, token, gap) = match item {
        // A state names its oldest holding's token and every holding, as
        // the wire event does.
        WatchItem::State {
            revision,
            view,
            gap,
        } => {
            if let Some(v) = view {
                holders = v.holders.iter().map(|h| h.token.as_i64()).collect();
            }
            (
                *revision,
                "state",
                view.as_ref().map_or(0, |v| v.token.as_i64()),
                *gap,
            )
        }
        WatchItem::Change(event) => {
            let (kind, token) = match &event.change {
                Change::Granted { token, .. } => ("granted", token),
                Change::ValueChanged { token, .. } => ("value_changed", token),
                Change::Ended { token, ended, .. } => (
                    match ended {
                        LeaseEnd::Released => "released",
                        LeaseEnd::Expired => "expired",
                        LeaseEnd::Cancelled => "cancelled",
                    },
                    token,
                ),
            };
            (event.revision, kind, token.as_i64(), false)
        }
    };
    let seen = WatchSeen {
        resource: resource.to_owned(),
        revision: (revision.epoch, revision.index, revision.seq),
        kind: kind.to_owned(),
        token,
        holders,
        gap,
    };
    (revision, seen)
}
