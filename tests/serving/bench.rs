//! Integration: the load harness run in-process (simulated apiserver + proxy + harness) at a
//! tiny size; the report must show every watch event delivered once and in order, requests
//! against both targets, the CPU costs filled, and the JSON / SVG files must be written. With
//! `--tls` (HTTP/1.1 and HTTP/2), both targets must really be HTTPS and the proxy's auth on.
//!
//! `BENCH_SCENARIO=watch-fanout cargo test --release --test serving -- --ignored --nocapture`
//! runs a full-size scenario and prints its table (see `full_scenario_from_env`; `BENCH_TLS=1`
//! and `BENCH_HTTP2=1` for HTTPS with auth on and HTTP/2).

use std::time::Duration;

use kube_watchcache_bench::{self as bench, BenchArgs, Report, Scenario};

fn tiny(scenario: Scenario) -> BenchArgs {
    let mut a = BenchArgs::new(scenario, Duration::from_secs(2));
    a.watchers = Some(20);
    a.objects = Some(200);
    a.object_size = Some(600);
    a.events_per_sec = Some(20.0);
    a.lists_per_sec = Some(4.0);
    a.gets_per_sec = Some(20.0);
    a
}

fn assert_clean(r: &Report, watchers: usize) {
    assert!(r.problems.is_empty(), "{:?}\n{}", r.problems, r.table());
    assert_eq!(r.targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["proxy", "direct"]);
    for t in &r.targets {
        let w = &t.watch;
        assert_eq!((w.watchers, w.opened, w.failed), (watchers, watchers, 0), "{}", t.name);
        assert_eq!((w.lost, w.duplicated, w.out_of_order), (0, 0, 0), "{}", t.name);
        assert!(w.changes_written > 10, "{}: the writer ran: {}", t.name, w.changes_written);
        assert_eq!(w.deliveries_received, w.deliveries_expected, "{}", t.name);
        assert!(w.deliveries_expected > 0, "{}", t.name);
        assert!(w.lag.count > 0 && w.lag.max_ms > 0.0, "{}: lag measured", t.name);
        assert!(t.upstream_requests.is_some(), "{}", t.name);
        assert!(t.cpu_seconds.is_some() && t.peak_rss_bytes.unwrap_or(0) > 0, "{}", t.name);
        assert_eq!(t.deliveries, w.deliveries_received, "{}", t.name);
        let per_delivery = t.cpu_us_per_delivery.unwrap_or(0.0);
        assert!(per_delivery > 0.0 && per_delivery.is_finite(), "{}: {per_delivery}", t.name);
    }
}

/// Every response of both targets was of `version`, and there were some.
fn assert_spoke(r: &Report, version: &str) {
    for t in &r.targets {
        assert_eq!(
            t.http_versions.keys().collect::<Vec<_>>(),
            [version],
            "{}: {:?}",
            t.name,
            t.http_versions
        );
        assert!(t.http_versions[version] > 20, "{}: {:?}", t.name, t.http_versions);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_tiny_run_is_clean_and_writes_json_and_svg() {
    let dir = std::env::temp_dir().join(format!("kwc-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut args = tiny(Scenario::Mixed);
    args.json = Some(dir.join("report.json"));
    args.svg = Some(dir.join("chart.svg"));
    let report = bench::measure(&args).await.expect("bench runs");
    println!("{}", report.table());
    // 20 watchers in mixed: 3 watch all pods, 17 one node each.
    assert_clean(&report, 20);
    for t in &report.targets {
        for kind in ["list rv=0", "list limit page", "get rv=0", "watch open"] {
            let r = t.requests.get(kind).unwrap_or_else(|| panic!("{}: no {kind}", t.name));
            assert!(r.count > 0 && r.latency.p50_ms > 0.0, "{}: {kind}: {r:?}", t.name);
            assert_eq!(r.errors, 0, "{}: {kind}", t.name);
        }
        assert!(t.requests["list rv=0"].bytes > 200 * 500, "{}: whole lists", t.name);
        assert!(t.bytes_listed > t.requests["list rv=0"].bytes, "{}: lists and pages", t.name);
        assert!(t.cpu_ms_per_mb_listed.unwrap_or(0.0) > 0.0, "{}", t.name);
        assert!(t.url.starts_with("http://"), "{}", t.url);
        assert_eq!(t.auth_lookups, None, "{}: --auth=none", t.name);
    }
    assert_spoke(&report, "HTTP/1.1");
    assert!(report.security.is_empty());
    let (proxy, direct) = (&report.targets[0], &report.targets[1]);
    assert!(
        direct.upstream_requests.unwrap() > proxy.upstream_requests.unwrap(),
        "the proxy spares the upstream: {:?} vs {:?}",
        proxy.upstream_requests,
        direct.upstream_requests
    );

    bench::run(args.clone()).await.expect("run succeeds and writes files");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).expect("JSON parses");
    assert_eq!(json["scenario"], "mixed");
    assert_eq!(json["targets"][0]["watch"]["lost"], 0);
    let back: Report = serde_json::from_value(json).expect("JSON is a Report");
    assert_eq!(back.targets.len(), 2);
    let svg = std::fs::read_to_string(dir.join("chart.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"), "{svg}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_fanout_and_kubelet_tiny_runs_are_clean() {
    let mut args = tiny(Scenario::WatchFanout);
    args.lists_per_sec = Some(0.0);
    args.gets_per_sec = Some(0.0);
    let r = bench::measure(&args).await.expect("watch-fanout runs");
    assert_clean(&r, 20);
    for t in &r.targets {
        assert_eq!(
            t.watch.deliveries_expected,
            20 * t.watch.changes_written,
            "every watcher sees every change"
        );
    }

    let mut args = tiny(Scenario::Kubelet);
    args.lists_per_sec = Some(0.0);
    let r = bench::measure(&args).await.expect("kubelet runs");
    assert_clean(&r, 20);
    for t in &r.targets {
        assert_eq!(
            t.watch.deliveries_expected, t.watch.changes_written,
            "each change goes to its node's watcher"
        );
    }
}

/// `sharded` (issue 34): 20 watchers over 4 uid shards. Through the proxy each change reaches
/// exactly the 5 watchers of its pod's shard; the 1.28 sim ignores `shardSelector`, so directly
/// every watcher gets the changes of every shard (the expected ones among them, none lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_tiny_run_delivers_each_change_to_its_shard_only() {
    let mut args = tiny(Scenario::Sharded);
    args.lists_per_sec = Some(0.0);
    args.gets_per_sec = Some(0.0);
    let r = bench::measure(&args).await.expect("sharded runs");
    assert!(r.problems.is_empty(), "{:?}\n{}", r.problems, r.table());
    for t in &r.targets {
        let w = &t.watch;
        assert_eq!((w.watchers, w.opened, w.failed), (20, 20, 0), "{}", t.name);
        assert_eq!((w.lost, w.duplicated, w.out_of_order), (0, 0, 0), "{}", t.name);
        assert!(w.changes_written > 10, "{}", t.name);
        assert_eq!(w.deliveries_expected, 5 * w.changes_written, "{}: 5 watchers per shard", t.name);
        if t.name == "proxy" {
            assert_eq!(w.deliveries_received, w.deliveries_expected, "{}", t.name);
        } else {
            // Directly, other shards' changes too; the run waits for the expected deliveries
            // only, so the last changes may still be on their way to other shards' watchers.
            let all = 20 * w.changes_written;
            assert!(
                w.deliveries_received > w.deliveries_expected && w.deliveries_received <= all,
                "{}: {} received, {} expected, {all} sent",
                t.name,
                w.deliveries_received,
                w.deliveries_expected
            );
        }
    }
}

/// `--tls`: the sim and the proxy on HTTPS, the proxy's delegated authn/authz on, a bearer token
/// from the clients; over HTTP/1.1 and over HTTP/2 (ALPN h2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_tiny_runs_with_auth_on_are_clean_over_http1_and_http2() {
    for (http2, version) in [(false, "HTTP/1.1"), (true, "HTTP/2.0")] {
        let mut args = tiny(Scenario::Mixed);
        args.tls = true;
        args.http2 = http2;
        let r = bench::measure(&args).await.unwrap_or_else(|e| panic!("--tls http2={http2}: {e}"));
        println!("{}", r.table());
        assert_clean(&r, 20);
        assert_spoke(&r, version);
        assert!(r.security.contains("got 401"), "the unauthenticated request was refused: {}", r.security);
        for t in &r.targets {
            assert!(t.url.starts_with("https://127.0.0.1:"), "{}", t.url);
            for kind in ["list rv=0", "get rv=0", "watch open"] {
                assert_eq!(t.requests[kind].errors, 0, "{}: {kind}: {:?}", t.name, t.statuses);
            }
            assert!(t.cpu_ms_per_mb_listed.unwrap_or(0.0) > 0.0, "{}", t.name);
        }
        let (proxy, direct) = (&r.targets[0], &r.targets[1]);
        // Every request of the load (watches opened before it) was authenticated and authorized
        // by the proxy, from its caches but for the first check of each decision (a token, a
        // list, each pod's GET), which went to the sim as a review.
        let auth = proxy.auth_lookups.expect("the proxy exports auth cache lookups");
        let load: u64 = proxy.requests.iter().filter(|(k, _)| *k != "watch open").map(|(_, r)| r.count).sum();
        assert!(auth.hits + auth.misses >= 2 * load, "a token and an access check per request: {auth:?}");
        assert!(auth.hits > 0 && auth.misses >= 2, "{auth:?}");
        assert_eq!(direct.auth_lookups, None);
    }
}

/// A full-size run of `BENCH_SCENARIO` (default mixed) with `BENCH_DURATION` seconds per
/// target; prints the table and writes `BENCH_JSON` / `BENCH_SVG` when set.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn full_scenario_from_env() {
    use clap::ValueEnum;
    let scenario = std::env::var("BENCH_SCENARIO").unwrap_or_else(|_| "mixed".into());
    let scenario = Scenario::from_str(&scenario, true).expect("scenario");
    let secs = std::env::var("BENCH_DURATION").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let mut args = BenchArgs::new(scenario, Duration::from_secs(secs));
    args.json = std::env::var("BENCH_JSON").ok().map(Into::into);
    args.svg = std::env::var("BENCH_SVG").ok().map(Into::into);
    args.watchers = std::env::var("BENCH_WATCHERS").ok().and_then(|s| s.parse().ok());
    args.http2 = std::env::var("BENCH_HTTP2").is_ok();
    args.tls = std::env::var("BENCH_TLS").is_ok();
    bench::run(args).await.expect("clean run");
}

/// Issue 18 item 1: against an external cluster (the sim over HTTP here) the bench renews real
/// Leases during each phase, and `--cleanup` deletes its pods, its Leases and the namespaces
/// it created, keeping a namespace that existed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_runs_churn_real_leases_and_cleanup_removes_what_the_bench_made() {
    use kube_watchcache_sim::{Sim, SimOptions};
    let sim =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .unwrap();
    let mut serve = kube_watchcache::config::ServeArgs::local(
        &format!("http://{}", sim.addr),
        &["pods"],
        "127.0.0.1:0".parse().unwrap(),
    );
    serve.shutdown_grace_period = Duration::from_secs(1);
    let proxy = kube_watchcache::app::start(&serve).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    // A namespace of the bench's names made by someone else: kept by the cleanup.
    let kept = serde_json::json!({"metadata": {"name": "bench-3"}});
    sim.sim.create("namespaces", "", kept).unwrap();
    sim.sim.create("configmaps", "bench-3", serde_json::json!({"metadata": {"name": "theirs"}})).unwrap();

    let mut a = tiny(Scenario::WatchFanout);
    a.direct = Some(format!("http://{}", sim.addr));
    a.target = Some(format!("http://{}", proxy.addr));
    a.watchers = Some(5);
    a.objects = Some(30);
    a.lease_churn = Some(20.0);
    a.cleanup = true;
    let r = bench::measure(&a).await.expect("the run passes");
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    for t in &r.targets {
        assert!(t.lease_renewals >= 20, "{}: {} renewals", t.name, t.lease_renewals);
        assert_eq!(t.lease_renewals_failed, 0, "{}: {:?}", t.name, t.first_lease_error);
    }
    assert!(r.table().contains("lease renewals"));

    let base = format!("http://{}", sim.addr);
    for n in 0..10 {
        let ns = format!("bench-{n}");
        assert_eq!(names(&format!("{base}/api/v1/namespaces/{ns}/pods")).await, Vec::<String>::new(), "{ns}");
        let leases = format!("{base}/apis/coordination.k8s.io/v1/namespaces/{ns}/leases");
        assert_eq!(names(&leases).await, Vec::<String>::new(), "{ns}");
    }
    let namespaces = names(&format!("{base}/api/v1/namespaces")).await;
    assert_eq!(namespaces.iter().filter(|n| n.starts_with("bench-")).collect::<Vec<_>>(), ["bench-3"]);
    assert_eq!(names(&format!("{base}/api/v1/namespaces/bench-3/configmaps")).await, ["theirs"]);
}

/// The names in a LIST.
async fn names(url: &str) -> Vec<String> {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let resp = client.get(url.parse().unwrap()).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    list["items"]
        .as_array()
        .map(|items| items.iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// Issue 16 part 4: kubelets with node identities through the proxy (HTTPS, HTTP/2, auth on):
/// every node watches its pods with a certificate of its own and GETs the Secrets its pods
/// mount; the Node authorizer (in the sim, asked by the proxy's SubjectAccessReviews) allows
/// all of it, nothing is refused, nothing lost, and the report gives the SARs and the hit rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_with_node_identities_are_authorized_and_lose_nothing() {
    let mut a = tiny(Scenario::Kubelet);
    a.tls = true;
    a.http2 = true;
    a.node_identities = true;
    a.watchers = Some(20);
    a.objects = Some(100);
    a.gets_per_sec = Some(40.0);
    let r = bench::measure(&a).await.expect("the run passes");
    assert_clean(&r, 20);
    for t in &r.targets {
        assert!(
            !t.statuses.contains_key("403") && !t.statuses.contains_key("401"),
            "{}: {:?}",
            t.name,
            t.statuses
        );
        let gets = &t.requests["get rv=0"];
        assert!(
            gets.count > 20 && gets.errors == 0,
            "{}: secret GETs {} ({} errors)",
            t.name,
            gets.count,
            gets.errors
        );
    }
    let proxy = &r.targets[0];
    let auth = proxy.auth_lookups.expect("the proxy's auth cache was read");
    assert!(auth.hits + auth.misses > 0, "{auth:?}");
    assert!(auth.subject_access_reviews > 0, "node GETs of Secrets asked the Node authorizer: {auth:?}");
    let table = r.table();
    assert!(table.contains("upstream SARs/s") && table.contains("auth cache hit %"), "{table}");
}

/// `--scenario restart` at a tiny size, all five cases against the sim: no event lost,
/// duplicated or reordered, every client back at the upstream's state; the proxy absorbs the
/// apiserver's restart (at most one upstream LIST), and a warm restart or a rollout costs no
/// relist and no upstream LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_tiny_run_all_cases() {
    let mut a = BenchArgs::new(Scenario::Restart, Duration::from_secs(1));
    a.watchers = Some(4);
    a.objects = Some(100);
    a.object_size = Some(400);
    a.events_per_sec = Some(40.0);
    a.restart_down = Duration::from_millis(100);
    a.informer_backoff = Duration::from_millis(20);
    let r = bench::measure_restart(&a).await.unwrap();
    let table = r.table();
    eprintln!("{table}");
    assert!(r.problems.is_empty(), "{:?}\n{table}", r.problems);
    let cases: Vec<&str> = r.cases.iter().map(|c| c.case.as_str()).collect();
    assert_eq!(cases, ["a", "b", "c", "d", "e"], "{table}");
    for c in &r.cases {
        assert_eq!((c.lost, c.duplicated, c.out_of_order, c.ghosts), (0, 0, 0, 0), "({}) {table}", c.case);
        assert!(c.changes_written > 10 && c.recovery_seconds.is_some(), "({}) {table}", c.case);
    }
    let case = |k: &str| r.cases.iter().find(|c| c.case == k).unwrap();
    // (a): the restarted apiserver's watch caches start at the restart: every client relists.
    assert!(case("a").clients_relisted >= 1, "{table}");
    assert!(case("b").upstream_lists <= 1, "{table}");
    for k in ["d", "e"] {
        assert_eq!((case(k).client_relists, case(k).upstream_lists), (0, 0), "({k}) {table}");
    }
}
