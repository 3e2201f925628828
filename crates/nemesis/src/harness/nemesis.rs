//! The nemesis: executes a schedule's steps against the cluster, the
//! network and the client processes, recording every fault's start and
//! stop in the history.
//!
//! Targets (which node, which shard) are chosen when a step runs, from what
//! the cluster reports then (the leader of the most shards, a shard's
//! replicas) and the step's seeded `pick`. A fault that cannot be injected
//! right now (no running node to kill, an admin call refused during another
//! fault) is recorded with what happened; it is never a checker failure.

use std::time::Duration;

use fencelock_api::v1::{
    reshard_request, MoveReplicaRequest, MoveSlots, ReplicaRole, ReshardRequest, ResumeMigration,
    SlotRange, TransferLeaderRequest,
};
use fencelock_statemachine::{slot_of, ResourceName};
use tokio::sync::oneshot;

use super::cluster::{ClockFault, Cluster, ClusterError, DiskFault, ADMIN_TIMEOUT_MS};
use super::damage;
use super::fence_server::FenceClient;
use super::grudge;
use super::holder::HolderProc;
use super::lock_client::LockClient;
use super::recorder::Recorder;
use crate::history::{Phase, ProcessId};
use crate::schedule::{FaultKind, Step};

/// Shards whose leadership moves in one `transfer-leaders` fault.
pub const TRANSFERS_PER_FAULT: usize = 3;
/// How long after a holder took its lock the nemesis pauses it.
pub const PAUSE_AFTER_GRANT_MS: u64 = 250;
/// First process id of the clients the nemesis runs itself (the next holder
/// of a paused client's lock).
pub const USURPER_FIRST_PROCESS: ProcessId = 9_000;

/// How long a node given a damaged data directory has to refuse it.
const REFUSAL_TIMEOUT_MS: u64 = 20_000;

/// How far a `clock-jump` steps a wall clock, ms: seconds, far past the
/// 500 ms allowance a leader change adds.
const CLOCK_JUMP_MS: (u64, u64) = (2_000, 8_000);
/// How fast or slow a `clock-drift` node's clocks run: the documented
/// bound (docs/safety.md, A2), 1%.
pub const CLOCK_DRIFT_PPM: i64 = 10_000;
/// Shards whose leadership a `clock-jump` hands to the stepped node.
const CLOCK_JUMP_TRANSFERS: usize = 4;

/// How long each sync of a `disk-slow` node takes.
pub const SLOW_DISK_DELAY_MS: u64 = 200;
/// How the detail of a fault that could not be injected begins.
const SKIPPED: &str = "skipped: ";

/// What must be undone when a fault heals.
enum Active {
    Restart(u64),
    Resume(u64),
    /// The paused holder, and the signal that its successor has written.
    ResumeClient(usize, Option<oneshot::Receiver<()>>),
    Partition,
    /// A node started with failpoints: restart it without them (and, if
    /// `partitioned`, heal the network first).
    Disarm {
        node: u64,
        partitioned: bool,
    },
    /// A disk fault to clear; with `must_stop`, the node was expected to
    /// stop on it and is restarted from its data.
    HealDisk {
        node: u64,
        must_stop: bool,
    },
    /// A node whose clocks were faulted: set them back to true time (the
    /// wall clock steps back; drift already accumulated stays, as on a
    /// real machine whose monotonic clock cannot run backwards).
    ClearClock(u64),
    /// A node whose data directory was damaged: kill it if it still runs,
    /// put its intact copy back and start it.
    RestoreIntact(u64),
    /// A replica move whose target was armed to crash on the snapshot:
    /// restart the target unarmed, then run the move again to finish it.
    FinishMove {
        node: u64,
        shard_id: u64,
        from: u64,
        first_try: tokio::task::JoinHandle<Result<(), String>>,
    },
    Nothing,
}

/// Failpoint settings (the `fail` crate's syntax) per fault. `return` at the
/// crash sites aborts the process; `panic` would only end the store thread.
/// The crash comes after a few hundred synced writes: late enough that the
/// restarted node leads shards again, soon enough to fall inside the hold.
const FP_CRASH_AFTER_PERSIST: &str = "store::after_persist=400*off->return";
const FP_DROP_REPLIES: &str = "store::drop_reply=33%return";
/// One 3 s stall of a leader's synced write, after the leadership moves to
/// the armed node have gone through (a stall on every write would starve its
/// Raft ticks and the moves would never finish): it lands around the time
/// the node is cut off, so an old leader finishes a delayed write.
const FP_SLOW_LEADER_SYNC: &str = "store::leader_sync=30*off->1*sleep(3000)";
const FP_CRASH_IN_SNAPSHOT_INSTALL: &str = "store::snapshot_install=return";
/// How long a node restarted with failpoints gets before it is used.
const ARMED_STARTUP_MS: u64 = 2_000;
/// Leadership moves to an armed node are abandoned after this: a node with
/// a slow disk may take long to serve, and the fault goes on without it.
const LEAD_ON_TIMEOUT_MS: u64 = 6_000;
/// Shards whose leadership moves to an armed node.
const LEAD_ON_SHARDS: usize = 2;

pub struct Nemesis<'a> {
    pub cluster: &'a mut Cluster,
    pub holders: &'a mut Vec<HolderProc>,
    pub recorder: Recorder,
    pub fence_addr: String,
    /// The resources the lock clients use (migrations move their slots).
    pub resources: Vec<String>,
    next_usurper: ProcessId,
    /// Nodes that failed: a process that exited without being killed (a
    /// crash), or one that did not refuse a damaged data directory.
    pub crashes: Vec<(u64, String)>,
}

impl<'a> Nemesis<'a> {
    pub fn new(
        cluster: &'a mut Cluster,
        holders: &'a mut Vec<HolderProc>,
        recorder: Recorder,
        fence_addr: String,
        resources: Vec<String>,
    ) -> Nemesis<'a> {
        Nemesis {
            cluster,
            holders,
            recorder,
            fence_addr,
            resources,
            next_usurper: USURPER_FIRST_PROCESS,
            crashes: Vec::new(),
        }
    }

    fn note(&self, kind: FaultKind, phase: Phase, detail: String) {
        eprintln!("nemesis: {kind} {phase:?}: {detail}");
        self.recorder.nemesis(kind.name(), phase, detail);
    }

    /// Starts the step's faults, holds them, heals them, then waits out
    /// the gap.
    pub async fn run_step(&mut self, step: &Step) {
        let mut active = Vec::new();
        for &kind in &step.kinds {
            let (detail, undo) = self.start(kind, step.pick).await;
            if matches!(undo, Active::Nothing) && detail.starts_with(SKIPPED) {
                // Counted apart in the report: not injected.
                let name = format!("{kind} (skipped)");
                eprintln!("nemesis: {name}: {detail}");
                self.recorder.nemesis(&name, Phase::Start, detail);
                continue;
            }
            self.note(kind, Phase::Start, detail);
            active.push((kind, undo));
        }
        tokio::time::sleep(Duration::from_millis(step.hold_ms)).await;
        for (kind, undo) in active.into_iter().rev() {
            let detail = self.heal(undo).await;
            self.note(kind, Phase::Stop, detail);
        }
        self.collect_crashes();
        tokio::time::sleep(Duration::from_millis(step.gap_ms)).await;
    }

    fn collect_crashes(&mut self) {
        for (id, status) in self.cluster.crashed() {
            eprintln!("nemesis: node {id} exited by itself: {status}");
            self.recorder.nemesis(
                "crash",
                Phase::Start,
                format!("node {id} exited by itself: {status}"),
            );
            self.crashes
                .push((id, format!("exited by itself: {status}")));
        }
    }

    async fn start(&mut self, kind: FaultKind, pick: u64) -> (String, Active) {
        let ids = self.cluster.ids.clone();
        match kind {
            FaultKind::KillNode | FaultKind::PauseNode => {
                let Some(&node) = self.cluster.running(pick).first() else {
                    return (format!("{SKIPPED}no running node"), Active::Nothing);
                };
                if kind == FaultKind::KillNode {
                    self.cluster.kill(node);
                    (format!("SIGKILL node {node}"), Active::Restart(node))
                } else {
                    self.cluster.pause(node);
                    (format!("SIGSTOP node {node}"), Active::Resume(node))
                }
            }
            FaultKind::KillLeaders => match self.cluster.busiest_leader().await {
                Ok((node, shards)) => {
                    self.cluster.kill(node);
                    (
                        format!("SIGKILL node {node}, leader of shards {shards:?}"),
                        Active::Restart(node),
                    )
                }
                Err(e) => (format!("{SKIPPED}{e}"), Active::Nothing),
            },
            FaultKind::PauseClient => self.pause_client(pick).await,
            FaultKind::IsolateNode => {
                let node = ids[(pick % ids.len() as u64) as usize];
                self.partition(grudge::isolate(&ids, node), format!("node {node} isolated"))
            }
            FaultKind::IsolateLeader => match self.cluster.busiest_leader().await {
                Ok((node, shards)) => self.partition(
                    grudge::isolate(&ids, node),
                    format!("node {node}, leader of shards {shards:?}, in the minority"),
                ),
                Err(e) => (format!("{SKIPPED}{e}"), Active::Nothing),
            },
            FaultKind::LoseMajority => {
                self.partition(grudge::all_alone(&ids), "every node alone".into())
            }
            FaultKind::Ring => {
                let mut order = ids.clone();
                order.rotate_left((pick % ids.len() as u64) as usize);
                self.partition(grudge::ring(&order), format!("ring {order:?}"))
            }
            FaultKind::TransferLeaders => (self.transfer_leaders(pick).await, Active::Nothing),
            FaultKind::MoveReplica => (self.move_replica(pick).await, Active::Nothing),
            FaultKind::MigrateSlots => (self.migrate_slots(pick).await, Active::Nothing),
            FaultKind::FpCrashAfterPersist => {
                self.arm_leader(FP_CRASH_AFTER_PERSIST, pick, false).await
            }
            FaultKind::FpDropReplies => self.arm_leader(FP_DROP_REPLIES, pick, false).await,
            FaultKind::FpSlowLeaderSync => self.arm_leader(FP_SLOW_LEADER_SYNC, pick, true).await,
            FaultKind::FpCrashInSnapshotInstall => self.crash_in_snapshot_install(pick).await,
            FaultKind::DiskEio => self.failing_disk().await,
            FaultKind::DiskSlow => self.slow_disk(pick).await,
            FaultKind::DiskCorrupt => self.corrupt_disk(pick).await,
            FaultKind::ClockJump => self.clock_jump(pick).await,
            FaultKind::DiskFull => self.full_disk().await,
            FaultKind::ClockDrift => self.clock_drift(pick).await,
        }
    }

    /// Kills a running node, garbles a record in the middle of its log and
    /// starts it again: it must refuse to run (exit 6, naming the file)
    /// within [`REFUSAL_TIMEOUT_MS`]. A node that runs on, or exits without
    /// saying why, is a failed node of the run.
    async fn corrupt_disk(&mut self, pick: u64) -> (String, Active) {
        let Some(&node) = self.cluster.running(pick).first() else {
            return (format!("{SKIPPED}no running node"), Active::Nothing);
        };
        self.cluster.kill(node);
        let file = match damage::garble_log(&self.cluster.data_dir(node)) {
            Ok(file) => file,
            Err(e) => {
                // Nothing was changed: start it as it was.
                let restarted = match self.cluster.restart(node) {
                    Ok(()) => "restarted".to_owned(),
                    Err(e) => format!("restart failed: {e}"),
                };
                return (
                    format!("{SKIPPED}node {node}: {e}; {restarted}"),
                    Active::Nothing,
                );
            }
        };
        let log_path = self.cluster.log_path(node);
        let log_from = std::fs::metadata(&log_path).map_or(0, |m| m.len());
        if let Err(e) = self.cluster.restart(node) {
            return (
                format!("node {node}'s {file} garbled; its start failed: {e}"),
                Active::RestoreIntact(node),
            );
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(REFUSAL_TIMEOUT_MS);
        let status = loop {
            if let Some(status) = self.cluster.reap(node) {
                break Some(status);
            }
            if tokio::time::Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let said = read_from(&log_path, log_from);
        let refused = status.is_some_and(|s| s.code() == Some(damage::EXIT_DAMAGED))
            && damage::refusal_names(&said, &file);
        if refused {
            return (
                format!("node {node}'s {file} garbled: it refused to start, naming it (exit 6)"),
                Active::RestoreIntact(node),
            );
        }
        let what = match status {
            None => format!("kept running on a garbled {file}"),
            Some(s) => format!("exited ({s}) on a garbled {file} without refusing it by name"),
        };
        eprintln!("nemesis: node {node} {what}");
        self.recorder
            .nemesis("damaged-start", Phase::Start, format!("node {node} {what}"));
        self.crashes.push((node, what.clone()));
        (format!("node {node} {what}"), Active::RestoreIntact(node))
    }

    /// Steps the wall clock of a running node that leads nothing (else any
    /// running node) by seconds, mostly ahead, then hands it the leadership
    /// of shards it holds voters of, so that it starts lease time as a new
    /// leader with a wrong wall clock.
    async fn clock_jump(&mut self, pick: u64) -> (String, Active) {
        let running = self.cluster.running(pick);
        let shards = match self.cluster.shards().await {
            Ok(list) => list.shards,
            Err(e) => return (format!("{SKIPPED}{e}"), Active::Nothing),
        };
        let leaders: Vec<u64> = shards.iter().map(|s| s.leader_node_id).collect();
        let Some(&node) = running
            .iter()
            .find(|n| !leaders.contains(n))
            .or(running.first())
        else {
            return (format!("{SKIPPED}no running node"), Active::Nothing);
        };
        let size = CLOCK_JUMP_MS.0 + pick % (CLOCK_JUMP_MS.1 - CLOCK_JUMP_MS.0 + 1);
        // Ahead is the dangerous direction (leases inherited could end
        // early); behind is tested by the heal, and by one jump in four.
        let step_ms = if (pick / 3).is_multiple_of(4) {
            -(size as i64)
        } else {
            size as i64
        };
        let fault = ClockFault {
            step_ms,
            rate_ppm: 0,
        };
        if let Err(e) = self.cluster.set_clock_fault(node, fault) {
            return (format!("{SKIPPED}{e}"), Active::Nothing);
        }
        // Let the layer pick the step up (it re-reads every 20 ms).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut moved = Vec::new();
        for shard in &shards {
            if moved.len() == CLOCK_JUMP_TRANSFERS {
                break;
            }
            let votes_here = shard
                .replicas
                .iter()
                .any(|r| r.node_id == node && r.role() == ReplicaRole::Voter);
            if !votes_here || shard.leader_node_id == node {
                continue;
            }
            moved.push(self.transfer_leader(pick, shard.shard_id, node).await);
        }
        (
            format!(
                "node {node}'s wall clock stepped {step_ms:+} ms, then leaderships moved to it: {}",
                if moved.is_empty() {
                    "no shard".to_owned()
                } else {
                    moved.join(", ")
                }
            ),
            Active::ClearClock(node),
        )
    }

    /// The busiest leader's clocks run [`CLOCK_DRIFT_PPM`] fast (or, one
    /// time in three, slow) until healed.
    async fn clock_drift(&mut self, pick: u64) -> (String, Active) {
        let node = match self.cluster.busiest_leader().await {
            Ok((node, _)) => node,
            Err(e) => return (format!("{SKIPPED}{e}"), Active::Nothing),
        };
        let rate_ppm = if pick.is_multiple_of(3) {
            -CLOCK_DRIFT_PPM
        } else {
            CLOCK_DRIFT_PPM
        };
        let fault = ClockFault {
            step_ms: 0,
            rate_ppm,
        };
        match self.cluster.set_clock_fault(node, fault) {
            Ok(()) => (
                format!("node {node}'s clocks run {rate_ppm:+} ppm"),
                Active::ClearClock(node),
            ),
            Err(e) => (format!("{SKIPPED}{e}"), Active::Nothing),
        }
    }

    /// The busiest leader's disk reports no free space from now on.
    async fn full_disk(&mut self) -> (String, Active) {
        let node = match self.cluster.busiest_leader().await {
            Ok((node, _)) => node,
            Err(e) => return (format!("{SKIPPED}{e}"), Active::Nothing),
        };
        match self
            .cluster
            .set_disk_fault(node, DiskFault::Low { free_bytes: 0 })
        {
            Ok(()) => (
                format!("node {node}'s disk reports no free space"),
                Active::HealDisk {
                    node,
                    must_stop: false,
                },
            ),
            Err(e) => (format!("{SKIPPED}{e}"), Active::Nothing),
        }
    }

    /// The busiest leader's fsyncs fail from now on.
    async fn failing_disk(&mut self) -> (String, Active) {
        let node = match self.cluster.busiest_leader().await {
            Ok((node, _)) => node,
            Err(e) => return (format!("{SKIPPED}{e}"), Active::Nothing),
        };
        match self.cluster.set_disk_fault(node, DiskFault::Eio) {
            Ok(()) => (
                format!("node {node}'s fsyncs fail with EIO"),
                Active::HealDisk {
                    node,
                    must_stop: true,
                },
            ),
            Err(e) => (format!("{SKIPPED}{e}"), Active::Nothing),
        }
    }

    /// A running node that leads no shard (else any running node) gets a
    /// disk whose syncs take [`SLOW_DISK_DELAY_MS`] each.
    async fn slow_disk(&mut self, pick: u64) -> (String, Active) {
        let running = self.cluster.running(pick);
        let leaders: Vec<u64> = match self.cluster.shards().await {
            Ok(shards) => shards.shards.iter().map(|s| s.leader_node_id).collect(),
            Err(_) => Vec::new(),
        };
        let Some(&node) = running
            .iter()
            .find(|n| !leaders.contains(n))
            .or(running.first())
        else {
            return (format!("{SKIPPED}no running node"), Active::Nothing);
        };
        let fault = DiskFault::Slow {
            delay_ms: SLOW_DISK_DELAY_MS,
        };
        match self.cluster.set_disk_fault(node, fault) {
            Ok(()) => (
                format!("node {node}'s syncs take {SLOW_DISK_DELAY_MS} ms each"),
                Active::HealDisk {
                    node,
                    must_stop: false,
                },
            ),
            Err(e) => (format!("{SKIPPED}{e}"), Active::Nothing),
        }
    }

    /// Restarts the busiest leader with `failpoints` armed, moves leaderships
    /// back to it, and, if `isolate`, cuts it off: an old leader.
    async fn arm_leader(&mut self, failpoints: &str, pick: u64, isolate: bool) -> (String, Active) {
        let node = match self.cluster.busiest_leader().await {
            Ok((node, _)) => node,
            Err(e) => return (format!("{SKIPPED}{e}"), Active::Nothing),
        };
        if let Err(e) = self.cluster.restart_with(node, Some(failpoints.to_owned())) {
            return (
                format!("{SKIPPED}restart of node {node} failed: {e}"),
                Active::Nothing,
            );
        }
        tokio::time::sleep(Duration::from_millis(ARMED_STARTUP_MS)).await;
        let moved = self.lead_on(node, pick).await;
        let mut detail = format!("node {node} restarted with {failpoints}; leads {moved}");
        if isolate {
            let ids = self.cluster.ids.clone();
            let (cut, _) =
                self.partition(grudge::isolate(&ids, node), format!("node {node} isolated"));
            detail = format!("{detail}; {cut}");
        }
        (
            detail,
            Active::Disarm {
                node,
                partitioned: isolate,
            },
        )
    }

    /// Transfers up to [`LEAD_ON_SHARDS`] shards' leadership to `node`.
    async fn lead_on(&self, node: u64, pick: u64) -> String {
        let list = match self.cluster.shards().await {
            Ok(list) => list,
            Err(e) => return format!("nothing ({e})"),
        };
        let mut led = Vec::new();
        let mut failed = Vec::new();
        for shard in list.shards.iter().filter(|s| {
            s.leader_node_id != node
                && s.replicas
                    .iter()
                    .any(|r| r.node_id == node && r.role() == ReplicaRole::Voter)
        }) {
            if led.len() + failed.len() == LEAD_ON_SHARDS {
                break;
            }
            let Some(&via) = self.cluster.running(pick).iter().find(|n| **n != node) else {
                break;
            };
            let mut client = self.cluster.admin_client(via);
            let call = client.transfer_leader(TransferLeaderRequest {
                shard_id: shard.shard_id,
                to_node_id: node,
            });
            let moved = tokio::time::timeout(Duration::from_millis(LEAD_ON_TIMEOUT_MS), call).await;
            match moved {
                Ok(Ok(_)) => led.push(shard.shard_id),
                Ok(Err(status)) => failed.push(format!("{}: {}", shard.shard_id, status.message())),
                Err(_) => failed.push(format!("{}: timed out", shard.shard_id)),
            }
        }
        if failed.is_empty() {
            format!("shards {led:?}")
        } else {
            format!("shards {led:?} (not: {})", failed.join("; "))
        }
    }

    /// Arms a node without a replica of some shard to crash installing a
    /// snapshot, then moves a replica of that shard to it (the move sends
    /// it the snapshot).
    async fn crash_in_snapshot_install(&mut self, pick: u64) -> (String, Active) {
        let list = match self.cluster.shards().await {
            Ok(list) => list,
            Err(e) => return (format!("{SKIPPED}{e}"), Active::Nothing),
        };
        let candidates: Vec<(u64, u64, u64)> = list
            .shards
            .iter()
            .filter(|s| s.shard_id != 0)
            .filter_map(|s| {
                let holders: Vec<u64> = s.replicas.iter().map(|r| r.node_id).collect();
                let to = self.cluster.ids.iter().find(|id| !holders.contains(id))?;
                let from = *holders.iter().find(|n| **n != s.leader_node_id)?;
                Some((s.shard_id, from, *to))
            })
            .collect();
        if candidates.is_empty() {
            return (
                format!("{SKIPPED}no shard can move a replica"),
                Active::Nothing,
            );
        }
        let (shard_id, from, node) = candidates[(pick % candidates.len() as u64) as usize];
        let armed = Some(FP_CRASH_IN_SNAPSHOT_INSTALL.to_owned());
        if let Err(e) = self.cluster.restart_with(node, armed) {
            return (
                format!("{SKIPPED}restart of node {node} failed: {e}"),
                Active::Nothing,
            );
        }
        tokio::time::sleep(Duration::from_millis(ARMED_STARTUP_MS)).await;
        let first_try = self.spawn_move(shard_id, from, node);
        (
            format!("node {node} armed with {FP_CRASH_IN_SNAPSHOT_INSTALL}; shard {shard_id}: replica node {from} -> node {node}"),
            Active::FinishMove {
                node,
                shard_id,
                from,
                first_try,
            },
        )
    }

    /// A replica move in the background (it may outlive a hold).
    fn spawn_move(
        &self,
        shard_id: u64,
        from: u64,
        to: u64,
    ) -> tokio::task::JoinHandle<Result<(), String>> {
        let clients: Vec<_> = self
            .cluster
            .running(0)
            .into_iter()
            .filter(|n| *n != to)
            .map(|n| self.cluster.admin_client(n))
            .collect();
        tokio::spawn(async move {
            let mut last = String::from("no running node");
            for mut c in clients {
                let call = c.move_replica(MoveReplicaRequest {
                    shard_id,
                    from_node_id: from,
                    to_node_id: to,
                });
                match tokio::time::timeout(Duration::from_millis(ADMIN_TIMEOUT_MS), call).await {
                    Ok(Ok(_)) => return Ok(()),
                    Ok(Err(status)) => last = status.message().to_owned(),
                    Err(_) => last = "timed out".into(),
                }
            }
            Err(last)
        })
    }

    fn partition(&self, g: grudge::Grudge, detail: String) -> (String, Active) {
        match self.cluster.network().partition(&g) {
            Ok(()) => (format!("{detail}; cut {g:?}"), Active::Partition),
            Err(e) => (format!("{SKIPPED}partition failed: {e}"), Active::Nothing),
        }
    }

    async fn heal(&mut self, undo: Active) -> String {
        match undo {
            Active::Restart(node) => match self.cluster.restart(node) {
                Ok(()) => format!("node {node} restarted"),
                Err(e) => format!("node {node} restart failed: {e}"),
            },
            Active::Resume(node) => {
                self.cluster.resume(node);
                format!("SIGCONT node {node}")
            }
            Active::ResumeClient(i, written) => {
                let wrote = match written {
                    Some(rx) => tokio::time::timeout(Duration::from_secs(15), rx)
                        .await
                        .is_ok_and(|r| r.is_ok()),
                    None => false,
                };
                self.holders[i].resume();
                format!(
                    "SIGCONT client process {}; its successor {}",
                    self.holders[i].process,
                    if wrote {
                        "wrote with a newer token first"
                    } else {
                        "did not write"
                    }
                )
            }
            Active::Partition => match self.cluster.network().heal() {
                Ok(()) => "network healed".into(),
                Err(e) => format!("heal failed: {e}"),
            },
            Active::Disarm { node, partitioned } => {
                let mut detail = String::new();
                if partitioned {
                    if let Err(e) = self.cluster.network().heal() {
                        detail = format!("heal failed: {e}; ");
                    }
                }
                let died = self.cluster.has_exited(node);
                match self.cluster.restart_with(node, None) {
                    Ok(()) => format!(
                        "{detail}node {node} restarted without failpoints (it had {})",
                        if died {
                            "died on its failpoint"
                        } else {
                            "kept running"
                        }
                    ),
                    Err(e) => format!("{detail}node {node} restart failed: {e}"),
                }
            }
            Active::HealDisk { node, must_stop } => {
                let cleared = match self.cluster.set_disk_fault(node, DiskFault::Healthy) {
                    Ok(()) => String::new(),
                    Err(e) => format!("clearing the fault failed: {e}; "),
                };
                if !must_stop {
                    return format!("{cleared}node {node}'s disk is healthy again");
                }
                // Stopped on its failed fsync, as it must: reaped here, so
                // it is not counted as a crash, and restarted.
                let stopped = self.cluster.has_exited(node);
                match self.cluster.restart_with(node, None) {
                    Ok(()) => format!(
                        "{cleared}node {node} {}; restarted from its data",
                        if stopped {
                            "stopped on the failed fsync"
                        } else {
                            "was still running (no synced write while its disk failed)"
                        }
                    ),
                    Err(e) => format!("{cleared}node {node} restart failed: {e}"),
                }
            }
            Active::ClearClock(node) => {
                match self.cluster.set_clock_fault(node, ClockFault::default()) {
                    Ok(()) => format!("node {node}'s clocks back to true time"),
                    Err(e) => format!("node {node}: clearing its clock fault failed: {e}"),
                }
            }
            Active::RestoreIntact(node) => {
                // Still running only if it failed to refuse (counted then).
                self.cluster.kill(node);
                if let Err(e) = damage::restore(&self.cluster.data_dir(node)) {
                    return format!("node {node}: putting its intact copy back failed: {e}");
                }
                match self.cluster.restart(node) {
                    Ok(()) => format!("node {node} restarted on its intact copy"),
                    Err(e) => format!("node {node} restart failed: {e}"),
                }
            }
            Active::FinishMove {
                node,
                shard_id,
                from,
                first_try,
            } => {
                let died = self.cluster.has_exited(node);
                if let Err(e) = self.cluster.restart_with(node, None) {
                    return format!("node {node} restart failed: {e}");
                }
                let first =
                    tokio::time::timeout(Duration::from_millis(ADMIN_TIMEOUT_MS), first_try)
                        .await
                        .map_err(|_| "still running".to_string())
                        .and_then(|r| r.unwrap_or_else(|e| Err(e.to_string())));
                let finished = match first {
                    Ok(()) => Ok(()),
                    Err(_) => self
                        .spawn_move(shard_id, from, node)
                        .await
                        .unwrap_or_else(|e| Err(e.to_string())),
                };
                format!(
                    "node {node} {} and restarted without failpoints; move {}",
                    if died {
                        "died installing the snapshot"
                    } else {
                        "did not die"
                    },
                    match finished {
                        Ok(()) => "finished".to_string(),
                        Err(e) => format!("not finished: {e}"),
                    }
                )
            }
            Active::Nothing => "done".into(),
        }
    }

    /// Pauses a holder while it holds its lock, and starts its successor: a
    /// client that waits for the lock (granted once the paused lease
    /// expires) and writes with its newer token.
    async fn pause_client(&mut self, pick: u64) -> (String, Active) {
        if self.holders.is_empty() {
            return (format!("{SKIPPED}no client process"), Active::Nothing);
        }
        let i = (pick % self.holders.len() as u64) as usize;
        let holder = &mut self.holders[i];
        if !holder.wait_fresh_grant(Duration::from_secs(10)).await {
            return (
                format!(
                    "{SKIPPED}client process {} never held its lock",
                    holder.process
                ),
                Active::Nothing,
            );
        }
        // Not the instant it took the lock: it is writing then. A little
        // later it is almost surely asleep between writes, so that when it
        // wakes its first act is the delayed write.
        tokio::time::sleep(Duration::from_millis(PAUSE_AFTER_GRANT_MS)).await;
        holder.pause();
        let resource = holder.resource.clone();
        let process = self.next_usurper;
        self.next_usurper += 1;
        let endpoints = self.cluster.endpoints();
        let mut lock = LockClient::new(process, &endpoints, self.recorder.clone());
        let mut fence = FenceClient::new(process, self.fence_addr.clone(), self.recorder.clone());
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let request_id = format!("u{process}");
            if let Some(g) = lock.acquire(&resource, &request_id, 3_000, 15_000).await {
                fence
                    .write(&resource, g.token, &format!("u{process}"))
                    .await;
                let _ = tx.send(());
                // Hold on while the paused holder wakes and tries its
                // delayed write.
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                lock.release(&resource, &g.lease_id).await;
            }
        });
        (
            format!(
                "SIGSTOP client process {} holding {}; process {process} waits for the lock",
                self.holders[i].process, self.holders[i].resource
            ),
            Active::ResumeClient(i, Some(rx)),
        )
    }

    /// Runs an admin call on the first running node that answers.
    async fn admin<T, F, Fut>(&self, pick: u64, mut call: F) -> Result<T, String>
    where
        F: FnMut(
            fencelock_api::v1::admin_service_client::AdminServiceClient<tonic::transport::Channel>,
        ) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut last = String::from("no running node");
        for node in self.cluster.running(pick) {
            let client = self.cluster.admin_client(node);
            match tokio::time::timeout(Duration::from_millis(ADMIN_TIMEOUT_MS), call(client)).await
            {
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) => last = format!("node {node}: {}", status.message()),
                Err(_) => last = format!("node {node}: timed out"),
            }
        }
        Err(last)
    }

    /// Hands `shard_id`'s leadership to node `to`; says what happened.
    async fn transfer_leader(&self, pick: u64, shard_id: u64, to: u64) -> String {
        let result = self
            .admin(pick, |mut c| async move {
                c.transfer_leader(TransferLeaderRequest {
                    shard_id,
                    to_node_id: to,
                })
                .await
            })
            .await;
        match result {
            Ok(_) => format!("shard {shard_id} -> node {to}"),
            Err(e) => format!("shard {shard_id} -> node {to} failed ({e})"),
        }
    }

    async fn transfer_leaders(&self, pick: u64) -> String {
        let list = match self.cluster.shards().await {
            Ok(list) => list,
            Err(e) => return format!("{SKIPPED}{e}"),
        };
        let mut done = Vec::new();
        let n = list.shards.len().max(1);
        for k in 0..TRANSFERS_PER_FAULT.min(n) {
            let shard = &list.shards[(pick as usize + k) % n];
            let voters: Vec<u64> = shard
                .replicas
                .iter()
                .filter(|r| r.role() == ReplicaRole::Voter && r.node_id != shard.leader_node_id)
                .map(|r| r.node_id)
                .collect();
            let Some(&to) = voters.get((pick as usize / 7) % voters.len().max(1)) else {
                continue;
            };
            done.push(self.transfer_leader(pick, shard.shard_id, to).await);
        }
        done.join("; ")
    }

    async fn move_replica(&self, pick: u64) -> String {
        let list = match self.cluster.shards().await {
            Ok(list) => list,
            Err(e) => return format!("{SKIPPED}{e}"),
        };
        let data: Vec<_> = list.shards.iter().filter(|s| s.shard_id != 0).collect();
        if data.is_empty() {
            return "skipped: no data shard".into();
        }
        let shard = data[(pick % data.len() as u64) as usize];
        let holders: Vec<u64> = shard.replicas.iter().map(|r| r.node_id).collect();
        let Some(&to) = self.cluster.ids.iter().find(|id| !holders.contains(id)) else {
            return format!("skipped: shard {} is on every node", shard.shard_id);
        };
        let from = holders[(pick as usize / 3) % holders.len()];
        let shard_id = shard.shard_id;
        let result = self
            .admin(pick, |mut c| async move {
                c.move_replica(MoveReplicaRequest {
                    shard_id,
                    from_node_id: from,
                    to_node_id: to,
                })
                .await
            })
            .await;
        match result {
            Ok(_) => format!("shard {shard_id}: replica node {from} -> node {to}"),
            Err(e) => format!("shard {shard_id}: replica node {from} -> node {to} failed ({e})"),
        }
    }

    async fn migrate_slots(&self, pick: u64) -> String {
        let list = match self.cluster.shards().await {
            Ok(list) => list,
            Err(e) => return format!("{SKIPPED}{e}"),
        };
        let resource = &self.resources[(pick % self.resources.len() as u64) as usize];
        let Ok(name) = ResourceName::parse(resource) else {
            return format!("skipped: {resource} is not a valid name");
        };
        let slot = slot_of(&name);
        let owner = list.shards.iter().find(|s| {
            s.slot_ranges
                .iter()
                .any(|r| r.start <= slot && slot <= r.end)
        });
        let Some(from) = owner.map(|s| s.shard_id) else {
            return format!("skipped: no shard owns slot {slot}");
        };
        let others: Vec<u64> = list
            .shards
            .iter()
            .map(|s| s.shard_id)
            .filter(|&id| id != 0 && id != from)
            .collect();
        if others.is_empty() {
            return "skipped: only one data shard".into();
        }
        let to = others[(pick as usize / 5) % others.len()];
        let result = self
            .admin(pick, |mut c| async move {
                c.reshard(ReshardRequest {
                    action: Some(reshard_request::Action::MoveSlots(MoveSlots {
                        from_shard_id: from,
                        to_shard_id: to,
                        slots: vec![SlotRange {
                            start: slot,
                            end: slot,
                        }],
                    })),
                })
                .await
            })
            .await;
        match result {
            Ok(r) => format!(
                "slot {slot} ({resource}) shard {from} -> {to}, epoch {}, {} resources moved",
                r.epoch, r.resources_moved
            ),
            Err(e) => format!("slot {slot} ({resource}) shard {from} -> {to} failed ({e})"),
        }
    }

    /// Ends every fault: network healed, every node running, every client
    /// process resumed. Recorded as `heal_all`, the moment the liveness
    /// checker measures from.
    pub async fn heal_all(&mut self) -> Result<(), ClusterError> {
        self.cluster.network().heal()?;
        for id in self.cluster.ids.clone() {
            self.cluster.set_disk_fault(id, DiskFault::Healthy)?;
            self.cluster.set_clock_fault(id, ClockFault::default())?;
        }
        self.collect_crashes();
        self.cluster.revive_all()?;
        for h in self.holders.iter_mut() {
            h.resume();
        }
        eprintln!("nemesis: every fault healed");
        self.recorder
            .nemesis("heal", Phase::HealAll, "every fault healed".into());
        Ok(())
    }

    /// Finishes a slot migration a fault interrupted (its slots are refused
    /// until then), retrying while the cluster comes back.
    pub async fn finish_migration(&self, within: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let result = self
                .admin(0, |mut c| async move {
                    c.reshard(ReshardRequest {
                        action: Some(reshard_request::Action::Resume(ResumeMigration {})),
                    })
                    .await
                })
                .await;
            match result {
                Ok(_) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

/// What was appended to the file at `path` from byte `from` on (lossily as
/// text; empty if it cannot be read).
fn read_from(path: &std::path::Path, from: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut out = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::Start(from)).is_ok() {
            let _ = f.read_to_end(&mut out);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
