//! Watch streams against the committed history: what each watcher
//! received is in order, has nothing twice, and misses nothing.
//!
//! A watcher follows one resource and, when its stream ends, watches again
//! after the last revision it received; its events over the whole run form
//! one stream. Per stream:
//!
//! * **No duplicate, no reordering**: revisions strictly rise (a revision
//!   names one change of the resource, the same on every replica).
//! * **Grants in token order**: tokens of `granted` events strictly rise
//!   (tokens rise with the log, and across slot moves with the epoch).
//! * **No gap**: every grant a client was told of (an ok acquire of the
//!   resource) whose token lies between the first and the last token the
//!   stream saw granted was delivered — unless a `state` event marked with
//!   `gap` (the node no longer had the changes, and said so) came between
//!   the grants around it. A grant the stream did not cover (before it
//!   started, after it stopped) says nothing.
//! * **Ends of grants it saw**: a `released`/`expired`/`cancelled` event
//!   names a token the stream saw granted, or one a `state` showed
//!   holding, or one granted before the stream's first event (unknown to
//!   it, so not judged).

use std::collections::{BTreeMap, BTreeSet};

use super::Verdict;
use crate::history::{History, ProcessId, Watched};

pub fn check(history: &History) -> Verdict {
    let mut verdict = Verdict::new("watch");
    let mut granted: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    for op in &history.ops {
        if let Some((_, token)) = op.grant() {
            granted.entry(op.call.resource()).or_default().insert(token);
        }
    }
    let mut streams: BTreeMap<(ProcessId, &str), Vec<&Watched>> = BTreeMap::new();
    for w in &history.watched {
        streams
            .entry((w.process, w.event.resource.as_str()))
            .or_default()
            .push(w);
    }
    let none = BTreeSet::new();
    for ((process, resource), events) in streams {
        verdict.checked += 1;
        let told = granted.get(resource).unwrap_or(&none);
        check_stream(process, resource, &events, told, &mut verdict);
    }
    verdict
}

fn check_stream(
    process: ProcessId,
    resource: &str,
    events: &[&Watched],
    told: &BTreeSet<i64>,
    verdict: &mut Verdict,
) {
    let mut last: Option<(u64, u64, u32)> = None;
    // Grants seen since the last gap, in order; tokens known to hold.
    let mut segment: Vec<i64> = Vec::new();
    let mut known: BTreeSet<i64> = BTreeSet::new();
    let mut last_granted: Option<i64> = None;
    let first_granted = (events.iter())
        .find(|w| w.event.kind == "granted")
        .map(|w| w.event.token);
    for w in events {
        let e = &w.event;
        if let Some(previous) = last {
            if e.revision <= previous {
                verdict.fail(format!(
                    "{resource}: watcher {process} got revision {:?} after {:?} ({} at {} ns): repeated or out of order",
                    e.revision, previous, e.kind, w.time_ns
                ));
            }
        }
        last = Some(last.map_or(e.revision, |p| p.max(e.revision)));
        match e.kind.as_str() {
            "state" => {
                if e.gap {
                    check_segment(process, resource, &segment, told, verdict);
                    segment.clear();
                }
                if e.token != 0 {
                    known.insert(e.token);
                }
                // A shared lock or a semaphore: every holding the state
                // names may end later in the stream.
                known.extend(e.holders.iter().copied());
            }
            "granted" => {
                if last_granted.is_some_and(|t| e.token <= t) {
                    verdict.fail(format!(
                        "{resource}: watcher {process} got grant {} after grant {}",
                        e.token,
                        last_granted.unwrap_or_default()
                    ));
                }
                last_granted = Some(e.token);
                segment.push(e.token);
                known.insert(e.token);
            }
            "released" | "expired" | "cancelled" => {
                let before_stream = first_granted.is_none_or(|first| e.token < first);
                if !known.contains(&e.token) && !before_stream {
                    verdict.fail(format!(
                        "{resource}: watcher {process} got {} of token {} it never saw granted",
                        e.kind, e.token
                    ));
                }
            }
            _ => {}
        }
    }
    check_segment(process, resource, &segment, told, verdict);
}

/// Every grant clients were told of with a token between the segment's
/// first and last grant is in the segment.
fn check_segment(
    process: ProcessId,
    resource: &str,
    segment: &[i64],
    told: &BTreeSet<i64>,
    verdict: &mut Verdict,
) {
    // Min and max: a reordered stream is reported on its own.
    let (Some(first), Some(last)) = (segment.iter().min(), segment.iter().max()) else {
        return;
    };
    let seen: BTreeSet<i64> = segment.iter().copied().collect();
    for token in told.range(first..=last) {
        if !seen.contains(token) {
            verdict.fail(format!(
                "{resource}: watcher {process} missed grant {token} (it saw {first} and later {last})"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::build::*;
    use crate::history::{Event, History, WatchSeen};

    const R: &str = "t/r";
    const WATCHER: ProcessId = 90;

    fn seen(time_ns: u64, index: u64, kind: &str, token: i64) -> Event {
        Event::Watched {
            process: WATCHER,
            time_ns,
            event: WatchSeen {
                resource: R.into(),
                revision: (1, index, 0),
                kind: kind.into(),
                token,
                holders: Vec::new(),
                gap: false,
            },
        }
    }

    /// Grants of tokens 10, 11, 12 told to clients, then the watcher's
    /// `events`.
    fn history(events: Vec<Event>) -> History {
        let mut b = Builder::default()
            .op(1, 0, 10, acquire(R, "a", 1000, 0), granted("aa", 10))
            .op(1, 20, 30, release(R, "aa"), released(true))
            .op(2, 40, 50, acquire(R, "b", 1000, 0), granted("bb", 11))
            .op(2, 60, 70, release(R, "bb"), released(true))
            .op(3, 80, 90, acquire(R, "c", 1000, 0), granted("cc", 12));
        for e in events {
            b = b.event(e);
        }
        b.build()
    }

    #[test]
    fn a_complete_stream_in_order_passes() {
        let h = history(vec![
            seen(1, 1, "state", 0),
            seen(11, 2, "granted", 10),
            seen(31, 3, "released", 10),
            seen(51, 4, "granted", 11),
            seen(71, 5, "released", 11),
            seen(91, 6, "granted", 12),
        ]);
        let v = check(&h);
        assert!(v.passed(), "{v}");
        assert_eq!(v.checked, 1);
    }

    #[test]
    fn a_missed_grant_fails() {
        let h = history(vec![
            seen(11, 2, "granted", 10),
            seen(31, 3, "released", 10),
            seen(91, 6, "granted", 12),
        ]);
        let v = check(&h);
        assert!(!v.passed());
        assert!(v.problems[0].contains("missed grant 11"), "{v}");
    }

    #[test]
    fn a_gap_the_node_reported_is_not_a_miss() {
        let mut gap = seen(60, 5, "state", 0);
        if let Event::Watched { event, .. } = &mut gap {
            event.gap = true;
        }
        let h = history(vec![
            seen(11, 2, "granted", 10),
            seen(31, 3, "released", 10),
            gap,
            seen(91, 6, "granted", 12),
        ]);
        assert!(check(&h).passed());
    }

    #[test]
    fn a_repeated_or_reordered_event_fails() {
        let repeated = history(vec![
            seen(11, 2, "granted", 10),
            seen(31, 3, "released", 10),
            seen(32, 3, "released", 10),
        ]);
        assert!(check(&repeated).problems[0].contains("repeated or out of order"));
        let reordered = history(vec![seen(51, 4, "granted", 11), seen(52, 2, "granted", 10)]);
        assert!(!check(&reordered).passed());
    }

    #[test]
    fn an_end_of_a_grant_never_seen_fails() {
        let h = history(vec![
            seen(11, 2, "granted", 10),
            seen(71, 5, "released", 11),
        ]);
        assert!(!check(&h).passed());
    }

    /// A shared lock after a gap: the STATE names the oldest holding (10)
    /// and another granted meanwhile (12); the end of 12 is no surprise.
    /// Without the STATE's holders it would be an end never seen granted.
    #[test]
    fn an_end_of_a_holding_a_state_named_is_not_an_unseen_grant() {
        let gap_naming = |holders: Vec<i64>| {
            let mut gap = seen(95, 8, "state", 10);
            if let Event::Watched { event, .. } = &mut gap {
                event.gap = true;
                event.holders = holders;
            }
            gap
        };
        let stream = |holders| {
            history(vec![
                seen(11, 2, "granted", 10),
                gap_naming(holders),
                seen(96, 9, "released", 12),
            ])
        };
        assert!(check(&stream(vec![10, 12])).passed());
        assert!(check(&stream(Vec::new())).problems[0].contains("never saw granted"));
    }
}
