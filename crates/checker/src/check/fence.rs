//! Lock safety as the protected side sees it: the fenced resource.
//!
//! Every holder writes to a fenced resource with its token; the resource
//! numbers each accepted write (`seq`, its accept order). The brief's
//! decisive assertion is checked on that order: once a write with token 42
//! was accepted, no write with token 41 is ever accepted on that resource.
//! Also: a refusal names a highest token above the refused one, and a read
//! returns the last write acknowledged before it (acknowledged writes
//! survive).
//!
//! A write with unknown outcome (a timeout, or a writer killed with the
//! call in flight) may have been accepted: a read that returns it shows it
//! was, at the seq the read names, and from then on it is checked like any
//! accepted write (its token order), except that nobody was told of it, so
//! it never counts as acknowledged.

use std::collections::{BTreeMap, BTreeSet};

use super::Verdict;
use crate::history::{Call, History, Operation, Reply};

pub fn check(history: &History) -> Verdict {
    let mut verdict = Verdict::new("fence");
    // resource -> accepted writes by seq: (token, value, op)
    let mut accepted: BTreeMap<&str, BTreeMap<u64, (i64, &str, &Operation)>> = BTreeMap::new();
    let mut seqs = BTreeSet::new();
    // Writes that may have been accepted, by (resource, token, value).
    let mut maybe: BTreeMap<(&str, i64, &str), &Operation> = BTreeMap::new();
    for op in &history.ops {
        let Call::FenceWrite {
            resource,
            token,
            value,
        } = &op.call
        else {
            continue;
        };
        verdict.checked += 1;
        match op.reply() {
            Some(Reply::FenceAccepted { seq }) => {
                if !seqs.insert(*seq) {
                    verdict.fail(format!("{resource}: two writes accepted as seq {seq}"));
                }
                accepted
                    .entry(resource)
                    .or_default()
                    .insert(*seq, (*token, value, op));
            }
            Some(Reply::FenceRejected { highest }) if highest <= token => verdict.fail(format!(
                "{resource}: token {token} refused though the highest accepted was {highest}"
            )),
            None if op.is_unknown() => {
                maybe.entry((resource, *token, value)).or_insert(op);
            }
            _ => {}
        }
    }
    // Unknown writes that a read shows were accepted.
    for op in &history.ops {
        let (Call::FenceRead { resource }, Some(Reply::FenceValue { token, value, seq })) =
            (&op.call, op.reply())
        else {
            continue;
        };
        let Some(value) = value.as_deref() else {
            continue;
        };
        let Some((&(resource, token, value), &write)) =
            maybe.get_key_value(&(resource.as_str(), *token, value))
        else {
            continue;
        };
        let writes = accepted.entry(resource).or_default();
        if writes.contains_key(seq) || !seqs.insert(*seq) {
            continue; // an acknowledged write holds that seq: checked below
        }
        writes.insert(*seq, (token, value, write));
    }
    for (resource, writes) in &accepted {
        let mut highest: Option<(i64, u64)> = None;
        for (&seq, &(token, _, _)) in writes {
            if let Some((top, top_seq)) = highest {
                if token < top {
                    verdict.fail(format!(
                        "{resource}: write with token {token} accepted (seq {seq}) after token {top} was accepted (seq {top_seq})"
                    ));
                    continue;
                }
            }
            highest = Some((token, seq));
        }
    }
    for op in &history.ops {
        let (Call::FenceRead { resource }, Some(Reply::FenceValue { token, value, seq })) =
            (&op.call, op.reply())
        else {
            continue;
        };
        verdict.checked += 1;
        let writes = accepted.get(resource.as_str());
        let last_acked = writes.and_then(|w| {
            w.iter()
                .filter(|(_, (_, _, write))| {
                    !write.is_unknown() && write.complete_ns < op.invoke_ns
                })
                .map(|(seq, _)| *seq)
                .max()
        });
        if let Some(last) = last_acked {
            if *seq < last {
                verdict.fail(format!(
                    "{resource}: read at {} ns returned seq {seq}, but write seq {last} was acknowledged before it",
                    op.invoke_ns
                ));
                continue;
            }
        }
        if *seq == 0 {
            continue;
        }
        match writes.and_then(|w| w.get(seq)) {
            Some((t, v, _)) if t == token && Some(*v) == value.as_deref() => {}
            _ => verdict.fail(format!(
                "{resource}: read returned token {token} value {value:?} as seq {seq}, which no accepted write had"
            )),
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::build::*;

    const R: &str = "t/r";

    fn accepted(seq: u64) -> Done {
        Done::Ok(Reply::FenceAccepted { seq })
    }

    fn rejected(highest: i64) -> Done {
        Done::Ok(Reply::FenceRejected { highest })
    }

    fn value(token: i64, v: &str, seq: u64) -> Done {
        Done::Ok(Reply::FenceValue {
            token,
            value: Some(v.into()),
            seq,
        })
    }

    #[test]
    fn rising_and_equal_tokens_with_a_stale_writer_refused_pass() {
        let h = Builder::default()
            .op(1, 0, 1, write(R, 41, "a1"), accepted(1))
            .op(1, 2, 3, write(R, 41, "a2"), accepted(2))
            .op(2, 4, 5, write(R, 42, "b1"), accepted(3))
            .op(1, 6, 7, write(R, 41, "a3"), rejected(42))
            .op(3, 8, 9, read(R), value(42, "b1", 3))
            .build();
        let v = check(&h);
        assert!(v.passed(), "{v}");
        assert_eq!(v.checked, 5);
    }

    #[test]
    fn token_41_accepted_after_42_fails() {
        let h = Builder::default()
            .op(2, 0, 1, write(R, 42, "b"), accepted(1))
            .op(1, 2, 3, write(R, 41, "a"), accepted(2))
            .build();
        let v = check(&h);
        assert!(!v.passed());
        assert!(v.problems[0].contains("token 41 accepted"), "{v}");
    }

    #[test]
    fn the_accept_order_decides_not_real_time() {
        // Overlapping calls: 42 was invoked first but accepted second. Fine.
        let h = Builder::default()
            .op(2, 0, 10, write(R, 42, "b"), accepted(2))
            .op(1, 1, 5, write(R, 41, "a"), accepted(1))
            .build();
        assert!(check(&h).passed());
    }

    #[test]
    fn a_refusal_of_a_current_token_fails() {
        let h = Builder::default()
            .op(1, 0, 1, write(R, 42, "b"), accepted(1))
            .op(1, 2, 3, write(R, 42, "c"), rejected(42))
            .build();
        assert!(!check(&h).passed());
    }

    #[test]
    fn a_read_may_reveal_a_write_whose_outcome_was_unknown() {
        // The writer was killed with its write in flight; the fenced
        // resource had accepted it.
        let h = Builder::default()
            .op(1, 0, 1, write(R, 42, "b1"), accepted(1))
            .op(1, 2, 3, write(R, 42, "b2"), Done::Unknown)
            .op(2, 5, 6, read(R), value(42, "b2", 2))
            .build();
        let v = check(&h);
        assert!(v.passed(), "{v}");
        // Revealed, it is held to the token order like any accepted write.
        let h = Builder::default()
            .op(1, 0, 1, write(R, 42, "b1"), accepted(1))
            .op(2, 2, 3, write(R, 41, "a"), Done::Unknown)
            .op(3, 5, 6, read(R), value(41, "a", 2))
            .build();
        let v = check(&h);
        assert!(!v.passed());
        assert!(v.problems[0].contains("token 41 accepted"), "{v}");
        // But a value nobody tried to write is still a failure, and so is
        // an unknown write claiming an acknowledged write's seq.
        let h = Builder::default()
            .op(1, 0, 1, write(R, 42, "b1"), accepted(1))
            .op(1, 2, 3, write(R, 42, "b2"), Done::Unknown)
            .op(2, 5, 6, read(R), value(42, "b3", 2))
            .build();
        assert!(!check(&h).passed());
        let h = Builder::default()
            .op(1, 0, 1, write(R, 42, "b1"), accepted(1))
            .op(1, 2, 3, write(R, 42, "b2"), Done::Unknown)
            .op(2, 5, 6, read(R), value(42, "b2", 1))
            .build();
        assert!(!check(&h).passed());
    }

    #[test]
    fn a_read_missing_an_acknowledged_write_fails() {
        let h = Builder::default()
            .op(1, 0, 1, write(R, 42, "b"), accepted(1))
            .op(
                2,
                5,
                6,
                read(R),
                Done::Ok(Reply::FenceValue {
                    token: 0,
                    value: None,
                    seq: 0,
                }),
            )
            .build();
        assert!(!check(&h).passed());
        let h = Builder::default()
            .op(1, 0, 1, write(R, 42, "b"), accepted(1))
            .op(2, 5, 6, read(R), value(42, "not b", 1))
            .build();
        assert!(!check(&h).passed());
    }
}
