//! The I/O half: real processes, a real network, real signals.
//!
//! * [`netns`] — one network namespace per node on a bridge, and
//!   partitions as kernel packet drops inside the namespaces.
//! * [`grudge`] — which links a partition cuts (pure).
//! * [`cluster`] — `fencelock serve` processes: start, SIGKILL, restart,
//!   SIGSTOP, SIGCONT; the admin API.
//! * [`fence_server`] — the fenced resource, served over TCP to client
//!   processes.
//! * [`lock_client`] — one logical call = retries with one request id,
//!   recorded as one operation with an honest outcome.
//! * [`recorder`] — the shared, thread-safe history being written.
//! * [`workload`] — the clients in the harness process.
//! * [`holder`] — a lock-holding client in its own process (the one the
//!   nemesis pauses past its TTL).
//! * [`nemesis`] — executes a [`crate::schedule`].
//! * [`run`] — one whole run: set up, load, faults, heal, check, report.
//! * [`controller`] — the placement controller repairing and balancing by
//!   itself under the same load and checks.
//! * [`soak`] — hours of load with a fault every few minutes, the node
//!   processes' memory, open files and disk sampled; [`background`] is its
//!   steady seed-shaped load (measured, not recorded).

pub mod background;
pub mod cluster;
pub mod controller;
pub mod damage;
pub mod fence_server;
pub mod grudge;
pub mod holder;
pub mod lock_client;
pub mod nemesis;
pub mod netns;
pub mod recorder;
pub mod run;
pub mod soak;
pub mod workload;

use std::path::PathBuf;

/// Where the `fencelock` binary is: `FENCELOCK_BIN`, else
/// `$CARGO_TARGET_DIR/debug/fencelock`, else next to the running test
/// binary (`target/debug/deps/..` → `target/debug/fencelock`).
pub fn fencelock_bin() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("FENCELOCK_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "FENCELOCK_BIN={} is not a file; build it with `cargo build --workspace`",
                path.display()
            ))
        };
    }
    let mut tried = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        tried.push(PathBuf::from(dir).join("debug").join("fencelock"));
    }
    if let Ok(exe) = std::env::current_exe() {
        for up in exe.ancestors().skip(1).take(2) {
            tried.push(up.join("fencelock"));
        }
    }
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "cannot find the fencelock binary (tried {}); build it with \
             `cargo build --workspace` or set FENCELOCK_BIN",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}
