//! Small SVG charts drawn on the server, so the status page shows its
//! picture to curl, to a browser without JavaScript and to a slow one alike.
//! Pure string building; every chart carries `data-chart`, `data-points`
//! and `data-now` attributes a test (or a script) can read.

use std::fmt::Write;

use super::page::escape;

/// Drawing area of one chart, in SVG user units (scaled by CSS).
const WIDTH: f64 = 320.0;
const HEIGHT: f64 = 96.0;
/// Room left of the plot for the y-axis labels, and above/below it.
const LEFT: f64 = 34.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 14.0;

/// Line colours, in series order (chosen to stay apart for the common
/// colour-vision deficiencies).
pub const PALETTE: [&str; 6] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9",
];

/// One line of a chart: `None` values leave a gap (no data then).
pub struct Line<'a> {
    pub name: &'a str,
    pub points: Vec<(u64, Option<f64>)>,
}

/// A line chart of `lines` over time. The first line is the headline:
/// `data-points` counts its known values and `data-now` is its latest.
pub fn line_chart(id: &str, unit: &str, lines: &[Line<'_>]) -> String {
    let known = || lines.iter().flat_map(|l| l.points.iter());
    let t_min = known().map(|(t, _)| *t).min().unwrap_or(0);
    let t_max = known().map(|(t, _)| *t).max().unwrap_or(0);
    let v_max = nice_ceiling(
        known()
            .filter_map(|(_, v)| *v)
            .fold(0.0_f64, |a, b| a.max(b)),
    );
    let headline = lines.first();
    let points = headline.map_or(0, |l| l.points.iter().filter(|p| p.1.is_some()).count());
    let now = headline
        .and_then(|l| l.points.iter().rev().find_map(|p| p.1))
        .map(format_value)
        .unwrap_or_default();
    let x = |t: u64| {
        if t_max == t_min {
            WIDTH - 1.0
        } else {
            LEFT + (WIDTH - 1.0 - LEFT) * (t - t_min) as f64 / (t_max - t_min) as f64
        }
    };
    let y = |v: f64| TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - v / v_max);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" data-chart="{}" data-points="{points}" data-now="{now}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{}">"#,
        escape(id),
        escape(&format!("{id}, {unit}")),
    );
    axes(
        &mut svg,
        &format!("{} {unit}", format_value(v_max)),
        t_max - t_min,
    );
    for (i, line) in lines.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        for run in runs(&line.points) {
            if run.len() == 1 {
                let (t, v) = run[0];
                let _ = write!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="1.5" fill="{colour}"/>"#,
                    x(t),
                    y(v)
                );
                continue;
            }
            let coords: Vec<String> = run
                .iter()
                .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
                .collect();
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"><title>{}</title></polyline>"#,
                coords.join(" "),
                escape(line.name)
            );
        }
    }
    if points == 0 {
        let _ = write!(
            svg,
            r#"<text x="{:.0}" y="{:.0}" text-anchor="middle" class="nodata">collecting samples</text>"#,
            (LEFT + WIDTH) / 2.0,
            HEIGHT / 2.0
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A horizontal bar per `(label, value)`; `data-now` is the sum.
pub fn bar_chart(id: &str, bars: &[(String, u64)]) -> String {
    const BAR_HEIGHT: f64 = 14.0;
    const GAP: f64 = 4.0;
    let height = (bars.len().max(1) as f64) * (BAR_HEIGHT + GAP) + GAP;
    let max = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1) as f64;
    let total: u64 = bars.iter().map(|b| b.1).sum();
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" data-chart="{}" data-points="{}" data-now="{total}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{}">"#,
        escape(id),
        bars.len(),
        escape(id),
    );
    for (i, (label, value)) in bars.iter().enumerate() {
        let top = GAP + i as f64 * (BAR_HEIGHT + GAP);
        let width = (WIDTH - LEFT - 30.0) * (*value as f64) / max;
        let colour = PALETTE[i % PALETTE.len()];
        let _ = write!(
            svg,
            r#"<text x="{:.0}" y="{:.1}" text-anchor="end" class="axis">{}</text><rect x="{LEFT}" y="{top:.1}" width="{width:.1}" height="{BAR_HEIGHT}" fill="{colour}"/><text x="{:.1}" y="{:.1}" class="axis" data-bar="{}">{value}</text>"#,
            LEFT - 4.0,
            top + BAR_HEIGHT - 3.0,
            escape(label),
            LEFT + width + 4.0,
            top + BAR_HEIGHT - 3.0,
            escape(label),
        );
    }
    svg.push_str("</svg>");
    svg
}

fn axes(svg: &mut String, top_label: &str, span_ms: u64) {
    let bottom = HEIGHT - BOTTOM;
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#999"/><line x1="{LEFT}" y1="{bottom}" x2="{WIDTH}" y2="{bottom}" stroke="#999"/><text x="{:.0}" y="{:.0}" text-anchor="end" class="axis">{}</text><text x="{:.0}" y="{bottom}" text-anchor="end" class="axis">0</text><text x="{WIDTH}" y="{HEIGHT}" text-anchor="end" class="axis">{}</text>"##,
        LEFT - 3.0,
        TOP + 8.0,
        escape(top_label),
        LEFT - 3.0,
        span_label(span_ms),
    );
}

/// The stretches of known values, split at each gap.
fn runs(points: &[(u64, Option<f64>)]) -> Vec<Vec<(u64, f64)>> {
    let mut runs = Vec::new();
    let mut current = Vec::new();
    for (t, v) in points {
        match v {
            Some(v) => current.push((*t, *v)),
            None if !current.is_empty() => runs.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs
}

/// The smallest of 1, 2, 5 × 10ⁿ at or above `v` (1 for nothing to show),
/// so the axis label is a round number.
pub fn nice_ceiling(v: f64) -> f64 {
    if !v.is_finite() || v <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|c| *c >= v * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

/// A value as the page prints it: three significant figures at most,
/// thousands as `k`, millions as `M`.
pub fn format_value(v: f64) -> String {
    let (scaled, suffix) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let text = if scaled.abs() >= 100.0 || scaled.fract() == 0.0 {
        format!("{scaled:.0}")
    } else if scaled.abs() >= 10.0 {
        format!("{scaled:.1}")
    } else {
        format!("{scaled:.2}")
    };
    format!("{text}{suffix}")
}

/// "last 5 min" / "last 40 s" for the x axis.
fn span_label(span_ms: u64) -> String {
    let s = span_ms / 1000;
    if s >= 120 {
        format!("last {} min", s / 60)
    } else {
        format!("last {s} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_names_its_headline_count_and_latest_value() {
        let svg = line_chart(
            "requests",
            "req/s",
            &[
                Line {
                    name: "answered",
                    points: vec![(1_000, Some(4.0)), (2_000, None), (3_000, Some(12.5))],
                },
                Line {
                    name: "granted",
                    points: vec![(1_000, Some(1.0)), (3_000, Some(2.0))],
                },
            ],
        );
        assert!(svg.contains(r#"data-chart="requests""#), "{svg}");
        assert!(svg.contains(r#"data-points="2""#), "{svg}");
        assert!(svg.contains(r#"data-now="12.5""#), "{svg}");
        // The gap splits the headline into two single points; the second
        // line is one polyline.
        assert_eq!(svg.matches("<circle").count(), 2, "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 1, "{svg}");
        assert!(
            svg.contains("20 req/s"),
            "axis top is the round ceiling: {svg}"
        );
        assert!(!svg.contains("collecting samples"));
    }

    #[test]
    fn an_empty_chart_says_it_is_collecting() {
        let svg = line_chart(
            "latency",
            "ms",
            &[Line {
                name: "p99",
                points: vec![],
            }],
        );
        assert!(svg.contains(r#"data-points="0""#));
        assert!(svg.contains("collecting samples"));
        assert!(!svg.contains("NaN"), "{svg}");
    }

    #[test]
    fn labels_are_escaped() {
        let svg = bar_chart("leaders", &[("<b>".into(), 3), ("2".into(), 1)]);
        assert!(svg.contains("&lt;b&gt;"), "{svg}");
        assert!(!svg.contains("<b>"), "{svg}");
        assert!(svg.contains(r#"data-now="4""#));
    }

    #[test]
    fn ceilings_and_values_are_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(200.0), 200.0);
        assert_eq!(nice_ceiling(201.0), 500.0);
        assert_eq!(format_value(3.0), "3");
        assert_eq!(format_value(0.256), "0.26");
        assert_eq!(format_value(45.67), "45.7");
        assert_eq!(format_value(12_345.0), "12.3k");
        assert_eq!(format_value(2_500_000.0), "2.50M");
    }
}
