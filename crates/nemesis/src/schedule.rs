//! Which faults happen, in which order, for how long: a pure function of a
//! seed, so a failed run's schedule can be replayed exactly.
//!
//! A schedule is a list of steps. A step starts one fault, or two of
//! different families at once (a partition while a leader is killed, a
//! paused client during a slot migration), holds them, heals them, and
//! leaves a quiet gap before the next step. The first steps cover every
//! selected kind once, alone, in seeded order, so even a short run injects
//! each (a fault combined with another might find nothing to act on: a
//! paused client cannot take its lock while no shard has a majority).

use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

/// Every fault the nemesis can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL one node, restart it from its data after a while.
    KillNode,
    /// SIGKILL the node leading the most shards, restart it.
    KillLeaders,
    /// SIGSTOP one node, SIGCONT it after longer than an election timeout.
    PauseNode,
    /// SIGSTOP a client process while it holds a lock, past its TTL; on
    /// SIGCONT it writes with its old token (a delayed old write).
    PauseClient,
    /// Cut one node off from every other node.
    IsolateNode,
    /// Cut off the node leading the most shards: the old leaders end up in
    /// the minority.
    IsolateLeader,
    /// Cut every node off from every other: no shard has a majority.
    LoseMajority,
    /// Each node reaches only its two ring neighbours: majorities overlap
    /// but none is complete.
    Ring,
    /// Transfer the leadership of several shards, back to back.
    TransferLeaders,
    /// Move one shard replica to a node without one (admin API).
    MoveReplica,
    /// Move slots between shards (admin API `reshard move`).
    MigrateSlots,
    /// Failpoint: the busiest leader crashes after a synced log write,
    /// before it sends, applies or answers anything.
    FpCrashAfterPersist,
    /// Failpoint: the busiest leader drops a third of its replies after
    /// commit (clients see lost replies and retry by request id).
    FpDropReplies,
    /// Failpoint: a node's synced writes take 1.5 s while it leads; it is
    /// made leader of shards, then isolated (an old leader with a slow disk).
    FpSlowLeaderSync,
    /// Failpoint: a node crashes installing the snapshot that a replica
    /// move sends it; restarted, it finishes the move.
    FpCrashInSnapshotInstall,
    /// The busiest leader's disk fails every fsync with EIO (the disk-fault
    /// layer): the node must stop at its next synced write, never go on
    /// with an unknown disk; healed, it restarts from its data.
    DiskEio,
    /// One node that leads nothing, if there is one, gets a disk whose
    /// syncs take 200 ms each: a slow follower, which the others outvote.
    DiskSlow,
    /// A node is killed and a record in the middle of its RocksDB log is
    /// garbled (a bad sector): restarted, it must refuse to run on it,
    /// naming the file (exit 6), never open without what it acknowledged.
    /// Healed with the copy taken before the damage (what replacing it from
    /// its peers would give it back, without the hour that takes).
    DiskCorrupt,
    /// A node that leads nothing gets its wall clock stepped by seconds
    /// (mostly ahead), then leadership of shards it holds replicas of:
    /// leases it inherits must not end early. Healed by stepping it back,
    /// on a node that now leads.
    ClockJump,
    /// The busiest leader's disk reports no free space: it must refuse new
    /// acquires on its shards (`SERVER_BUSY`, saying why) while renewals
    /// and releases go on, and take acquires again once space returns.
    DiskFull,
    /// The busiest leader's clocks, monotonic and wall, run 1% fast or
    /// slow: the documented drift bound (docs/safety.md, A2).
    ClockDrift,
}

/// Kinds that act on the same thing and so never run in one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Network,
    NodeProcess,
    ClientProcess,
    Placement,
}

impl FaultKind {
    pub const ALL: [FaultKind; 17] = [
        FaultKind::KillNode,
        FaultKind::KillLeaders,
        FaultKind::PauseNode,
        FaultKind::PauseClient,
        FaultKind::IsolateNode,
        FaultKind::IsolateLeader,
        FaultKind::LoseMajority,
        FaultKind::Ring,
        FaultKind::TransferLeaders,
        FaultKind::MoveReplica,
        FaultKind::MigrateSlots,
        FaultKind::DiskEio,
        FaultKind::DiskSlow,
        FaultKind::DiskCorrupt,
        FaultKind::DiskFull,
        FaultKind::ClockJump,
        FaultKind::ClockDrift,
    ];

    /// The failpoint kinds: they need a `fencelock` binary built with the
    /// server's `failpoints` feature (as `cargo test --workspace` builds
    /// it), so `all` does not include them; select them by name or with
    /// `failpoints`.
    pub const FAILPOINTS: [FaultKind; 4] = [
        FaultKind::FpCrashAfterPersist,
        FaultKind::FpDropReplies,
        FaultKind::FpSlowLeaderSync,
        FaultKind::FpCrashInSnapshotInstall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillNode => "kill-node",
            FaultKind::KillLeaders => "kill-leaders",
            FaultKind::PauseNode => "pause-node",
            FaultKind::PauseClient => "pause-client",
            FaultKind::IsolateNode => "isolate-node",
            FaultKind::IsolateLeader => "isolate-leader",
            FaultKind::LoseMajority => "lose-majority",
            FaultKind::Ring => "ring",
            FaultKind::TransferLeaders => "transfer-leaders",
            FaultKind::MoveReplica => "move-replica",
            FaultKind::MigrateSlots => "migrate-slots",
            FaultKind::FpCrashAfterPersist => "fp-crash-after-persist",
            FaultKind::FpDropReplies => "fp-drop-replies",
            FaultKind::FpSlowLeaderSync => "fp-slow-leader-sync",
            FaultKind::FpCrashInSnapshotInstall => "fp-crash-in-snapshot-install",
            FaultKind::DiskEio => "disk-eio",
            FaultKind::DiskSlow => "disk-slow",
            FaultKind::DiskCorrupt => "disk-corrupt",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::DiskFull => "disk-full",
            FaultKind::ClockDrift => "clock-drift",
        }
    }

    pub fn family(self) -> Family {
        match self {
            FaultKind::KillNode
            | FaultKind::KillLeaders
            | FaultKind::PauseNode
            | FaultKind::FpCrashAfterPersist
            | FaultKind::FpDropReplies
            | FaultKind::FpCrashInSnapshotInstall
            | FaultKind::DiskEio
            | FaultKind::DiskSlow
            | FaultKind::DiskCorrupt
            | FaultKind::ClockJump
            | FaultKind::ClockDrift
            | FaultKind::DiskFull => Family::NodeProcess,
            // It also cuts the network.
            FaultKind::FpSlowLeaderSync => Family::Network,
            FaultKind::PauseClient => Family::ClientProcess,
            FaultKind::IsolateNode
            | FaultKind::IsolateLeader
            | FaultKind::LoseMajority
            | FaultKind::Ring => Family::Network,
            FaultKind::TransferLeaders | FaultKind::MoveReplica | FaultKind::MigrateSlots => {
                Family::Placement
            }
        }
    }

    /// How long the fault is held, in ms (before healing), as a range.
    /// Placement actions take as long as they take; their hold is the pause
    /// after them.
    fn hold_range_ms(self, client_ttl_ms: u64) -> (u64, u64) {
        match self {
            FaultKind::KillNode | FaultKind::KillLeaders => (1_500, 5_000),
            // Longer than an election timeout, so the others elect leaders.
            FaultKind::PauseNode => (2_000, 5_000),
            // Past the TTL, so the lock is re-granted meanwhile.
            FaultKind::PauseClient => (client_ttl_ms + 1_500, client_ttl_ms + 3_000),
            FaultKind::IsolateNode
            | FaultKind::IsolateLeader
            | FaultKind::LoseMajority
            | FaultKind::Ring => (2_500, 6_000),
            FaultKind::TransferLeaders | FaultKind::MoveReplica | FaultKind::MigrateSlots => {
                (500, 1_500)
            }
            FaultKind::FpCrashAfterPersist
            | FaultKind::FpDropReplies
            | FaultKind::FpSlowLeaderSync
            | FaultKind::FpCrashInSnapshotInstall => (3_000, 5_000),
            FaultKind::DiskEio => (2_000, 4_000),
            FaultKind::DiskSlow => (3_000, 6_000),
            // Down like a killed node meanwhile.
            FaultKind::DiskCorrupt => (1_500, 4_000),
            FaultKind::ClockJump => (3_000, 6_000),
            // Past the watcher's one-second reading, both ways.
            FaultKind::DiskFull => (3_000, 6_000),
            FaultKind::ClockDrift => (4_000, 8_000),
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown fault kind {0:?}; known: kill-node, kill-leaders, pause-node, pause-client, isolate-node, isolate-leader, lose-majority, ring, transfer-leaders, move-replica, migrate-slots, disk-eio, disk-slow, disk-corrupt, disk-full, clock-jump, clock-drift, or all; fp-crash-after-persist, fp-drop-replies, fp-slow-leader-sync, fp-crash-in-snapshot-install, or failpoints")]
pub struct UnknownFault(pub String);

impl FromStr for FaultKind {
    type Err = UnknownFault;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultKind::ALL
            .into_iter()
            .chain(FaultKind::FAILPOINTS)
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownFault(s.to_owned()))
    }
}

/// Parses a comma-separated list of kinds (`all` for every kind).
pub fn parse_kinds(list: &str) -> Result<Vec<FaultKind>, UnknownFault> {
    let mut kinds = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "all" {
            kinds.extend(FaultKind::ALL);
        } else if part == "failpoints" {
            kinds.extend(FaultKind::FAILPOINTS);
        } else {
            kinds.push(part.parse()?);
        }
    }
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

/// One step of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// One kind, or two of different families, started together.
    pub kinds: Vec<FaultKind>,
    pub hold_ms: u64,
    /// Quiet time after healing, before the next step.
    pub gap_ms: u64,
    /// A random number for choices made when the step runs (which node,
    /// which shard), so they too follow from the seed.
    pub pick: u64,
}

impl Step {
    pub fn duration_ms(&self) -> u64 {
        self.hold_ms + self.gap_ms
    }
}

/// Shortest quiet gap between steps, in ms: long enough for an election.
pub const MIN_GAP_MS: u64 = 1_500;
pub const MAX_GAP_MS: u64 = 3_500;
/// Chance, in percent, that a step combines two faults.
pub const COMBINE_PERCENT: u32 = 30;

/// The schedule for `seed`: every kind in `kinds` once, then random steps
/// while the total stays within `duration_ms` (the first pass always runs
/// whole, even if it is longer).
pub fn generate(seed: u64, duration_ms: u64, kinds: &[FaultKind], client_ttl_ms: u64) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    if kinds.is_empty() {
        return steps;
    }
    let mut first_pass = kinds.to_vec();
    first_pass.shuffle(&mut rng);
    let mut total_ms = 0;
    let mut i = 0;
    loop {
        let main = if i < first_pass.len() {
            first_pass[i]
        } else {
            kinds[rng.random_range(0..kinds.len())]
        };
        let mut step_kinds = vec![main];
        if i >= first_pass.len() && rng.random_ratio(COMBINE_PERCENT, 100) {
            let others: Vec<FaultKind> = kinds
                .iter()
                .copied()
                .filter(|k| k.family() != main.family())
                .collect();
            if let Some(other) = others.choose(&mut rng) {
                step_kinds.push(*other);
            }
        }
        let hold_ms = step_kinds
            .iter()
            .map(|k| {
                let (lo, hi) = k.hold_range_ms(client_ttl_ms);
                rng.random_range(lo..=hi)
            })
            .max()
            .unwrap_or(0);
        let step = Step {
            kinds: step_kinds,
            hold_ms,
            gap_ms: rng.random_range(MIN_GAP_MS..=MAX_GAP_MS),
            pick: rng.random(),
        };
        if i >= first_pass.len() && total_ms + step.duration_ms() > duration_ms {
            break;
        }
        total_ms += step.duration_ms();
        steps.push(step);
        i += 1;
    }
    steps
}

/// A soak's schedule: steps of [`generate`] for `seed`, one starting every
/// `every_ms` (the quiet time after each fills the rest of its period, and
/// is never shorter than the step's own gap), while the total stays within
/// `duration_ms`. Unlike [`generate`], it does not promise every kind: a
/// long run reaches them by chance, a short one may not.
pub fn spaced(
    seed: u64,
    duration_ms: u64,
    kinds: &[FaultKind],
    client_ttl_ms: u64,
    every_ms: u64,
) -> Vec<Step> {
    let mut total_ms = 0;
    let mut out = Vec::new();
    // As many steps of the dense schedule as the run can use; a step per
    // period at most, so asking for its whole length is enough.
    for mut step in generate(seed, duration_ms, kinds, client_ttl_ms) {
        step.gap_ms = step.gap_ms.max(every_ms.saturating_sub(step.hold_ms));
        if total_ms + step.duration_ms() > duration_ms {
            break;
        }
        total_ms += step.duration_ms();
        out.push(step);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_soak_schedule_starts_one_step_per_period_within_the_duration() {
        let every_ms = 60_000;
        let duration_ms = 10 * every_ms;
        let steps = spaced(11, duration_ms, &FaultKind::ALL, 2_000, every_ms);
        assert!(!steps.is_empty());
        let total: u64 = steps.iter().map(Step::duration_ms).sum();
        assert!(total <= duration_ms, "{total} ms over {duration_ms}");
        for step in &steps {
            assert!(step.duration_ms() >= every_ms, "{step:?} starts early");
            assert!(step.gap_ms >= MIN_GAP_MS);
        }
        // About one step per period: none are lost to the spacing.
        assert!(steps.len() >= 8, "{} steps", steps.len());
        // Same seed, same schedule.
        assert_eq!(
            steps,
            spaced(11, duration_ms, &FaultKind::ALL, 2_000, every_ms)
        );
    }

    #[test]
    fn every_selected_kind_runs_at_least_once_even_in_a_short_run() {
        let steps = generate(7, 1_000, &FaultKind::ALL, 2_000);
        for kind in FaultKind::ALL {
            assert!(
                steps.iter().any(|s| s.kinds.contains(&kind)),
                "{kind} missing"
            );
        }
    }

    #[test]
    fn the_first_pass_runs_each_kind_alone_and_later_steps_combine() {
        let steps = generate(11, 600_000, &FaultKind::ALL, 2_000);
        assert!(steps[..FaultKind::ALL.len()]
            .iter()
            .all(|s| s.kinds.len() == 1));
        assert!(steps.iter().any(|s| s.kinds.len() == 2));
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let a = generate(42, 120_000, &FaultKind::ALL, 2_000);
        assert_eq!(a, generate(42, 120_000, &FaultKind::ALL, 2_000));
        assert_ne!(a, generate(43, 120_000, &FaultKind::ALL, 2_000));
    }

    #[test]
    fn a_step_never_combines_two_faults_of_one_family() {
        for seed in 0..50 {
            for step in generate(seed, 300_000, &FaultKind::ALL, 2_000) {
                if let [a, b] = step.kinds[..] {
                    assert_ne!(a.family(), b.family(), "{step:?}");
                }
                assert!(step.kinds.len() <= 2);
            }
        }
    }

    #[test]
    fn later_steps_stay_within_the_duration() {
        let steps = generate(3, 200_000, &[FaultKind::KillNode], 2_000);
        let total: u64 = steps.iter().map(Step::duration_ms).sum();
        assert!(
            total <= 200_000 && steps.len() > 10,
            "{total} ms, {} steps",
            steps.len()
        );
        assert!(steps.iter().all(|s| s.kinds == [FaultKind::KillNode]));
    }

    #[test]
    fn kinds_parse_by_name_or_all() {
        assert_eq!(
            parse_kinds("ring, kill-node").unwrap(),
            vec![FaultKind::KillNode, FaultKind::Ring]
        );
        assert_eq!(parse_kinds("all").unwrap().len(), FaultKind::ALL.len());
        assert_eq!(parse_kinds("failpoints").unwrap().len(), 4);
        assert!(parse_kinds("flood").is_err());
        for kind in FaultKind::ALL.into_iter().chain(FaultKind::FAILPOINTS) {
            assert_eq!(kind.name().parse::<FaultKind>(), Ok(kind));
        }
    }
}
