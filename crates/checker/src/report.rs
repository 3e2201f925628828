//! The summary a run prints: faults injected by kind, operations by kind
//! and outcome, and the checker verdicts.

use std::collections::BTreeMap;
use std::fmt;

use crate::check::Verdict;
use crate::history::{History, Outcome, Phase, Reply};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// fault kind -> times started
    pub faults: BTreeMap<String, u64>,
    /// (operation, outcome) -> count; outcome is `ok`, `fail:REASON`,
    /// `unknown`, or for fenced writes `accepted` / `rejected`.
    pub ops: BTreeMap<(String, String), u64>,
    pub verdicts: Vec<Verdict>,
}

impl Report {
    pub fn new(history: &History, verdicts: Vec<Verdict>) -> Report {
        let mut faults = BTreeMap::new();
        for f in &history.faults {
            if f.phase == Phase::Start {
                *faults.entry(f.fault.clone()).or_insert(0) += 1;
            }
        }
        let mut ops = BTreeMap::new();
        for op in &history.ops {
            let outcome = match &op.outcome {
                Outcome::Ok(Reply::FenceAccepted { .. }) => "accepted".to_string(),
                Outcome::Ok(Reply::FenceRejected { .. }) => "rejected".to_string(),
                Outcome::Ok(_) => "ok".to_string(),
                Outcome::Fail(reason) => {
                    format!("fail:{}", reason.trim_start_matches("REASON_"))
                }
                Outcome::Unknown(_) => "unknown".to_string(),
            };
            *ops.entry((op.call.name().to_string(), outcome))
                .or_insert(0) += 1;
        }
        Report {
            faults,
            ops,
            verdicts,
        }
    }

    /// Every verdict passed.
    pub fn all_passed(&self) -> bool {
        self.verdicts.iter().all(Verdict::passed)
    }

    pub fn op_count(&self, op: &str, outcome: &str) -> u64 {
        self.ops
            .get(&(op.to_string(), outcome.to_string()))
            .copied()
            .unwrap_or(0)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "faults injected:")?;
        if self.faults.is_empty() {
            writeln!(f, "  (none)")?;
        }
        for (kind, n) in &self.faults {
            writeln!(f, "  {kind:<22} {n}")?;
        }
        writeln!(f, "operations:")?;
        for ((op, outcome), n) in &self.ops {
            writeln!(f, "  {op:<12} {outcome:<32} {n}")?;
        }
        writeln!(f, "checkers:")?;
        for v in &self.verdicts {
            writeln!(f, "  {v}")?;
        }
        Ok(())
    }
}
