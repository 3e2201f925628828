//! The free space of the data directory's file system, watched so that a
//! node refuses new acquires while its disk is low instead of running it
//! full.
//!
//! A full disk fails RocksDB's next write, and a failed write stops the
//! node (fail-stop: its state on disk is unknown). Long before that, below
//! `edge.min_free_disk_bytes`, the node stops taking what makes its state
//! grow — new acquires on the shards it leads, refused with `SERVER_BUSY`
//! and a message that says why — while renewals, releases, expiry and
//! Raft's own writes go on in the space left, so held leases are kept and
//! the disk drains as leases end and logs are compacted. When a quarter
//! more than the minimum is free again the node takes acquires again by
//! itself. The decision ([`next_low`]) is a pure function of what the
//! watcher ([`watch`]) reads; only the watcher touches the file system.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::errors::ServerError;

/// How often the watcher reads the free space.
pub const DISK_CHECK_INTERVAL_MS: u64 = 1_000;
/// How much more than the minimum must be free before acquires resume,
/// as a fraction of the minimum (1/4): a disk hovering at the line does
/// not flap.
pub const DISK_RESUME_MARGIN_DIVISOR: u64 = 4;
/// The first backoff step a refused caller is told.
pub const DISK_LOW_RETRY_AFTER_MS: u64 = 2_000;

/// Whether the disk is low after reading `free_bytes`, given whether it was
/// (`was_low`) and the minimum (`min_free_bytes`, 0 = never low).
pub fn next_low(was_low: bool, free_bytes: u64, min_free_bytes: u64) -> bool {
    if min_free_bytes == 0 {
        return false;
    }
    let resume_at = min_free_bytes.saturating_add(min_free_bytes / DISK_RESUME_MARGIN_DIVISOR);
    if was_low {
        free_bytes < resume_at
    } else {
        free_bytes < min_free_bytes
    }
}

/// What the watcher last saw, shared with the request path and metrics.
#[derive(Debug)]
pub struct DiskSpace {
    min_free_bytes: u64,
    free_bytes: AtomicU64,
    low: AtomicBool,
}

impl DiskSpace {
    pub fn new(min_free_bytes: u64) -> Arc<DiskSpace> {
        Arc::new(DiskSpace {
            min_free_bytes,
            free_bytes: AtomicU64::new(u64::MAX),
            low: AtomicBool::new(false),
        })
    }

    /// Records a reading; returns the new state when it changed.
    pub fn observe(&self, free_bytes: u64) -> Option<bool> {
        self.free_bytes.store(free_bytes, Ordering::Relaxed);
        let was = self.low.load(Ordering::Relaxed);
        let now = next_low(was, free_bytes, self.min_free_bytes);
        self.low.store(now, Ordering::Relaxed);
        (now != was).then_some(now)
    }

    pub fn is_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// The last reading (`u64::MAX` before the first).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes.load(Ordering::Relaxed)
    }

    /// The refusal a new acquire gets while the disk is low.
    pub fn check_acquire(&self) -> Result<(), ServerError> {
        if !self.is_low() {
            return Ok(());
        }
        Err(ServerError::DiskLow {
            free_bytes: self.free_bytes(),
            min_free_bytes: self.min_free_bytes,
        })
    }
}

/// Bytes available to the node's user on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c_path` is a valid NUL-terminated string and `stat` a
    // writable struct of the type statvfs fills.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// Reads the free space under `data_dir` every [`DISK_CHECK_INTERVAL_MS`]
/// into `space`, logging each change. Runs until aborted. A failed read
/// keeps the previous state (it says nothing about the space).
pub async fn watch(data_dir: PathBuf, space: Arc<DiskSpace>) {
    let mut interval = tokio::time::interval(Duration::from_millis(DISK_CHECK_INTERVAL_MS));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let dir = data_dir.clone();
        let read = tokio::task::spawn_blocking(move || free_bytes(&dir)).await;
        match read {
            Ok(Ok(free)) => match space.observe(free) {
                Some(true) => tracing::error!(
                    free_bytes = free,
                    min_free_bytes = space.min_free_bytes,
                    "the data directory's disk is low: new acquires are refused until space returns"
                ),
                Some(false) => tracing::warn!(
                    free_bytes = free,
                    "the data directory's disk has room again: acquires are taken again"
                ),
                None => {}
            },
            Ok(Err(e)) => {
                tracing::warn!("cannot read the free space of {}: {e}", data_dir.display())
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_disk_turns_low_below_the_minimum_and_back_only_a_quarter_above_it() {
        let min = 100 * MIB;
        assert!(!next_low(false, 100 * MIB, min));
        assert!(next_low(false, 100 * MIB - 1, min));
        // Low stays low until 125 MiB are free.
        assert!(next_low(true, 110 * MIB, min));
        assert!(next_low(true, 125 * MIB - 1, min));
        assert!(!next_low(true, 125 * MIB, min));
        // 0 turns the check off.
        assert!(!next_low(true, 0, 0));
    }

    #[test]
    fn a_low_disk_refuses_acquires_as_server_busy_saying_why_and_recovers() {
        let space = DiskSpace::new(100 * MIB);
        assert!(space.check_acquire().is_ok());
        assert_eq!(space.observe(10 * MIB), Some(true));
        let refusal = space.check_acquire().unwrap_err();
        let detail = refusal.to_detail();
        assert_eq!(detail.reason(), fencelock_api::v1::Reason::ServerBusy);
        assert_eq!(detail.retry_after_ms, DISK_LOW_RETRY_AFTER_MS);
        assert!(
            detail.message.contains("edge.min_free_disk_bytes"),
            "{detail:?}"
        );
        assert_eq!(space.observe(200 * MIB), Some(false));
        assert!(space.check_acquire().is_ok());
    }

    #[test]
    fn the_free_space_of_a_real_directory_is_read() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }
}
