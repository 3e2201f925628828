//! Real processes: the `fencelock` binary started as `serve` or `dev`, driven through
//! its CLI, gRPC and admin HTTP port, as an operator would. Slower; few of them.
//!
//! One test binary per kind (each links RocksDB): grouping keeps `make test`'s
//! build and link time down. A module per former test file.

/// The shared test support (crates/testkit), under the name the modules use.
use fencelock_testkit as common;
use fencelock_testkit::ops as ops_support;

mod admin_cli;
mod cli_lock;
mod config_docs;
mod deploy;
mod deploy_prometheus;
mod dev_cluster;
mod disk_full;
mod fail_stop;
mod operations;
mod process;
mod rolling_restart;
mod security;
mod serve_process;
mod status_page;
mod upgrade_fixture;
