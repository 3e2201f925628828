//! Wire compatibility with the previous release's clients.
//!
//! This crate owns a frozen copy of the previous release's public contract
//! (`proto/<release>/fencelock/v1/`, the commit [`PREVIOUS_RELEASE`], the
//! same one `make upgrade-test` upgrades from) and two ways of holding the
//! current contract to it:
//!
//! * [`previous`]: a tonic client generated from the frozen protos — what
//!   an application built against the previous release sends and decodes.
//!   The in-process cluster tests (`crates/server/tests/in_process/compat.rs`)
//!   drive today's nodes with it.
//! * [`schema::breaking_changes`]: a pure comparison of two descriptor sets
//!   that lists every change an old peer would misread (a field renumbered,
//!   retyped or dropped without a reservation, an enum value renumbered, a
//!   method gone or its shape changed). `tests/schema.rs` runs it on the
//!   frozen and the current contract.
//!
//! It is a test-support crate (`publish = false`): nothing in a node or a
//! client links it.

pub mod schema;

/// The commit whose contract is frozen here (the Makefile's
/// `PREVIOUS_RELEASE`).
pub const PREVIOUS_RELEASE: &str = env!("FENCELOCK_PREVIOUS_RELEASE");

/// Package `fencelock.v1` as the previous release declared it: messages and
/// clients only.
pub mod previous {
    include!(concat!(env!("OUT_DIR"), "/fencelock.v1.rs"));
}

/// The encoded `FileDescriptorSet` of the frozen contract.
pub const PREVIOUS_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/previous_descriptor.bin"));

/// `google.rpc.Status`, as the previous release's clients decoded the
/// status details (three fields, wire-compatible with
/// `google/rpc/status.proto`).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// The type URL the previous release read its `ErrorDetail` under.
pub const PREVIOUS_ERROR_DETAIL_TYPE_URL: &str = "type.googleapis.com/fencelock.v1.ErrorDetail";

/// The refusal in a status, read the way the previous release's clients
/// read it; `None` when the details do not hold one.
pub fn previous_error_detail(status: &tonic::Status) -> Option<previous::ErrorDetail> {
    use prost::Message;
    let envelope = RpcStatus::decode(status.details()).ok()?;
    let any = envelope
        .details
        .iter()
        .find(|a| a.type_url == PREVIOUS_ERROR_DETAIL_TYPE_URL)?;
    previous::ErrorDetail::decode(any.value.as_slice()).ok()
}
