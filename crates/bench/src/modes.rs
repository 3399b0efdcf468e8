//! The two ways `bench` runs: against external targets (`--target`, `--direct`,
//! `--kubeconfig`: TLS material and tokens from the flags and the kubeconfig, a first request to
//! each target so a TLS or auth error shows at once, seeding, then the proxy and direct phases
//! with each one's PID measured) or against the in-process sim + proxy (plain, or `--tls` with
//! the proxy's auth on, checked by a request without the token that must get 401).
//!
//! Called by `bench::measure`.

use std::sync::Arc;

use super::env::{self, Backend, Local, Target};
use super::nodes::NodeIdentities;
use super::report::Report;
use super::scenario::Plan;
use super::{cluster, kubeconfig, phase, tls, BenchArgs};
use kube_watchcache::upstream::Credentials;

/// The token of `--token` / `--token-file`, if given.
fn flag_token(args: &BenchArgs) -> Result<Option<String>, String> {
    if let Some(t) = &args.token {
        return Ok(Some(t.trim().to_owned()));
    }
    match &args.token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p).map_err(|e| format!("--token-file {}: {e}", p.display()))?;
            Ok(Some(t.trim().to_owned()).filter(|t| !t.is_empty()))
        }
        None => Ok(None),
    }
}

/// `--target` / `--direct` / `--kubeconfig`: proxy phase, then direct phase.
pub async fn external(args: &BenchArgs, plan: &Plan, report: &mut Report, seq: u64) -> Result<(), String> {
    let roots = match &args.certificate_authority {
        Some(p) => tls::certs_file(p, "--certificate-authority")?,
        None => Vec::new(),
    };
    let mut auth = None;
    // What the node clients of --node-identities trust: the same CAs as the other clients.
    let mut node_roots = roots.clone();
    let (tls, direct_url) = match (&args.direct, &args.kubeconfig) {
        (Some(url), _) => (tls::ClientTls::new(roots)?, Some(trim(url))),
        (None, Some(path)) => {
            let c = kubeconfig::load(path, None)?;
            auth = c.auth;
            node_roots.extend(c.tls.roots.iter().cloned());
            (tls::ClientTls::from_kubeconfig(c.tls, roots)?, Some(c.server))
        }
        (None, None) => (tls::ClientTls::new(roots)?, None),
    };
    if let Some(t) = flag_token(args)? {
        auth = Some(Arc::new(Credentials::token(&t).map_err(|e| format!("--token: {e}"))?));
    }
    let direct = direct_url.map(|base| Target { name: "direct", base, auth: auth.clone() });
    let proxy = args.target.as_ref().map(|u| Target { name: "proxy", base: trim(u), auth: auth.clone() });
    for t in proxy.iter().chain(direct.iter()) {
        tls.check(&t.base)?;
    }
    let write_to = direct.clone().or(proxy.clone()).ok_or("nothing to measure")?;
    let one = env::Clients::one(&tls);
    let backend = Backend::Http(if args.put_writes {
        env::Remote::with_put_writes(write_to, one.clone())
    } else {
        env::Remote::new(write_to, one.clone())
    });
    // Fails fast (with the TLS or HTTP error) instead of after the watch-open timeout.
    for t in proxy.iter().chain(direct.iter()) {
        let req = t.request(http::Method::GET, "/api/v1/pods?limit=1", None).ok_or("bad URL")?;
        env::send(&one, req).await.map_err(|e| format!("{}: {e}", t.name))?;
    }
    if !args.skip_seed {
        eprintln!("creating {} pods of ~{} bytes", plan.sizes.objects, plan.sizes.object_size);
        backend.seed(plan).await?;
    }
    let pid = |p: Option<u32>, phase: &str, flag: &str| match p {
        Some(p) => format!("pid {p} in the {phase} phase"),
        None => format!("not measured in the {phase} phase (give {flag})"),
    };
    report.process = format!(
        "{}; {}",
        pid(args.proxy_pid, "proxy", "--proxy-pid"),
        pid(args.direct_pid, "direct", "--direct-pid")
    );
    let nodes = match (&args.node_ca_cert, &args.node_ca_key) {
        (Some(cert), Some(key)) if plan.node_identities => {
            let issuer = super::certs::issuer_from_files(cert, key)?;
            eprintln!("making {} node certificates", plan.nodes);
            Some(NodeIdentities::new(&issuer, &node_roots, plan.nodes, plan.http2, args.node_json)?)
        }
        _ if plan.node_identities => {
            return Err(
                "--node-identities against external targets needs --node-ca-cert and --node-ca-key".into()
            )
        }
        _ => None,
    };
    let mut seq = seq;
    for target in [proxy, direct].into_iter().flatten() {
        let is_proxy = target.name == "proxy";
        let metrics = is_proxy.then(|| env::Remote::new(target.clone(), one.clone()));
        let phase = phase::Phase {
            plan,
            upstream: match &metrics {
                Some(m) => phase::UpstreamCount::ProxyMetrics(m.clone()),
                None => phase::UpstreamCount::Unknown,
            },
            proxy_metrics: metrics,
            target,
            backend: backend.clone(),
            seq_base: seq,
            measure: if is_proxy { args.proxy_pid } else { args.direct_pid }.map(Some),
            measure_upstream: if is_proxy { args.direct_pid } else { None },
            tls: tls.clone(),
            nodes: nodes.clone(),
        };
        let (r, next) = phase.run().await?;
        seq = next;
        report.targets.push(r);
    }
    if args.cleanup {
        let Backend::Http(remote) = &backend else { return Ok(()) };
        eprintln!("cleaning up: the bench's pods and Leases, then the namespaces it created");
        match cluster::cleanup(plan, remote.clone()).await {
            Ok(c) => eprintln!(
                "cleanup: deleted {} pods, {} Leases, namespaces [{}] (namespaces the bench did not create are kept)",
                c.pods,
                c.leases,
                c.namespaces.join(", ")
            ),
            Err(e) => report.problems.push(format!("cleanup failed: {e}")),
        }
    }
    Ok(())
}

/// The in-process sim and proxy (plain, or `--tls` with auth on): proxy phase, then direct.
pub async fn in_process(args: &BenchArgs, plan: &Plan, report: &mut Report, seq: u64) -> Result<(), String> {
    eprintln!(
        "starting a simulated apiserver with {} pods of ~{} bytes and a proxy{}",
        plan.sizes.objects,
        plan.sizes.object_size,
        if args.tls { " (HTTPS, auth on)" } else { "" }
    );
    let local = Local::start(plan, args.tls).await?;
    let result = in_process_run(args, plan, report, seq, &local).await;
    local.shutdown().await;
    result
}

async fn in_process_run(
    args: &BenchArgs,
    plan: &Plan,
    report: &mut Report,
    seq: u64,
    local: &Local,
) -> Result<(), String> {
    let roots = match &local.secure {
        Some((pki, _)) => tls::certs_file(&pki.ca, "the bench CA")?,
        None => Vec::new(),
    };
    let nodes = match (&local.secure, plan.node_identities) {
        (Some((pki, _)), true) => {
            eprintln!("making {} node certificates", plan.nodes);
            Some(NodeIdentities::new(&pki.issuer, &roots, plan.nodes, plan.http2, args.node_json)?)
        }
        (None, true) => return Err("--node-identities in-process needs --tls".into()),
        _ => None,
    };
    let tls = tls::ClientTls::new(roots)?;
    let [proxy, direct] = local.targets();
    let one = env::Clients::one(&tls);
    if local.secure.is_some() {
        // The proxy's auth must really be on: a request without the token is refused.
        let anonymous = Target { auth: None, ..proxy.clone() };
        let req = anonymous.request(http::Method::GET, "/api/v1/pods?limit=1", None).ok_or("bad URL")?;
        match env::send(&one, req).await {
            Err(e) if e.contains("401") => {}
            other => return Err(format!("the proxy's auth is not on: a LIST without a token got {other:?}")),
        }
        report.security = "HTTPS on both targets (throwaway CA); proxy --auth=upstream: a bearer token \
            checked by TokenReview and each read by SubjectAccessReview at the sim, both cached; a request \
            without the token got 401"
            .into();
        if nodes.is_some() {
            report.security.push_str(
                "; node watchers and Secret GETs: a kubelet-like client per node, its own client certificate \
                 (CN=system:node:node-<n>, O=system:nodes), no token, authorized by the sim's Node authorizer",
            );
        }
    }
    report.process = match args.proxy_pid {
        Some(p) => format!("pid {p}"),
        None => "this whole process (harness + sim + proxy)".into(),
    };
    let mut seq = seq;
    for target in [proxy, direct] {
        let metrics = (target.name == "proxy").then(|| env::Remote::new(target.clone(), one.clone()));
        let phase = phase::Phase {
            plan,
            target,
            backend: Backend::Sim(local.sim.sim.clone()),
            seq_base: seq,
            measure: Some(args.proxy_pid),
            // In-process: the sim is this process too, measured already.
            measure_upstream: None,
            upstream: phase::UpstreamCount::Sim(local.sim.sim.clone()),
            tls: tls.clone(),
            proxy_metrics: metrics,
            nodes: nodes.clone(),
        };
        let (r, next) = phase.run().await?;
        seq = next;
        report.targets.push(r);
    }
    Ok(())
}

fn trim(url: &str) -> String {
    url.trim_end_matches('/').to_owned()
}
