//! In-process clusters: real nodes (RocksDB in temp dirs, gRPC on loopback, the real
//! peer transport) inside this test process, plus the pure checks of the server's
//! configuration and error mapping. Fast; many of them.
//!
//! One test binary per kind (each links RocksDB): grouping keeps `make test`'s
//! build and link time down. A module per former test file.

/// The shared test support (crates/testkit), under the name the modules use.
use fencelock_testkit as common;

mod architecture;
mod client_lib;
mod cluster;
mod compat;
mod config;
mod epochs;
mod errors;
mod hostile;
mod modes;
mod repair;
mod sharding;
mod transport;
mod upgrades;
mod values;
mod watch;
