//! The history being recorded: events from every client task, the
//! nemesis, and the lines client processes send, behind one lock.
//!
//! A client process records into [`Recorder::stdout`] instead: each event
//! becomes one JSONL line on its standard output, which the harness reads
//! and merges.
//!
//! Events are stamped when they are recorded, on the shared monotonic
//! clock. A call's invocation is recorded before it is sent and its
//! completion after the answer arrived, so the recorded interval always
//! contains the real one.

use std::io::Write as _;
use std::sync::{Arc, Mutex};

use crate::clock::monotonic_ns;
use crate::history::{to_jsonl, Call, Event, Phase, ProcessId, Reply, WatchSeen};

#[derive(Clone)]
pub struct Recorder {
    sink: Sink,
}

#[derive(Clone)]
enum Sink {
    Memory(Arc<Mutex<Vec<Event>>>),
    /// Each event as a JSONL line on stdout (client processes).
    Stdout,
    /// Nowhere: load that is measured, not checked (the soak's background).
    Discard,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// Records in memory.
    pub fn new() -> Recorder {
        Recorder {
            sink: Sink::Memory(Arc::default()),
        }
    }

    /// Writes every event as a JSONL line on stdout (client processes).
    pub fn stdout() -> Recorder {
        Recorder { sink: Sink::Stdout }
    }

    /// Keeps nothing: for load that is measured but not checked.
    pub fn discard() -> Recorder {
        Recorder {
            sink: Sink::Discard,
        }
    }

    fn push(&self, event: Event) {
        match &self.sink {
            Sink::Memory(events) => events.lock().unwrap_or_else(|e| e.into_inner()).push(event),
            Sink::Discard => {}
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                // The harness reads line by line; flush so a paused or
                // killed process leaves whole lines only.
                let _ = writeln!(out, "{}", to_jsonl(&event));
                let _ = out.flush();
            }
        }
    }

    pub fn invoke(&self, process: ProcessId, call: Call) {
        self.push(Event::Invoke {
            process,
            time_ns: monotonic_ns(),
            call,
        });
    }

    pub fn ok(&self, process: ProcessId, reply: Reply) {
        self.push(Event::Ok {
            process,
            time_ns: monotonic_ns(),
            reply,
        });
    }

    pub fn fail(&self, process: ProcessId, error: String) {
        self.push(Event::Fail {
            process,
            time_ns: monotonic_ns(),
            error,
        });
    }

    pub fn unknown(&self, process: ProcessId, error: String) {
        self.push(Event::Unknown {
            process,
            time_ns: monotonic_ns(),
            error,
        });
    }

    pub fn watched(&self, process: ProcessId, event: WatchSeen) {
        self.push(Event::Watched {
            process,
            time_ns: monotonic_ns(),
            event,
        });
    }

    pub fn nemesis(&self, fault: &str, phase: Phase, detail: String) {
        self.push(Event::Nemesis {
            time_ns: monotonic_ns(),
            fault: fault.to_owned(),
            phase,
            detail,
        });
    }

    /// An event a client process recorded itself (already stamped).
    pub fn external(&self, event: Event) {
        self.push(event);
    }

    /// Every event so far, in time order (stable, so one process's events
    /// keep their order when stamps tie).
    pub fn events(&self) -> Vec<Event> {
        let mut events = match &self.sink {
            Sink::Memory(events) => events.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            Sink::Stdout | Sink::Discard => Vec::new(),
        };
        events.sort_by_key(Event::time_ns);
        events
    }
}
