//! Conformance suites: every [`Engine`] must pass [`engine_conformance`], and
//! [`ShardStorage`](crate::ShardStorage) over every engine must pass
//! [`storage_conformance`]. That is what lets tests of the layers above run
//! on [`MemEngine`] and still mean something for [`RocksEngine`].
//!
//! Built for this crate's tests and, with feature `testing`, for other
//! crates (e.g. a fault-injecting engine wrapper must pass these too).
//! Assertion failures panic, as tests do; each case is announced on stderr
//! first so a failure names its case.

pub mod engine_suite;
pub mod storage_suite;

use std::path::PathBuf;

use crate::engine::{Engine, MemEngine, RocksEngine};
use crate::error::Result;

/// Opens an engine at a fixed location, again and again: what a test needs
/// to check durability across a restart.
pub trait EngineFactory {
    /// The engine this factory opens.
    type Engine: Engine + 'static;

    /// Opens the engine. After every engine it returned has been dropped, a
    /// new call must see all data those engines wrote with `sync = true`.
    fn open(&self) -> Result<Self::Engine>;
}

/// [`MemEngine`] "reopened": every open shares the same tables.
#[derive(Debug, Default)]
pub struct MemFactory(MemEngine);

impl EngineFactory for MemFactory {
    type Engine = MemEngine;

    fn open(&self) -> Result<MemEngine> {
        Ok(self.0.clone())
    }
}

/// [`RocksEngine`] opened at `path` (the caller owns the directory and keeps
/// it alive, e.g. a `tempfile::TempDir`).
#[derive(Debug)]
pub struct RocksFactory {
    /// Database directory.
    pub path: PathBuf,
}

impl EngineFactory for RocksFactory {
    type Engine = RocksEngine;

    fn open(&self) -> Result<RocksEngine> {
        RocksEngine::open(&self.path)
    }
}

/// A named conformance case.
pub type Case<F> = (&'static str, fn(&F) -> Result<()>);

/// Runs every engine case, each on a fresh factory from `make`.
pub fn engine_conformance<F: EngineFactory>(make: impl Fn() -> F) {
    run_cases("engine", engine_suite::cases::<F>(), make);
}

/// Runs every `ShardStorage` case, each on a fresh factory from `make`.
pub fn storage_conformance<F: EngineFactory>(make: impl Fn() -> F) {
    run_cases("storage", storage_suite::cases::<F>(), make);
}

fn run_cases<F>(suite: &str, cases: Vec<Case<F>>, make: impl Fn() -> F) {
    for (name, case) in cases {
        eprintln!("{suite} conformance: {name}");
        let factory = make();
        if let Err(e) = case(&factory) {
            panic!("{suite} conformance case {name} failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps the temp dir alive as long as the factory.
    struct TempRocks {
        _dir: tempfile::TempDir,
        factory: RocksFactory,
    }

    impl EngineFactory for TempRocks {
        type Engine = RocksEngine;
        fn open(&self) -> Result<RocksEngine> {
            self.factory.open()
        }
    }

    fn temp_rocks() -> TempRocks {
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("tempdir: {e}"),
        };
        let path = dir.path().join("db");
        TempRocks {
            _dir: dir,
            factory: RocksFactory { path },
        }
    }

    #[test]
    fn mem_engine_conformance() {
        engine_conformance(MemFactory::default);
    }

    #[test]
    fn rocks_engine_conformance() {
        engine_conformance(temp_rocks);
    }

    #[test]
    fn mem_storage_conformance() {
        storage_conformance(MemFactory::default);
    }

    #[test]
    fn rocks_storage_conformance() {
        storage_conformance(temp_rocks);
    }
}
