//! The error model on the wire: [`Reason`] → gRPC code, and [`ErrorDetail`]
//! in and out of a `tonic::Status`.
//!
//! An error travels the way the gRPC rich error model expects, so clients in
//! every language can read it: the status details (the
//! `grpc-status-details-bin` trailer) hold an encoded `google.rpc.Status`
//! whose `details` carry one `google.protobuf.Any` wrapping the
//! [`ErrorDetail`] (type URL [`ERROR_DETAIL_TYPE_URL`]). Putting a bare
//! `ErrorDetail` there instead would break clients such as grpc-go, which
//! parse that trailer as a `google.rpc.Status` and turn a failure to do so
//! into `INTERNAL`.
//!
//! The code and default retry advice of every reason live in one table,
//! read through [`wire_code_for`] (`code_for` with the `grpc` feature) and
//! [`default_retry`]; `errors.proto` documents the same table, and a test
//! checks that the two agree. The table and the retry advice need no gRPC
//! library: crates below the gRPC edge (the store loop, the controller, the
//! simulation) build them without tonic.

use std::time::Duration;

#[cfg(feature = "grpc")]
use prost::Message;
#[cfg(feature = "grpc")]
use tonic::Code;

use crate::v1::{ErrorDetail, Reason, RetryPolicy};

/// The gRPC status codes the error model uses, numbered as gRPC numbers
/// them, so the table below needs no gRPC library and the gRPC edge converts
/// one to one (a test checks the numbers against tonic's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum WireCode {
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    Internal = 13,
    Unavailable = 14,
}

/// The `Any` type URL under which an [`ErrorDetail`] travels in the status
/// details.
pub const ERROR_DETAIL_TYPE_URL: &str = "type.googleapis.com/fencelock.v1.ErrorDetail";

/// The fully qualified protobuf name of [`ErrorDetail`]; the part of a type
/// URL after its last `/`.
#[cfg(feature = "grpc")]
const ERROR_DETAIL_FULL_NAME: &str = "fencelock.v1.ErrorDetail";

/// The gRPC code a call failing for `reason` ends with.
pub fn wire_code_for(reason: Reason) -> WireCode {
    policy(reason).0
}

/// The gRPC code a call failing for `reason` ends with, as tonic's type.
#[cfg(feature = "grpc")]
pub fn code_for(reason: Reason) -> Code {
    Code::from_i32(wire_code_for(reason) as i32)
}

/// What a client should do after `reason` when the server sent no explicit
/// [`RetryPolicy`]. Servers fill [`ErrorDetail::retry`] with this unless they
/// know better for the case at hand (for example IMMEDIATELY for
/// SHUTTING_DOWN when they can name the leader).
pub fn default_retry(reason: Reason) -> RetryPolicy {
    policy(reason).1
}

/// The one table of gRPC code and default retry advice per reason. It is an
/// exhaustive match, so a new reason does not compile until it has a row;
/// keep it in step with the comments in `errors.proto` (a test checks).
fn policy(reason: Reason) -> (WireCode, RetryPolicy) {
    use Reason as R;
    use RetryPolicy as P;
    use WireCode as Code;
    match reason {
        R::Unspecified => (Code::Unknown, P::Never),

        R::InvalidResource
        | R::InvalidRequestId
        | R::InvalidLeaseId
        | R::TtlOutOfRange
        | R::WaitTimeoutOutOfRange
        | R::BatchTooLarge
        | R::RequestIdReused
        | R::InvalidAdminRequest
        | R::ValueTooLarge
        | R::InvalidPermits
        | R::MalformedRequest => (Code::InvalidArgument, P::Never),

        R::LockHeld | R::WaitTimedOut => (Code::Aborted, P::Backoff),
        R::LeaseIdCollision => (Code::Aborted, P::Immediately),

        R::QueueFull
        | R::TenantWaitersExceeded
        | R::DedupTableFull
        | R::TableFull
        | R::TenantQuotaExceeded
        | R::ValuesFull
        | R::RateLimited => (Code::ResourceExhausted, P::Backoff),

        R::MessageTooLarge => (Code::ResourceExhausted, P::Never),

        R::PermissionDenied => (Code::PermissionDenied, P::Never),

        R::LeaseNotHeld | R::HoldLimitReached | R::PlacementConflict => {
            (Code::FailedPrecondition, P::Never)
        }

        R::FeatureNotEnabled | R::ModeMismatch => (Code::FailedPrecondition, P::Never),

        R::WaitCancelled => (Code::Cancelled, P::Never),

        R::NotLeader | R::OutcomeUnknown => (Code::Unavailable, P::Immediately),
        R::LeaderUnknown
        | R::NoQuorum
        | R::LeaderNotReady
        | R::TokenSpaceExhausted
        | R::ShuttingDown
        | R::ServerBusy => (Code::Unavailable, P::Backoff),

        R::EpochNotMatch => (Code::Aborted, P::Immediately),
        R::ShardNotFound | R::NodeNotFound => (Code::NotFound, P::Never),

        R::Internal => (Code::Internal, P::Backoff),
    }
}

/// A client's reading of an error's retry advice (see [`ErrorDetail::retry_hint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryHint {
    /// Retrying the same request cannot succeed.
    Never,
    /// Retry now: at [`ErrorDetail::leader`] when it is set, after refreshing
    /// the routing map for EPOCH_NOT_MATCH. Bound the number of immediate
    /// retries, then back off.
    Immediately,
    /// Retry after this long, plus jitter.
    After(Duration),
    /// Retry with exponential backoff and jitter, starting from `initial`
    /// when the server suggested a first step, else from the client's base
    /// delay.
    Backoff { initial: Option<Duration> },
}

impl ErrorDetail {
    /// An error for `reason` with its default retry advice and nothing else
    /// set. Fill the other fields (leader hint, epoch, limits, ...) with
    /// struct update syntax: `ErrorDetail { shard_id, ..ErrorDetail::new(..) }`.
    pub fn new(reason: Reason, message: impl Into<String>) -> ErrorDetail {
        ErrorDetail {
            reason: reason as i32,
            message: message.into(),
            retry: default_retry(reason) as i32,
            ..ErrorDetail::default()
        }
    }

    /// The gRPC code for this error's reason. An unknown reason value (from a
    /// newer peer) reads as UNSPECIFIED, hence [`Code::Unknown`].
    #[cfg(feature = "grpc")]
    pub fn code(&self) -> Code {
        code_for(self.reason())
    }

    /// The status a call failing with this error ends with: code from
    /// [`code_for`], message `"<REASON>: <message>"`, and this detail in the
    /// status details (see the module docs for the encoding).
    #[cfg(feature = "grpc")]
    pub fn to_status(&self) -> tonic::Status {
        let code = self.code();
        let message = format!("{}: {}", reason_name(self.reason()), self.message);
        let rpc_status = RpcStatus {
            code: code as i32,
            message: message.clone(),
            details: vec![prost_types::Any {
                type_url: ERROR_DETAIL_TYPE_URL.to_owned(),
                value: self.encode_to_vec(),
            }],
        };
        tonic::Status::with_details(code, message, rpc_status.encode_to_vec().into())
    }

    /// Reads the [`ErrorDetail`] back from a status made by
    /// [`ErrorDetail::to_status`] (or by any gRPC library packing it into a
    /// `google.rpc.Status`). `None` when the status carries no such detail or
    /// its details do not decode; never panics on malformed bytes.
    #[cfg(feature = "grpc")]
    pub fn from_status(status: &tonic::Status) -> Option<ErrorDetail> {
        let details = status.details();
        if details.is_empty() {
            return None;
        }
        let rpc_status = RpcStatus::decode(details).ok()?;
        rpc_status
            .details
            .iter()
            .find(|any| type_name(&any.type_url) == ERROR_DETAIL_FULL_NAME)
            .and_then(|any| ErrorDetail::decode(any.value.as_slice()).ok())
    }

    /// `status` as it is when it carries an `ErrorDetail`; otherwise the
    /// call broke off without an answer (the node died, the connection
    /// dropped), so what it asked for may or may not have happened:
    /// `OUTCOME_UNKNOWN` for `shard_id` (0: none), saying `context` first
    /// and the transport's words after.
    #[cfg(feature = "grpc")]
    pub fn or_outcome_unknown(
        status: tonic::Status,
        shard_id: u64,
        context: &str,
    ) -> tonic::Status {
        if ErrorDetail::from_status(&status).is_some() {
            return status;
        }
        ErrorDetail {
            shard_id,
            ..ErrorDetail::new(
                Reason::OutcomeUnknown,
                format!(
                    "{context} (the call broke off without an answer: {:?}: {})",
                    status.code(),
                    status.message()
                ),
            )
        }
        .to_status()
    }

    /// What to do next: the server's [`RetryPolicy`] when it sent one the
    /// client knows, else the reason's [`default_retry`].
    pub fn retry_hint(&self) -> RetryHint {
        let policy = match RetryPolicy::try_from(self.retry) {
            Ok(RetryPolicy::Unspecified) | Err(_) => default_retry(self.reason()),
            Ok(known) => known,
        };
        let retry_after = Duration::from_millis(self.retry_after_ms);
        match policy {
            RetryPolicy::Unspecified | RetryPolicy::Never => RetryHint::Never,
            RetryPolicy::Immediately => RetryHint::Immediately,
            RetryPolicy::After => RetryHint::After(retry_after),
            RetryPolicy::Backoff => RetryHint::Backoff {
                initial: (self.retry_after_ms > 0).then_some(retry_after),
            },
        }
    }
}

#[cfg(feature = "grpc")]
impl From<ErrorDetail> for tonic::Status {
    fn from(detail: ErrorDetail) -> tonic::Status {
        detail.to_status()
    }
}

impl std::fmt::Display for ErrorDetail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", reason_name(self.reason()), self.message)
    }
}

impl std::error::Error for ErrorDetail {}

/// The reason's proto name without the `REASON_` prefix, e.g. `LOCK_HELD`.
fn reason_name(reason: Reason) -> &'static str {
    let name = reason.as_str_name();
    name.strip_prefix("REASON_").unwrap_or(name)
}

/// The message name of a type URL: what follows its last `/`.
#[cfg(feature = "grpc")]
fn type_name(type_url: &str) -> &str {
    type_url.rsplit('/').next().unwrap_or(type_url)
}

/// `google.rpc.Status`, the envelope gRPC libraries expect in the status
/// details. Declared here (three fields, wire-compatible with
/// `google/rpc/status.proto`) rather than pulled in with the googleapis
/// protos, which the public contract does not otherwise need.
#[cfg(feature = "grpc")]
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

#[cfg(all(test, feature = "grpc"))]
mod tests {
    use super::*;

    #[test]
    fn a_status_without_a_detail_becomes_outcome_unknown_and_one_with_a_detail_is_kept() {
        let broke_off = tonic::Status::unknown("transport error");
        let unknown = ErrorDetail::or_outcome_unknown(broke_off, 7, "moving a replica");
        let detail = ErrorDetail::from_status(&unknown).expect("a detail");
        assert_eq!(detail.reason(), Reason::OutcomeUnknown);
        assert_eq!(detail.shard_id, 7);
        assert!(
            detail.message.starts_with("moving a replica"),
            "{}",
            detail.message
        );
        assert!(
            detail.message.contains("transport error"),
            "{}",
            detail.message
        );
        assert_eq!(unknown.code(), code_for(Reason::OutcomeUnknown));

        let held = ErrorDetail::new(Reason::LockHeld, "held").to_status();
        let kept = ErrorDetail::or_outcome_unknown(held, 7, "ignored");
        assert_eq!(
            ErrorDetail::from_status(&kept).unwrap().reason(),
            Reason::LockHeld
        );
    }
    use crate::v1::LeaderHint;

    /// Every value of [`Reason`], read from the generated enum itself: the
    /// values are dense from 0, so this stops at the first gap.
    fn all_reasons() -> Vec<Reason> {
        let reasons: Vec<Reason> = (0..).map_while(|n| Reason::try_from(n).ok()).collect();
        assert!(reasons.len() > 30, "Reason values must stay dense from 0");
        reasons
    }

    /// A detail with every field set, so a round trip checks them all.
    fn full_detail(reason: Reason) -> ErrorDetail {
        ErrorDetail {
            retry_after_ms: 250,
            leader: Some(LeaderHint {
                node_id: 3,
                address: "10.0.0.3:7000".to_owned(),
            }),
            shard_id: 17,
            current_epoch: 9,
            map_version: 42,
            holder_expires_at_ms: 1_700_000_000_000,
            queue_length: 5,
            min_allowed: 1_000,
            max_allowed: 600_000,
            field: "items[3].lease_ttl_ms".to_owned(),
            ..ErrorDetail::new(reason, format!("test {reason:?}"))
        }
    }

    #[test]
    fn every_reason_round_trips_through_a_status() {
        for reason in all_reasons() {
            let detail = full_detail(reason);
            let status = detail.to_status();
            assert_eq!(status.code(), code_for(reason), "{reason:?}");
            assert!(
                status.message().starts_with(reason_name(reason)),
                "{reason:?}: {}",
                status.message()
            );
            assert_eq!(ErrorDetail::from_status(&status), Some(detail.clone()));

            // The bare default detail survives too (all optional fields unset).
            let bare = ErrorDetail::new(reason, "");
            assert_eq!(
                ErrorDetail::from_status(&bare.into()),
                Some(ErrorDetail::new(reason, ""))
            );
        }
    }

    #[test]
    fn every_reason_but_unspecified_has_a_specific_code() {
        for reason in all_reasons() {
            let code = code_for(reason);
            if reason == Reason::Unspecified {
                assert_eq!(code, Code::Unknown);
                continue;
            }
            assert!(
                !matches!(code, Code::Ok | Code::Unknown),
                "{reason:?} maps to {code:?}"
            );
            assert_ne!(
                default_retry(reason),
                RetryPolicy::Unspecified,
                "{reason:?}"
            );
        }
    }

    #[test]
    fn wire_codes_are_the_grpc_code_numbers() {
        let pairs = [
            (WireCode::Cancelled, Code::Cancelled),
            (WireCode::Unknown, Code::Unknown),
            (WireCode::InvalidArgument, Code::InvalidArgument),
            (WireCode::NotFound, Code::NotFound),
            (WireCode::PermissionDenied, Code::PermissionDenied),
            (WireCode::ResourceExhausted, Code::ResourceExhausted),
            (WireCode::FailedPrecondition, Code::FailedPrecondition),
            (WireCode::Aborted, Code::Aborted),
            (WireCode::Internal, Code::Internal),
            (WireCode::Unavailable, Code::Unavailable),
        ];
        for (wire, code) in pairs {
            assert_eq!(Code::from_i32(wire as i32), code, "{wire:?}");
        }
    }

    #[test]
    fn code_table_matches_the_contract() {
        // Spot checks of the table that clients depend on most.
        assert_eq!(code_for(Reason::LockHeld), Code::Aborted);
        assert_eq!(code_for(Reason::LeaseNotHeld), Code::FailedPrecondition);
        assert_eq!(code_for(Reason::NotLeader), Code::Unavailable);
        assert_eq!(code_for(Reason::OutcomeUnknown), Code::Unavailable);
        assert_eq!(code_for(Reason::EpochNotMatch), Code::Aborted);
        assert_eq!(code_for(Reason::QueueFull), Code::ResourceExhausted);
        assert_eq!(code_for(Reason::WaitCancelled), Code::Cancelled);
        assert_eq!(code_for(Reason::ShardNotFound), Code::NotFound);
        assert_eq!(code_for(Reason::ServerBusy), Code::Unavailable);
        assert_eq!(default_retry(Reason::ServerBusy), RetryPolicy::Backoff);
        assert_eq!(default_retry(Reason::LeaseNotHeld), RetryPolicy::Never);
        assert_eq!(
            default_retry(Reason::OutcomeUnknown),
            RetryPolicy::Immediately
        );
    }

    #[test]
    fn status_details_are_a_google_rpc_status() {
        // What grpc-go and other libraries require of the details trailer:
        // a google.rpc.Status whose code and message match the status.
        let status = ErrorDetail::new(Reason::NoQuorum, "no majority").to_status();
        let envelope = RpcStatus::decode(status.details()).unwrap();
        assert_eq!(envelope.code, status.code() as i32);
        assert_eq!(envelope.message, status.message());
        assert_eq!(envelope.details.len(), 1);
        assert_eq!(envelope.details[0].type_url, ERROR_DETAIL_TYPE_URL);
    }

    #[test]
    fn any_type_url_prefix_is_accepted() {
        let detail = ErrorDetail::new(Reason::LockHeld, "held");
        let envelope = RpcStatus {
            code: Code::Aborted as i32,
            message: "held".to_owned(),
            details: vec![
                prost_types::Any {
                    type_url: "type.googleapis.com/google.rpc.ErrorInfo".to_owned(),
                    value: vec![1, 2, 3],
                },
                prost_types::Any {
                    type_url: "example.com/types/fencelock.v1.ErrorDetail".to_owned(),
                    value: detail.encode_to_vec(),
                },
            ],
        };
        let status =
            tonic::Status::with_details(Code::Aborted, "held", envelope.encode_to_vec().into());
        assert_eq!(ErrorDetail::from_status(&status), Some(detail));
    }

    #[test]
    fn statuses_without_an_error_detail_decode_to_none() {
        assert_eq!(
            ErrorDetail::from_status(&tonic::Status::unavailable("x")),
            None
        );

        let other_type = RpcStatus {
            code: Code::Internal as i32,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".to_owned(),
                value: Vec::new(),
            }],
        };
        let status =
            tonic::Status::with_details(Code::Internal, "x", other_type.encode_to_vec().into());
        assert_eq!(ErrorDetail::from_status(&status), None);
    }

    #[test]
    fn garbage_details_decode_to_none_without_panicking() {
        let with_details = |bytes: Vec<u8>| {
            ErrorDetail::from_status(&tonic::Status::with_details(
                Code::Internal,
                "garbage",
                bytes.into(),
            ))
        };
        // Malformed envelopes: truncated varint, length past the end,
        // wrong wire type for `details`, an invalid wire type.
        for bytes in [
            vec![0x08, 0xff],
            vec![0x12, 0x10, b'a'],
            vec![0x18, 0x01],
            vec![0x0f],
            vec![0xff; 16],
        ] {
            assert_eq!(with_details(bytes.clone()), None, "{bytes:02x?}");
        }
        // A well-formed envelope whose ErrorDetail payload is malformed.
        let bad_payload = RpcStatus {
            code: Code::Internal as i32,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: ERROR_DETAIL_TYPE_URL.to_owned(),
                value: vec![0x12, 0x7f],
            }],
        };
        assert_eq!(with_details(bad_payload.encode_to_vec()), None);

        // Every truncation and every single-byte corruption of a valid
        // encoding: any answer is fine as long as decoding does not panic.
        let valid = full_detail(Reason::NotLeader)
            .to_status()
            .details()
            .to_vec();
        for len in 0..valid.len() {
            let _ = with_details(valid[..len].to_vec());
        }
        for pos in 0..valid.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut corrupt = valid.clone();
                corrupt[pos] ^= flip;
                let _ = with_details(corrupt);
            }
        }
    }

    #[test]
    fn retry_hint_follows_the_server_then_the_default() {
        let detail = |reason, retry: RetryPolicy, after_ms| ErrorDetail {
            retry: retry as i32,
            retry_after_ms: after_ms,
            ..ErrorDetail::new(reason, "")
        };
        assert_eq!(
            detail(Reason::LeaseNotHeld, RetryPolicy::Unspecified, 0).retry_hint(),
            RetryHint::Never
        );
        assert_eq!(
            detail(Reason::NotLeader, RetryPolicy::Unspecified, 0).retry_hint(),
            RetryHint::Immediately
        );
        assert_eq!(
            detail(Reason::LockHeld, RetryPolicy::Unspecified, 0).retry_hint(),
            RetryHint::Backoff { initial: None }
        );
        assert_eq!(
            detail(Reason::NoQuorum, RetryPolicy::Backoff, 40).retry_hint(),
            RetryHint::Backoff {
                initial: Some(Duration::from_millis(40))
            }
        );
        assert_eq!(
            detail(Reason::LeaderNotReady, RetryPolicy::After, 5).retry_hint(),
            RetryHint::After(Duration::from_millis(5))
        );
        // An explicit policy wins over the reason's default.
        assert_eq!(
            detail(Reason::ShuttingDown, RetryPolicy::Immediately, 0).retry_hint(),
            RetryHint::Immediately
        );
        // A policy value this client does not know falls back to the default.
        let unknown = ErrorDetail {
            retry: 99,
            ..ErrorDetail::new(Reason::QueueFull, "")
        };
        assert_eq!(unknown.retry_hint(), RetryHint::Backoff { initial: None });
        // So does a reason this client does not know: never retry blindly.
        let unknown_reason = ErrorDetail {
            reason: 9_999,
            retry: RetryPolicy::Unspecified as i32,
            ..ErrorDetail::default()
        };
        assert_eq!(unknown_reason.code(), Code::Unknown);
        assert_eq!(unknown_reason.retry_hint(), RetryHint::Never);
    }

    #[test]
    fn new_fills_the_default_retry() {
        for reason in all_reasons() {
            assert_eq!(ErrorDetail::new(reason, "").retry(), default_retry(reason));
        }
    }
}
