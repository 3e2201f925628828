//! Test support for fencelock's cluster tests (not published): what the
//! in-process, real-process and external-system test binaries share.
//!
//! * `cluster` — an in-process cluster: real nodes (RocksDB in temp dirs,
//!   gRPC on loopback, the real peer transport) in one process, with
//!   network faults through the transport's fault rules (`NetworkRules`)
//!   and crash, restart and wipe of nodes;
//! * `calls` — lock calls against it as a careful client makes them.
//!
//! Those two need the `fault-rules` feature (the test binaries turn it
//! on): a plain workspace build compiles this crate without them, so no
//! release build ever carries the fault rules. The rest is always there:
//!
//! * [`ports`] — ports for test servers that stay free.
//! * [`process`] — the real `fencelock` binary and child processes that die
//!   with the test.
//! * [`ops`] — plain HTTP against the admin port, the Prometheus text
//!   format, and waiting for a condition.

#[cfg(feature = "fault-rules")]
pub mod calls;
#[cfg(feature = "fault-rules")]
pub mod cluster;
pub mod ops;
pub mod ports;
pub mod process;

#[cfg(feature = "fault-rules")]
pub use calls::{acquire, acquire_req, call_endpoints, get, release, renew, with_leader};
#[cfg(feature = "fault-rules")]
pub use cluster::Cluster;
pub use ports::{free_port, free_ports};
pub use process::{fencelock_bin, Proc};
