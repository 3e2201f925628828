//! Fuzz targets for fencelock's pure crates, and the bounded driver that
//! runs every target in `cargo test` (the "smoke").
//!
//! A target is a `fn(&[u8])`: it turns arbitrary bytes into input for one
//! entry point and checks that entry point's promises. It must return for
//! every input; a panic is a bug — either in the code under test (bad bytes
//! made it panic: errors must be values) or a broken promise the target
//! asserts (a decode that is not canonical, a table invariant broken, a
//! snapshot that does not round-trip).
//!
//! The same functions run in two places:
//!
//! * `fuzz/` (outside the workspace): coverage-guided libFuzzer runs through
//!   `cargo fuzz`, one binary per target (`make fuzz`).
//! * [`smoke::run`] from `tests/fuzz_smoke.rs`: the committed corpus
//!   (`fuzz/corpus/<target>/`) plus a fixed number of seeded random and
//!   mutated inputs, on stable Rust, in `make test`.
//!
//! The one target on server-side code (request validation as `service.rs`
//! does it) lives in `crates/server/tests/fuzz_smoke.rs` and uses this
//! crate's driver: the server crate links RocksDB, which the coverage-guided
//! build leaves out. The store's codecs (entry payloads, snapshot data,
//! the transport's Raft batches) are pure and are targets here ([`store`]).
//!
//! See `docs/testing.md`, "Fuzzing".

pub mod apply;
pub mod decode;
pub mod input;
pub mod placement_apply;
pub mod requests;
pub mod seeds;
pub mod smoke;
pub mod store;

/// A fuzz target: name (also its corpus directory and `cargo fuzz` binary)
/// and the function.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Generated inputs in the smoke run: about a second or less each in a
    /// debug build (the structured targets are far slower per input).
    pub smoke_iterations: usize,
}

const DECODER_SMOKE: usize = 100_000;

/// Every target of this crate, in the order the smoke runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "command_decode",
        run: decode::command_decode,
        smoke_iterations: DECODER_SMOKE,
    },
    Target {
        name: "snapshot_decode",
        run: decode::snapshot_decode,
        smoke_iterations: DECODER_SMOKE,
    },
    Target {
        name: "export_import",
        run: decode::export_import,
        smoke_iterations: DECODER_SMOKE,
    },
    Target {
        name: "placement_decode",
        run: decode::placement_decode,
        smoke_iterations: DECODER_SMOKE,
    },
    Target {
        name: "lock_table_apply",
        run: apply::lock_table_apply,
        smoke_iterations: 40_000,
    },
    Target {
        name: "placement_apply",
        run: placement_apply::placement_apply,
        smoke_iterations: 6_000,
    },
    Target {
        name: "api_requests",
        run: requests::api_requests,
        smoke_iterations: DECODER_SMOKE,
    },
    Target {
        name: "log_payload",
        run: store::log_payload,
        smoke_iterations: DECODER_SMOKE,
    },
    Target {
        name: "raft_batch",
        run: store::raft_batch,
        smoke_iterations: DECODER_SMOKE,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}
