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
}

async fn answer(script: Arc<Script>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let q = req.uri().query().unwrap_or("").to_owned();
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

#[tokio::test]
async fn list_watch_rewatch_relist() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let script = Arc::new(Script { log: Mutex::new(Vec::new()) });
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

    let upstream =
        Upstream::new(&UpstreamOptions { upstream: Some(format!("http://{addr}")), ..Default::default() })
            .unwrap();
    let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let (writer, reader) = cache::new(kind, CacheOptions::default());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let opts = ReflectorOptions { backoff_initial: Duration::from_millis(10), ..Default::default() };
    let task = tokio::spawn(reflector::run(upstream, writer, opts, Arc::new(Metrics::new()), stop));

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
    stop_tx.send(true).unwrap();
    task.await.unwrap();
}
