//! The public gRPC contract of fencelock, compiled for Rust.
//!
//! This crate owns:
//! - [`v1`]: the messages and (feature `grpc`, on by default) the tonic
//!   clients and servers generated from `proto/fencelock/v1/*.proto` (package `fencelock.v1`): `LockService`
//!   (acquire, renew, batch renew, release, get) and `AdminService`
//!   (placement). The `.proto` files are the user-facing contract; their
//!   comments are the reference for every field.
//! - [`status`]: the error model: which gRPC code each
//!   [`Reason`](v1::Reason) maps to ([`status::wire_code_for`]), and (with
//!   `grpc`) how an [`ErrorDetail`](v1::ErrorDetail) travels in a
//!   `tonic::Status` and is read back.
//! - [`refusal`]: the pure core's refusals (`LockError`, `PlacementError`)
//!   in the contract's words, and the retry advice nodes give, so the store
//!   loop, the controller and the server answer them alike.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for gRPC reflection.
//! - [`headers`]: the request metadata keys nodes and clients agree on.
//! - [`internal`]: the internal peer protocol (Raft message streams, the
//!   `NodeControl` service), generated from `proto/fencelock/internal/`:
//!   not a public contract, but one copy for every crate that speaks it.
//!
//! Without the `grpc` feature it is prost messages and plain functions
//! only: the store loop, the controller and the deterministic simulation
//! build on it without tonic. It builds on the two pure crates
//! (`fencelock-statemachine`, `fencelock-placement`) for [`refusal`] only,
//! and knows nothing of the store or the servers.

pub mod headers;
pub mod refusal;
pub mod status;

/// Package `fencelock.v1`: generated from `proto/fencelock/v1/`.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/fencelock.v1.rs"));
}

/// The encoded `google.protobuf.FileDescriptorSet` of every file in
/// package `fencelock.v1` (with source info, so comments included), for
/// registering with a gRPC reflection service.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/fencelock_v1_descriptor.bin"));

/// Package `fencelock.internal.v1`: generated from
/// `proto/fencelock/internal/` (node-to-node only).
pub mod internal {
    include!(concat!(env!("OUT_DIR"), "/fencelock.internal.v1.rs"));
}
