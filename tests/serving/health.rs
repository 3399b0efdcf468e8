//! The health endpoints (issue 24 item 2, issue 21): the apiserver's format (`?verbose`,
//! `?exclude`, per-check paths), the proxy's own checks, and the detail (resource names,
//! upstream error text) only for callers allowed to see it.

use crate::common;

use std::time::Duration;

use common::fault::Fault;
use common::{send, serve_args, Resp};
use http::{Method, StatusCode};
use kube_watchcache::app;
use kube_watchcache_sim::{AuthScript, Rule, ScriptUser, Sim, SimOptions};

fn body(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

async fn get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> Resp {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    send(&common::client(), Method::GET, &format!("http://{addr}{path}"), None, &headers).await
}

/// A trusted sidecar (`--auth=none`) sees every check.
#[tokio::test]
async fn verbose_exclude_and_per_check_paths_as_the_apiserver() {
    let env = common::start().await;
    let addr = env.proxy.addr;
    assert_eq!(body(&get(addr, "/healthz", None).await), "ok");
    assert_eq!(body(&get(addr, "/livez?verbose", None).await), "[+]ping ok\nlivez check passed\n");
    let r = get(addr, "/readyz?verbose=1", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        body(&r),
        "[+]ping ok\n[+]shutdown ok\n[+]upstream ok\n[+]cache/configmaps ok\n[+]cache/nodes ok\n[+]cache/pods ok\n\
         [+]cache/widgets.example.com ok\nreadyz check passed\n"
    );
    let r = get(addr, "/readyz?verbose&exclude=ping&exclude=cache/pods&exclude=nope", None).await;
    let t = body(&r);
    assert!(t.starts_with("[+]ping excluded: ok\n"), "{t}");
    assert!(t.contains("[+]cache/pods excluded: ok\n"), "{t}");
    assert!(t.contains("warn: some health checks cannot be excluded: no matches for \"nope\"\n"), "{t}");
    assert!(t.ends_with("readyz check passed\n"), "{t}");
    assert_eq!(
        (get(addr, "/readyz/ping", None).await.status, body(&get(addr, "/readyz/ping", None).await)),
        (StatusCode::OK, "ok".into())
    );
    assert_eq!(get(addr, "/readyz/cache/configmaps", None).await.status, 200);
    assert_eq!(get(addr, "/readyz/nope", None).await.status, 404);
    assert_eq!(get(addr, "/livez/ping", None).await.status, 200);
}

/// With authentication: a failing /readyz tells anyone only which public check failed; the
/// resource names and reasons go to a caller allowed `get` on the path.
#[tokio::test]
async fn details_only_for_callers_allowed_to_see_them() {
    let sim = Sim::start(SimOptions { objects: 0, ..Default::default() }).await.expect("sim");
    sim.sim.set_auth(
        AuthScript::default()
            .token("ops-token", ScriptUser::new("ops", &[]))
            .token("dev-token", ScriptUser::new("dev", &[]))
            .rule(Rule::paths("ops", &["get"], &["/readyz", "/readyz/*"])),
    );
    // Every LIST of configmaps fails: the cache never syncs.
    let relay = Fault::start(sim.addr).await;
    relay.fail_next_lists(1_000_000);
    let mut args = serve_args(relay.addr, &["configmaps"]);
    args.security.auth = "upstream".into();
    let proxy = app::start(&args).await.expect("proxy starts");
    let addr = proxy.addr;
    let r = get(addr, "/readyz", None).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        body(&r),
        "[+]ping ok\n[+]shutdown ok\n[+]upstream ok\n[-]cache-sync failed: reason withheld\n[+]resources ok\nreadyz check failed\n"
    );
    // Asking for more does not give more to the unauthorized.
    for token in [None, Some("dev-token"), Some("bogus")] {
        let t = body(&get(addr, "/readyz?verbose", token).await);
        assert!(!t.contains("configmaps"), "{token:?}: {t}");
        assert!(t.contains("[-]cache-sync failed: reason withheld"), "{token:?}: {t}");
    }
    assert_eq!(get(addr, "/readyz/cache-sync", None).await.status, 401);
    assert_eq!(get(addr, "/readyz/cache-sync", Some("dev-token")).await.status, 403);
    // The allowed caller sees the detailed checks, their reasons at their own paths only: the
    // root paths withhold them as the apiserver's do (its public-info-viewer role lets every
    // caller `get /readyz`; the reasons carry the upstream's answers to the proxy).
    let t = body(&get(addr, "/readyz?verbose", Some("ops-token")).await);
    assert!(t.contains("[-]cache/configmaps failed: reason withheld\n"), "{t}");
    assert!(!t.contains("not synced"), "{t}");
    let r = get(addr, "/readyz/cache/configmaps", Some("ops-token")).await;
    assert_eq!(
        (r.status, body(&r)),
        (StatusCode::INTERNAL_SERVER_ERROR, "internal server error: cache configmaps not synced\n".into())
    );
    // Probes keep working without credentials.
    assert_eq!(get(addr, "/livez", None).await.status, 200);
    relay.fail_next_lists(0);
    assert!(proxy.wait_ready(Duration::from_secs(20)).await, "synced once the LISTs succeed");
    assert_eq!(body(&get(addr, "/readyz", None).await), "ok");
    proxy.shutdown().await;
}
