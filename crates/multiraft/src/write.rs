//! The write path: what the loop hands to the disk and what comes back.
//!
//! Every iteration stages the shards' `Ready`s (and the deferred writes:
//! commit and applied indexes, snapshots, compactions) into one batch. At
//! most one batch is in flight: when the disk is free, the staged batch is
//! handed to the writer (one synced write for every shard: group commit)
//! and the loop goes on stepping, proposing, sending the leaders' appends
//! and applying entries already committed. What it stages meanwhile is the
//! next batch, handed over the moment this one lands (TiKV's async-io
//! write workers and raft-rs's `advance_append_async` /
//! `on_persist_ready`). When a write lands, each shard's storage is told
//! how far it is durable, the messages that needed it (acknowledgements,
//! votes) leave, and raft-rs learns the persisted readies.
//!
//! How a batch reaches the disk is the [`WriteMode`]: a writer thread in
//! production; written at once on the loop's thread (unit tests); or held
//! until the driver completes it (the deterministic simulation, which so
//! decides when each write lands).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use fencelock_storage::{Engine, WriteBatch};
use raft::prelude::{Message, Snapshot};

/// The staged batch that makes the loop wait for the one in flight before
/// staging more (back-pressure): while it waits its inbox fills, and
/// callers are refused `SERVER_BUSY` instead of the node growing without
/// bound behind a slow disk.
pub(crate) const MAX_STAGED_WRITE_BYTES: usize = 64 << 20;

/// How the store's batches reach the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WriteMode {
    /// A writer thread: the loop keeps going while a write is in flight
    /// (production).
    #[default]
    Thread,
    /// Written on the loop's thread when handed over (the loop still
    /// handles the landing as it would a thread's).
    Inline,
    /// Held until the driver calls [`super::Store::complete_write`] (the
    /// deterministic simulation decides when each write lands).
    Driven,
}

/// One batch for the disk.
pub(crate) struct WriteJob {
    pub(crate) seq: u64,
    pub(crate) batch: WriteBatch,
    pub(crate) sync: bool,
    /// The node led a shard when it handed the batch over (the
    /// `store::leader_sync` failpoint slows only a leader's disk).
    pub(crate) leading: bool,
}

/// A batch that landed (or failed).
pub(crate) struct WriteDone {
    pub(crate) seq: u64,
    pub(crate) result: Result<(), String>,
    /// How long the engine took.
    pub(crate) took: Duration,
    pub(crate) sync: bool,
}

/// Writes `job`: what the writer thread, the inline mode and the driver
/// all run.
pub(crate) fn perform(engine: &dyn Engine, job: WriteJob) -> WriteDone {
    let started = Instant::now();
    if job.leading && job.sync {
        fail::fail_point!("store::leader_sync");
    }
    let result = if job.batch.is_empty() {
        Ok(())
    } else {
        engine
            .write(&job.batch, job.sync)
            .map_err(|e| e.to_string())
    };
    WriteDone {
        seq: job.seq,
        result,
        took: started.elapsed(),
        sync: job.sync,
    }
}

/// A shard's `Ready` whose write is staged or in flight: what waits for it.
pub(crate) struct StagedReady {
    pub(crate) shard_id: u64,
    /// raft-rs's number of the ready (`on_persist_ready`).
    pub(crate) number: u64,
    /// Messages that may leave only once the ready is durable.
    pub(crate) persisted_messages: Vec<Message>,
    /// A snapshot received from the leader, installed in memory once durable.
    pub(crate) snapshot: Option<Snapshot>,
}

/// What the next batch carries besides its bytes (which build up in
/// `Store::deferred`).
#[derive(Default)]
pub(crate) struct Staging {
    pub(crate) readies: Vec<StagedReady>,
    /// Some ready must be synced (entries, a snapshot, a new term or vote).
    pub(crate) must_sync: bool,
    pub(crate) entries: u64,
}

/// The batch on its way to the disk.
pub(crate) struct InFlight {
    /// Set by [`Writes::hand_over`].
    pub(crate) seq: u64,
    /// Each shard's storage mark at hand-over: durable through it on landing.
    pub(crate) marks: Vec<(u64, u64)>,
    pub(crate) readies: Vec<StagedReady>,
    pub(crate) entries: u64,
    pub(crate) commands: u64,
}

/// The loop's side of the write path.
pub(crate) struct Writes {
    pub(crate) mode: WriteMode,
    pub(crate) staging: Staging,
    pub(crate) in_flight: Option<InFlight>,
    next_seq: u64,
    /// To the writer thread ([`WriteMode::Thread`]).
    jobs: Option<Sender<WriteJob>>,
    /// The writer thread, joined on drop: it holds the engine, and a node
    /// restarted in the same process must find the database closed.
    writer: Option<std::thread::JoinHandle<()>>,
    /// Landed writes: from the writer thread, or queued by the loop itself.
    done_tx: Sender<WriteDone>,
    pub(crate) done_rx: Receiver<WriteDone>,
    /// The batch the driver has yet to complete ([`WriteMode::Driven`]).
    pub(crate) held: Option<WriteJob>,
    engine: Arc<dyn Engine>,
    /// [`MAX_STAGED_WRITE_BYTES`] (lowered by tests).
    pub(crate) max_staged_bytes: usize,
}

impl Writes {
    pub(crate) fn new(mode: WriteMode, engine: Arc<dyn Engine>, node_id: u64) -> Writes {
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let (jobs, writer) = if mode == WriteMode::Thread {
            // One job at a time: the loop hands over a batch only when the
            // previous one landed.
            let (tx, rx) = crossbeam_channel::bounded::<WriteJob>(1);
            let engine = engine.clone();
            let done = done_tx.clone();
            let writer = std::thread::Builder::new()
                .name(format!("fencelock-writer-{node_id}"))
                .spawn(move || {
                    for job in rx {
                        let (seq, sync) = (job.seq, job.sync);
                        // A panic here must stop the node like a failed
                        // write, not leave the loop waiting for a landing
                        // that never comes: it is reported as one.
                        let landed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            perform(engine.as_ref(), job)
                        }))
                        .unwrap_or_else(|_| WriteDone {
                            seq,
                            result: Err("the writer thread panicked in the write".into()),
                            took: Duration::ZERO,
                            sync,
                        });
                        if done.send(landed).is_err() {
                            break;
                        }
                    }
                })
                .expect("spawn the writer thread");
            (Some(tx), Some(writer))
        } else {
            (None, None)
        };
        Writes {
            mode,
            staging: Staging::default(),
            in_flight: None,
            next_seq: 1,
            jobs,
            writer,
            done_tx,
            done_rx,
            held: None,
            engine,
            max_staged_bytes: MAX_STAGED_WRITE_BYTES,
        }
    }

    /// Hands `batch` to the disk as this mode does; `in_flight` (its
    /// sequence number set here) is what waits for it. An empty batch
    /// lands at once.
    pub(crate) fn hand_over(
        &mut self,
        mut in_flight: InFlight,
        batch: WriteBatch,
        sync: bool,
        leading: bool,
    ) {
        debug_assert!(self.in_flight.is_none(), "one batch in flight at a time");
        let seq = self.next_seq;
        self.next_seq += 1;
        in_flight.seq = seq;
        self.in_flight = Some(in_flight);
        let job = WriteJob {
            seq,
            batch,
            sync,
            leading,
        };
        if job.batch.is_empty() {
            // Nothing for the disk (messages that wait only for earlier
            // batches, all landed): lands at once, in order.
            let _ = self.done_tx.send(perform(self.engine.as_ref(), job));
            return;
        }
        match self.mode {
            WriteMode::Thread => {
                let jobs = self.jobs.as_ref().expect("thread mode has a writer");
                if jobs.send(job).is_err() {
                    panic!("fencelock: the writer thread is gone; stopping the node");
                }
            }
            WriteMode::Inline => {
                let _ = self.done_tx.send(perform(self.engine.as_ref(), job));
            }
            WriteMode::Driven => self.held = Some(job),
        }
    }

    /// The driver's completion of the held batch ([`WriteMode::Driven`]).
    pub(crate) fn complete_held(&mut self) -> bool {
        let Some(job) = self.held.take() else {
            return false;
        };
        let _ = self.done_tx.send(perform(self.engine.as_ref(), job));
        true
    }

    /// Blocks until the batch in flight has landed and returns it (the
    /// driver's held batch is written now).
    pub(crate) fn wait(&mut self) -> Option<WriteDone> {
        self.in_flight.as_ref()?;
        self.complete_held();
        match self.done_rx.recv() {
            Ok(done) => Some(done),
            Err(_) => panic!("fencelock: the writer thread is gone; stopping the node"),
        }
    }
}

impl Drop for Writes {
    /// Stops the writer thread after the write it may be doing (what a
    /// crash would leave is whatever landed; a batch never handed over is
    /// lost, as in a crash).
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}
