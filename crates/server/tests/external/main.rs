//! Against external systems the brief names: a real PostgreSQL protected by fencing
//! tokens, and the Python client example against a real cluster.
//!
//! One test binary per kind (each links RocksDB): grouping keeps `make test`'s
//! build and link time down. A module per former test file.

/// The shared test support (crates/testkit), under the name the modules use.
use fencelock_testkit as common;

mod fencing_postgres;
mod python_client;
