//! Whether a long run leaks: resource samples of the node processes
//! (`nemesis soak`) and the growth per hour each resource shows after the
//! warm-up (pure; the sampler is in `harness::soak`).
//!
//! Memory and open files belong to one process: a node that was killed and
//! restarted starts again from nothing, which would hide a leak behind the
//! drop or fake one in the climb back, and warms up again (caches,
//! memtables, tables filling to their retention). So each is fitted per
//! process, over that process's samples after *its own* warm-up (from its
//! first sample), by a straight line (least squares), and the slopes are
//! averaged, weighted by how long each process was watched. Disk belongs
//! to the data directory, which outlives its processes: fitted over every
//! sample after the run's warm-up.
//!
//! A resource is *flat* when its growth is at most its allowance per hour:
//! a share of its mean level or a small absolute amount, whichever is
//! larger (RocksDB's memtables, caches and compactions make every level
//! wander; a leak keeps climbing).

use std::collections::BTreeMap;
use std::fmt;

/// A process watched for less than this after its warm-up is not fitted
/// (a line through a few minutes of a sawtooth says nothing: the 1-hour
/// soak of 2026-12-04 read +147 MiB/h off six minutes of a level process).
pub const MIN_FIT_SPAN_S: f64 = 900.0;
/// Fewest samples a fit uses.
pub const MIN_FIT_SAMPLES: usize = 5;

/// Resident memory may grow by this share of its mean per hour…
pub const MEMORY_ALLOWED_PERCENT_PER_HOUR: f64 = 10.0;
/// …or by this much, whichever is larger.
pub const MEMORY_ALLOWED_BYTES_PER_HOUR: f64 = 16.0 * 1024.0 * 1024.0;
pub const FILES_ALLOWED_PERCENT_PER_HOUR: f64 = 10.0;
pub const FILES_ALLOWED_PER_HOUR: f64 = 8.0;
pub const DISK_ALLOWED_PERCENT_PER_HOUR: f64 = 20.0;
pub const DISK_ALLOWED_BYTES_PER_HOUR: f64 = 64.0 * 1024.0 * 1024.0;

/// One look at one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Seconds since the run started.
    pub at_s: f64,
    pub node: u64,
    /// The node's process at the time (a restart changes it).
    pub pid: u32,
    pub rss_bytes: u64,
    pub open_files: u64,
    /// Bytes under the node's data directory.
    pub disk_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Memory,
    OpenFiles,
    Disk,
}

impl Resource {
    pub const ALL: [Resource; 3] = [Resource::Memory, Resource::OpenFiles, Resource::Disk];

    fn of(self, s: &Sample) -> f64 {
        match self {
            Resource::Memory => s.rss_bytes as f64,
            Resource::OpenFiles => s.open_files as f64,
            Resource::Disk => s.disk_bytes as f64,
        }
    }

    /// Whether a restart starts the resource again from nothing.
    fn per_process(self) -> bool {
        !matches!(self, Resource::Disk)
    }

    fn allowed_per_hour(self, mean: f64) -> f64 {
        let (percent, floor) = match self {
            Resource::Memory => (
                MEMORY_ALLOWED_PERCENT_PER_HOUR,
                MEMORY_ALLOWED_BYTES_PER_HOUR,
            ),
            Resource::OpenFiles => (FILES_ALLOWED_PERCENT_PER_HOUR, FILES_ALLOWED_PER_HOUR),
            Resource::Disk => (DISK_ALLOWED_PERCENT_PER_HOUR, DISK_ALLOWED_BYTES_PER_HOUR),
        };
        (mean * percent / 100.0).max(floor)
    }

    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory (RSS)",
            Resource::OpenFiles => "open files",
            Resource::Disk => "data directory",
        }
    }

    /// `value` in the resource's reporting unit (MiB or a count).
    pub fn show(self, value: f64) -> String {
        match self {
            Resource::OpenFiles => format!("{value:.1}"),
            Resource::Memory | Resource::Disk => format!("{:.1} MiB", value / 1048576.0),
        }
    }
}

/// One resource of one node after the warm-up.
#[derive(Clone, Debug, PartialEq)]
pub struct Growth {
    pub node: u64,
    pub resource: Resource,
    /// The mean level after the warm-up.
    pub mean: f64,
    /// Growth per hour; `None` when no process was watched long enough.
    pub per_hour: Option<f64>,
    pub allowed_per_hour: f64,
    /// Seconds of samples the fit covers.
    pub fitted_s: f64,
}

impl Growth {
    /// Flat, or not judged (too short a run).
    pub fn flat(&self) -> bool {
        self.per_hour.is_none_or(|g| g <= self.allowed_per_hour)
    }
}

impl fmt::Display for Growth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.resource;
        write!(
            f,
            "node {} {:<14} mean {:>10}",
            self.node,
            r.name(),
            r.show(self.mean)
        )?;
        match self.per_hour {
            None => write!(f, "  not judged (no process watched long enough)"),
            Some(g) => write!(
                f,
                "  {:>+10}/h over {:.0} min (allowed {}/h): {}",
                r.show(g),
                self.fitted_s / 60.0,
                r.show(self.allowed_per_hour),
                if self.flat() { "flat" } else { "GROWS" }
            ),
        }
    }
}

/// Least-squares slope of `points` (x, y), per unit of x; `None` for
/// fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    Some(sxy / sxx)
}

/// The growth of every resource of every node in `samples`, counting only
/// samples taken at or after `warmup_s` (disk), or that long after their
/// process's first sample (memory, open files).
pub fn assess(samples: &[Sample], warmup_s: f64) -> Vec<Growth> {
    assess_fitting(samples, warmup_s, MIN_FIT_SPAN_S)
}

/// [`assess`], fitting processes watched for at least `min_fit_span_s`
/// (short test runs).
pub fn assess_fitting(samples: &[Sample], warmup_s: f64, min_fit_span_s: f64) -> Vec<Growth> {
    let mut by_node: BTreeMap<u64, Vec<&Sample>> = BTreeMap::new();
    let mut started: BTreeMap<(u64, u32), f64> = BTreeMap::new();
    for s in samples {
        by_node.entry(s.node).or_default().push(s);
        let first = started.entry((s.node, s.pid)).or_insert(s.at_s);
        *first = first.min(s.at_s);
    }
    let mut out = Vec::new();
    for (node, mut all) in by_node {
        all.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        for resource in Resource::ALL {
            let warm = |s: &&Sample| {
                let since = if resource.per_process() {
                    s.at_s - started[&(s.node, s.pid)]
                } else {
                    s.at_s
                };
                since >= warmup_s
            };
            let mine: Vec<&Sample> = all.iter().copied().filter(warm).collect();
            if mine.is_empty() {
                out.push(Growth {
                    node,
                    resource,
                    mean: 0.0,
                    per_hour: None,
                    allowed_per_hour: resource.allowed_per_hour(0.0),
                    fitted_s: 0.0,
                });
                continue;
            }
            let mean = mine.iter().map(|s| resource.of(s)).sum::<f64>() / mine.len() as f64;
            // Runs of one process (or the whole node, for disk).
            let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
            let mut last_pid = None;
            for s in &mine {
                if runs.is_empty() || (resource.per_process() && last_pid != Some(s.pid)) {
                    runs.push(Vec::new());
                }
                last_pid = Some(s.pid);
                runs.last_mut()
                    .expect("pushed above")
                    .push((s.at_s, resource.of(s)));
            }
            let mut weighted = 0.0;
            let mut fitted_s = 0.0;
            for run in &runs {
                let span = run.last().map_or(0.0, |l| l.0) - run.first().map_or(0.0, |f| f.0);
                if run.len() < MIN_FIT_SAMPLES || span < min_fit_span_s {
                    continue;
                }
                if let Some(per_s) = slope(run) {
                    weighted += per_s * span;
                    fitted_s += span;
                }
            }
            out.push(Growth {
                node,
                resource,
                mean,
                per_hour: (fitted_s > 0.0).then(|| weighted / fitted_s * 3600.0),
                allowed_per_hour: resource.allowed_per_hour(mean),
                fitted_s,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    /// Node 1 over `minutes`, one sample a minute, its memory given by
    /// `rss(minute)` and its process by `pid(minute)`.
    fn run(
        minutes: u32,
        rss: impl Fn(u32) -> f64,
        pid: impl Fn(u32) -> u32,
        disk: impl Fn(u32) -> f64,
    ) -> Vec<Sample> {
        (0..minutes)
            .map(|m| Sample {
                at_s: f64::from(m) * 60.0,
                node: 1,
                pid: pid(m),
                rss_bytes: rss(m) as u64,
                open_files: 40,
                disk_bytes: disk(m) as u64,
            })
            .collect()
    }

    fn growth(all: &[Growth], resource: Resource) -> &Growth {
        all.iter().find(|g| g.resource == resource).unwrap()
    }

    #[test]
    fn a_steady_climb_is_measured_per_hour_and_fails_the_allowance() {
        // 100 MiB, then 1 MiB a minute: 60 MiB an hour against an allowance
        // of max(10% of ~130 MiB, 16 MiB).
        let samples = run(60, |m| (100.0 + f64::from(m)) * MIB, |_| 7, |_| 10.0 * MIB);
        let all = assess(&samples, 0.0);
        let memory = growth(&all, Resource::Memory);
        let per_hour = memory.per_hour.unwrap();
        assert!((per_hour / MIB - 60.0).abs() < 0.01, "{per_hour}");
        assert!(!memory.flat(), "{memory}");
        assert!(growth(&all, Resource::Disk).flat());
        assert!(growth(&all, Resource::OpenFiles).flat());
    }

    #[test]
    fn a_sawtooth_that_returns_to_its_level_is_flat() {
        let samples = run(
            60,
            |m| (200.0 + f64::from(m % 10) * 3.0) * MIB,
            |_| 7,
            |m| (50.0 + f64::from(m % 7)) * MIB,
        );
        let all = assess(&samples, 0.0);
        assert!(all.iter().all(Growth::flat), "{all:?}");
    }

    #[test]
    fn a_restart_is_neither_a_leak_nor_a_hiding_place_for_one() {
        // Memory climbs back after a restart at minute 30, then stays: flat.
        let climb_back = run(
            60,
            |m| {
                if m < 30 {
                    200.0 * MIB
                } else {
                    (200.0 - 30.0 + f64::from(m.min(31))) * MIB
                }
            },
            |m| if m < 30 { 7 } else { 8 },
            |_| 10.0 * MIB,
        );
        assert!(growth(&assess(&climb_back, 0.0), Resource::Memory).flat());
        // A leak in both processes, each dropping back at its start: caught,
        // though the first and last samples are level.
        let leak = run(
            60,
            |m| (100.0 + f64::from(m % 30) * 2.0) * MIB,
            |m| if m < 30 { 7 } else { 8 },
            |_| 10.0 * MIB,
        );
        let memory = growth(&assess(&leak, 0.0), Resource::Memory).clone();
        assert!(!memory.flat(), "{memory}");
        assert!((memory.per_hour.unwrap() / MIB - 120.0).abs() < 0.01);
    }

    #[test]
    fn the_warm_up_is_left_out_and_short_runs_are_not_judged() {
        // Filling caches for 10 minutes, then level.
        let samples = run(60, |m| f64::from(m.min(10)) * 20.0 * MIB, |_| 7, |_| MIB);
        assert!(!growth(&assess(&samples, 0.0), Resource::Memory).flat());
        assert!(growth(&assess(&samples, 600.0), Resource::Memory).flat());
        let short = run(2, |m| f64::from(m) * 100.0 * MIB, |_| 7, |_| MIB);
        let memory = growth(&assess(&short, 0.0), Resource::Memory).clone();
        assert_eq!(memory.per_hour, None);
        assert!(memory.flat(), "not judged is not a failure");
    }

    #[test]
    fn a_restarted_process_warms_up_again_and_its_own_warm_up_is_left_out() {
        // Two processes, each filling caches for 10 minutes from its start
        // (minute 0 and minute 40), then level: flat once each process's
        // own warm-up is left out; not if only the run's first ten minutes
        // are.
        let samples = run(
            100,
            |m| {
                let since = if m < 40 { m } else { m - 40 };
                (50.0 + f64::from(since.min(10)) * 5.0) * MIB
            },
            |m| if m < 40 { 7 } else { 8 },
            |_| MIB,
        );
        let memory = growth(&assess(&samples, 600.0), Resource::Memory).clone();
        assert!(memory.flat(), "{memory}");
        assert!((memory.per_hour.unwrap() / MIB).abs() < 0.01, "{memory}");
        // Fitted: minutes 10..=39 of the first process, 50..=99 of the
        // second (its first ten minutes are its warm-up).
        assert_eq!(memory.fitted_s, (29.0 + 49.0) * 60.0, "{memory}");
    }

    #[test]
    fn slope_of_a_line_and_of_too_few_points() {
        assert_eq!(slope(&[(0.0, 1.0), (2.0, 5.0), (4.0, 9.0)]), Some(2.0));
        assert_eq!(slope(&[(1.0, 1.0)]), None);
        assert_eq!(slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }
}
