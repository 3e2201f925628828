//! A slow disk for one node of a local cluster, on a release build.
//!
//! Release builds carry no failpoints, so the `slow-disk` profile slows a
//! node's disk from outside: the node runs with the fault-injection runs'
//! LD_PRELOAD layer (`crates/nemesis/faults/diskfault.c`, compiled here
//! into the cluster's directory), which makes every `fsync`, `fdatasync`
//! and `sync_file_range` of the process wait as long as the node's control
//! file says. RocksDB makes data durable through those calls only, so the
//! layer delays exactly the synced writes and nothing else; the file is
//! read on every call, so the delay can be switched on while the node runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::BenchError;

/// The layer's source: the same file the fault-injection runs use.
const SOURCE: &str = include_str!("../../../crates/nemesis/faults/diskfault.c");
/// The environment variable that names a node's control file.
pub const CONTROL_ENV: &str = "FENCELOCK_DISK_FAULT_FILE";
/// The longest delay the layer honours (it ignores longer ones).
pub const MAX_DELAY_MS: u64 = 60_000;

/// Compiles the layer into `dir`; returns the library's path.
pub fn build_layer(dir: &Path) -> Result<PathBuf, BenchError> {
    let source = dir.join("diskfault.c");
    std::fs::write(&source, SOURCE).map_err(|e| BenchError::io(&source, e))?;
    let library = dir.join("libdiskfault.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .map_err(|e| {
            BenchError::Cluster(format!(
                "cannot run cc to build the disk-fault layer ({e}); install a C compiler \
                 (apt-get install gcc)"
            ))
        })?;
    if !out.status.success() {
        return Err(BenchError::Cluster(format!(
            "building the disk-fault layer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(library)
}

/// What the control file says for a sync delay of `delay_ms` (0: none).
pub fn control_text(delay_ms: u64) -> Result<String, BenchError> {
    match delay_ms {
        0 => Ok(String::new()),
        ms if ms <= MAX_DELAY_MS => Ok(format!("delay {ms}")),
        ms => Err(BenchError::InvalidArgument(format!(
            "a sync delay of {ms} ms is over the disk-fault layer's {MAX_DELAY_MS} ms"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_text_is_what_the_layer_parses() {
        assert_eq!(control_text(0).unwrap(), "");
        assert_eq!(control_text(200).unwrap(), "delay 200");
        assert!(control_text(MAX_DELAY_MS + 1).is_err());
        // The layer's parser, read from its source: a change there that
        // this side does not follow fails here.
        assert!(SOURCE.contains("strncmp(verb, \"delay \", 6)"));
        assert!(SOURCE.contains("ms <= 60000"));
        assert!(SOURCE.contains(CONTROL_ENV));
    }
}
