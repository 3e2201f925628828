//! The audit log: one JSON line per lock state change.
//!
//! This module owns the audit sink: the record type, the line format and a
//! writer thread. The store loop hands records over a bounded queue and
//! never waits: formatting and writing happen on the writer thread, and a
//! full queue drops the record and counts it (`fencelock_audit_dropped_
//! lines_total`), because stalling lock traffic behind a slow disk would
//! turn an audit problem into an outage.
//!
//! What is written, and where (docs/operations.md, "Audit log"):
//! * one line per change applied by a shard **this node leads**: granted
//!   (directly or from the queue), queued, released, expired, cancelled,
//!   wait timed out, wait cancelled, wait moved (and renewed, when
//!   `audit.include_renewals`). Followers write nothing, so each change
//!   appears once in the cluster, except around a leader change, when the
//!   old and the new leader may both log an entry; `shard` + `index`
//!   identify it.
//! * fields: time, node, shard, log index, event, resource, a lease
//!   fingerprint, fencing token, caller address (`caller`: as the client
//!   connected, or as reported by the node that forwarded the request).
//! * never request payloads, request ids or whole lease ids: a lease id is
//!   a bearer secret (whoever has it can renew or release), so only its
//!   first [`LEASE_FINGERPRINT_BYTES`] bytes are logged, enough to match a
//!   client's log line and far from enough to guess the rest.
//!
//! * one line per step the placement controller takes by itself (on the
//!   meta shard's leader): `event` `controller`, the kind of work, the
//!   step in words, why, and how it ended ([`DecisionRecord`]).
//!
//! Rotation: lines are appended with `O_APPEND`; after `logrotate` moves the
//! file, SIGHUP (`AuditLog::reopen`) makes the writer open the path anew.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use fencelock_statemachine::LeaseId;

/// Records queued between the store loop and the writer. About a second of
/// the design peak (2,000 acquires + 2,000 releases + expiries per second)
/// several times over, so a slow disk hiccup loses nothing.
pub const AUDIT_QUEUE_RECORDS: usize = 65_536;
/// Bytes of a lease id written to the log (of 16).
pub const LEASE_FINGERPRINT_BYTES: usize = 4;

/// Where audit lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditTarget {
    Off,
    Stdout,
    File(PathBuf),
}

/// One state change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    pub time_ms: u64,
    pub shard_id: u64,
    pub index: u64,
    pub event: &'static str,
    pub resource: String,
    pub lease_id: LeaseId,
    /// 0 when the event has none (a wait that ended without a grant).
    pub token: i64,
    pub caller: Option<Arc<str>>,
}

/// One step the placement controller took by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionRecord {
    pub time_ms: u64,
    /// `mark_down`, `return`, `repair`, `split` or `balance`.
    pub kind: &'static str,
    /// The step in words (`move the replica of shard 3 from node 2 to node 5`).
    pub step: String,
    /// Why the controller chose the work.
    pub reason: String,
    /// `done`, or `failed: <error>`.
    pub outcome: String,
}

enum Msg {
    Record(AuditRecord),
    Decision(DecisionRecord),
    Reopen,
}

#[derive(Default)]
struct Counters {
    lines: AtomicU64,
    dropped: AtomicU64,
}

/// The sink's counters, readable without keeping the sink open.
#[derive(Clone, Default)]
pub struct AuditStats(Arc<Counters>);

impl AuditStats {
    pub fn lines_total(&self) -> u64 {
        self.0.lines.load(Ordering::Relaxed)
    }

    pub fn dropped_total(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }
}

/// The node's audit sink; cheap to clone. See the module docs.
#[derive(Clone)]
pub struct AuditLog {
    tx: Option<Sender<Msg>>,
    counters: Arc<Counters>,
    include_renewals: bool,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl AuditLog {
    /// A sink that writes nothing.
    pub fn disabled() -> AuditLog {
        AuditLog {
            tx: None,
            counters: Arc::default(),
            include_renewals: false,
            writer: Arc::default(),
        }
    }

    /// Starts the writer for `target`. A file is created if missing and
    /// must be writable now: a node that cannot audit refuses to start
    /// rather than run unaudited.
    pub fn start(
        node_id: u64,
        target: &AuditTarget,
        include_renewals: bool,
    ) -> std::io::Result<AuditLog> {
        let sink = match target {
            AuditTarget::Off => return Ok(AuditLog::disabled()),
            AuditTarget::Stdout => Sink::Stdout,
            AuditTarget::File(path) => Sink::File {
                file: open_append(path)?,
                path: path.clone(),
            },
        };
        let (tx, rx) = crossbeam_channel::bounded(AUDIT_QUEUE_RECORDS);
        let counters = Arc::new(Counters::default());
        let writer_counters = counters.clone();
        let handle = std::thread::Builder::new()
            .name(format!("audit-{node_id}"))
            .spawn(move || write_loop(node_id, sink, rx, &writer_counters))?;
        Ok(AuditLog {
            tx: Some(tx),
            counters,
            include_renewals,
            writer: Arc::new(Mutex::new(Some(handle))),
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.tx.is_some()
    }

    pub fn include_renewals(&self) -> bool {
        self.include_renewals && self.is_enabled()
    }

    /// Queues one record; never blocks (a full queue drops and counts it).
    pub fn record(&self, record: AuditRecord) {
        let Some(tx) = &self.tx else {
            return;
        };
        match tx.try_send(Msg::Record(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Queues one controller decision; never blocks, like [`Self::record`].
    pub fn record_decision(&self, decision: DecisionRecord) {
        let Some(tx) = &self.tx else {
            return;
        };
        if tx.try_send(Msg::Decision(decision)).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Makes the writer reopen its file (after log rotation moved it).
    pub fn reopen(&self) {
        if let Some(tx) = &self.tx {
            // Blocking is fine here: this runs on a signal handler task.
            let _ = tx.send(Msg::Reopen);
        }
    }

    pub fn stats(&self) -> AuditStats {
        AuditStats(self.counters.clone())
    }

    /// Stops accepting records, writes what is queued, flushes and waits
    /// for the writer. Other clones stop recording too.
    pub fn close(&mut self) {
        self.tx = None;
        let handle = self.writer.lock().ok().and_then(|mut h| h.take());
        if let Some(handle) = handle {
            // The writer ends when every sender is gone; clones held by a
            // store that has already stopped are dropped by now.
            let _ = handle.join();
        }
    }
}

enum Sink {
    Stdout,
    File { file: std::fs::File, path: PathBuf },
}

fn open_append(path: &PathBuf) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

fn write_loop(node_id: u64, mut sink: Sink, rx: Receiver<Msg>, counters: &Counters) {
    let mut buf = Vec::with_capacity(64 * 1024);
    // Blocks for the first message, then takes what else is queued, so a
    // burst becomes one write. Messages are handled in order: a reopen
    // first writes what came before it to the old file.
    while let Ok(first) = rx.recv() {
        let mut pending = 0u64;
        for msg in std::iter::once(first).chain(rx.try_iter()) {
            match msg {
                Msg::Record(r) => {
                    format_line(node_id, &r, &mut buf);
                    pending += 1;
                    if buf.len() >= 64 * 1024 {
                        pending = flush(&mut sink, &mut buf, pending, counters);
                    }
                }
                Msg::Decision(d) => {
                    format_decision(node_id, &d, &mut buf);
                    pending += 1;
                }
                Msg::Reopen => {
                    pending = flush(&mut sink, &mut buf, pending, counters);
                    reopen(&mut sink);
                }
            }
        }
        flush(&mut sink, &mut buf, pending, counters);
    }
}

fn reopen(sink: &mut Sink) {
    if let Sink::File { file, path } = sink {
        match open_append(path) {
            Ok(f) => *file = f,
            Err(e) => tracing::error!(path = %path.display(), "cannot reopen the audit log: {e}"),
        }
    }
}

/// Writes `buf` (holding `lines` lines) to the sink; returns 0 (lines now
/// pending).
fn flush(sink: &mut Sink, buf: &mut Vec<u8>, lines: u64, counters: &Counters) -> u64 {
    if buf.is_empty() {
        return 0;
    }
    let result = match sink {
        Sink::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(buf).and_then(|()| out.flush())
        }
        // One write of whole lines with O_APPEND: readers and rotation
        // never see half a line from us.
        Sink::File { file, .. } => file.write_all(buf),
    };
    match result {
        Ok(()) => counters.lines.fetch_add(lines, Ordering::Relaxed),
        Err(e) => {
            tracing::error!("audit log write failed: {e}");
            counters.dropped.fetch_add(lines, Ordering::Relaxed)
        }
    };
    buf.clear();
    0
}

/// Appends one JSON line for `r` to `out`.
pub fn format_line(node_id: u64, r: &AuditRecord, out: &mut Vec<u8>) {
    let lease = hex::encode(&r.lease_id.0[..LEASE_FINGERPRINT_BYTES]);
    let line = serde_json::json!({
        "ts_ms": r.time_ms,
        "node": node_id,
        "shard": r.shard_id,
        "index": r.index,
        "event": r.event,
        "resource": r.resource,
        "lease": lease,
        "token": r.token,
        "caller": r.caller.as_deref().unwrap_or("-"),
    });
    // Serializing a `Value` of plain fields cannot fail.
    let _ = serde_json::to_writer(&mut *out, &line);
    out.push(b'\n');
}

/// Appends one JSON line for the controller's decision `d` to `out`.
pub fn format_decision(node_id: u64, d: &DecisionRecord, out: &mut Vec<u8>) {
    let line = serde_json::json!({
        "ts_ms": d.time_ms,
        "node": node_id,
        "event": "controller",
        "kind": d.kind,
        "step": d.step,
        "reason": d.reason,
        "outcome": d.outcome,
    });
    let _ = serde_json::to_writer(&mut *out, &line);
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(event: &'static str) -> AuditRecord {
        AuditRecord {
            time_ms: 1_700_000_000_000,
            shard_id: 2,
            index: 42,
            event,
            resource: "acme/orders/42".into(),
            lease_id: LeaseId([0xab; 16]),
            token: 7,
            caller: Some("10.0.0.5:41000".into()),
        }
    }

    #[test]
    fn a_line_names_the_change_but_never_the_whole_lease_id() {
        let mut out = Vec::new();
        format_line(1, &record("granted"), &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["event"], "granted");
        assert_eq!(v["resource"], "acme/orders/42");
        assert_eq!(v["token"], 7);
        assert_eq!(v["caller"], "10.0.0.5:41000");
        assert_eq!(v["lease"], "abababab");
        assert!(!text.contains(&"ab".repeat(16)));
    }

    #[test]
    fn a_controller_decision_is_one_line_with_its_step_reason_and_outcome() {
        let mut out = Vec::new();
        let d = DecisionRecord {
            time_ms: 1_700_000_000_000,
            kind: "repair",
            step: "move the replica of shard 3 from node 2 to node 5".into(),
            reason: "replicas on DOWN nodes are replaced".into(),
            outcome: "done".into(),
        };
        format_decision(4, &d, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches('\n').count(), 1);
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["event"], "controller");
        assert_eq!(v["kind"], "repair");
        assert_eq!(v["node"], 4);
        assert_eq!(v["step"], d.step);
        assert_eq!(v["reason"], d.reason);
        assert_eq!(v["outcome"], "done");
    }

    #[test]
    fn records_reach_the_file_and_a_reopen_follows_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let mut log = AuditLog::start(1, &AuditTarget::File(path.clone()), false).unwrap();
        log.record(record("granted"));
        // Rotate as logrotate does: once the first line is on disk, move
        // the file away and signal; later lines go to a new file at the
        // same path. (The writer runs on its own thread, so the test waits
        // for the line to appear; bounded, and not a hot loop.)
        let rotated = dir.path().join("audit.log.1");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_to_string(&path)
            .unwrap_or_default()
            .is_empty()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "first line never written"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::rename(&path, &rotated).unwrap();
        log.reopen();
        log.record(record("released"));
        log.close();
        let old = std::fs::read_to_string(&rotated).unwrap();
        let new = std::fs::read_to_string(&path).unwrap();
        assert!(old.contains("\"granted\"") && !old.contains("\"released\""));
        assert!(new.contains("\"released\""));
        assert_eq!(log.stats().lines_total(), 2);
        assert_eq!(log.stats().dropped_total(), 0);
    }
}
