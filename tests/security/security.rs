//! Security end to end: the sim plays TokenReview and SubjectAccessReview from a script; the
//! proxy runs with `--auth=upstream`, on plain loopback HTTP (tokens) or on TLS (client
//! certificates, HTTP/2 and HTTP/1.1, certificate reload).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{open_watch, send, serve_args, Resp};
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use kube_watchcache::app::{self, Running};
use kube_watchcache::config::{SecurityArgs, ServeArgs};
use kube_watchcache_sim::{AuthScript, Rule, ScriptUser, Sim, SimHandle, SimOptions};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security").join(name)
}

/// alice: everything on configmaps; bob: only list configmaps; dev: get/list/watch configmaps
/// in ns-a only; admin: may impersonate users; metrics-reader: GET /watchcache/metrics; group devs (the
/// certificate user alice's O): list/watch configmaps.
fn script() -> AuthScript {
    AuthScript::default()
        .token("alice-token", ScriptUser::new("alice", &[]))
        .token("bob-token", ScriptUser::new("bob", &[]))
        .token("dev-token", ScriptUser::new("dev-user", &[]))
        .token("admin-token", ScriptUser::new("admin", &[]))
        .token("metrics-token", ScriptUser::new("metrics-reader", &[]))
        .rule(Rule::user("alice", &["get", "list", "watch"], "", &["configmaps"]))
        .rule(Rule::user("bob", &["list"], "", &["configmaps"]))
        .rule(Rule::user("dev-user", &["get", "list", "watch"], "", &["configmaps"]).in_namespace("ns-a"))
        .rule(Rule::user("admin", &["impersonate"], "", &["users"]))
        .rule(Rule::paths("metrics-reader", &["get"], &["/watchcache/metrics"]))
        .rule(Rule::group("devs", &["list", "watch"], "", &["configmaps"]))
        .token("ns-token", ScriptUser::new("ns-reader", &[]))
        // A Role in ns-a: get on namespaces (the apiserver asks with namespace ns-a, name ns-a).
        .rule(
            Rule::user("ns-reader", &["get", "list", "watch"], "", &["namespaces", "configmaps"])
                .in_namespace("ns-a"),
        )
}

struct Env {
    sim: SimHandle,
    proxy: Running,
    client: common::HttpClient,
}

async fn start_sim() -> SimHandle {
    let sim = Sim::start(SimOptions::default()).await.expect("sim starts");
    sim.sim.set_auth(script());
    for ns in ["ns-a", "ns-b"] {
        let _ = sim.sim.create(
            "namespaces",
            "",
            json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":ns}}),
        );
        sim.sim
            .create("configmaps", ns, json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm1"}}))
            .expect("create");
    }
    sim
}

fn secure(mut args: ServeArgs, edit: impl FnOnce(&mut SecurityArgs)) -> ServeArgs {
    args.security.auth = "upstream".into();
    edit(&mut args.security);
    args
}

async fn start_with(edit: impl FnOnce(&mut SecurityArgs)) -> Env {
    start_caching(&["configmaps"], edit).await
}

async fn start_caching(resources: &[&str], edit: impl FnOnce(&mut SecurityArgs)) -> Env {
    let sim = start_sim().await;
    let args = secure(serve_args(sim.addr, resources), edit);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    Env { sim, proxy, client: common::client() }
}

async fn start() -> Env {
    start_with(|_| {}).await
}

impl Env {
    async fn get_as(&self, token: Option<&str>, path: &str, extra: &[(&str, &str)]) -> Resp {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = extra.to_vec();
        if let Some(a) = &auth {
            headers.push(("authorization", a));
        }
        send(&self.client, Method::GET, &format!("http://{}{path}", self.proxy.addr), None, &headers).await
    }

    fn reviews(&self, path: &str) -> usize {
        self.sim.sim.request_count(|r| r.path == path)
    }
}

fn message(r: &Resp) -> String {
    r.json()["message"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn allowed_and_denied_users_per_verb() {
    let env = start().await;
    let list = "/api/v1/namespaces/ns-a/configmaps?resourceVersion=0";
    let get = "/api/v1/namespaces/ns-a/configmaps/cm1?resourceVersion=0";
    let watch = "/api/v1/namespaces/ns-a/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1";
    for path in [list, get, watch] {
        let r = env.get_as(Some("alice-token"), path, &[]).await;
        assert_eq!(r.status, StatusCode::OK, "alice {path}: {:?}", r.body);
    }
    assert_eq!(env.get_as(Some("bob-token"), list, &[]).await.status, StatusCode::OK);
    let r = env.get_as(Some("bob-token"), get, &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json(),
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
               "message":"configmaps \"cm1\" is forbidden: User \"bob\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"ns-a\"",
               "reason":"Forbidden","details":{"name":"cm1","kind":"configmaps"},"code":403})
    );
    let r = env.get_as(Some("bob-token"), watch, &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&r),
        r#"configmaps is forbidden: User "bob" cannot watch resource "configmaps" in API group "" in the namespace "ns-a""#
    );
}

/// The apiserver authorizes before its handlers validate: a malformed read of a cached
/// resource by a caller without the right is 403, never the 400 / 422 that would tell it about
/// the request's validity; with the right it is the apiserver's own 400 / 422. Answered here
/// either way, nothing forwarded.
#[tokio::test]
async fn bad_requests_are_authorized_before_they_are_refused() {
    // What kube-apiserver 1.28.7 answered to these reads in `default`, by an admin and by a user
    // without rights (`tests/recordings/record_authz.py`).
    let rec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/recordings/v1.28.7-raw/authz-before-validation.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let recorded = |user: &str, query: &str| -> (u16, serde_json::Value) {
        let c = rec["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["user"] == user && c["query"] == query)
            .unwrap();
        (c["status"].as_u64().unwrap() as u16, c["body"].clone())
    };
    let env = start().await;
    let queries = [
        // resourceVersionMatch without resourceVersion: 422.
        ("resourceVersionMatch=NotOlderThan", "list"),
        // A malformed label selector: 400.
        ("labelSelector=tier%3Dfront%3Dx", "list"),
        // resourceVersionMatch=Exact on a watch: 422.
        ("watch=1&resourceVersionMatch=Exact&resourceVersion=1", "watch"),
    ];
    let forwarded = env.sim.sim.request_count(|r| r.path.contains("/namespaces/ns-"));
    for (query, verb) in queries {
        let path = format!("/api/v1/namespaces/ns-a/configmaps?{query}");
        let allowed = env.get_as(Some("alice-token"), &path, &[]).await;
        let (code, _) = recorded("admin", query);
        assert_eq!(allowed.status.as_u16(), code, "{path}: {:?}", allowed.body);
        // bob may list but not watch; a user of another namespace may do neither here: the
        // apiserver's 403, as recorded (its user and namespace ours).
        let outsider = env.get_as(Some("dev-token"), &path.replace("ns-a", "ns-b"), &[]).await;
        let (code, body) = recorded("nobody", query);
        assert_eq!((outsider.status.as_u16(), code), (403, 403), "{path}: {:?}", outsider.body);
        let want: serde_json::Value = serde_json::from_str(
            &body
                .to_string()
                .replace(r#"\"nobody\""#, r#"\"dev-user\""#)
                .replace(r#"\"default\""#, r#"\"ns-b\""#),
        )
        .unwrap();
        assert_eq!(outsider.json(), want, "{path}");
        assert!(message(&outsider).contains(&format!("cannot {verb} resource")), "{path}");
        let bob = env.get_as(Some("bob-token"), &path, &[]).await;
        assert_eq!(bob.status == StatusCode::FORBIDDEN, verb == "watch", "bob {path}: {:?}", bob.body);
    }
    assert_eq!(
        env.sim.sim.request_count(|r| r.path.contains("/namespaces/ns-")),
        forwarded,
        "nothing forwarded"
    );
}

#[tokio::test]
async fn namespaced_user_lists_only_inside_its_namespace() {
    let env = start().await;
    let r = env.get_as(Some("dev-token"), "/api/v1/configmaps?resourceVersion=0", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&r),
        r#"configmaps is forbidden: User "dev-user" cannot list resource "configmaps" in API group "" at the cluster scope"#
    );
    let r = env.get_as(Some("dev-token"), "/api/v1/namespaces/ns-a/configmaps?resourceVersion=0", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.names(), ["cm1"]);
    let r = env.get_as(Some("dev-token"), "/api/v1/namespaces/ns-b/configmaps?resourceVersion=0", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

/// The attributes are the apiserver's RequestInfo: `GET /api/v1/namespaces/X` is about
/// namespace X and name X, so a Role in X that allows `get namespaces` allows it, from the cache
/// as from the apiserver; the denial names the namespace like the apiserver's.
#[tokio::test]
async fn a_namespace_is_authorized_inside_itself() {
    let env = start_caching(&["configmaps", "namespaces"], |_| {}).await;
    let r = env.get_as(Some("ns-token"), "/api/v1/namespaces/ns-a?resourceVersion=0", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", message(&r));
    assert_eq!(r.json()["metadata"]["name"], "ns-a");
    let r = env.get_as(Some("ns-token"), "/api/v1/namespaces/ns-b?resourceVersion=0", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json(),
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
               "message":"namespaces \"ns-b\" is forbidden: User \"ns-reader\" cannot get resource \"namespaces\" in API group \"\" in the namespace \"ns-b\"",
               "reason":"Forbidden","details":{"name":"ns-b","kind":"namespaces"},"code":403})
    );
    // Listing namespaces is cluster-scoped, even with a name selector.
    let r = env
        .get_as(
            Some("ns-token"),
            "/api/v1/namespaces?resourceVersion=0&fieldSelector=metadata.name%3Dns-a",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&r),
        r#"namespaces "ns-a" is forbidden: User "ns-reader" cannot list resource "namespaces" in API group "" at the cluster scope"#
    );
    // A watch through the legacy prefix gets no name from its field selector (the prefix sets
    // the verb first), so a name-restricted rule does not cover it.
    let r = env
        .get_as(
            Some("ns-token"),
            "/api/v1/watch/namespaces/ns-b/configmaps?fieldSelector=metadata.name%3Dcm1&timeoutSeconds=1",
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&r),
        r#"configmaps is forbidden: User "ns-reader" cannot watch resource "configmaps" in API group "" in the namespace "ns-b""#
    );
}

#[tokio::test]
async fn missing_or_invalid_credentials_are_401() {
    let env = start().await;
    let path = "/api/v1/configmaps?resourceVersion=0";
    for token in [None, Some("expired-token")] {
        let r = env.get_as(token, path, &[]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.json(),
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401})
        );
    }
    // Forwarded requests need credentials too; health does not.
    let r = env.get_as(None, "/api/v1/namespaces", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(env.get_as(None, "/readyz", &[]).await.status, StatusCode::OK);
    assert_eq!(env.get_as(None, "/livez", &[]).await.status, StatusCode::OK);
    // The proxy's metrics: authenticated and authorized like the apiserver's /metrics.
    let own = "/watchcache/metrics";
    assert_eq!(env.get_as(None, own, &[]).await.status, StatusCode::UNAUTHORIZED);
    let r = env.get_as(Some("alice-token"), own, &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(message(&r), r#"forbidden: User "alice" cannot get path "/watchcache/metrics""#);
    let r = env.get_as(Some("metrics-token"), own, &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&r.body).contains("watchcache_requests_total"));
    // The token never reaches the proxy's answers.
    assert!(!String::from_utf8_lossy(&env.get_as(Some("alice-token"), own, &[]).await.body)
        .contains("alice-token"));
    // /metrics and /debug/* are the apiserver's: forwarded with the caller's own token.
    for path in ["/metrics", "/debug/pprof/"] {
        let before = env.sim.sim.request_count(|r| r.path == path);
        let r = env.get_as(Some("metrics-token"), path, &[]).await;
        assert!(!String::from_utf8_lossy(&r.body).contains("watchcache_"), "{path}: not the proxy's");
        let seen = env.sim.sim.requests(|r| r.path == path);
        assert_eq!(seen.len(), before + 1, "{path} forwarded");
        assert_eq!(seen[seen.len() - 1].headers["authorization"], "Bearer metrics-token");
    }
}

#[tokio::test]
async fn anonymous_access_when_enabled_but_invalid_tokens_stay_401() {
    let env = start_with(|s| s.anonymous_auth = true).await;
    let r = env.get_as(None, "/api/v1/configmaps?resourceVersion=0", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(message(&r).contains(r#"User "system:anonymous" cannot list"#), "{}", message(&r));
    let r = env.get_as(Some("expired-token"), "/api/v1/configmaps?resourceVersion=0", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // A token that is not text is a token all the same (it was taken for none: anonymous).
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap();
    c.write_all(b"GET /api/v1/configmaps?resourceVersion=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xffabc\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    c.read_to_end(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 401"), "{}", String::from_utf8_lossy(&answer));
}

#[tokio::test]
async fn decisions_and_tokens_are_cached_and_concurrent_checks_coalesced() {
    let env = start().await;
    let path = "/api/v1/namespaces/ns-a/configmaps?resourceVersion=0";
    for _ in 0..3 {
        assert_eq!(env.get_as(Some("alice-token"), path, &[]).await.status, StatusCode::OK);
    }
    assert_eq!(env.reviews(TOKEN_REVIEWS), 1, "one TokenReview for three requests");
    assert_eq!(env.reviews(ACCESS_REVIEWS), 1, "one SubjectAccessReview for three requests");
    // Another namespace is another decision; the token stays cached.
    let other = "/api/v1/namespaces/ns-b/configmaps?resourceVersion=0";
    assert_eq!(env.get_as(Some("alice-token"), other, &[]).await.status, StatusCode::OK);
    assert_eq!((env.reviews(TOKEN_REVIEWS), env.reviews(ACCESS_REVIEWS)), (1, 2));
    // Denials and rejected tokens are cached too.
    for _ in 0..3 {
        assert_eq!(
            env.get_as(Some("bob-token"), other.replace("?", "/cm1?").as_str(), &[]).await.status,
            403
        );
        assert_eq!(env.get_as(Some("nobody"), other, &[]).await.status, 401);
    }
    assert_eq!((env.reviews(TOKEN_REVIEWS), env.reviews(ACCESS_REVIEWS)), (3, 3));
    // Twenty identical concurrent first requests: one review of each kind.
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (client, url) = (env.client.clone(), format!("http://{}{path}", env.proxy.addr));
        tasks.push(tokio::spawn(async move {
            send(&client, Method::GET, &url, None, &[("authorization", "Bearer dev-token")]).await.status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    assert_eq!((env.reviews(TOKEN_REVIEWS), env.reviews(ACCESS_REVIEWS)), (4, 4));
}

#[tokio::test]
async fn impersonation_needs_the_right_and_then_acts_as_the_target() {
    let env = start().await;
    let list = "/api/v1/namespaces/ns-a/configmaps?resourceVersion=0";
    let r = env.get_as(Some("alice-token"), list, &[("impersonate-user", "bob")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // The sim is Kubernetes 1.36: constrained impersonation's first mode refuses first
    // (`constrained::` tests the rest; the legacy text with the gate off).
    assert_eq!(
        message(&r),
        r#"configmaps is forbidden: User "alice" cannot impersonate-on:user-info:list resource "configmaps" in API group "" in the namespace "ns-a""#
    );
    let r = env.get_as(Some("alice-token"), list, &[("impersonate-group", "system:masters")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "groups without a user");
    // admin may impersonate users: as bob, bob's rights apply.
    let r = env.get_as(Some("admin-token"), list, &[("impersonate-user", "bob")]).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = env
        .get_as(
            Some("admin-token"),
            "/api/v1/namespaces/ns-a/configmaps/cm1?resourceVersion=0",
            &[("impersonate-user", "bob")],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(message(&r).contains(r#"User "bob" cannot get"#), "{}", message(&r));
    // but not groups.
    let r = env
        .get_as(
            Some("admin-token"),
            list,
            &[("impersonate-user", "bob"), ("impersonate-group", "system:masters")],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // (constrained impersonation's refusal comes first on 1.36: the user-info mode's.)
    assert!(
        message(&r)
            .starts_with(r#"configmaps is forbidden: User "admin" cannot impersonate-on:user-info:list"#),
        "{}",
        message(&r)
    );
}

#[tokio::test]
async fn forwarded_token_requests_carry_the_callers_token_only() {
    let env = start().await;
    let r = send(
        &env.client,
        Method::POST,
        &format!("http://{}/api/v1/namespaces/ns-a/configmaps", env.proxy.addr),
        Some(json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fwd"}})),
        &[("authorization", "Bearer alice-token"), ("content-type", "application/json")],
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let seen = env.sim.sim.request_count(|r| {
        r.method == "POST"
            && r.path == "/api/v1/namespaces/ns-a/configmaps"
            && r.headers.get("authorization").is_some_and(|v| v == "Bearer alice-token")
            && !r.headers.contains_key("impersonate-user")
    });
    assert_eq!(seen, 1);
}

/// A proxy whose own identity is a token file, with `--auth` as `edit` sets it.
async fn start_with_own_token(dir: &Path, edit: impl FnOnce(&mut SecurityArgs)) -> Env {
    std::fs::create_dir_all(dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "proxy-token\n").unwrap();
    let sim = start_sim().await;
    let mut args = serve_args(sim.addr, &["configmaps"]);
    args.upstream.token_file = Some(token);
    edit(&mut args.security);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    Env { sim, proxy, client: common::client() }
}

/// `--auth=none` is a trusted sidecar: like `kubectl proxy`, what it forwards goes with the
/// proxy's own credentials (discovery, writes), never with a caller's token or impersonation.
#[tokio::test]
async fn a_sidecar_forwards_with_the_proxys_own_credentials() {
    let dir = temp_dir("sidecar");
    let env = start_with_own_token(&dir, |s| s.auth = "none".into()).await;
    let with_proxy_token = |method: &'static str, path: &'static str| {
        env.sim.sim.request_count(move |r| {
            r.method == method
                && r.path == path
                && r.headers.get("authorization").is_some_and(|v| v == "Bearer proxy-token")
                && !r.headers.contains_key("impersonate-user")
        })
    };
    // (The proxy's own discovery at startup used /api/v1 too.)
    let before = with_proxy_token("GET", "/api/v1");
    assert_eq!(env.get_as(None, "/api/v1", &[]).await.status, StatusCode::OK);
    assert_eq!(with_proxy_token("GET", "/api/v1"), before + 1, "discovery goes as the proxy");
    let r = send(
        &env.client,
        Method::POST,
        &format!("http://{}/api/v1/namespaces/ns-a/configmaps", env.proxy.addr),
        Some(json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"via-sidecar"}})),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer caller-token"),
            ("impersonate-user", "system:admin"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(with_proxy_token("POST", "/api/v1/namespaces/ns-a/configmaps"), 1);
    assert_eq!(env.sim.sim.request_count(|r| r.headers.contains_key("impersonate-user")), 0);
    assert_eq!(
        env.sim
            .sim
            .request_count(|r| r.headers.get("authorization").is_some_and(|v| v == "Bearer caller-token")),
        0
    );
    env.proxy.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--auth=upstream` a proxy with its own token still never lends it: token callers go
/// with their own token, anonymous callers with none.
#[tokio::test]
async fn authenticated_mode_never_lends_the_proxys_token() {
    let dir = temp_dir("no-lend");
    let env = start_with_own_token(&dir, |s| {
        s.auth = "upstream".into();
        s.anonymous_auth = true;
    })
    .await;
    let with_token = |path: &'static str, token: &'static str| {
        env.sim.sim.request_count(move |r| {
            r.path == path
                && r.headers
                    .get("authorization")
                    .is_some_and(|v| v.as_bytes() == format!("Bearer {token}").as_bytes())
        })
    };
    // (The proxy's own discovery at startup used /api/v1 and /apis with its token.)
    let own = (with_token("/api/v1", "proxy-token"), with_token("/apis", "proxy-token"));
    let r = env.get_as(None, "/api/v1", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = env.get_as(Some("alice-token"), "/apis", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        env.sim.sim.request_count(|r| r.path == "/api/v1" && !r.headers.contains_key("authorization")),
        1
    );
    assert_eq!(with_token("/apis", "alice-token"), 1);
    assert_eq!(
        (with_token("/api/v1", "proxy-token"), with_token("/apis", "proxy-token")),
        own,
        "the callers' requests did not go with the proxy's token"
    );
    env.proxy.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// At most `--max-watches-per-user` watches per user and client host (429 past it).
#[tokio::test]
async fn watches_per_user_are_limited() {
    let env = start_with(|s| s.max_watches_per_user = 2).await;
    let url =
        format!("http://{}/api/v1/namespaces/ns-a/configmaps?watch=1&resourceVersion=0", env.proxy.addr);
    let watch = |c: common::HttpClient, url: String| async move {
        let req = Request::builder()
            .uri(url)
            .header("authorization", "Bearer alice-token")
            .body(Full::new(Bytes::new()))
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), c.request(req)).await.unwrap().unwrap()
    };
    let w1 = watch(env.client.clone(), url.clone()).await;
    let w2 = watch(env.client.clone(), url.clone()).await;
    assert_eq!((w1.status(), w2.status()), (StatusCode::OK, StatusCode::OK));
    let w3 = watch(env.client.clone(), url.clone()).await;
    assert_eq!(w3.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(w3.headers()["retry-after"], "1");
    // The same user from another client host (a DaemonSet's pod on another node, under the
    // same service account) has slots of its own, and as many.
    let other = |i: usize| async move {
        let io = hyper_util::rt::TokioIo::new(common::connect_from("127.0.0.2", env.proxy.addr).await);
        let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(io).await.unwrap();
        tokio::spawn(conn);
        let req = Request::get(format!("/api/v1/namespaces/ns-a/configmaps?watch=1&resourceVersion=0&i={i}"))
            .header("host", "localhost")
            .header("authorization", "Bearer alice-token")
            .body(Full::new(Bytes::new()))
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), send.send_request(req)).await.unwrap().unwrap()
    };
    let (o1, o2, o3) = (other(1).await, other(2).await, other(3).await);
    assert_eq!(
        (o1.status(), o2.status(), o3.status()),
        (StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS),
        "127.0.0.2's own two"
    );
    drop((o1, o2, o3));
    // At the limit, a malformed watch is still the apiserver's own refusal (it holds no slot).
    let bad = watch(env.client.clone(), format!("{url}&resourceVersionMatch=Exact")).await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    drop(w1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let w = watch(env.client.clone(), url.clone()).await;
        if w.status() == StatusCode::OK {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "slot freed when a watch ends");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The unauthenticated never get a watch.
    let w = open_watch(&env.client, &url).await;
    assert_eq!(w.status, StatusCode::UNAUTHORIZED);
}

// ---- TLS ----

fn certs(name: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(testdata(name)).unwrap().map(|c| c.unwrap()).collect()
}

fn client_tls(identity: Option<&str>) -> rustls::ClientConfig {
    let b = common::tls::config();
    match identity {
        None => b.with_no_client_auth(),
        Some(name) => {
            let key = PrivateKeyDer::from_pem_file(testdata(&format!("{name}.key"))).unwrap();
            b.with_client_auth_cert(certs(&format!("{name}.crt")), key).unwrap()
        }
    }
}

use common::tls::TlsClient;

fn tls_client(identity: Option<&str>, h2: bool) -> TlsClient {
    common::tls::https(client_tls(identity), h2)
}

async fn tls_get(
    c: &TlsClient,
    url: &str,
    token: Option<&str>,
) -> Result<(StatusCode, Version, Value), String> {
    let mut b = Request::builder().uri(url);
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let resp =
        tokio::time::timeout(Duration::from_secs(10), c.request(b.body(Full::new(Bytes::new())).unwrap()))
            .await
            .map_err(|_| "timeout".to_string())?
            .map_err(|e| format!("{e:?}"))?;
    let (status, version) = (resp.status(), resp.version());
    let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, version, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

async fn start_tls(dir: &Path) -> (SimHandle, Running) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(testdata("server1.crt"), dir.join("tls.crt")).unwrap();
    std::fs::copy(testdata("server1.key"), dir.join("tls.key")).unwrap();
    let sim = start_sim().await;
    let mut args = secure(serve_args(sim.addr, &["configmaps"]), |s| {
        s.client_ca_file = Some(testdata("client-ca.crt"));
        s.tls_reload_interval = Duration::from_millis(100);
    });
    args.insecure_listen = None;
    // Port 0 on loopback: the TLS tests of this binary run at once (the default 0.0.0.0:8443
    // would be taken by the first).
    args.secure_port = 0;
    args.bind_address = "127.0.0.1".parse().unwrap();
    args.tls_cert_file = Some(dir.join("tls.crt"));
    args.tls_private_key_file = Some(dir.join("tls.key"));
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    (sim, proxy)
}

fn temp_dir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kwc-security-{tag}-{}", std::process::id()))
}

#[tokio::test]
async fn tls_with_http2_and_http1_tokens_and_client_certificates() {
    let dir = temp_dir("alpn");
    let (sim, proxy) = start_tls(&dir).await;
    let url = format!(
        "https://localhost:{}/api/v1/namespaces/ns-a/configmaps?resourceVersion=0",
        proxy.addr.port()
    );

    let (s, v, _) = tls_get(&tls_client(None, true), &url, Some("alice-token")).await.unwrap();
    assert_eq!((s, v), (StatusCode::OK, Version::HTTP_2));
    let (s, v, _) = tls_get(&tls_client(None, false), &url, Some("alice-token")).await.unwrap();
    assert_eq!((s, v), (StatusCode::OK, Version::HTTP_11));
    let (s, _, _) = tls_get(&tls_client(None, true), &url, None).await.unwrap();
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // alice's certificate: user alice, groups devs + ops; devs may list, not get.
    let alice = tls_client(Some("alice"), true);
    let (s, v, body) = tls_get(&alice, &url, None).await.unwrap();
    assert_eq!((s, v), (StatusCode::OK, Version::HTTP_2), "{body}");
    let get = url.replace("configmaps?", "configmaps/cm1?");
    assert_eq!(tls_get(&alice, &get, None).await.unwrap().0, StatusCode::OK, "alice's own rule allows get");
    // Many watches over one HTTP/2 connection.
    let watch = url.replace("?", "?watch=1&timeoutSeconds=1&");
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (c, w) = (alice.clone(), watch.clone());
        tasks.push(tokio::spawn(async move { tls_get(&c, &w, None).await.map(|r| r.0) }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(StatusCode::OK));
    }

    // A certificate caller's forwarded request goes with impersonation headers, never with
    // the caller's own headers.
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("https://localhost:{}/api/v1/namespaces/ns-a/configmaps", proxy.addr.port()))
        .header("content-type", "application/json")
        .header("impersonate-user", "system:admin")
        .body(Full::new(Bytes::from(
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"by-cert"}}"#,
        )))
        .unwrap();
    let resp = alice.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "alice may not impersonate system:admin");
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("https://localhost:{}/api/v1/namespaces/ns-a/configmaps", proxy.addr.port()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"by-cert"}}"#,
        )))
        .unwrap();
    let resp = alice.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let seen = sim.sim.request_count(|r| {
        let groups: Vec<_> = r.headers.get_all("impersonate-group").iter().collect();
        r.method == "POST"
            && r.path.ends_with("/configmaps")
            && r.headers.get("impersonate-user").is_some_and(|v| v == "alice")
            && groups == ["devs", "ops", "system:authenticated"]
    });
    assert_eq!(seen, 1);

    // A certificate from an unknown CA fails the handshake.
    assert!(tls_get(&tls_client(Some("mallory"), true), &url, None).await.is_err());
    proxy.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The leaf certificate a fresh handshake gets.
async fn served_leaf(port: u16) -> CertificateDer<'static> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_tls(None)));
    let tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone().into_owned()
}

#[tokio::test]
async fn certificate_swap_keeps_open_connections_and_serves_the_new_one() {
    let dir = temp_dir("swap");
    let (_sim, proxy) = start_tls(&dir).await;
    let port = proxy.addr.port();
    let url = format!("https://localhost:{port}/api/v1/namespaces/ns-a/configmaps?resourceVersion=0");
    assert_eq!(served_leaf(port).await, certs("server1.crt")[0]);
    let client = tls_client(None, true);
    assert_eq!(tls_get(&client, &url, Some("alice-token")).await.unwrap().0, StatusCode::OK);
    // An open watch on the old connection.
    let watch_url = url.replace("?", "?watch=1&");
    let req = Request::builder()
        .uri(&watch_url)
        .header("authorization", "Bearer alice-token")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mut watch = client.request(req).await.unwrap().into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), watch.frame()).await.unwrap();
    assert!(first.is_some(), "initial ADDED event");

    std::fs::copy(testdata("server2.key"), dir.join("tls.key")).unwrap();
    std::fs::copy(testdata("server2.crt"), dir.join("tls.crt")).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while served_leaf(port).await != certs("server2.crt")[0] {
        assert!(tokio::time::Instant::now() < deadline, "the new certificate is served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The old connection still works: its watch gets new events, new requests succeed.
    _sim.sim
        .create(
            "configmaps",
            "ns-a",
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"after-swap"}}),
        )
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), watch.frame()).await.unwrap().unwrap().unwrap();
    let line = String::from_utf8_lossy(next.data_ref().unwrap()).into_owned();
    assert!(line.contains("after-swap"), "{line}");
    assert_eq!(tls_get(&client, &url, Some("alice-token")).await.unwrap().0, StatusCode::OK);
    proxy.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 30 §1, as found against kube-apiserver 1.28.7: a caller allowed to list and watch
/// configmaps everywhere named a namespace `ns-a%2Fsecrets%2Fsuper-secret%3Fx%3D`; the proxy,
/// as itself, then GET `/api/v1/namespaces/ns-a/secrets/super-secret?x=/…` for the watch-list's
/// initial LIST and the proof of a Most Recent LIST (an existence oracle for Secrets, and blind
/// requests as the proxy), and served `GET /api/v1/configmaps/ns-a%2Fcm1` as ns-a's cm1. Now
/// such requests go upstream unchanged with the caller's own token, and get what the upstream
/// answers that caller; the proxy's own requests never leave the caller's segment.
#[tokio::test]
async fn a_callers_namespace_or_name_never_steers_the_proxys_requests() {
    let env = start().await;
    env.sim
        .sim
        .create(
            "secrets",
            "ns-a",
            json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"super-secret"}}),
        )
        .expect("secret");
    let injected = "/api/v1/namespaces/ns-a%2Fsecrets%2Fsuper-secret%3Fx%3D/configmaps";
    let attempts = [
        format!("{injected}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"),
        format!("{injected}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0&timeoutSeconds=1"),
        injected.to_string(),
        format!("{injected}?limit=1"),
        format!("{injected}?resourceVersion=0"),
        format!("{injected}?labelSelector=a%3Db&fieldSelector=type%3DOpaque"),
        "/api/v1/namespaces/ns-a%2fsecrets%2fsuper-secret/configmaps?watch=1&timeoutSeconds=1".into(),
        "/api/v1/configmaps/ns-a%2Fcm1?resourceVersion=0".into(),
        "/api/v1/namespaces/ns-a/configmaps/cm1%2F..?resourceVersion=0".into(),
        "/api/v1/namespaces/NS-A/configmaps?resourceVersion=0".into(),
        // A name with a field selector's separators: one value upstream, not more terms.
        "/api/v1/watch/namespaces/ns-a/configmaps/cm1,metadata.namespace!=x?timeoutSeconds=1".into(),
    ];
    let alice = [("authorization", "Bearer alice-token")];
    for path in &attempts {
        let before = env.sim.sim.requests(|_| true).len();
        let via_proxy = env.get_as(Some("alice-token"), path, &[]).await;
        let sent = env.sim.sim.requests(|_| true).split_off(before);
        // What the upstream answers the same caller directly.
        let url = format!("http://{}{path}", env.sim.addr);
        let direct = send(&env.client, Method::GET, &url, None, &alice).await;
        assert_eq!(via_proxy.status, direct.status, "{path}: {}", String::from_utf8_lossy(&via_proxy.body));
        if via_proxy.status != StatusCode::OK {
            assert_eq!(via_proxy.json()["message"], direct.json()["message"], "{path}");
        }
        assert_ne!(
            (
                via_proxy.status,
                serde_json::from_slice::<Value>(&via_proxy.body)
                    .ok()
                    .and_then(|v| v.pointer("/metadata/name").cloned())
            ),
            (StatusCode::OK, Some(json!("cm1"))),
            "{path}: another object served"
        );
        for r in sent.iter().filter(|r| r.path != TOKEN_REVIEWS && r.path != ACCESS_REVIEWS) {
            let decoded = percent_encoding::percent_decode_str(&r.path).decode_utf8_lossy().into_owned();
            let query: String =
                form_urlencoded::parse(r.query.as_bytes()).map(|(k, v)| format!("{k}={v}&")).collect();
            let callers = r.headers.get("authorization").is_some_and(|v| v == "Bearer alice-token");
            assert!(
                callers || !decoded.contains("secrets") && !query.contains("cm1,metadata"),
                "{path}: the proxy asked {} ?{} as itself",
                r.path,
                r.query
            );
        }
    }
    env.proxy.shutdown().await;
}

/// Issue 30 §3: a caller naming `X-Forwarded-For` in `Connection` (a hop-by-hop header the
/// proxy drops) no longer removes the address the proxy sets; its own value never passes.
#[tokio::test]
async fn a_caller_cannot_remove_the_forwarded_for_address() {
    let env = start().await;
    let path = "/api/v1/namespaces/ns-a/configmaps/cm1";
    let r = env
        .get_as(
            Some("alice-token"),
            path,
            &[("connection", "keep-alive, X-Forwarded-For"), ("x-forwarded-for", "10.9.9.9")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "forwarded (a Most Recent GET)");
    let seen = env.sim.sim.requests(|r| r.path == path);
    assert_eq!(seen.len(), 1);
    let xff: Vec<_> = seen[0].headers.get_all("x-forwarded-for").iter().collect();
    assert_eq!(xff, ["127.0.0.1"], "{:?}", seen[0].headers);
    env.proxy.shutdown().await;
}
