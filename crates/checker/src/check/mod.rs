//! Checkers: each one a pure function from a [`History`] to a [`Verdict`].
//!
//! | checker | property |
//! |---|---|
//! | [`fence`] | the fenced resource never accepts a token lower than one it accepted; its reads return the last accepted write |
//! | [`windows`] | no two holders' validity windows overlap beyond what their modes allow (shared beside shared, N holders of a semaphore of N, never an exclusive beside another); no acknowledged grant is lost before its lease could end |
//! | [`tokens`] | tokens are unique and strictly increase per resource in real-time order, also against `Get`'s `last_token` |
//! | [`dedup`] | one `requestId` is applied at most once |
//! | [`fifo`] | waiters certainly queued earlier are granted earlier |
//! | [`linear`] | acquire / renew / release / get per resource are linearizable against a lock model with lease expiry and unknown outcomes |
//! | [`liveness`] | after every fault healed, each resource still in use is served within a bound |
//! | [`watch`] | each watcher's stream (resumed across reconnects) has rising revisions and grant tokens, and misses no grant clients were told of between two it saw, unless the node marked a gap |
//!
//! Lease time is reasoned about on the client's monotonic clock: a lease
//! granted (or renewed) by a call *sent* at `t` whose answer granted `ttl`
//! cannot end on the server before `t + ttl` (the server starts counting
//! later, never earlier), up to a clock-rate allowance
//! ([`CheckConfig::expiry_margin_percent`]). `ttl` is the time the answer
//! granted, never the time asked for ([`LeaseFacts::promises`]).

pub mod dedup;
pub mod fence;
pub mod fifo;
mod leases;
pub mod linear;
pub mod liveness;
pub mod tokens;
pub mod watch;
pub mod windows;

use std::fmt;

use crate::clock::ms_to_ns;
use crate::history::History;

pub use leases::{first_sends, lease_facts, LeaseFacts, Promise};

/// Problems listed per verdict; the count is always exact.
pub const MAX_REPORTED_PROBLEMS: usize = 20;

/// Default clock-rate allowance between a client's clock and lease time on
/// the servers, in percent of a TTL.
pub const DEFAULT_EXPIRY_MARGIN_PERCENT: u64 = 2;
/// Default fixed allowance on lease time: servers stamp time in whole
/// milliseconds, and a stamp may be read a little before the call is sent.
pub const DEFAULT_EXPIRY_SLACK_MS: u64 = 20;
/// Default bound for the liveness checker.
pub const DEFAULT_LIVENESS_BOUND_MS: u64 = 30_000;
/// Default search budget per resource for the linearizability checker.
pub const DEFAULT_LINEAR_MAX_STEPS: u64 = 2_000_000;

/// Parameters every checker shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckConfig {
    pub expiry_margin_percent: u64,
    pub expiry_slack_ms: u64,
    /// After the last heal, every resource in use must see an ok operation
    /// completing within this many milliseconds.
    pub liveness_bound_ms: u64,
    /// Search steps per resource before the linearizability checker gives
    /// up with an inconclusive verdict.
    pub linear_max_steps: u64,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            expiry_margin_percent: DEFAULT_EXPIRY_MARGIN_PERCENT,
            expiry_slack_ms: DEFAULT_EXPIRY_SLACK_MS,
            liveness_bound_ms: DEFAULT_LIVENESS_BOUND_MS,
            linear_max_steps: DEFAULT_LINEAR_MAX_STEPS,
        }
    }
}

impl CheckConfig {
    /// The earliest moment (client clock) a lease granted or renewed by a
    /// call sent at `sent_ns` for `ttl_ms` can have ended on the server.
    pub fn earliest_end_ns(&self, sent_ns: u64, ttl_ms: u64) -> u64 {
        let ttl_ns = ms_to_ns(ttl_ms);
        let margin_ns = ttl_ns * self.expiry_margin_percent / 100 + ms_to_ns(self.expiry_slack_ms);
        sent_ns + ttl_ns.saturating_sub(margin_ns)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    /// The checker could not decide (a search budget ran out); not a pass.
    Inconclusive,
}

/// One checker's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub checker: &'static str,
    pub status: Status,
    /// How many items (operations, leases, resources) it looked at.
    pub checked: usize,
    /// The first [`MAX_REPORTED_PROBLEMS`] problems, human readable.
    pub problems: Vec<String>,
    /// All problems, including those not listed.
    pub problem_count: usize,
}

impl Verdict {
    /// A passing verdict of `checker` that has looked at nothing yet; also
    /// for checks made outside this module (the simulation's durability
    /// check).
    pub fn new(checker: &'static str) -> Verdict {
        Verdict {
            checker,
            status: Status::Pass,
            checked: 0,
            problems: Vec::new(),
            problem_count: 0,
        }
    }

    /// Records a violation: the verdict fails.
    pub fn fail(&mut self, problem: String) {
        self.status = Status::Fail;
        self.note(problem);
    }

    /// Records that the checker could not decide something; a failure
    /// elsewhere still wins.
    fn undecided(&mut self, problem: String) {
        if self.status == Status::Pass {
            self.status = Status::Inconclusive;
        }
        self.note(problem);
    }

    fn note(&mut self, problem: String) {
        self.problem_count += 1;
        if self.problems.len() < MAX_REPORTED_PROBLEMS {
            self.problems.push(problem);
        }
    }

    pub fn passed(&self) -> bool {
        self.status == Status::Pass
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Inconclusive => "INCONCLUSIVE",
        };
        write!(
            f,
            "{:<13} {status:<12} checked {}",
            self.checker, self.checked
        )?;
        if self.problem_count > 0 {
            write!(f, ", {} problem(s)", self.problem_count)?;
        }
        for p in &self.problems {
            write!(f, "\n    - {p}")?;
        }
        if self.problem_count > self.problems.len() {
            write!(
                f,
                "\n    ... and {} more",
                self.problem_count - self.problems.len()
            )?;
        }
        Ok(())
    }
}

/// Runs every checker.
pub fn check_all(history: &History, config: &CheckConfig) -> Vec<Verdict> {
    vec![
        fence::check(history),
        windows::check(history, config),
        tokens::check(history),
        dedup::check(history),
        fifo::check(history),
        linear::check(history, config),
        liveness::check(history, config),
        watch::check(history),
    ]
}

/// Test helpers: build histories by hand, compactly.
#[cfg(test)]
pub(crate) mod build {
    use crate::history::{Call, Event, History, Mode, Phase, ProcessId, Reply};

    /// Milliseconds as the nanosecond timestamps histories carry.
    pub const MS: u64 = 1_000_000;

    /// Builds a history from whole operations (invoke and completion).
    #[derive(Default)]
    pub struct Builder {
        events: Vec<Event>,
    }

    pub enum Done {
        Ok(Reply),
        Fail(&'static str),
        Unknown,
        /// Unknown, with what the client said.
        UnknownBecause(&'static str),
    }

    impl Builder {
        pub fn op(
            mut self,
            p: ProcessId,
            from_ms: u64,
            to_ms: u64,
            call: Call,
            done: Done,
        ) -> Self {
            self.events.push(Event::Invoke {
                process: p,
                time_ns: from_ms * MS,
                call,
            });
            let time_ns = to_ms * MS;
            self.events.push(match done {
                Done::Ok(reply) => Event::Ok {
                    process: p,
                    time_ns,
                    reply,
                },
                Done::Fail(error) => Event::Fail {
                    process: p,
                    time_ns,
                    error: error.into(),
                },
                Done::Unknown => Event::Unknown {
                    process: p,
                    time_ns,
                    error: "timeout".into(),
                },
                Done::UnknownBecause(why) => Event::Unknown {
                    process: p,
                    time_ns,
                    error: why.into(),
                },
            });
            self
        }

        /// Adds one event as it is (a watcher's, for instance).
        pub fn event(mut self, event: Event) -> Self {
            self.events.push(event);
            self
        }

        pub fn heal(mut self, at_ms: u64) -> Self {
            self.events.push(Event::Nemesis {
                time_ns: at_ms * MS,
                fault: "heal".into(),
                phase: Phase::HealAll,
                detail: String::new(),
            });
            self
        }

        pub fn build(mut self) -> History {
            self.events.sort_by_key(Event::time_ns);
            History::from_events(&self.events).expect("well-formed test history")
        }
    }

    pub fn acquire(r: &str, req: &str, ttl_ms: u64, wait_ms: u64) -> Call {
        acquire_in(r, req, ttl_ms, wait_ms, Mode::Exclusive)
    }

    pub fn acquire_in(r: &str, req: &str, ttl_ms: u64, wait_ms: u64, mode: Mode) -> Call {
        Call::Acquire {
            resource: r.into(),
            request_id: req.into(),
            ttl_ms,
            wait_ms,
            mode,
        }
    }

    /// A grant recorded without the TTL it answered (an old history).
    pub fn granted(lease: &str, token: i64) -> Done {
        Done::Ok(Reply::Acquired {
            lease_id: lease.into(),
            token,
            deduplicated: false,
            granted_ttl_ms: None,
        })
    }

    /// A grant (or, `deduplicated`, a re-send's answer) that answered
    /// `ttl_ms`.
    pub fn granted_for(lease: &str, token: i64, deduplicated: bool, ttl_ms: u64) -> Done {
        Done::Ok(Reply::Acquired {
            lease_id: lease.into(),
            token,
            deduplicated,
            granted_ttl_ms: Some(ttl_ms),
        })
    }

    /// A renewal recorded without the TTL it answered (an old history).
    pub fn renewed() -> Done {
        Done::Ok(Reply::Renewed {
            granted_ttl_ms: None,
        })
    }

    /// A renewal that answered `ttl_ms`.
    pub fn renewed_for(ttl_ms: u64) -> Done {
        Done::Ok(Reply::Renewed {
            granted_ttl_ms: Some(ttl_ms),
        })
    }

    pub fn release(r: &str, lease: &str) -> Call {
        Call::Release {
            resource: r.into(),
            lease_id: lease.into(),
        }
    }

    pub fn released(released: bool) -> Done {
        Done::Ok(Reply::Released { released })
    }

    pub fn renew(r: &str, lease: &str, ttl_ms: u64) -> Call {
        Call::Renew {
            resource: r.into(),
            lease_id: lease.into(),
            ttl_ms,
        }
    }

    pub fn get(r: &str) -> Call {
        Call::Get { resource: r.into() }
    }

    pub fn got(held: bool, token: i64, last_token: i64, queue_len: u32) -> Done {
        Done::Ok(Reply::Got {
            held,
            token,
            last_token,
            queue_len,
        })
    }

    pub fn write(r: &str, token: i64, value: &str) -> Call {
        Call::FenceWrite {
            resource: r.into(),
            token,
            value: value.into(),
        }
    }

    pub fn read(r: &str) -> Call {
        Call::FenceRead { resource: r.into() }
    }
}
