//! Lock safety on the lock side: validity windows never overlap (beyond
//! what the modes allow: shared holders beside each other, up to N holders
//! of a semaphore of N, never an exclusive holder beside any other), and no
//! acknowledged grant is lost.
//!
//! A holder's **validity window** runs from when it learned of the grant
//! (the acquire's completion) to when it stopped relying on it: the first
//! release it sent, or its stop-by deadline, whichever is first. The
//! stop-by deadline is the one a client following the contract keeps: the
//! latest *send* plus granted TTL over the answers that gave the lease
//! time, minus the clock allowance ([`LeaseFacts::promises`]): the logical
//! acquire's first send plus the TTL asked for, every ok acquire answer's
//! send plus the TTL it answered, every ok renewal's send plus the TTL it
//! answered. Another grant of the resource can only be applied after the
//! old lease ended on the server, which is after that window closed; so two
//! windows of one resource overlapping means two holders at once.
//!
//! The TTLs are the answered ones, never the ones asked for: a server that
//! answers more time than the lease has (a renewal near the hold cap told
//! the full TTL, a re-sent acquire answered from the dedup table with the
//! full TTL again) stretches its holder's window past the lease's real
//! end, and the next grant overlaps it. A server answering less (as it
//! must near the hold cap) shortens the window, so a correct handover at
//! the cap is not mistaken for an overlap. Histories without answered TTLs
//! fall back to the TTL asked for, for renewals; the acquire's own rule
//! needs none.
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
use crate::history::{History, Outcome, Reply};

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
        // The windows still open at the current start, in start order.
        let mut open: Vec<&LeaseFacts> = Vec::new();
        for lease in leases {
            if lease.window_end_ns <= lease.window_start_ns() {
                continue;
            }
            open.retain(|o| o.window_end_ns > lease.window_start_ns());
            if let Some(problem) = overlap_problem(lease, &open) {
                verdict.fail(format!("{resource}: {problem}"));
            }
            open.push(lease);
        }
    }
    for lease in &leases {
        check_not_lost(lease, config, &mut verdict);
    }
    verdict
}

/// What is wrong with `lease`'s window opening while the `open` ones are
/// still valid, if anything: an exclusive holder beside any other, holders
/// of different kinds (a lock's and a semaphore's, or two permit counts)
/// at once, or more holders than a semaphore's permits.
fn overlap_problem(lease: &LeaseFacts, open: &[&LeaseFacts]) -> Option<String> {
    let clash = |other: &LeaseFacts| {
        format!(
            "lease {} (token {}, {:?}) held from {} ns while lease {} (token {}, {:?}) was valid until {} ns",
            lease.lease_id,
            lease.token,
            lease.mode,
            lease.window_start_ns(),
            other.lease_id,
            other.token,
            other.mode,
            other.window_end_ns
        )
    };
    let first = open.first()?;
    if lease.mode.is_exclusive() {
        return Some(clash(first));
    }
    if let Some(other) = open.iter().find(|o| o.mode.is_exclusive()) {
        return Some(clash(other));
    }
    if let Some(other) = open.iter().find(|o| o.mode != lease.mode) {
        return Some(format!("kinds mixed: {}", clash(other)));
    }
    let holders = open.len() + 1;
    if holders > lease.mode.max_holders() {
        return Some(format!(
            "{holders} holders of a {:?} at once: {}",
            lease.mode,
            clash(first)
        ));
    }
    None
}

fn check_not_lost(lease: &LeaseFacts, config: &CheckConfig, verdict: &mut Verdict) {
    // The earliest end as known when `sent_ns` was sent: later renewals
    // cannot explain an earlier answer.
    let earliest_end_before = |sent_ns: u64| lease.earliest_end_before(config, sent_ns);
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
    use crate::history::Mode;

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
    fn shared_holders_overlap_but_a_writer_beside_them_fails() {
        let shared = |req| acquire_in(R, req, 1000, 0, Mode::Shared);
        let h = Builder::default()
            .op(1, 0, 10, shared("a"), granted("aa", 10))
            .op(2, 20, 30, shared("b"), granted("bb", 11))
            .build();
        assert!(check(&h, &config()).passed());
        let h = Builder::default()
            .op(1, 0, 10, shared("a"), granted("aa", 10))
            .op(2, 20, 30, acquire(R, "w", 1000, 0), granted("ww", 11))
            .build();
        let v = check(&h, &config());
        assert!(!v.passed());
        assert!(v.problems[0].contains("lease ww"), "{v}");
    }

    #[test]
    fn a_semaphore_of_two_fails_at_its_third_holder() {
        let permit = |req| acquire_in(R, req, 1000, 0, Mode::Semaphore(2));
        let two = Builder::default()
            .op(1, 0, 10, permit("a"), granted("aa", 10))
            .op(2, 20, 30, permit("b"), granted("bb", 11))
            .op(1, 40, 50, release(R, "aa"), released(true))
            .op(3, 60, 70, permit("c"), granted("cc", 12))
            .build();
        assert!(check(&two, &config()).passed());
        let three = Builder::default()
            .op(1, 0, 10, permit("a"), granted("aa", 10))
            .op(2, 20, 30, permit("b"), granted("bb", 11))
            .op(3, 60, 70, permit("c"), granted("cc", 12))
            .build();
        let v = check(&three, &config());
        assert!(!v.passed());
        assert!(v.problems[0].contains("3 holders"), "{v}");
    }

    #[test]
    fn a_grant_learned_after_its_stop_by_deadline_holds_nothing() {
        let late = Done::Ok(Reply::Acquired {
            lease_id: "aa".into(),
            token: 10,
            deduplicated: true,
            granted_ttl_ms: None,
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
            .op(1, 600, 610, renew(R, "aa", 1000), renewed())
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

    /// A 30 s lease granted at about 0 under a 60 s hold cap, renewed at
    /// 20 s (answered 30 s) and 40 s, 20 s before the cap (answered
    /// `answered`); at the cap the service frees it and grants it to b,
    /// and a's next renewal is refused.
    fn renewed_up_to_the_hold_cap(answered: u64) -> History {
        Builder::default()
            .op(
                1,
                0,
                10,
                acquire(R, "a", 30_000, 0),
                granted_for("aa", 10, false, 30_000),
            )
            .op(
                1,
                20_000,
                20_010,
                renew(R, "aa", 30_000),
                renewed_for(30_000),
            )
            .op(
                1,
                40_000,
                40_010,
                renew(R, "aa", 30_000),
                renewed_for(answered),
            )
            .op(
                2,
                60_050,
                60_060,
                acquire(R, "b", 30_000, 0),
                granted_for("bb", 11, false, 30_000),
            )
            .op(
                1,
                60_100,
                60_110,
                renew(R, "aa", 30_000),
                Done::Fail(LEASE_NOT_HELD),
            )
            .build()
    }

    #[test]
    fn a_renewal_answered_more_than_the_hold_cap_leaves_fails() {
        // The old answer near the cap: the full TTL asked for. The holder
        // counts on it to 70 s; b holds from 60 s.
        let v = check(&renewed_up_to_the_hold_cap(30_000), &config());
        assert!(!v.passed());
        assert!(v.problems[0].contains("lease bb"), "{v}");
        // What was left before the cap (applied at 40 005 ms): the holder
        // stops by 59 995 ms, and the refusal after the cap is expected.
        let v = check(&renewed_up_to_the_hold_cap(19_995), &config());
        assert!(v.passed(), "{v}");
    }

    /// A 30 s lease granted at about 0; its reply "lost", the request id is
    /// re-sent at 10 s and answered from the dedup table with `answered`;
    /// the lease expires at about 30 s and b gets the lock.
    fn resent_after_10_s(answered: u64) -> History {
        Builder::default()
            .op(
                1,
                0,
                10,
                acquire(R, "a", 30_000, 0),
                granted_for("aa", 10, false, 30_000),
            )
            .op(
                1,
                10_000,
                10_010,
                acquire(R, "a", 30_000, 0),
                granted_for("aa", 10, true, answered),
            )
            .op(
                2,
                30_100,
                30_110,
                acquire(R, "b", 30_000, 0),
                granted_for("bb", 11, false, 30_000),
            )
            .build()
    }

    #[test]
    fn a_resent_acquire_answered_the_full_ttl_again_fails() {
        // The old dedup answer: the full TTL, counted by the holder from
        // the re-send, to 40 s.
        let v = check(&resent_after_10_s(30_000), &config());
        assert!(!v.passed());
        assert!(v.problems[0].contains("lease bb"), "{v}");
        // What was left of the grant (applied at 5 ms, re-sent one applied
        // at 10 005 ms): the holder stops by 30 000 ms.
        let v = check(&resent_after_10_s(20_000), &config());
        assert!(v.passed(), "{v}");
        // Nothing left (a leader change's allowance running): the grant's
        // own deadline stands.
        let v = check(&resent_after_10_s(0), &config());
        assert!(v.passed(), "{v}");
    }

    #[test]
    fn a_renewal_answering_more_than_asked_extends_the_window() {
        // a asks 10 s at 100 ms (unknown: applied at 105 ms, reply lost),
        // then 1 s at 900 ms, answered with the 9 195 ms the first renewal
        // still runs: the holder counts on it to 10 095 ms.
        let h = |renewed: Done| {
            Builder::default()
                .op(
                    1,
                    0,
                    10,
                    acquire(R, "a", 1_000, 0),
                    granted_for("aa", 10, false, 1_000),
                )
                .op(1, 100, 900, renew(R, "aa", 10_000), Done::Unknown)
                .op(1, 900, 910, renew(R, "aa", 1_000), renewed)
                .op(
                    2,
                    5_000,
                    5_010,
                    acquire(R, "b", 1_000, 0),
                    granted_for("bb", 11, false, 1_000),
                )
                .build()
        };
        let v = check(&h(renewed_for(9_195)), &config());
        assert!(v.problems[0].contains("lease bb"), "{v}");
        // Without the answered TTL only the 1 s asked for counts.
        assert!(check(&h(renewed()), &config()).passed());
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
