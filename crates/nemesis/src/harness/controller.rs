//! The placement controller acting by itself on real processes, under the
//! recorded load of a chaos run (issue "A placement controller that acts by
//! itself"): five nodes, sixteen data shards,
//!
//! 1. one node killed with SIGKILL for good: every shard must be back to
//!    three voters, all on live nodes, within `node_down_after_ms` + 60 s,
//!    with no operator action;
//! 2. the scheduler paused and a sixth node joined: nothing moves to it;
//! 3. the scheduler resumed: replicas and leaderships spread onto the new
//!    node until the live nodes are even;
//! 4. a hot range: [`HOT_LOCKS`] locks held in the slots of one shard, over
//!    `controller.split_above_locks`: the shard splits by itself, and every
//!    hot resource taken again afterwards gets a higher token (the tokens
//!    checker compares them with the grants before the split);
//!
//! then the whole history goes through every checker, and no client call
//! may have ended without an answer it could act on (an unknown outcome:
//! the client retried until its deadline). Each phase that misses its goal
//! is a problem in [`ControllerRunResult::problems`], never a panic, so the
//! history is always checked and kept.

use std::collections::BTreeMap;
use std::time::Duration;

use fencelock_api::v1::scheduler_request::Action as SchedulerAction;
use fencelock_api::v1::{ListShardsResponse, ReplicaRole, SchedulerRequest};
use tokio::time::Instant;

use super::cluster::Cluster;
use super::lock_client::{AFTER_AMBIGUOUS_ATTEMPT, LEASE_SINCE_ENDED};
use super::run::{out_dir, Load, RunConfig, RunError, RunResult, SETTLE_MS};
use crate::history::{Operation, Outcome, Phase};
use crate::retry::RETRIED_REASONS;

/// Members at the start, and data shards.
pub const NODES: u64 = 5;
pub const DATA_SHARDS: u32 = 16;
/// The node that joins in phase 2.
pub const JOINING_NODE: u64 = NODES + 1;
/// `controller.node_down_after_ms` of the run: short, so the run is.
pub const DOWN_AFTER_MS: u64 = 5_000;
/// The bound on a repair, past `node_down_after_ms`.
pub const REPAIR_WITHIN_MS: u64 = DOWN_AFTER_MS + 60_000;
/// Load before the first fault, so the history has grants to check.
const WARM_UP_MS: u64 = 5_000;
/// How long a paused scheduler is watched for moves to the new node.
const PAUSED_WATCH_MS: u64 = 8_000;
/// How long the resumed controller may take to fill the new node.
const BALANCE_WITHIN_MS: u64 = 120_000;
const POLL: Duration = Duration::from_millis(500);
/// `controller.split_above_locks` of the run: far above what the lock
/// clients hold at once (a few per shard), below [`HOT_LOCKS`].
pub const SPLIT_ABOVE_LOCKS: u64 = 40;
/// Locks held in one shard's slots to make it split.
pub const HOT_LOCKS: usize = 60;
/// How long the split may take to start and finish.
const SPLIT_WITHIN_MS: u64 = 60_000;
/// The recording process that holds the hot locks.
const HOT_PROCESS: crate::history::ProcessId = 700;

/// The `[controller]` section every node of the run gets.
pub fn controller_config() -> String {
    format!(
        "\n[controller]\nrepair = true\nnode_down_after_ms = {DOWN_AFTER_MS}\n\
         balance = true\nmax_moves_per_round = 2\nsplit_above_locks = {SPLIT_ABOVE_LOCKS}\n"
    )
}

/// A run's configuration: [`RunConfig`]'s load and checks (its fault kinds
/// and duration are not used) over [`NODES`] nodes and [`DATA_SHARDS`].
pub fn config(cfg: &RunConfig) -> RunConfig {
    RunConfig {
        nodes: NODES,
        shard_count: DATA_SHARDS,
        kinds: Vec::new(),
        ..cfg.clone()
    }
}

pub struct ControllerRunResult {
    pub run: RunResult,
    /// The node killed for good.
    pub victim: u64,
    /// From the kill to every shard on three live voters.
    pub repaired_after_ms: Option<u64>,
    /// From the resume to the live nodes evened out.
    pub balanced_after_ms: Option<u64>,
    /// The shard the hot range was in, and from the last hot grant to the
    /// split being listed.
    pub split: Option<(u64, u64)>,
    /// Phases that missed their goal, in words.
    pub problems: Vec<String>,
}

impl ControllerRunResult {
    pub fn passed(&self) -> bool {
        self.run.passed() && self.problems.is_empty()
    }
}

/// Voters of every shard, from a shard listing.
fn voters(list: &ListShardsResponse) -> BTreeMap<u64, Vec<u64>> {
    list.shards
        .iter()
        .map(|s| {
            let voters = s
                .replicas
                .iter()
                .filter(|r| r.role == ReplicaRole::Voter as i32)
                .map(|r| r.node_id)
                .collect();
            (s.shard_id, voters)
        })
        .collect()
}

/// Replicas and leaderships per node among `live`, from a shard listing.
fn loads(list: &ListShardsResponse, live: &[u64]) -> (BTreeMap<u64, usize>, BTreeMap<u64, usize>) {
    let mut replicas: BTreeMap<u64, usize> = live.iter().map(|&n| (n, 0)).collect();
    let mut leaders = replicas.clone();
    for s in &list.shards {
        for r in &s.replicas {
            if let Some(c) = replicas.get_mut(&r.node_id) {
                *c += 1;
            }
        }
        if let Some(c) = leaders.get_mut(&s.leader_node_id) {
            *c += 1;
        }
    }
    (replicas, leaders)
}

fn spread(counts: &BTreeMap<u64, usize>) -> usize {
    let max = counts.values().max().copied().unwrap_or(0);
    let min = counts.values().min().copied().unwrap_or(0);
    max - min
}

async fn scheduler(cluster: &Cluster, action: SchedulerAction) -> Result<bool, String> {
    let mut last = String::from("no running node");
    for attempt in 0..10u64 {
        for id in cluster.running(attempt) {
            let request = SchedulerRequest {
                action: action as i32,
            };
            match cluster.admin_client(id).scheduler(request).await {
                Ok(r) => return Ok(r.into_inner().paused),
                Err(status) => last = format!("node {id}: {}", status.message()),
            }
        }
        tokio::time::sleep(POLL).await;
    }
    Err(last)
}

/// The node holding the most voters (lowest id on ties).
fn busiest(list: &ListShardsResponse) -> u64 {
    let mut held: BTreeMap<u64, usize> = BTreeMap::new();
    for v in voters(list).values() {
        for &n in v {
            *held.entry(n).or_default() += 1;
        }
    }
    held.into_iter()
        .max_by_key(|&(n, c)| (c, std::cmp::Reverse(n)))
        .map_or(1, |(n, _)| n)
}

/// Polls the shard listing until `done` says so or `within` passes;
/// returns the time it took, or the last listing's state in words.
async fn wait_for(
    cluster: &Cluster,
    within: Duration,
    done: impl Fn(&ListShardsResponse) -> Result<(), String>,
) -> Result<u64, String> {
    let started = Instant::now();
    let mut last = String::from("no listing");
    while started.elapsed() < within {
        match cluster.shards().await {
            Ok(list) => match done(&list) {
                Ok(()) => return Ok(started.elapsed().as_millis() as u64),
                Err(why) => last = why,
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(POLL).await;
    }
    Err(last)
}

/// Resource names whose slots `shard_id` owns in `list`.
fn names_in_shard(list: &ListShardsResponse, shard_id: u64, count: usize) -> Vec<String> {
    let Some(shard) = list.shards.iter().find(|s| s.shard_id == shard_id) else {
        return Vec::new();
    };
    let owns = |slot: u32| {
        shard
            .slot_ranges
            .iter()
            .any(|r| (r.start..=r.end).contains(&slot))
    };
    (0u64..)
        .map(|i| format!("chaos/hot-{i}"))
        .filter(|name| {
            fencelock_statemachine::ResourceName::parse(name)
                .is_ok_and(|r| owns(fencelock_statemachine::slot_of(&r)))
        })
        .take(count)
        .collect()
}

/// Phase 4: holds [`HOT_LOCKS`] locks in the shard of `chaos/r-0` (one of
/// the lock clients' resources), waits for the controller to split it,
/// then releases each hot lock and takes it once more. Returns the hot
/// shard and how long the split took.
async fn hot_range_splits(cluster: &Cluster, load: &Load) -> Result<(u64, u64), String> {
    let before = cluster.shards().await.map_err(|e| e.to_string())?;
    let slot = fencelock_statemachine::ResourceName::parse("chaos/r-0")
        .map(|r| fencelock_statemachine::slot_of(&r))
        .map_err(|e| e.to_string())?;
    let hot = before
        .shards
        .iter()
        .find(|s| {
            s.slot_ranges
                .iter()
                .any(|r| (r.start..=r.end).contains(&slot))
        })
        .map(|s| s.shard_id)
        .ok_or("no shard owns chaos/r-0")?;
    let names = names_in_shard(&before, hot, HOT_LOCKS);
    let mut client =
        super::lock_client::LockClient::new(HOT_PROCESS, &load.endpoints, load.recorder.clone());
    let mut held = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if let Some(grant) = client.acquire(name, &format!("hot-{i}"), 600_000, 0).await {
            held.push((name.clone(), grant));
        }
    }
    if held.len() < HOT_LOCKS * 9 / 10 {
        return Err(format!(
            "only {} of {HOT_LOCKS} hot locks granted",
            held.len()
        ));
    }
    let shards_before = before.shards.len();
    let took = wait_for(cluster, Duration::from_millis(SPLIT_WITHIN_MS), |list| {
        // Finished: the new shard exists and owns slots (the migration
        // committed).
        let empty = list
            .shards
            .iter()
            .filter(|s| s.shard_id != 0 && s.slot_ranges.is_empty())
            .count();
        if list.shards.len() > shards_before && empty == 0 {
            Ok(())
        } else {
            Err(format!(
                "{} shards, {empty} without slots",
                list.shards.len()
            ))
        }
    })
    .await
    .map_err(|last| {
        format!(
            "shard {hot} holding {} locks did not split within {SPLIT_WITHIN_MS} ms: {last}",
            held.len()
        )
    })?;
    for (i, (name, grant)) in held.iter().enumerate() {
        client.release(name, &grant.lease_id).await;
        if let Some(again) = client
            .acquire(name, &format!("hot-again-{i}"), 5_000, 0)
            .await
        {
            client.release(name, &again.lease_id).await;
        }
    }
    Ok((hot, took))
}

/// Whether the client gave up on the call: it kept getting "try again"
/// (or nothing) until its deadline. A definite refusal — the lock is held
/// — is an answer the caller acts on, also after an attempt that timed out
/// (recorded as unknown: that attempt might have applied); so is a retry
/// answered with the earlier grant of a lease that has ended since (the
/// service cancels a grant whose caller went away before it was told).
pub fn gave_up(op: &Operation) -> bool {
    match &op.outcome {
        Outcome::Ok(_) => false,
        Outcome::Unknown(why) => {
            !why.ends_with(AFTER_AMBIGUOUS_ATTEMPT) && !why.starts_with(LEASE_SINCE_ENDED)
        }
        Outcome::Fail(why) => {
            !why.starts_with("REASON_") || RETRIED_REASONS.iter().any(|r| r.as_str_name() == why)
        }
    }
}

/// The whole scenario; see the module docs.
pub async fn run(cfg: &RunConfig) -> Result<ControllerRunResult, RunError> {
    let cfg = config(cfg);
    let (dir, temporary) = out_dir(&cfg)?;
    eprintln!("controller run: output in {}", dir.display());
    let mut cluster = Cluster::start_with(
        &cfg.fencelock_bin,
        &dir,
        NODES,
        1,
        DATA_SHARDS,
        controller_config(),
    )?;
    let load = Load::start(&cfg, &cluster).await?;
    let mut problems = Vec::new();
    tokio::time::sleep(Duration::from_millis(WARM_UP_MS)).await;

    // 1. Kill the busiest node for good.
    let victim = busiest(&cluster.shards().await?);
    eprintln!("controller run: SIGKILL node {victim} for good");
    cluster.kill(victim);
    load.recorder.nemesis(
        "kill-for-good",
        Phase::Start,
        format!("SIGKILL node {victim}, never restarted"),
    );
    let repaired = wait_for(&cluster, Duration::from_millis(REPAIR_WITHIN_MS), |list| {
        let all = voters(list);
        match all
            .iter()
            .find(|(_, v)| v.len() != 3 || v.contains(&victim))
        {
            None if all.len() > DATA_SHARDS as usize => Ok(()),
            None => Err(format!("only {} shards listed", all.len())),
            Some((shard, v)) => Err(format!("shard {shard} has voters {v:?}")),
        }
    })
    .await;
    let repaired_after_ms = match repaired {
        Ok(ms) => Some(ms),
        Err(last) => {
            problems.push(format!(
                "not repaired within {REPAIR_WITHIN_MS} ms of killing node {victim}: {last}"
            ));
            None
        }
    };
    eprintln!("controller run: repaired after {repaired_after_ms:?} ms");

    // 2. Paused: a joining node receives nothing.
    match scheduler(&cluster, SchedulerAction::Pause).await {
        Ok(true) => {}
        Ok(false) => problems.push("pause answered not paused".into()),
        Err(e) => problems.push(format!("pause failed: {e}")),
    }
    if let Err(e) = cluster.join(JOINING_NODE).await {
        problems.push(format!("node {JOINING_NODE} could not join: {e}"));
    }
    tokio::time::sleep(Duration::from_millis(PAUSED_WATCH_MS)).await;
    let live: Vec<u64> = (1..=JOINING_NODE).filter(|&n| n != victim).collect();
    match cluster.shards().await {
        Ok(list) => {
            let (replicas, _) = loads(&list, &live);
            if replicas[&JOINING_NODE] != 0 {
                problems.push(format!(
                    "a paused controller moved {} replicas to node {JOINING_NODE}",
                    replicas[&JOINING_NODE]
                ));
            }
        }
        Err(e) => problems.push(format!("listing shards while paused: {e}")),
    }

    // 3. Resumed: the new node fills up until the live nodes are even.
    match scheduler(&cluster, SchedulerAction::Resume).await {
        Ok(false) => {}
        Ok(true) => problems.push("resume answered paused".into()),
        Err(e) => problems.push(format!("resume failed: {e}")),
    }
    let balanced = wait_for(&cluster, Duration::from_millis(BALANCE_WITHIN_MS), |list| {
        let (replicas, leaders) = loads(list, &live);
        if spread(&replicas) <= 1 && leaders[&JOINING_NODE] > 0 {
            Ok(())
        } else {
            Err(format!("replicas {replicas:?}, leaders {leaders:?}"))
        }
    })
    .await;
    let balanced_after_ms = match balanced {
        Ok(ms) => Some(ms),
        Err(last) => {
            problems.push(format!(
                "node {JOINING_NODE} not filled within {BALANCE_WITHIN_MS} ms: {last}"
            ));
            None
        }
    };
    eprintln!("controller run: balanced after {balanced_after_ms:?} ms");
    // The dead node stays dead, but the cluster is whole again: liveness
    // is measured from here.
    load.recorder.nemesis(
        "heal",
        Phase::HealAll,
        "repaired and balanced without the killed node".into(),
    );

    // 4. A hot range splits its shard.
    let split = match hot_range_splits(&cluster, &load).await {
        Ok(split) => Some(split),
        Err(e) => {
            problems.push(e);
            None
        }
    };
    eprintln!("controller run: split (shard, after ms) {split:?}");

    tokio::time::sleep(Duration::from_millis(SETTLE_MS)).await;
    let crashes = cluster.crashed();
    // The directory is kept unless every check and every phase passed.
    let run = load
        .finish(&cfg, cluster, dir.clone(), false, crashes)
        .await?;
    let gave_up: Vec<String> = run
        .history
        .ops
        .iter()
        .filter(|op| gave_up(op))
        .map(|op| format!("{:?} -> {:?}", op.call, op.outcome))
        .collect();
    if !gave_up.is_empty() {
        problems.push(format!(
            "{} client calls retried until their deadline without an answer, e.g. {}",
            gave_up.len(),
            gave_up[0]
        ));
    }
    if temporary && run.passed() && problems.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(ControllerRunResult {
        run,
        victim,
        repaired_after_ms,
        balanced_after_ms,
        split,
        problems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Call, Mode};

    fn acquire_ending(outcome: Outcome) -> Operation {
        Operation {
            id: 0,
            process: 1,
            call: Call::Acquire {
                resource: "chaos/r-4".into(),
                request_id: "c6-28".into(),
                ttl_ms: 3_000,
                wait_ms: 2_000,
                mode: Mode::Exclusive,
            },
            invoke_ns: 0,
            complete_ns: 1,
            outcome,
        }
    }

    #[test]
    fn a_retry_answered_with_a_since_ended_grant_is_an_answer_not_giving_up() {
        let answered = acquire_ending(Outcome::Unknown(format!(
            "{LEASE_SINCE_ENDED} (LEASE_STATE_CANCELLED)"
        )));
        assert!(!gave_up(&answered));
        let refused_after_timeout = acquire_ending(Outcome::Unknown(format!(
            "REASON_LOCK_HELD {AFTER_AMBIGUOUS_ATTEMPT}"
        )));
        assert!(!gave_up(&refused_after_timeout));
    }

    #[test]
    fn no_answer_until_the_deadline_is_giving_up() {
        let silent = acquire_ending(Outcome::Unknown("deadline: transport error".into()));
        assert!(gave_up(&silent));
        let busy = acquire_ending(Outcome::Fail("REASON_NO_QUORUM".into()));
        assert!(gave_up(&busy));
        let held = acquire_ending(Outcome::Fail("REASON_LOCK_HELD".into()));
        assert!(!gave_up(&held));
    }
}
