//! The `--svg FILE` chart, written by hand (no crate): latency percentiles per request kind as
//! horizontal bars (proxy vs direct, each kind scaled to its own maximum, values printed), and
//! watch delivery lag per second as lines (mean and max, proxy vs direct).
//!
//! Called by `bench::run` with the finished [`Report`].

use std::fmt::Write as _;

use super::report::{Report, TargetReport};

const WIDTH: f64 = 900.0;
const LEFT: f64 = 190.0;
const BAR_W: f64 = WIDTH - LEFT - 90.0;
const BAR_H: f64 = 9.0;

fn color(target: &str, strong: bool) -> &'static str {
    match (target, strong) {
        ("proxy", true) => "#1f77b4",
        ("proxy", false) => "#9ecae1",
        (_, true) => "#ff7f0e",
        (_, false) => "#fdd0a2",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// One bar group: its label and, per percentile, the value of each target.
type Group = (String, Vec<(&'static str, Vec<f64>)>);

/// Latency bar groups, one per request kind, plus the watch lag.
fn latency_groups(targets: &[&TargetReport]) -> Vec<Group> {
    let mut kinds: Vec<String> = targets.iter().flat_map(|t| t.requests.keys().cloned()).collect();
    kinds.sort();
    kinds.dedup();
    let mut groups: Vec<Group> = kinds
        .iter()
        .map(|k| {
            let get = |f: fn(&super::stats::Summary) -> f64| {
                targets.iter().map(|t| t.requests.get(k).map(|r| f(&r.latency)).unwrap_or(0.0)).collect()
            };
            (
                k.clone(),
                vec![("p50", get(|s| s.p50_ms)), ("p90", get(|s| s.p90_ms)), ("p99", get(|s| s.p99_ms))],
            )
        })
        .collect();
    if targets.iter().any(|t| t.watch.lag.count > 0) {
        let get = |f: fn(&super::stats::Summary) -> f64| targets.iter().map(|t| f(&t.watch.lag)).collect();
        groups.push((
            "watch delivery lag".into(),
            vec![("p50", get(|s| s.p50_ms)), ("p99", get(|s| s.p99_ms)), ("max", get(|s| s.max_ms))],
        ));
    }
    groups
}

/// Renders the chart.
pub fn render(report: &Report) -> String {
    let targets: Vec<&TargetReport> =
        ["proxy", "direct"].iter().filter_map(|n| report.targets.iter().find(|t| t.name == *n)).collect();
    let groups = latency_groups(&targets);
    let rows: usize = groups.iter().map(|(_, r)| r.len()).sum();
    let bars_h = 60.0 + groups.len() as f64 * 26.0 + rows as f64 * (BAR_H * targets.len() as f64 + 6.0);
    let lag_top = bars_h + 40.0;
    let lag_h = 220.0;
    let height = lag_top + lag_h + 70.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="20" font-size="15" font-weight="bold">kube-watchcache bench: {} — latency (ms), proxy vs direct</text>"#,
        esc(&report.scenario)
    );
    for (i, t) in targets.iter().enumerate() {
        let x = 10.0 + i as f64 * 110.0;
        let _ =
            writeln!(s, r#"<rect x="{x}" y="32" width="12" height="12" fill="{}"/>"#, color(&t.name, true));
        let _ = writeln!(s, r#"<text x="{}" y="42">{}</text>"#, x + 16.0, esc(&t.name));
    }
    let mut y = 60.0;
    for (label, rows) in &groups {
        let _ = writeln!(s, r#"<text x="10" y="{}" font-weight="bold">{}</text>"#, y + 12.0, esc(label));
        y += 18.0;
        let max = rows.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0, f64::max).max(1e-9);
        for (p, vals) in rows {
            let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="end">{p}</text>"#, LEFT - 8.0, y + BAR_H);
            for (t, v) in targets.iter().zip(vals) {
                let w = (v / max * BAR_W).max(0.5);
                let _ = writeln!(
                    s,
                    r#"<rect x="{LEFT}" y="{y}" width="{w:.1}" height="{BAR_H}" fill="{}"/><text x="{:.1}" y="{}" font-size="9">{v:.2}</text>"#,
                    color(&t.name, true),
                    LEFT + w + 4.0,
                    y + BAR_H - 1.0
                );
                y += BAR_H;
            }
            y += 6.0;
        }
        y += 8.0;
    }

    // Lag over time.
    let _ = writeln!(
        s,
        r#"<text x="10" y="{}" font-size="15" font-weight="bold">watch delivery lag per second (ms): mean (solid), max (dashed)</text>"#,
        lag_top - 12.0
    );
    let (x0, x1, y0, y1) = (60.0, WIDTH - 20.0, lag_top + lag_h, lag_top);
    let secs = targets.iter().flat_map(|t| t.watch.lag_timeline.iter().map(|p| p.0)).max().unwrap_or(0).max(1)
        as f64;
    let ymax =
        targets.iter().flat_map(|t| t.watch.lag_timeline.iter().map(|p| p.2)).fold(0.0, f64::max).max(1.0);
    let _ = writeln!(
        s,
        r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>"#
    );
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let yy = y0 - (y0 - y1) * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{:.1}" text-anchor="end" font-size="9">{v:.1}</text><line x1="{x0}" y1="{yy:.1}" x2="{x1}" y2="{yy:.1}" stroke="#ddd"/>"##,
            x0 - 4.0,
            yy + 3.0
        );
        let sec = secs * i as f64 / 4.0;
        let xx = x0 + (x1 - x0) * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r#"<text x="{xx:.1}" y="{}" text-anchor="middle" font-size="9">{sec:.0}s</text>"#,
            y0 + 14.0
        );
    }
    for t in &targets {
        for (dash, pick) in [("", 1usize), (r#" stroke-dasharray="4 3""#, 2)] {
            let pts: Vec<String> = t
                .watch
                .lag_timeline
                .iter()
                .map(|p| {
                    let v = if pick == 1 { p.1 } else { p.2 };
                    format!("{:.1},{:.1}", x0 + (x1 - x0) * p.0 as f64 / secs, y0 - (y0 - y1) * v / ymax)
                })
                .collect();
            if !pts.is_empty() {
                let _ = writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{}" stroke-width="1.5"{dash} points="{}"/>"#,
                    color(&t.name, pick == 1),
                    pts.join(" ")
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{RequestReport, WatchReport};
    use crate::stats::Summary;

    #[test]
    fn chart_has_bars_and_lines_for_both_targets() {
        let t = |name: &str, p50: f64| {
            let mut t = TargetReport { name: name.into(), ..Default::default() };
            t.requests.insert(
                "get rv=0".into(),
                RequestReport {
                    count: 1,
                    latency: Summary { p50_ms: p50, p90_ms: p50, p99_ms: p50, ..Default::default() },
                    ..Default::default()
                },
            );
            t.watch = WatchReport {
                lag: Summary { count: 2, p50_ms: 1.0, ..Default::default() },
                lag_timeline: vec![(0, 1.0, 2.0), (1, 1.5, 3.0)],
                ..Default::default()
            };
            t
        };
        let r = Report {
            scenario: "a<b".into(),
            targets: vec![t("proxy", 1.0), t("direct", 2.0)],
            ..Default::default()
        };
        let svg = render(&r);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a&lt;b"));
        assert_eq!(svg.matches("<polyline").count(), 4, "mean and max for each target");
        assert!(svg.contains(">2.00</text>") && svg.contains(">1.00</text>"));
        assert!(svg.contains("watch delivery lag"));
    }
}
