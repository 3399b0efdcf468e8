//! `/healthz`, `/livez`, `/readyz` (and their per-check paths) and the proxy's own metrics
//! (`/watchcache/metrics`): answered by the proxy itself, never forwarded. `/metrics` is the
//! apiserver's and is forwarded (issue 24: through the proxy, `kubectl get --raw /metrics`
//! must show the apiserver's metrics).
//!
//! The health endpoints answer as kube-apiserver's (k8s.io/apiserver/pkg/server/healthz,
//! `handleRootHealth` and `adaptCheckToHandler`), with the proxy's own checks:
//! - `ok` when every check passes; with `?verbose`, one `[+]<check> ok` line per check then
//!   `<endpoint> check passed`; `?exclude=<check>` (repeatable) skips a check (`[+]<check>
//!   excluded: ok`) and warns about names that match none;
//! - on a failure, 500 with every check's line and `<endpoint> check failed`;
//! - `/<endpoint>/<check>`: `ok`, or 500 `internal server error: <reason>`; 404 for no such
//!   check.
//!
//! What a caller sees depends on whether it may (`Access`): anyone gets the public checks
//! (`ping`, `shutdown`, `upstream`, `cache-sync`, `resources`) with failure reasons withheld, as
//! the apiserver withholds them on its public endpoints; a caller allowed `get` on the path (or
//! any caller with `--auth=none`) gets one check per cached resource (`cache/<resource>`) and
//! per resource not cached yet (`resource/<name>`), and passing lines for
//! what a wildcard skipped (`skipped/<reason>/<name>`) and what `--cache-memory-limit` stopped
//! caching (`dropped/memory-limit/<resource>`) or cannot parse an object of
//! (`forwarded/unparsable/<resource>`, in place of its `cache/<resource>`). Per-check paths are not
//! public (as in the apiserver, whose public-info-viewer role covers the root paths only). A
//! failure's reason is shown at its per-check path; the root paths withhold it from everyone
//! (the apiserver's `handleRootHealth`: the public role lets every caller `get /readyz`, and
//! the reasons carry the upstream's answers to the proxy's own requests) but with `--auth=none`.
//!
//! Called by `phase::health`, which decides the access, and `phase::authenticate` (the
//! metrics page, through `stack`).

use http::{header, HeaderValue, Request, Response, StatusCode};

use super::body::{self, Body};
use super::{Readiness, Server};

/// Where the proxy serves its own metrics.
pub const METRICS_PATH: &str = "/watchcache/metrics";

/// The three health endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Healthz,
    Livez,
    Readyz,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Healthz => "healthz",
            Endpoint::Livez => "livez",
            Endpoint::Readyz => "readyz",
        }
    }
}

/// A health request: its endpoint and, for `/<endpoint>/<check>`, the check.
pub fn route(path: &str) -> Option<(Endpoint, Option<&str>)> {
    let rest = path.strip_prefix('/')?;
    let (root, check) = match rest.split_once('/') {
        Some((r, c)) => (r, Some(c)),
        None => (rest, None),
    };
    let e = match root {
        "healthz" => Endpoint::Healthz,
        "livez" => Endpoint::Livez,
        "readyz" => Endpoint::Readyz,
        _ => return None,
    };
    Some((e, check))
}

/// Whether the caller may see the detailed checks and their reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The public checks, reasons withheld.
    Public,
    /// A caller allowed `get` on the path: the detailed checks; their reasons at a per-check
    /// path only (the root paths withhold them, as the apiserver's `handleRootHealth` does:
    /// its `system:public-info-viewer` role lets every caller, even anonymous, `get /readyz`,
    /// and the reasons carry the upstream's answers to the proxy's own requests).
    Detailed,
    /// `--auth=none` (everyone is trusted): the detailed checks with their reasons everywhere.
    Unsecured,
}

/// One check's outcome: `None` when it passes, else why not.
struct Check {
    name: String,
    failure: Option<String>,
}

fn check(name: impl Into<String>, failure: Option<String>) -> Check {
    Check { name: name.into(), failure }
}

/// The checks of `e`, as `access` may see them.
fn checks(server: &Server, e: Endpoint, access: Access) -> Vec<Check> {
    let st = if e == Endpoint::Readyz { server.readiness() } else { Readiness::default() };
    checks_of(&st, e, access)
}

/// The checks of `e` from the readiness `st`.
fn checks_of(st: &Readiness, e: Endpoint, access: Access) -> Vec<Check> {
    let mut out = vec![check("ping", None)];
    if e != Endpoint::Readyz {
        return out;
    }
    out.push(check("shutdown", st.shutting_down.then(|| "the server is shutting down".to_owned())));
    let stale: Vec<String> = st.stale.iter().map(|(gr, why)| format!("cache {gr} stale: {why}")).collect();
    out.push(check("upstream", st.upstream_away().then(|| stale.join("; "))));
    // Relisting after a first sync: answered meanwhile, never blocking (`Readiness::blocking`).
    let blocks = |gr: &String, synced: bool| !synced && !st.resyncing.contains(gr);
    match access {
        Access::Public => {
            let unsynced: Vec<&str> = st
                .caches
                .iter()
                .filter(|(gr, synced)| blocks(gr, *synced))
                .map(|(gr, _)| gr.as_str())
                .collect();
            out.push(check(
                "cache-sync",
                (!unsynced.is_empty()).then(|| format!("caches not synced: {}", unsynced.join(", "))),
            ));
            let missing: Vec<String> =
                st.missing.iter().map(|(n, why)| format!("resource {n} not cached yet: {why}")).collect();
            out.push(check("resources", (!missing.is_empty()).then(|| missing.join("; "))));
        }
        Access::Detailed | Access::Unsecured => {
            for (gr, synced) in &st.caches {
                let why = st.not_ready.iter().find(|(g, _)| g == gr).map(|(_, w)| format!(": {w}"));
                out.push(check(
                    format!("cache/{gr}"),
                    blocks(gr, *synced).then(|| format!("cache {gr} not synced{}", why.unwrap_or_default())),
                ));
            }
            // Relisting after a first sync, or stale while others are not: answered (429 while
            // relisting, forwarded while stale), never blocking: passing, named.
            for gr in &st.resyncing {
                out.push(check(format!("relisting/{gr}"), None));
            }
            if !st.upstream_away() {
                for (gr, _) in &st.stale {
                    out.push(check(format!("forwarded/stale/{gr}"), None));
                }
            }
            for (name, why) in &st.missing {
                out.push(check(
                    format!("resource/{name}"),
                    Some(format!("resource {name} not cached yet: {why}")),
                ));
            }
            // What a wildcard skipped, and why (forwarded, never blocking): always passing.
            for (name, reason, _) in &st.skipped {
                out.push(check(format!("skipped/{reason}/{name}"), None));
            }
            // What --cache-memory-limit stopped caching (forwarded, never blocking): passing;
            // the numbers are in the log line and the metrics.
            for (gr, _) in &st.dropped {
                out.push(check(format!("dropped/memory-limit/{gr}"), None));
            }
            // Caches that cannot parse an object (forwarded, never blocking): passing; the
            // error is in the log line and the metrics.
            for (gr, _) in &st.unparsable {
                out.push(check(format!("forwarded/unparsable/{gr}"), None));
            }
        }
    }
    out
}

fn text(code: StatusCode, t: String) -> Response<Body> {
    let mut resp = Response::new(body::full(t));
    *resp.status_mut() = code;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp.headers_mut().insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    resp
}

/// Answers a health request (`route` matched it) for a caller with `access`.
pub fn handle<B>(
    server: &Server,
    req: &Request<B>,
    e: Endpoint,
    sub: Option<&str>,
    access: Access,
) -> Response<Body> {
    let all = checks(server, e, access);
    if let Some(name) = sub {
        return match all.iter().find(|c| c.name == name) {
            None => text(StatusCode::NOT_FOUND, "404 page not found\n".into()),
            Some(Check { failure: None, .. }) => text(StatusCode::OK, "ok".into()),
            Some(Check { failure: Some(why), .. }) => {
                text(StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {why}\n"))
            }
        };
    }
    let query = req.uri().query().unwrap_or("");
    let params: Vec<(String, String)> =
        form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    let mut excluded: std::collections::BTreeSet<String> =
        params.iter().filter(|(k, _)| k == "exclude").map(|(_, v)| v.clone()).collect();
    let verbose = params.iter().any(|(k, _)| k == "verbose");
    let mut lines = String::new();
    let mut failed = Vec::new();
    for c in &all {
        if excluded.remove(&c.name) {
            lines.push_str(&format!("[+]{} excluded: ok\n", c.name));
            continue;
        }
        match &c.failure {
            None => lines.push_str(&format!("[+]{} ok\n", c.name)),
            Some(why) => {
                let shown = if access == Access::Unsecured { why.as_str() } else { "reason withheld" };
                lines.push_str(&format!("[-]{} failed: {shown}\n", c.name));
                failed.push(c);
            }
        }
    }
    if !excluded.is_empty() {
        let names: Vec<String> = excluded.iter().map(|n| format!("{n:?}")).collect();
        lines.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            names.join(",")
        ));
    }
    let name = e.name();
    if !failed.is_empty() {
        // The reasons go to the log in full, as the apiserver logs them.
        let reasons: Vec<String> =
            failed.iter().map(|c| format!("{}: {}", c.name, c.failure.as_deref().unwrap_or(""))).collect();
        tracing::debug!(endpoint = name, failed = %reasons.join("; "), "health check failed");
        // Go's http.Error adds the newline.
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{lines}{name} check failed\n"));
    }
    if !verbose {
        return text(StatusCode::OK, "ok".into());
    }
    text(StatusCode::OK, format!("{lines}{name} check passed\n"))
}

/// The proxy's own metrics (Prometheus text).
pub fn metrics(server: &Server) -> Response<Body> {
    server.metrics().observe_caches(server.readers().iter());
    server.metrics().set_in_flight(server.in_flight());
    let mut resp = Response::new(body::full(server.metrics().render()));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server of these caches alone, with default limits, and its shutdown sender (kept).
    fn server_of(caches: Vec<crate::cache::Reader>) -> (Server, tokio::sync::watch::Sender<bool>) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
        let upstream = crate::server::phase::testing::upstream();
        (Server::new(caches, upstream, Default::default(), metrics, rx, Default::default()), tx)
    }

    /// A cache that met an object it cannot parse forwards its requests: it is named to those
    /// who may see details, and never holds `/readyz` (a bad object would take every replica
    /// out of service).
    #[tokio::test]
    async fn a_cache_that_cannot_parse_an_object_does_not_block_readiness() {
        use crate::server::phase::testing;
        let (mut w, r) = testing::configmaps();
        let (server, _tx) = server_of(vec![r]);
        let names = || {
            checks(&server, Endpoint::Readyz, Access::Detailed)
                .into_iter()
                .map(|c| (c.name, c.failure.is_some()))
                .collect::<Vec<_>>()
        };
        assert!(names().contains(&("cache/configmaps".into(), false)));
        w.unparsable("an object cannot be parsed".into());
        assert_eq!(server.ready(), Ok(()));
        let after = names();
        assert!(after.contains(&("forwarded/unparsable/configmaps".into(), false)), "{after:?}");
        assert!(!after.iter().any(|(n, _)| n == "cache/configmaps"), "{after:?}");
        w.set_not_ready(Some("relisting".into()));
        assert!(server.ready().is_ok(), "a failed list meanwhile keeps it forwarded");
    }

    /// A listed cache relisting (found wrong) keeps the server ready and is named; a cache
    /// restored and never proven by the upstream (`proven_here`) that relists blocks, as a
    /// cold start; once proven (its resumed watch brought a bookmark), it does not.
    #[tokio::test]
    async fn a_listed_cache_relisting_keeps_the_server_ready() {
        use crate::server::phase::testing;
        let (_w, r) = testing::configmaps();
        let (server, _tx) = server_of(vec![r.clone()]);
        r.request_relist(crate::resource::Rv(5), r.lists(), "inconsistent; relisting".into());
        assert!(!r.progress().ready);
        assert_eq!(server.ready(), Ok(()));
        let names: Vec<_> = checks(&server, Endpoint::Readyz, Access::Detailed)
            .into_iter()
            .map(|c| (c.name, c.failure.is_some()))
            .collect();
        assert!(names.contains(&("relisting/configmaps".into(), false)), "{names:?}");
        // Restored, never listed: a cold start's relist blocks.
        let kind = crate::resource::ResourceKind::new("", "v1", "secrets", "Secret", true, true);
        let (mut w2, r2) = crate::cache::new(kind, Default::default());
        w2.restore(Vec::new(), crate::resource::Rv(7), Vec::new(), crate::resource::Rv(7)).unwrap();
        let (server2, _tx2) = server_of(vec![r2.clone()]);
        assert_eq!(server2.ready(), Ok(()), "restored: ready");
        w2.set_not_ready(Some("restored at resourceVersion 7, which the upstream no longer has".into()));
        assert_eq!(server2.ready(), Err(vec!["cache secrets not synced".to_string()]));
        // Restored and proven, then relisting (an apiserver rollout's 410s, hours later).
        let kind = crate::resource::ResourceKind::new("", "v1", "services", "Service", true, true);
        let (mut w3, r3) = crate::cache::new(kind, Default::default());
        w3.restore(Vec::new(), crate::resource::Rv(7), Vec::new(), crate::resource::Rv(7)).unwrap();
        w3.bookmark(crate::resource::Rv(9));
        w3.set_not_ready(Some("relisting".into()));
        let (server3, _tx3) = server_of(vec![r3]);
        assert_eq!(server3.ready(), Ok(()), "proven here: a relist does not block");
    }

    #[test]
    fn detailed_checks_name_every_cache_missing_and_skipped_resource() {
        let st = Readiness {
            caches: vec![("configmaps".into(), true), ("widgets.example.com".into(), false)],
            missing: vec![("apps/deployments".into(), "upstream unreachable".into())],
            skipped: vec![("metrics.k8s.io/v1beta1".into(), "aggregated", "served by an APIService".into())],
            dropped: vec![("secrets".into(), "over --cache-memory-limit".into())],
            ..Readiness::default()
        };
        let names = |a| {
            checks_of(&st, Endpoint::Readyz, a)
                .into_iter()
                .map(|c| (c.name, c.failure.is_some()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(Access::Detailed),
            [
                ("ping".to_string(), false),
                ("shutdown".into(), false),
                ("upstream".into(), false),
                ("cache/configmaps".into(), false),
                ("cache/widgets.example.com".into(), true),
                ("resource/apps/deployments".into(), true),
                ("skipped/aggregated/metrics.k8s.io/v1beta1".into(), false),
                ("dropped/memory-limit/secrets".into(), false),
            ]
        );
        // The public checks name no resource.
        assert_eq!(
            names(Access::Public),
            [
                ("ping".to_string(), false),
                ("shutdown".into(), false),
                ("upstream".into(), false),
                ("cache-sync".into(), true),
                ("resources".into(), true),
            ]
        );
        assert_eq!(checks_of(&st, Endpoint::Livez, Access::Detailed).len(), 1);
    }

    /// Issue 33: a cache the consistency check found wrong says so to whoever may see details,
    /// and to nobody else.
    #[test]
    fn an_inconsistent_cache_names_its_reason_in_the_detailed_checks_only() {
        let why = "inconsistent with the upstream at resourceVersion 11: 1 keys differ; relisting";
        let st = Readiness {
            caches: vec![("configmaps".into(), false), ("pods".into(), false)],
            not_ready: vec![("configmaps".into(), why.into())],
            ..Readiness::default()
        };
        let failures =
            |a| checks_of(&st, Endpoint::Readyz, a).into_iter().filter_map(|c| c.failure).collect::<Vec<_>>();
        assert_eq!(
            failures(Access::Detailed),
            [format!("cache configmaps not synced: {why}"), "cache pods not synced".to_string()]
        );
        assert!(failures(Access::Public).iter().all(|f| !f.contains("inconsistent")));
    }

    /// Once synced, a cache relisting or stale does not make the proxy unready (every replica
    /// relists and goes stale together): it is named, passing; staleness blocks only when every
    /// synced cache is stale (the upstream away), and a cache that never synced blocks.
    #[test]
    fn a_cache_relisting_or_stale_after_its_first_sync_does_not_block() {
        let mut st = Readiness {
            caches: vec![("configmaps".into(), false), ("pods".into(), true), ("secrets".into(), true)],
            resyncing: vec!["configmaps".into()],
            stale: vec![("secrets".into(), "no proof of being current for 200s".into())],
            ..Readiness::default()
        };
        assert_eq!(st.blocking(), Vec::<String>::new());
        let names = |st: &Readiness| {
            checks_of(st, Endpoint::Readyz, Access::Detailed)
                .into_iter()
                .map(|c| (c.name, c.failure.is_some()))
                .collect::<Vec<_>>()
        };
        let got = names(&st);
        for passing in ["upstream", "cache/configmaps", "relisting/configmaps", "forwarded/stale/secrets"] {
            assert!(got.contains(&(passing.to_owned(), false)), "{passing}: {got:?}");
        }
        // Every synced cache stale, but one relisting within --max-staleness: not away.
        st.stale.push(("pods".into(), "no proof of being current for 200s".into()));
        assert_eq!(st.blocking(), Vec::<String>::new());
        // Its relist not landed within it either: the upstream is away.
        st.stale.push(("configmaps".into(), "no proof of being current for 200s".into()));
        assert_eq!(st.blocking().len(), 3);
        assert!(names(&st).contains(&("upstream".to_owned(), true)));
        // Never synced: blocks.
        st.stale.clear();
        st.resyncing.clear();
        assert_eq!(st.blocking(), ["cache configmaps not synced"]);
    }

    #[test]
    fn routes() {
        assert_eq!(route("/readyz"), Some((Endpoint::Readyz, None)));
        assert_eq!(route("/livez/ping"), Some((Endpoint::Livez, Some("ping"))));
        assert_eq!(route("/readyz/cache/pods"), Some((Endpoint::Readyz, Some("cache/pods"))));
        assert_eq!(route("/readyzz"), None);
        assert_eq!(route("/api"), None);
    }
}
