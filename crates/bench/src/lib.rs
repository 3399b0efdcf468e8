//! `kube-watchcache bench`: the load harness (the `kube-watchcache-bench` crate, built on the
//! proxy's core and the sim; the proxy links it only through the binary's `tools` feature). Drives W watchers, L LISTs/s, G GETs/s and a
//! writer making E changes/s against the proxy and then, with the same load, against the direct
//! upstream, and reports both side by side: latency percentiles per request kind, throughput,
//! watch delivery lag, lost / duplicated / reordered events (the run fails if any), errors by
//! status, requests that reached the upstream, and the measured process's CPU seconds, CPU per
//! watch delivery and per MB listed, and peak RSS.
//!
//! Targets are `http://` or `https://` (verified against `--certificate-authority` and the
//! kubeconfig's CA), spoken to in HTTP/1.1 or, with `--http2`, h2 (ALPN over TLS, prior
//! knowledge in the clear), with a bearer token (`--token`, `--token-file`, the kubeconfig's)
//! sent to both. Without `--target` / `--direct` / `--kubeconfig` it starts a simulated
//! apiserver and a proxy in this process: plain HTTP with `--auth=none`, or with `--tls` both on
//! HTTPS and the proxy's delegated authn/authz on (then CPU and RSS are those of the whole
//! process: harness + sim + proxy, so compare the two columns rather than read either alone).
//!
//! Called by the binary (`kube-watchcache-cli`: the `bench` subcommand, `demo`) and by
//! `tests/serving/bench.rs`.
//!
//! # Layout
//!
//! | file | owns |
//! | --- | --- |
//! | `scenario` | the six load shapes, their defaults, the resolved [`Plan`] |
//! | `shards` | the `sharded` scenario's uid shards: selectors, and each pod's shard |
//! | `env` | targets, HTTP clients, the writer's backend, the in-process sim + proxy |
//! | `modes` | external targets or the in-process pair: setup, checks, the two phases |
//! | `phase` | one target's run: open watches → load → drain → settle |
//! | `load` | open-loop LIST / GET drivers and the stamping writer |
//! | `watchers` | watch clients: minimal line parsing, lag, resume |
//! | `track` | per-watcher loss / duplicate / order accounting |
//! | `stats` | lock-free histograms and counters |
//! | `procstat` | `/proc` CPU seconds, RSS, the open-file limit |
//! | `report` | the report structure, terminal table, JSON |
//! | `svg` | the hand-written SVG chart |
//! | `kubeconfig` | server URL, CA, token or client certificate from a kubeconfig |
//! | `tls` | the clients' trust anchors and connector (TLS by scheme, ALPN) |
//! | `certs` | the throwaway CA and serving certificates of `--tls` |
//! | `cluster` | an external cluster's Lease churn and `--cleanup` |
//! | `nodes` | `--node-identities`: a kubelet-like client per node, with its own certificate |
//! | `restart` | `--scenario restart`: its five cases, the restartable upstream and proxies |
//! | `informer` | its clients: client-go's reflector (list, watch, resume, relist on 410) |
//! | `balancer` | its rollout case's TCP round-robin in front of two replicas |
//! | `restart_report` | its report: one column per case, checks, goals |
#![forbid(unsafe_code)]

mod balancer;
mod certs;
mod cluster;
mod env;
mod informer;
mod kubeconfig;
mod load;
mod modes;
mod nodes;
mod parsed;
mod pbwatch;
mod phase;
mod procstat;
pub mod report;
mod restart;
pub mod restart_report;
mod scenario;
mod shards;
mod stats;
mod svg;
mod tls;
mod track;
mod watchers;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use kube_watchcache::config::parse_duration;
pub use report::Report;
pub use restart_report::RestartReport;
pub use scenario::{Plan, Scenario};

/// Flags of `bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// URL of the proxy to measure, http:// or https://, e.g. https://127.0.0.1:8443. Without
    /// --target, --direct and --kubeconfig, a simulated apiserver and a proxy run inside this
    /// process.
    #[arg(long)]
    pub target: Option<String>,
    /// URL of the upstream itself (http:// or https://), measured with the same load after the
    /// proxy; the writer and the seeding write here (else through --target).
    #[arg(long)]
    pub direct: Option<String>,
    /// Take the direct upstream's URL, CA and credentials (token, token file or client
    /// certificate) from this kubeconfig's current context; the token is sent to --target too.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// PEM bundle trusted for https:// targets (both; added to the kubeconfig's CA).
    #[arg(long)]
    pub certificate_authority: Option<PathBuf>,
    /// Bearer token sent to both targets (wins over the kubeconfig's).
    #[arg(long, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// File holding the bearer token sent to both targets.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// In-process only: the sim and the proxy serve HTTPS (a fresh CA, certificates for
    /// 127.0.0.1), the proxy reaches the sim over HTTPS and runs with --auth=upstream (the sim
    /// answers its TokenReviews and SubjectAccessReviews), and the clients send a bearer token.
    #[arg(long, conflicts_with_all = ["target", "direct", "kubeconfig"])]
    pub tls: bool,
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
    /// Lease renewals per second (default 20; 0 = a quiet cluster): the in-process sim renews
    /// its own; against an external cluster the bench renews real `coordination.k8s.io/v1`
    /// Leases `bench-lease-<i>` in namespace `bench-0`, each every ~10 s (200 Leases at 20/s).
    #[arg(long)]
    pub lease_churn: Option<f64>,
    /// Pods created before the run (in 10 namespaces `bench-0..9`).
    #[arg(long)]
    pub objects: Option<usize>,
    /// Approximate size of each pod in bytes.
    #[arg(long)]
    pub object_size: Option<usize>,
    /// Talk HTTP/2 (ALPN h2 over TLS, prior knowledge in the clear; ~100 streams per
    /// connection) instead of HTTP/1.1.
    #[arg(long)]
    pub http2: bool,
    /// Do not create the pods first (external mode, when a previous run made them).
    #[arg(long)]
    pub skip_seed: bool,
    /// External mode: the writer replaces whole pods with PUT, as it did before it used
    /// merge-patches. A real apiserver refuses those (422 "pod updates may not change fields
    /// other than …"); kept to show that such a run fails loudly.
    #[arg(long, hide = true)]
    pub put_writes: bool,
    /// External mode: after the run, delete every pod and Lease the bench made and the
    /// namespaces `bench-0..9` it created (labelled app.kubernetes.io/created-by=
    /// kube-watchcache-bench; namespaces that existed before are kept).
    #[arg(long)]
    pub cleanup: bool,
    /// Node watchers are kubelets: each with a client certificate of its own
    /// (CN=system:node:node-<n>, O=system:nodes), no bearer token, kubelet's protobuf-first
    /// Accept; each node's pods mount a Secret the node GETs (the GETs of the run). In-process
    /// with --tls (the proxy trusts the run's CA with --client-ca-file and caches pods and
    /// secrets), or external with --node-ca-cert and --node-ca-key (a CA the proxy trusts).
    #[arg(long)]
    pub node_identities: bool,
    /// With --node-identities: the nodes ask for JSON only instead of protobuf first (to set a
    /// protobuf delivery's cost beside a JSON one's in the same setup).
    #[arg(long, requires = "node_identities")]
    pub node_json: bool,
    /// CA certificate (PEM) that signs the node certificates of --node-identities (external).
    #[arg(long, requires = "node_ca_key")]
    pub node_ca_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "node_ca_cert")]
    pub node_ca_key: Option<PathBuf>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a chart (latency percentiles, lag over time) as SVG to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// PID of the proxy process, for its CPU seconds (and per delivery, per MB listed) and peak
    /// RSS in the proxy phase (in-process: the whole process is measured).
    #[arg(long)]
    pub proxy_pid: Option<u32>,
    /// PID of the direct upstream (e.g. a `kube-watchcache sim`), measured the same way in the
    /// direct phase (external mode).
    #[arg(long)]
    pub direct_pid: Option<u32>,
    /// `--scenario restart`: which cases to run, e.g. `ade` (default all five, a to e).
    #[arg(long)]
    pub cases: Option<String>,
    /// `--scenario restart` with `--kubeconfig`: a shell command that restarts the apiserver
    /// and returns once it is ready again (the proxies run in this process).
    #[arg(long)]
    pub restart_command: Option<String>,
    /// `--scenario restart`, in-process: how long the restarted sim stays down.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub restart_down: Duration,
    /// `--scenario restart`: the informers' initial backoff (client-go's is 800 ms, doubling to
    /// 37.5× it).
    #[arg(long, default_value = "800ms", value_parser = parse_duration, hide = true)]
    pub informer_backoff: Duration,
}

impl BenchArgs {
    /// Flags with every optional value unset, for programmatic use (tests, `demo`).
    pub fn new(scenario: Scenario, duration: Duration) -> BenchArgs {
        BenchArgs {
            target: None,
            direct: None,
            kubeconfig: None,
            certificate_authority: None,
            token: None,
            token_file: None,
            tls: false,
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
            put_writes: false,
            cleanup: false,
            node_identities: false,
            node_json: false,
            node_ca_cert: None,
            node_ca_key: None,
            json: None,
            svg: None,
            proxy_pid: None,
            direct_pid: None,
            cases: None,
            restart_command: None,
            restart_down: Duration::from_secs(2),
            informer_backoff: Duration::from_millis(800),
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
        let mut plan = Plan::new(self.scenario, s, self.duration, self.http2);
        plan.node_identities = self.node_identities;
        plan
    }
}

/// Runs the harness: prints the table on stdout, writes `--json` / `--svg`, and fails (after
/// reporting) when any watch event was lost, duplicated or reordered.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    if args.scenario == Scenario::Restart {
        return run_restart(&args).await;
    }
    let report = measure(&args).await?;
    kube_watchcache::app::say(&report.table());
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
        for p in &report.problems {
            eprintln!("bench: {p}");
        }
        Err(format!("the run failed: {}", report.problems.join("; ")))
    }
}

/// `--scenario restart`: its own table and JSON; fails when a case lost, duplicated or
/// reordered an event, or left a client away from the upstream's state.
async fn run_restart(args: &BenchArgs) -> Result<(), String> {
    let report = measure_restart(args).await?;
    kube_watchcache::app::say(&report.table());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    if report.problems.is_empty() {
        Ok(())
    } else {
        Err(format!("the run failed: {}", report.problems.join("; ")))
    }
}

/// Runs `--scenario restart` and returns its (checked) report without printing it.
pub async fn measure_restart(args: &BenchArgs) -> Result<RestartReport, String> {
    restart::measure(args).await
}

/// Runs the phases and returns the (checked) report without printing it.
pub async fn measure(args: &BenchArgs) -> Result<Report, String> {
    if args.scenario == Scenario::Restart {
        return Err("--scenario restart has its own report: use measure_restart".into());
    }
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
            let identities = plan.node_identities;
            plan = Plan::new(plan.scenario, plan.sizes.clone(), plan.duration, plan.http2);
            plan.node_identities = identities;
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
        modes::external(args, &plan, &mut report, seq).await?;
    } else {
        modes::in_process(args, &plan, &mut report, seq).await?;
    }
    report.check();
    Ok(report)
}
