//! Linearizability of acquire / renew / release / get, per resource,
//! against the lock model in [`model`].
//!
//! Each resource is checked on its own (a lock's history does not depend on
//! other locks'), which keeps each search small. Operations that certainly
//! failed without saying anything about the lock are left out; an acquire
//! re-sent with the same `requestId` is merged with the first one into one
//! logical acquire (the service applies it once). Unknown outcomes may take
//! effect at any point after their invocation, or never. The search has a
//! step budget; running out is reported as inconclusive, never as a pass.
//! Resources acquired in any mode other than exclusive are left out (the
//! model has one holder).

pub mod model;
mod search;

use std::collections::BTreeMap;

use model::Effect;
pub use search::{search, SearchResult};

use super::{CheckConfig, Verdict};
use crate::history::{Call, History, Operation, Outcome, Reply};

/// One operation as the search sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinOp {
    /// The history operation it stands for (the first of merged ones).
    pub op_id: usize,
    pub invoke_ns: u64,
    /// `None`: unknown outcome, no end.
    pub complete_ns: Option<u64>,
    pub effect: Effect,
}

/// Refusals of an acquire that mean the lock was held when it was decided.
const HELD_REASONS: [&str; 2] = ["REASON_LOCK_HELD", "REASON_WAIT_TIMED_OUT"];
const LEASE_NOT_HELD: &str = "REASON_LEASE_NOT_HELD";

pub fn check(history: &History, config: &CheckConfig) -> Verdict {
    let mut verdict = Verdict::new("linear");
    let mut leases = Interner::default();
    for (resource, ops) in history.by_resource() {
        // The model is one exclusive holder: resources held shared or as a
        // semaphore are the windows checker's (no more holders than the
        // mode allows) and the tokens checker's.
        let exclusive_only = ops
            .iter()
            .all(|op| !matches!(&op.call, Call::Acquire { mode, .. } if !mode.is_exclusive()));
        if !exclusive_only {
            continue;
        }
        let lin = to_lin_ops(&ops, config, &mut leases);
        if lin.is_empty() {
            continue;
        }
        verdict.checked += 1;
        match search(&lin, config.linear_max_steps) {
            SearchResult::Linearizable => {}
            SearchResult::GaveUp => verdict.undecided(format!(
                "{resource}: no answer within {} steps ({} operations)",
                config.linear_max_steps,
                lin.len()
            )),
            SearchResult::NotLinearizable {
                stuck_op,
                placed,
                states,
            } => {
                let op = &history.ops[lin[stuck_op].op_id];
                verdict.fail(format!(
                    "{resource}: not linearizable: after {placed} operations no order places op {} (process {}, {:?} -> {:?}, {}..{} ns); model states then: {states:?}",
                    op.id, op.process, op.call, op.outcome, op.invoke_ns, op.complete_ns
                ));
            }
        }
    }
    verdict
}

#[derive(Default)]
struct Interner {
    ids: BTreeMap<String, u32>,
}

impl Interner {
    fn id(&mut self, lease: &str) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(lease.to_owned()).or_insert(next)
    }
}

/// The operations of one resource that say something about the lock.
fn to_lin_ops(ops: &[&Operation], config: &CheckConfig, leases: &mut Interner) -> Vec<LinOp> {
    let mut out = Vec::new();
    // Acquires merged by request id: (first op, merged outcome, end).
    let mut acquires: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for op in ops {
        if let Call::Acquire { request_id, .. } = &op.call {
            acquires.entry(request_id).or_default().push(op);
        }
    }
    for group in acquires.values() {
        if let Some(lin) = merged_acquire(group, config, leases) {
            out.push(lin);
        }
    }
    for op in ops {
        let complete_ns = Some(op.complete_ns);
        let effect = match (&op.call, &op.outcome) {
            (
                Call::Renew {
                    lease_id, ttl_ms, ..
                },
                outcome,
            ) => {
                let lease = leases.id(lease_id);
                let earliest_end_ns = config.earliest_end_ns(op.invoke_ns, *ttl_ms);
                match outcome {
                    // The time the renewal answered (less than asked near
                    // the hold cap), or the TTL asked for where the history
                    // lacks it.
                    Outcome::Ok(_) => Effect::Renewed {
                        lease,
                        earliest_end_ns: op
                            .promise()
                            .map_or(earliest_end_ns, |(sent_ns, ttl_ms)| {
                                config.earliest_end_ns(sent_ns, ttl_ms)
                            }),
                    },
                    Outcome::Fail(r) if r == LEASE_NOT_HELD => Effect::RenewRefused { lease },
                    Outcome::Fail(_) => continue,
                    Outcome::Unknown(_) => Effect::MaybeRenewed {
                        lease,
                        earliest_end_ns,
                    },
                }
            }
            (Call::Release { lease_id, .. }, outcome) => {
                let lease = leases.id(lease_id);
                match outcome {
                    Outcome::Ok(Reply::Released { released }) => Effect::Released {
                        lease,
                        released: *released,
                    },
                    Outcome::Unknown(_) => Effect::MaybeReleased { lease },
                    _ => continue,
                }
            }
            (Call::Get { .. }, Outcome::Ok(Reply::Got { held, token, .. })) => Effect::Read {
                held: *held,
                token: *token,
            },
            _ => continue,
        };
        out.push(LinOp {
            op_id: op.id,
            invoke_ns: op.invoke_ns,
            complete_ns: if op.is_unknown() { None } else { complete_ns },
            effect,
        });
    }
    out.sort_by_key(|l| (l.invoke_ns, l.op_id));
    out
}

/// One logical acquire from every operation that sent its request id: it
/// took effect once, somewhere after the first was invoked and before the
/// first grant was seen.
fn merged_acquire(
    group: &[&Operation],
    config: &CheckConfig,
    leases: &mut Interner,
) -> Option<LinOp> {
    let first = group.iter().min_by_key(|op| op.invoke_ns)?;
    let Call::Acquire { ttl_ms, .. } = &first.call else {
        return None;
    };
    // As the windows checker counts it: the first send plus the TTL asked
    // for, or a later answer's send plus the TTL it answered, if longer.
    // A lease the service cancelled (a retry was told so: the attempt it
    // granted had lost its caller) ended at a moment nobody saw, possibly
    // long before its TTL: its time bounds nothing. Nobody was told it
    // held the lock, so nobody relied on that time either.
    let earliest_end_ns = if group.iter().any(|op| op.lease_was_cancelled()) {
        0
    } else {
        group
            .iter()
            .filter_map(|op| op.promise())
            .map(|(sent_ns, ttl_ms)| config.earliest_end_ns(sent_ns, ttl_ms))
            .fold(config.earliest_end_ns(first.invoke_ns, *ttl_ms), u64::max)
    };
    let granted = group
        .iter()
        .filter_map(|op| op.grant().map(|g| (op, g)))
        .min_by_key(|(op, _)| op.complete_ns);
    let (effect, complete_ns) = if let Some((op, (lease, token))) = granted {
        let effect = Effect::Granted {
            lease: leases.id(lease),
            token,
            earliest_end_ns,
        };
        (effect, Some(op.complete_ns))
    } else if group.iter().any(|op| op.is_unknown()) {
        let effect = Effect::MaybeGranted {
            op: first.id as u32,
            earliest_end_ns,
        };
        (effect, None)
    } else {
        let held = first
            .failure()
            .is_some_and(|reason| HELD_REASONS.contains(&reason));
        if !held {
            return None;
        }
        (Effect::RefusedHeld, Some(first.complete_ns))
    };
    Some(LinOp {
        op_id: first.id,
        invoke_ns: first.invoke_ns,
        complete_ns,
        effect,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::build::*;
    use crate::check::Status;

    const R: &str = "t/r";

    fn config() -> CheckConfig {
        CheckConfig {
            expiry_margin_percent: 0,
            expiry_slack_ms: 0,
            ..CheckConfig::default()
        }
    }

    fn held() -> Done {
        Done::Fail("REASON_LOCK_HELD")
    }

    #[test]
    fn a_sequential_lock_history_is_linearizable() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), granted("a", 10))
            .op(2, 20, 30, acquire(R, "2", 1000, 0), held())
            .op(3, 40, 50, get(R), got(true, 10, 10, 0))
            .op(1, 60, 70, renew(R, "a", 1000), renewed())
            .op(1, 80, 90, release(R, "a"), released(true))
            .op(3, 100, 110, get(R), got(false, 0, 10, 0))
            .op(2, 120, 130, acquire(R, "3", 1000, 0), granted("b", 11))
            .op(2, 140, 150, release(R, "b"), released(true))
            .op(1, 160, 170, release(R, "a"), released(false))
            .build();
        let v = check(&h, &config());
        assert!(v.passed(), "{v}");
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // The get overlaps the release: it may see the lock held or free.
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), granted("a", 10))
            .op(1, 20, 40, release(R, "a"), released(true))
            .op(2, 25, 30, get(R), got(true, 10, 10, 0))
            .op(3, 26, 35, get(R), got(false, 0, 10, 0))
            .build();
        assert!(check(&h, &config()).passed());
    }

    #[test]
    fn two_grants_without_a_release_or_expiry_are_not_linearizable() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), granted("a", 10))
            .op(2, 20, 30, acquire(R, "2", 1000, 0), granted("b", 11))
            .build();
        let v = check(&h, &config());
        assert_eq!(v.status, Status::Fail, "{v}");
        assert!(v.problems[0].contains("not linearizable"), "{v}");
    }

    #[test]
    fn a_lease_may_expire_once_its_ttl_is_certainly_up() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), granted("a", 10))
            .op(2, 1000, 1010, acquire(R, "2", 1000, 0), granted("b", 11))
            .op(1, 1020, 1030, release(R, "a"), released(false))
            .build();
        assert!(check(&h, &config()).passed());
        // Too early: freed before the TTL.
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), granted("a", 10))
            .op(3, 500, 510, get(R), got(false, 0, 10, 0))
            .build();
        assert!(!check(&h, &config()).passed());
    }

    #[test]
    fn a_lease_lasts_the_time_its_answers_granted() {
        // A renewal 20 s before a 60 s hold cap: answered with what was
        // left (the lock is free at the cap), or with the full TTL (then
        // the grant at the cap is too early).
        let capped = |answered| {
            Builder::default()
                .op(
                    1,
                    0,
                    10,
                    acquire(R, "1", 30_000, 0),
                    granted_for("a", 10, false, 30_000),
                )
                .op(
                    1,
                    40_000,
                    40_010,
                    renew(R, "a", 30_000),
                    renewed_for(answered),
                )
                .op(
                    2,
                    60_050,
                    60_060,
                    acquire(R, "2", 30_000, 0),
                    granted_for("b", 11, false, 30_000),
                )
                .build()
        };
        assert!(check(&capped(19_995), &config()).passed());
        assert!(!check(&capped(30_000), &config()).passed());
        // A re-send 10 s after the grant, answered with what was left of
        // it, or with the full TTL again.
        let resent = |answered| {
            Builder::default()
                .op(
                    1,
                    0,
                    10,
                    acquire(R, "1", 30_000, 0),
                    granted_for("a", 10, false, 30_000),
                )
                .op(
                    1,
                    10_000,
                    10_010,
                    acquire(R, "1", 30_000, 0),
                    granted_for("a", 10, true, answered),
                )
                .op(
                    2,
                    30_100,
                    30_110,
                    acquire(R, "2", 30_000, 0),
                    granted_for("b", 11, false, 30_000),
                )
                .build()
        };
        assert!(check(&resent(20_000), &config()).passed());
        assert!(!check(&resent(30_000), &config()).passed());
    }

    #[test]
    fn a_free_lock_refused_as_held_is_not_linearizable() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), held())
            .build();
        assert!(!check(&h, &config()).passed());
    }

    #[test]
    fn a_token_going_back_is_not_linearizable() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), granted("a", 10))
            .op(1, 20, 30, release(R, "a"), released(true))
            .op(2, 40, 50, acquire(R, "2", 1000, 0), granted("b", 9))
            .build();
        assert!(!check(&h, &config()).passed());
    }

    #[test]
    fn an_unknown_acquire_may_have_taken_the_lock_or_not() {
        // The unknown acquire explains the refusal of the second one...
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), Done::Unknown)
            .op(2, 20, 30, acquire(R, "2", 1000, 0), held())
            .op(3, 40, 50, get(R), got(true, 10, 10, 0))
            .op(2, 1100, 1110, acquire(R, "3", 1000, 0), granted("b", 11))
            .build();
        let v = check(&h, &config());
        assert!(v.passed(), "{v}");
        // ...or never happened.
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), Done::Unknown)
            .op(2, 20, 30, acquire(R, "2", 1000, 0), granted("b", 11))
            .build();
        assert!(check(&h, &config()).passed());
        // But it grants one lease at most: two holders with different
        // tokens cannot both come from it.
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), Done::Unknown)
            .op(3, 1500, 1510, get(R), got(true, 12, 12, 0))
            .op(3, 1600, 1610, get(R), got(true, 13, 13, 0))
            .build();
        assert!(!check(&h, &config()).passed());
    }

    /// A retry told "granted earlier, lease since ended (cancelled)": the
    /// service ended that lease on purpose at a moment nobody saw, so
    /// another grant well within its TTL is fine. An expired lease is not:
    /// its TTL still bounds its end.
    #[test]
    fn a_cancelled_unseen_lease_may_have_ended_at_any_moment() {
        let history = |why| {
            Builder::default()
                .op(
                    1,
                    0,
                    300,
                    acquire(R, "1", 5000, 1000),
                    Done::UnknownBecause(why),
                )
                .op(2, 100, 110, acquire(R, "2", 5000, 0), held())
                .op(3, 200, 210, acquire(R, "3", 5000, 0), granted("c", 12))
                .build()
        };
        let cancelled = check(
            &history("granted earlier, lease since ended (LEASE_STATE_CANCELLED)"),
            &config(),
        );
        assert!(cancelled.passed(), "{cancelled}");
        let expired = check(
            &history("granted earlier, lease since ended (LEASE_STATE_EXPIRED)"),
            &config(),
        );
        assert!(
            !expired.passed(),
            "an expired lease lasted its TTL: {expired}"
        );
    }

    #[test]
    fn an_unknown_release_may_have_freed_the_lock() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 5000, 0), granted("a", 10))
            .op(1, 20, 30, release(R, "a"), Done::Unknown)
            .op(2, 40, 50, acquire(R, "2", 5000, 0), granted("b", 11))
            .build();
        assert!(check(&h, &config()).passed());
    }

    #[test]
    fn a_resent_request_is_one_logical_acquire() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "x", 5000, 0), granted("a", 10))
            .op(
                1,
                20,
                30,
                acquire(R, "x", 5000, 0),
                Done::Ok(Reply::Acquired {
                    lease_id: "a".into(),
                    token: 10,
                    deduplicated: true,
                    granted_ttl_ms: None,
                }),
            )
            .build();
        assert!(check(&h, &config()).passed());
    }

    #[test]
    fn a_tiny_budget_is_inconclusive_not_a_pass() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "1", 1000, 0), granted("a", 10))
            .op(1, 20, 30, release(R, "a"), released(true))
            .build();
        let tight = CheckConfig {
            linear_max_steps: 1,
            ..config()
        };
        assert_eq!(check(&h, &tight).status, Status::Inconclusive);
    }
}
