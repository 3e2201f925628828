//! Reading a failed attempt the way `errors.proto` asks: what to do next
//! ([`Advice`]), where to send the retry ([`Reroute`]), and how long to wait
//! ([`Backoff`]).

use std::time::Duration;

use fencelock_api::status::RetryHint;
use fencelock_api::v1::{ErrorDetail, Reason};
use rand::Rng as _;
use tonic::Code;

/// Immediate retries (redirects included) one call may make before it
/// backs off even when told to retry at once. `errors.proto` asks for a
/// bound: two nodes that each name the other as leader must not spin.
pub const MAX_IMMEDIATE_RETRIES: u32 = 5;

/// Largest doubling exponent: past it the step is at its maximum anyway,
/// and the shift must not overflow.
const MAX_BACKOFF_DOUBLINGS: u32 = 16;

/// What the error contract says to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Advice {
    /// A definitive answer: give up.
    Fail,
    /// Retry at once (bounded by [`MAX_IMMEDIATE_RETRIES`]).
    Now,
    /// Retry after this long, plus jitter.
    After(Duration),
    /// Retry with exponential backoff, from this first step when the server
    /// suggested one.
    Backoff(Option<Duration>),
}

/// Where the retry goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reroute {
    /// The same node: it can serve the shard, only not right now.
    Stay,
    /// The shard's leader, as hinted by the answering node (`host:port`).
    To(String),
    /// Another node: the answering one cannot serve the shard (unreachable,
    /// no leader, on the minority side) and its route is forgotten.
    Elsewhere,
    /// The client's idea of the resource's shard is stale: forget it.
    Refresh,
}

/// One failed attempt, read.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub advice: Advice,
    pub reroute: Reroute,
    /// The server's detail, when it sent one.
    pub detail: Option<ErrorDetail>,
    /// `REASON: message` or `CODE: message`, for errors and logs.
    pub summary: String,
    /// The attempt failed to open its connection: the request never left
    /// the client, so it cannot have taken effect.
    pub never_sent: bool,
}

/// Whether `status` is a failure to connect (refused, unreachable, no such
/// address): the request was never sent. Anything else, a timeout or a
/// connection cut mid-call above all, may have reached a node.
pub(crate) fn is_connect_failure(status: &tonic::Status) -> bool {
    use std::io::ErrorKind;
    if status.code() != Code::Unavailable || ErrorDetail::from_status(status).is_some() {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::AddrNotAvailable
                    | ErrorKind::NetworkUnreachable
                    | ErrorKind::HostUnreachable
            ) {
                return true;
            }
        }
        source = error.source();
    }
    false
}

/// Reads a failed attempt.
pub(crate) fn classify(status: &tonic::Status) -> Failure {
    match ErrorDetail::from_status(status) {
        Some(detail) => classify_detail(detail, status.code()),
        None => {
            let summary = format!("{:?}: {}", status.code(), status.message());
            let (advice, reroute) = by_code(status.code());
            Failure {
                advice,
                reroute,
                detail: None,
                summary,
                never_sent: is_connect_failure(status),
            }
        }
    }
}

/// Reads an error detail that came with gRPC code `code` (for a failed
/// `RenewBatch` item: the code the item would have had alone).
pub(crate) fn classify_detail(detail: ErrorDetail, code: Code) -> Failure {
    let (advice, reroute) = if Reason::try_from(detail.reason).is_ok() {
        advise(&detail)
    } else {
        // A reason this client does not know (a newer server): the gRPC
        // code decides, as `errors.proto` asks.
        by_code(code)
    };
    Failure {
        advice,
        reroute,
        summary: detail.to_string(),
        detail: Some(detail),
        never_sent: false,
    }
}

/// Advice from the gRPC code alone, for failures without a known reason.
fn by_code(code: Code) -> (Advice, Reroute) {
    match code {
        // The attempt never got an answer (or one this client cannot read):
        // the node may be down or the connection cut, and another node may
        // serve the shard.
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::Internal => (Advice::Backoff(None), Reroute::Elsewhere),
        _ => (Advice::Fail, Reroute::Stay),
    }
}

/// An answer with a known reason: the server's retry policy (or the
/// reason's default) decides whether and when; the reason decides where.
fn advise(detail: &ErrorDetail) -> (Advice, Reroute) {
    let hinted = detail
        .leader
        .as_ref()
        .map(|l| l.address.clone())
        .filter(|a| !a.is_empty());
    let reroute = match detail.reason() {
        Reason::NotLeader | Reason::ShuttingDown => match &hinted {
            Some(address) => Reroute::To(address.clone()),
            None => Reroute::Elsewhere,
        },
        Reason::LeaderUnknown | Reason::NoQuorum => Reroute::Elsewhere,
        Reason::EpochNotMatch | Reason::ShardNotFound => Reroute::Refresh,
        _ => Reroute::Stay,
    };
    let advice = match detail.retry_hint() {
        RetryHint::Never => Advice::Fail,
        RetryHint::Immediately => Advice::Now,
        RetryHint::After(delay) => Advice::After(delay),
        // SHUTTING_DOWN with a named leader: that leader can answer now.
        RetryHint::Backoff { .. } if matches!(reroute, Reroute::To(_)) => Advice::Now,
        RetryHint::Backoff { initial } => Advice::Backoff(initial),
    };
    (advice, reroute)
}

/// The delays between the retries of one call.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    doublings: u32,
    immediate_left: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            doublings: 0,
            immediate_left: MAX_IMMEDIATE_RETRIES,
        }
    }

    /// How long to wait before the next attempt, given the advice. Jittered,
    /// so that many clients failing together do not retry together.
    pub fn delay(&mut self, advice: Advice) -> Duration {
        match advice {
            Advice::Fail => Duration::ZERO,
            Advice::Now if self.immediate_left > 0 => {
                self.immediate_left -= 1;
                Duration::ZERO
            }
            Advice::Now => self.exponential(None),
            // The server knows why it wants this long: honour it, jitter
            // only upwards.
            Advice::After(delay) => delay + jitter_up_to(delay / 4),
            Advice::Backoff(first) => self.exponential(first),
        }
    }

    /// The next exponential step, jittered into its upper half.
    fn exponential(&mut self, first: Option<Duration>) -> Duration {
        let start = first.unwrap_or(self.base).min(self.max);
        let step = start
            .saturating_mul(1 << self.doublings.min(MAX_BACKOFF_DOUBLINGS))
            .min(self.max);
        self.doublings = self.doublings.saturating_add(1);
        step / 2 + jitter_up_to(step / 2)
    }
}

/// A uniformly random duration in `0..=limit`.
pub(crate) fn jitter_up_to(limit: Duration) -> Duration {
    let limit_us = u64::try_from(limit.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rand::rng().random_range(0..=limit_us))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_api::v1::{LeaderHint, RetryPolicy};

    fn status(detail: ErrorDetail) -> tonic::Status {
        detail.to_status()
    }

    #[test]
    fn not_leader_with_a_hint_goes_to_the_leader_at_once() {
        let f = classify(&status(ErrorDetail {
            leader: Some(LeaderHint {
                node_id: 2,
                address: "10.0.0.2:7001".into(),
            }),
            shard_id: 3,
            ..ErrorDetail::new(Reason::NotLeader, "")
        }));
        assert_eq!(f.advice, Advice::Now);
        assert_eq!(f.reroute, Reroute::To("10.0.0.2:7001".into()));
        assert_eq!(f.detail.unwrap().shard_id, 3);
    }

    #[test]
    fn never_is_never_retried() {
        for reason in [
            Reason::LeaseNotHeld,
            Reason::InvalidResource,
            Reason::RequestIdReused,
            Reason::WaitCancelled,
            Reason::HoldLimitReached,
        ] {
            let f = classify(&status(ErrorDetail::new(reason, "")));
            assert_eq!(f.advice, Advice::Fail, "{reason:?}");
        }
        // Even a reason that is retryable by default, when the server says
        // NEVER.
        let f = classify(&status(ErrorDetail {
            retry: RetryPolicy::Never as i32,
            ..ErrorDetail::new(Reason::NoQuorum, "")
        }));
        assert_eq!(f.advice, Advice::Fail);
    }

    #[test]
    fn unavailability_backs_off_and_moves_to_another_node() {
        for reason in [Reason::LeaderUnknown, Reason::NoQuorum] {
            let f = classify(&status(ErrorDetail::new(reason, "")));
            assert_eq!(f.advice, Advice::Backoff(None), "{reason:?}");
            assert_eq!(f.reroute, Reroute::Elsewhere, "{reason:?}");
        }
        let busy = classify(&status(ErrorDetail {
            retry_after_ms: 30,
            ..ErrorDetail::new(Reason::ServerBusy, "")
        }));
        assert_eq!(
            busy.advice,
            Advice::Backoff(Some(Duration::from_millis(30)))
        );
        assert_eq!(busy.reroute, Reroute::Stay);
        let unknown = classify(&status(ErrorDetail::new(Reason::OutcomeUnknown, "")));
        assert_eq!(unknown.advice, Advice::Now);
        let epoch = classify(&status(ErrorDetail::new(Reason::EpochNotMatch, "")));
        assert_eq!(epoch.reroute, Reroute::Refresh);
    }

    #[test]
    fn transport_failures_are_retried_elsewhere_and_other_codes_fail() {
        for s in [
            tonic::Status::unavailable("connection refused"),
            tonic::Status::deadline_exceeded("timeout"),
            tonic::Status::cancelled("reset"),
        ] {
            let f = classify(&s);
            assert_eq!(f.advice, Advice::Backoff(None));
            assert_eq!(f.reroute, Reroute::Elsewhere);
            assert!(f.detail.is_none());
        }
        assert_eq!(
            classify(&tonic::Status::unimplemented("no such service")).advice,
            Advice::Fail
        );
    }

    #[test]
    fn an_unknown_reason_falls_back_on_the_grpc_code() {
        let newer = ErrorDetail {
            reason: 9_999,
            ..ErrorDetail::default()
        };
        let s = tonic::Status::with_details(
            Code::Unavailable,
            "newer",
            newer.to_status().details().to_vec().into(),
        );
        assert_eq!(classify(&s).advice, Advice::Backoff(None));
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_maximum() {
        let base = Duration::from_millis(100);
        let max = Duration::from_millis(1_000);
        let mut b = Backoff::new(base, max);
        let steps: Vec<Duration> = (0..8).map(|_| b.delay(Advice::Backoff(None))).collect();
        for (i, d) in steps.iter().enumerate() {
            let full = (base * (1 << i)).min(max);
            assert!(
                *d >= full / 2 && *d <= full,
                "step {i}: {d:?} not in half of {full:?}"
            );
        }
    }

    #[test]
    fn immediate_retries_are_bounded_then_back_off() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..MAX_IMMEDIATE_RETRIES {
            assert_eq!(b.delay(Advice::Now), Duration::ZERO);
        }
        assert!(b.delay(Advice::Now) >= Duration::from_millis(50));
    }

    #[test]
    fn after_is_honoured_with_upward_jitter() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(20));
        let d = b.delay(Advice::After(Duration::from_millis(400)));
        assert!(d >= Duration::from_millis(400) && d <= Duration::from_millis(500));
    }
}
