//! Requests a node cannot read are the caller's fault, and the answer says
//! so with a typed error.
//!
//! tonic answers a request body that does not decode as its method's
//! message (a wrong wire type, a string that is not UTF-8) with `INTERNAL`,
//! and one over the decoding limit with `OUT_OF_RANGE`, both without an
//! [`ErrorDetail`]. A client reads `INTERNAL` without detail as a failure
//! in transport and retries, but a request that cannot be decoded fails
//! the same way every time. [`TypedDecodeErrors`] wraps a service and turns
//! those two answers into `MALFORMED_REQUEST` (`INVALID_ARGUMENT`) and
//! `MESSAGE_TOO_LARGE` (`RESOURCE_EXHAUSTED`, with the limit), both retry
//! NEVER. Nothing else passes through it changed: it only reads the status
//! tonic leaves in the response's extensions.

use std::convert::Infallible;
use std::task::{Context, Poll};

use fencelock_api::v1::{ErrorDetail, Reason};
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::{Code, Status};

/// What prost's decode errors start with (`prost::DecodeError`'s Display),
/// which tonic passes on as the status message.
const DECODE_FAILED: &str = "failed to decode Protobuf message";
/// tonic's words when a request message is over the decoding limit.
const DECODED_TOO_LARGE: &str = "decoded message length too large";

/// `S` with its decode failures answered as typed errors (module docs).
#[derive(Clone, Debug)]
pub struct TypedDecodeErrors<S> {
    inner: S,
    max_message_bytes: usize,
}

impl<S> TypedDecodeErrors<S> {
    /// `max_message_bytes` is the decoding limit `inner` was built with; it
    /// is what a MESSAGE_TOO_LARGE answer names.
    pub fn new(inner: S, max_message_bytes: usize) -> TypedDecodeErrors<S> {
        TypedDecodeErrors {
            inner,
            max_message_bytes,
        }
    }
}

impl<S: NamedService> NamedService for TypedDecodeErrors<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<Body>> for TypedDecodeErrors<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<B>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let answer = self.inner.call(request);
        let max_message_bytes = self.max_message_bytes;
        Box::pin(async move {
            let response = answer.await?;
            Ok(retyped(response, max_message_bytes))
        })
    }
}

/// `response` with a decode failure's status replaced by its typed error.
/// Such an answer is trailers-only (status in the headers, empty body), so
/// the new status's headers replace the old ones and the body stays.
fn retyped<B>(response: http::Response<B>, max_message_bytes: usize) -> http::Response<B> {
    let Some(detail) = response
        .extensions()
        .get::<Status>()
        .and_then(|status| typed_decode_error(status, max_message_bytes))
    else {
        return response;
    };
    let (_, body) = response.into_parts();
    let (parts, ()) = detail.to_status().into_http::<()>().into_parts();
    http::Response::from_parts(parts, body)
}

/// The typed error for a status tonic made because a request did not
/// decode; `None` for every other status.
pub fn typed_decode_error(status: &Status, max_message_bytes: usize) -> Option<ErrorDetail> {
    if ErrorDetail::from_status(status).is_some() {
        return None;
    }
    match status.code() {
        Code::Internal if status.message().starts_with(DECODE_FAILED) => Some(ErrorDetail::new(
            Reason::MalformedRequest,
            format!("the request does not decode: {}", status.message()),
        )),
        Code::OutOfRange if status.message().contains(DECODED_TOO_LARGE) => Some(ErrorDetail {
            max_allowed: max_message_bytes as u64,
            ..ErrorDetail::new(
                Reason::MessageTooLarge,
                format!(
                    "the request is larger than this node accepts \
                     (edge.max_message_bytes = {max_message_bytes}): {}",
                    status.message()
                ),
            )
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_decode_failures_are_retyped() {
        let decode = Status::internal("failed to decode Protobuf message: invalid string value");
        let detail = typed_decode_error(&decode, 1024).expect("retyped");
        assert_eq!(detail.reason(), Reason::MalformedRequest);
        assert_eq!(detail.code(), Code::InvalidArgument);

        let large = Status::out_of_range(
            "Error, decoded message length too large: found 2000 bytes, the limit is: 1024 bytes",
        );
        let detail = typed_decode_error(&large, 1024).expect("retyped");
        assert_eq!(detail.reason(), Reason::MessageTooLarge);
        assert_eq!(detail.max_allowed, 1024);

        // A server bug stays INTERNAL; an answer with a detail stays as it is.
        assert!(typed_decode_error(&Status::internal("oops"), 1024).is_none());
        let typed = ErrorDetail::new(Reason::Internal, "failed to decode Protobuf message");
        assert!(typed_decode_error(&typed.to_status(), 1024).is_none());
        // Too large on the way out is the server's business, not the caller's.
        let encoded = Status::out_of_range("Error, encoded message length too large");
        assert!(typed_decode_error(&encoded, 1024).is_none());
    }

    #[test]
    fn a_retyped_answer_carries_the_detail_in_its_headers() {
        let original = Status::internal("failed to decode Protobuf message: buffer underflow")
            .into_http::<Vec<u8>>();
        let response = retyped(original, 1024);
        let status = Status::from_header_map(response.headers()).expect("a status in the headers");
        assert_eq!(status.code(), Code::InvalidArgument);
        let detail = ErrorDetail::from_status(&status).expect("an ErrorDetail");
        assert_eq!(detail.reason(), Reason::MalformedRequest);
    }
}
