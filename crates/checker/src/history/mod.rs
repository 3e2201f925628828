//! The history model: what clients and the nemesis did, as events, and the
//! operations they pair into.
//!
//! An **event** is one line of a history file: a client *invoked* a call, or
//! the call completed *ok* (with a reply), *failed* (it certainly took no
//! effect) or ended *unknown* (it may or may not have taken effect, now or
//! later — a timeout, a lost connection, `OUTCOME_UNKNOWN`). The nemesis
//! adds its own events (a fault started or stopped, everything healed).
//!
//! An **operation** is an invocation paired with its completion. Each
//! process (one client, one client process) has at most one operation in
//! flight, so pairing is by process. Timestamps are nanoseconds on the
//! system-wide monotonic clock ([`crate::clock`]); within one process they
//! never go back.
//!
//! Tokens are `i64` as on the wire; lease ids are lower-case hex.

mod jsonl;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use jsonl::{read_jsonl, to_jsonl, write_jsonl, JsonlError};

/// A client (in the harness or a separate process). The nemesis has none.
pub type ProcessId = u64;

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum Call {
    /// `Acquire`. `request_id` is stable across the call's retries.
    /// `mode` is left out of a line when exclusive, so such lines read as
    /// before modes.
    Acquire {
        resource: String,
        request_id: String,
        ttl_ms: u64,
        wait_ms: u64,
        #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
        mode: Mode,
    },
    Renew {
        resource: String,
        lease_id: String,
        ttl_ms: u64,
    },
    Release {
        resource: String,
        lease_id: String,
    },
    /// A linearizable read of the lock state.
    Get {
        resource: String,
    },
    /// A write to the fenced resource, carrying the writer's token.
    FenceWrite {
        resource: String,
        token: i64,
        value: String,
    },
    /// A read of the fenced resource.
    FenceRead {
        resource: String,
    },
}

/// How an acquire asked to hold its resource (lock.proto `AcquireMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Exclusive,
    Shared,
    /// One of this many permits.
    Semaphore(u32),
}

impl Mode {
    pub fn is_exclusive(&self) -> bool {
        *self == Mode::Exclusive
    }

    /// How many holders of this mode may hold at once beside each other
    /// (1 for exclusive; shared: unbounded).
    pub fn max_holders(&self) -> usize {
        match *self {
            Mode::Exclusive => 1,
            Mode::Shared => usize::MAX,
            Mode::Semaphore(permits) => permits as usize,
        }
    }
}

impl Call {
    /// The lock (and fenced resource) the call is about.
    pub fn resource(&self) -> &str {
        match self {
            Call::Acquire { resource, .. }
            | Call::Renew { resource, .. }
            | Call::Release { resource, .. }
            | Call::Get { resource }
            | Call::FenceWrite { resource, .. }
            | Call::FenceRead { resource } => resource,
        }
    }

    /// The operation's name, for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Acquire { .. } => "acquire",
            Call::Renew { .. } => "renew",
            Call::Release { .. } => "release",
            Call::Get { .. } => "get",
            Call::FenceWrite { .. } => "fence_write",
            Call::FenceRead { .. } => "fence_read",
        }
    }
}

/// What a call answered when it completed ok.
///
/// `granted_ttl_ms` is the time the answer granted (the reply's
/// `lease_ttl_ms`), which may differ from the TTL the call asked for: a
/// renewal near the hold cap grants less, one behind an earlier longer
/// grant more, and a deduplicated acquire only what is left of the
/// original grant. Histories recorded before it was kept lack it (`None`);
/// it is left out of a line when `None`, so such lines read as before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "r", rename_all = "snake_case")]
pub enum Reply {
    Acquired {
        lease_id: String,
        token: i64,
        deduplicated: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        granted_ttl_ms: Option<u64>,
    },
    Renewed {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        granted_ttl_ms: Option<u64>,
    },
    Released {
        released: bool,
    },
    Got {
        held: bool,
        /// The holder's token; 0 when not held.
        token: i64,
        /// The highest token the shard knows was granted; 0 if unknown.
        last_token: i64,
        queue_len: u32,
    },
    /// The fenced resource accepted the write; `seq` is its position in the
    /// resource's accept order (one counter for all resources).
    FenceAccepted {
        seq: u64,
    },
    /// The fenced resource refused the write: it had accepted `highest`.
    FenceRejected {
        highest: i64,
    },
    /// The fenced resource's last accepted write (`seq` 0: none).
    FenceValue {
        token: i64,
        value: Option<String>,
        seq: u64,
    },
}

impl Reply {
    /// Whether this reply can answer `call`.
    fn answers(&self, call: &Call) -> bool {
        matches!(
            (call, self),
            (Call::Acquire { .. }, Reply::Acquired { .. })
                | (Call::Renew { .. }, Reply::Renewed { .. })
                | (Call::Release { .. }, Reply::Released { .. })
                | (Call::Get { .. }, Reply::Got { .. })
                | (
                    Call::FenceWrite { .. },
                    Reply::FenceAccepted { .. } | Reply::FenceRejected { .. }
                )
                | (Call::FenceRead { .. }, Reply::FenceValue { .. })
        )
    }
}

/// Whether a fault began or ended, or every fault was healed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Start,
    Stop,
    /// Every fault is over: all nodes run, no partition, nothing paused.
    /// The liveness checker measures from the last one.
    HealAll,
}

/// One line of a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Invoke {
        process: ProcessId,
        time_ns: u64,
        #[serde(flatten)]
        call: Call,
    },
    Ok {
        process: ProcessId,
        time_ns: u64,
        #[serde(flatten)]
        reply: Reply,
    },
    /// The call certainly took no effect; `error` is the reason
    /// (`REASON_LOCK_HELD`, ...).
    Fail {
        process: ProcessId,
        time_ns: u64,
        error: String,
    },
    /// The call may or may not have taken effect, now or later.
    Unknown {
        process: ProcessId,
        time_ns: u64,
        error: String,
    },
    Nemesis {
        time_ns: u64,
        fault: String,
        phase: Phase,
        detail: String,
    },
    /// A watcher received one event of its watch (lock.proto `WatchEvent`).
    /// One watcher process follows one resource, resuming after the last
    /// revision it received when its stream ends.
    Watched {
        process: ProcessId,
        time_ns: u64,
        #[serde(flatten)]
        event: WatchSeen,
    },
}

/// One watch event as a watcher received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchSeen {
    pub resource: String,
    /// (epoch, log index, place in the entry).
    pub revision: (u64, u64, u32),
    /// `state`, `granted`, `value_changed`, `released`, `expired` or
    /// `cancelled`.
    pub kind: String,
    /// The lease the event is about (a STATE: the oldest holding's; 0 when
    /// free).
    pub token: i64,
    /// A STATE's every holding, oldest first (a shared lock or a semaphore
    /// has several; their ends are known to the watcher from here). Empty
    /// for changes and when free.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<i64>,
    /// A STATE sent instead of changes the node no longer had.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gap: bool,
}

impl Event {
    pub fn time_ns(&self) -> u64 {
        match self {
            Event::Invoke { time_ns, .. }
            | Event::Ok { time_ns, .. }
            | Event::Fail { time_ns, .. }
            | Event::Unknown { time_ns, .. }
            | Event::Nemesis { time_ns, .. }
            | Event::Watched { time_ns, .. } => *time_ns,
        }
    }

    pub fn process(&self) -> Option<ProcessId> {
        match self {
            Event::Invoke { process, .. }
            | Event::Ok { process, .. }
            | Event::Fail { process, .. }
            | Event::Unknown { process, .. }
            | Event::Watched { process, .. } => Some(*process),
            Event::Nemesis { .. } => None,
        }
    }
}

/// What an acquire's unknown outcome says when a retry learned the lease it
/// had been granted was cancelled since (the lease state's wire name, in
/// the harness client's "granted earlier, lease since ended (..)").
pub const CANCELLED_SINCE: &str = "LEASE_STATE_CANCELLED";

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(Reply),
    Fail(String),
    /// Also what an invocation without a completion becomes.
    Unknown(String),
}

/// An invocation paired with its completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// Position in [`History::ops`].
    pub id: usize,
    pub process: ProcessId,
    pub call: Call,
    pub invoke_ns: u64,
    /// When the client stopped waiting. For an unknown outcome the effect
    /// may still come later; checkers treat its end as open.
    pub complete_ns: u64,
    pub outcome: Outcome,
}

impl Operation {
    pub fn is_ok(&self) -> bool {
        matches!(self.outcome, Outcome::Ok(_))
    }

    pub fn reply(&self) -> Option<&Reply> {
        match &self.outcome {
            Outcome::Ok(reply) => Some(reply),
            _ => None,
        }
    }

    /// The failure reason, if the operation certainly failed.
    pub fn failure(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Fail(reason) => Some(reason),
            _ => None,
        }
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self.outcome, Outcome::Unknown(_))
    }

    /// An acquire a retry was told had been granted and then cancelled
    /// (its earlier attempt's caller was gone): the service ended that
    /// lease on purpose, at a moment nobody saw, before the answer.
    pub fn lease_was_cancelled(&self) -> bool {
        matches!(
            (&self.call, &self.outcome),
            (Call::Acquire { .. }, Outcome::Unknown(why)) if why.contains(CANCELLED_SINCE)
        )
    }

    /// For an ok acquire: its lease id and token.
    pub fn grant(&self) -> Option<(&str, i64)> {
        match (&self.call, &self.outcome) {
            (
                Call::Acquire { .. },
                Outcome::Ok(Reply::Acquired {
                    lease_id, token, ..
                }),
            ) => Some((lease_id, *token)),
            _ => None,
        }
    }

    /// For an ok acquire or renewal: the time it granted, as its send time
    /// and TTL — the start and length of the stop-by deadline a client
    /// following the contract computes from this answer (before its drift
    /// margin). The TTL is the answered one; where the history lacks it,
    /// a renewal falls back to the TTL asked for and an acquire gives
    /// `None` (see [`crate::check::lease_facts`] for the acquire rule).
    pub fn promise(&self) -> Option<(u64, u64)> {
        match (&self.call, self.reply()?) {
            (
                Call::Acquire { .. },
                Reply::Acquired {
                    granted_ttl_ms: Some(ttl_ms),
                    ..
                },
            ) => Some((self.invoke_ns, *ttl_ms)),
            (Call::Renew { ttl_ms, .. }, Reply::Renewed { granted_ttl_ms }) => {
                Some((self.invoke_ns, granted_ttl_ms.unwrap_or(*ttl_ms)))
            }
            _ => None,
        }
    }
}

/// A fault as the nemesis recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    pub time_ns: u64,
    pub fault: String,
    pub phase: Phase,
    pub detail: String,
}

/// A watch event in a history: which watcher saw it, when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched {
    pub process: ProcessId,
    pub time_ns: u64,
    pub event: WatchSeen,
}

/// A validated history: operations in invocation order, the faults, and
/// what watchers received (in the order each received it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Operation>,
    pub faults: Vec<FaultEvent>,
    pub watched: Vec<Watched>,
}

/// Why a list of events is not a history.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HistoryError {
    #[error("event {index}: process {process} invoked while its previous call was in flight")]
    OverlappingInvoke { index: usize, process: ProcessId },
    #[error("event {index}: process {process} completed a call it never invoked")]
    CompletionWithoutInvoke { index: usize, process: ProcessId },
    #[error(
        "event {index}: process {process}'s clock went back ({previous_ns} ns, then {time_ns} ns)"
    )]
    TimeWentBack {
        index: usize,
        process: ProcessId,
        previous_ns: u64,
        time_ns: u64,
    },
    #[error("event {index}: a {reply} reply cannot answer a {call} call")]
    ReplyMismatch {
        index: usize,
        call: &'static str,
        reply: String,
    },
}

impl History {
    /// Pairs events into operations and checks the history is well formed:
    /// per process, calls alternate with completions and time never goes
    /// back. A call still in flight at the end becomes unknown.
    pub fn from_events(events: &[Event]) -> Result<History, HistoryError> {
        struct Pending {
            call: Call,
            invoke_ns: u64,
        }
        let mut pending: BTreeMap<ProcessId, Pending> = BTreeMap::new();
        let mut last_time: BTreeMap<ProcessId, u64> = BTreeMap::new();
        let mut ops = Vec::new();
        let mut faults = Vec::new();
        let mut watched = Vec::new();
        let mut end_ns = 0;
        for (index, event) in events.iter().enumerate() {
            end_ns = end_ns.max(event.time_ns());
            if let Some(process) = event.process() {
                let time_ns = event.time_ns();
                if let Some(&previous_ns) = last_time.get(&process) {
                    if time_ns < previous_ns {
                        return Err(HistoryError::TimeWentBack {
                            index,
                            process,
                            previous_ns,
                            time_ns,
                        });
                    }
                }
                last_time.insert(process, time_ns);
            }
            let (process, time_ns, outcome) = match event {
                Event::Invoke {
                    process,
                    time_ns,
                    call,
                } => {
                    if pending.contains_key(process) {
                        return Err(HistoryError::OverlappingInvoke {
                            index,
                            process: *process,
                        });
                    }
                    pending.insert(
                        *process,
                        Pending {
                            call: call.clone(),
                            invoke_ns: *time_ns,
                        },
                    );
                    continue;
                }
                Event::Nemesis {
                    time_ns,
                    fault,
                    phase,
                    detail,
                } => {
                    faults.push(FaultEvent {
                        time_ns: *time_ns,
                        fault: fault.clone(),
                        phase: *phase,
                        detail: detail.clone(),
                    });
                    continue;
                }
                Event::Watched {
                    process,
                    time_ns,
                    event,
                } => {
                    watched.push(Watched {
                        process: *process,
                        time_ns: *time_ns,
                        event: event.clone(),
                    });
                    continue;
                }
                Event::Ok {
                    process,
                    time_ns,
                    reply,
                } => (*process, *time_ns, Outcome::Ok(reply.clone())),
                Event::Fail {
                    process,
                    time_ns,
                    error,
                } => (*process, *time_ns, Outcome::Fail(error.clone())),
                Event::Unknown {
                    process,
                    time_ns,
                    error,
                } => (*process, *time_ns, Outcome::Unknown(error.clone())),
            };
            let Some(Pending { call, invoke_ns }) = pending.remove(&process) else {
                return Err(HistoryError::CompletionWithoutInvoke { index, process });
            };
            if let Outcome::Ok(reply) = &outcome {
                if !reply.answers(&call) {
                    return Err(HistoryError::ReplyMismatch {
                        index,
                        call: call.name(),
                        reply: format!("{reply:?}"),
                    });
                }
            }
            ops.push(Operation {
                id: 0,
                process,
                call,
                invoke_ns,
                complete_ns: time_ns,
                outcome,
            });
        }
        for (process, Pending { call, invoke_ns }) in pending {
            ops.push(Operation {
                id: 0,
                process,
                call,
                invoke_ns,
                complete_ns: end_ns,
                outcome: Outcome::Unknown("history ended".into()),
            });
        }
        ops.sort_by_key(|op| (op.invoke_ns, op.process));
        for (id, op) in ops.iter_mut().enumerate() {
            op.id = id;
        }
        Ok(History {
            ops,
            faults,
            watched,
        })
    }

    /// Operations on one resource, in invocation order.
    pub fn by_resource(&self) -> BTreeMap<&str, Vec<&Operation>> {
        let mut map: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
        for op in &self.ops {
            map.entry(op.call.resource()).or_default().push(op);
        }
        map
    }

    /// When the last "everything healed" nemesis event happened.
    pub fn last_heal_ns(&self) -> Option<u64> {
        self.faults
            .iter()
            .filter(|f| f.phase == Phase::HealAll)
            .map(|f| f.time_ns)
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invoke(process: ProcessId, time_ns: u64) -> Event {
        Event::Invoke {
            process,
            time_ns,
            call: Call::Get {
                resource: "t/r".into(),
            },
        }
    }

    fn got(process: ProcessId, time_ns: u64) -> Event {
        Event::Ok {
            process,
            time_ns,
            reply: Reply::Got {
                held: false,
                token: 0,
                last_token: 0,
                queue_len: 0,
            },
        }
    }

    #[test]
    fn events_pair_into_operations_per_process() {
        let events = vec![invoke(1, 10), invoke(2, 11), got(2, 12), got(1, 20)];
        let h = History::from_events(&events).unwrap();
        assert_eq!(h.ops.len(), 2);
        assert_eq!((h.ops[0].process, h.ops[0].complete_ns), (1, 20));
        assert_eq!((h.ops[1].process, h.ops[1].complete_ns), (2, 12));
    }

    #[test]
    fn a_call_in_flight_at_the_end_is_unknown() {
        let h = History::from_events(&[invoke(1, 10), invoke(2, 30)]).unwrap();
        assert!(h.ops.iter().all(Operation::is_unknown));
        assert_eq!(h.ops[0].complete_ns, 30);
    }

    #[test]
    fn malformed_histories_are_refused() {
        assert!(matches!(
            History::from_events(&[invoke(1, 10), invoke(1, 11)]),
            Err(HistoryError::OverlappingInvoke { index: 1, .. })
        ));
        assert!(matches!(
            History::from_events(&[got(1, 10)]),
            Err(HistoryError::CompletionWithoutInvoke { .. })
        ));
        assert!(matches!(
            History::from_events(&[invoke(1, 10), got(1, 9)]),
            Err(HistoryError::TimeWentBack { .. })
        ));
        let wrong = Event::Ok {
            process: 1,
            time_ns: 12,
            reply: Reply::Renewed {
                granted_ttl_ms: None,
            },
        };
        assert!(matches!(
            History::from_events(&[invoke(1, 10), wrong]),
            Err(HistoryError::ReplyMismatch { .. })
        ));
    }
}
