//! `kube-watchcache bench`: the load harness. Drives W watchers, L LISTs/s, G GETs/s and a
//! writer making E changes/s against the proxy and then, with the same load, against the direct
//! upstream, and reports both side by side: latency percentiles per request kind, throughput,
//! watch delivery lag, lost / duplicated / reordered events (the run fails if any), errors by
//! status, requests that reached the upstream, and the proxy's CPU seconds and peak RSS.
//!
//! Without `--target` / `--direct` / `--kubeconfig` it starts a simulated apiserver and a proxy
//! in this process (then CPU and RSS are those of the whole process: harness + sim + proxy, so
//! compare the two columns rather than read either alone).
//!
//! Called by `main` (the `bench` subcommand) and by `tests/bench.rs`.
//!
//! # Layout
//!
//! | file | owns |
//! | --- | --- |
//! | `scenario` | the four load shapes, their defaults, the resolved [`Plan`] |
//! | `env` | targets, HTTP clients, the writer's backend, the in-process sim + proxy |
//! | `phase` | one target's run: open watches → load → drain → settle |
//! | `load` | open-loop LIST / GET drivers and the stamping writer |
//! | `watchers` | watch clients: minimal line parsing, lag, resume |
//! | `track` | per-watcher loss / duplicate / order accounting |
//! | `stats` | lock-free histograms and counters |
//! | `procstat` | `/proc` CPU seconds, RSS, the open-file limit |
//! | `report` | the report structure, terminal table, JSON |
//! | `svg` | the hand-written SVG chart |
//! | `kubeconfig` | server URL and bearer token from a kubeconfig |

mod env;
mod kubeconfig;
mod load;
mod phase;
mod procstat;
pub mod report;
mod scenario;
mod stats;
mod svg;
mod track;
mod watchers;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::config::parse_duration;
use env::{Backend, Local, Target};
pub use report::Report;
pub use scenario::{Plan, Scenario};

/// Flags of `bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// URL of the proxy to measure (plain HTTP), e.g. http://127.0.0.1:8001. Without --target,
    /// --direct and --kubeconfig, a simulated apiserver and a proxy run inside this process.
    #[arg(long)]
    pub target: Option<String>,
    /// URL of the upstream itself (plain HTTP), measured with the same load after the proxy;
    /// the writer and the seeding write here (else through --target).
    #[arg(long)]
    pub direct: Option<String>,
    /// Take the direct upstream's URL and bearer token from this kubeconfig (plain HTTP only
    /// for now; use `kubectl proxy` in front of a TLS apiserver).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The load shape; its defaults are overridden by the flags below.
    #[arg(long, value_enum, default_value = "mixed")]
    pub scenario: Scenario,
    /// How long each target is driven.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Watch clients. kubelet: one per node (`fieldSelector=spec.nodeName=node-i`); mixed: a
    /// sixth watch all pods, the rest one node each; otherwise all watch all pods.
    #[arg(long)]
    pub watchers: Option<usize>,
    /// LISTs per second (alternately `resourceVersion=0`, and paginated with `limit=500`).
    #[arg(long)]
    pub lists_per_sec: Option<f64>,
    /// GETs per second (`resourceVersion=0`, random pods).
    #[arg(long)]
    pub gets_per_sec: Option<f64>,
    /// Pod updates per second made by the writer upstream.
    #[arg(long)]
    pub events_per_sec: Option<f64>,
    /// Lease renewals per second in the in-process simulated apiserver (default 20; 0 = a quiet
    /// cluster).
    #[arg(long)]
    pub lease_churn: Option<f64>,
    /// Pods created before the run (in 10 namespaces `bench-0..9`).
    #[arg(long)]
    pub objects: Option<usize>,
    /// Approximate size of each pod in bytes.
    #[arg(long)]
    pub object_size: Option<usize>,
    /// Talk HTTP/2 (prior knowledge, ~100 streams per connection) instead of HTTP/1.1.
    #[arg(long)]
    pub http2: bool,
    /// Do not create the pods first (external mode, when a previous run made them).
    #[arg(long)]
    pub skip_seed: bool,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a chart (latency percentiles, lag over time) as SVG to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// PID of the proxy process, for its CPU seconds and peak RSS (automatic in-process).
    #[arg(long)]
    pub proxy_pid: Option<u32>,
}

impl BenchArgs {
    /// Flags with every optional value unset, for programmatic use (tests, `demo`).
    pub fn new(scenario: Scenario, duration: Duration) -> BenchArgs {
        BenchArgs {
            target: None,
            direct: None,
            kubeconfig: None,
            scenario,
            duration,
            watchers: None,
            lists_per_sec: None,
            gets_per_sec: None,
            events_per_sec: None,
            lease_churn: None,
            objects: None,
            object_size: None,
            http2: false,
            skip_seed: false,
            json: None,
            svg: None,
            proxy_pid: None,
        }
    }

    /// The scenario's defaults with the given overrides.
    pub fn plan(&self) -> Plan {
        let mut s = self.scenario.defaults();
        if let Some(w) = self.watchers {
            match self.scenario {
                Scenario::Kubelet => (s.watchers, s.node_watchers) = (0, w),
                Scenario::Mixed => (s.watchers, s.node_watchers) = (w / 6, w - w / 6),
                _ => (s.watchers, s.node_watchers) = (w, 0),
            }
        }
        s.lists_per_sec = self.lists_per_sec.unwrap_or(s.lists_per_sec);
        s.gets_per_sec = self.gets_per_sec.unwrap_or(s.gets_per_sec);
        s.events_per_sec = self.events_per_sec.unwrap_or(s.events_per_sec);
        s.lease_churn_per_sec = self.lease_churn.unwrap_or(s.lease_churn_per_sec);
        s.objects = self.objects.unwrap_or(s.objects);
        s.object_size = self.object_size.unwrap_or(s.object_size);
        Plan::new(self.scenario, s, self.duration, self.http2)
    }
}

/// Runs the harness: prints the table on stdout, writes `--json` / `--svg`, and fails (after
/// reporting) when any watch event was lost, duplicated or reordered.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    let report = measure(&args).await?;
    crate::app::say(&report.table());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::render(&report)).map_err(|e| format!("--svg {}: {e}", path.display()))?;
    }
    if report.problems.is_empty() {
        Ok(())
    } else {
        Err(format!("watch delivery problems: {}", report.problems.join("; ")))
    }
}

/// Runs the phases and returns the (checked) report without printing it.
pub async fn measure(args: &BenchArgs) -> Result<Report, String> {
    let mut plan = args.plan();
    let external = args.target.is_some() || args.direct.is_some() || args.kubeconfig.is_some();
    // In-process, both ends of every watch connection are in this process.
    let fds_per_watch = if external { 1 } else { 2 };
    let spare = (4 * load::MAX_IN_FLIGHT + 512) as u64;
    let needed = plan.watch_clients() as u64 * fds_per_watch + spare;
    if let Some(soft) = procstat::raise_fd_limit(needed) {
        if soft < needed && args.watchers.is_none() {
            // A scenario default that does not fit: shrink it, and say so.
            let fit = (soft.saturating_sub(spare) / fds_per_watch) as usize;
            let total = plan.watch_clients().max(1);
            plan.sizes.node_watchers = plan.sizes.node_watchers * fit / total;
            plan.sizes.watchers = fit.saturating_sub(plan.sizes.node_watchers);
            plan = Plan::new(plan.scenario, plan.sizes.clone(), plan.duration, plan.http2);
            eprintln!(
                "the open-file limit is {soft}: running {} watch clients instead of {total} (raise it with `ulimit -n {needed}`)",
                plan.watch_clients()
            );
        } else if soft < needed {
            return Err(format!(
                "{} watch clients need about {needed} open files but the limit is {soft}: raise it with `ulimit -n {needed}` or use fewer --watchers",
                plan.watch_clients()
            ));
        }
    }
    let mut report = Report {
        scenario: plan.scenario.as_str().to_owned(),
        plan: serde_json::to_value(&plan).map_err(|e| e.to_string())?,
        mode: if external { "external" } else { "in-process" }.to_owned(),
        ..Report::default()
    };
    let seq = 1;
    if external {
        let direct = match (&args.direct, &args.kubeconfig) {
            (Some(url), _) => Some(Target { name: "direct", base: trim(url), token: None }),
            (None, Some(path)) => {
                let (base, token) = kubeconfig::server_and_token(path)?;
                Some(Target { name: "direct", base, token })
            }
            (None, None) => None,
        };
        let proxy = args.target.as_ref().map(|u| Target { name: "proxy", base: trim(u), token: None });
        let token = direct.as_ref().and_then(|d| d.token.clone());
        let proxy = proxy.map(|p| Target { token: token.clone(), ..p });
        let write_to = direct.clone().or(proxy.clone()).ok_or("nothing to measure")?;
        let backend = Backend::Http(env::Remote::new(write_to, env::Clients::new(false, 1).pick(0).clone()));
        if !args.skip_seed {
            eprintln!("creating {} pods of ~{} bytes", plan.sizes.objects, plan.sizes.object_size);
            backend.seed(&plan).await?;
        }
        report.process = match args.proxy_pid {
            Some(p) => format!("the proxy, pid {p}, in the proxy phase"),
            None => "not measured (give --proxy-pid)".into(),
        };
        let metrics_client = env::Clients::new(false, 1).pick(0).clone();
        let mut seq = seq;
        for target in [proxy, direct].into_iter().flatten() {
            let is_proxy = target.name == "proxy";
            let phase = phase::Phase {
                plan: &plan,
                upstream: if is_proxy {
                    phase::UpstreamCount::ProxyMetrics(env::Remote::new(
                        target.clone(),
                        metrics_client.clone(),
                    ))
                } else {
                    phase::UpstreamCount::Unknown
                },
                target,
                backend: backend.clone(),
                seq_base: seq,
                measure: if is_proxy { args.proxy_pid.map(Some) } else { None },
            };
            let (r, next) = phase.run().await?;
            seq = next;
            report.targets.push(r);
        }
    } else {
        eprintln!(
            "starting a simulated apiserver with {} pods of ~{} bytes and a proxy",
            plan.sizes.objects, plan.sizes.object_size
        );
        let local = Local::start(&plan).await?;
        report.process = match args.proxy_pid {
            Some(p) => format!("pid {p}"),
            None => "this whole process (harness + sim + proxy)".into(),
        };
        let measure = Some(args.proxy_pid);
        let targets = [
            Target { name: "proxy", base: format!("http://{}", local.proxy.addr), token: None },
            Target { name: "direct", base: format!("http://{}", local.sim.addr), token: None },
        ];
        let mut seq = seq;
        let mut result = Ok(());
        for target in targets {
            let phase = phase::Phase {
                plan: &plan,
                target,
                backend: Backend::Sim(local.sim.sim.clone()),
                seq_base: seq,
                measure,
                upstream: phase::UpstreamCount::Sim(local.sim.sim.clone()),
            };
            match phase.run().await {
                Ok((r, next)) => {
                    seq = next;
                    report.targets.push(r);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        local.shutdown().await;
        result?;
    }
    report.check();
    Ok(report)
}

fn trim(url: &str) -> String {
    url.trim_end_matches('/').to_owned()
}
