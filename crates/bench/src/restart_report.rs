//! The `restart` scenario's report: one column per case, as a terminal table and as JSON, with
//! the checks that fail the run (events lost, duplicated or reordered, ghosts, a client never
//! back) and the goals read off the figures (never a failure: figures, not tests).
//!
//! Filled by `restart`, printed by `bench::run`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// One case.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CaseReport {
    /// `a` to `e`.
    pub case: String,
    pub title: String,
    pub clients: usize,
    /// How long the restart itself took (command, or stop + start + ready).
    pub restart_seconds: f64,
    /// From the restart's start until every client had the first change written after the
    /// target was back (`None`: not within the wait).
    pub recovery_seconds: Option<f64>,
    /// Full lists the clients made after their first (summed), and how many clients relisted.
    pub client_relists: u64,
    pub clients_relisted: u64,
    /// Why the clients' watches ended in a relist, and why a LIST was tried again, counted.
    #[serde(default)]
    pub relist_reasons: std::collections::BTreeMap<String, u64>,
    /// LISTs that reached the upstream: case (a) the clients' LIST requests (pages included),
    /// otherwise the proxies' full lists (`watchcache_relists_total`).
    pub upstream_lists: u64,
    /// Client requests the proxies forwarded upstream (`watchcache_forwarded_requests_total`).
    pub upstream_forwarded: u64,
    /// The proxies' consistency checks (metadata-only LISTs at an exact RV, one after every
    /// warm start).
    pub consistency_checks: u64,
    pub changes_written: u64,
    pub writes_failed: u64,
    /// Writer changes a client never got (as an event or through a relist), summed.
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Keys that differed from the upstream's pods at the end (ghost, missing or stale), summed.
    pub ghosts: u64,
}

/// The whole run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RestartReport {
    /// `in-process` (the sim) or `external`.
    pub mode: String,
    pub upstream: String,
    pub clients: usize,
    pub objects: usize,
    pub object_size: usize,
    pub events_per_sec: f64,
    pub seconds_per_case: f64,
    pub cases: Vec<CaseReport>,
    /// The goals, each met or not (figures, never a failure).
    pub goals: Vec<String>,
    /// What fails the run.
    pub problems: Vec<String>,
}

impl RestartReport {
    /// Fills `problems` and `goals`.
    pub fn check(&mut self) {
        for c in &self.cases {
            let name = format!("case ({})", c.case);
            for (n, what) in [
                (c.lost, "events lost"),
                (c.duplicated, "events duplicated"),
                (c.out_of_order, "events reordered"),
                (c.ghosts, "keys differing from the upstream at the end"),
            ] {
                if n > 0 {
                    self.problems.push(format!("{name}: {n} {what}"));
                }
            }
            if c.recovery_seconds.is_none() {
                self.problems.push(format!("{name}: the clients were not all back at the truth"));
            }
            if c.changes_written == 0 {
                self.problems.push(format!("{name}: no change was written: the checks proved nothing"));
            }
            let met = |ok: bool| if ok { "met" } else { "NOT met" };
            match c.case.as_str() {
                "b" => self.goals.push(format!(
                    "(b) at most one upstream LIST per cached resource (1: pods): {} ({} LISTs for {} clients)",
                    met(c.upstream_lists <= 1),
                    c.upstream_lists,
                    c.clients
                )),
                "d" | "e" => self.goals.push(format!(
                    "({}) zero client relists and zero upstream LISTs: {} ({} relists, {} LISTs, {} forwarded, {} consistency checks)",
                    c.case,
                    met(c.client_relists == 0 && c.upstream_lists == 0),
                    c.client_relists,
                    c.upstream_lists,
                    c.upstream_forwarded,
                    c.consistency_checks
                )),
                _ => {}
            }
        }
    }

    /// The side-by-side table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "restart scenario, {}: {} clients, {} pods of ~{} bytes, {} changes/s, {:.0} s per case (upstream {})",
            self.mode, self.clients, self.objects, self.object_size, self.events_per_sec, self.seconds_per_case, self.upstream
        );
        for c in &self.cases {
            let _ = writeln!(out, "  ({}) {}", c.case, c.title);
        }
        let mut header = format!("{:<34}", "");
        for c in &self.cases {
            let _ = write!(header, "{:>10}", format!("({})", c.case));
        }
        let _ = writeln!(out, "{header}");
        type Cell = fn(&CaseReport) -> String;
        let rows: [(&str, Cell); 12] = [
            ("restart took (s)", |c| format!("{:.1}", c.restart_seconds)),
            ("back at the truth after (s)", |c| {
                c.recovery_seconds.map_or("never".into(), |s| format!("{s:.1}"))
            }),
            ("client relists", |c| c.client_relists.to_string()),
            ("clients that relisted", |c| c.clients_relisted.to_string()),
            ("upstream LISTs", |c| c.upstream_lists.to_string()),
            ("requests forwarded upstream", |c| c.upstream_forwarded.to_string()),
            ("consistency checks", |c| c.consistency_checks.to_string()),
            ("changes written", |c| c.changes_written.to_string()),
            ("events lost", |c| c.lost.to_string()),
            ("events duplicated", |c| c.duplicated.to_string()),
            ("events reordered", |c| c.out_of_order.to_string()),
            ("ghost / stale keys at the end", |c| c.ghosts.to_string()),
        ];
        for (label, f) in rows {
            let mut line = format!("{label:<34}");
            for c in &self.cases {
                let _ = write!(line, "{:>10}", f(c));
            }
            let _ = writeln!(out, "{line}");
        }
        for c in self.cases.iter().filter(|c| !c.relist_reasons.is_empty()) {
            let why: Vec<String> = c.relist_reasons.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            let _ = writeln!(out, "({}) relists (and LIST retries) because: {}", c.case, why.join(", "));
        }
        for g in &self.goals {
            let _ = writeln!(out, "goal {g}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(c: &str) -> CaseReport {
        CaseReport { case: c.into(), changes_written: 10, recovery_seconds: Some(1.0), ..Default::default() }
    }

    #[test]
    fn losses_fail_the_run_and_goals_are_read_off() {
        let mut r = RestartReport {
            cases: vec![
                CaseReport { upstream_lists: 1, clients: 5, ..case("b") },
                CaseReport { client_relists: 2, ..case("d") },
                CaseReport { lost: 3, recovery_seconds: None, ..case("e") },
            ],
            ..Default::default()
        };
        r.check();
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(r.problems[0].contains("3 events lost"));
        assert!(r.goals[0].contains(": met"), "{:?}", r.goals);
        assert!(r.goals[1].contains("NOT met"), "{:?}", r.goals);
        assert!(r.goals[2].contains(": met"), "{:?}", r.goals);
        let t = r.table();
        assert!(t.lines().any(|l| l.starts_with("events lost") && l.ends_with('3')), "{t}");
        assert!(t.lines().any(|l| l.starts_with("back at the truth") && l.ends_with("never")), "{t}");
    }
}
