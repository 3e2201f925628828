//! Line charts as inline SVG: no scripts, no fonts to load, readable in any
//! browser and in a file viewer.

use std::fmt::Write;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 240.0;
const MARGIN_LEFT: f64 = 60.0;
const MARGIN_RIGHT: f64 = 120.0;
const MARGIN_TOP: f64 = 28.0;
const MARGIN_BOTTOM: f64 = 32.0;
const Y_TICKS: usize = 4;

/// One line of a chart.
pub struct Series {
    pub label: String,
    pub color: &'static str,
    pub dashed: bool,
    /// (x, y) points, x ascending.
    pub points: Vec<(f64, f64)>,
}

/// A vertical marker (an event) at `x`.
pub struct Marker {
    pub x: f64,
    pub label: String,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten.
fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|&c| c >= value)
        .unwrap_or(10.0 * power)
}

/// A chart of `series` with `x_label` and `y_label`.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    markers: &[Marker],
) -> String {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let x_max = xs.fold(1.0f64, f64::max);
    let y_max = nice_ceiling(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(|y| y.is_finite())
            .fold(0.0f64, f64::max),
    );
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let sx = |x: f64| MARGIN_LEFT + x / x_max * plot_w;
    let sy = |y: f64| MARGIN_TOP + plot_h - (y.min(y_max) / y_max) * plot_h;

    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        svg,
        r#"<text x="{MARGIN_LEFT}" y="16" font-size="13" font-weight="bold">{}</text>"#,
        escape(title)
    );
    // Grid and y ticks.
    for i in 0..=Y_TICKS {
        let y = y_max * i as f64 / Y_TICKS as f64;
        let py = sy(y);
        let _ = write!(
            svg,
            r##"<line x1="{MARGIN_LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            MARGIN_LEFT + plot_w,
            MARGIN_LEFT - 4.0,
            py + 4.0,
            format_tick(y)
        );
    }
    // X ticks: about six.
    let x_step = nice_ceiling(x_max / 6.0);
    let mut x = 0.0;
    while x <= x_max + 1e-9 {
        let px = sx(x);
        let _ = write!(
            svg,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#999"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            MARGIN_TOP + plot_h,
            MARGIN_TOP + plot_h + 4.0,
            MARGIN_TOP + plot_h + 16.0,
            format_tick(x)
        );
        x += x_step;
    }
    let _ = write!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        MARGIN_LEFT + plot_w / 2.0,
        HEIGHT - 4.0,
        escape(x_label)
    );
    let _ = write!(
        svg,
        r#"<text x="12" y="{:.1}" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"#,
        MARGIN_TOP + plot_h / 2.0,
        MARGIN_TOP + plot_h / 2.0,
        escape(y_label)
    );
    for marker in markers {
        let px = sx(marker.x);
        let _ = write!(
            svg,
            r##"<line x1="{px:.1}" y1="{MARGIN_TOP}" x2="{px:.1}" y2="{:.1}" stroke="#c00" stroke-dasharray="3,3"/><text x="{:.1}" y="{:.1}" fill="#c00">{}</text>"##,
            MARGIN_TOP + plot_h,
            px + 3.0,
            MARGIN_TOP + 10.0,
            escape(&marker.label)
        );
    }
    for (i, s) in series.iter().enumerate() {
        if !s.points.is_empty() {
            let path: Vec<String> = s
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                .collect();
            let dash = if s.dashed {
                r#" stroke-dasharray="5,3""#
            } else {
                ""
            };
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.5"{dash} points="{}"/>"#,
                s.color,
                path.join(" ")
            );
        }
        // Legend.
        let ly = MARGIN_TOP + 12.0 + i as f64 * 15.0;
        let lx = MARGIN_LEFT + plot_w + 10.0;
        let _ = write!(
            svg,
            r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2"/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 4.0,
            lx + 16.0,
            ly - 4.0,
            s.color,
            lx + 20.0,
            escape(&s.label)
        );
    }
    svg.push_str("</svg>");
    svg
}

fn format_tick(v: f64) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ceilings_are_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(47.0), 50.0);
        assert_eq!(nice_ceiling(100.0), 100.0);
    }

    #[test]
    fn a_chart_is_one_svg_element_with_its_lines_and_escaped_labels() {
        let svg = line_chart(
            "p99 <ms>",
            "s",
            "ms",
            &[Series {
                label: "acquire".into(),
                color: "#1f77b4",
                dashed: false,
                points: vec![(0.0, 1.0), (1.0, 2.0)],
            }],
            &[Marker {
                x: 0.5,
                label: "kill".into(),
            }],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("<polyline"));
        assert!(svg.contains("p99 &lt;ms&gt;"));
        assert!(svg.contains("kill"));
    }
}
