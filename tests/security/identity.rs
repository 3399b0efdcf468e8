//! Certificate identities forwarded upstream (issue 21, items 2 and 3): a TLS proxy with
//! `--client-ca-file` (a client CA made here with rcgen, so subjects can be anything a CA might
//! sign), the sim recording what it receives. A subject that a header would change is refused
//! with 401 before anything is sent; an `Upgrade` other than Kubernetes' own is a plain request;
//! a service-account certificate user reaches the upstream with exactly its groups; a
//! certificate that expires on an open connection stops authenticating, and so does one whose CA
//! a reloaded `--client-ca-file` no longer holds.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use kube_watchcache::app::{self, Running};
use kube_watchcache_sim::{AuthScript, Rule, Sim, SimHandle, SimOptions};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security").join(name)
}

/// A client CA and certificates it signs, with any CN and O values.
struct Pki {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
}

impl Pki {
    fn new() -> Pki {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, "identity test client CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let ca_pem = ca.self_signed(&key).unwrap().pem();
        Pki { issuer: Issuer::new(ca, key), ca_pem }
    }

    /// (certificate PEM, key PEM) for `CN=cn` and one `O` per entry of `orgs`.
    fn client(&self, cn: &str, orgs: &[&str]) -> (String, String) {
        self.client_until(cn, orgs, None)
    }

    /// [`Pki::client`], valid until `not_after` (Unix seconds) when given.
    fn client_until(&self, cn: &str, orgs: &[&str], not_after: Option<u64>) -> (String, String) {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        if let Some(t) = not_after {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(t);
        }
        p.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, *o);
        }
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Always presents one certificate.
#[derive(Debug)]
struct Present(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for Present {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

use common::tls::TlsClient;

/// An HTTP/1.1 client presenting `identity` (so that `Connection: Upgrade` can be sent).
fn client(identity: &(String, String)) -> TlsClient {
    common::tls::https(client_config(identity), false)
}

/// The TLS configuration of [`client`]; clients made from clones of it share its TLS session
/// cache (a second one's connection resumes the first one's session).
fn client_config((cert, key): &(String, String)) -> rustls::ClientConfig {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.as_bytes()).map(|c| c.unwrap()).collect();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Not `with_client_auth_cert`, which refuses X.509 v1 certificates on the client side.
    let signer = provider.key_provider.load_private_key(key).unwrap();
    let certified = Arc::new(rustls::sign::CertifiedKey::new(chain, signer));
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(common::tls::server_roots())
        .with_client_cert_resolver(Arc::new(Present(certified)))
}

struct Env {
    sim: SimHandle,
    proxy: Running,
    dir: PathBuf,
}

async fn start(pki: &Pki, tag: &str) -> Env {
    start_with_ca(&pki.ca_pem, tag).await
}

async fn start_with_ca(ca_pem: &str, tag: &str) -> Env {
    let dir = std::env::temp_dir().join(format!("kwc-identity-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("client-ca.crt"), ca_pem).unwrap();
    let sim = Sim::start(SimOptions::default()).await.expect("sim starts");
    // Everyone authenticated may do everything: the refusals below are the proxy's own.
    sim.sim.set_auth(AuthScript::default().rule(Rule::group("system:authenticated", &["*"], "*", &["*"])));
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ns-a"}}))
        .unwrap();
    let mut args = common::serve_args(sim.addr, &["configmaps"]);
    args.security.auth = "upstream".into();
    args.security.client_ca_file = Some(dir.join("client-ca.crt"));
    args.insecure_listen = None;
    args.secure_port = 0;
    args.bind_address = "127.0.0.1".parse().unwrap();
    args.tls_cert_file = Some(testdata("server1.crt"));
    args.tls_private_key_file = Some(testdata("server1.key"));
    // The client CA file is polled often: a test rewrites it.
    args.security.tls_reload_interval = Duration::from_millis(100);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    Env { sim, proxy, dir }
}

impl Env {
    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.proxy.addr.port())
    }

    /// A ConfigMap POST (forwarded), optionally asking for an arbitrary upgrade.
    async fn create(&self, c: &TlsClient, name: &str, upgrade: bool) -> StatusCode {
        let mut b = Request::builder()
            .method(Method::POST)
            .uri(self.url("/api/v1/namespaces/ns-a/configmaps"))
            .header("content-type", "application/json");
        if upgrade {
            b = b.header("connection", "Upgrade").header("upgrade", "x");
        }
        let body = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name}}).to_string();
        let resp = tokio::time::timeout(
            Duration::from_secs(10),
            c.request(b.body(Full::new(Bytes::from(body))).unwrap()),
        )
        .await
        .expect("answered")
        .expect("request");
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        status
    }

    /// Lists with `c` until the answer is `want` (a reloaded client CA bundle), at most 10 s.
    async fn list_until(&self, c: TlsClient, want: StatusCode) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let code = self.list(&c).await;
            if code == want {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "still {code}, not {want}, 10 s after the change");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn list(&self, c: &TlsClient) -> StatusCode {
        let req = Request::get(self.url("/api/v1/namespaces/ns-a/configmaps?resourceVersion=0"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        c.request(req).await.expect("request").status()
    }

    /// Forwarded POSTs the sim saw, with their impersonation headers.
    fn posts(&self) -> Vec<(Option<String>, Vec<String>, bool)> {
        self.sim
            .sim
            .requests(|r| r.method == "POST" && r.path.ends_with("/configmaps"))
            .into_iter()
            .map(|r| {
                let user = r
                    .headers
                    .get("impersonate-user")
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                let groups = r
                    .headers
                    .get_all("impersonate-group")
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect();
                (user, groups, r.headers.contains_key("upgrade"))
            })
            .collect()
    }

    async fn stop(self) {
        self.proxy.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Issue 21 item 2, as reproduced against a real kube-apiserver 1.28.7: `CN=mallory,
/// O=" system:masters"` with `Connection: Upgrade`, `Upgrade: x` on a POST ran as
/// system:masters. Now every request with such a subject is 401 and nothing reaches the upstream.
#[tokio::test]
async fn subjects_a_header_would_change_are_refused() {
    let pki = Pki::new();
    let env = start(&pki, "subjects").await;
    for (cn, orgs) in [
        ("mallory", vec![" system:masters"]),
        ("mallory", vec!["system:masters "]),
        ("mallory", vec!["devs", "\tsystem:masters"]),
        (" ", vec![]),
        (" mallory", vec![]),
        ("mal\u{7f}lory", vec![]),
    ] {
        let c = client(&pki.client(cn, &orgs));
        assert_eq!(env.create(&c, "by-mallory", true).await, StatusCode::UNAUTHORIZED, "{cn:?} {orgs:?}");
        assert_eq!(env.create(&c, "by-mallory", false).await, StatusCode::UNAUTHORIZED, "{cn:?} {orgs:?}");
        assert_eq!(env.list(&c).await, StatusCode::UNAUTHORIZED, "{cn:?} {orgs:?}");
    }
    assert!(env.posts().is_empty(), "nothing forwarded: {:?}", env.posts());
    // A well-formed certificate with an arbitrary Upgrade: a plain request, as the apiserver
    // treats it; the upstream gets exactly the certificate's identity, without the Upgrade.
    let c = client(&pki.client("carol", &["team a"]));
    assert_eq!(env.create(&c, "by-carol", true).await, StatusCode::CREATED);
    assert_eq!(
        env.posts(),
        [(Some("carol".to_string()), vec!["team a".to_string(), "system:authenticated".to_string()], false)]
    );
    env.stop().await;
}

/// Issue 21 item 3: `CN=system:serviceaccount:<ns>:<name>` without O has no groups but
/// `system:authenticated` at the apiserver; forwarded, it must not gain the service-account
/// groups (which the apiserver adds when no Impersonate-Group is sent).
#[tokio::test]
async fn a_service_account_certificate_keeps_exactly_its_groups_upstream() {
    let pki = Pki::new();
    let env = start(&pki, "sa").await;
    let c = client(&pki.client("system:serviceaccount:ns-a:robot", &[]));
    assert_eq!(env.create(&c, "by-robot", false).await, StatusCode::CREATED);
    assert_eq!(
        env.posts(),
        [(
            Some("system:serviceaccount:ns-a:robot".to_string()),
            vec!["system:authenticated".to_string()],
            false
        )]
    );
    env.stop().await;
}

/// Issue 21 item 7: an X.509 v1 client certificate (kube-apiserver accepts them, rustls does
/// not verify them) completes the handshake and gets a 401 saying why, on every request, and
/// authenticates nothing: the upstream never hears of it.
#[tokio::test]
async fn a_version_one_client_certificate_gets_a_clear_401() {
    let ca = std::fs::read_to_string(testdata("v1/ca.crt")).unwrap();
    let env = start_with_ca(&ca, "v1").await;
    let cert = std::fs::read_to_string(testdata("v1/client-v1.crt")).unwrap();
    let key = std::fs::read_to_string(testdata("v1/client-v1.key")).unwrap();
    let c = client(&(cert, key));
    let req = Request::get(env.url("/api/v1/namespaces/ns-a/configmaps?resourceVersion=0"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = c.request(req).await.expect("the handshake completes");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["reason"], "Unauthorized");
    assert!(body["message"].as_str().unwrap().contains("X.509 version 1"), "{body}");
    assert_eq!(env.create(&c, "by-v1", false).await, StatusCode::UNAUTHORIZED);
    assert!(env.posts().is_empty());
    env.stop().await;
}

/// The apiserver verifies a client's chain at every request: a certificate that expires while
/// its connection is kept open (or its TLS session resumed, which restores the chain unverified)
/// stops authenticating — 401, not anonymous, nothing forwarded in its name (a review: it kept
/// reading from the cache and writing through the proxy for as long as the connection was used).
/// Waits for the certificate's real expiry (about 3 s; certificate times have whole seconds).
#[tokio::test]
async fn a_client_certificate_that_expires_on_an_open_connection_stops_authenticating() {
    let pki = Pki::new();
    let env = start(&pki, "expiry").await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let c = client(&pki.client_until("erin", &["devs"], Some(now + 3)));
    assert_eq!(env.list(&c).await, StatusCode::OK, "valid at first");
    assert_eq!(env.create(&c, "before-expiry", false).await, StatusCode::CREATED);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let code = env.list(&c).await;
        if code == StatusCode::UNAUTHORIZED {
            break;
        }
        assert_eq!(code, StatusCode::OK);
        assert!(std::time::Instant::now() < deadline, "still authenticated 12 s after its notAfter");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() >= now + 3,
        "not before its notAfter"
    );
    assert_eq!(env.create(&c, "after-expiry", false).await, StatusCode::UNAUTHORIZED);
    let posts = env.posts();
    assert_eq!(posts.len(), 1, "only the POST before expiry was forwarded: {posts:?}");
    env.stop().await;
}

/// `--client-ca-file` is reloaded when its content changes, and a connection verified under the
/// bundle before verifies its chain again at its next request, as the apiserver verifies every
/// request against its current bundle: a CA taken out of the file stops authenticating its
/// certificates on connections kept open (and put back, authenticates them again); a new CA's
/// certificates are accepted without a restart.
#[tokio::test]
async fn a_client_ca_taken_out_of_the_file_stops_authenticating_open_connections() {
    let (old_ca, new_ca) = (Pki::new(), Pki::new());
    let env = start(&old_ca, "ca-reload").await;
    let old_client = client(&old_ca.client("olga", &["devs"]));
    assert_eq!(env.list(&old_client).await, StatusCode::OK);
    let until = |want: StatusCode, c: &TlsClient| env.list_until(c.clone(), want);
    std::fs::write(env.dir.join("client-ca.crt"), &new_ca.ca_pem).unwrap();
    until(StatusCode::UNAUTHORIZED, &old_client).await;
    assert_eq!(env.create(&old_client, "by-olga", false).await, StatusCode::UNAUTHORIZED);
    let new_client = client(&new_ca.client("nina", &["devs"]));
    assert_eq!(env.list(&new_client).await, StatusCode::OK, "the new CA's certificates, without a restart");
    // A new handshake with the old CA's certificate is refused outright.
    let fresh_old = client(&old_ca.client("oscar", &["devs"]));
    let req = Request::get(env.url("/api/v1/namespaces/ns-a/configmaps?resourceVersion=0"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert!(fresh_old.request(req).await.is_err(), "the handshake fails");
    // Both CAs: the open connection of the old one authenticates again.
    std::fs::write(env.dir.join("client-ca.crt"), format!("{}{}", old_ca.ca_pem, new_ca.ca_pem)).unwrap();
    until(StatusCode::OK, &old_client).await;
    assert_eq!(env.list(&new_client).await, StatusCode::OK);
    assert!(env.posts().is_empty(), "nothing forwarded in olga's name after her CA was taken out");
    env.stop().await;
}

/// A TLS session resumed after the client CA bundle changed restores a chain nothing verified
/// against the new bundle (rustls does not verify a resumed session's chain): it is verified at
/// the first request, as the apiserver verifies every request — 401, not authenticated by the
/// bundle it was never checked against.
#[tokio::test]
async fn a_session_resumed_after_its_ca_was_taken_out_does_not_authenticate() {
    let (old_ca, new_ca) = (Pki::new(), Pki::new());
    let env = start(&old_ca, "resumed").await;
    let cfg = client_config(&old_ca.client("rosa", &["devs"]));
    let (first, second) = (common::tls::https(cfg.clone(), false), common::tls::https(cfg, false));
    assert_eq!(env.list(&first).await, StatusCode::OK, "a full handshake; its session kept by the client");
    std::fs::write(env.dir.join("client-ca.crt"), &new_ca.ca_pem).unwrap();
    env.list_until(first.clone(), StatusCode::UNAUTHORIZED).await;
    // A new connection resumes the session: the handshake passes without the chain being
    // verified (a full one would fail: the old CA is gone).
    let req = Request::get(env.url("/api/v1/namespaces/ns-a/configmaps?resourceVersion=0"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = second.request(req).await.expect("the resumed handshake completes");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "verified against the bundle at its first request");
    env.stop().await;
}

/// The groups of the forwarded POST that created `name`, as the sim received them.
fn groups_of(env: &Env, user: &str) -> Vec<Vec<String>> {
    env.posts().into_iter().filter(|(u, _, _)| u.as_deref() == Some(user)).map(|(_, g, _)| g).collect()
}

/// Issue 30 §2, as found against kube-apiserver 1.28.7: `CN=system:serviceaccount:team-a:<64 ×
/// a>` is a service account to the apiserver (Go bounds only a service-account name's total
/// length), so the proxy used to forward it as a plain user with no `Impersonate-Group`, and
/// the apiserver added `system:serviceaccounts` and `system:serviceaccounts:team-a`. Now every
/// forwarded identity states all its groups, whatever either side takes the name for: the
/// upstream acts as exactly the certificate's user.
#[tokio::test]
async fn a_long_service_account_label_gains_no_groups_upstream() {
    let pki = Pki::new();
    let env = start(&pki, "sa-long").await;
    let long = "a".repeat(64);
    for (i, name) in
        [long.clone(), format!("x.{long}"), "short".to_string(), "b".repeat(254)].into_iter().enumerate()
    {
        let user = format!("system:serviceaccount:ns-a:{name}");
        let c = client(&pki.client(&user, &["devs"]));
        assert_eq!(env.create(&c, &format!("by-sa-{i}"), false).await, StatusCode::CREATED, "{user}");
        assert_eq!(
            groups_of(&env, &user),
            [vec!["devs".to_string(), "system:authenticated".to_string()]],
            "{user}"
        );
        // And without any O: still stated, so the apiserver adds no service-account group.
        let user = format!("system:serviceaccount:team-b:{name}");
        let c = client(&pki.client(&user, &[]));
        assert_eq!(env.create(&c, &format!("by-bare-sa-{i}"), false).await, StatusCode::CREATED, "{user}");
        assert_eq!(groups_of(&env, &user), [vec!["system:authenticated".to_string()]], "{user}");
    }
    env.stop().await;
}

/// Issue 30 §3: Go's group adder adds `system:authenticated` to nobody in
/// `system:unauthenticated`, nor to `system:anonymous`; and `CN=system:anonymous` cannot be
/// impersonated upstream without gaining `system:unauthenticated`, so it is not forwarded.
#[tokio::test]
async fn unauthenticated_and_anonymous_certificates_keep_their_groups() {
    let pki = Pki::new();
    let env = start(&pki, "anon").await;
    // The sim's rule is for system:authenticated: a user outside it is denied on cached reads.
    let c = client(&pki.client("carol", &["system:unauthenticated"]));
    assert_eq!(env.list(&c).await, StatusCode::FORBIDDEN, "not in system:authenticated");
    assert_eq!(env.create(&c, "by-carol", false).await, StatusCode::CREATED, "the sim does not check writes");
    assert_eq!(groups_of(&env, "carol"), [vec!["system:unauthenticated".to_string()]]);
    let c = client(&pki.client("system:anonymous", &["devs"]));
    assert_eq!(env.list(&c).await, StatusCode::FORBIDDEN, "only its O groups");
    assert_ne!(env.create(&c, "by-anon", false).await, StatusCode::CREATED);
    assert!(groups_of(&env, "system:anonymous").is_empty(), "never forwarded: {:?}", env.posts());
    // (One O each: rcgen keeps one value per attribute type.)
    let c = client(&pki.client("system:anonymous", &["system:unauthenticated"]));
    assert_eq!(env.create(&c, "by-anon-2", false).await, StatusCode::CREATED);
    assert_eq!(groups_of(&env, "system:anonymous"), [vec!["system:unauthenticated".to_string()]]);
    env.stop().await;
}
