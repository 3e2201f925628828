//! Test support (feature `testing`), for this crate's tests and other
//! crates':
//! - [`conformance`]: the cases every [`FenceStore`](crate::FenceStore) must
//!   pass; the same cases run against [`MemoryFenceStore`](crate::MemoryFenceStore)
//!   and [`PgFenceStore`](crate::PgFenceStore) on a real server, which is what
//!   lets tests elsewhere use the in-memory one and still mean something.
//! - [`PgServer`]: a throwaway PostgreSQL server (initdb into a temp dir,
//!   loopback port), stopped when dropped.

pub mod conformance;
mod pg_server;

pub use conformance::{run_conformance, MemoryFactory, PgFactory, StoreFactory};
pub use pg_server::{PgServer, PG_BIN_ENV, PG_SUPERUSER};
