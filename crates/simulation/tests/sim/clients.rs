//! Simulated lock clients: each one sends `StoreMsg` requests to a node of
//! its choice (after a network latency), polls the answer channel with
//! `try_recv` after every event, retries a logical call on other nodes with
//! the same request id until a definite answer or its deadline, and records
//! one history operation per logical call with an honest outcome — the same
//! rules as the real harness client (`src/harness/lock_client.rs`).

use std::collections::BTreeMap;

use fencelock_multiraft::StoreError;
use fencelock_multiraft::{AcquireResult, ReadReply, ReplyResult, Responder, StoreMsg};
use fencelock_nemesis::fence::{FencedResource, WriteOutcome};
use fencelock_nemesis::history::{Call, Event, Mode, ProcessId, Reply};
use fencelock_statemachine::{
    slot_of, AcquireMode, AcquireStatus, Command, LeaseId, Owner, Reply as LockReply, RequestId,
    ResourceName,
};
use rand::Rng;
use tokio::sync::oneshot;
use tokio::sync::oneshot::error::TryRecvError;

use super::world::{Ev, World, NODES};

/// Resources the clients contend on (spread over the data shards).
pub const RESOURCES: usize = 6;
/// Lease TTLs the clients ask for, ms.
pub const TTL_MS: (u64, u64) = (300, 1_000);
/// Wait timeouts of waiting acquires, ms.
const WAIT_MS: (u64, u64) = (100, 1_200);
/// One attempt's timeout (plus the wait).
const ATTEMPT_TIMEOUT_MS: u64 = 1_000;
/// A logical call gives up after this (plus the wait).
const CALL_DEADLINE_MS: u64 = 3_000;
/// Pause between attempts.
const RETRY_PAUSE_MS: (u64, u64) = (5, 60);
/// Pause between logical calls.
const THINK_MS: (u64, u64) = (1, 40);
/// Client-to-node latency.
const REQUEST_LATENCY_MS: (u64, u64) = (1, 5);
/// A holder stops using its lease at this share of the TTL an answer
/// granted (`lease_ttl_ms`, never the TTL asked for) after the send of the
/// answered call, keeping the latest such deadline (the client library's
/// stop-by deadline).
const STOP_BY_PERCENT: u64 = 85;
/// Per-mille chance that a holder "pauses" (GC, SIGSTOP) past its lease and
/// then writes with its old token without checking its deadline.
const PAUSE_PER_MILLE: u32 = 40;

// Retried refusals, and those documented as "nothing was changed": the
// same lists as the real-process harness client, so both record outcomes
// alike.
use fencelock_nemesis::retry::{NO_EFFECT_REASONS, RETRIED_REASONS};

pub fn resource_name(i: usize) -> String {
    format!("sim/r-{i}")
}

/// The permits of the semaphore resource (the last one).
pub const SEMAPHORE_PERMITS: u32 = 2;

/// How an acquire of `resource` holds it, from its request id (so a
/// re-send asks the same): the last resource is a semaphore of
/// [`SEMAPHORE_PERMITS`], the one before it a lock taken shared two times
/// in three and exclusive otherwise, the rest exclusive locks.
pub fn mode_of(resource: &str, request_id: &str) -> Mode {
    if resource == resource_name(RESOURCES - 1) {
        Mode::Semaphore(SEMAPHORE_PERMITS)
    } else if resource == resource_name(RESOURCES - 2) {
        let spread: u32 = request_id.bytes().map(u32::from).sum();
        if spread.is_multiple_of(3) {
            Mode::Exclusive
        } else {
            Mode::Shared
        }
    } else {
        Mode::Exclusive
    }
}

fn wire_mode(mode: Mode) -> AcquireMode {
    match mode {
        Mode::Exclusive => AcquireMode::Exclusive,
        Mode::Shared => AcquireMode::Shared,
        Mode::Semaphore(permits) => AcquireMode::Semaphore { permits },
    }
}

/// The stop-by deadline an answer granting `ttl_ms` to a call sent at
/// `sent_ms` gives.
fn stop_by(sent_ms: u64, ttl_ms: u64) -> u64 {
    sent_ms + ttl_ms * STOP_BY_PERCENT / 100
}

/// A lease the client believes it holds.
struct Held {
    resource: String,
    lease_id: LeaseId,
    token: i64,
    /// The TTL asked for (renewals and re-sends ask for it again).
    ttl_ms: u64,
    request_id: String,
    wait_ms: u64,
    stop_by_ms: u64,
    writes: u32,
}

enum Rx {
    Acquire(oneshot::Receiver<AcquireResult>),
    Reply(oneshot::Receiver<ReplyResult>),
    Read(oneshot::Receiver<Result<ReadReply, StoreError>>),
}

enum Polled {
    Pending,
    Acquire(AcquireResult),
    Reply(ReplyResult),
    Read(Result<ReadReply, StoreError>),
    /// The node dropped the channel (it crashed or stopped).
    Closed,
}

/// One attempt of a logical call, sent to `node`.
struct Attempt {
    rx: Rx,
    node: u64,
    timeout_at_ms: u64,
}

impl Rx {
    fn poll(&mut self) -> Polled {
        fn map<T>(r: Result<T, TryRecvError>, f: impl FnOnce(T) -> Polled) -> Polled {
            match r {
                Ok(v) => f(v),
                Err(TryRecvError::Empty) => Polled::Pending,
                Err(TryRecvError::Closed) => Polled::Closed,
            }
        }
        match self {
            Rx::Acquire(rx) => map(rx.try_recv(), Polled::Acquire),
            Rx::Reply(rx) => map(rx.try_recv(), Polled::Reply),
            Rx::Read(rx) => map(rx.try_recv(), Polled::Read),
        }
    }
}

#[derive(Clone)]
enum OpKind {
    Acquire { resend: bool },
    Renew,
    Release,
    Get,
}

/// A logical call in progress.
struct Op {
    kind: OpKind,
    resource: String,
    shard_id: u64,
    request_id: String,
    lease_id: Option<LeaseId>,
    ttl_ms: u64,
    wait_ms: u64,
    started_ms: u64,
    deadline_ms: u64,
    maybe_applied: bool,
    last_error: String,
    attempt: Option<Attempt>,
}

pub struct Client {
    pub process: ProcessId,
    held: Option<Held>,
    op: Option<Op>,
    /// shard → node to try first.
    leader_guess: BTreeMap<u64, u64>,
    next_request: u64,
    /// The wake-up event that is current (older ones are ignored).
    wake_ms: u64,
    /// A paused holder's delayed write, due at `wake_ms`.
    paused: Option<Held>,
}

/// Every client, the fenced resource and the recorded history.
pub struct Clients {
    pub clients: Vec<Client>,
    pub events: Vec<Event>,
    fence: FencedResource,
    shard_of: Vec<u64>,
    /// Clients stop starting calls (the end of the run).
    pub stopped: bool,
}

/// Polls a future that completes without waiting (the in-memory fence).
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("the in-memory fence never waits"),
    }
}

impl Clients {
    pub fn new(count: usize, fence: FencedResource, map_of: impl Fn(u32) -> u64) -> Clients {
        let shard_of = (0..RESOURCES)
            .map(|i| {
                let name = ResourceName::parse(&resource_name(i)).expect("valid name");
                map_of(slot_of(&name))
            })
            .collect();
        Clients {
            clients: (0..count)
                .map(|i| Client {
                    process: i as u64 + 1,
                    held: None,
                    op: None,
                    leader_guess: BTreeMap::new(),
                    next_request: 0,
                    wake_ms: 0,
                    paused: None,
                })
                .collect(),
            events: Vec::new(),
            fence,
            shard_of,
            stopped: false,
        }
    }

    pub fn start(&mut self, world: &mut World) {
        for i in 0..self.clients.len() {
            let at = world.rng.random_range(THINK_MS.0..=THINK_MS.1);
            self.wake(world, i, at);
        }
    }

    fn wake(&mut self, world: &mut World, client: usize, at_ms: u64) {
        let at_ms = at_ms.max(world.now_ms + 1);
        self.clients[client].wake_ms = at_ms;
        world.schedule(at_ms, Ev::ClientWake { client });
    }

    fn invoke(&mut self, world: &World, process: ProcessId, call: Call) {
        self.events.push(Event::Invoke {
            process,
            time_ns: world.now_ms * 1_000_000,
            call,
        });
    }

    fn complete(
        &mut self,
        world: &World,
        process: ProcessId,
        outcome: Result<Reply, (bool, String)>,
    ) {
        let time_ns = world.now_ms * 1_000_000;
        self.events.push(match outcome {
            Ok(reply) => Event::Ok {
                process,
                time_ns,
                reply,
            },
            Err((false, error)) => Event::Fail {
                process,
                time_ns,
                error,
            },
            Err((true, error)) => Event::Unknown {
                process,
                time_ns,
                error,
            },
        });
    }

    /// A client's scheduled wake-up: time out an attempt, retry, or start
    /// the next call.
    pub fn on_wake(&mut self, world: &mut World, client: usize) {
        if self.clients[client].wake_ms != world.now_ms {
            return;
        }
        if let Some(held) = self.clients[client].paused.take() {
            // The paused holder resumes and writes at once with its old
            // token, without checking its deadline.
            self.fence_write(world, client, &held);
            self.think(world, client);
            return;
        }
        let Some(op) = self.clients[client].op.as_mut() else {
            self.next_call(world, client);
            return;
        };
        match &op.attempt {
            Some(a) if world.now_ms < a.timeout_at_ms => {}
            Some(_) => {
                // Dropping the receiver is what a client's cancelled RPC
                // does: a waiting acquire's waiter is then cancelled.
                op.attempt = None;
                op.maybe_applied = true;
                op.last_error = "attempt timed out".into();
                self.retry_or_give_up(world, client);
            }
            None => self.send_attempt(world, client),
        }
    }

    /// After every event: answers that arrived.
    pub fn poll(&mut self, world: &mut World) {
        for client in 0..self.clients.len() {
            let polled = match self.clients[client]
                .op
                .as_mut()
                .and_then(|op| op.attempt.as_mut())
            {
                Some(a) => a.rx.poll(),
                None => continue,
            };
            match polled {
                Polled::Pending => {}
                Polled::Closed => {
                    let op = self.clients[client].op.as_mut().expect("polled");
                    op.attempt = None;
                    op.maybe_applied = true;
                    op.last_error = "connection lost".into();
                    self.retry_or_give_up(world, client);
                }
                Polled::Acquire(r) => self.on_acquire(world, client, r),
                Polled::Reply(r) => self.on_reply(world, client, r),
                Polled::Read(r) => self.on_read(world, client, r),
            }
        }
    }

    fn think(&mut self, world: &mut World, client: usize) {
        let at = world.now_ms + world.rng.random_range(THINK_MS.0..=THINK_MS.1);
        self.wake(world, client, at);
    }

    fn next_call(&mut self, world: &mut World, client: usize) {
        if self.stopped {
            return;
        }
        let now = world.now_ms;
        if let Some(held) = &self.clients[client].held {
            if now >= held.stop_by_ms {
                // Past its deadline: the holder stops relying on the lease.
                self.clients[client].held = None;
            }
        }
        let roll = world.rng.random_range(0..1000u32);
        if let Some(held) = self.clients[client].held.take() {
            if roll < PAUSE_PER_MILLE {
                let resume = held.stop_by_ms + world.rng.random_range(100..=800);
                self.clients[client].paused = Some(held);
                self.wake(world, client, resume);
                return;
            }
            let roll = world.rng.random_range(0..100u32);
            let (kind, request_id, ttl_ms, wait_ms, started) = match roll {
                // Only an exclusive holder writes: the fenced resource
                // orders one writer's tokens (docs/fencing.md).
                0..=34
                    if held.writes < 3
                        && mode_of(&held.resource, &held.request_id) == Mode::Exclusive =>
                {
                    self.fence_write(world, client, &held);
                    let held = Held {
                        writes: held.writes + 1,
                        ..held
                    };
                    self.clients[client].held = Some(held);
                    self.think(world, client);
                    return;
                }
                35..=54 => (OpKind::Renew, String::new(), held.ttl_ms, 0, now),
                55..=62 => (OpKind::Get, String::new(), 0, 0, now),
                63..=70 => (
                    OpKind::Acquire { resend: true },
                    held.request_id.clone(),
                    held.ttl_ms,
                    held.wait_ms,
                    now,
                ),
                _ => (OpKind::Release, String::new(), 0, 0, now),
            };
            let resource = held.resource.clone();
            let lease_id = Some(held.lease_id);
            if !matches!(kind, OpKind::Release) {
                self.clients[client].held = Some(held);
            }
            self.begin(
                world, client, kind, resource, request_id, lease_id, ttl_ms, wait_ms, started,
            );
            return;
        }
        let resource = resource_name(world.rng.random_range(0..RESOURCES));
        match roll {
            0..=699 => {
                let c = &mut self.clients[client];
                c.next_request += 1;
                let request_id = format!("c{}-{}", c.process, c.next_request);
                let ttl_ms = world.rng.random_range(TTL_MS.0..=TTL_MS.1);
                let wait_ms = if world.rng.random_range(0..3) == 0 {
                    world.rng.random_range(WAIT_MS.0..=WAIT_MS.1)
                } else {
                    0
                };
                self.begin(
                    world,
                    client,
                    OpKind::Acquire { resend: false },
                    resource,
                    request_id,
                    None,
                    ttl_ms,
                    wait_ms,
                    now,
                );
            }
            700..=899 => self.begin(
                world,
                client,
                OpKind::Get,
                resource,
                String::new(),
                None,
                0,
                0,
                now,
            ),
            _ => {
                let process = self.clients[client].process;
                self.invoke(
                    world,
                    process,
                    Call::FenceRead {
                        resource: resource.clone(),
                    },
                );
                let last = ready(self.fence.read(&resource));
                self.complete(
                    world,
                    process,
                    Ok(Reply::FenceValue {
                        token: last.token,
                        value: last.value,
                        seq: last.seq,
                    }),
                );
                self.think(world, client);
            }
        }
    }

    fn fence_write(&mut self, world: &World, client: usize, held: &Held) {
        let process = self.clients[client].process;
        let value = format!("{}-{}", held.request_id, held.writes);
        self.invoke(
            world,
            process,
            Call::FenceWrite {
                resource: held.resource.clone(),
                token: held.token,
                value: value.clone(),
            },
        );
        let reply = match ready(self.fence.write(&held.resource, held.token, &value)) {
            Ok(WriteOutcome::Accepted { seq }) => Ok(Reply::FenceAccepted { seq }),
            Ok(WriteOutcome::Rejected { highest }) => Ok(Reply::FenceRejected { highest }),
            Err(e) => Err((false, e.to_string())),
        };
        self.complete(world, process, reply);
    }

    #[allow(clippy::too_many_arguments)]
    fn begin(
        &mut self,
        world: &mut World,
        client: usize,
        kind: OpKind,
        resource: String,
        request_id: String,
        lease_id: Option<LeaseId>,
        ttl_ms: u64,
        wait_ms: u64,
        started_ms: u64,
    ) {
        let process = self.clients[client].process;
        let lease_hex = lease_id.map(|l| hex::encode(l.0)).unwrap_or_default();
        let call = match kind {
            OpKind::Acquire { .. } => Call::Acquire {
                resource: resource.clone(),
                request_id: request_id.clone(),
                ttl_ms,
                wait_ms,
                mode: mode_of(&resource, &request_id),
            },
            OpKind::Renew => Call::Renew {
                resource: resource.clone(),
                lease_id: lease_hex,
                ttl_ms,
            },
            OpKind::Release => Call::Release {
                resource: resource.clone(),
                lease_id: lease_hex,
            },
            OpKind::Get => Call::Get {
                resource: resource.clone(),
            },
        };
        self.invoke(world, process, call);
        let index = (0..RESOURCES)
            .find(|i| resource_name(*i) == resource)
            .expect("a simulated resource");
        self.clients[client].op = Some(Op {
            kind,
            shard_id: self.shard_of[index],
            resource,
            request_id,
            lease_id,
            ttl_ms,
            wait_ms,
            started_ms,
            deadline_ms: started_ms + CALL_DEADLINE_MS + wait_ms,
            maybe_applied: false,
            last_error: String::new(),
            attempt: None,
        });
        self.send_attempt(world, client);
    }

    fn send_attempt(&mut self, world: &mut World, client: usize) {
        let c = &mut self.clients[client];
        let Some(op) = c.op.as_mut() else {
            return;
        };
        let node = match c.leader_guess.get(&op.shard_id) {
            Some(node) => *node,
            None => world.rng.random_range(1..=NODES),
        };
        let resource = ResourceName::parse(&op.resource).expect("valid name");
        let (msg, rx) = match op.kind {
            OpKind::Acquire { .. } => {
                let (tx, rx) = oneshot::channel();
                // A fresh lease id per attempt, as the service makes one.
                let lease_id = LeaseId(world.rng.random());
                let msg = StoreMsg::Propose {
                    shard_id: op.shard_id,
                    command: Command::Acquire {
                        resource: resource.clone(),
                        owner: Owner::anonymous(),
                        request_id: RequestId::new(op.request_id.as_bytes().to_vec())
                            .expect("valid request id"),
                        lease_id,
                        lease_ttl_ms: op.ttl_ms,
                        wait_timeout_ms: op.wait_ms,
                        value: fencelock_statemachine::HolderValue::none(),
                        mode: wire_mode(mode_of(&op.resource, &op.request_id)),
                    },
                    responder: Responder::Acquire { resource, tx },
                    caller: None,
                };
                (msg, Rx::Acquire(rx))
            }
            OpKind::Renew | OpKind::Release => {
                let (tx, rx) = oneshot::channel();
                let lease_id = op.lease_id.expect("a held lease");
                let command = if matches!(op.kind, OpKind::Renew) {
                    Command::Renew {
                        resource,
                        owner: Owner::anonymous(),
                        lease_id,
                        lease_ttl_ms: op.ttl_ms,
                    }
                } else {
                    Command::Release {
                        resource,
                        owner: Owner::anonymous(),
                        lease_id,
                    }
                };
                let msg = StoreMsg::Propose {
                    shard_id: op.shard_id,
                    command,
                    responder: Responder::Reply(tx),
                    caller: None,
                };
                (msg, Rx::Reply(rx))
            }
            OpKind::Get => {
                let (tx, rx) = oneshot::channel();
                let msg = StoreMsg::Read {
                    shard_id: op.shard_id,
                    resource,
                    tx,
                };
                (msg, Rx::Read(rx))
            }
        };
        let timeout_at = world.now_ms + ATTEMPT_TIMEOUT_MS + op.wait_ms;
        op.attempt = Some(Attempt {
            rx,
            node,
            timeout_at_ms: timeout_at,
        });
        let latency = world
            .rng
            .random_range(REQUEST_LATENCY_MS.0..=REQUEST_LATENCY_MS.1);
        world.schedule(
            world.now_ms + latency,
            Ev::Request {
                node,
                msg: Box::new(msg),
            },
        );
        self.wake(world, client, timeout_at);
    }

    /// A retried refusal or a lost attempt: try another node after a pause,
    /// or give up at the deadline.
    fn retry_or_give_up(&mut self, world: &mut World, client: usize) {
        let now = world.now_ms;
        let pause = world.rng.random_range(RETRY_PAUSE_MS.0..=RETRY_PAUSE_MS.1);
        let op = self.clients[client].op.as_mut().expect("an op");
        if now + pause < op.deadline_ms && !self.stopped {
            self.wake(world, client, now + pause);
            return;
        }
        let op = self.clients[client].op.take().expect("an op");
        let process = self.clients[client].process;
        // A renewal that did not certainly succeed leaves the holder's
        // deadline where the last confirmed send put it.
        self.complete(world, process, Err((op.maybe_applied, op.last_error)));
        self.think(world, client);
    }

    /// Which refusals are final, which are retried (and whether an attempt
    /// refused so may have taken effect).
    fn refused(&mut self, world: &mut World, client: usize, e: StoreError) {
        // The reason the gRPC edge would answer with.
        let reason = e.reason();
        let c = &mut self.clients[client];
        let op = c.op.as_mut().expect("an op");
        if RETRIED_REASONS.contains(&reason) {
            op.maybe_applied |= !NO_EFFECT_REASONS.contains(&reason);
            op.last_error = reason.as_str_name().to_owned();
            match &e {
                StoreError::NotLeader {
                    leader: Some(leader),
                    ..
                } => {
                    c.leader_guess.insert(op.shard_id, leader.node_id);
                }
                _ => {
                    c.leader_guess.remove(&op.shard_id);
                }
            }
            self.retry_or_give_up(world, client);
            return;
        }
        let op = c.op.take().expect("an op");
        let process = c.process;
        let ambiguous = op.maybe_applied && matches!(op.kind, OpKind::Acquire { .. });
        let error = if ambiguous {
            format!("{} after an ambiguous attempt", reason.as_str_name())
        } else {
            reason.as_str_name().to_owned()
        };
        self.complete(world, process, Err((ambiguous, error)));
        self.think(world, client);
    }

    /// The call got its answer: it ends, and the node that answered is
    /// where this client goes first next time for that shard.
    fn settled(&mut self, client: usize) -> Option<(Op, ProcessId, u64)> {
        let c = &mut self.clients[client];
        let mut op = c.op.take()?;
        let node = op.attempt.take()?.node;
        c.leader_guess.insert(op.shard_id, node);
        Some((op, c.process, node))
    }

    fn on_acquire(&mut self, world: &mut World, client: usize, r: AcquireResult) {
        let reply = match r {
            Ok(reply) => reply,
            Err(e) => return self.refused(world, client, e),
        };
        let Some((op, process, _)) = self.settled(client) else {
            return;
        };
        match reply.status {
            AcquireStatus::Held {
                token,
                lease_ttl_ms,
                ..
            } => {
                let token = token.as_i64();
                self.complete(
                    world,
                    process,
                    Ok(Reply::Acquired {
                        lease_id: hex::encode(reply.lease_id.0),
                        token,
                        deduplicated: reply.deduplicated,
                        granted_ttl_ms: Some(lease_ttl_ms),
                    }),
                );
                // Counted from the first send of the logical call (the
                // answered attempt was sent then or later): never longer
                // than the contract's deadline.
                let stop_by_ms = stop_by(op.started_ms, lease_ttl_ms);
                let resend = matches!(op.kind, OpKind::Acquire { resend: true });
                if resend {
                    // A deduplicated answer grants only what is left of the
                    // lease, so the holder may count on it like a renewal.
                    if let Some(held) = self.clients[client].held.as_mut() {
                        if reply.deduplicated && held.lease_id == reply.lease_id {
                            held.stop_by_ms = held.stop_by_ms.max(stop_by_ms);
                        }
                    }
                } else {
                    self.clients[client].held = Some(Held {
                        resource: op.resource,
                        lease_id: reply.lease_id,
                        token,
                        ttl_ms: op.ttl_ms,
                        request_id: op.request_id,
                        wait_ms: op.wait_ms,
                        stop_by_ms,
                        writes: 0,
                    });
                }
            }
            // Granted once, over since (a retry answered from the dedup
            // table): nothing to use. Recorded as unknown — the grant took
            // effect at some point, and the client holds nothing now.
            AcquireStatus::Ended { .. } => {
                self.complete(world, process, Err((true, "lease already ended".into())));
                if matches!(op.kind, OpKind::Acquire { resend: true }) {
                    self.clients[client].held = None;
                }
            }
            AcquireStatus::Queued { .. } | AcquireStatus::WaitEnded(_) => {
                self.complete(
                    world,
                    process,
                    Err((true, "acquire answered before it ended".into())),
                );
            }
        }
        self.think(world, client);
    }

    fn on_reply(&mut self, world: &mut World, client: usize, r: ReplyResult) {
        let reply = match r {
            Ok(reply) => reply,
            Err(e) => return self.refused(world, client, e),
        };
        let Some((op, process, _)) = self.settled(client) else {
            return;
        };
        match (&op.kind, reply) {
            (OpKind::Renew, LockReply::Renewed(renewed)) => {
                self.complete(
                    world,
                    process,
                    Ok(Reply::Renewed {
                        granted_ttl_ms: Some(renewed.lease_ttl_ms),
                    }),
                );
                // The time the renewal granted, which may be less than
                // asked (near the hold cap) or more (an earlier, longer
                // grant still runs); the longest deadline given stands.
                if let Some(held) = self.clients[client].held.as_mut() {
                    if Some(held.lease_id) == op.lease_id {
                        held.stop_by_ms = held
                            .stop_by_ms
                            .max(stop_by(op.started_ms, renewed.lease_ttl_ms));
                    }
                }
            }
            (OpKind::Release, LockReply::Released { released }) => {
                let outcome = if !released && op.maybe_applied {
                    Err((true, "released=false after an ambiguous attempt".into()))
                } else {
                    Ok(Reply::Released { released })
                };
                self.complete(world, process, outcome);
            }
            (_, other) => {
                self.complete(
                    world,
                    process,
                    Err((true, format!("unexpected reply {other:?}"))),
                );
            }
        }
        self.think(world, client);
    }

    fn on_read(&mut self, world: &mut World, client: usize, r: Result<ReadReply, StoreError>) {
        let read = match r {
            Ok(read) => read,
            Err(e) => return self.refused(world, client, e),
        };
        let Some((_, process, _)) = self.settled(client) else {
            return;
        };
        // `held` is what the replicated state says: a record exists until a
        // command retires it. (The service's `Get` also calls a lease past
        // its expiry on the serving node's wall clock not held; with clocks
        // skewed between nodes that flag can go from false back to true
        // across a leader change, which the linear checker rejects — seed
        // 1945 found it when this client copied that rule. See the report
        // in docs/testing.md, "What it cannot see".)
        let reply = match read.view {
            Some(v) => Reply::Got {
                held: true,
                token: v.token.as_i64(),
                last_token: v.last_token.as_i64(),
                queue_len: v.queue_len,
            },
            None => Reply::Got {
                held: false,
                token: 0,
                last_token: 0,
                queue_len: 0,
            },
        };
        self.complete(world, process, Ok(reply));
        self.think(world, client);
    }

    /// Ends the run: no new calls; whatever is still open stays open (the
    /// history makes it unknown).
    pub fn stop(&mut self) {
        self.stopped = true;
    }
}
