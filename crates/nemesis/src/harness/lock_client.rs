//! A recording lock client over raw gRPC: one logical call is invoked,
//! retried on other nodes with the same `request_id` until it gets a
//! definite answer or its deadline, and recorded as one operation whose
//! outcome is honest:
//!
//! * ok — the service answered;
//! * fail — it certainly took no effect (a refusal, or only attempts that
//!   the error contract says changed nothing);
//! * unknown — some attempt may have taken effect (a timeout, a dropped
//!   connection, `OUTCOME_UNKNOWN`, ...), and no later answer settled it.
//!
//! Raw gRPC instead of `fencelock-client` because the checkers need every
//! call's exact outcome; the client library hides retries on purpose.

use std::time::Duration;

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::AcquireMode as WireMode;
use fencelock_api::v1::{
    AcquireRequest, ErrorDetail, GetRequest, LeaseState, Reason, ReleaseRequest, RenewRequest,
};
use rand::Rng;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::recorder::Recorder;
use crate::history::{Call, Mode, ProcessId, Reply};
use crate::retry::{NO_EFFECT_REASONS, RETRIED_REASONS};

/// One attempt's timeout (plus the wait, for a waiting acquire).
pub const ATTEMPT_TIMEOUT_MS: u64 = 1_500;
/// A logical call gives up after this (plus the wait).
pub const CALL_DEADLINE_MS: u64 = 6_000;
pub const CONNECT_TIMEOUT_MS: u64 = 500;
/// Pause between attempts, in ms (random within).
const RETRY_PAUSE_MS: (u64, u64) = (20, 150);
/// Ends an unknown outcome recorded because a refusal came after an
/// attempt that may still apply: the service answered.
pub const AFTER_AMBIGUOUS_ATTEMPT: &str = "after an ambiguous attempt";
/// Starts the unknown outcome of an acquire whose retry was answered from
/// the dedup table with a lease that has ended since: the service
/// answered (the acquire took effect once), but the client never held it.
pub const LEASE_SINCE_ENDED: &str = "granted earlier, lease since ended";

/// How a logical call ended, before recording.
enum Ended<T> {
    Ok(T),
    /// A final refusal: the call took no effect.
    Refused(Reason),
    /// The deadline passed; `maybe_applied` if some attempt may have taken
    /// effect.
    GaveUp {
        maybe_applied: bool,
        last: String,
    },
}

/// What a recorded acquire returned to the caller.
pub struct Grant {
    pub lease_id: Vec<u8>,
    pub token: i64,
    /// The time the answer granted (`lease_ttl_ms`), counted from the send
    /// of the acquire: what the stop-by deadline is computed from, never
    /// the TTL asked for.
    pub ttl_ms: u64,
}

pub struct LockClient {
    process: ProcessId,
    clients: Vec<LockServiceClient<Channel>>,
    next: usize,
    recorder: Recorder,
}

impl LockClient {
    pub fn new(process: ProcessId, endpoints: &[String], recorder: Recorder) -> LockClient {
        let clients = endpoints
            .iter()
            .map(|e| {
                let channel = Endpoint::from_shared(e.clone())
                    .expect("endpoint URLs are built by the harness")
                    .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
                    .connect_lazy();
                LockServiceClient::new(channel)
            })
            .collect();
        LockClient {
            process,
            next: process as usize,
            clients,
            recorder,
        }
    }

    pub fn process(&self) -> ProcessId {
        self.process
    }

    /// Another client over the same connections (no new sockets), as
    /// process `process`, recording into `recorder`.
    pub fn sharing(&self, process: ProcessId, recorder: Recorder) -> LockClient {
        LockClient {
            process,
            next: process as usize,
            clients: self.clients.clone(),
            recorder,
        }
    }

    /// Runs attempts on rotating nodes until a definite answer or the
    /// deadline.
    async fn attempts<T, F, Fut>(&mut self, extra_ms: u64, attempt: F) -> Ended<T>
    where
        F: FnMut(LockServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        self.attempts_noting(extra_ms, attempt).await.0
    }

    /// [`Self::attempts`], also telling whether an attempt before the last
    /// may have taken effect.
    async fn attempts_noting<T, F, Fut>(
        &mut self,
        extra_ms: u64,
        mut attempt: F,
    ) -> (Ended<T>, bool)
    where
        F: FnMut(LockServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let deadline = Instant::now() + Duration::from_millis(CALL_DEADLINE_MS + extra_ms);
        let mut maybe_applied = false;
        let mut last;
        loop {
            let client = self.clients[self.next % self.clients.len()].clone();
            let timeout = Duration::from_millis(ATTEMPT_TIMEOUT_MS + extra_ms);
            match tokio::time::timeout(timeout, attempt(client)).await {
                Ok(Ok(value)) => return (Ended::Ok(value), maybe_applied),
                Ok(Err(status)) => match ErrorDetail::from_status(&status) {
                    Some(detail) if !RETRIED_REASONS.contains(&detail.reason()) => {
                        return (Ended::Refused(detail.reason()), maybe_applied);
                    }
                    Some(detail) => {
                        maybe_applied |= !NO_EFFECT_REASONS.contains(&detail.reason());
                        last = detail.reason().as_str_name().to_owned();
                    }
                    None => {
                        maybe_applied = true;
                        last = format!("{:?}: {}", status.code(), status.message());
                    }
                },
                Err(_) => {
                    maybe_applied = true;
                    last = "attempt timed out".into();
                }
            }
            self.next += 1;
            let pause = rand::rng().random_range(RETRY_PAUSE_MS.0..=RETRY_PAUSE_MS.1);
            if Instant::now() + Duration::from_millis(pause) >= deadline {
                return (
                    Ended::GaveUp {
                        maybe_applied,
                        last,
                    },
                    maybe_applied,
                );
            }
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// Records a definite refusal or a give-up.
    fn record_end<T>(&self, ended: Ended<T>) {
        match ended {
            Ended::Ok(_) => unreachable!("ok is recorded with its reply"),
            Ended::Refused(reason) => self
                .recorder
                .fail(self.process, reason.as_str_name().to_owned()),
            Ended::GaveUp {
                maybe_applied: true,
                last,
            } => self.recorder.unknown(self.process, last),
            Ended::GaveUp {
                maybe_applied: false,
                last,
            } => self.recorder.fail(self.process, last),
        }
    }

    pub async fn acquire(
        &mut self,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Option<Grant> {
        self.acquire_in(resource, request_id, ttl_ms, wait_ms, Mode::Exclusive)
            .await
    }

    /// An acquire in `mode` (shared, or one of a semaphore's permits).
    pub async fn acquire_in(
        &mut self,
        resource: &str,
        request_id: &str,
        ttl_ms: u64,
        wait_ms: u64,
        mode: Mode,
    ) -> Option<Grant> {
        self.recorder.invoke(
            self.process,
            Call::Acquire {
                resource: resource.to_owned(),
                request_id: request_id.to_owned(),
                ttl_ms,
                wait_ms,
                mode,
            },
        );
        let (wire_mode, permits) = match mode {
            Mode::Exclusive => (WireMode::Exclusive, 0),
            Mode::Shared => (WireMode::Shared, 0),
            Mode::Semaphore(permits) => (WireMode::Semaphore, permits),
        };
        let req = AcquireRequest {
            resource: resource.to_owned(),
            request_id: request_id.as_bytes().to_vec(),
            lease_ttl_ms: ttl_ms,
            wait_timeout_ms: wait_ms,
            value: Vec::new(),
            mode: wire_mode as i32,
            permits,
        };
        let (ended, earlier_maybe_applied) = self
            .attempts_noting(wait_ms, |mut c| {
                let req = req.clone();
                async move { c.acquire(req).await.map(|r| r.into_inner()) }
            })
            .await;
        match ended {
            // A refusal after an attempt that may have been applied is not
            // trusted: that attempt could still be in flight (delayed in a
            // forwarding hop) and be applied after the refusal.
            Ended::Refused(reason) if earlier_maybe_applied => {
                self.recorder.unknown(
                    self.process,
                    format!("{} {AFTER_AMBIGUOUS_ATTEMPT}", reason.as_str_name()),
                );
                None
            }
            // A retry answered from the dedup table with a lease that has
            // ended since (released, expired, or cancelled because an
            // earlier attempt's caller went away): the acquire took effect
            // once, but this client never held the lock and must not use
            // the lease. Not a grant; its effect is recorded as unknown.
            Ended::Ok(a) if a.lease_state() != LeaseState::Held => {
                self.recorder.unknown(
                    self.process,
                    format!("{LEASE_SINCE_ENDED} ({})", a.lease_state().as_str_name()),
                );
                None
            }
            Ended::Ok(a) => {
                self.recorder.ok(
                    self.process,
                    Reply::Acquired {
                        lease_id: hex::encode(&a.lease_id),
                        token: a.fencing_token,
                        deduplicated: a.deduplicated,
                        granted_ttl_ms: Some(a.lease_ttl_ms),
                    },
                );
                Some(Grant {
                    lease_id: a.lease_id,
                    token: a.fencing_token,
                    ttl_ms: a.lease_ttl_ms,
                })
            }
            other => {
                self.record_end(other);
                None
            }
        }
    }

    /// If renewed, the time the renewal granted (`lease_ttl_ms`, counted
    /// from the send of the renew; it may differ from `ttl_ms`).
    pub async fn renew(&mut self, resource: &str, lease_id: &[u8], ttl_ms: u64) -> Option<u64> {
        self.recorder.invoke(
            self.process,
            Call::Renew {
                resource: resource.to_owned(),
                lease_id: hex::encode(lease_id),
                ttl_ms,
            },
        );
        let req = RenewRequest {
            resource: resource.to_owned(),
            lease_id: lease_id.to_vec(),
            lease_ttl_ms: ttl_ms,
        };
        match self
            .attempts(0, |mut c| {
                let req = req.clone();
                async move { c.renew(req).await.map(|r| r.into_inner()) }
            })
            .await
        {
            Ended::Ok(r) => {
                self.recorder.ok(
                    self.process,
                    Reply::Renewed {
                        granted_ttl_ms: Some(r.lease_ttl_ms),
                    },
                );
                Some(r.lease_ttl_ms)
            }
            other => {
                self.record_end(other);
                None
            }
        }
    }

    /// Releases; `Some(released)` on a definite answer (`false`: the lease
    /// had already ended), `None` when none came or it is ambiguous.
    pub async fn release(&mut self, resource: &str, lease_id: &[u8]) -> Option<bool> {
        self.recorder.invoke(
            self.process,
            Call::Release {
                resource: resource.to_owned(),
                lease_id: hex::encode(lease_id),
            },
        );
        let req = ReleaseRequest {
            resource: resource.to_owned(),
            lease_id: lease_id.to_vec(),
        };
        let (ended, earlier_maybe_applied) = self
            .attempts_noting(0, |mut c| {
                let req = req.clone();
                async move { c.release(req).await.map(|r| r.into_inner().released) }
            })
            .await;
        match ended {
            // `false` after an attempt that may have released the lease says
            // nothing: that attempt may be what ended it.
            Ended::Ok(false) if earlier_maybe_applied => {
                self.recorder.unknown(
                    self.process,
                    format!("released=false {AFTER_AMBIGUOUS_ATTEMPT}"),
                );
                None
            }
            Ended::Ok(released) => {
                self.recorder.ok(self.process, Reply::Released { released });
                Some(released)
            }
            other => {
                self.record_end(other);
                None
            }
        }
    }

    pub async fn get(&mut self, resource: &str) -> Option<(bool, i64, u32)> {
        self.recorder.invoke(
            self.process,
            Call::Get {
                resource: resource.to_owned(),
            },
        );
        let req = GetRequest {
            resource: resource.to_owned(),
        };
        match self
            .attempts(0, |mut c| {
                let req = req.clone();
                async move { c.get(req).await.map(|r| r.into_inner()) }
            })
            .await
        {
            Ended::Ok(g) => {
                self.recorder.ok(
                    self.process,
                    Reply::Got {
                        held: g.held,
                        token: g.fencing_token,
                        last_token: g.last_token,
                        queue_len: g.queue_length,
                    },
                );
                Some((g.held, g.fencing_token, g.queue_length))
            }
            other => {
                self.record_end(other);
                None
            }
        }
    }
}
