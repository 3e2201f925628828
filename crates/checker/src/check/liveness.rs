//! Liveness after healing: once every fault is over (the last `heal_all`
//! nemesis event), every resource the clients still use sees an operation
//! on the lock service succeed within a bound.
//!
//! Safety alone is easy to have by refusing everything; this is the check
//! that the cluster came back (elections finished, restarted nodes caught
//! up, routing recovered).

use std::collections::BTreeMap;

use super::{CheckConfig, Verdict};
use crate::clock::ms_to_ns;
use crate::history::{Call, History};

pub fn check(history: &History, config: &CheckConfig) -> Verdict {
    let mut verdict = Verdict::new("liveness");
    let Some(healed_ns) = history.last_heal_ns() else {
        verdict.undecided("no heal_all event: nothing to measure from".into());
        return verdict;
    };
    let deadline_ns = healed_ns + ms_to_ns(config.liveness_bound_ms);
    // resource -> first ok completion after the heal (None: none yet)
    let mut first_ok: BTreeMap<&str, Option<u64>> = BTreeMap::new();
    for op in &history.ops {
        let lock_op = !matches!(op.call, Call::FenceWrite { .. } | Call::FenceRead { .. });
        if !lock_op || op.invoke_ns < healed_ns {
            continue;
        }
        let entry = first_ok.entry(op.call.resource()).or_insert(None);
        if op.is_ok() {
            *entry = Some(entry.map_or(op.complete_ns, |t| t.min(op.complete_ns)));
        }
    }
    verdict.checked = first_ok.len();
    if first_ok.is_empty() {
        verdict.undecided("no operation was invoked after the heal".into());
    }
    for (resource, ok_ns) in first_ok {
        match ok_ns {
            Some(t) if t <= deadline_ns => {}
            Some(t) => verdict.fail(format!(
                "{resource}: first success {} ms after the heal (bound {} ms)",
                (t - healed_ns) / 1_000_000,
                config.liveness_bound_ms
            )),
            None => verdict.fail(format!(
                "{resource}: no success after the heal (bound {} ms)",
                config.liveness_bound_ms
            )),
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::build::*;
    use crate::check::Status;

    fn config() -> CheckConfig {
        CheckConfig {
            liveness_bound_ms: 1000,
            ..CheckConfig::default()
        }
    }

    #[test]
    fn service_within_the_bound_passes() {
        let h = Builder::default()
            .op(1, 0, 10, get("t/a"), Done::Unknown)
            .heal(100)
            .op(1, 110, 500, get("t/a"), Done::Fail("REASON_NO_QUORUM"))
            .op(1, 600, 900, get("t/a"), got(false, 0, 0, 0))
            .build();
        let v = check(&h, &config());
        assert!(v.passed(), "{v}");
        assert_eq!(v.checked, 1);
    }

    #[test]
    fn late_or_missing_service_fails() {
        let h = Builder::default()
            .heal(100)
            .op(1, 110, 1500, get("t/a"), got(false, 0, 0, 0))
            .op(2, 110, 1500, get("t/b"), Done::Unknown)
            .build();
        let v = check(&h, &config());
        assert_eq!(v.problem_count, 2, "{v}");
    }

    #[test]
    fn without_a_heal_nothing_is_decided() {
        let h = Builder::default()
            .op(1, 0, 10, get("t/a"), got(false, 0, 0, 0))
            .build();
        assert_eq!(check(&h, &config()).status, Status::Inconclusive);
    }
}
