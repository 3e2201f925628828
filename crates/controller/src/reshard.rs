//! Slot migration, decided from the replicated state alone.
//!
//! A migration (`reshard move`, `split`) is recorded in the placement map
//! first and then driven through three shard commands (`ExportSlots` on the
//! source, `ImportSlots` on the target, `DropExport` on the source) and one
//! placement command that ends it. Any of them can fail with an outcome
//! nobody knows: the leader that took the proposal died, the answer was
//! lost, the orchestrator itself died. The rules here make every such
//! failure harmless:
//!
//! * **Every step is idempotent** (by migration id), so a step whose outcome
//!   is unknown is simply proposed again: the repeat applies after the
//!   first (if that one commits at all) and answers what the shard now
//!   holds.
//! * **Only a refusal applied by the shard is a decision**, and even then
//!   the orchestrator first proposes `CloseMigration` to that shard and
//!   decides from its answer: after the close no export or import of the
//!   migration can change the shard any more, so a delayed copy of an
//!   earlier proposal cannot undo the decision, and the answer says what
//!   the shard did (kept an export, serves the slots).
//! * **The map ends the migration last**, after the shards are settled:
//!   committed once the target serves the slots, rolled back once the
//!   source took its export back, aborted only when the source is closed
//!   without having exported. Until then the open migration in the map is
//!   the record [`resume`] finishes from, on any node, any number of times.
//!
//! The protocol runs over the [`Cluster`] trait: gRPC calls to the nodes in
//! production (`crate::ops::Ops` over the server's gRPC node calls), the simulated stores in the
//! deterministic simulation (`crates/simulation/tests/sim/reshard.rs`), which
//! forces the leader changes and lost answers at each step.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use fencelock_api::v1::{ErrorDetail, Reason};
use fencelock_placement::{Migration, PlacementCommand, PlacementMap};
use fencelock_statemachine::{Command, Reply, SlotSet};

use crate::error::{ControllerError, Result};

/// The result of a finished migration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resharded {
    pub migration_id: u64,
    pub epoch: u64,
    pub resources: u32,
    pub new_shard_id: u64,
}

/// What the protocol needs from the cluster. Every call is one attempt:
/// retries, and what a failure means, are decided here.
#[allow(async_fn_in_trait)]
pub trait Cluster {
    /// Proposes a resharding command to the leader of `shard_id` and
    /// returns the state machine's answer.
    async fn propose_shard(&self, shard_id: u64, command: Command) -> Result<Reply>;
    /// Proposes a placement command; the map right after it applied.
    async fn propose_meta(&self, command: PlacementCommand) -> Result<Arc<PlacementMap>>;
    /// The newest placement map reachable.
    async fn map(&self) -> Result<Arc<PlacementMap>>;
    /// Starts `node_id`'s replica of a split's new shard from the shard's
    /// bootstrap snapshot (nothing if it exists).
    async fn start_replica(
        &self,
        node_id: u64,
        shard_id: u64,
        voters: BTreeSet<u64>,
        epoch: u64,
    ) -> Result<()>;
    /// The exports every data shard's leader reports as kept, by shard.
    async fn pending_exports(&self) -> BTreeMap<u64, Vec<u64>>;
    /// Waits before try `tries + 1` of a step; false once the step has had
    /// its time (the step then fails, and the migration stays open).
    async fn pause(&self, tries: u32) -> bool;
    /// The clock allowance imported leases get (as at a leader change).
    fn clock_offset_allowance_ms(&self) -> u64;
    /// Whether every replica of `shard_id` answers that it reads an
    /// `ImportSlots` carrying the source's lease clock (placement format
    /// [`fencelock_placement::IMPORT_AT_CLOCK_FORMAT`]): only then is one sent, since a replica
    /// of the previous release would stop at it.
    async fn reads_import_at_clock(&self, shard_id: u64) -> bool;
}

/// Whether a shard applied the command and refused it (nothing changed).
/// Everything else — no leader, a lost answer, a dead node — leaves the
/// outcome open. A wrong guess here costs only time: no decision is taken
/// before `CloseMigration` says what the shard did.
fn refused_by_shard(error: &ControllerError) -> bool {
    is_answer(error)
        && matches!(
            error.reason(),
            Reason::PlacementConflict | Reason::EpochNotMatch
        )
}

/// Whether the placement map applied the command and refused it.
fn refused_by_map(error: &ControllerError) -> bool {
    is_answer(error)
        && matches!(
            error.reason(),
            Reason::PlacementConflict | Reason::InvalidAdminRequest | Reason::NodeNotFound
        )
}

/// Whether `error` is a typed answer (a node's or the map's refusal), not
/// a step that ran out of time or a call that broke off: only an answer
/// says what the cluster did.
fn is_answer(error: &ControllerError) -> bool {
    !matches!(
        error,
        ControllerError::StepTimedOut { .. } | ControllerError::Unanswered { .. }
    )
}

/// A step that did not get a definite answer in its time: the migration
/// stays open, for `reshard resume` or the meta leader to finish.
///
/// Always `OUTCOME_UNKNOWN`, whatever the last attempt's reason: steps
/// before it may have applied, so the last refusal (`LEADER_UNKNOWN`, say)
/// must not read as "nothing happened".
fn unfinished(m: u64, what: &str, last: &ControllerError) -> ControllerError {
    let last_detail = last.to_detail();
    let last_reason = format!("{:?}: {}", last_detail.reason(), last_detail.message);
    let which = match m {
        0 => "the migration".to_owned(),
        m => format!("migration {m}"),
    };
    ErrorDetail {
        shard_id: last_detail.shard_id,
        ..ErrorDetail::new(
            Reason::OutcomeUnknown,
            format!(
                "{which}: {what} did not get a definite answer (last: {last_reason}); a \
                 migration it opened stays open and is finished by the meta leader, or by \
                 `fencelock admin reshard resume`"
            ),
        )
    }
    .into()
}

fn ended(m: u64, how: &str, cause: &ControllerError) -> ControllerError {
    let mut detail = match cause {
        ControllerError::Unanswered { .. } => {
            ErrorDetail::new(Reason::PlacementConflict, cause.to_string())
        }
        typed => typed.to_detail(),
    };
    detail.message = format!("migration {m} {how}: {}", detail.message);
    detail.into()
}

fn unexpected(m: u64, what: &str, reply: &Reply) -> ControllerError {
    ErrorDetail::new(
        Reason::Internal,
        format!("migration {m}: {what} answered {reply:?}"),
    )
    .into()
}

enum Step<T> {
    Done(T),
    Refused(ControllerError),
}

/// Runs one attempt after another until a definite answer or the step's
/// time is up.
async fn settle<C, T, F, Fut>(
    c: &C,
    m: u64,
    what: &str,
    refused: fn(&ControllerError) -> bool,
    mut attempt: F,
) -> Result<Step<T>>
where
    C: Cluster,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        match attempt().await {
            Ok(v) => return Ok(Step::Done(v)),
            Err(e) if refused(&e) => return Ok(Step::Refused(e)),
            Err(e) => {
                tries += 1;
                if !c.pause(tries).await {
                    return Err(unfinished(m, what, &e));
                }
            }
        }
    }
}

async fn shard_step<C: Cluster>(
    c: &C,
    m: u64,
    what: &str,
    shard_id: u64,
    command: Command,
) -> Result<Step<Reply>> {
    settle(c, m, what, refused_by_shard, || {
        c.propose_shard(shard_id, command.clone())
    })
    .await
}

/// What `CloseMigration` found on a shard.
struct Closed {
    pending_export: Option<SlotSet>,
    owns_slots: bool,
    epoch: u64,
    later_migration: bool,
}

/// A shard took part in a later migration, so `m` has ended; the map this
/// orchestrator read was stale. Nothing is decided from it.
fn ended_elsewhere(m: u64, shard_id: u64) -> ControllerError {
    ErrorDetail::new(
        Reason::PlacementConflict,
        format!(
            "migration {m} has ended (shard {shard_id} has taken part in a later one); \
             nothing was changed for it"
        ),
    )
    .into()
}

/// Settles migration `m` on `shard_id` and reads what the shard did.
async fn close<C: Cluster>(c: &C, m: u64, shard_id: u64, slots: SlotSet) -> Result<Closed> {
    let what = format!("closing it on shard {shard_id}");
    let command = Command::CloseMigration {
        migration_id: m,
        slots,
    };
    // A close is never refused by a working shard: a refusal is retried
    // like an unknown outcome.
    let reply = settle(
        c,
        m,
        &what,
        |_| false,
        || c.propose_shard(shard_id, command.clone()),
    )
    .await?;
    match reply {
        Step::Done(Reply::MigrationClosed {
            pending_export,
            owns_slots,
            epoch,
            later_migration,
        }) => Ok(Closed {
            pending_export,
            owns_slots,
            epoch,
            later_migration,
        }),
        Step::Done(other) => Err(unexpected(m, &what, &other)),
        Step::Refused(e) => Err(e),
    }
}

/// Proposes the placement command that ends `m`. A refusal means the map
/// no longer has `m` open: ended by an earlier attempt whose answer was
/// lost, or by another orchestrator that read the same shard states (every
/// orchestrator reaches the same end: it is decided by what the closed
/// shards did). Returns the map in which `m` is ended.
async fn end_in_map<C: Cluster>(
    c: &C,
    m: &Migration,
    command: PlacementCommand,
) -> Result<Arc<PlacementMap>> {
    let what = format!("{command:?}");
    match settle(c, m.id, &what, refused_by_map, || {
        c.propose_meta(command.clone())
    })
    .await?
    {
        Step::Done(map) => Ok(map),
        Step::Refused(e) => {
            // The map that refused is at least as new as the one read here
            // once it no longer shows `m` (an older copy may still do).
            let mut tries = 0;
            loop {
                let map = c.map().await?;
                if map.migration().is_none_or(|open| open.id != m.id) {
                    return Ok(map);
                }
                tries += 1;
                if !c.pause(tries).await {
                    // The command may have applied: not a refusal to pass on.
                    return Err(unfinished(m.id, &what, &e));
                }
            }
        }
    }
}

/// Whether `map` routes every slot of `m` to its target (it committed).
fn committed(map: &PlacementMap, m: &Migration) -> bool {
    m.slots.iter().all(|&s| map.shard_of_slot(s) == m.to_shard)
}

/// Starts a split's new shard's replicas (each from the bootstrap snapshot
/// every replica of it shares). Idempotent.
async fn start_new_shard<C: Cluster>(c: &C, m: &Migration) -> Result<()> {
    let map = c.map().await?;
    let Some(shard) = map.shard(m.to_shard).cloned() else {
        return Err(ErrorDetail::new(
            Reason::ShardNotFound,
            format!("migration {}: shard {} is not in the map", m.id, m.to_shard),
        )
        .into());
    };
    for &node_id in &shard.replicas {
        let what = format!("starting shard {}'s replica on node {node_id}", m.to_shard);
        let step = settle(
            c,
            m.id,
            &what,
            |_| false,
            || c.start_replica(node_id, m.to_shard, shard.replicas.clone(), shard.epoch),
        )
        .await?;
        if let Step::Refused(e) = step {
            return Err(e);
        }
    }
    Ok(())
}

/// Drives the open migration `m` to its end: committed (`Ok`), or rolled
/// back / aborted (`Err` with the refusal that decided it). An `Err` from a
/// step that got no definite answer leaves `m` open, to be resumed.
pub async fn finish<C: Cluster>(c: &C, m: &Migration) -> Result<Resharded> {
    let slots: SlotSet = m.slots.iter().copied().collect();
    if m.new_shard {
        start_new_shard(c, m).await?;
    }
    // 1. The export (or the one the source already keeps).
    let export = Command::ExportSlots {
        migration_id: m.id,
        slots,
    };
    let exported = match shard_step(c, m.id, "the export", m.from_shard, export.clone()).await? {
        Step::Done(reply) => reply,
        Step::Refused(cause) => {
            let closed = close(c, m.id, m.from_shard, slots).await?;
            if closed.later_migration {
                return Err(ended_elsewhere(m.id, m.from_shard));
            }
            if closed.pending_export.is_none() {
                // The source did not export and now never will. If it serves
                // the slots at the migration's epoch, an earlier roll-back
                // got that far; otherwise the slots never left it.
                let taken_back = closed.owns_slots && closed.epoch == m.epoch;
                let (command, how) = if taken_back {
                    (
                        PlacementCommand::RollBackMigration { migration_id: m.id },
                        "was rolled back",
                    )
                } else {
                    (
                        PlacementCommand::AbortMigration { migration_id: m.id },
                        "was aborted (nothing left the source)",
                    )
                };
                let map = end_in_map(c, m, command).await?;
                if committed(&map, m) {
                    // A stale orchestrator: another one finished `m`.
                    return Ok(done(m, 0));
                }
                return Err(ended(m.id, how, &cause));
            }
            // A delayed export applied before the close: the source keeps
            // it and answers it again.
            match shard_step(c, m.id, "the export", m.from_shard, export).await? {
                Step::Done(reply) => reply,
                Step::Refused(e) => return Err(e),
            }
        }
    };
    let Reply::Exported {
        data,
        resources,
        clock_ms,
    } = exported
    else {
        return Err(unexpected(m.id, "the export", &exported));
    };
    // The source's lease clock at the answer, if the importing shard can
    // read it (0: the source is of the previous release).
    let export_clock = |reads: bool| (reads && clock_ms > 0).then_some(clock_ms);
    // 2. The import (or the one the target already did).
    let import = Command::ImportSlots {
        migration_id: m.id,
        epoch: m.epoch,
        slots,
        data: data.clone(),
        clock_offset_allowance_ms: c.clock_offset_allowance_ms(),
        export_clock_ms: export_clock(c.reads_import_at_clock(m.to_shard).await),
    };
    if let Step::Refused(cause) = shard_step(c, m.id, "the import", m.to_shard, import).await? {
        let closed = close(c, m.id, m.to_shard, slots).await?;
        if closed.later_migration {
            return Err(ended_elsewhere(m.id, m.to_shard));
        }
        if !closed.owns_slots {
            // The target never imported and now never will: the source
            // takes its export back.
            let at = export_clock(c.reads_import_at_clock(m.from_shard).await);
            roll_back(c, m, slots, data, at).await?;
            return Err(ended(m.id, "was rolled back", &cause));
        }
    }
    // 3. The map routes the slots to the target.
    let map = end_in_map(
        c,
        m,
        PlacementCommand::CommitMigration { migration_id: m.id },
    )
    .await?;
    if !committed(&map, m) {
        // Cannot happen: the target serves the slots, so nobody could have
        // decided to give them back.
        return Err(ErrorDetail::new(
            Reason::Internal,
            format!(
                "migration {}: the target imported, the map ended it otherwise",
                m.id
            ),
        )
        .into());
    }
    // 4. The source forgets the export. If this does not get through, the
    // migration is still done; the export is a leftover `resume` drops.
    let drop = Command::DropExport { migration_id: m.id };
    if let Err(e) = shard_step(c, m.id, "dropping the export", m.from_shard, drop).await {
        tracing::warn!(
            migration_id = m.id,
            "migration committed; its export on shard {} stays until the next resume: {}",
            m.from_shard,
            e
        );
    }
    Ok(done(m, resources))
}

fn done(m: &Migration, resources: u32) -> Resharded {
    Resharded {
        migration_id: m.id,
        epoch: m.epoch,
        resources,
        new_shard_id: if m.new_shard { m.to_shard } else { 0 },
    }
}

/// The source takes back what it exported, at the migration's epoch (the
/// target is closed without it, so nobody else ever takes that epoch),
/// forgets the export, and the map records the end.
async fn roll_back<C: Cluster>(
    c: &C,
    m: &Migration,
    slots: SlotSet,
    data: Vec<u8>,
    export_clock_ms: Option<u64>,
) -> Result<()> {
    let take_back = Command::ImportSlots {
        migration_id: m.id,
        epoch: m.epoch,
        slots,
        data,
        clock_offset_allowance_ms: c.clock_offset_allowance_ms(),
        export_clock_ms,
    };
    let what = "giving the slots back to the source";
    if let Step::Refused(e) = shard_step(c, m.id, what, m.from_shard, take_back).await? {
        // The source has no room for its own state any more, say. The
        // migration stays open (the slots are served by nobody) until the
        // cause is fixed and it is resumed.
        return Err(ended(
            m.id,
            "could not be rolled back, it stays open (fix the cause, then `fencelock admin \
             reshard resume`)",
            &e,
        ));
    }
    let drop = Command::DropExport { migration_id: m.id };
    if let Step::Refused(e) = shard_step(c, m.id, "dropping the export", m.from_shard, drop).await?
    {
        return Err(e);
    }
    end_in_map(
        c,
        m,
        PlacementCommand::RollBackMigration { migration_id: m.id },
    )
    .await
    .map(|_| ())
}

/// Begins a migration of `slots` from `from` to `to` and finishes it. If the
/// begin's outcome was unknown and a repeat is refused because it did
/// apply, the migration it opened is finished.
pub async fn move_slots<C: Cluster>(
    c: &C,
    from: u64,
    to: u64,
    slots: Vec<u32>,
) -> Result<Resharded> {
    let command = PlacementCommand::BeginMigration {
        from_shard: from,
        to_shard: to,
        slots: slots.clone(),
    };
    let wanted = |m: &Migration| m.from_shard == from && m.to_shard == to && m.slots == slots;
    let m = begin(c, command, wanted).await?;
    finish(c, &m).await
}

/// Splits: one placement command creates the new shard and opens the
/// migration to it, then the migration is finished like any other.
pub async fn split<C: Cluster>(c: &C, from: u64, slots: Vec<u32>) -> Result<Resharded> {
    let command = PlacementCommand::BeginSplit {
        from_shard: from,
        slots: slots.clone(),
    };
    let wanted = |m: &Migration| m.new_shard && m.from_shard == from && m.slots == slots;
    let m = begin(c, command, wanted).await?;
    finish(c, &m).await
}

async fn begin<C: Cluster>(
    c: &C,
    command: PlacementCommand,
    wanted: impl Fn(&Migration) -> bool,
) -> Result<Migration> {
    match settle(c, 0, "beginning it", refused_by_map, || {
        c.propose_meta(command.clone())
    })
    .await?
    {
        Step::Done(map) => map.migration().cloned().ok_or_else(|| {
            ErrorDetail::new(Reason::Internal, "the map opened no migration").into()
        }),
        Step::Refused(e) => {
            // An earlier attempt may have opened it.
            let map = c.map().await?;
            match map.migration() {
                Some(m) if wanted(m) => Ok(m.clone()),
                _ => Err(e),
            }
        }
    }
}

/// Finishes the migration the map has open, if any, and then clears the
/// leftovers of earlier ones: exports a source still keeps for a migration
/// the map has ended. Returns the open migration's result.
pub async fn resume<C: Cluster>(c: &C) -> Result<Option<Resharded>> {
    let map = c.map().await?;
    let open = map.migration().cloned();
    let finished = match &open {
        Some(m) => Some(finish(c, m).await),
        None => None,
    };
    let open_id = open.as_ref().map(|m| m.id);
    let cleared = clear_leftovers(c, open_id).await;
    let finished = finished.transpose()?;
    cleared?;
    Ok(finished)
}

/// Every kept export of a migration that is no longer open: dropped if its
/// slots are served elsewhere now (the migration committed; its target has
/// them), or taken back by its source if the map still routes them to the
/// source while the source does not serve them (only an orchestrator from
/// before these rules could leave that: it aborted a migration whose export
/// had applied).
async fn clear_leftovers<C: Cluster>(c: &C, open: Option<u64>) -> Result<()> {
    for (shard_id, ids) in c.pending_exports().await {
        for id in ids {
            if Some(id) == open {
                continue;
            }
            // Only a map that knows the migration began and shows it ended
            // (which is final) says where its slots went.
            let map = c.map().await?;
            if id >= map.next_migration_id() || map.migration().is_some_and(|m| m.id == id) {
                continue;
            }
            let closed = close(c, id, shard_id, SlotSet::EMPTY).await?;
            let Some(slots) = closed.pending_export else {
                continue;
            };
            let routed_here = slots.iter().all(|s| map.shard_of_slot(s) == shard_id);
            let serves = close(c, id, shard_id, slots).await?.owns_slots;
            if routed_here && !serves {
                take_back_leftover(c, shard_id, id, slots, &map).await?;
            } else {
                let drop = Command::DropExport { migration_id: id };
                if let Step::Refused(e) =
                    shard_step(c, id, "dropping a leftover export", shard_id, drop).await?
                {
                    return Err(e);
                }
                tracing::info!(
                    migration_id = id,
                    shard_id,
                    "dropped the export of an ended migration"
                );
            }
        }
    }
    Ok(())
}

async fn take_back_leftover<C: Cluster>(
    c: &C,
    shard_id: u64,
    id: u64,
    slots: SlotSet,
    map: &PlacementMap,
) -> Result<()> {
    if map.migration().is_some() {
        // A fresh epoch cannot be handed to a shard while a migration is
        // open; the next resume does it.
        return Ok(());
    }
    let what = format!("a fresh epoch for shard {shard_id}");
    let advanced = match settle(c, id, &what, refused_by_map, || {
        c.propose_meta(PlacementCommand::AdvanceEpoch { shard_id })
    })
    .await?
    {
        Step::Done(map) => map,
        Step::Refused(e) => return Err(e),
    };
    // The map that handed out the epoch is current: look again there.
    if !slots.iter().all(|s| advanced.shard_of_slot(s) == shard_id) {
        return Ok(());
    }
    let epoch = advanced.shard(shard_id).map(|s| s.epoch).unwrap_or(0);
    let export = Command::ExportSlots {
        migration_id: id,
        slots,
    };
    let (data, clock_ms) =
        match shard_step(c, id, "reading a leftover export", shard_id, export).await? {
            Step::Done(Reply::Exported { data, clock_ms, .. }) => (data, clock_ms),
            Step::Done(other) => return Err(unexpected(id, "reading a leftover export", &other)),
            Step::Refused(e) => return Err(e),
        };
    let reads = c.reads_import_at_clock(shard_id).await;
    let take_back = Command::ImportSlots {
        migration_id: id,
        epoch,
        slots,
        data,
        clock_offset_allowance_ms: c.clock_offset_allowance_ms(),
        export_clock_ms: (reads && clock_ms > 0).then_some(clock_ms),
    };
    let what = "giving a leftover export back to its source";
    if let Step::Refused(e) = shard_step(c, id, what, shard_id, take_back).await? {
        return Err(e);
    }
    let drop = Command::DropExport { migration_id: id };
    if let Step::Refused(e) = shard_step(c, id, "dropping the export", shard_id, drop).await? {
        return Err(e);
    }
    tracing::warn!(
        migration_id = id,
        shard_id,
        epoch,
        "an ended migration's export was never imported: its source took it back"
    );
    Ok(())
}
