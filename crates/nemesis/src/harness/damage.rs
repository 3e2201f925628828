//! Damaging a stopped node's data directory the way a bad disk would, and
//! reading back whether the node refused it: the `disk-corrupt` fault.
//!
//! The damage is a garbled record in the middle of the node's largest
//! RocksDB log file (`*.log`): what a bad sector or a misdirected write
//! does, and the case RocksDB's default recovery would have opened past,
//! without every synced write after it. A copy of the directory is taken
//! first; the heal puts it back, which gives the node exactly what it held
//! (what replacing its replicas from their peers would also give it back).

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Bytes overwritten in the log: more than a record header, so the
/// record's checksum cannot match.
const GARBLE_BYTES: usize = 16;

/// What `fencelock serve` exits with when it refuses a damaged data
/// directory (`EXIT_DAMAGED` in crates/cli/src/lib.rs).
pub const EXIT_DAMAGED: i32 = 6;

/// The start of the message a node prints when it refuses one
/// (`fencelock_storage::Error::Damaged`).
pub const DAMAGED_MESSAGE: &str = "the data directory is damaged";

/// Where the intact copy of `data_dir` is kept while the fault is on.
pub fn intact_copy(data_dir: &Path) -> PathBuf {
    let mut name = data_dir.as_os_str().to_owned();
    name.push(".intact");
    PathBuf::from(name)
}

/// Copies `data_dir` aside, then garbles the middle of its largest log
/// file. Returns that file's name. The node must not be running.
pub fn garble_log(data_dir: &Path) -> std::io::Result<String> {
    let copy = intact_copy(data_dir);
    if copy.exists() {
        std::fs::remove_dir_all(&copy)?;
    }
    copy_dir(data_dir, &copy)?;
    let log = largest_log(&data_dir.join("db"))?;
    let len = std::fs::metadata(&log)?.len();
    if len < 2 * GARBLE_BYTES as u64 {
        return Err(std::io::Error::other(format!(
            "{} holds {len} bytes: nothing to garble",
            log.display()
        )));
    }
    let mut f = std::fs::OpenOptions::new().write(true).open(&log)?;
    f.seek(SeekFrom::Start(len / 2))?;
    f.write_all(&[0xff; GARBLE_BYTES])?;
    f.sync_all()?;
    Ok(log
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// Puts the intact copy back in place of the damaged directory.
pub fn restore(data_dir: &Path) -> std::io::Result<()> {
    let copy = intact_copy(data_dir);
    if !copy.exists() {
        return Err(std::io::Error::other(format!(
            "no intact copy at {}",
            copy.display()
        )));
    }
    std::fs::remove_dir_all(data_dir)?;
    std::fs::rename(copy, data_dir)
}

/// Whether the node's log (its stderr) says it refused a damaged directory
/// naming `file`.
pub fn refusal_names(node_log: &str, file: &str) -> bool {
    node_log
        .lines()
        .any(|line| line.contains(DAMAGED_MESSAGE) && line.contains(file))
}

fn largest_log(db_dir: &Path) -> std::io::Result<PathBuf> {
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(db_dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "log") {
            let len = std::fs::metadata(&path)?.len();
            if best.as_ref().is_none_or(|(l, _)| len > *l) {
                best = Some((len, path));
            }
        }
    }
    best.map(|(_, p)| p)
        .ok_or_else(|| std::io::Error::other(format!("no log file in {}", db_dir.display())))
}

/// Copies a directory tree; the copy's root is private (0700), as the node
/// requires of its data directory.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_log_is_garbled_and_the_copy_put_back_is_intact() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data1");
        std::fs::create_dir_all(data.join("db")).unwrap();
        std::fs::write(data.join("db/000004.log"), vec![1u8; 100]).unwrap();
        std::fs::write(data.join("db/000009.log"), vec![2u8; 4000]).unwrap();
        std::fs::write(data.join("db/MANIFEST-000005"), b"m").unwrap();

        assert_eq!(garble_log(&data).unwrap(), "000009.log");
        let garbled = std::fs::read(data.join("db/000009.log")).unwrap();
        assert_eq!(garbled.len(), 4000);
        assert_eq!(&garbled[2000..2016], &[0xff; 16]);
        assert_eq!(
            std::fs::read(data.join("db/000004.log")).unwrap(),
            vec![1u8; 100]
        );

        restore(&data).unwrap();
        assert_eq!(
            std::fs::read(data.join("db/000009.log")).unwrap(),
            vec![2u8; 4000]
        );
        assert!(!intact_copy(&data).exists());
        let mode = std::fs::metadata(&data).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }

    #[test]
    fn a_refusal_counts_only_when_it_names_the_file() {
        let log = "WARN x\nerror: node 2 failed to start: the data directory is damaged \
                   (/d/data2/db/000012.log): Corruption: checksum mismatch. Do not ...\n";
        assert!(refusal_names(log, "000012.log"));
        assert!(!refusal_names(log, "000013.log"));
        assert!(!refusal_names("error: cannot listen", "000012.log"));
    }
}
