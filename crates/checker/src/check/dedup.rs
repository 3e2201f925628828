//! `requestId` is applied at most once.
//!
//! * Every ok acquire with one `(resource, requestId)` returns the same lease
//!   and token, however often it was retried or re-sent.
//! * One lease is granted to one `(resource, requestId)` only.
//! * An acquire re-sent with a `requestId` whose earlier acquire was granted
//!   (within the retention window, which a run never exceeds) gets that
//!   grant back: a refusal as if it were new (`LOCK_HELD`, a wait timeout,
//!   `REQUEST_ID_REUSED` with the same parameters) means it was applied
//!   again.

use std::collections::BTreeMap;

use super::Verdict;
use crate::history::{Call, History, Operation};

/// Refusals that only a request treated as new can get.
const SECOND_APPLY_REASONS: [&str; 3] = [
    "REASON_LOCK_HELD",
    "REASON_WAIT_TIMED_OUT",
    "REASON_REQUEST_ID_REUSED",
];

pub fn check(history: &History) -> Verdict {
    let mut verdict = Verdict::new("dedup");
    let mut by_request: BTreeMap<(&str, &str), Vec<&Operation>> = BTreeMap::new();
    for op in &history.ops {
        if let Call::Acquire {
            resource,
            request_id,
            ..
        } = &op.call
        {
            by_request
                .entry((resource.as_str(), request_id.as_str()))
                .or_default()
                .push(op);
        }
    }
    verdict.checked = by_request.len();
    let mut lease_owner: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for ((resource, request_id), ops) in &by_request {
        let mut first_grant: Option<(&Operation, &str, i64)> = None;
        for op in ops {
            if let Some((lease, token)) = op.grant() {
                match first_grant {
                    None => first_grant = Some((op, lease, token)),
                    Some((_, l, t)) if (l, t) != (lease, token) => verdict.fail(format!(
                        "{resource}: request {request_id} granted twice: lease {l} (token {t}) and lease {lease} (token {token})"
                    )),
                    Some(_) => {}
                }
                if let Some(other) = lease_owner.insert((resource, lease), request_id) {
                    if other != *request_id {
                        verdict.fail(format!(
                            "{resource}: lease {lease} returned for requests {other} and {request_id}"
                        ));
                    }
                }
            }
        }
        let Some((granted, lease, _)) = first_grant else {
            continue;
        };
        for op in ops {
            if op.invoke_ns > granted.complete_ns {
                if let Some(reason) = op.failure() {
                    if SECOND_APPLY_REASONS.contains(&reason) {
                        verdict.fail(format!(
                            "{resource}: request {request_id} re-sent after its grant of lease {lease} was refused with {reason}: applied again"
                        ));
                    }
                }
            }
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::build::*;
    use crate::history::Reply;

    const R: &str = "t/r";

    fn dedup(lease: &str, token: i64) -> Done {
        Done::Ok(Reply::Acquired {
            lease_id: lease.into(),
            token,
            deduplicated: true,
            granted_ttl_ms: None,
        })
    }

    #[test]
    fn a_resent_request_gets_its_original_grant() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "x", 1000, 0), Done::Unknown)
            .op(1, 20, 30, acquire(R, "x", 1000, 0), dedup("aa", 5))
            .op(2, 40, 50, acquire(R, "x", 1000, 0), dedup("aa", 5))
            .op(
                3,
                60,
                70,
                acquire(R, "y", 1000, 0),
                Done::Fail("REASON_LOCK_HELD"),
            )
            .build();
        let v = check(&h);
        assert!(v.passed(), "{v}");
        assert_eq!(v.checked, 2);
    }

    #[test]
    fn one_request_with_two_leases_fails() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "x", 1000, 0), granted("aa", 5))
            .op(2, 20, 30, acquire(R, "x", 1000, 0), granted("bb", 6))
            .build();
        assert!(check(&h).problems[0].contains("granted twice"));
    }

    #[test]
    fn one_lease_for_two_requests_fails() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "x", 1000, 0), granted("aa", 5))
            .op(2, 20, 30, acquire(R, "y", 1000, 0), dedup("aa", 5))
            .build();
        assert!(!check(&h).passed());
    }

    #[test]
    fn a_resent_request_refused_as_new_fails() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "x", 1000, 0), granted("aa", 5))
            .op(
                1,
                20,
                30,
                acquire(R, "x", 1000, 0),
                Done::Fail("REASON_LOCK_HELD"),
            )
            .build();
        assert!(check(&h).problems[0].contains("applied again"));
    }
}
