//! The status page as HTML, rendered on the server: every number and chart
//! is in the first response. A small script then swaps in a fresh copy of
//! the `#live` section every [`super::STATUS_REFRESH_MS`]; without
//! JavaScript a `<noscript>` refresh reloads the page instead.

use std::fmt::Write;

use super::charts::{bar_chart, format_value, line_chart, Line};
use super::history::{History, Point};
use super::view::ClusterView;

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("refresh.js");

/// `text` safe inside HTML text and quoted attribute values (resource
/// names are chosen by clients).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What the page shows: the cluster now, or why it could not be listed.
pub enum Content<'a> {
    View(&'a ClusterView),
    Unavailable { node_id: u64, reason: &'a str },
}

/// The whole page.
pub fn render(content: Content<'_>, history: &History, refresh_ms: u64) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>fencelock status</title>
<style>{STYLE}</style>
<noscript><meta http-equiv="refresh" content="{}"></noscript>
</head>
<body>
<h1>fencelock cluster</h1>
<div id="live">
"#,
        refresh_ms.div_ceil(1000).max(1)
    );
    match content {
        Content::View(view) => live(&mut html, view, history),
        Content::Unavailable { node_id, reason } => {
            let _ = write!(
                html,
                r#"<p class="meta">Served by node <span id="served-by">{node_id}</span>.</p>
<p id="unavailable" class="down">The cluster could not be listed: {}</p>
"#,
                escape(reason)
            );
        }
    }
    let _ = write!(
        html,
        r#"</div>
<p class="meta">Refreshed <span id="refreshes">0</span> times in this tab, every {refresh_ms} ms. <span id="error"></span></p>
<script>
const REFRESH_MS = {refresh_ms};
{SCRIPT}</script>
</body>
</html>
"#
    );
    html
}

fn live(html: &mut String, v: &ClusterView, history: &History) {
    if v.insecure {
        html.push_str(
            "<p id=\"insecure\" class=\"banner\">INSECURE MODE: this node runs without TLS or \
             authentication (tls.insecure = true). Development only.</p>\n",
        );
    }
    let migration = match v.migration_id {
        0 => "none".to_owned(),
        id => id.to_string(),
    };
    let _ = writeln!(
        html,
        r#"<p class="meta">Served by node <span id="served-by">{}</span>, placement map version <span id="map-version">{}</span>, migration <span id="migration">{migration}</span>. Updated <span id="updated">{}</span>.</p>"#,
        v.served_by,
        v.map_version,
        rfc3339(v.generated_at_ms),
    );
    if !v.unreachable_node_ids.is_empty() {
        let ids: Vec<String> = v.unreachable_node_ids.iter().map(u64::to_string).collect();
        let _ = writeln!(
            html,
            r#"<p class="down">Not answering: node <span id="unreachable">{}</span> (its replicas show no applied index; a shard it led shows no leader).</p>"#,
            ids.join(", ")
        );
    }
    let _ = writeln!(
        html,
        r#"<p class="totals"><span>Held locks: <b id="total-locks">{}</b></span><span>Waiters: <b id="total-waiters">{}</b></span><span>Shards: <b id="total-shards">{}</b></span><span>Nodes: <b id="total-nodes">{}</b></span></p>"#,
        v.totals.held_locks, v.totals.waiters, v.totals.shards, v.totals.nodes
    );
    charts(html, v, history);
    nodes(html, v);
    shards(html, v);
    hot(html, v);
}

fn charts(html: &mut String, v: &ClusterView, history: &History) {
    let points = history.points();
    type Figure = fn(&Point) -> Option<f64>;
    // Every chart but the leaders' is two lines over the same points.
    let pair =
        |id: &str, unit: &str, first: (&'static str, Figure), second: (&'static str, Figure)| {
            let line = |(name, f): (&'static str, Figure)| Line {
                name,
                points: points.iter().map(|p| (p.at_ms, f(p))).collect(),
            };
            line_chart(id, unit, &[line(first), line(second)])
        };
    let requests = pair(
        "requests",
        "/s",
        ("requests answered", |p| p.requests_per_s),
        ("acquires granted", |p| p.grants_per_s),
    );
    let latency = pair(
        "latency",
        "ms",
        ("p99", |p| p.p99_ms),
        ("p50", |p| p.p50_ms),
    );
    let locks = pair(
        "locks",
        "",
        ("held", |p| Some(p.held_locks as f64)),
        ("waiting", |p| Some(p.waiters as f64)),
    );
    let bars: Vec<(String, u64)> = v
        .nodes
        .iter()
        .map(|n| (n.node_id.to_string(), u64::from(n.leaders)))
        .collect();
    let leaders = bar_chart("leaders", &bars);
    let latest = points.last();
    let now = |v: Option<f64>, unit: &str| match v {
        Some(v) => format!("{} {unit}", format_value(v)),
        None => "–".to_owned(),
    };
    let _ = write!(
        html,
        r#"<section class="charts">
<figure><figcaption>Requests/s, cluster-wide: <b class="k0">answered</b> {}, <b class="k1">granted</b> {}</figcaption>{requests}</figure>
<figure><figcaption>Request latency, queued acquires included: <b class="k0">p99</b> {}, <b class="k1">p50</b> {}</figcaption>{latency}</figure>
<figure><figcaption>Locks: <b class="k0">held</b> {}, <b class="k1">waiting</b> {}</figcaption>{locks}</figure>
<figure><figcaption>Shard leaders per node</figcaption>{leaders}</figure>
</section>
<p class="meta">Charts: {} samples over the last {} s, from the nodes' counters (a node that did not answer, or restarted, is left out of that interval).</p>
"#,
        now(latest.and_then(|p| p.requests_per_s), "/s"),
        now(latest.and_then(|p| p.grants_per_s), "/s"),
        now(latest.and_then(|p| p.p99_ms), "ms"),
        now(latest.and_then(|p| p.p50_ms), "ms"),
        v.totals.held_locks,
        v.totals.waiters,
        history.len(),
        history.span_ms() / 1000,
    );
}

fn nodes(html: &mut String, v: &ClusterView) {
    html.push_str(
        "<h2>Nodes</h2>\n<table id=\"nodes\"><thead><tr><th>node</th><th>address</th><th>state</th>\
         <th>replicas</th><th>leaders</th></tr></thead><tbody>\n",
    );
    for n in &v.nodes {
        let class = match n.state {
            "up" => "",
            "down" | "unknown" => "down",
            _ => "draining",
        };
        let _ = writeln!(
            html,
            r#"<tr data-node="{id}"><td>{id}</td><td data-field="address">{}</td><td data-field="state" class="{class}">{}</td><td data-field="replicas" class="num">{}</td><td data-field="leaders" class="num">{}</td></tr>"#,
            escape(&n.address),
            n.state,
            n.replicas,
            n.leaders,
            id = n.node_id,
        );
    }
    html.push_str("</tbody></table>\n");
}

fn shards(html: &mut String, v: &ClusterView) {
    html.push_str(
        "<h2>Shards</h2>\n<table id=\"shards\"><thead><tr><th>shard</th><th>epoch</th><th>leader</th>\
         <th>replicas (applied index)</th><th>slots</th><th>held</th><th>waiters</th></tr></thead><tbody>\n",
    );
    for s in &v.shards {
        let name = if s.shard_id == fencelock_placement::META_SHARD_ID {
            format!("{} (meta)", s.shard_id)
        } else {
            s.shard_id.to_string()
        };
        let (leader, leader_class) = match s.leader {
            0 => ("none".to_owned(), "noleader"),
            n => (n.to_string(), ""),
        };
        let replicas: Vec<String> = s
            .replicas
            .iter()
            .map(|r| {
                let learner = if r.role == "learner" { "L" } else { "" };
                format!("{}{learner} ({})", r.node_id, r.applied_index)
            })
            .collect();
        let _ = writeln!(
            html,
            r#"<tr data-shard="{}"><td>{name}</td><td data-field="epoch" class="num">{}</td><td data-field="leader" class="{leader_class}">{leader}</td><td data-field="replicas">{}</td><td data-field="slots">{}</td><td data-field="held" class="num">{}</td><td data-field="waiters" class="num">{}</td></tr>"#,
            s.shard_id,
            s.epoch,
            replicas.join(", "),
            s.slots.join(" "),
            s.held_locks,
            s.waiters,
        );
    }
    html.push_str("</tbody></table>\n");
}

fn hot(html: &mut String, v: &ClusterView) {
    html.push_str(
        "<h2>Hottest resources</h2>\n<table id=\"hot\"><thead><tr><th>resource</th><th>shard</th>\
         <th>acquires</th><th>contended</th></tr></thead><tbody>\n",
    );
    for h in &v.hot {
        let _ = writeln!(
            html,
            r#"<tr><td data-field="resource">{}</td><td data-field="shard" class="num">{}</td><td data-field="acquires" class="num">{}</td><td data-field="contended" class="num">{}</td></tr>"#,
            escape(&h.resource),
            h.shard_id,
            h.acquires,
            h.contended,
        );
    }
    html.push_str("</tbody></table>\n");
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC, to the millisecond.
fn rfc3339(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms"))
}

#[cfg(test)]
mod tests {
    use super::super::history::Sample;
    use super::super::view::{HotRow, NodeRow, ShardRow, Totals};
    use super::*;

    fn view() -> ClusterView {
        ClusterView {
            served_by: 2,
            insecure: true,
            generated_at_ms: 1_764_720_000_123,
            map_version: 7,
            migration_id: 0,
            unreachable_node_ids: vec![3],
            totals: Totals {
                held_locks: 5,
                waiters: 1,
                shards: 1,
                nodes: 1,
            },
            nodes: vec![NodeRow {
                node_id: 1,
                address: "127.0.0.1:7001".into(),
                state: "up",
                replicas: 1,
                leaders: 1,
            }],
            shards: vec![ShardRow {
                shard_id: 1,
                epoch: 4,
                leader: 0,
                replicas: vec![],
                slots: vec!["0-99".into()],
                held_locks: 5,
                waiters: 1,
            }],
            hot: vec![HotRow {
                resource: "acme/<script>alert(1)</script>".into(),
                shard_id: 1,
                acquires: 9,
                contended: 2,
            }],
        }
    }

    #[test]
    fn the_page_carries_its_numbers_and_charts_without_any_script_running() {
        let mut history = History::new(4);
        history.push(Sample {
            at_ms: 1_000,
            held_locks: 5,
            ..Sample::default()
        });
        let page = render(Content::View(&view()), &history, 2_000);
        assert!(page.contains(r#"<span id="served-by">2</span>"#));
        assert!(page.contains(r#"<b id="total-locks">5</b>"#));
        assert!(page.contains(r#"id="insecure""#));
        assert!(page.contains(r#"<span id="unreachable">3</span>"#));
        assert!(page.contains("2025-12-03T00:00:00.123Z"), "{page}");
        assert!(page.contains(r#"<td data-field="leader" class="noleader">none</td>"#));
        for chart in ["requests", "latency", "locks", "leaders"] {
            assert!(
                page.contains(&format!(r#"data-chart="{chart}""#)),
                "{chart}"
            );
        }
        assert!(page.contains(r#"<meta http-equiv="refresh" content="2">"#));
    }

    #[test]
    fn client_chosen_names_cannot_inject_markup() {
        let page = render(Content::View(&view()), &History::new(2), 2_000);
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(page.contains("acme/&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn an_unlistable_cluster_says_why() {
        let page = render(
            Content::Unavailable {
                node_id: 4,
                reason: "no meta leader <yet>",
            },
            &History::new(2),
            1_500,
        );
        assert!(page.contains("no meta leader &lt;yet&gt;"));
        assert!(page.contains(r#"<span id="served-by">4</span>"#));
        assert!(page.contains("every 1500 ms"));
    }
}
