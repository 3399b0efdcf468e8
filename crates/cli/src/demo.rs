//! `kube-watchcache demo`: the simulated apiserver with sample objects and churn, the proxy in
//! front of it, an optional short benchmark of both, and commands to try. Called by `main`
//! (with the `tools` feature); uses the core's `app` (the proxy), the sim crate and the harness
//! crate, none of which uses it.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use kube_watchcache::app::{say, start, wait_for_signal};
use kube_watchcache::cache::Reader;
use kube_watchcache::config::{parse_duration, ServeArgs};

/// Flags of `demo`.
#[derive(Debug, Args, Clone)]
pub struct DemoArgs {
    /// Address of the proxy (plain HTTP, loopback).
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub listen: SocketAddr,
    /// Address of the simulated apiserver (plain HTTP, loopback).
    #[arg(long, default_value = "127.0.0.1:8002")]
    pub sim_listen: SocketAddr,
    /// Sample objects in the simulated apiserver.
    #[arg(long, default_value_t = 200)]
    pub objects: usize,
    /// Random updates per second in the simulated apiserver.
    #[arg(long, default_value_t = 2.0)]
    pub churn: f64,
    /// Lease renewals per second in the simulated apiserver (node heartbeats, not cached).
    #[arg(long, default_value_t = 20.0)]
    pub lease_churn: f64,
    /// Stop after this long instead of waiting for Ctrl-C (e.g. `30s`).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Length of the short benchmark (proxy vs direct, per side) run before the prompt; 0 skips it.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub bench: Duration,
}

/// `kube-watchcache demo`.
pub async fn run(args: DemoArgs) -> Result<(), String> {
    let opts = kube_watchcache_sim::SimOptions {
        listen: args.sim_listen,
        objects: args.objects,
        churn_per_sec: args.churn,
        lease_churn_per_sec: args.lease_churn,
        ..Default::default()
    };
    let sim = kube_watchcache_sim::Sim::start(opts)
        .await
        .map_err(|e| format!("sim: listen on {}: {e}", args.sim_listen))?;
    let mut serve_args = ServeArgs::local(
        &format!("http://{}", sim.addr),
        &["pods", "configmaps", "nodes", "example.com/widgets"],
        args.listen,
    );
    serve_args.shutdown_grace_period = Duration::from_secs(5);
    let proxy = start(&serve_args).await?;
    if !proxy.wait_ready(Duration::from_secs(30)).await {
        return Err("the proxy did not sync from the simulated apiserver within 30 s".into());
    }
    if !args.bench.is_zero() {
        say("A short benchmark: the same load against the proxy, then directly against the simulated apiserver.");
        let mut b = kube_watchcache_bench::BenchArgs::new(kube_watchcache_bench::Scenario::Mixed, args.bench);
        b.target = Some(format!("http://{}", proxy.addr));
        b.direct = Some(format!("http://{}", sim.addr));
        b.watchers = Some(120);
        b.objects = Some(500);
        b.lists_per_sec = Some(2.0);
        b.gets_per_sec = Some(20.0);
        b.events_per_sec = Some(10.0);
        if let Err(e) = kube_watchcache_bench::run(b).await {
            eprintln!("benchmark: {e}");
        }
    }
    let kubeconfig =
        write_demo_kubeconfig(proxy.addr).map_err(|e| format!("writing the demo kubeconfig: {e}"))?;
    let p = proxy.addr;
    let objects: usize = proxy.readers().iter().map(Reader::len).sum();
    say(&format!(
        r#"
kube-watchcache demo
  simulated apiserver  http://{sim}   ({objects} objects, {churn} updates/s, {leases} lease renewals/s)
  proxy                http://{p}    caching pods, configmaps, nodes, example.com/widgets

Try (served from the cache):
  curl -s 'http://{p}/api/v1/configmaps?resourceVersion=0' | head -c 600; echo
  curl -s 'http://{p}/api/v1/namespaces/ns-0/pods?resourceVersion=0&labelSelector=app%3Dapp-1'
  curl -sN 'http://{p}/api/v1/namespaces/ns-0/configmaps?watch=1&resourceVersion=0&allowWatchBookmarks=true'
  kubectl --kubeconfig {kc} get configmaps -A -w --output-watch-events
Forwarded upstream unchanged (writes, discovery):
  curl -s -XPOST -H 'Content-Type: application/json' 'http://{p}/api/v1/namespaces/ns-0/configmaps' \
       -d '{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"hello"}},"data":{{"k":"v"}}}}'
  kubectl --kubeconfig {kc} apply --validate=false -f - <<< '{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"demo","namespace":"ns-0"}}}}'
Health and metrics:
  curl -s http://{p}/readyz; curl -s http://{p}/watchcache/metrics | grep watchcache_
Stop with Ctrl-C."#,
        sim = sim.addr,
        churn = args.churn,
        leases = args.lease_churn,
        kc = kubeconfig.display(),
    ));
    match args.duration {
        Some(d) => tokio::select! {
            _ = tokio::time::sleep(d) => {},
            _ = wait_for_signal() => {},
        },
        None => wait_for_signal().await,
    }
    proxy.shutdown().await;
    sim.shutdown().await;
    Ok(())
}

fn write_demo_kubeconfig(addr: SocketAddr) -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join("kube-watchcache-demo");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: demo\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: demo\n  context:\n    cluster: demo\n    user: demo\ncurrent-context: demo\nusers:\n- name: demo\n  user: {{}}\n"
        ),
    )?;
    Ok(path)
}
