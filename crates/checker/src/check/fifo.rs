//! Waiters are granted in FIFO order.
//!
//! A client cannot see when its waiting acquire joined the queue, so the
//! checker only uses orders it can prove. A `Get` G that reports a queue of
//! `q` waiters pins the queue down when exactly `q` waiting acquires could
//! be in it — invoked before G completed, and not completed before G was
//! invoked (unknown outcomes count as still waiting). Then every one of them
//! was queued before G completed. Any acquire invoked after that must not
//! be granted before any of them: its token must be above the token of each
//! of them that was granted (the service grants the head waiter in the same
//! step that frees the lock, so even a non-waiting acquire cannot barge in).
//!
//! "Invoked" means the first send of the acquire's request id: a re-sent
//! request returns its original grant, which may be older than the get.
//!
//! The harness's FIFO workload makes this bite: waiters join one at a time,
//! each after a `Get` showed the previous one queued.

use super::{first_sends, Verdict};
use crate::history::{Call, History, Operation, Reply};

pub fn check(history: &History) -> Verdict {
    let mut verdict = Verdict::new("fifo");
    let sends = first_sends(history);
    let sent_ns = |op: &Operation| match &op.call {
        Call::Acquire {
            resource,
            request_id,
            ..
        } => sends[&(resource.as_str(), request_id.as_str())],
        _ => op.invoke_ns,
    };
    for (resource, ops) in history.by_resource() {
        let waiting: Vec<&Operation> = ops
            .iter()
            .copied()
            .filter(|op| matches!(op.call, Call::Acquire { wait_ms, .. } if wait_ms > 0))
            .collect();
        for get in &ops {
            let Some(Reply::Got { queue_len, .. }) = get.reply() else {
                continue;
            };
            if *queue_len == 0 {
                continue;
            }
            let queued: Vec<&Operation> = waiting
                .iter()
                .copied()
                .filter(|w| {
                    w.invoke_ns < get.complete_ns
                        && (w.is_unknown() || w.complete_ns > get.invoke_ns)
                })
                .collect();
            if queued.len() != *queue_len as usize {
                continue;
            }
            verdict.checked += 1;
            for later in &ops {
                let Some((_, later_token)) = later.grant() else {
                    continue;
                };
                if sent_ns(later) <= get.complete_ns {
                    continue;
                }
                for earlier in &queued {
                    if let Some((lease, token)) = earlier.grant() {
                        if token > later_token {
                            verdict.fail(format!(
                                "{resource}: acquire sent at {} ns (token {later_token}) was granted before lease {lease} (token {token}), queued before {} ns",
                                sent_ns(later), get.complete_ns
                            ));
                        }
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

    const R: &str = "t/hot";

    /// A holds; W1 queues (a get sees 1 waiter); W2 queues (a get sees 2);
    /// A releases; the waiters get tokens `w1` and `w2`.
    fn history(w1: i64, w2: i64) -> crate::history::History {
        Builder::default()
            .op(1, 0, 10, acquire(R, "a", 5000, 0), granted("aa", 10))
            .op(2, 20, 400, acquire(R, "w1", 5000, 2000), granted("w1", w1))
            .op(9, 30, 40, get(R), got(true, 10, 10, 1))
            .op(3, 50, 400, acquire(R, "w2", 5000, 2000), granted("w2", w2))
            .op(9, 60, 70, get(R), got(true, 10, 10, 2))
            .op(1, 300, 310, release(R, "aa"), released(true))
            .build()
    }

    #[test]
    fn waiters_granted_in_queue_order_pass() {
        let v = check(&history(11, 12));
        assert!(v.passed(), "{v}");
        assert_eq!(v.checked, 2);
    }

    #[test]
    fn a_later_waiter_granted_first_fails() {
        let v = check(&history(12, 11));
        assert!(!v.passed());
        assert!(v.problems[0].contains("token 11"), "{v}");
    }

    #[test]
    fn a_barging_acquire_fails() {
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 5000, 0), granted("aa", 10))
            .op(2, 20, 400, acquire(R, "w1", 5000, 2000), granted("w1", 12))
            .op(9, 30, 40, get(R), got(true, 10, 10, 1))
            .op(1, 300, 310, release(R, "aa"), released(true))
            .op(4, 311, 320, acquire(R, "b", 5000, 0), granted("bb", 11))
            .build();
        assert!(!check(&h).passed());
    }

    #[test]
    fn a_resent_old_request_is_not_a_later_grant() {
        // The holder's request "a" is re-sent after the get and returns its
        // original, older grant: no waiter was overtaken.
        let again = Done::Ok(Reply::Acquired {
            lease_id: "aa".into(),
            token: 10,
            deduplicated: true,
            granted_ttl_ms: None,
        });
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 5000, 0), granted("aa", 10))
            .op(2, 20, 400, acquire(R, "w1", 5000, 2000), granted("w1", 11))
            .op(9, 30, 40, get(R), got(true, 10, 10, 1))
            .op(1, 50, 60, acquire(R, "a", 5000, 0), again)
            .op(1, 300, 310, release(R, "aa"), released(true))
            .build();
        let v = check(&h);
        assert!(v.passed(), "{v}");
    }

    #[test]
    fn an_ambiguous_queue_proves_nothing() {
        // Two waiters could be queued but the get saw one: either may be it.
        let h = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 5000, 0), granted("aa", 10))
            .op(2, 20, 400, acquire(R, "w1", 5000, 2000), granted("w1", 12))
            .op(3, 21, 400, acquire(R, "w2", 5000, 2000), granted("w2", 11))
            .op(9, 30, 40, get(R), got(true, 10, 10, 1))
            .build();
        let v = check(&h);
        assert!(v.passed(), "{v}");
        assert_eq!(v.checked, 0);
    }
}
