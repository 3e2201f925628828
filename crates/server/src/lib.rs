//! The fencelock node as a library: the gRPC edge and the wiring around
//! the crates below it (the `fencelock` binary is crates/cli).
//!
//! * [`node`] — wiring: open storage, start the store loop, the transport
//!   and the gRPC server; shut them down.
//! * [`service`] — the public `LockService` over the store, with routing
//!   and forwarding to shard leaders.
//! * [`admin`] — the public `AdminService` (`fencelock admin ...`).
//! * [`ops`] — the operator actions' gRPC binding: `fencelock-controller`'s
//!   actions over [`control`] calls to each node (`GrpcNodes`).
//! * [`control`] — the internal `NodeControl` service: node-local steps.
//! * [`lifecycle`] — health status, in-flight requests and the graceful
//!   shutdown sequence.
//! * [`peers`] — gRPC channels to other nodes (forwarding, operator actions).
//! * [`errors`] — the crate's error type and its mapping to gRPC statuses.
//! * [`metrics`] — the node's Prometheus registry and every metric.
//! * [`admin_http`] — the admin HTTP port: `/metrics`, `/healthz` and the
//!   operator status page.
//! * [`logging`] — `tracing` output: filters, text or JSON.
//! * [`validate`] — field checks of public API requests (pure; fuzzed).
//!
//! Re-exported from the crates below, for the server's callers: [`store`]
//! (`fencelock-multiraft`, the store loop; [`audit`] is its audit log),
//! [`transport`] (`fencelock-transport`; `netfilter`, its fault rules, in
//! test builds only), [`router`] (`fencelock-router`), [`reshard`]
//! (`fencelock-controller`'s migration protocol), [`internal`]
//! (`fencelock-api`'s internal protos), [`config`] (`fencelock-config`,
//! the configuration file, its defaults and validation), [`security`]
//! (`fencelock-security`: mutual TLS, caller identities and who may call
//! what, per-tenant rate limits, private data directories;
//! docs/security.md) and [`status`] (`fencelock-status`: the status page's
//! samples, rates, latencies and its HTML with charts).

pub mod admin;
pub mod admin_http;
/// The configuration file lives in `fencelock-config`; re-exported for the
/// server's callers.
pub use fencelock_config as config;
/// The audit log is written by the store loop at apply; it lives there.
pub use store::audit;
pub mod control;
pub mod disk_space;
pub mod errors;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
/// The fault rules live with the transport (test builds only).
#[cfg(feature = "fault-rules")]
pub use fencelock_transport::netfilter;
pub mod node;
pub mod ops;
pub mod peers;
/// The migration protocol lives in `fencelock-controller`; re-exported for
/// the server's callers.
pub use fencelock_controller::reshard;
/// The controller's error type, for the server's callers.
pub use fencelock_controller::ControllerError;
/// The route table lives in `fencelock-router`; re-exported for the
/// server's callers.
pub use fencelock_router as router;
/// Mutual TLS, identities, who may call what and rate limits live in
/// `fencelock-security`; re-exported for the server's callers.
pub use fencelock_security as security;
pub mod service;
/// The multi-Raft store loop lives in `fencelock-multiraft`; re-exported
/// for the server's callers.
pub use fencelock_multiraft as store;
/// The status page (its view, history, charts and sampler) lives in
/// `fencelock-status`; re-exported for the server's callers.
pub use fencelock_status as status;
/// The peer transport lives in `fencelock-transport`; re-exported for the
/// server's callers.
pub use fencelock_transport as transport;
pub mod validate;
pub mod watch;

/// Generated code of the internal peer protocol (`proto/fencelock/internal`),
/// compiled by the api crate.
pub use fencelock_api::internal;
