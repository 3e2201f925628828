//! Lock safety on the lock side: validity windows never overlap, and no
//! acknowledged grant is lost.
//!
//! A holder's **validity window** runs from when it learned of the grant
//! (the acquire's completion) to when it stopped relying on it: the first
//! release it sent, or its stop-by deadline (the last confirmed grant or
//! renewal *send* plus the TTL, minus the clock allowance), whichever is
//! first. Another grant of the resource can only be applied after the old
//! lease ended on the server, which is after that window closed; so two
//! windows of one resource overlapping means two holders at once.
//!
//! A window can be empty: a reply that arrives after the stop-by deadline
//! (a slow retry of a waiting acquire answered from the dedup table) hands
//! over a lease its holder must not use. Empty windows overlap nothing.
//!
//! A grant is **lost** if the servers say the lease is gone (a release
//! answered `released = false`, a renewal answered `LEASE_NOT_HELD`) before
//! it could have ended: the answer completed before the lease's earliest
//! end. Such an answer was produced by an apply before its completion, so
//! the lease really ended early.

use std::collections::BTreeMap;

use super::{lease_facts, CheckConfig, LeaseFacts, Verdict};
use crate::history::{Call, History, Outcome, Reply};

/// The reason a renewal gets when its lease is gone.
const LEASE_NOT_HELD: &str = "REASON_LEASE_NOT_HELD";

pub fn check(history: &History, config: &CheckConfig) -> Verdict {
    let mut verdict = Verdict::new("windows");
    let leases = lease_facts(history, config);
    verdict.checked = leases.len();
    let mut by_resource: BTreeMap<&str, Vec<&LeaseFacts>> = BTreeMap::new();
    for lease in &leases {
        by_resource.entry(lease.resource).or_default().push(lease);
    }
    for (resource, mut leases) in by_resource {
        leases.sort_by_key(|l| l.window_start_ns());
        let mut longest: Option<&LeaseFacts> = None;
        for lease in leases {
            if lease.window_end_ns <= lease.window_start_ns() {
                continue;
            }
            if let Some(earlier) = longest {
                if lease.window_start_ns() < earlier.window_end_ns {
                    verdict.fail(format!(
                        "{resource}: lease {} (token {}) held from {} ns while lease {} (token {}) was valid until {} ns",
                        lease.lease_id,
                        lease.token,
                        lease.window_start_ns(),
                        earlier.lease_id,
                        earlier.token,
                        earlier.window_end_ns
                    ));
                }
            }
            if longest.is_none_or(|l| lease.window_end_ns > l.window_end_ns) {
                longest = Some(lease);
            }
        }
    }
    for lease in &leases {
        check_not_lost(lease, config, &mut verdict);
    }
    verdict
}

fn check_not_lost(lease: &LeaseFacts, config: &CheckConfig, verdict: &mut Verdict) {
    let Call::Acquire { ttl_ms, .. } = &lease.grant.call else {
        return;
    };
    // The earliest end as known when `sent_ns` was sent: later renewals
    // cannot explain an earlier answer.
    let earliest_end_before = |sent_ns: u64| {
        let mut end = config.earliest_end_ns(lease.sent_ns, *ttl_ms);
        for renew in &lease.renews {
            if let (Call::Renew { ttl_ms, .. }, Some(Reply::Renewed)) = (&renew.call, renew.reply())
            {
                if renew.invoke_ns < sent_ns {
                    end = end.max(config.earliest_end_ns(renew.invoke_ns, *ttl_ms));
                }
            }
        }
        end
    };
    if let Some(release) = lease.release {
        if release.outcome == Outcome::Ok(Reply::Released { released: false })
            && release.complete_ns < earliest_end_before(release.invoke_ns)
        {
            verdict.fail(format!(
                "{}: lease {} (token {}) was gone at release at {} ns, before it could end at {} ns",
                lease.resource,
                lease.lease_id,
                lease.token,
                release.complete_ns,
                earliest_end_before(release.invoke_ns)
            ));
        }
    }
    for renew in &lease.renews {
        let released_before = lease.release.is_some_and(|r| r.invoke_ns < renew.invoke_ns);
        if renew.failure() == Some(LEASE_NOT_HELD)
            && !released_before
            && renew.complete_ns < earliest_end_before(renew.invoke_ns)
        {
            verdict.fail(format!(
                "{}: lease {} (token {}) refused as not held at {} ns, before it could end at {} ns",
                lease.resource,
                lease.lease_id,
                lease.token,
                renew.complete_ns,
                earliest_end_before(renew.invoke_ns)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::build::*;

    const R: &str = "t/r";

    fn config() -> CheckConfig {
        CheckConfig {
            expiry_margin_percent: 0,
            expiry_slack_ms: 0,
            ..CheckConfig::default()
        }
    }

    #[test]
    fn handover_by_release_and_by_expiry_passes() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 1000, 0), granted("aa", 10))
            .op(1, 50, 60, release(R, "aa"), released(true))
            .op(2, 55, 70, acquire(R, "b", 1000, 0), granted("bb", 11))
            // b's holder never releases; c gets the lock after b's TTL.
            .op(3, 1100, 1110, acquire(R, "c", 1000, 0), granted("cc", 12))
            .build();
        let v = check(&h, &config());
        assert!(v.passed(), "{v}");
        assert_eq!(v.checked, 3);
    }

    #[test]
    fn a_grant_during_another_holders_window_fails() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 1000, 0), granted("aa", 10))
            // Granted 500 ms into a's 1 s lease, which a never released.
            .op(2, 490, 500, acquire(R, "b", 1000, 0), granted("bb", 11))
            .build();
        let v = check(&h, &config());
        assert!(!v.passed());
        assert!(v.problems[0].contains("lease bb"), "{v}");
    }

    #[test]
    fn a_grant_learned_after_its_stop_by_deadline_holds_nothing() {
        let late = Done::Ok(Reply::Acquired {
            lease_id: "aa".into(),
            token: 10,
            deduplicated: true,
        });
        let h = Builder::default()
            // Sent at 0 and granted then, but the reply came after the TTL.
            .op(1, 0, 1200, acquire(R, "a", 1000, 2000), late)
            .op(2, 1100, 1110, acquire(R, "b", 1000, 0), granted("bb", 11))
            .build();
        assert!(check(&h, &config()).passed());
    }

    #[test]
    fn a_renewal_extends_the_window() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 1000, 0), granted("aa", 10))
            .op(1, 600, 610, renew(R, "aa", 1000), Done::Ok(Reply::Renewed))
            // After a's first TTL but inside the renewed one.
            .op(2, 1200, 1210, acquire(R, "b", 1000, 0), granted("bb", 11))
            .build();
        assert!(!check(&h, &config()).passed());
    }

    #[test]
    fn a_lease_gone_before_its_ttl_is_a_lost_grant() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 1000, 0), granted("aa", 10))
            .op(1, 100, 110, release(R, "aa"), released(false))
            .build();
        let v = check(&h, &config());
        assert!(v.problems[0].contains("gone at release"), "{v}");
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 1000, 0), granted("aa", 10))
            .op(
                1,
                100,
                110,
                renew(R, "aa", 1000),
                Done::Fail(LEASE_NOT_HELD),
            )
            .build();
        let v = check(&h, &config());
        assert!(v.problems[0].contains("not held"), "{v}");
        // After the TTL the same answers are expected, not violations.
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 1000, 0), granted("aa", 10))
            .op(
                1,
                1500,
                1510,
                renew(R, "aa", 1000),
                Done::Fail(LEASE_NOT_HELD),
            )
            .op(1, 1600, 1610, release(R, "aa"), released(false))
            .build();
        assert!(check(&h, &config()).passed());
    }

    #[test]
    fn the_clock_allowance_shortens_the_window() {
        // b is granted 15 ms before a's TTL ran out: a violation with no
        // allowance, accepted with a 2% allowance (20 ms of 1 s).
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 1000, 0), granted("aa", 10))
            .op(2, 980, 985, acquire(R, "b", 1000, 0), granted("bb", 11))
            .build();
        assert!(!check(&h, &config()).passed());
        let lenient = CheckConfig {
            expiry_margin_percent: 2,
            ..config()
        };
        assert!(check(&h, &lenient).passed());
    }
}
