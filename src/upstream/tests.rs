//! Tests of `upstream` through its public API: configuration sources, discovery, LIST/WATCH and
//! forwarding against tiny in-test servers on 127.0.0.1:0 (plain and TLS).

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::config::{resolve_with, Env};
use super::testutil::*;
use super::*;
use crate::resource::{EventType, Rv};

fn no_env() -> Env {
    Env { kubeconfig_var: None, home: None, in_cluster: false, ssl_cert_file: None }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Three contexts: `a` (CA data + token), `b` (insecure, tokenFile relative to the file, path
/// prefix), `c` (client certificate data), `x` (exec plugin only).
fn kubeconfig(dir: &TempDir) -> std::path::PathBuf {
    dir.write("token-b", "tok-b\n");
    let yaml = format!(
        r#"apiVersion: v1
kind: Config
current-context: a
clusters:
- name: ca-cluster
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: {ca}
- name: insecure-cluster
  cluster:
    server: http://127.0.0.1:8080/prefix/
    insecure-skip-tls-verify: true
    tls-server-name: apiserver.test
contexts:
- name: a
  context: {{cluster: ca-cluster, user: token-user, namespace: ns-a}}
- name: b
  context: {{cluster: insecure-cluster, user: file-user}}
- name: c
  context: {{cluster: ca-cluster, user: cert-user}}
- name: x
  context: {{cluster: ca-cluster, user: exec-user}}
users:
- name: token-user
  user: {{token: tok-a}}
- name: file-user
  user: {{tokenFile: token-b}}
- name: cert-user
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
- name: exec-user
  user:
    exec: {{apiVersion: client.authentication.k8s.io/v1, command: kwc-no-such-auth-plugin}}
"#,
        ca = b64(CA_PEM),
        cert = b64(CLIENT_PEM),
        key = b64(CLIENT_KEY),
    );
    dir.write("config", &yaml)
}

fn opts_kubeconfig(path: &std::path::Path, context: Option<&str>) -> UpstreamOptions {
    UpstreamOptions {
        kubeconfig: Some(path.to_owned()),
        context: context.map(str::to_owned),
        ..Default::default()
    }
}

#[test]
fn kubeconfig_current_context_with_ca_data_and_token() {
    let dir = TempDir::new();
    let path = kubeconfig(&dir);
    let r = resolve_with(&opts_kubeconfig(&path, None), &no_env()).unwrap();
    assert_eq!(r.base_url, "https://127.0.0.1:6443");
    assert_eq!(r.tls.roots.len(), 1);
    assert!(!r.tls.insecure);
    assert!(r.tls.identity.is_none());
    assert_eq!(r.auth.header().unwrap(), "Bearer tok-a");
    assert_eq!(r.origin, format!("kubeconfig {}, context a", path.display()));
}

/// A client certificate whose certificate and key are both files is read again later
/// (client-go's `ReloadTLSFiles`), from the flags or a kubeconfig; inline data is not.
#[tokio::test]
async fn certificate_files_are_watched_data_is_not() {
    let dir = TempDir::new();
    let (cert, key) = (dir.write("c.pem", CLIENT_PEM), dir.write("c.key", CLIENT_KEY));
    let flags = UpstreamOptions {
        upstream: Some("https://127.0.0.1:6443".into()),
        client_certificate: Some(cert.clone()),
        client_key: Some(key.clone()),
        ..Default::default()
    };
    let watched = |o: &UpstreamOptions| {
        resolve_with(o, &no_env()).unwrap().tls.identity.unwrap().reload_files().map(|t| t.abort()).is_some()
    };
    assert!(watched(&flags));
    let config = |user: String| {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters:\n- name: c\n  cluster: {{server: \"http://127.0.0.1:8080\"}}\ncontexts:\n- name: a\n  context: {{cluster: c, user: u}}\nusers:\n- name: u\n  user: {user}\n"
        );
        opts_kubeconfig(&dir.write("config", &yaml), None)
    };
    let files = format!("{{client-certificate: {}, client-key: {}}}", cert.display(), key.display());
    assert!(watched(&config(files)));
    let data = format!("{{client-certificate-data: {}, client-key: {}}}", b64(CLIENT_PEM), key.display());
    assert!(!watched(&config(data)));
}

/// A user with both `token` and `tokenFile`: the file's token is sent (client-go's
/// `NewBearerAuthWithRefreshRoundTripper`), the fixed one while the file cannot be read.
#[test]
fn token_file_wins_over_token() {
    let dir = TempDir::new();
    let file = dir.write("tok", "from-file\n");
    let config = |file: &std::path::Path| {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters:\n- name: c\n  cluster: {{server: \"http://127.0.0.1:8080\"}}\ncontexts:\n- name: a\n  context: {{cluster: c, user: u}}\nusers:\n- name: u\n  user: {{token: fixed, tokenFile: {}}}\n",
            file.display()
        );
        opts_kubeconfig(&dir.write("config", &yaml), None)
    };
    let r = resolve_with(&config(&file), &no_env()).unwrap();
    assert_eq!(r.auth.header().unwrap(), "Bearer from-file");
    let r = resolve_with(&config(&dir.path().join("absent")), &no_env()).unwrap();
    assert_eq!(r.auth.header().unwrap(), "Bearer fixed");
}

#[test]
fn kubeconfig_context_selection_insecure_and_token_file() {
    let dir = TempDir::new();
    let path = kubeconfig(&dir);
    let r = resolve_with(&opts_kubeconfig(&path, Some("b")), &no_env()).unwrap();
    assert_eq!(r.base_url, "http://127.0.0.1:8080/prefix");
    assert!(r.tls.insecure);
    assert_eq!(r.tls.server_name.as_deref(), Some("apiserver.test"));
    // tokenFile is relative to the kubeconfig's directory.
    assert_eq!(r.auth.header().unwrap(), "Bearer tok-b");

    let c = resolve_with(&opts_kubeconfig(&path, Some("c")), &no_env()).unwrap();
    let id = c.tls.identity.as_ref().expect("client certificate from data");
    assert_eq!(id.current().cert.len(), 1);
    assert!(matches!(c.auth, auth::Credentials::None));
}

/// A certificate authority verifies: `--certificate-authority` overrides a kubeconfig's
/// insecure-skip-tls-verify (as kubectl's flag does); the two flags together, or a kubeconfig
/// cluster with both, are client-go's refusal (a review: the roots were loaded and nothing
/// was verified).
#[test]
fn a_certificate_authority_is_never_combined_with_insecure() {
    let dir = TempDir::new();
    let path = kubeconfig(&dir);
    let ca = dir.write("ca.pem", CA_PEM);
    let mut opts = opts_kubeconfig(&path, Some("b"));
    opts.certificate_authority = Some(ca);
    let r = resolve_with(&opts, &no_env()).unwrap();
    assert!(!r.tls.insecure, "the CA given verifies");
    assert_eq!(r.tls.roots.len(), 1);
    opts.insecure_skip_tls_verify = true;
    let e = resolve_with(&opts, &no_env()).err().unwrap().to_string();
    assert!(e.contains("specifying a root certificates file with the insecure flag is not allowed"), "{e}");
    let both = dir.write(
        "both",
        &format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\nusers:\n- name: u\n  user: {{token: t}}\n",
            b64(CA_PEM)
        ),
    );
    let e = resolve_with(&opts_kubeconfig(&both, None), &no_env()).err().unwrap().to_string();
    assert!(e.contains("specifying a root certificates file with the insecure flag is not allowed"), "{e}");
}

#[test]
fn kubeconfig_errors_are_one_line() {
    let dir = TempDir::new();
    let path = kubeconfig(&dir);
    let unknown = resolve_with(&opts_kubeconfig(&path, Some("nope")), &no_env()).err().unwrap().to_string();
    assert_eq!(unknown, format!("kubeconfig {}: context \"nope\" not found", path.display()));

    let missing = dir.path().join("absent");
    let e = resolve_with(&opts_kubeconfig(&missing, None), &no_env()).err().unwrap().to_string();
    assert!(e.starts_with(&format!("cannot read kubeconfig {}: ", missing.display())), "{e}");

    let broken = dir.write("broken", "clusters: [\n  - name: x\n    cluster: {server: \"unterminated\n");
    let e = resolve_with(&opts_kubeconfig(&broken, None), &no_env()).err().unwrap().to_string();
    assert!(e.starts_with(&format!("kubeconfig {}: ", broken.display())), "{e}");

    // The plugin is run (exec_tests.rs); one that is not installed stops the start.
    let exec = resolve_with(&opts_kubeconfig(&path, Some("x")), &no_env()).err().unwrap().to_string();
    assert!(exec.starts_with("user \"exec-user\": exec plugin kwc-no-such-auth-plugin: "), "{exec}");

    let none = resolve_with(&UpstreamOptions::default(), &no_env()).err().unwrap();
    assert!(matches!(none, ConfigError::NoSource));

    for e in [unknown, e, exec, none.to_string()] {
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn in_cluster_is_the_last_resort_and_fails_in_one_line() {
    // The test process has no KUBERNETES_SERVICE_HOST, so kube-client's loader fails.
    let env = Env { in_cluster: true, ..no_env() };
    let e = resolve_with(&UpstreamOptions::default(), &env).err().unwrap().to_string();
    assert!(e.starts_with("in-cluster config: "), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn kubeconfig_from_env_var_and_home() {
    let dir = TempDir::new();
    let path = kubeconfig(&dir);
    // $KUBECONFIG lists files; the first to set current-context wins.
    let other = dir.write("other", "apiVersion: v1\nkind: Config\ncurrent-context: b\n");
    let list = std::env::join_paths([&path, &other]).unwrap();
    let env = Env { kubeconfig_var: Some(list), ..no_env() };
    let r = resolve_with(&UpstreamOptions::default(), &env).unwrap();
    assert_eq!(r.base_url, "https://127.0.0.1:6443");

    let home = TempDir::new();
    std::fs::create_dir_all(home.path().join(".kube")).unwrap();
    std::fs::copy(&path, home.path().join(".kube/config")).unwrap();
    std::fs::copy(dir.path().join("token-b"), home.path().join(".kube/token-b")).unwrap();
    let env = Env { home: Some(home.path().to_owned()), ..no_env() };
    let r = resolve_with(&UpstreamOptions { context: Some("b".into()), ..Default::default() }, &env).unwrap();
    assert_eq!(r.base_url, "http://127.0.0.1:8080/prefix");
}

#[test]
fn upstream_url_without_kubeconfig() {
    let dir = TempDir::new();
    let token = dir.write("token", "proxy-secret");
    let opts = UpstreamOptions {
        upstream: Some("http://127.0.0.1:9/".into()),
        token_file: Some(token.clone()),
        ..Default::default()
    };
    let up = Upstream::new(&opts).unwrap();
    assert_eq!(up.base_url(), "http://127.0.0.1:9");
    let d = up.describe();
    assert_eq!(d, format!("http://127.0.0.1:9 (--upstream; bearer token from {})", token.display()));
    assert!(!d.contains("proxy-secret"));

    // --upstream wins over a kubeconfig, and the flags apply on top.
    let kc = kubeconfig(&dir);
    let ca = dir.write("ca.pem", CA_PEM);
    let opts = UpstreamOptions {
        upstream: Some("https://10.0.0.1:6443".into()),
        kubeconfig: Some(kc),
        certificate_authority: Some(ca),
        ..Default::default()
    };
    let r = resolve_with(&opts, &no_env()).unwrap();
    assert_eq!((r.base_url.as_str(), r.tls.roots.len()), ("https://10.0.0.1:6443", 1));

    for (url, shown, want) in [
        ("ftp://x", "ftp://x", "scheme must be http or https"),
        ("127.0.0.1:6443", "127.0.0.1:6443", "expected scheme://host[:port]"),
        // The query is not repeated (it may hold a token).
        ("https://h:1/?a=b", "https://h:1/?***", "a query is not allowed"),
    ] {
        let opts = UpstreamOptions { upstream: Some(url.into()), ..Default::default() };
        let e = Upstream::new(&opts).err().unwrap().to_string();
        assert_eq!(e, format!("invalid upstream URL \"{shown}\": {want}"));
    }
    // Credentials in the URL are refused, and the error does not repeat them.
    for (url, shown) in [
        ("https://admin:hunter2@10.0.0.1:6443", "https://***@10.0.0.1:6443"),
        ("https://tok%40en@10.0.0.1:6443/prefix", "https://***@10.0.0.1:6443/prefix"),
        ("https://a:b@c@10.0.0.1:6443/x?y=z", "https://***@10.0.0.1:6443/x?***"),
        ("admin:hunter2@10.0.0.1:6443", "***@10.0.0.1:6443"),
    ] {
        let opts = UpstreamOptions { upstream: Some(url.into()), ..Default::default() };
        let e = Upstream::new(&opts).err().unwrap().to_string();
        assert!(!e.contains("hunter2") && !e.contains("tok%40en") && !e.contains("a:b"), "{e}");
        assert!(e.starts_with(&format!("invalid upstream URL \"{shown}\": ")), "{e}");
    }
    let half = UpstreamOptions {
        upstream: Some("http://127.0.0.1:9".into()),
        client_certificate: Some(dir.path().join("c.pem")),
        ..Default::default()
    };
    assert!(Upstream::new(&half).err().unwrap().to_string().contains("must be given together"));
}

// ---------------------------------------------------------------------------------------------
// Servers

/// One request as the fake apiserver saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    uri: String,
    headers: HeaderMap,
    body: Bytes,
    conn: ConnInfo,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A fake apiserver: records every request, answers with `route(path_and_query)`.
async fn fake_apiserver(
    tls: bool,
    route: impl Fn(&Seen) -> (StatusCode, String) + Send + Sync + 'static,
) -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let (l, route) = (log.clone(), Arc::new(route));
    let h = handler(move |conn, req: Request<hyper::body::Incoming>| {
        let (l, route) = (l.clone(), route.clone());
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let seen = Seen {
                method: parts.method,
                uri: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default(),
                headers: parts.headers,
                body,
                conn,
            };
            let (code, text) = route(&seen);
            l.lock().push(seen);
            let mut resp = Response::new(full(text));
            *resp.status_mut() = code;
            resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
            resp.headers_mut().insert("x-upstream", "yes".parse().unwrap());
            resp
        }
    });
    let addr = if tls { serve_tls(h).await } else { serve(h).await };
    (addr, log)
}

fn plain_upstream(addr: SocketAddr, token: Option<&TempDir>) -> Upstream {
    let token_file = token.map(|d| d.write("token", "proxy-secret\n"));
    Upstream::new(&UpstreamOptions {
        upstream: Some(format!("http://{addr}")),
        token_file,
        ..Default::default()
    })
    .unwrap()
}

/// The proxy's listener stand-in: every request goes through `Upstream::forward`.
async fn proxy_front(up: Upstream) -> SocketAddr {
    serve(handler(move |_, req| {
        let up = up.clone();
        async move {
            match up.forward(req).await {
                Ok(resp) => resp,
                Err(e) => {
                    let mut r = Response::new(full(e.to_string()));
                    *r.status_mut() = StatusCode::BAD_GATEWAY;
                    r
                }
            }
        }
    }))
    .await
}

fn test_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

// ---------------------------------------------------------------------------------------------
// Discovery (document shapes as kube-apiserver serves them)

const CORE_V1: &str = r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[
 {"name":"bindings","singularName":"binding","namespaced":true,"kind":"Binding","verbs":["create"]},
 {"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["create","delete","deletecollection","get","list","patch","update","watch"],"shortNames":["cm"],"storageVersionHash":"qFsyl6wFWjQ="},
 {"name":"nodes","singularName":"node","namespaced":false,"kind":"Node","verbs":["create","delete","deletecollection","get","list","patch","update","watch"],"shortNames":["no"]},
 {"name":"pods","singularName":"pod","namespaced":true,"kind":"Pod","verbs":["create","delete","deletecollection","get","list","patch","update","watch"],"shortNames":["po"],"categories":["all"]},
 {"name":"pods/exec","singularName":"","namespaced":true,"kind":"PodExecOptions","verbs":["create","get"]},
 {"name":"pods/log","singularName":"","namespaced":true,"kind":"Pod","verbs":["get"]}]}"#;

const APIS: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[
 {"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}],"preferredVersion":{"groupVersion":"apps/v1","version":"v1"}},
 {"name":"authorization.k8s.io","versions":[{"groupVersion":"authorization.k8s.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"authorization.k8s.io/v1","version":"v1"}},
 {"name":"capture.example.com","versions":[{"groupVersion":"capture.example.com/v1","version":"v1"},{"groupVersion":"capture.example.com/v1beta1","version":"v1beta1"}],"preferredVersion":{"groupVersion":"capture.example.com/v1","version":"v1"}}]}"#;

const APPS_V1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"apps/v1","resources":[
 {"name":"deployments","singularName":"deployment","namespaced":true,"kind":"Deployment","verbs":["create","delete","deletecollection","get","list","patch","update","watch"],"shortNames":["deploy"],"categories":["all"]},
 {"name":"deployments/scale","singularName":"","namespaced":true,"group":"autoscaling","version":"v1","kind":"Scale","verbs":["get","patch","update"]},
 {"name":"deployments/status","singularName":"","namespaced":true,"kind":"Deployment","verbs":["get","patch","update"]}]}"#;

const AUTHZ_V1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"authorization.k8s.io/v1","resources":[
 {"name":"subjectaccessreviews","singularName":"subjectaccessreview","namespaced":false,"kind":"SubjectAccessReview","verbs":["create"]}]}"#;

const CAPTURE_V1: &str =
    r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"capture.example.com/v1","resources":[]}"#;

const CAPTURE_V1BETA1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"capture.example.com/v1beta1","resources":[
 {"name":"widgets","singularName":"widget","namespaced":true,"kind":"Widget","verbs":["delete","deletecollection","get","list","patch","create","update","watch"],"storageVersionHash":"x"}]}"#;

fn discovery_route(s: &Seen) -> (StatusCode, String) {
    let doc = match s.uri.as_str() {
        "/api/v1" => CORE_V1,
        "/apis" => APIS,
        "/apis/apps/v1" => APPS_V1,
        "/apis/authorization.k8s.io/v1" => AUTHZ_V1,
        "/apis/capture.example.com/v1" => CAPTURE_V1,
        "/apis/capture.example.com/v1beta1" => CAPTURE_V1BETA1,
        // A dotted group: built in or not is read from the upstream's list encoding.
        "/apis/capture.example.com/v1beta1/widgets?limit=1" => {
            r#"{"apiVersion":"capture.example.com/v1beta1","items":[],"kind":"WidgetList","metadata":{"continue":"","resourceVersion":"9"}}"#
        }
        // Every named resource is tried with a one-item LIST (may the proxy list it?).
        u if u.ends_with("?limit=1") && !u.contains("example") => {
            r#"{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[]}"#
        }
        _ => return (StatusCode::NOT_FOUND, "404 page not found\n".into()),
    };
    (StatusCode::OK, doc.into())
}

const FORBIDDEN: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes is forbidden: User \"system:serviceaccount:kube-system:kwc\" cannot list resource \"nodes\" in API group \"\" at the cluster scope","reason":"Forbidden","details":{"kind":"nodes"},"code":403}"#;

/// The discovery of a cluster with an aggregated API (metrics.example.io, an APIService with a
/// service) and a resource the proxy may not list (nodes).
fn wildcard_route(s: &Seen) -> (StatusCode, String) {
    match s.uri.as_str() {
        "/apis" => (
            StatusCode::OK,
            APIS.replace(
                r#"{"name":"apps","#,
                r#"{"name":"metrics.example.io","versions":[{"groupVersion":"metrics.example.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"metrics.example.io/v1","version":"v1"}},
 {"name":"apps","#,
            ),
        ),
        "/apis/apiregistration.k8s.io/v1/apiservices" => (
            StatusCode::OK,
            r#"{"kind":"APIServiceList","apiVersion":"apiregistration.k8s.io/v1","metadata":{"resourceVersion":"9"},"items":[
             {"metadata":{"name":"v1.apps"},"spec":{"group":"apps","version":"v1","groupPriorityMinimum":17800,"versionPriority":15},"status":{}},
             {"metadata":{"name":"v1.metrics.example.io"},"spec":{"service":{"namespace":"m","name":"m","port":443},"group":"metrics.example.io","version":"v1","groupPriorityMinimum":100,"versionPriority":100},"status":{}}]}"#
                .into(),
        ),
        "/apis/metrics.example.io/v1" => (
            StatusCode::OK,
            r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"metrics.example.io/v1","resources":[
             {"name":"samples","singularName":"sample","namespaced":true,"kind":"Sample","verbs":["get","list","watch"]}]}"#
                .into(),
        ),
        "/api/v1/nodes?limit=1" => (StatusCode::FORBIDDEN, FORBIDDEN.into()),
        _ => discovery_route(s),
    }
}

#[tokio::test]
async fn wildcard_discovery_finds_everything_cacheable_and_says_what_it_skips() {
    let (addr, log) = fake_apiserver(false, wildcard_route).await;
    let up = plain_upstream(addr, None);
    let excluded = |g: &str, r: &str| g.is_empty() && r == "configmaps";
    let all = Round::new(&up).everything(&excluded, &[]).await.unwrap();
    let names: Vec<&str> = all.kinds.iter().map(|(n, _)| n.as_str()).collect();
    // Not bindings (create only), not pods/exec (a subresource), not configmaps (excluded),
    // not subjectaccessreviews; capture widgets at the only version that has them.
    assert_eq!(names, ["pods", "apps/deployments", "capture.example.com/widgets"]);
    assert_eq!(
        all.kinds[2].1,
        ResourceKind::new("capture.example.com", "v1beta1", "widgets", "Widget", true, false)
    );
    assert_eq!(all.kinds[1].1, ResourceKind::new("apps", "v1", "deployments", "Deployment", true, true));
    let skipped: Vec<(&str, SkipReason)> = all.skipped.iter().map(|s| (s.name.as_str(), s.reason)).collect();
    assert_eq!(
        skipped,
        [("nodes", SkipReason::Forbidden), ("metrics.example.io/samples", SkipReason::Aggregated)]
    );
    assert!(all.skipped[0].detail.contains("cannot list resource"), "{}", all.skipped[0].detail);
    let seen: Vec<String> = log.lock().iter().map(|s| s.uri.clone()).collect();
    assert_eq!(seen.iter().filter(|u| *u == "/apis").count(), 1, "/apis once per round: {seen:?}");
    assert!(!seen.iter().any(|u| u.contains("samples")), "an aggregated API is never listed: {seen:?}");
    assert!(!seen.iter().any(|u| u.contains("configmaps")), "an excluded resource is never listed");
    // The next round lists only what is not cached yet (here: the forbidden nodes again).
    let known: Vec<ResourceKind> = all.kinds.iter().map(|(_, k)| k.clone()).collect();
    let again = Round::new(&up).everything(&excluded, &known).await.unwrap();
    assert_eq!(again.kinds, all.kinds);
    let lists: Vec<String> = log
        .lock()
        .iter()
        .skip(seen.len())
        .filter(|s| s.uri.ends_with("?limit=1"))
        .map(|s| s.uri.clone())
        .collect();
    assert_eq!(lists, ["/api/v1/nodes?limit=1"]);
}

/// An APIService list that fails in passing (500, 429) fails the round, which changes nothing:
/// it never lets the aggregated `samples` be cached as if nothing were aggregated. One the
/// proxy may not read (403) is a standing state: warned, and nothing is known aggregated.
#[tokio::test]
async fn a_round_that_cannot_read_the_apiservices_in_passing_caches_nothing() {
    for (code, fails) in [
        (StatusCode::INTERNAL_SERVER_ERROR, true),
        (StatusCode::TOO_MANY_REQUESTS, true),
        (StatusCode::FORBIDDEN, false),
    ] {
        let (addr, _) = fake_apiserver(false, move |s: &Seen| match s.uri.as_str() {
            "/apis/apiregistration.k8s.io/v1/apiservices" => (code, FORBIDDEN.into()),
            _ => wildcard_route(s),
        })
        .await;
        let up = plain_upstream(addr, None);
        let none = |_: &str, _: &str| false;
        match Round::new(&up).everything(&none, &[]).await {
            Err(e) => assert!(fails, "{code}: {e}"),
            Ok(all) => {
                assert!(!fails, "{code}: a round went on");
                let aggregated = all.skipped.iter().any(|s| s.reason == SkipReason::Aggregated);
                assert!(!aggregated, "{code}: nothing is known aggregated: {:?}", all.skipped);
            }
        }
    }
}

#[tokio::test]
async fn a_named_resource_the_proxy_may_not_list_cannot_be_cached() {
    let (addr, _) = fake_apiserver(false, wildcard_route).await;
    let up = plain_upstream(addr, None);
    let e = up.discover(&["nodes".to_string()]).await.unwrap_err().to_string();
    assert!(
        e.starts_with("discovery: resource \"nodes\" cannot be cached: the proxy may not list it"),
        "{e}"
    );
    assert!(e.contains("remove it from --resources"), "{e}");
}

#[tokio::test]
async fn discovery_finds_kinds_scopes_and_builtin() {
    let (addr, log) = fake_apiserver(false, discovery_route).await;
    let dir = TempDir::new();
    let up = plain_upstream(addr, Some(&dir));
    let wanted: Vec<String> =
        ["pods", "nodes", "apps/deployments", "capture.example.com/widgets"].map(String::from).to_vec();
    let kinds = up.discover(&wanted).await.unwrap();
    assert_eq!(
        kinds,
        vec![
            ResourceKind::new("", "v1", "pods", "Pod", true, true),
            ResourceKind::new("", "v1", "nodes", "Node", false, true),
            ResourceKind::new("apps", "v1", "deployments", "Deployment", true, true),
            // Not in the preferred version: found in the next one listed.
            ResourceKind::new("capture.example.com", "v1beta1", "widgets", "Widget", true, false),
        ]
    );
    let seen = log.lock().clone();
    let paths: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/api/v1",
            "/api/v1/pods?limit=1",
            "/api/v1/nodes?limit=1",
            "/apis",
            "/apis/apps/v1",
            "/apis/apps/v1/deployments?limit=1",
            "/apis/capture.example.com/v1",
            "/apis/capture.example.com/v1beta1",
            "/apis/capture.example.com/v1beta1/widgets?limit=1"
        ],
        "each document fetched once, one list per resource (may the proxy list it? a dotted group's encoding)"
    );
    for s in &seen {
        assert_eq!(s.headers["accept"], "application/json");
        assert_eq!(s.headers["authorization"], "Bearer proxy-secret");
        assert!(s.headers["user-agent"].to_str().unwrap().starts_with("kube-watchcache/"));
    }
}

#[tokio::test]
async fn discovery_errors_name_the_resource() {
    let (addr, _) = fake_apiserver(false, discovery_route).await;
    let up = plain_upstream(addr, None);
    let cases = [
        ("apps/foos", "discovery: resource \"apps/foos\" not found on the upstream (looked in apps/v1)"),
        ("nope.io/things", "discovery: resource \"nope.io/things\": the upstream serves no API group \"nope.io\""),
        (
            "authorization.k8s.io/subjectaccessreviews",
            "discovery: resource \"authorization.k8s.io/subjectaccessreviews\" cannot be cached: its verbs lack list and watch",
        ),
        ("bindings", "discovery: resource \"bindings\" cannot be cached: its verbs lack list and watch"),
        // A subresource reads as group "pods": unknown either way.
        ("pods/log", "discovery: resource \"pods/log\": the upstream serves no API group \"pods\""),
    ];
    for (w, want) in cases {
        let e = up.discover(&[w.to_string()]).await.unwrap_err();
        assert_eq!(e.to_string(), want);
    }
}

// ---------------------------------------------------------------------------------------------
// LIST and WATCH with the proxy's credentials

#[tokio::test]
async fn list_page_sends_the_query_and_keeps_items() {
    let (addr, log) = fake_apiserver(false, |s| {
        if s.uri.contains("resourceVersion=1") {
            // As recorded in `compaction-continue-expired` (shortened).
            return (
                StatusCode::GONE,
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"The provided continue parameter is too old to display a consistent list result.","reason":"Expired","code":410}"#.into(),
            );
        }
        (
            StatusCode::OK,
            r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"abc"},"items":[{"metadata":{"name":"p1","namespace":"ns","resourceVersion":"40"}}]}"#.into(),
        )
    })
    .await;
    let up = plain_upstream(addr, None);
    let pods = ResourceKind::new("", "v1", "pods", "Pod", true, true);
    let page = up.list_page(&pods, 500, Some("a b"), None).await.unwrap();
    assert_eq!(page.rv, Rv(42));
    assert_eq!(page.continue_token.as_deref(), Some("abc"));
    assert_eq!(&page.items[0][..], br#"{"metadata":{"name":"p1","namespace":"ns","resourceVersion":"40"}}"#);
    assert_eq!(log.lock()[0].uri, "/api/v1/pods?limit=500&continue=a+b");
    assert!(log.lock()[0].headers.get("authorization").is_none(), "no token configured");

    let e = up.list_page(&pods, 500, None, Some(Rv(1))).await.unwrap_err();
    assert!(e.is_gone(), "{e}");
    assert_eq!(e.status_code(), Some(410));
    assert!(e
        .to_string()
        .starts_with("upstream answered HTTP 410: The provided continue parameter is too old"));
}

/// A metadata proof of a large selection reads it in pages of 500 (the first a consistent
/// read, the others by their tokens), never the whole collection's JSON at once, and gives it
/// as the one page a single LIST of `limit` items would have been.
#[tokio::test]
async fn metadata_lists_are_read_in_pages_and_given_as_one() {
    const N: usize = 1203;
    let (addr, log) = fake_apiserver(false, |s| {
        let q: std::collections::HashMap<String, String> =
            form_urlencoded::parse(s.uri.split_once('?').map_or("", |(_, q)| q).as_bytes()).into_owned().collect();
        let from: usize = q.get("continue").map_or(0, |t| t.trim_start_matches('t').parse().unwrap());
        let limit: usize = q.get("limit").map_or(N, |l| l.parse().unwrap());
        let to = (from + limit).min(N);
        let items: Vec<String> = (from..to)
            .map(|i| format!(r#"{{"metadata":{{"name":"c{i:04}","namespace":"ns","resourceVersion":"{}"}}}}"#, i + 1))
            .collect();
        let more = if to < N { format!(r#","continue":"t{to}","remainingItemCount":{}"#, N - to) } else { String::new() };
        let body = format!(
            r#"{{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{{"resourceVersion":"2000"{more}}},"items":[{}]}}"#,
            items.join(",")
        );
        (StatusCode::OK, body)
    })
    .await;
    let up = plain_upstream(addr, None);
    let cms = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let sel = Selection {
        namespace: Some("ns".into()),
        label_selector: "a=b".into(),
        field_selector: String::new(),
    };
    let uris = |log: &Log| log.lock().drain(..).map(|s| s.uri).collect::<Vec<_>>();

    for limit in [None, Some(0)] {
        let all = up.list_metadata(&cms, &sel, limit).await.unwrap();
        assert_eq!(
            (all.rv, all.items.len(), all.continue_token.as_deref(), all.remaining),
            (Rv(2000), N, None, None)
        );
        assert!(all
            .items
            .iter()
            .enumerate()
            .all(|(i, (ns, n, rv))| ns == "ns" && *n == format!("c{i:04}") && *rv == Rv(i as u64 + 1)));
        assert_eq!(
            uris(&log),
            [
                "/api/v1/namespaces/ns/configmaps?limit=500&labelSelector=a%3Db",
                "/api/v1/namespaces/ns/configmaps?limit=500&continue=t500&labelSelector=a%3Db",
                "/api/v1/namespaces/ns/configmaps?limit=500&continue=t1000&labelSelector=a%3Db",
            ]
        );
    }
    // A client's limit of 1 100: the pages end where its page would, with its continuation.
    let page = up.list_metadata(&cms, &sel, Some(1100)).await.unwrap();
    assert_eq!(
        (page.items.len(), page.continue_token.as_deref(), page.remaining),
        (1100, Some("t1100"), Some(103))
    );
    let asked = uris(&log);
    assert_eq!(asked.len(), 3);
    assert!(asked[2].starts_with("/api/v1/namespaces/ns/configmaps?limit=100&continue=t1000"), "{asked:?}");
    // A small limit: one page, as before.
    let page = up.list_metadata(&cms, &sel, Some(10)).await.unwrap();
    assert_eq!((page.items.len(), page.continue_token.as_deref()), (10, Some("t10")));
    assert_eq!(uris(&log).len(), 1);

    // An upstream that ignores `limit` (everything, no token): one request; one that repeats
    // its token: it stops rather than looping.
    let (addr, log) = fake_apiserver(false, |s| {
        let token = if s.uri.contains("repeat") { r#","continue":"same""# } else { "" };
        (StatusCode::OK, format!(r#"{{"metadata":{{"resourceVersion":"9"{token}}},"items":[{{"metadata":{{"name":"x","resourceVersion":"3"}}}}]}}"#))
    })
    .await;
    let up = plain_upstream(addr, None);
    let plain = Selection { namespace: None, label_selector: String::new(), field_selector: String::new() };
    assert_eq!(up.list_metadata(&cms, &plain, None).await.unwrap().items.len(), 1);
    assert_eq!(uris(&log).len(), 1);
    let repeat = Selection { label_selector: "repeat".into(), ..plain.clone() };
    let page = up.list_metadata(&cms, &repeat, None).await.unwrap();
    assert_eq!((page.items.len(), page.continue_token.as_deref()), (2, Some("same")));
    assert_eq!(uris(&log).len(), 2);

    // Tokens going round (A, B, A, …): it stops at the first one given again; a continued
    // page at another RV than the first (an upstream whose tokens do not keep their list's
    // RV): an error, no proof.
    let (addr, log) = fake_apiserver(false, |s| {
        let (next, rv) = match s.uri.split_once("continue=") {
            None => ("A", 9),
            Some((_, t)) if t.starts_with('A') => ("B", 9),
            Some((_, t)) if t.starts_with('B') => ("A", 9),
            Some(_) => ("C", 10),
        };
        let next = if s.uri.contains("drift") && next == "B" { "D" } else { next };
        (StatusCode::OK, format!(r#"{{"metadata":{{"resourceVersion":"{rv}","continue":"{next}"}},"items":[{{"metadata":{{"name":"x","resourceVersion":"3"}}}}]}}"#))
    })
    .await;
    let up = plain_upstream(addr, None);
    let page = up.list_metadata(&cms, &plain, None).await.unwrap();
    assert_eq!((page.items.len(), page.continue_token.as_deref()), (3, Some("A")));
    assert_eq!(uris(&log).len(), 3);
    let drift = Selection { label_selector: "drift".into(), ..plain.clone() };
    let e = up.list_metadata(&cms, &drift, None).await.unwrap_err();
    assert!(e.to_string().contains("at resourceVersion 10, its first page at 9"), "{e}");

    // Compacted between two pages (the token expired): an error, not a part of the list (the
    // proof then fails and the read is forwarded).
    let (addr, _log) = fake_apiserver(false, |s| {
        if s.uri.contains("continue=") {
            return (
                StatusCode::GONE,
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"The provided continue parameter is too old to display a consistent list result.","reason":"Expired","code":410}"#.into(),
            );
        }
        (StatusCode::OK, r#"{"metadata":{"resourceVersion":"9","continue":"next"},"items":[{"metadata":{"name":"x","resourceVersion":"3"}}]}"#.into())
    })
    .await;
    let e = plain_upstream(addr, None).list_metadata(&cms, &plain, None).await.unwrap_err();
    assert!(e.is_gone(), "{e}");
}

#[tokio::test]
async fn watch_streams_events_from_the_server() {
    let (addr, log) = fake_apiserver(false, |_| {
        (
            StatusCode::OK,
            concat!(
                r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","resourceVersion":"5"}}}"#,
                "\n",
                r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#,
                "\n"
            )
            .into(),
        )
    })
    .await;
    let dir = TempDir::new();
    let up = plain_upstream(addr, Some(&dir));
    let deploys = ResourceKind::new("apps", "v1", "deployments", "Deployment", true, true);
    let mut w = up.watch(&deploys, Rv(4), 290).await.unwrap();
    assert_eq!(w.next().await.unwrap().unwrap().kind, EventType::Added);
    let b = w.next().await.unwrap().unwrap();
    assert_eq!(
        (b.kind, &b.object[..]),
        (EventType::Bookmark, &br#"{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9"}}"#[..])
    );
    assert!(w.next().await.unwrap().is_none());
    let seen = log.lock()[0].clone();
    assert_eq!(
        seen.uri,
        "/apis/apps/v1/deployments?watch=true&allowWatchBookmarks=true&resourceVersion=4&timeoutSeconds=290"
    );
    assert_eq!(seen.headers["authorization"], "Bearer proxy-secret");
}

#[tokio::test]
async fn connection_refused_is_a_transport_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let up = plain_upstream(addr, None);
    let e = up.get_json("/version").await.unwrap_err();
    assert!(matches!(e, UpstreamError::Transport(_)), "{e}");
    assert!(!e.is_gone());
    assert!(e.to_string().contains("GET /version"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Forwarding

#[tokio::test]
async fn forward_passes_the_callers_request_and_never_the_proxys_token() {
    let (addr, log) = fake_apiserver(false, |s| {
        (StatusCode::CREATED, format!("{{\"echo\":{}}}", String::from_utf8_lossy(&s.body)))
    })
    .await;
    let dir = TempDir::new();
    let up = plain_upstream(addr, Some(&dir));
    let front = proxy_front(up.clone()).await;

    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{front}/api/v1/namespaces/ns/configmaps?fieldManager=kubectl&dryRun=All"))
        .header("authorization", "Bearer caller-token")
        .header("content-type", "application/json")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "drop me")
        .header("proxy-authorization", "Basic eDp5")
        .header("impersonate-user", "alice")
        .body(Full::new(Bytes::from_static(br#"{"metadata":{"name":"x"}}"#)))
        .unwrap();
    let resp = test_client().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(resp.headers()["x-upstream"], "yes");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], br#"{"echo":{"metadata":{"name":"x"}}}"#);

    // A caller without credentials stays without credentials.
    let anon = Request::get(format!("http://{front}/api/v1/namespaces")).body(Full::default()).unwrap();
    assert_eq!(test_client().request(anon).await.unwrap().status(), StatusCode::CREATED);
    // The proxy's own request, as a control: it does carry the token.
    up.get_json("/version").await.unwrap();
    let seen = log.lock().clone();

    let fwd = &seen[0];
    assert_eq!(fwd.method, Method::POST);
    assert_eq!(fwd.uri, "/api/v1/namespaces/ns/configmaps?fieldManager=kubectl&dryRun=All");
    assert_eq!(fwd.headers["authorization"], "Bearer caller-token");
    assert_eq!(fwd.headers["impersonate-user"], "alice");
    assert_eq!(fwd.headers["host"], addr.to_string().as_str());
    for h in ["x-hop", "proxy-authorization", "connection"] {
        assert!(fwd.headers.get(h).is_none(), "{h} forwarded");
    }
    assert!(seen[1].headers.get("authorization").is_none(), "anonymous caller got the proxy's token");
    assert_eq!(seen[2].headers["authorization"], "Bearer proxy-secret");
    for s in &seen[..2] {
        assert!(!format!("{:?}", s.headers).contains("proxy-secret"));
    }
}

#[tokio::test]
async fn forward_upgrade_splices_both_connections() {
    let seen_auth: Arc<Mutex<Vec<String>>> = Arc::default();
    let sa = seen_auth.clone();
    // An "apiserver" that accepts SPDY upgrades and echoes every byte, upper-cased.
    let upstream_addr = serve(handler(move |_, mut req: Request<hyper::body::Incoming>| {
        let auth = req.headers().get("authorization").map(|v| v.to_str().unwrap().to_owned());
        sa.lock().push(auth.unwrap_or_default());
        let upgrade = req.headers().get("upgrade").cloned();
        let on = hyper::upgrade::on(&mut req);
        async move {
            tokio::spawn(async move {
                let mut io = TokioIo::new(on.await.unwrap());
                let mut buf = [0u8; 64];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n].to_ascii_uppercase()).await.is_err() {
                        break;
                    }
                }
            });
            Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "Upgrade")
                .header("upgrade", upgrade.unwrap())
                .header("x-stream-protocol-version", "v4.channel.k8s.io")
                .body(full(""))
                .unwrap()
        }
    }))
    .await;
    let dir = TempDir::new();
    let front = proxy_front(plain_upstream(upstream_addr, Some(&dir))).await;

    let mut tcp = tokio::net::TcpStream::connect(front).await.unwrap();
    tcp.write_all(
        b"POST /api/v1/namespaces/ns/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\nHost: proxy\r\n\
          Authorization: Bearer caller-token\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
          X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(tcp.read(&mut b).await.unwrap(), 1, "closed before the 101 ended");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: spdy/3.1"), "{head}");
    assert!(head.contains("x-stream-protocol-version: v4.channel.k8s.io"), "{head}");

    for msg in [&b"hello"[..], b"exec me"] {
        tcp.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tcp.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg.to_ascii_uppercase());
    }
    assert_eq!(*seen_auth.lock(), ["Bearer caller-token"]);
}

#[tokio::test]
async fn forward_upgrade_refused_returns_the_upstream_answer() {
    let (addr, _) = fake_apiserver(false, |_| {
        (
            StatusCode::FORBIDDEN,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"p\" is forbidden","reason":"Forbidden","code":403}"#.into(),
        )
    })
    .await;
    let front = proxy_front(plain_upstream(addr, None)).await;
    let resp = exec_upgrade(front).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(br#"{"kind":"Status""#));
}

/// An exec's SPDY upgrade request to `front`, answered.
async fn exec_upgrade(front: SocketAddr) -> Response<hyper::body::Incoming> {
    let req = Request::post(format!("http://{front}/api/v1/namespaces/ns/pods/p/exec"))
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .body(Full::default())
        .unwrap();
    test_client().request(req).await.unwrap()
}

/// A refused upgrade's upstream connection is closed, not kept idle in a pool where no client
/// connection's slot counts it: the upstream reads the end of its connection after answering.
#[tokio::test]
async fn a_refused_upgrades_upstream_connection_is_closed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed = tokio::spawn(async move {
        let (mut c, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(c.read(&mut b).await.unwrap(), 1);
            head.push(b[0]);
        }
        c.write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n").await.unwrap();
        // The proxy closes its side: the read ends (a pooled connection would stay open).
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.map(|_| rest.len())
    });
    let front = proxy_front(plain_upstream(addr, None)).await;
    let resp = exec_upgrade(front).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), closed).await;
    assert!(matches!(ended, Ok(Ok(Ok(0)))), "the upstream connection stayed open: {ended:?}");
}

// ---------------------------------------------------------------------------------------------
// TLS: CA verification, h2, and the client certificate only on the proxy's own requests

fn conn_route(s: &Seen) -> (StatusCode, String) {
    (StatusCode::OK, format!(r#"{{"client_cert":{},"h2":{}}}"#, s.conn.client_cert, s.conn.h2))
}

fn tls_opts(dir: &TempDir, addr: SocketAddr) -> UpstreamOptions {
    UpstreamOptions {
        upstream: Some(format!("https://{addr}")),
        certificate_authority: Some(dir.write("ca.pem", CA_PEM)),
        client_certificate: Some(dir.write("client.pem", CLIENT_PEM)),
        client_key: Some(dir.write("client.key", CLIENT_KEY)),
        token_file: Some(dir.write("token", "proxy-secret")),
        ..Default::default()
    }
}

#[tokio::test]
async fn tls_own_requests_present_the_client_certificate_forwarded_ones_do_not() {
    let (addr, log) = fake_apiserver(true, conn_route).await;
    let dir = TempDir::new();
    let up = Upstream::new(&tls_opts(&dir, addr)).unwrap();
    assert!(up.describe().ends_with("client certificate)"), "{}", up.describe());

    let own = up.get_json("/version").await.unwrap();
    assert_eq!(&own[..], br#"{"client_cert":true,"h2":true}"#);

    let front = proxy_front(up).await;
    let req = Request::get(format!("http://{front}/api/v1/pods")).body(Full::default()).unwrap();
    let resp = test_client().request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], br#"{"client_cert":false,"h2":true}"#);
    let seen = log.lock().clone();
    assert!(seen[1].headers.get("authorization").is_none());
}

#[tokio::test]
async fn tls_verifies_the_server_unless_told_not_to() {
    let (addr, _) = fake_apiserver(true, conn_route).await;
    let dir = TempDir::new();

    // Wrong CA (the system bundle does not know the test CA).
    let opts = UpstreamOptions {
        certificate_authority: Some(dir.write("other.pem", CLIENT_PEM)),
        ..tls_opts(&dir, addr)
    };
    let e = Upstream::new(&opts).unwrap().get_json("/version").await.unwrap_err();
    assert!(matches!(e, UpstreamError::Transport(_)), "{e}");

    // Insecure: accepted without any CA.
    let opts = UpstreamOptions {
        upstream: Some(format!("https://{addr}")),
        insecure_skip_tls_verify: true,
        ..Default::default()
    };
    let body = Upstream::new(&opts).unwrap().get_json("/version").await.unwrap();
    assert_eq!(&body[..], br#"{"client_cert":false,"h2":true}"#);

    // tls-server-name from a kubeconfig is what gets verified.
    for (name, ok) in [("apiserver.test", true), ("wrong.test", false)] {
        let kc = dir.write(
            "kc",
            &format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: t\n  cluster:\n    \
                 server: https://{addr}\n    certificate-authority-data: {}\n    tls-server-name: {name}\n\
                 contexts:\n- name: t\n  context: {{cluster: t}}\n",
                b64(CA_PEM)
            ),
        );
        let up = Upstream::new(&UpstreamOptions { kubeconfig: Some(kc), ..Default::default() }).unwrap();
        assert_eq!(up.get_json("/version").await.is_ok(), ok, "{name}");
    }
}
