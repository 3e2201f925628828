//! The outputs of a benchmark: `results.json` (everything measured),
//! `report.html` (one self-contained page: tables and SVG charts of latency
//! over time and throughput, no scripts or external files) and `tables.md`
//! (the Markdown tables `docs/benchmarks.md` quotes).

mod html;
mod markdown;
mod svg;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::BenchError;
use crate::suite::{Machine, Profiles, RunResult};

/// Everything one invocation produced.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Seconds since the Unix epoch when the report was written.
    pub generated_unix_s: u64,
    pub machine: Machine,
    pub profiles: Profiles,
    pub runs: Vec<RunResult>,
}

impl Report {
    pub fn new(machine: Machine, profiles: Profiles, runs: Vec<RunResult>) -> Report {
        Report {
            generated_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            machine,
            profiles,
            runs,
        }
    }

    /// Writes `results.json`, `report.html` and `tables.md` into `dir`;
    /// returns their paths.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
        let outputs = [
            ("results.json", serde_json::to_string_pretty(self)?),
            ("report.html", html::render(self)),
            ("tables.md", markdown::render(self)),
        ];
        let mut paths = Vec::new();
        for (name, text) in outputs {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| BenchError::io(&path, e))?;
            paths.push(path);
        }
        Ok(paths)
    }
}
