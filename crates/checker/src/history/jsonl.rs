//! Histories as JSON Lines: one [`Event`] per line, in the order recorded.
//!
//! One line per event keeps a history readable with `grep` and `jq`, lets a
//! client process stream its events to the harness as it goes, and survives
//! a crash of the writer up to the last complete line.

use std::io::{BufRead, Write};

use super::Event;

/// Longest line accepted, in bytes: a bound on what one malformed or hostile
/// line can make the reader allocate. Real events are a few hundred bytes.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum JsonlError {
    #[error("line {line}: {source}")]
    Parse {
        line: usize,
        source: serde_json::Error,
    },
    #[error("line {line}: longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong { line: usize },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// One event as one line, without the newline.
pub fn to_jsonl(event: &Event) -> String {
    // Serialising these plain data types cannot fail.
    serde_json::to_string(event).expect("events serialise")
}

pub fn write_jsonl(mut out: impl Write, events: &[Event]) -> std::io::Result<()> {
    for event in events {
        writeln!(out, "{}", to_jsonl(event))?;
    }
    out.flush()
}

/// Reads every event; blank lines are skipped.
pub fn read_jsonl(input: impl BufRead) -> Result<Vec<Event>, JsonlError> {
    let mut events = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line?;
        if line.len() > MAX_LINE_BYTES {
            return Err(JsonlError::LineTooLong { line: i + 1 });
        }
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|source| JsonlError::Parse {
            line: i + 1,
            source,
        })?;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Call, Mode, Phase, Reply};

    #[test]
    fn every_event_kind_round_trips() {
        let events = vec![
            Event::Invoke {
                process: 3,
                time_ns: 100,
                call: Call::Acquire {
                    resource: "t/a".into(),
                    request_id: "c3-1".into(),
                    ttl_ms: 2000,
                    wait_ms: 0,
                    mode: Mode::Exclusive,
                },
            },
            Event::Invoke {
                process: 4,
                time_ns: 110,
                call: Call::Acquire {
                    resource: "t/pool".into(),
                    request_id: "c4-1".into(),
                    ttl_ms: 2000,
                    wait_ms: 0,
                    mode: Mode::Semaphore(3),
                },
            },
            Event::Ok {
                process: 3,
                time_ns: 200,
                reply: Reply::Acquired {
                    lease_id: "00ff".into(),
                    token: 1 << 40 | 7,
                    deduplicated: false,
                    granted_ttl_ms: Some(2000),
                },
            },
            Event::Invoke {
                process: 3,
                time_ns: 210,
                call: Call::Renew {
                    resource: "t/a".into(),
                    lease_id: "00ff".into(),
                    ttl_ms: 2000,
                },
            },
            Event::Ok {
                process: 3,
                time_ns: 220,
                reply: Reply::Renewed {
                    granted_ttl_ms: Some(1500),
                },
            },
            Event::Invoke {
                process: 3,
                time_ns: 300,
                call: Call::FenceWrite {
                    resource: "t/a".into(),
                    token: 5,
                    value: "v".into(),
                },
            },
            Event::Ok {
                process: 3,
                time_ns: 301,
                reply: Reply::FenceValue {
                    token: 5,
                    value: None,
                    seq: 0,
                },
            },
            Event::Fail {
                process: 4,
                time_ns: 302,
                error: "REASON_LOCK_HELD".into(),
            },
            Event::Unknown {
                process: 4,
                time_ns: 303,
                error: "deadline".into(),
            },
            Event::Nemesis {
                time_ns: 400,
                fault: "kill".into(),
                phase: Phase::Start,
                detail: "node 2".into(),
            },
        ];
        let mut buf = Vec::new();
        write_jsonl(&mut buf, &events).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(
            text.lines().next().unwrap().contains(r#""type":"invoke","#),
            "{text}"
        );
        assert!(text.contains(r#""f":"acquire""#), "{text}");
        // An exclusive acquire is written as before modes: no mode key.
        assert!(!text.lines().next().unwrap().contains("mode"), "{text}");
        assert!(text.contains(r#""mode":{"semaphore":3}"#), "{text}");
        assert_eq!(read_jsonl(&buf[..]).unwrap(), events);
    }

    #[test]
    fn answers_recorded_before_granted_ttls_were_kept_still_read() {
        let old = concat!(
            r#"{"type":"ok","process":3,"time_ns":200,"r":"acquired","lease_id":"00ff","token":7,"deduplicated":true}"#,
            "\n",
            r#"{"type":"ok","process":3,"time_ns":220,"r":"renewed"}"#,
            "\n",
        );
        let events = read_jsonl(old.as_bytes()).unwrap();
        assert_eq!(
            events,
            vec![
                Event::Ok {
                    process: 3,
                    time_ns: 200,
                    reply: Reply::Acquired {
                        lease_id: "00ff".into(),
                        token: 7,
                        deduplicated: true,
                        granted_ttl_ms: None,
                    },
                },
                Event::Ok {
                    process: 3,
                    time_ns: 220,
                    reply: Reply::Renewed {
                        granted_ttl_ms: None,
                    },
                },
            ]
        );
        // And an unknown TTL is written as before: left out.
        let mut buf = Vec::new();
        write_jsonl(&mut buf, &events).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), old);
    }

    #[test]
    fn a_bad_line_is_reported_with_its_number() {
        let input = "\n{\"type\":\"nope\"}\n";
        match read_jsonl(input.as_bytes()) {
            Err(JsonlError::Parse { line, .. }) => assert_eq!(line, 2),
            other => panic!("{other:?}"),
        }
    }
}
