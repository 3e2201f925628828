//! The `fencelock` binary: run a node (`serve`), a local cluster (`dev`),
//! check a config file, and take, renew, release and inspect locks from the
//! command line. See `fencelock --help`.

use clap::Parser;

/// jemalloc, not glibc's malloc, on Linux. A node's threads (tokio workers,
/// the store loop, RocksDB's) each get a glibc arena, and glibc gives a
/// non-main arena's memory back only from the top of its heap: after a
/// burst (a restarted replica catching up, a backlog of retried calls) one
/// small live allocation at the top pins the whole arena. The 1-hour soak
/// saw restarted nodes keep 550-650 MiB resident with about 55 MiB in use
/// (`malloc_stats`: arenas of 64 MiB, 2-5 MiB of each in use).
/// jemalloc returns freed pages to the system after a short decay (10 s by
/// default), so resident memory follows what is in use (docs/testing.md,
/// "Soak").
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Test builds only: FAILPOINTS=name=action;... arms the store's
    // failpoints (docs/testing.md).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    fail_stop_on_panic();
    let args = fencelock_cli::Cli::parse();
    std::process::ExitCode::from(fencelock_cli::run(args).await)
}

/// A panic on any thread ends the process. Without this a panic on the
/// store thread (a failed fsync, a corrupt snapshot, a broken invariant)
/// would end only that thread while the gRPC server kept accepting calls it
/// can never answer; a node that stops whole is one Raft already handles
/// (its peers elect a new leader, it recovers from disk on restart).
/// `panic = "abort"` in the profile would do the same for the binary but
/// changes how every dependency is built for tests.
fn fail_stop_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tracing::error!(panic = %info, "panicked; stopping the process (fail-stop)");
        std::process::abort();
    }));
}
