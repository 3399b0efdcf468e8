//! `/metrics` end to end: the series move by exactly what a cached LIST, a forwarded GET, a
//! watch with one event and token-authenticated requests did; every metric in the README's
//! "Metrics" table is exported (TLS, auth and an upstream failure included); the Grafana
//! dashboard is valid JSON whose queries use those metrics. (The binary's JSON and text logs:
//! `crates/cli/tests/logs.rs`.)

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use common::{open_watch_with, send, serve_args};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use kube_watchcache::app::{self, Running};
use kube_watchcache_sim::{AuthScript, Rule, ScriptUser, Sim, SimHandle, SimOptions};
use serde_json::{json, Value};

fn root(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// alice may read configmaps; metrics-reader may GET /watchcache/metrics.
fn script() -> AuthScript {
    AuthScript::default()
        .token("alice-token", ScriptUser::new("alice", &[]))
        .token("metrics-token", ScriptUser::new("metrics-reader", &[]))
        .rule(Rule::user("alice", &["get", "list", "watch"], "", &["configmaps"]))
        .rule(Rule::paths("metrics-reader", &["get"], &["/watchcache/metrics"]))
}

async fn start_sim() -> SimHandle {
    let sim = Sim::start(SimOptions::default()).await.expect("sim starts");
    sim.sim.set_auth(script());
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ns-a"}}))
        .expect("namespace");
    sim.sim
        .create("configmaps", "ns-a", json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm1"}}))
        .expect("create");
    sim
}

/// Parses the text format into `name{labels}` → value (labels as rendered, sorted by name).
fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }
    /// Sum over the series of `name` whose labels contain every `k="v"` in `having`.
    fn sum(&self, name: &str, having: &[&str]) -> f64 {
        self.0
            .iter()
            .filter(|(s, _)| s.split('{').next() == Some(name) && having.iter().all(|h| s.contains(h)))
            .map(|(_, v)| v)
            .sum()
    }
}

async fn scrape_plain(client: &common::HttpClient, proxy: &Running) -> Scrape {
    let url = format!("http://{}/watchcache/metrics", proxy.addr);
    let r = send(client, Method::GET, &url, None, &[("authorization", "Bearer metrics-token")]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let text = String::from_utf8(r.body.to_vec()).expect("utf-8");
    assert!(!text.contains("alice") && !text.contains("token\""), "no user or token in labels:\n{text}");
    Scrape(parse(&text))
}

#[tokio::test]
async fn series_move_by_exactly_what_the_requests_did() {
    let sim = start_sim().await;
    let mut args = serve_args(sim.addr, &["configmaps"]);
    args.security.auth = "upstream".into();
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let client = common::client();
    let base = format!("http://{}", proxy.addr);
    let alice = [("authorization", "Bearer alice-token")];
    let cm = "configmaps";

    let before = scrape_plain(&client, &proxy).await;
    // A cached LIST (one object in ns-a), a forwarded Most Recent GET, a watch with one event.
    let r = send(
        &client,
        Method::GET,
        &format!("{base}/api/v1/namespaces/ns-a/configmaps?resourceVersion=0"),
        None,
        &alice,
    )
    .await;
    assert_eq!(r.status, 200);
    let r =
        send(&client, Method::GET, &format!("{base}/api/v1/namespaces/ns-a/configmaps/cm1"), None, &alice)
            .await;
    assert_eq!(r.status, 200);
    let rv = sim.sim.current_rv().0;
    let mut w = open_watch_with(
        &client,
        &format!("{base}/api/v1/namespaces/ns-a/configmaps?watch=1&resourceVersion={rv}"),
        &alice,
    )
    .await;
    assert_eq!(w.status, 200);
    sim.sim
        .create("configmaps", "ns-a", json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm2"}}))
        .expect("create");
    let e = w.next(Duration::from_secs(10)).await.expect("an event");
    assert_eq!(e["type"], "ADDED");
    let after = scrape_plain(&client, &proxy).await;

    let d = |series: &str| after.get(series) - before.get(series);
    let ds = |name: &str, having: &[&str]| after.sum(name, having) - before.sum(name, having);
    let req = |verb: &str, code: &str, served: &str, reason: &str| {
        format!(
            r#"watchcache_requests_total{{code="{code}",reason="{reason}",resource="{cm}",served="{served}",verb="{verb}"}}"#
        )
    };
    assert_eq!(d(&req("list", "200", "cache", "")), 1.0);
    assert_eq!(d(&req("get", "200", "upstream", "most_recent_get")), 1.0);
    assert_eq!(d(&req("watch", "200", "cache", "")), 1.0);
    assert_eq!(ds("watchcache_requests_total", &[]), 3.0, "nothing else was counted");
    assert_eq!(d(r#"watchcache_forwarded_requests_total{reason="most_recent_get"}"#), 1.0);
    // Latency: the LIST and the GET, never the watch.
    assert_eq!(
        d(&format!(
            r#"watchcache_request_duration_seconds_count{{resource="{cm}",served="cache",verb="list"}}"#
        )),
        1.0
    );
    assert_eq!(
        d(&format!(
            r#"watchcache_request_duration_seconds_count{{resource="{cm}",served="upstream",verb="get"}}"#
        )),
        1.0
    );
    assert_eq!(after.sum("watchcache_request_duration_seconds_count", &[r#"verb="watch""#]), 0.0);
    // The scrape itself: it holds a permit (counted before authentication, as the apiserver).
    assert_eq!(after.get("watchcache_current_inflight_requests"), 1.0);
    // The cache: one object examined and returned, one event received and delivered once.
    let res = format!(r#"{{resource="{cm}"}}"#);
    assert_eq!(d(&format!("watchcache_list_fetched_objects_total{res}")), 1.0);
    assert_eq!(d(&format!("watchcache_list_returned_objects_total{res}")), 1.0);
    assert_eq!(d(&format!("watchcache_events_received_total{res}")), 1.0);
    assert_eq!(d(&format!("watchcache_events_dispatched_total{res}")), 1.0);
    assert_eq!(d(&format!("watchcache_fanout_offered_total{res}")), 1.0);
    assert_eq!(after.get(&format!("watchcache_terminated_watchers_total{res}")), 0.0);
    let ended = format!("watchcache_watchers_ended_at_relist_total{res}");
    assert_eq!(after.0.get(&ended), Some(&0.0), "the series exists from the start, at 0");
    assert_eq!(after.get(&format!("watchcache_watchers{res}")), 1.0);
    assert_eq!(d(&format!("watchcache_history_size{res}")), 1.0);
    assert_eq!(after.get(&format!("watchcache_history_capacity{res}")), args.history_max_events as f64);
    assert!(after.get(&format!("watchcache_history_window_seconds{res}")) < 60.0);
    // Auth: alice's token reviewed once, then cached for the GET, the watch and the second
    // scrape's metrics-token; SubjectAccessReviews for alice's list and watch (the forwarded
    // GET is authorized upstream), the /watchcache/metrics decision cached since the first scrape.
    let lookups = |review: &str, result: &str| {
        d(&format!(r#"watchcache_auth_cache_lookups_total{{result="{result}",review="{review}"}}"#))
    };
    assert_eq!((lookups("tokenreview", "miss"), lookups("tokenreview", "hit")), (1.0, 3.0));
    assert_eq!((lookups("subjectaccessreview", "miss"), lookups("subjectaccessreview", "hit")), (2.0, 1.0));
    assert_eq!(d(r#"watchcache_auth_review_duration_seconds_count{review="tokenreview"}"#), 1.0);
    assert_eq!(d(r#"watchcache_auth_review_duration_seconds_count{review="subjectaccessreview"}"#), 2.0);
    // The proxy's own upstream requests in between: exactly those three reviews.
    assert_eq!(ds("watchcache_upstream_requests_total", &[]), 3.0);
    assert_eq!(ds("watchcache_upstream_requests_total", &[r#"method="POST""#]), 3.0);
    assert_eq!(ds("watchcache_upstream_request_duration_seconds_count", &[r#"method="POST""#]), 3.0);
    // Process and build.
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(after.get(&format!(r#"watchcache_build_info{{version="{version}"}}"#)), 1.0);
    assert!(after.get("process_resident_memory_bytes") > 1e6);
    assert!(after.get("process_open_fds") > 3.0);
    assert!(after.get("process_max_fds") >= after.get("process_open_fds"));
    assert!(after.get("process_cpu_seconds_total") > 0.0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let start = after.get("process_start_time_seconds");
    assert!(start <= now + 1.0 && start > now - 3600.0, "{start} vs {now}");
    drop(w);
    proxy.shutdown().await;
    sim.shutdown().await;
}

/// The metric names of the table in `docs/metrics.md` (first column).
fn readme_metrics() -> Vec<String> {
    let readme = std::fs::read_to_string(root("docs/metrics.md")).expect("docs/metrics.md");
    let section = readme.split("\n## Metrics\n").nth(1).expect("a Metrics section");
    let names: Vec<String> = section
        .lines()
        .skip_while(|l| !l.starts_with("| metric"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1)?.trim().strip_prefix('`')?.strip_suffix('`').map(str::to_owned))
        .collect();
    assert!(names.len() > 20, "{names:?}");
    names
}

use common::tls::TlsClient;

fn tls_client() -> TlsClient {
    common::tls::https(common::tls::config().with_no_client_auth(), false)
}

async fn tls_get(c: &TlsClient, url: &str, token: &str) -> (u16, String) {
    let req = Request::builder()
        .uri(url)
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("in time")
        .expect("answer");
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (code, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn every_metric_in_the_readme_table_is_exported() {
    let dir = std::env::temp_dir().join(format!("kwc-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(root("tests/testdata/security/server1.crt"), dir.join("tls.crt")).unwrap();
    std::fs::copy(root("tests/testdata/security/server1.key"), dir.join("tls.key")).unwrap();
    let sim = start_sim().await;
    let mut args = serve_args(sim.addr, &["configmaps"]);
    args.security.auth = "upstream".into();
    args.insecure_listen = None;
    args.secure_port = 0;
    args.bind_address = "127.0.0.1".parse().unwrap();
    args.tls_cert_file = Some(dir.join("tls.crt"));
    args.tls_private_key_file = Some(dir.join("tls.key"));
    // Warm restarts on: state saved every 100 ms (watchcache_state_*).
    args.state_dir = Some(dir.join("state"));
    args.state_sync_period = Duration::from_millis(100);
    // And the consistency check (watchcache_consistency_*).
    args.consistency_check_period = Duration::from_millis(100);
    // And a memory limit with room to spare (watchcache_cache_memory_*).
    args.cache_memory_limit = kube_watchcache::memory::limit::Limit::Bytes(1 << 30);
    args.cache_memory_check_period = Duration::from_millis(100);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let c = tls_client();
    let base = format!("https://localhost:{}", proxy.addr.port());
    let rv = sim.sim.current_rv().0;
    // Cached LISTs (Any, NotOlderThan, Most Recent) and a forwarded GET.
    let rv_n = format!("configmaps?resourceVersion={rv}");
    for p in ["configmaps?resourceVersion=0", &rv_n, "configmaps", "configmaps/cm1"] {
        let (code, body) = tls_get(&c, &format!("{base}/api/v1/namespaces/ns-a/{p}"), "alice-token").await;
        assert_eq!(code, 200, "{p}: {body}");
    }
    // An event, then the metrics once (auth decisions cached for after the upstream is gone).
    sim.sim
        .create("configmaps", "ns-a", json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm9"}}))
        .expect("create");
    let (code, text) = tls_get(&c, &format!("{base}/watchcache/metrics"), "metrics-token").await;
    assert_eq!(code, 200, "{text}");
    // A state save and a consistency check (every 100 ms) while the upstream is there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = tls_get(&c, &format!("{base}/watchcache/metrics"), "metrics-token").await;
        let seen = [
            "watchcache_state_bytes{",
            "watchcache_consistency_differences{",
            "watchcache_cache_memory_bytes{",
        ]
        .iter()
        .all(|m| text.contains(m));
        if seen || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The upstream goes away: the reflector's watch fails and is counted.
    sim.shutdown().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let (code, text) = tls_get(&c, &format!("{base}/watchcache/metrics"), "metrics-token").await;
        assert_eq!(code, 200, "{text}");
        if text.contains("watchcache_reflector_errors_total{") || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let missing: Vec<String> = readme_metrics()
        .into_iter()
        .filter(|name| {
            !text.lines().any(|l| {
                l.starts_with(&format!("{name} "))
                    || l.starts_with(&format!("{name}{{"))
                    || l.starts_with(&format!("{name}_count"))
            })
        })
        .collect();
    assert!(missing.is_empty(), "in the README table but not in /metrics: {missing:?}\n{text}");
    let s = Scrape(parse(&text));
    let expiry = s.get("watchcache_serving_certificate_expiration_timestamp_seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(expiry > now, "{expiry}");
    assert!(s.sum("watchcache_read_wait_seconds_count", &[r#"read="freshness""#]) >= 1.0, "{text}");
    proxy.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_dashboard_is_json_and_queries_only_documented_metrics() {
    let text = std::fs::read_to_string(root("deploy/dashboards/kube-watchcache.json")).expect("dashboard");
    let d: Value = serde_json::from_str(&text).expect("valid JSON");
    let names = readme_metrics();
    let panels = d["panels"].as_array().expect("panels");
    assert!(panels.len() >= 20);
    let mut used = std::collections::BTreeSet::new();
    for p in panels {
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            let metrics: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("watchcache_") || w.starts_with("process_"))
                .collect();
            assert!(!metrics.is_empty(), "{expr}");
            for m in metrics {
                let base = m.strip_suffix("_bucket").unwrap_or(m);
                assert!(names.iter().any(|n| n == base), "{m} in {expr:?} is not in the README table");
                used.insert(base.to_owned());
            }
        }
    }
    let unused: Vec<&String> = names.iter().filter(|n| !used.contains(*n)).collect();
    assert!(unused.len() <= 8, "most documented metrics have a panel; without one: {unused:?}");
}
