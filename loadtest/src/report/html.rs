//! The self-contained HTML report: per run, the latency table and two
//! charts (latency over time, throughput), then the Markdown tables'
//! content as preformatted text.

use std::fmt::Write;

use super::svg::{line_chart, Marker, Series};
use super::Report;
use crate::outcome::Op;
use crate::profile::ProfileFindings;
use crate::suite::RunResult;

fn color(op: Op) -> &'static str {
    match op {
        Op::Acquire => "#1f77b4",
        Op::Renew => "#2ca02c",
        Op::Release => "#ff7f0e",
        Op::Handoff => "#9467bd",
        Op::Delivery => "#8c564b",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn charts(run: &RunResult) -> String {
    let markers: Vec<Marker> = match &run.findings {
        ProfileFindings::Seed(f) => f
            .events
            .iter()
            .map(|e| Marker {
                x: e.t_s,
                label: e.label.clone(),
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut latency = Vec::new();
    let mut throughput = Vec::new();
    for op in Op::ALL {
        let points: Vec<_> = run
            .summary
            .series
            .iter()
            .filter_map(|p| p.ops.get(&op).map(|o| (p.t_s as f64, o)))
            .collect();
        if points.is_empty() {
            continue;
        }
        latency.push(Series {
            label: format!("{} p99", op.name()),
            color: color(op),
            dashed: false,
            points: points
                .iter()
                .filter(|(_, o)| o.ok > 0)
                .map(|(t, o)| (*t, o.p99_ms))
                .collect(),
        });
        latency.push(Series {
            label: format!("{} p50", op.name()),
            color: color(op),
            dashed: true,
            points: points
                .iter()
                .filter(|(_, o)| o.ok > 0)
                .map(|(t, o)| (*t, o.p50_ms))
                .collect(),
        });
        // Hand-offs and deliveries are not requests: no throughput line.
        if op != Op::Handoff && op != Op::Delivery {
            throughput.push(Series {
                label: format!("{} ok/s", op.name()),
                color: color(op),
                dashed: false,
                points: points.iter().map(|(t, o)| (*t, o.ok as f64)).collect(),
            });
            if points.iter().any(|(_, o)| o.failed > 0) {
                throughput.push(Series {
                    label: format!("{} failed/s", op.name()),
                    color: color(op),
                    dashed: true,
                    points: points.iter().map(|(t, o)| (*t, o.failed as f64)).collect(),
                });
            }
        }
    }
    let title = format!("{} / {}", run.target.name(), run.profile.name());
    format!(
        "{}\n{}",
        line_chart(
            &format!("{title}: latency per second (p99 solid, p50 dashed)"),
            "seconds into the measured window",
            "ms",
            &latency,
            &markers
        ),
        line_chart(
            &format!("{title}: throughput"),
            "seconds into the measured window",
            "requests / s",
            &throughput,
            &markers
        )
    )
}

pub fn render(report: &Report) -> String {
    let mut out = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>fencelock-bench report</title>\n\
         <style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}\
         table{border-collapse:collapse;font-size:13px;margin:0.5em 0}\
         td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}\
         th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}\
         pre{background:#f8f8f8;padding:1em;overflow-x:auto;font-size:12px}</style></head><body>\n\
         <h1>fencelock-bench report</h1>\n",
    );
    let m = &report.machine;
    let _ = writeln!(
        out,
        "<p>{} CPUs ({}), {:.1} GiB memory, Linux {}{}.</p>",
        m.cpus,
        escape(&m.cpu_model),
        m.memory_gib,
        escape(&m.kernel),
        m.etcd_version
            .as_ref()
            .map(|v| format!(", etcd {}", escape(v)))
            .unwrap_or_default()
    );
    for run in &report.runs {
        let _ = writeln!(
            out,
            "<h2>{} / {}</h2>\n<table><tr><th>op</th><th>ok/s</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>max ms</th><th>failed</th></tr>",
            run.target.name(),
            run.profile.name()
        );
        for (op, s) in &run.summary.ops {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{:.0}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td></tr>",
                op.name(),
                s.ok_per_s,
                s.p50_ms,
                s.p95_ms,
                s.p99_ms,
                s.p999_ms,
                s.max_ms,
                s.failed()
            );
        }
        out.push_str("</table>\n");
        out.push_str(&charts(run));
        out.push('\n');
        for (outcome, samples) in &run.summary.error_samples {
            let _ = writeln!(
                out,
                "<p><b>{}</b> examples: {}</p>",
                outcome.name(),
                escape(&samples.join("; "))
            );
        }
    }
    let _ = writeln!(
        out,
        "<h2>All tables</h2><pre>{}</pre></body></html>",
        escape(&super::markdown::render(report))
    );
    out
}
