//! The `fencelock` binary: run a node (`serve`), a local cluster (`dev`),
//! check a config file, and take, renew, release and inspect locks from the
//! command line. See `fencelock --help`.

mod cli;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Test builds only: FAILPOINTS=name=action;... arms the store's
    // failpoints (docs/testing.md).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let args = cli::Cli::parse();
    std::process::ExitCode::from(cli::run(args).await)
}
