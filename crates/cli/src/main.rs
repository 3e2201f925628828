//! The `fencelock` binary: run a node (`serve`), a local cluster (`dev`),
//! check a config file, and take, renew, release and inspect locks from the
//! command line. See `fencelock --help`.

use clap::Parser;

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
