//! A fair race between systems: the order a comparison runs in, and the
//! quiet machine every run starts on.
//!
//! Running every fencelock profile and then every etcd one started etcd on
//! a machine still loaded by the runs before it (load 11.5 at etcd's start
//! against 3.7 at fencelock's in one `saturate` comparison). So:
//!
//! * [`schedule`]: per profile, the systems run back to back, in an order
//!   that rotates with the repeat; with two repeats (the default of
//!   `compare`) each system runs each profile once first and once second.
//! * [`settle`]: before every run, wait — at most a bounded time — until
//!   the CPU is idle and the load average is low, and record whether it
//!   was ([`SettleRecord`]).
//! * [`quiet_pairs`]: the pairs (one profile, one repeat, every system)
//!   whose runs all started on a quiet machine; a ratio between systems
//!   is claimed only from those.
//!
//! The decisions ([`schedule`], [`is_quiet`], [`busy_pct`],
//! [`quiet_pairs`]) are pure; only [`settle`] reads `/proc` and sleeps.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::driver::TargetKind;
use crate::profile::ProfileKind;
use crate::suite::RunResult;

/// Repeats of a comparison by default: two, so every system runs every
/// shared profile once from each position.
pub const DEFAULT_REPEATS: u32 = 2;
/// Most CPU busy (all cores, over one sample) for a quiet machine, percent.
pub const DEFAULT_MAX_BUSY_PCT: f64 = 10.0;
/// Highest 1-minute load average per CPU for a quiet machine. The average
/// decays with a one-minute time constant: after a run that left it at 11
/// on 2 cores, reaching 1.0 takes about two and a half minutes.
pub const DEFAULT_MAX_LOAD_PER_CPU: f64 = 0.5;
/// How long to wait for a quiet machine before running anyway (the record
/// then says it was not quiet).
pub const DEFAULT_SETTLE_TIMEOUT_S: u64 = 300;
/// One CPU sample.
const SAMPLE: Duration = Duration::from_secs(2);

/// One run of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    pub target: TargetKind,
    pub profile: ProfileKind,
    /// Which repeat (0-based).
    pub repeat: u32,
    /// Place among the systems running this profile in this repeat
    /// (0 = first).
    pub position: u32,
}

/// The order of a comparison: for each profile, for each repeat, the
/// systems that run it (etcd has no `watch` or `failover`), rotated by the
/// repeat so that the first one changes.
pub fn schedule(targets: &[TargetKind], profiles: &[ProfileKind], repeats: u32) -> Vec<Job> {
    let mut jobs = Vec::new();
    for &profile in profiles {
        let runs: Vec<TargetKind> = targets
            .iter()
            .copied()
            .filter(|t| *t == TargetKind::Fencelock || !profile.fencelock_only())
            .collect();
        if runs.is_empty() {
            continue;
        }
        for repeat in 0..repeats.max(1) {
            let shift = repeat as usize % runs.len();
            for (position, &target) in runs[shift..].iter().chain(&runs[..shift]).enumerate() {
                jobs.push(Job {
                    target,
                    profile,
                    repeat,
                    position: position as u32,
                });
            }
        }
    }
    jobs
}

/// What makes a machine quiet enough to start a run on.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SettleConfig {
    pub max_busy_pct: f64,
    pub max_load_per_cpu: f64,
    /// 0 = do not wait (and record what the machine was like).
    pub timeout_s: u64,
}

impl Default for SettleConfig {
    fn default() -> SettleConfig {
        SettleConfig {
            max_busy_pct: DEFAULT_MAX_BUSY_PCT,
            max_load_per_cpu: DEFAULT_MAX_LOAD_PER_CPU,
            timeout_s: DEFAULT_SETTLE_TIMEOUT_S,
        }
    }
}

/// The machine when a run started.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SettleRecord {
    /// How long the run waited for the machine to settle.
    pub waited_ms: u64,
    /// Whether it was quiet by the [`SettleConfig`] when the run started.
    pub quiet: bool,
    /// CPU busy over the last sample, percent of all cores.
    pub busy_pct: f64,
    /// The 1-minute load average.
    pub load_1m: f64,
}

/// Where a run stood in its comparison.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RunOrder {
    pub repeat: u32,
    pub position: u32,
    /// `None`: the comparison did not wait for a quiet machine.
    pub settle: Option<SettleRecord>,
}

/// Whether a machine with `cpus` cores, `busy_pct` busy and this load
/// average is quiet.
pub fn is_quiet(busy_pct: f64, load_1m: f64, cpus: usize, config: &SettleConfig) -> bool {
    busy_pct <= config.max_busy_pct && load_1m <= config.max_load_per_cpu * cpus.max(1) as f64
}

/// Busy and total jiffies of all cores: the `cpu` line of `/proc/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    pub busy: u64,
    pub total: u64,
}

/// Parses the first line of `/proc/stat` (`cpu user nice system idle
/// iowait irq softirq steal ...`); idle and iowait are not busy.
pub fn parse_cpu_times(proc_stat: &str) -> Option<CpuTimes> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if fields.len() < 4 {
        return None;
    }
    // Guest time is already counted in user time: leave it out of the sum.
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    Some(CpuTimes {
        busy: total.saturating_sub(idle),
        total,
    })
}

/// Percent of all cores busy between two samples (100 when nothing moved:
/// a sample that cannot tell is not a quiet one).
pub fn busy_pct(before: CpuTimes, after: CpuTimes) -> f64 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 100.0;
    }
    after.busy.saturating_sub(before.busy) as f64 * 100.0 / total as f64
}

fn cpu_times() -> Option<CpuTimes> {
    parse_cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Waits until the machine is quiet or `config.timeout_s` passed; samples
/// the CPU every two seconds.
pub async fn settle(config: &SettleConfig) -> SettleRecord {
    let started = Instant::now();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    loop {
        let before = cpu_times();
        tokio::time::sleep(SAMPLE).await;
        let busy = match (before, cpu_times()) {
            (Some(b), Some(a)) => busy_pct(b, a),
            _ => 100.0,
        };
        let load = crate::suite::load_avg_1m();
        let quiet = is_quiet(busy, load, cpus, config);
        let waited = started.elapsed();
        if quiet || waited >= Duration::from_secs(config.timeout_s) {
            return SettleRecord {
                waited_ms: waited.as_millis() as u64,
                quiet,
                busy_pct: busy,
                load_1m: load,
            };
        }
    }
}

/// One run as [`quiet_pairs`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub profile: ProfileKind,
    pub target: TargetKind,
    pub order: Option<RunOrder>,
}

impl From<&RunResult> for Placed {
    fn from(run: &RunResult) -> Placed {
        Placed {
            profile: run.profile,
            target: run.target,
            order: run.order,
        }
    }
}

/// Every repeat of a profile that more than one system ran and in which
/// every run started on a quiet machine, with the indexes of those runs in
/// `runs`: the pairs a ratio between systems may be drawn from. Runs
/// without an order (single runs) or without a settle record never count.
pub fn quiet_pairs(runs: &[Placed]) -> Vec<(ProfileKind, u32, Vec<usize>)> {
    let mut groups: Vec<(ProfileKind, u32, Vec<usize>)> = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let Some(order) = run.order else {
            continue;
        };
        match groups
            .iter_mut()
            .find(|(p, r, _)| *p == run.profile && *r == order.repeat)
        {
            Some((_, _, members)) => members.push(i),
            None => groups.push((run.profile, order.repeat, vec![i])),
        }
    }
    groups.retain(|(_, _, members)| {
        let mut targets: Vec<TargetKind> = members.iter().map(|&i| runs[i].target).collect();
        targets.sort_by_key(|t| t.name());
        targets.dedup();
        targets.len() > 1
            && members.iter().all(|&i| {
                runs[i]
                    .order
                    .and_then(|o| o.settle)
                    .is_some_and(|s| s.quiet)
            })
    });
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    use TargetKind::{Etcd, Fencelock};

    #[test]
    fn every_system_runs_every_shared_profile_once_first_and_once_second() {
        let jobs = schedule(
            &[Fencelock, Etcd],
            &[ProfileKind::Seed, ProfileKind::Watch],
            2,
        );
        let order: Vec<(TargetKind, ProfileKind, u32, u32)> = jobs
            .iter()
            .map(|j| (j.target, j.profile, j.repeat, j.position))
            .collect();
        assert_eq!(
            order,
            [
                (Fencelock, ProfileKind::Seed, 0, 0),
                (Etcd, ProfileKind::Seed, 0, 1),
                (Etcd, ProfileKind::Seed, 1, 0),
                (Fencelock, ProfileKind::Seed, 1, 1),
                // etcd has no watch: fencelock runs it alone, each repeat.
                (Fencelock, ProfileKind::Watch, 0, 0),
                (Fencelock, ProfileKind::Watch, 1, 0),
            ]
        );
        // One repeat is the old order, per profile.
        let once = schedule(&[Etcd, Fencelock], &[ProfileKind::Seed], 1);
        assert_eq!(once.len(), 2);
        assert_eq!((once[0].target, once[1].target), (Etcd, Fencelock));
        assert!(schedule(&[Etcd], &[ProfileKind::Failover], 2).is_empty());
    }

    #[test]
    fn a_machine_is_quiet_only_with_an_idle_cpu_and_a_low_load_average() {
        let config = SettleConfig::default();
        assert!(is_quiet(3.0, 0.4, 2, &config));
        assert!(!is_quiet(35.0, 0.4, 2, &config), "busy CPU");
        assert!(!is_quiet(3.0, 11.5, 2, &config), "load left by a run");
        assert!(is_quiet(3.0, 1.0, 2, &config), "0.5 per CPU on 2 CPUs");
        assert!(!is_quiet(3.0, 1.0, 1, &config));
    }

    #[test]
    fn cpu_busy_comes_from_the_cpu_line_of_proc_stat() {
        let before = parse_cpu_times(
            "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\nintr 1\n",
        )
        .unwrap();
        assert_eq!(
            before,
            CpuTimes {
                busy: 150,
                total: 1000
            }
        );
        let after = parse_cpu_times("cpu  130 0 60 960 50 0 0 0 0 0\n").unwrap();
        assert!((busy_pct(before, after) - 20.0).abs() < 1e-9);
        assert_eq!(busy_pct(after, after), 100.0, "no time passed: not quiet");
        assert_eq!(parse_cpu_times("intr 1\n"), None);
        assert_eq!(parse_cpu_times("cpu  x y\n"), None);
    }

    fn placed(
        profile: ProfileKind,
        target: TargetKind,
        repeat: u32,
        quiet: Option<bool>,
    ) -> Placed {
        Placed {
            profile,
            target,
            order: Some(RunOrder {
                repeat,
                position: 0,
                settle: quiet.map(|quiet| SettleRecord {
                    waited_ms: 0,
                    quiet,
                    busy_pct: 0.0,
                    load_1m: 0.0,
                }),
            }),
        }
    }

    #[test]
    fn a_ratio_is_drawn_only_from_repeats_where_every_system_started_quiet() {
        let seed = ProfileKind::Seed;
        let runs = [
            placed(seed, Fencelock, 0, Some(true)),
            placed(seed, Etcd, 0, Some(false)),
            placed(seed, Etcd, 1, Some(true)),
            placed(seed, Fencelock, 1, Some(true)),
            // Alone in its repeat: nothing to compare with.
            placed(ProfileKind::Watch, Fencelock, 0, Some(true)),
            // Not checked: never claimed.
            placed(ProfileKind::Saturate, Fencelock, 0, None),
            placed(ProfileKind::Saturate, Etcd, 0, Some(true)),
            // A single run, outside any comparison.
            Placed {
                profile: seed,
                target: Etcd,
                order: None,
            },
        ];
        assert_eq!(quiet_pairs(&runs), vec![(seed, 1, vec![2, 3])]);
    }
}
