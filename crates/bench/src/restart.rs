//! `bench --scenario restart`: what a restart costs the clients, case by case. N informer-like
//! clients (`informer`) list and watch all pods through the case's target while a writer
//! changes pods upstream; a target is restarted mid-run, and the case reports the clients'
//! relists, the LISTs that reached the upstream, the time until every client had the first
//! change written after the restart, and the events lost, duplicated or reordered and the keys
//! that differ from the upstream at the end (ghosts) — the last four must be 0.
//!
//! Cases: (a) the apiserver restarted, clients direct; (b) the apiserver restarted, clients
//! through a proxy; (c) the proxy restarted cold; (d) the proxy restarted with `--state-dir`;
//! (e) two replicas with `--state-dir` and `--goaway-chance` behind a round-robin (`balancer`),
//! restarted one after the other. The proxies always run in this process; the upstream is the
//! in-process sim (restarted by `SimHandle::restart`, its storage kept) or an external apiserver
//! (`--kubeconfig`, restarted by `--restart-command`, a shell command that returns once it is
//! back).
//!
//! Called by `bench::run`; its report is `restart_report`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Method;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::balancer::Balancer;
use super::env::{self, Backend, HttpClient, Remote, Target};
use super::informer::{self, Informer, Store};
use super::restart_report::{CaseReport, RestartReport};
use super::scenario::Plan;
use super::{kubeconfig, procstat, tls, BenchArgs};
use kube_watchcache::app::{self, Running};
use kube_watchcache::config::ServeArgs;
use kube_watchcache::upstream::Credentials;
use kube_watchcache_sim::{Sim, SimHandle, SimOptions};

/// The five cases, by letter.
pub const CASES: [(char, &str); 5] = [
    ('a', "apiserver restarted, clients direct"),
    ('b', "apiserver restarted, clients through the proxy"),
    ('c', "proxy restarted cold"),
    ('d', "proxy restarted with --state-dir"),
    ('e', "two replicas (--state-dir, --goaway-chance) rolled one after the other"),
];

/// Case (e): the least time between one replica ready again and the next one's restart.
const ROLLOUT_PAUSE: Duration = Duration::from_millis(1200);

/// The upstream: the in-process sim, or an external apiserver.
enum Upstream {
    Sim(Option<SimHandle>),
    External { kubeconfig: PathBuf, restart_command: String },
}

/// Everything the cases share.
struct Ctx {
    plan: Plan,
    upstream: Mutex<Upstream>,
    direct: Target,
    backend: Backend,
    tls: tls::ClientTls,
    one: HttpClient,
    informer: informer::Options,
    /// The writer's next sequence number (across cases).
    seq: AtomicU64,
    /// How long a restarted sim stays down.
    down: Duration,
    http2: bool,
}

/// Runs the scenario and returns its (checked) report.
pub async fn measure(args: &BenchArgs) -> Result<RestartReport, String> {
    let plan = args.plan();
    let clients = plan.sizes.watchers;
    if let Some(soft) = procstat::raise_fd_limit(3 * clients as u64 + 1024) {
        if soft < 3 * clients as u64 + 1024 {
            return Err(format!(
                "{clients} clients need about {} open files but the limit is {soft}: raise it with `ulimit -n`",
                3 * clients + 1024
            ));
        }
    }
    let cases: Vec<char> = match &args.cases {
        Some(c) => c.chars().filter(|c| c.is_ascii_alphabetic()).collect(),
        None => CASES.iter().map(|(c, _)| *c).collect(),
    };
    if let Some(bad) = cases.iter().find(|c| !CASES.iter().any(|(k, _)| k == *c)) {
        return Err(format!("--cases: no case {bad:?} (a to e)"));
    }
    let external = args.kubeconfig.is_some();
    let ctx = if let Some(path) = &args.kubeconfig {
        let restart_command = args
            .restart_command
            .clone()
            .ok_or("--scenario restart against --kubeconfig needs --restart-command (restarts the apiserver, returns once it is back)")?;
        let c = kubeconfig::load(path, None)?;
        let roots = match &args.certificate_authority {
            Some(p) => tls::certs_file(p, "--certificate-authority")?,
            None => Vec::new(),
        };
        let tls = tls::ClientTls::from_kubeconfig(c.tls, roots)?;
        let mut auth = c.auth;
        if let Some(t) = &args.token {
            auth = Some(Arc::new(Credentials::token(t).map_err(|e| format!("--token: {e}"))?));
        }
        let direct = Target { name: "direct", base: c.server.trim_end_matches('/').to_owned(), auth };
        let one = env::Clients::one(&tls);
        let backend = Backend::Http(Remote::new(direct.clone(), one.clone()));
        let upstream = Upstream::External { kubeconfig: path.clone(), restart_command };
        Ctx::new(plan, upstream, direct, backend, tls, one, args)
    } else {
        let events = (plan.sizes.events_per_sec * plan.duration.as_secs_f64() * 8.0) as usize;
        let opts = SimOptions {
            compaction_window: plan.sizes.objects * 2 + events + 100_000,
            lease_churn_per_sec: plan.sizes.lease_churn_per_sec,
            ..SimOptions::default()
        };
        let sim = Sim::start(opts).await.map_err(|e| format!("sim: {e}"))?;
        let tls = tls::ClientTls::new(Vec::new())?;
        let direct = Target { name: "direct", base: format!("http://{}", sim.addr), auth: None };
        let one = env::Clients::one(&tls);
        let backend = Backend::Sim(sim.sim.clone());
        Ctx::new(plan, Upstream::Sim(Some(sim)), direct, backend, tls, one, args)
    };
    let mut report = RestartReport {
        mode: if external { "external" } else { "in-process" }.into(),
        upstream: ctx.direct.base.clone(),
        clients,
        objects: ctx.plan.sizes.objects,
        object_size: ctx.plan.sizes.object_size,
        events_per_sec: ctx.plan.sizes.events_per_sec,
        seconds_per_case: ctx.plan.duration.as_secs_f64(),
        ..RestartReport::default()
    };
    let result = run_cases(&ctx, &cases, args, &mut report).await;
    let upstream = std::mem::replace(&mut *ctx.upstream.lock(), Upstream::Sim(None));
    if let Upstream::Sim(Some(sim)) = upstream {
        sim.shutdown().await;
    }
    result?;
    report.check();
    Ok(report)
}

impl Ctx {
    fn new(
        plan: Plan,
        upstream: Upstream,
        direct: Target,
        backend: Backend,
        tls: tls::ClientTls,
        one: HttpClient,
        args: &BenchArgs,
    ) -> Ctx {
        let informer = informer::Options {
            backoff: args.informer_backoff,
            objects: plan.sizes.objects,
            lists_at_once: Arc::new(tokio::sync::Semaphore::new(informer::LISTS_AT_ONCE)),
        };
        Ctx {
            plan,
            upstream: Mutex::new(upstream),
            direct,
            backend,
            tls,
            one,
            informer,
            seq: AtomicU64::new(1),
            down: args.restart_down,
            http2: args.http2,
        }
    }
}

async fn run_cases(
    ctx: &Ctx,
    cases: &[char],
    args: &BenchArgs,
    report: &mut RestartReport,
) -> Result<(), String> {
    if !args.skip_seed {
        eprintln!("creating {} pods of ~{} bytes", ctx.plan.sizes.objects, ctx.plan.sizes.object_size);
        ctx.backend.seed(&ctx.plan).await?;
    }
    for &case in cases {
        let title = CASES.iter().find(|(c, _)| *c == case).map(|(_, t)| *t).unwrap_or("");
        eprintln!("case ({case}) {title}: {} clients", ctx.plan.sizes.watchers);
        let r = run_case(ctx, case).await.map_err(|e| format!("case ({case}): {e}"))?;
        eprintln!(
            "case ({case}): {} client relists, {} upstream LISTs, back at the truth after {}, lost {} dup {} reordered {} ghosts {}",
            r.client_relists,
            r.upstream_lists,
            r.recovery_seconds.map(|s| format!("{s:.1} s")).unwrap_or_else(|| "never".into()),
            r.lost,
            r.duplicated,
            r.out_of_order,
            r.ghosts
        );
        report.cases.push(r);
    }
    Ok(())
}

/// The proxy's counters the report reads: full upstream lists (initial sync and relists),
/// forwarded requests, consistency checks.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    relists: u64,
    forwarded: u64,
    checks: u64,
}

impl std::ops::Add for Counters {
    type Output = Counters;
    fn add(self, o: Counters) -> Counters {
        Counters {
            relists: self.relists + o.relists,
            forwarded: self.forwarded + o.forwarded,
            checks: self.checks + o.checks,
        }
    }
}

/// Sum of every sample of `name` in a Prometheus text body.
pub fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with('{') || r.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// One proxy replica, restartable on the same port and state directory.
struct Replica {
    args: ServeArgs,
    running: Option<Running>,
    /// Counters of the instances already stopped.
    past: Counters,
}

impl Replica {
    async fn start(ctx: &Ctx, state_dir: Option<&Path>, goaway: bool) -> Result<Replica, String> {
        let mut flags = match &*ctx.upstream.lock() {
            Upstream::Sim(_) => vec![format!("--upstream={}", ctx.direct.base)],
            Upstream::External { kubeconfig, .. } => vec![format!("--kubeconfig={}", kubeconfig.display())],
        };
        flags.extend([
            "--resources=pods".to_owned(),
            "--insecure-listen=127.0.0.1:0".into(),
            "--auth=none".into(),
            "--max-watches-per-user=0".into(),
        ]);
        if let Some(d) = state_dir {
            flags.push(format!("--state-dir={}", d.display()));
        }
        if goaway {
            flags.push("--goaway-chance=0.02".into());
        }
        let mut args = ServeArgs::from_flags(&flags).map_err(|e| format!("the proxy's flags: {e}"))?;
        args.history_window = Duration::from_secs(600);
        args.history_max_events = args.history_max_events.max(102_400);
        args.shutdown_grace_period = Duration::from_secs(2);
        let running = start(&args).await?;
        // Restarts listen where the clients already connect.
        args.insecure_listen = Some(running.addr);
        Ok(Replica { args, running: Some(running), past: Counters::default() })
    }

    fn addr(&self) -> Option<SocketAddr> {
        self.running.as_ref().map(|r| r.addr)
    }

    async fn counters(&self, client: &HttpClient) -> Counters {
        let Some(addr) = self.addr() else { return self.past };
        let t = Target { name: "proxy", base: format!("http://{addr}"), auth: None };
        let text = match t.request(Method::GET, kube_watchcache::server::health::METRICS_PATH, None) {
            Some(req) => env::send(client, req).await.map(|b| String::from_utf8_lossy(&b).into_owned()),
            None => Err("bad URL".into()),
        }
        .unwrap_or_default();
        self.past
            + Counters {
                relists: metric_sum(&text, "watchcache_relists_total"),
                forwarded: metric_sum(&text, "watchcache_forwarded_requests_total"),
                checks: metric_sum(&text, "watchcache_consistency_checks_total"),
            }
    }

    /// Stops (as on SIGTERM: watches ended, state written) and starts again.
    async fn restart(&mut self, client: &HttpClient) -> Result<(), String> {
        self.past = self.counters(client).await;
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
        self.running = Some(start(&self.args).await?);
        Ok(())
    }

    async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
    }
}

async fn start(args: &ServeArgs) -> Result<Running, String> {
    // The port of a replica that just stopped may take a moment to be free again.
    let mut tries = 0;
    let running = loop {
        match app::start(args).await {
            Ok(r) => break r,
            Err(e) if tries >= 50 || !e.contains("in use") => return Err(format!("proxy: {e}")),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    if !running.wait_ready(Duration::from_secs(600)).await {
        return Err("the proxy did not become ready within 600 s".into());
    }
    Ok(running)
}

/// A temporary state directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<TempDir, String> {
        let p = std::env::temp_dir().join(format!(
            "kube-watchcache-bench-{tag}-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the writer did: (seq, pod index, when) of every change that succeeded.
#[derive(Default)]
struct WriterLog {
    changes: Vec<(u64, usize, Instant)>,
    failed: u64,
}

async fn writer(ctx: &Ctx, log: &Mutex<WriterLog>, mut stop: watch::Receiver<bool>) {
    let rate = ctx.plan.sizes.events_per_sec.max(0.1);
    let every = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => {},
            _ = stop.wait_for(|s| *s) => return,
        }
        let seq = ctx.seq.fetch_add(1, Relaxed);
        let i = (seq as usize) % ctx.plan.sizes.objects.max(1);
        let sent = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let obj = env::pod(&ctx.plan, i, seq, sent);
        match ctx.backend.write(obj, false).await {
            Ok(()) => log.lock().changes.push((seq, i, Instant::now())),
            Err(_) => log.lock().failed += 1,
        }
    }
}

/// The upstream's pods now (a consistent LIST, paginated), as an informer's store.
async fn truth(ctx: &Ctx) -> Result<(Store, u64), String> {
    let inf = Informer::new(0, ctx.plan.sizes.objects);
    prime_from(ctx, &ctx.direct, &inf, "").await?;
    let s = inf.state.lock();
    Ok((s.store.clone(), s.tracker.last_rv()))
}

/// One list of the target (RV `rv`, pages of 500) into `inf`.
async fn prime_from(ctx: &Ctx, target: &Target, inf: &Informer, rv: &str) -> Result<(), String> {
    let (tx, rx) = watch::channel(false);
    let r = informer::list_once(inf, &ctx.one, target, rv, &ctx.informer, rx).await;
    drop(tx);
    r.map_err(|e| format!("LIST of {}: {e}", target.base))
}

async fn run_case(ctx: &Ctx, case: char) -> Result<CaseReport, String> {
    let title = CASES.iter().find(|(c, _)| *c == case).map(|(_, t)| t.to_string()).unwrap_or_default();
    // The targets.
    let dirs = match case {
        'd' => vec![TempDir::new("d")?],
        'e' => vec![TempDir::new("e0")?, TempDir::new("e1")?],
        _ => Vec::new(),
    };
    let mut replicas = Vec::new();
    match case {
        'a' => {}
        'b' | 'c' => replicas.push(Replica::start(ctx, None, false).await?),
        'd' => replicas.push(Replica::start(ctx, Some(&dirs[0].0), false).await?),
        _ => {
            for d in &dirs {
                replicas.push(Replica::start(ctx, Some(&d.0), true).await?);
            }
        }
    }
    let balancer = match case {
        'e' => Some(Balancer::start(replicas.iter().filter_map(Replica::addr).collect()).await?),
        _ => None,
    };
    let target = match (&balancer, replicas.first().and_then(Replica::addr)) {
        (Some(b), _) => Target { name: "proxy", base: format!("http://{}", b.addr), auth: None },
        (None, Some(addr)) => Target { name: "proxy", base: format!("http://{addr}"), auth: None },
        (None, None) => ctx.direct.clone(),
    };
    let result = drive(ctx, case, &target, &mut replicas).await;
    for r in &mut replicas {
        r.stop().await;
    }
    drop(balancer);
    drop(dirs);
    let mut r = result?;
    r.case = case.to_string();
    r.title = title;
    Ok(r)
}

async fn drive(
    ctx: &Ctx,
    case: char,
    target: &Target,
    replicas: &mut [Replica],
) -> Result<CaseReport, String> {
    let n = ctx.plan.sizes.watchers;
    let base = ctx.seq.load(Relaxed);
    // The informers' first list, made once and given to each (it is not what is measured: the
    // restart is); each then watches from its RV as client-go would after listing.
    let first = Informer::new(base, ctx.plan.sizes.objects);
    prime_from(ctx, target, &first, "0").await?;
    let informers: Vec<Arc<Informer>> = (0..n).map(|_| Arc::new(first.clone_synced(base))).collect();
    let clients = env::Clients::new(&ctx.tls, ctx.http2, n);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, inf) in informers.iter().enumerate() {
        let (inf, client, t, o, s) =
            (inf.clone(), clients.pick(i).clone(), target.clone(), ctx.informer.clone(), stop_rx.clone());
        tasks.spawn(informer::run(inf, client, t, o, s));
    }
    // Every watch open before the clock starts.
    let opened =
        wait_until(Duration::from_secs(300), || informers.iter().all(|i| i.watch_opens.load(Relaxed) > 0))
            .await;
    if !opened {
        let _ = stop_tx.send(true);
        return Err("the clients' watches did not all open within 300 s".into());
    }
    let log = Arc::new(Mutex::new(WriterLog::default()));
    let (wstop_tx, wstop_rx) = watch::channel(false);
    let writer_task = {
        let log = log.clone();
        // The writer borrows the context: run it here, joined below.
        async move { writer(ctx, &log, wstop_rx).await }
    };
    let pre = ctx.plan.duration / 3;
    let body = async {
        tokio::time::sleep(pre).await;
        // What the restart costs is counted from here: relists and LISTs before it (a client
        // whose first watch met a replica that had listed later than its RV) are not its.
        let upstream_before = upstream_count(ctx, case, replicas, &informers).await;
        for inf in &informers {
            inf.relists.store(0, Relaxed);
            inf.relist_reasons.lock().clear();
        }
        let t0 = Instant::now();
        match case {
            'a' | 'b' => restart_upstream(ctx).await?,
            _ => {
                for (k, r) in replicas.iter_mut().enumerate() {
                    if k > 0 {
                        // A rollout waits between replicas (a Deployment's minReadySeconds):
                        // the clients that moved over have watched a while by the next restart.
                        tokio::time::sleep(ROLLOUT_PAUSE.max(ctx.plan.duration / 10)).await;
                    }
                    r.restart(&ctx.one).await?;
                }
            }
        }
        let restart_seconds = t0.elapsed().as_secs_f64();
        let back = Instant::now();
        // The first change written after the target was back, and when every client had it.
        let deadline = Duration::from_secs(600).max(ctx.plan.duration * 4);
        let mut first_after: Option<(u64, usize)> = None;
        let recovered = wait_until(deadline, || {
            if first_after.is_none() {
                first_after = log.lock().changes.iter().find(|c| c.2 >= back).map(|c| (c.0, c.1));
            }
            let Some((seq, i)) = first_after else { return false };
            informers.iter().all(|inf| Informer::got(&inf.state.lock(), seq, i))
        })
        .await;
        let recovery = recovered.then(|| t0.elapsed().as_secs_f64());
        let rest = ctx.plan.duration.saturating_sub(pre + t0.elapsed());
        tokio::time::sleep(rest).await;
        Ok::<_, String>((restart_seconds, recovery, upstream_before))
    };
    let (timing, ()) = tokio::join!(
        async {
            let r = body.await;
            let _ = wstop_tx.send(true);
            r
        },
        writer_task
    );
    let (restart_seconds, recovery_seconds, upstream_before) = timing.inspect_err(|_| {
        let _ = stop_tx.send(true);
    })?;
    // Settle: every client at the upstream's state once the writer stopped.
    let (truth, _) = truth(ctx).await?;
    wait_until(Duration::from_secs(120), || {
        informers.iter().all(|i| i.state.lock().store.differences(&truth) == 0)
    })
    .await;
    let upstream_after = upstream_count(ctx, case, replicas, &informers).await;
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    let log = log.lock();
    let mut r = CaseReport {
        clients: n,
        restart_seconds,
        recovery_seconds,
        changes_written: log.changes.len() as u64,
        writes_failed: log.failed,
        ..CaseReport::default()
    };
    for inf in &informers {
        let relists = inf.relists.load(Relaxed);
        r.client_relists += relists;
        r.clients_relisted += u64::from(relists > 0);
        for (why, n) in inf.relist_reasons.lock().iter() {
            *r.relist_reasons.entry(why.clone()).or_default() += n;
        }
        let s = inf.state.lock();
        r.lost += log.changes.iter().filter(|&&(seq, i, _)| !Informer::got(&s, seq, i)).count() as u64;
        r.duplicated += s.tracker.duplicated;
        r.out_of_order += s.tracker.out_of_order;
        r.ghosts += s.store.differences(&truth) as u64;
    }
    let (before, after) = (upstream_before, upstream_after);
    r.upstream_lists = after.relists.saturating_sub(before.relists);
    r.upstream_forwarded = after.forwarded.saturating_sub(before.forwarded);
    r.consistency_checks = after.checks.saturating_sub(before.checks);
    Ok(r)
}

/// Case (a): the clients' own LIST requests (all reach the upstream); otherwise the proxies'
/// counters.
async fn upstream_count(
    ctx: &Ctx,
    case: char,
    replicas: &[Replica],
    informers: &[Arc<Informer>],
) -> Counters {
    if case == 'a' {
        let lists = informers.iter().map(|i| i.list_requests.load(Relaxed)).sum();
        return Counters { relists: lists, ..Counters::default() };
    }
    let mut total = Counters::default();
    for r in replicas {
        total = total + r.counters(&ctx.one).await;
    }
    total
}

/// How long `--restart-command` may take (an apiserver's restart takes seconds to a minute).
const RESTART_COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

async fn restart_upstream(ctx: &Ctx) -> Result<(), String> {
    let command = match &*ctx.upstream.lock() {
        Upstream::External { restart_command, .. } => Some(restart_command.clone()),
        Upstream::Sim(_) => None,
    };
    if let Some(command) = command {
        eprintln!("restarting the upstream: {command}");
        // Bounded: a command that hangs fails the run instead of hanging it; it runs in a
        // process group of its own, killed whole (a compound command's children too).
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(&command).stdout(std::process::Stdio::null()).kill_on_drop(true).process_group(0);
        let mut child = cmd.spawn().map_err(|e| format!("--restart-command {command:?}: {e}"))?;
        return match tokio::time::timeout(RESTART_COMMAND_TIMEOUT, child.wait()).await {
            Ok(Ok(s)) if s.success() => Ok(()),
            Ok(Ok(s)) => Err(format!("--restart-command {command:?} exited with {s}")),
            Ok(Err(e)) => Err(format!("--restart-command {command:?}: {e}")),
            Err(_) => {
                let group = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32));
                if let Some(pid) = group {
                    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                }
                Err(format!(
                    "--restart-command {command:?} did not end within {}s (its process group killed)",
                    RESTART_COMMAND_TIMEOUT.as_secs()
                ))
            }
        };
    }
    let sim = match std::mem::replace(&mut *ctx.upstream.lock(), Upstream::Sim(None)) {
        Upstream::Sim(Some(sim)) => sim,
        _ => return Err("the sim is gone".into()),
    };
    let sim = sim.restart(ctx.down).await.map_err(|e| format!("restarting the sim: {e}"))?;
    *ctx.upstream.lock() = Upstream::Sim(Some(sim));
    Ok(())
}

/// Polls `done` every 20 ms until it holds (true) or `timeout` passes (false).
async fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_read_every_sample_of_one_name() {
        let text = "# HELP x\nwatchcache_relists_total{resource=\"pods\"} 2\nwatchcache_relists_total{resource=\"secrets\"} 1\nwatchcache_relists_total_other 9\n";
        assert_eq!(metric_sum(text, "watchcache_relists_total"), 3);
        assert_eq!(metric_sum(text, "watchcache_forwarded_requests_total"), 0);
    }
}
