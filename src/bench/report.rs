//! The bench report: what one run measured per target, as a side-by-side table on the terminal
//! (proxy, direct, ratio) and as JSON (`--json FILE`).
//!
//! Built by the phase runner (`phase`, one [`TargetReport`] per phase) and `bench::run`;
//! the SVG chart (`svg`) reads the same structure.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::stats::Summary;

/// One request kind against one target.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RequestReport {
    pub count: u64,
    pub per_sec: f64,
    pub bytes: u64,
    pub bytes_per_sec: f64,
    pub errors: u64,
    /// Ticks not sent because too many requests were in flight (overload).
    pub skipped: u64,
    pub latency: Summary,
}

/// The watch clients against one target.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WatchReport {
    pub watchers: usize,
    pub opened: usize,
    /// Watchers that got an ERROR event (e.g. 410) and could not continue.
    pub failed: usize,
    pub reconnects: u64,
    pub events: u64,
    pub events_per_sec: f64,
    pub bytes_per_sec: f64,
    /// Changes the writer made in this phase (and failed writes).
    pub changes_written: u64,
    pub writes_failed: u64,
    /// Sum over watchers of the changes each should have received.
    pub deliveries_expected: u64,
    pub deliveries_received: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Delivery lag: receive time − writer's send time.
    pub lag: Summary,
    /// Per second of the phase: (second, mean lag ms, max lag ms).
    pub lag_timeline: Vec<(u64, f64, f64)>,
}

/// Everything measured against one target in one phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TargetReport {
    /// `proxy` or `direct`.
    pub name: String,
    pub url: String,
    pub seconds: f64,
    /// By request kind (`list rv=0`, `list limit page`, `get rv=0`, `watch open`).
    pub requests: BTreeMap<String, RequestReport>,
    /// Outcomes by HTTP status or failure label.
    pub statuses: BTreeMap<String, u64>,
    pub watch: WatchReport,
    /// Requests that reached the upstream during the phase (the sim's count, or the proxy's
    /// forwarded-requests metric), when known.
    pub upstream_requests: Option<u64>,
    /// CPU seconds used during the phase by the measured process (the whole bench process when
    /// everything runs in-process).
    pub cpu_seconds: Option<f64>,
    /// Largest resident set seen during the phase.
    pub peak_rss_bytes: Option<u64>,
}

/// The whole run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub scenario: String,
    /// The resolved plan (sizes, rates, duration).
    pub plan: serde_json::Value,
    /// `in-process` (sim + proxy + harness in one process) or `external`.
    pub mode: String,
    /// What CPU/RSS measure.
    pub process: String,
    pub targets: Vec<TargetReport>,
    /// Lost, duplicated or reordered events, or watchers that never opened.
    pub problems: Vec<String>,
}

impl Report {
    /// Collects delivery problems from every target; the run fails if there is any.
    pub fn check(&mut self) {
        for t in &self.targets {
            let w = &t.watch;
            for (n, what) in
                [(w.lost, "lost"), (w.duplicated, "duplicated"), (w.out_of_order, "out of order")]
            {
                if n > 0 {
                    self.problems.push(format!("{}: {n} watch events {what}", t.name));
                }
            }
            if w.opened < w.watchers {
                self.problems.push(format!("{}: only {} of {} watches opened", t.name, w.opened, w.watchers));
            }
        }
    }

    fn target(&self, name: &str) -> Option<&TargetReport> {
        self.targets.iter().find(|t| t.name == name)
    }

    /// The terminal table: one column per target, and proxy/direct when both ran.
    pub fn table(&self) -> String {
        let cols: Vec<&TargetReport> = ["proxy", "direct"].iter().filter_map(|n| self.target(n)).collect();
        let both = cols.len() == 2;
        let mut rows: Vec<(String, Vec<Option<f64>>, u8)> = Vec::new();
        let mut row = |label: String, f: &dyn Fn(&TargetReport) -> Option<f64>, decimals: u8| {
            rows.push((label, cols.iter().map(|t| f(t)).collect(), decimals));
        };
        let kinds: Vec<String> = {
            let mut k: Vec<String> = cols.iter().flat_map(|t| t.requests.keys().cloned()).collect();
            k.sort();
            k.dedup();
            k
        };
        for k in &kinds {
            let get = |t: &TargetReport| t.requests.get(k).cloned().unwrap_or_default();
            if cols.iter().all(|t| get(t).count == 0 && get(t).errors == 0) {
                continue;
            }
            row(format!("{k}: requests/s"), &|t| Some(get(t).per_sec), 1);
            row(format!("{k}: p50 ms"), &|t| Some(get(t).latency.p50_ms), 2);
            row(format!("{k}: p90 ms"), &|t| Some(get(t).latency.p90_ms), 2);
            row(format!("{k}: p99 ms"), &|t| Some(get(t).latency.p99_ms), 2);
            row(format!("{k}: max ms"), &|t| Some(get(t).latency.max_ms), 2);
            row(format!("{k}: MB/s"), &|t| Some(get(t).bytes_per_sec / 1e6), 2);
            row(format!("{k}: errors"), &|t| Some(get(t).errors as f64), 0);
            if cols.iter().any(|t| get(t).skipped > 0) {
                row(format!("{k}: skipped (overload)"), &|t| Some(get(t).skipped as f64), 0);
            }
        }
        if cols.iter().any(|t| t.watch.watchers > 0) {
            row("watchers open".into(), &|t| Some(t.watch.opened as f64), 0);
            row("watch events/s".into(), &|t| Some(t.watch.events_per_sec), 0);
            row("watch MB/s".into(), &|t| Some(t.watch.bytes_per_sec / 1e6), 2);
            row("changes written".into(), &|t| Some(t.watch.changes_written as f64), 0);
            row("deliveries expected".into(), &|t| Some(t.watch.deliveries_expected as f64), 0);
            row("lag p50 ms".into(), &|t| Some(t.watch.lag.p50_ms), 2);
            row("lag p99 ms".into(), &|t| Some(t.watch.lag.p99_ms), 2);
            row("lag max ms".into(), &|t| Some(t.watch.lag.max_ms), 2);
            row("events lost".into(), &|t| Some(t.watch.lost as f64), 0);
            row("events duplicated".into(), &|t| Some(t.watch.duplicated as f64), 0);
            row("events out of order".into(), &|t| Some(t.watch.out_of_order as f64), 0);
            row("watch reconnects".into(), &|t| Some(t.watch.reconnects as f64), 0);
        }
        row("upstream requests".into(), &|t| t.upstream_requests.map(|n| n as f64), 0);
        row("CPU seconds".into(), &|t| t.cpu_seconds, 2);
        row("peak RSS MiB".into(), &|t| t.peak_rss_bytes.map(|b| b as f64 / 1048576.0), 1);

        let mut out = String::new();
        let _ = write!(out, "{:<32}", format!("scenario {}", self.scenario));
        for t in &cols {
            let _ = write!(out, "{:>14}", t.name);
        }
        if both {
            let _ = write!(out, "{:>14}", "proxy/direct");
        }
        out.push('\n');
        for (label, vals, d) in rows {
            let _ = write!(out, "{label:<32}");
            for v in &vals {
                let _ = write!(
                    out,
                    "{:>14}",
                    v.map(|v| format!("{v:.*}", d as usize)).unwrap_or_else(|| "-".into())
                );
            }
            if both {
                let ratio = match (vals[0], vals[1]) {
                    (Some(p), Some(d)) if d != 0.0 => format!("{:.2}", p / d),
                    _ => "-".into(),
                };
                let _ = write!(out, "{ratio:>14}");
            }
            out.push('\n');
        }
        for t in &cols {
            let s: Vec<String> = t.statuses.iter().map(|(k, v)| format!("{k}×{v}")).collect();
            let _ = writeln!(out, "{} outcomes: {}", t.name, s.join(" "));
        }
        let _ = writeln!(out, "CPU/RSS: {}", self.process);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &str, p50: f64, lost: u64) -> TargetReport {
        let mut t =
            TargetReport { name: name.into(), url: "http://x".into(), seconds: 1.0, ..Default::default() };
        t.requests.insert(
            "get rv=0".into(),
            RequestReport {
                count: 10,
                per_sec: 10.0,
                latency: Summary { p50_ms: p50, ..Default::default() },
                ..Default::default()
            },
        );
        t.watch = WatchReport { watchers: 2, opened: 2, lost, ..Default::default() };
        t.statuses.insert("200".into(), 12);
        t
    }

    #[test]
    fn table_has_both_columns_and_the_ratio() {
        let r = Report {
            scenario: "mixed".into(),
            targets: vec![target("proxy", 1.0, 0), target("direct", 4.0, 0)],
            ..Default::default()
        };
        let t = r.table();
        let p50 = t.lines().find(|l| l.starts_with("get rv=0: p50 ms")).unwrap();
        assert!(p50.ends_with("0.25"), "{p50}");
        assert!(t.contains("proxy outcomes: 200×12"), "{t}");
    }

    #[test]
    fn delivery_problems_fail_the_run() {
        let mut r =
            Report { targets: vec![target("proxy", 1.0, 3), target("direct", 1.0, 0)], ..Default::default() };
        r.check();
        assert_eq!(r.problems, vec!["proxy: 3 watch events lost".to_owned()]);
        let mut ok = Report { targets: vec![target("proxy", 1.0, 0)], ..Default::default() };
        ok.check();
        assert!(ok.problems.is_empty());
    }
}
