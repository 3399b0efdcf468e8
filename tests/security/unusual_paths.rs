//! Issue 30 §1 against a real kube-apiserver 1.28.7 (`tests/recordings/v1.28.7-raw/
//! unusual-paths.json`, recorded with `../shared/realk8s`): the apiserver routes the decoded
//! path split on every `/` (an encoded `/` in a namespace makes a Secret's subresource, 404
//! here) and refuses a name that is not a valid path segment with 400. The sim answers as it
//! does, and the proxy forwards what it must not serve and so answers the same (with `--auth=none`
//! an encoded `/` is refused before anything, by the loopback guard: not replayed through it).

use crate::common;

use common::*;
use http::Method;
use serde_json::{json, Value};

fn recording() -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/recordings/v1.28.7-raw/unusual-paths.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("recording")).expect("JSON")
}

#[tokio::test]
async fn unusual_paths_are_answered_as_the_apiserver_answers_them() {
    let env = start().await;
    env.ns("default");
    env.sim
        .sim
        .create(
            "secrets",
            "default",
            json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"super-secret"}}),
        )
        .expect("secret");
    env.sim
        .sim
        .create(
            "configmaps",
            "default",
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm1"}}),
        )
        .expect("configmap");
    let rec = recording();
    let requests = rec["requests"].as_array().expect("requests");
    assert!(requests.len() >= 6);
    for r in requests {
        let path = r["path"].as_str().unwrap();
        let want = r["status"].as_u64().unwrap() as u16;
        let mut urls = vec![("sim", env.sim_url(path))];
        if !path.to_ascii_lowercase().contains("%2f") {
            urls.push(("proxy", env.proxy_url(path)));
        }
        for (who, url) in urls {
            let got = send(&env.client, Method::GET, &url, None, &[]).await;
            assert_eq!(got.status.as_u16(), want, "{who} {path}: {}", String::from_utf8_lossy(&got.body));
            let body = got.json();
            match r["body"]["kind"].as_str() {
                Some("Status") => assert_eq!(body["message"], r["body"]["message"], "{who} {path}"),
                Some(list) => {
                    assert_eq!(body["kind"], list, "{who} {path}");
                    assert_eq!(body["items"], r["body"]["items"], "{who} {path}");
                }
                None => panic!("recorded body without a kind"),
            }
        }
    }
    env.proxy.shutdown().await;
}

/// Behind a base URL with a path prefix (a front proxy serving several clusters, such as
/// `https://rancher/k8s/clusters/c-1`), a `.` or `..` segment — also percent-encoded, or after
/// a backslash (after a `%2F` too: `--auth=none` refuses that first, the unit test of
/// `upstream::client` covers it) — is refused with 400 and never sent: a front proxy that normalizes
/// it would take the request out of the prefix, to another cluster or its own API, with the
/// proxy's credentials. Without a prefix the same path is forwarded as it came (the apiserver
/// reads it as it does, with nothing above it to escape to).
#[tokio::test]
async fn a_dot_segment_never_leaves_the_upstream_path_prefix() {
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = listener.local_addr().unwrap();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let log = log.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    log.lock().unwrap().push(req.uri().path().to_owned());
                    let mut resp = http::Response::new(http_body_util::Full::new(bytes::Bytes::from("{}")));
                    *resp.status_mut() = http::StatusCode::NOT_FOUND;
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            });
        }
    });
    let escapes = [
        "/api/../../c-2/api/v1/secrets",
        "/api/v1/namespaces/default/configmaps/..",
        "/api/%2e%2E/%2e%2e/v3/tokens",
        "/api/v1/namespaces/default/configmaps/cm1%5C..",
        "/./api/v1/secrets",
    ];
    let client = client();
    for (prefix, refused) in [("/k8s/clusters/c-1", true), ("", false)] {
        let url = format!("http://{front}{prefix}");
        let args =
            kube_watchcache::config::ServeArgs::local(&url, &["configmaps"], "127.0.0.1:0".parse().unwrap());
        let proxy = kube_watchcache::app::start(&args).await.expect("proxy starts");
        seen.lock().unwrap().clear();
        for path in escapes {
            for method in [Method::GET, Method::POST] {
                let got =
                    send(&client, method.clone(), &format!("http://{}{path}", proxy.addr), None, &[]).await;
                if refused {
                    assert_eq!(got.status.as_u16(), 400, "{method} {path}");
                    let body = got.json();
                    assert_eq!(
                        (body["kind"].as_str(), body["reason"].as_str()),
                        (Some("Status"), Some("BadRequest"))
                    );
                } else {
                    assert_eq!(got.status.as_u16(), 404, "{method} {path}: forwarded as it came");
                }
            }
        }
        let sent = seen.lock().unwrap().clone();
        let dotted: Vec<&String> = sent.iter().filter(|p| escapes.iter().any(|e| p.ends_with(e))).collect();
        if refused {
            assert!(dotted.is_empty(), "sent below {prefix}: {dotted:?}");
            // A name that merely holds dots is no dot segment: forwarded.
            let plain = format!("http://{}/api/v1/namespaces/default/configmaps/a..b", proxy.addr);
            assert_eq!(send(&client, Method::GET, &plain, None, &[]).await.status.as_u16(), 404);
            assert!(seen
                .lock()
                .unwrap()
                .iter()
                .any(|p| p == "/k8s/clusters/c-1/api/v1/namespaces/default/configmaps/a..b"));
        } else {
            assert_eq!(dotted.len(), 2 * escapes.len(), "{sent:?}");
        }
        proxy.shutdown().await;
    }
}
