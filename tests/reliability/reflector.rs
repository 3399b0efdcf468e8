//! Integration: the reflector's list → watch → relist state machine against a scripted fake
//! apiserver (re-watch from the last RV after a clean end, relist after ERROR 410, upstream
//! BOOKMARKs advance the cache RV, a relist ends the live watchers it concerns).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_watchcache::cache::{self, CacheOptions, Filter, WatchRequest, WatchStart};
use kube_watchcache::metrics::Metrics;
use kube_watchcache::reflector::{self, ReflectorOptions};
use kube_watchcache::resource::{ResourceKind, Rv};
use kube_watchcache::upstream::{Upstream, UpstreamOptions};
use parking_lot::Mutex;

fn cm(name: &str, rv: u64) -> String {
    format!(
        r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"k":"{rv}"}}}}"#
    )
}

fn typed(name: &str, rv: u64) -> String {
    format!(
        r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}}}}"#
    )
}

fn list(rv: u64, items: &[String]) -> String {
    format!(
        r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}},"items":[{}]}}"#,
        items.join(",")
    )
}

/// The scripted upstream: answers each request in turn and records what it was asked.
struct Script {
    log: Mutex<Vec<String>>,
    /// Probes answered by `answer` (not logged).
    probes: std::sync::atomic::AtomicUsize,
    /// When each request came (`answer_unparsable` only).
    at: Mutex<Vec<std::time::Instant>>,
}

/// The reflector's probe before a re-watch (`limit=1`), after a watch the upstream ended early.
fn is_probe(q: &str) -> bool {
    q.split('&').any(|p| p == "limit=1")
}

fn json(body: String) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}

async fn answer(script: Arc<Script>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    if is_probe(&q) {
        // Never behind: the re-watch goes on (this script's watches all end early).
        script.probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        return json(list(1000, &[]));
    }
    let n = {
        let mut log = script.log.lock();
        log.push(q.clone());
        log.len()
    };
    let body = match (n, q.contains("watch=true")) {
        // 1: the first list.
        (1, false) => list(10, &[cm("a", 5), cm("b", 6)]),
        // 2: watch from 10: a change, a bookmark, then the stream ends cleanly.
        (2, true) => format!(
            "{{\"type\":\"MODIFIED\",\"object\":{}}}\n{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{{\"resourceVersion\":\"15\"}}}}}}\n",
            typed("a", 11)
        ),
        // 3: re-watch from the bookmark's RV: the upstream says it is gone.
        (3, true) => r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 15 (20)","reason":"Expired","code":410}}
"#
        .to_owned(),
        // 4: relist: a changed, b gone, c new.
        (4, false) => list(25, &[cm("a", 21), cm("c", 22)]),
        // 5+: quiet watches.
        _ => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            String::new()
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}

type Answer = fn(Arc<Script>, Request<Incoming>) -> BoxedAnswer;
type BoxedAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

/// Serves `answer` on a local port; returns its address and the script it records into.
async fn scripted(answer: Answer) -> (std::net::SocketAddr, Arc<Script>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let script = Arc::new(Script {
        log: Mutex::new(Vec::new()),
        probes: std::sync::atomic::AtomicUsize::new(0),
        at: Mutex::new(Vec::new()),
    });
    let s2 = script.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let s = s2.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| answer(s.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, script)
}

/// A client of the scripted upstream at `addr`, and an empty configmaps cache for a reflector.
/// A reflector filling `writer`'s cache from `upstream`, until [`Reflecting::stop`].
struct Reflecting {
    stop_tx: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start_reflector(upstream: Upstream, writer: cache::Writer, opts: ReflectorOptions) -> Reflecting {
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(reflector::run(upstream, writer, opts, Arc::new(Metrics::new()), stop));
    Reflecting { stop_tx, task }
}

impl Reflecting {
    /// Stops the reflector and waits for it to end.
    async fn stop(self) {
        self.stop_tx.send(true).unwrap();
        self.task.await.unwrap();
    }
}

fn configmaps_against(addr: std::net::SocketAddr) -> (Upstream, cache::Writer, cache::Reader) {
    let upstream =
        Upstream::new(&UpstreamOptions { upstream: Some(format!("http://{addr}")), ..Default::default() })
            .unwrap();
    let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let (writer, reader) = cache::new(kind, CacheOptions::default());
    (upstream, writer, reader)
}

#[tokio::test]
async fn list_watch_rewatch_relist() {
    let (addr, script) = scripted(|s, r| Box::pin(answer(s, r))).await;

    let (upstream, writer, reader) = configmaps_against(addr);
    let opts = ReflectorOptions { backoff_initial: Duration::from_millis(10), ..Default::default() };
    let running = start_reflector(upstream, writer, opts);

    reader.wait_for(Rv(10), Duration::from_secs(5)).await.unwrap();
    let mut w = reader
        .watch(WatchRequest {
            filter: Filter::default(),
            start: WatchStart::After(Rv(10)),
            bookmarks: false,
            deadline: tokio::time::Instant::now() + Duration::from_secs(10),
        })
        .unwrap();
    reader.wait_for(Rv(25), Duration::from_secs(5)).await.unwrap();

    let mut got = Vec::new();
    while let Some(f) = tokio::time::timeout(Duration::from_secs(5), w.next()).await.unwrap() {
        let v: serde_json::Value = serde_json::from_slice(&f).unwrap();
        got.push(format!(
            "{} {} {}",
            v["type"].as_str().unwrap(),
            v["object"]["metadata"]["name"].as_str().unwrap(),
            v["object"]["metadata"]["resourceVersion"].as_str().unwrap()
        ));
    }
    // The watch began at 10, so the replay shows a@11; the relist changed what it selects, so
    // its stream ends there (no difference events: README "Relists").
    assert_eq!(got, vec!["MODIFIED a 11"]);
    let snap = reader.snapshot();
    assert_eq!(snap.rv, Rv(25));
    assert_eq!(snap.store.keys().map(|k| k.as_str().to_owned()).collect::<Vec<_>>(), vec!["ns/a", "ns/c"]);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while script.log.lock().len() < 5 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = script.log.lock().clone();
    assert!(log[0].contains("limit=500") && !log[0].contains("watch"), "{log:?}");
    assert!(
        log[1].contains("watch=true")
            && log[1].contains("resourceVersion=10")
            && log[1].contains("allowWatchBookmarks=true"),
        "{log:?}"
    );
    assert!(log[2].contains("resourceVersion=15"), "re-watch from the bookmark RV: {log:?}");
    assert!(!log[3].contains("watch"), "relist after 410: {log:?}");
    assert!(log[4].contains("resourceVersion=25"), "watch from the relist RV: {log:?}");
    running.stop().await;
}

/// The apiserver's 429 under API Priority and Fairness, with its `Retry-After`.
fn too_many(seconds: u64) -> Response<Full<Bytes>> {
    let body = format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{{"retryAfterSeconds":{seconds}}},"code":429}}"#
    );
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
    resp.headers_mut().insert("retry-after", seconds.to_string().parse().unwrap());
    resp
}

async fn answer_busy_second_page(
    script: Arc<Script>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    if is_probe(&q) || q.contains("watch=true") {
        tokio::time::sleep(Duration::from_secs(2)).await;
        return json(String::new());
    }
    let tries = {
        let mut log = script.log.lock();
        log.push(q.clone());
        script.at.lock().push(std::time::Instant::now());
        log.iter().filter(|l| l.contains("continue=")).count()
    };
    if !q.contains("continue=") {
        return json(format!(
            r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"10","continue":"page2","remainingItemCount":1}},"items":[{}]}}"#,
            cm("a", 5)
        ));
    }
    if tries == 1 {
        return Ok(too_many(1));
    }
    json(list(10, &[cm("b", 6)]))
}

/// A page after the first that the upstream is too busy for (429, APF) is asked for again
/// with its continue token, after the answer's `retryAfterSeconds`: the pages before it are
/// kept, the list is not started over (a review: one failed page threw a whole relist away).
#[tokio::test]
async fn a_busy_page_is_asked_again_not_the_whole_list() {
    let (addr, script) = scripted(|s, r| Box::pin(answer_busy_second_page(s, r))).await;
    let (upstream, writer, reader) = configmaps_against(addr);
    let opts = ReflectorOptions { backoff_initial: Duration::from_millis(10), ..Default::default() };
    let running = start_reflector(upstream, writer, opts);
    reader.wait_for(Rv(10), Duration::from_secs(10)).await.unwrap();
    assert_eq!(reader.snapshot().store.len(), 2, "both pages installed");
    let (log, at) = (script.log.lock().clone(), script.at.lock().clone());
    assert_eq!(log.len(), 3, "page 1 once, page 2 twice: {log:?}");
    assert!(log[1].contains("continue=page2") && log[2].contains("continue=page2"), "{log:?}");
    assert!(at[2] - at[1] >= Duration::from_secs(1), "after its Retry-After: {:?}", at[2] - at[1]);
    running.stop().await;
}

async fn answer_busy_first_list(
    script: Arc<Script>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    if is_probe(&q) || q.contains("watch=true") {
        tokio::time::sleep(Duration::from_secs(2)).await;
        return json(String::new());
    }
    let n = {
        let mut log = script.log.lock();
        log.push(q.clone());
        script.at.lock().push(std::time::Instant::now());
        log.len()
    };
    if n == 1 {
        return Ok(too_many(2));
    }
    json(list(10, &[cm("a", 5)]))
}

/// A list the upstream is too busy for is asked again no sooner than its `retryAfterSeconds`
/// (the backoff here is 10 ms): APF's, or a watch cache's that is re-initialising (the cacher
/// scales it with its downtime).
#[tokio::test]
async fn a_busy_list_is_retried_after_its_retry_after() {
    let (addr, script) = scripted(|s, r| Box::pin(answer_busy_first_list(s, r))).await;
    let (upstream, writer, reader) = configmaps_against(addr);
    let opts = ReflectorOptions { backoff_initial: Duration::from_millis(10), ..Default::default() };
    let running = start_reflector(upstream, writer, opts);
    reader.wait_for(Rv(10), Duration::from_secs(10)).await.unwrap();
    let at = script.at.lock().clone();
    assert!(at[1] - at[0] >= Duration::from_secs(2), "{:?}", at[1] - at[0]);
    running.stop().await;
}

async fn answer_closed_at_once(
    script: Arc<Script>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    if is_probe(&q) {
        script.probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        return json(list(10, &[]));
    }
    script.log.lock().push(q.clone());
    if q.contains("watch=true") {
        return json(String::new());
    }
    json(list(10, &[cm("a", 5)]))
}

/// A watch accepted and closed at once with nothing in it (a load balancer, an aggregated
/// server that ignores `watch`; the apiserver once per cacher generation) is client-go's "very
/// short watch": a failure, waited out with the backoff. It was re-watched at once, a watch and
/// a probe as fast as the upstream answered (a review).
#[tokio::test]
async fn watches_closed_at_once_are_re_made_after_the_backoff() {
    let (addr, script) = scripted(|s, r| Box::pin(answer_closed_at_once(s, r))).await;
    let (upstream, writer, reader) = configmaps_against(addr);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let opts = ReflectorOptions { backoff_initial: Duration::from_millis(100), ..Default::default() };
    let metrics = Arc::new(Metrics::new());
    let task = tokio::spawn(reflector::run(upstream, writer, opts, metrics.clone(), stop));
    reader.wait_for(Rv(10), Duration::from_secs(5)).await.unwrap();
    let started = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let watches = script.log.lock().iter().filter(|q| q.contains("watch=true")).count();
    // Backoff 100 ms, doubling with up to 2× jitter: at most 100+200+400+800 ms fit.
    assert!((1..=5).contains(&watches), "{watches} watches in {:?}", started.elapsed());
    let text = metrics.render();
    assert!(text.contains("reason=\"watch_short\""), "counted");
    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

/// A watch that ends at its `timeoutSeconds` (here 1 s, the script's watches ending after
/// 200 ms: within the 2 s margin) is re-watched without the probe: only one the upstream ended
/// well before its time is.
#[tokio::test]
async fn a_watch_ended_at_its_time_is_re_watched_without_a_probe() {
    let (addr, script) = scripted(|s, r| Box::pin(answer(s, r))).await;
    let (upstream, writer, reader) = configmaps_against(addr);
    let opts = ReflectorOptions {
        backoff_initial: Duration::from_millis(10),
        watch_timeout_secs: 1,
        // (the script's watches last 200 ms: not "very short" here)
        short_watch: Duration::from_millis(50),
        ..Default::default()
    };
    let running = start_reflector(upstream, writer, opts);
    reader.wait_for(Rv(25), Duration::from_secs(5)).await.unwrap();
    // Until a few quiet watches have ended (the script's 5th request on).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while script.log.lock().len() < 7 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(script.log.lock().len() >= 7, "{:?}", script.log.lock());
    assert_eq!(script.probes.load(std::sync::atomic::Ordering::SeqCst), 0);
    running.stop().await;
}

/// The upstream of `a_watch_ended_early_by_an_upstream_gone_back_relists`: a list at 10, the
/// watch from it ended at once and cleanly (an apiserver re-initialising its watch cache on
/// an etcd restored without a revision bump), the probe and the next list at 7.
async fn answer_gone_back(
    script: Arc<Script>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    let n = {
        let mut log = script.log.lock();
        log.push(q.clone());
        log.len()
    };
    if is_probe(&q) {
        return json(list(7, &[]));
    }
    json(match (n, q.contains("watch=true")) {
        (1, false) => list(10, &[cm("a", 5), cm("b", 6)]),
        (2, true) => String::new(),
        (_, false) => list(7, &[cm("a", 5), cm("c", 7)]),
        _ => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            String::new()
        }
    })
}

/// A watch the upstream ends cleanly before its `timeoutSeconds` is followed by the probe
/// failed watches get: an upstream whose storage went back (etcd restored without a revision
/// bump: its watch cache re-initialises and ends every watch cleanly) would accept the re-watch
/// from our RV, ahead of it, and stay silent, and after a quiet second the gone state would be
/// served as current (a review). Here the probe sees it behind: the cache relists at once.
#[tokio::test]
async fn a_watch_ended_early_by_an_upstream_gone_back_relists() {
    let (addr, script) = scripted(|s, r| Box::pin(answer_gone_back(s, r))).await;
    let (upstream, writer, reader) = configmaps_against(addr);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let opts = ReflectorOptions { backoff_initial: Duration::from_millis(10), ..Default::default() };
    let metrics = Arc::new(Metrics::new());
    let task = tokio::spawn(reflector::run(upstream, writer, opts, metrics.clone(), stop));
    let mut rx = reader.subscribe();
    tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|p| p.ready && p.rv == Rv(7)))
        .await
        .expect("relisted at the upstream's RV")
        .unwrap();
    let keys: Vec<String> = reader.snapshot().store.keys().map(|k| k.as_str().to_owned()).collect();
    assert_eq!(keys, ["ns/a", "ns/c"]);
    let log = script.log.lock().clone();
    assert!(log[1].contains("watch=true") && log[1].contains("resourceVersion=10"), "{log:?}");
    assert!(is_probe(&log[2]), "probed before re-watching: {log:?}");
    assert!(!log[3].contains("watch") && !is_probe(&log[3]), "then relisted: {log:?}");
    let text = metrics.render();
    assert!(
        text.contains(
            r#"watchcache_reflector_errors_total{reason="upstream_behind",resource="configmaps"} 1"#
        ),
        "{text}"
    );
    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

/// The upstream of `a_cache_whose_relist_keeps_failing_ends_its_watches_past_max_staleness`:
/// a list at 10, the watch from it answered 410, every list after it a 500.
async fn answer_relist_failing(
    script: Arc<Script>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    let n = {
        let mut log = script.log.lock();
        log.push(q.clone());
        log.len()
    };
    if n == 1 {
        return json(list(10, &[cm("a", 5)]));
    }
    if q.contains("watch=true") {
        return json(r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 10 (20)","reason":"Expired","code":410}}
"#.to_owned());
    }
    let mut resp = json(r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcdserver: request timed out","code":500}"#.to_owned())?;
    *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
    Ok(resp)
}

/// A cache whose relist keeps failing after a 410 holds a state it cannot prove current: past
/// `--max-staleness` its watches end (their clients re-watch; the proxy forwards a stale
/// cache's requests), as the apiserver ends its watchers when its own list-and-watch restarts,
/// instead of staying open, quiet, with a BOOKMARK at the old RV before their deadline saying
/// all is current (a review).
#[tokio::test]
async fn a_cache_whose_relist_keeps_failing_ends_its_watches_past_max_staleness() {
    let (addr, _script) = scripted(|s, r| Box::pin(answer_relist_failing(s, r))).await;
    let (upstream, writer, reader) = configmaps_against(addr);
    let opts = ReflectorOptions {
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        max_staleness: Duration::from_millis(300),
        ..Default::default()
    };
    let running = start_reflector(upstream, writer, opts);
    reader.wait_for(Rv(10), Duration::from_secs(5)).await.unwrap();
    let mut w = reader
        .watch(WatchRequest {
            filter: Filter::default(),
            start: WatchStart::After(Rv(10)),
            bookmarks: true,
            deadline: tokio::time::Instant::now() + Duration::from_secs(60),
        })
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), w.next()).await.expect("ended past max staleness");
    assert!(end.is_none(), "nothing more, no BOOKMARK at the old RV: {end:?}");
    assert!(reader.staleness().is_some_and(|s| s > Duration::from_millis(300)));
    running.stop().await;
}

/// The upstream of `one_failure_of_a_quiet_current_cache_leaves_its_watches_open`: a list at
/// 10; the watch from it answered 500 after 1.5 s; then quiet watches and probes at 10.
async fn answer_one_failure(
    script: Arc<Script>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    let n = {
        let mut log = script.log.lock();
        log.push(q.clone());
        log.len()
    };
    if n == 1 || is_probe(&q) {
        return json(list(10, &[cm("a", 5)]));
    }
    if n == 2 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut resp = json(r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"rolling","code":500}"#.to_owned())?;
        *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        return Ok(resp);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    json(String::new())
}

/// One failure (an apiserver rolling) of a cache that has had no proof for longer than
/// `--max-staleness` — a quiet resource between its watches — is no reason to end its watches:
/// only failures lasting that long are (a review of the first version, which sent every watch
/// of such a resource upstream at once).
#[tokio::test]
async fn one_failure_of_a_quiet_current_cache_leaves_its_watches_open() {
    let (addr, script) = scripted(|s, r| Box::pin(answer_one_failure(s, r))).await;
    let (upstream, writer, reader) = configmaps_against(addr);
    let opts = ReflectorOptions {
        backoff_initial: Duration::from_millis(10),
        max_staleness: Duration::from_millis(300),
        short_watch: Duration::from_millis(50),
        ..Default::default()
    };
    let running = start_reflector(upstream, writer, opts);
    reader.wait_for(Rv(10), Duration::from_secs(5)).await.unwrap();
    let mut w = reader
        .watch(WatchRequest {
            filter: Filter::default(),
            start: WatchStart::After(Rv(10)),
            bookmarks: false,
            deadline: tokio::time::Instant::now() + Duration::from_secs(60),
        })
        .unwrap();
    // Until the failed watch is behind and the reflector watches again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while script.log.lock().len() < 5 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(script.log.lock().len() >= 5, "{:?}", script.log.lock());
    assert!(reader.staleness().is_some_and(|s| s > Duration::from_millis(300)), "stale by proof age");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), w.next()).await.is_err(),
        "the watch is still open"
    );
    running.stop().await;
}

/// The upstream of `an_object_that_cannot_be_parsed_forwards_the_resource_until_a_list_parses`.
async fn answer_unparsable(
    script: Arc<Script>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    let n = {
        let mut log = script.log.lock();
        log.push(q.clone());
        script.at.lock().push(std::time::Instant::now());
        log.len()
    };
    // No name: nothing a real apiserver sends, and nothing the cache can key.
    let nameless = |rv: u64| format!(r#"{{"metadata":{{"namespace":"ns","resourceVersion":"{rv}"}}}}"#);
    let body = match (n, q.contains("watch=true")) {
        (1, false) => list(10, &[cm("a", 5), cm("b", 6)]),
        // A change, one that cannot be parsed, then one more that must not be applied after it.
        (2, true) => format!(
            "{{\"type\":\"MODIFIED\",\"object\":{}}}\n{{\"type\":\"MODIFIED\",\"object\":{}}}\n{{\"type\":\"MODIFIED\",\"object\":{}}}\n",
            typed("a", 11),
            nameless(12),
            typed("b", 13)
        ),
        // The next list still holds it: the cache stays out of service.
        (3, false) => list(14, &[cm("a", 11), nameless(12), cm("b", 13)]),
        // Fixed upstream: the cache serves again.
        (4, false) => list(20, &[cm("a", 11), cm("b", 13), cm("c", 19)]),
        _ => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            String::new()
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}

/// An object the cache cannot parse is never skipped: every watch ends after what it got
/// before it (its client re-watches, forwarded), no watch starts, nothing after it is applied,
/// and the resource is forwarded until a full list parses whole; a list that still holds it
/// is not installed.
#[tokio::test]
async fn an_object_that_cannot_be_parsed_forwards_the_resource_until_a_list_parses() {
    let (addr, script) = scripted(|s, r| Box::pin(answer_unparsable(s, r))).await;
    let (upstream, writer, reader) = configmaps_against(addr);
    let mut progress = reader.subscribe();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let opts = ReflectorOptions {
        backoff_initial: Duration::from_millis(10),
        unparsable_retry: Duration::from_millis(50),
        ..Default::default()
    };
    let metrics = Arc::new(Metrics::new());
    let task = tokio::spawn(reflector::run(upstream, writer, opts, metrics.clone(), stop));
    reader.wait_for(Rv(10), Duration::from_secs(5)).await.unwrap();
    let watch = |start| WatchRequest {
        filter: Filter::default(),
        start,
        bookmarks: false,
        deadline: tokio::time::Instant::now() + Duration::from_secs(30),
    };
    let mut w = reader.watch(watch(WatchStart::After(Rv(10)))).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), progress.wait_for(|p| p.unservable));
    let p = first.await.expect("unservable in time").unwrap().clone();
    assert!(!p.ready, "{p:?}");
    assert_eq!(p.rv, Rv(11), "nothing after the object that cannot be parsed was applied");
    assert!(p.last_error.as_deref().is_some_and(|e| e.contains("no metadata.name")), "{p:?}");
    assert!(
        matches!(reader.watch(watch(WatchStart::Now)), Err(kube_watchcache::error::Error::Unparsable)),
        "no watch starts"
    );
    let mut got = Vec::new();
    while let Some(f) = tokio::time::timeout(Duration::from_secs(5), w.next()).await.expect("the watch ends")
    {
        let v: serde_json::Value = serde_json::from_slice(&f).unwrap();
        got.push(format!("{} {}", v["type"].as_str().unwrap(), v["object"]["metadata"]["resourceVersion"]));
    }
    assert_eq!(got, ["MODIFIED \"11\""], "the watch ends after what it got before");

    // The list that still holds it is not installed; the one after it is.
    let back = tokio::time::timeout(Duration::from_secs(10), progress.wait_for(|p| p.ready));
    let p = back.await.expect("ready again in time").unwrap().clone();
    assert!(!p.unservable);
    assert_eq!(p.rv, Rv(20));
    let log = script.log.lock().clone();
    assert!(log.len() >= 4 && !log[2].contains("watch") && !log[3].contains("watch"), "{log:?}");
    // The wait before each list: 50 ms × [1, 2) after the watch, then doubled after a list
    // that still held the object.
    let at = script.at.lock().clone();
    assert!(at[2] - at[1] >= Duration::from_millis(50), "{:?}", at[2] - at[1]);
    assert!(at[3] - at[2] >= Duration::from_millis(100), "doubled: {:?}", at[3] - at[2]);
    let snap = reader.snapshot();
    assert_eq!(
        snap.store.keys().map(|k| k.as_str().to_owned()).collect::<Vec<_>>(),
        ["ns/a", "ns/b", "ns/c"]
    );
    assert!(reader.watch(watch(WatchStart::Now)).is_ok(), "watches start again");
    let text = metrics.render();
    assert!(text.contains(r#"watchcache_unparseable_objects_total{resource="configmaps"} 2"#), "{text}");
    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

/// Lets the held list of `answer_restored` go.
static RELEASE_LIST: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The upstream of `a_restored_state_the_upstream_no_longer_has_is_not_served_while_it_relists`:
/// the resumed watch from 10 is answered 410; the list waits for [`RELEASE_LIST`].
async fn answer_restored(
    script: Arc<Script>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
    script.log.lock().push(q.clone());
    let body = if q.contains("watch=true") && q.contains("resourceVersion=10&") {
        r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 10 (20)","reason":"Expired","code":410}}
"#
        .to_owned()
    } else if q.contains("watch=true") {
        tokio::time::sleep(Duration::from_millis(200)).await;
        String::new()
    } else {
        RELEASE_LIST.notified().await;
        list(25, &[cm("c", 22)])
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}

/// A cache restored from `--state-dir` (ready at its saved RV before any upstream answer) whose
/// RV the upstream no longer has — the resumed watch gets 410 — holds a state from before the
/// proxy's downtime: it is not ready while it relists, as at a cold start, instead of serving
/// that state until the list is in. A cache the reflector itself listed keeps serving through
/// such a relist (`list_watch_rewatch_relist`): its state is seconds old.
#[tokio::test]
async fn a_restored_state_the_upstream_no_longer_has_is_not_served_while_it_relists() {
    let (addr, script) = scripted(|s, r| Box::pin(answer_restored(s, r))).await;
    let (upstream, mut writer, reader) = configmaps_against(addr);
    // What a restore leaves: the cache ready at the saved RV, its reflector to resume from it.
    writer.restore(Vec::new(), Rv(10), Vec::new(), Rv(10)).unwrap();
    assert!(reader.progress().ready);
    let opts = ReflectorOptions { backoff_initial: Duration::from_millis(10), ..Default::default() };
    let running = start_reflector(upstream, writer, opts);

    let mut rx = reader.subscribe();
    let p = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|p| !p.ready))
        .await
        .expect("not ready after the 410")
        .unwrap()
        .clone();
    let why = p.last_error.unwrap_or_default();
    assert!(why.contains("restored at resourceVersion 10, which the upstream no longer has"), "{why}");
    assert_eq!(p.rv, Rv(10));
    RELEASE_LIST.notify_one();
    reader.wait_for(Rv(25), Duration::from_secs(5)).await.expect("ready once relisted");
    assert!(reader.progress().ready);
    let log = script.log.lock().clone();
    assert!(log[0].contains("watch=true") && log[0].contains("resourceVersion=10&"), "{log:?}");
    assert!(!log[1].contains("watch"), "the relist: {log:?}");
    running.stop().await;
}
