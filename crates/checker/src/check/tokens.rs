//! Fencing tokens: unique, and strictly increasing per resource over the
//! whole run.
//!
//! * Two different leases never carry the same token, on any resources
//!   (tokens embed the shard epoch, and epochs are never reused).
//! * Real-time order implies token order: if grant A completed before grant
//!   B of the same resource was invoked, A's token is lower.
//! * A `Get` that reports `last_token = L` (not 0): every grant of the
//!   resource completed before the get was invoked has a token ≤ L, and
//!   every grant invoked after the get completed has a token > L.

use std::collections::BTreeMap;

use super::{first_sends, Verdict};
use crate::history::{Call, History, Reply};

/// One lease as the token checks need it.
struct Grant<'h> {
    lease: &'h str,
    token: i64,
    /// The first send of its request id.
    sent_ns: u64,
    /// The first time a client learned of it.
    granted_ns: u64,
}

pub fn check(history: &History) -> Verdict {
    let mut verdict = Verdict::new("tokens");
    let sends = first_sends(history);
    let mut grants: BTreeMap<&str, BTreeMap<&str, Grant>> = BTreeMap::new();
    for op in &history.ops {
        let (Call::Acquire { request_id, .. }, Some((lease, token))) = (&op.call, op.grant())
        else {
            continue;
        };
        let resource = op.call.resource();
        let sent_ns = sends[&(resource, request_id.as_str())];
        let g = grants
            .entry(resource)
            .or_default()
            .entry(lease)
            .or_insert(Grant {
                lease,
                token,
                sent_ns,
                granted_ns: op.complete_ns,
            });
        if g.token != token {
            verdict.fail(format!(
                "{resource}: lease {lease} returned with tokens {} and {token}",
                g.token
            ));
        }
        g.granted_ns = g.granted_ns.min(op.complete_ns);
    }
    // token -> (resource, lease)
    let mut owners: BTreeMap<i64, (&str, &str)> = BTreeMap::new();
    for (resource, leases) in &grants {
        for g in leases.values() {
            verdict.checked += 1;
            if g.token <= 0 {
                verdict.fail(format!("{resource}: token {} is not positive", g.token));
            }
            if let Some((r, l)) = owners.insert(g.token, (resource, g.lease)) {
                verdict.fail(format!(
                    "token {} granted twice: lease {l} on {r} and lease {} on {resource}",
                    g.token, g.lease
                ));
            }
        }
    }

    for (resource, leases) in &grants {
        // A grant sent after another was granted must carry a larger token.
        let mut by_granted: Vec<&Grant> = leases.values().collect();
        by_granted.sort_by_key(|g| g.granted_ns);
        let mut by_sent: Vec<&Grant> = leases.values().collect();
        by_sent.sort_by_key(|g| g.sent_ns);
        let mut i = 0;
        let mut top: Option<&Grant> = None;
        for b in by_sent {
            while i < by_granted.len() && by_granted[i].granted_ns < b.sent_ns {
                if top.is_none_or(|t| by_granted[i].token > t.token) {
                    top = Some(by_granted[i]);
                }
                i += 1;
            }
            if let Some(a) = top {
                if b.token <= a.token {
                    verdict.fail(format!(
                        "{resource}: token {} (sent {} ns) not above token {} (granted {} ns)",
                        b.token, b.sent_ns, a.token, a.granted_ns
                    ));
                }
            }
        }
    }

    for op in &history.ops {
        let Some(Reply::Got { last_token, .. }) = op.reply() else {
            continue;
        };
        if *last_token == 0 {
            continue;
        }
        let resource = op.call.resource();
        for g in grants.get(resource).into_iter().flat_map(|l| l.values()) {
            if g.granted_ns < op.invoke_ns && g.token > *last_token {
                verdict.fail(format!(
                    "{resource}: get reported last token {last_token} after token {} was granted",
                    g.token
                ));
            }
            if g.sent_ns > op.complete_ns && g.token <= *last_token {
                verdict.fail(format!(
                    "{resource}: token {} granted after a get reported last token {last_token}",
                    g.token
                ));
            }
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::build::*;

    #[test]
    fn rising_tokens_and_consistent_gets_pass() {
        let h = Builder::default()
            .op(1, 0, 10, acquire("t/a", "1", 1000, 0), granted("a1", 5))
            .op(2, 20, 30, acquire("t/a", "2", 1000, 0), granted("a2", 9))
            .op(3, 40, 50, get("t/a"), got(true, 9, 9, 0))
            .op(1, 60, 70, acquire("t/b", "3", 1000, 0), granted("b1", 6))
            .op(4, 80, 90, acquire("t/a", "4", 1000, 0), granted("a3", 12))
            .build();
        let v = check(&h);
        assert!(v.passed(), "{v}");
        assert_eq!(v.checked, 4);
    }

    #[test]
    fn concurrent_grants_may_come_in_either_order() {
        let h = Builder::default()
            .op(1, 0, 50, acquire("t/a", "1", 1000, 0), granted("a1", 9))
            .op(2, 10, 20, acquire("t/a", "2", 1000, 0), granted("a2", 5))
            .build();
        assert!(check(&h).passed());
    }

    #[test]
    fn a_lower_token_after_a_completed_grant_fails() {
        let h = Builder::default()
            .op(1, 0, 10, acquire("t/a", "1", 1000, 0), granted("a1", 9))
            .op(2, 20, 30, acquire("t/a", "2", 1000, 0), granted("a2", 5))
            .build();
        let v = check(&h);
        assert!(v.problems[0].contains("token 5"), "{v}");
    }

    #[test]
    fn a_resent_request_returns_its_old_token_without_going_back() {
        let again = Done::Ok(Reply::Acquired {
            lease_id: "a1".into(),
            token: 5,
            deduplicated: true,
            granted_ttl_ms: None,
        });
        let h = Builder::default()
            .op(1, 0, 10, acquire("t/a", "1", 1000, 0), granted("a1", 5))
            .op(2, 20, 30, acquire("t/a", "2", 1000, 0), granted("a2", 9))
            .op(1, 40, 50, acquire("t/a", "1", 1000, 0), again)
            .build();
        let v = check(&h);
        assert!(v.passed(), "{v}");
    }

    #[test]
    fn a_token_shared_by_two_leases_fails_even_across_resources() {
        let h = Builder::default()
            .op(1, 0, 10, acquire("t/a", "1", 1000, 0), granted("a1", 9))
            .op(2, 20, 30, acquire("t/b", "2", 1000, 0), granted("b1", 9))
            .build();
        assert!(check(&h).problems[0].contains("granted twice"));
    }

    #[test]
    fn a_get_that_contradicts_the_grants_fails() {
        let h = Builder::default()
            .op(1, 0, 10, acquire("t/a", "1", 1000, 0), granted("a1", 9))
            .op(3, 40, 50, get("t/a"), got(false, 0, 7, 0))
            .build();
        assert!(!check(&h).passed());
        let h = Builder::default()
            .op(3, 0, 5, get("t/a"), got(false, 0, 9, 0))
            .op(1, 10, 20, acquire("t/a", "1", 1000, 0), granted("a1", 9))
            .build();
        assert!(!check(&h).passed());
    }
}
