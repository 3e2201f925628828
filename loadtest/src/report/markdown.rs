//! Markdown tables of a [`Report`], for `docs/benchmarks.md`.

use std::fmt::Write;

use super::Report;
use crate::driver::TargetKind;
use crate::outcome::{Op, Outcome};
use crate::profile::failover::{FailoverFindings, FailoverRep, Spread};
use crate::profile::slow_disk::SlowDiskFindings;
use crate::profile::watch::WatchFindings;
use crate::profile::ProfileFindings;
use crate::suite::RunResult;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "n/a".to_owned(), |v| format!("{v:.digits$}"))
}

fn latency_table(out: &mut String, runs: &[&RunResult]) {
    out.push_str(
        "| target | profile | op | ok/s | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms | ok | conflict | timeout | unavailable | unknown |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for run in runs {
        for (op, s) in &run.summary.ops {
            let _ = write!(
                out,
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                run.target.name(),
                run.profile.name(),
                op.name(),
                s.ok_per_s,
                s.p50_ms,
                s.p95_ms,
                s.p99_ms,
                s.p999_ms,
                s.max_ms
            );
            for o in Outcome::ALL {
                let _ = write!(out, " {} |", s.outcomes.get(o.name()).copied().unwrap_or(0));
            }
            out.push('\n');
        }
    }
}

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let m = &report.machine;
    let _ = writeln!(
        out,
        "Machine: {} CPUs ({}), {:.1} GiB memory, Linux {}{}.\n",
        m.cpus,
        if m.cpu_model.is_empty() {
            "unknown model"
        } else {
            &m.cpu_model
        },
        m.memory_gib,
        m.kernel,
        m.etcd_version
            .as_ref()
            .map(|v| format!(", etcd {v}"))
            .unwrap_or_default()
    );
    let runs: Vec<&RunResult> = report.runs.iter().collect();

    out.push_str("### Latency and outcomes\n\nLatency of successful requests, from each request's scheduled start (open loop) or send (closed loop).\n\n");
    latency_table(&mut out, &runs);

    out.push_str("\n### Machine load during each run\n\nThe 1-minute load average at the start and end of each run (2 cores: above 2, other work was competing for the CPU). In a comparison: the repeat, the run's place among the systems running that profile (1 = first), and the machine it started on after waiting for it to settle.\n\n| target | profile | repeat | place | waited s | CPU busy at start | quiet | load at start | load at end |\n|---|---|---:|---:|---:|---:|---|---:|---:|\n");
    for run in &runs {
        let (repeat, place) = run.order.map_or(("-".to_owned(), "-".to_owned()), |o| {
            ((o.repeat + 1).to_string(), (o.position + 1).to_string())
        });
        let settle = run.order.and_then(|o| o.settle);
        let _ = writeln!(
            out,
            "| {} | {} | {repeat} | {place} | {} | {} | {} | {:.1} | {:.1} |",
            run.target.name(),
            run.profile.name(),
            settle.map_or("-".to_owned(), |s| format!(
                "{:.0}",
                s.waited_ms as f64 / 1000.0
            )),
            settle.map_or("-".to_owned(), |s| format!("{:.0}%", s.busy_pct)),
            quiet_cell(settle),
            run.load_avg_1m[0],
            run.load_avg_1m[1]
        );
    }
    fair_race(&mut out, &runs);

    out.push_str("\n### CPU and memory per node\n\nCPU in cores busy on average over the measured window; resident memory at its end and the peak since the node started.\n\n| target | profile | node | CPU (cores) | RSS MiB | peak RSS MiB |\n|---|---|---:|---:|---:|---:|\n");
    for run in &runs {
        for n in &run.nodes {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {:.0} | {:.0} |",
                run.target.name(),
                run.profile.name(),
                n.node,
                n.cpu_cores,
                n.rss_mib,
                n.peak_rss_mib
            );
        }
    }

    out.push_str("\n### Server CPU per lock operation\n\nCPU time of all three nodes over the measured window (from /proc) per successful acquire, renew or release; for `saturate` over every step together.\n\n| target | profile | lock ops | server CPU s | µs per lock op |\n|---|---|---:|---:|---:|\n");
    for run in &runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            run.target.name(),
            run.profile.name(),
            run.derived.lock_ops,
            opt(run.derived.server_cpu_s, 1),
            opt(run.derived.server_cpu_us_per_lock_op, 1)
        );
    }

    out.push_str("\n### Batching: lock operations per Raft entry and per fsync\n\n| target | profile | lock ops | Raft entries | log fsyncs (all nodes) | ops / entry | ops / fsync (per node) | entries / fsync | mean fsync ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for run in &runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            run.target.name(),
            run.profile.name(),
            run.derived.lock_ops,
            run.counters
                .raft_entries
                .map_or_else(|| "n/a".to_owned(), |v| v.to_string()),
            run.counters
                .log_fsyncs
                .map_or_else(|| "n/a".to_owned(), |v| v.to_string()),
            opt(run.derived.ops_per_entry, 1),
            opt(run.derived.ops_per_fsync, 1),
            opt(run.derived.entries_per_fsync, 2),
            opt(run.derived.fsync_mean_ms, 2)
        );
    }

    for run in &runs {
        match &run.findings {
            ProfileFindings::Contended(f) => {
                let handoff = run.summary.ops.get(&Op::Handoff);
                let release = run.summary.ops.get(&Op::Release);
                if !out.contains("### Contended") {
                    out.push_str("\n### Contended: hand-off and order\n\n| target | grants | hand-off p50 ms | hand-off p99 ms | release (one commit) p50 ms | release p99 ms | hand-off p99 / release p99 | FIFO inversions | token regressions |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
                }
                let ratio = handoff
                    .zip(release)
                    .map(|(h, r)| h.p99_ms / r.p99_ms.max(1e-3));
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    run.target.name(),
                    f.grants,
                    opt(handoff.map(|h| h.p50_ms), 2),
                    opt(handoff.map(|h| h.p99_ms), 2),
                    opt(release.map(|r| r.p50_ms), 2),
                    opt(release.map(|r| r.p99_ms), 2),
                    opt(ratio, 2),
                    f.fifo_inversions,
                    f.token_regressions
                );
            }
            ProfileFindings::Watch(f) => watch_tables(&mut out, run, f),
            ProfileFindings::Failover(f) => failover_table(&mut out, run, f),
            ProfileFindings::SlowDisk(f) => slow_disk_table(&mut out, run, f),
            ProfileFindings::Saturate(_) | ProfileFindings::Seed(_) => {}
        }
    }

    let saturations: Vec<&RunResult> = runs
        .iter()
        .copied()
        .filter(|r| matches!(r.findings, ProfileFindings::Saturate(_)))
        .collect();
    if !saturations.is_empty() {
        out.push_str("\n### Saturate: steps\n\n| target | offered ops/s | delivered ops/s | acquire p50 ms | acquire p99 ms | release p99 ms | failed | held | server CPU µs per lock op |\n|---|---:|---:|---:|---:|---:|---:|---|---:|\n");
        for run in &saturations {
            if let ProfileFindings::Saturate(f) = &run.findings {
                for s in &f.steps {
                    let _ = writeln!(
                        out,
                        "| {} | {:.0} | {:.0} | {:.2} | {} | {:.2} | {} | {} | {} |",
                        run.target.name(),
                        s.offered_per_s,
                        s.delivered_per_s,
                        s.acquire_p50_ms,
                        opt(Some(s.acquire_p99_ms), 2),
                        s.release_p99_ms,
                        s.failed,
                        if s.held { "yes" } else { "**no**" },
                        opt(s.server_cpu_us_per_lock_op, 1)
                    );
                }
            }
        }
        out.push_str(
            "\n| target | highest lock ops/s with acquire p99 within the bound |\n|---|---:|\n",
        );
        for run in &saturations {
            if let ProfileFindings::Saturate(f) = &run.findings {
                let _ = writeln!(out, "| {} | {:.0} |", run.target.name(), f.best_ops_per_s);
            }
        }
    }

    for run in &runs {
        if let ProfileFindings::Seed(f) = &run.findings {
            if f.events.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n### Capacity events ({})\n", run.target.name());
            for e in &f.events {
                let _ = writeln!(
                    out,
                    "- {:.1} s: {}{}",
                    e.t_s,
                    e.label,
                    e.error
                        .as_ref()
                        .map(|m| format!(" (failed: {m})"))
                        .unwrap_or_default()
                );
            }
        }
    }
    out
}

fn watch_tables(out: &mut String, run: &RunResult, f: &WatchFindings) {
    let _ = writeln!(
        out,
        "\n### Watch: the cost to lock throughput ({})\n\n{} watchers over {} busy resources, {} closed-loop lock clients per resource; the same lock load without, then with the watchers.\n\n| phase | lock ops/s | acquire p50 ms | acquire p99 ms | release p99 ms | failed |\n|---|---:|---:|---:|---:|---:|",
        run.target.name(),
        f.watchers,
        f.resources,
        f.lock_clients
    );
    for (label, p) in [
        ("without watchers", &f.without_watchers),
        ("with watchers", &f.with_watchers),
    ] {
        let _ = writeln!(
            out,
            "| {label} | {:.0} | {:.2} | {:.2} | {:.2} | {} |",
            p.lock_ops_per_s, p.acquire_p50_ms, p.acquire_p99_ms, p.release_p99_ms, p.failed
        );
    }
    let _ = writeln!(
        out,
        "| with / without | {:.2}× | | {:.2}× | | |",
        f.lock_ops_ratio, f.acquire_p99_ratio
    );
    let delivery = run.summary.ops.get(&Op::Delivery);
    let _ = writeln!(
        out,
        "\n### Watch: delivery ({})\n\nFrom the lock client's answer to each watcher's event (matched by resource, token and kind).\n\n| watchers streaming | ready after ms | events/s | changes | owed | delivered | early | missed | unmatched | cut (SERVER_BUSY) | resumed | gaps | p50 ms | p99 ms | p99.9 ms | max ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        run.target.name()
    );
    let _ = writeln!(
        out,
        "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        f.watchers_ready,
        f.ready_ms,
        f.events_per_s,
        f.changes,
        f.deliveries_expected,
        f.delivered,
        f.delivered_early,
        f.missed,
        f.unmatched,
        f.cut_server_busy,
        f.resumed,
        f.gaps,
        opt(delivery.map(|d| d.p50_ms), 2),
        opt(delivery.map(|d| d.p99_ms), 2),
        opt(delivery.map(|d| d.p999_ms), 2),
        opt(delivery.map(|d| d.max_ms), 2)
    );
}

fn slow_disk_table(out: &mut String, run: &RunResult, f: &SlowDiskFindings) {
    let led =
        |l: Option<(usize, usize)>| l.map_or_else(|| "n/a".to_owned(), |(a, b)| format!("{a}/{b}"));
    let _ = writeln!(
        out,
        "\n### Slow leader disk ({})\n\nEvery shard led by node {} (shards led at start / end: {} / {}); from the window's midpoint each of its syncs waits {} ms. The `slow-disk` row of the latency table is the slow half.\n\n| half | s | lock ops | failed | acquire p50 ms | acquire p99 ms | acquire p99.9 ms | release p99 ms | node {}'s mean sync ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        run.target.name(),
        f.slow_node,
        led(Some(f.led_at_start)),
        led(f.led_at_end),
        f.sync_delay_ms,
        f.slow_node,
    );
    for (name, p) in [("healthy", &f.healthy), ("slow", &f.slow)] {
        let _ = writeln!(
            out,
            "| {name} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            p.window_s,
            p.lock_ops,
            p.failed,
            opt(p.acquire_p50_ms, 2),
            opt(p.acquire_p99_ms, 2),
            opt(p.acquire_p999_ms, 2),
            opt(p.release_p99_ms, 2),
            opt(p.slow_node_sync_mean_ms, 1),
        );
    }
    let _ = writeln!(
        out,
        "\nacquire p99, slow / healthy: **{}** (target ≤ 2)",
        opt(f.acquire_p99_ratio, 2)
    );
}

fn failover_table(out: &mut String, run: &RunResult, f: &FailoverFindings) {
    let spread = |s: &Spread| format!("{} / {}", opt(s.p50_ms, 0), opt(s.max_ms, 0));
    let _ = writeln!(
        out,
        "\n### Failover: elections ({})\n\n{} elections × {} campaigners, lease TTL {} ms. Times in ms from the crash or kill, p50 / max over the repetitions.\n\n| case | reps | failed | `leader()` answers again | next leader's GRANTED observed | `leader()` names the next leader |\n|---|---:|---:|---:|---:|---:|",
        run.target.name(),
        f.elections,
        f.candidates,
        f.ttl_ms
    );
    let failed = |reps: &[FailoverRep]| reps.iter().filter(|r| r.error.is_some()).count();
    let _ = writeln!(
        out,
        "| (a) leader stops renewing (crash) | {} | {} | n/a | {} | {} |",
        f.crash.len(),
        failed(&f.crash),
        spread(&f.crash_observed),
        spread(&f.crash_leader_read)
    );
    let _ = writeln!(
        out,
        "| (b) shard leader node killed, leader resigns | {} | {} | {} | {} | {} |",
        f.kill.len(),
        failed(&f.kill),
        spread(&f.kill_served),
        spread(&f.kill_observed),
        spread(&f.kill_leader_read)
    );
    let _ = writeln!(
        out,
        "\nToken regressions seen by the observers: {}.",
        f.token_regressions
    );
}

/// Lock operations per second of a run: acquires, renews and releases.
fn lock_ops_per_s(run: &RunResult) -> f64 {
    run.derived.lock_ops as f64 / run.summary.window_s
}

/// Whether a run of a comparison started on a quiet machine.
fn quiet_cell(settle: Option<crate::fair::SettleRecord>) -> &'static str {
    settle.map_or("not checked", |s| if s.quiet { "yes" } else { "**no**" })
}

fn acquire_p99_ms(run: &RunResult) -> Option<f64> {
    run.summary.ops.get(&Op::Acquire).map(|s| s.p99_ms)
}

/// Each system's figures from each place in the order, and the ratios
/// between fencelock and etcd drawn only from repeats in which both
/// started on a quiet machine (`fair::quiet_pairs`).
fn fair_race(out: &mut String, runs: &[&RunResult]) {
    let ordered: Vec<&RunResult> = runs.iter().copied().filter(|r| r.order.is_some()).collect();
    if ordered.is_empty() {
        return;
    }
    out.push_str("\n### A fair race: each system from each place\n\nPer profile and repeat, the systems ran back to back; the first one alternates across repeats. A ratio is drawn only from a repeat whose runs all started on a quiet machine.\n\n| profile | repeat | target | place | quiet | lock ops/s | acquire p99 ms |\n|---|---:|---|---:|---|---:|---:|\n");
    for run in &ordered {
        let order = run.order.expect("filtered");
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.0} | {} |",
            run.profile.name(),
            order.repeat + 1,
            run.target.name(),
            order.position + 1,
            quiet_cell(order.settle),
            lock_ops_per_s(run),
            opt(acquire_p99_ms(run), 2)
        );
    }
    let placed: Vec<crate::fair::Placed> = ordered.iter().map(|r| (*r).into()).collect();
    let pairs = crate::fair::quiet_pairs(&placed);
    out.push_str("\n| profile | repeat | fencelock first | lock ops/s fencelock / etcd | acquire p99 etcd / fencelock |\n|---|---:|---|---:|---:|\n");
    let mut claimed = 0;
    for (profile, repeat, members) in &pairs {
        let of = |kind: TargetKind| {
            members
                .iter()
                .map(|&i| ordered[i])
                .find(|r| r.target == kind)
        };
        let (Some(f), Some(e)) = (of(TargetKind::Fencelock), of(TargetKind::Etcd)) else {
            continue;
        };
        claimed += 1;
        let first = f.order.is_some_and(|o| o.position == 0);
        let p99_ratio = match (acquire_p99_ms(e), acquire_p99_ms(f)) {
            (Some(e), Some(f)) if f > 0.0 => Some(e / f),
            _ => None,
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            profile.name(),
            repeat + 1,
            if first { "yes" } else { "no" },
            opt(Some(lock_ops_per_s(f) / lock_ops_per_s(e)), 2),
            opt(p99_ratio, 2)
        );
    }
    if claimed == 0 {
        out.push_str("| (none) | | | no repeat started on a quiet machine for both systems: no ratio is claimed | |\n");
    }
}
