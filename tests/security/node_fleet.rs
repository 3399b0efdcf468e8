//! The node fleet through the cache (issue 16 part 3): a kubelet-like client (HTTP/2, a client
//! certificate `CN=system:node:n1, O=system:nodes`, protobuf-first `Accept`) against a TLS proxy
//! whose upstream, the sim, authorizes like a 1.34 apiserver run with
//! `--authorization-mode=Node,RBAC`. Everything the node may read is served from the cache
//! (the sim never sees those paths), because the proxy's SubjectAccessReviews carry the
//! request's field selector; another node's pods and Secrets get the apiserver's 403. A
//! kube-proxy-like client watches Services and EndpointSlices with kube-proxy's label selector.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kube_watchcache::app::{self, Running};
use kube_watchcache_sim::{AuthScript, Rule, ScriptUser, Sim, SimHandle, SimOptions};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

/// JSON, to read the answers here; a kubelet's protobuf-first Accept gets the same objects in
/// protobuf (`tests/protobuf/protobuf_serving.rs`, `bench --node-identities`).
const ACCEPT: &str = "application/json";

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security").join(name)
}

use common::tls::TlsClient;

/// An HTTP/2 client with a certificate for `cn` / `orgs` signed by `issuer`.
fn node_client(issuer: &Issuer<'_, KeyPair>, cn: &str, orgs: &[&str]) -> TlsClient {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    for o in orgs {
        p.distinguished_name.push(DnType::OrganizationName, *o);
    }
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, issuer).unwrap();
    let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
    let cfg = common::tls::config().with_client_auth_cert(chain, key).unwrap();
    let conn =
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(cfg).https_only().enable_http2().build();
    Client::builder(TokioExecutor::new()).http2_only(true).build(conn)
}

struct Env {
    sim: SimHandle,
    proxy: Running,
    dir: PathBuf,
}

fn pod(name: &str, node: &str, secret: &str, cm: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}],
                    "volumes": [{"name": "s", "secret": {"secretName": secret}},
                                {"name": "c", "configMap": {"name": cm}}]}})
}

async fn start(ca_pem: &str) -> Env {
    let dir = std::env::temp_dir().join(format!("kwc-node-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("client-ca.crt"), ca_pem).unwrap();
    let sim = Sim::start(SimOptions { objects: 0, ..Default::default() }).await.expect("sim starts");
    sim.sim.set_auth(
        AuthScript::default()
            .with_node_authorizer()
            .token("kube-proxy-token", ScriptUser::new("system:serviceaccount:kube-system:kube-proxy", &[]))
            // The system:node-proxier ClusterRole's reads.
            .rule(Rule::user(
                "system:serviceaccount:kube-system:kube-proxy",
                &["list", "watch"],
                "",
                &["services", "nodes"],
            ))
            .rule(Rule::user(
                "system:serviceaccount:kube-system:kube-proxy",
                &["list", "watch"],
                "discovery.k8s.io",
                &["endpointslices"],
            )),
    );
    let s = &sim.sim;
    s.create("namespaces", "", json!({"metadata": {"name": "ns"}})).unwrap();
    for n in ["n1", "n2"] {
        s.create("nodes", "", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})).unwrap();
    }
    for (name, node) in [("p1", "n1"), ("p2", "n2")] {
        s.create(
            "secrets",
            "ns",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("s-{name}")}}),
        )
        .unwrap();
        s.create(
            "configmaps",
            "ns",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c-{name}")}}),
        )
        .unwrap();
        s.create("pods", "ns", pod(name, node, &format!("s-{name}"), &format!("c-{name}"))).unwrap();
    }
    s.create(
        "services",
        "ns",
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "labels": {"app": "web"}}}),
    )
    .unwrap();
    s.create(
        "services",
        "ns",
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hl", "labels": {"service.kubernetes.io/headless": ""}}}),
    )
    .unwrap();
    s.create(
        "discovery.k8s.io/endpointslices",
        "ns",
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "web-1"}, "addressType": "IPv4", "endpoints": []}),
    )
    .unwrap();
    let resources = ["pods", "nodes", "secrets", "configmaps", "services", "discovery.k8s.io/endpointslices"];
    let mut args = common::serve_args(sim.addr, &resources);
    args.security.auth = "upstream".into();
    args.security.client_ca_file = Some(dir.join("client-ca.crt"));
    args.insecure_listen = None;
    args.secure_port = 0;
    args.bind_address = "127.0.0.1".parse().unwrap();
    args.tls_cert_file = Some(testdata("server1.crt"));
    args.tls_private_key_file = Some(testdata("server1.key"));
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    Env { sim, proxy, dir }
}

impl Env {
    /// GET through the proxy; asserts the sim never saw this request (same path and query) when
    /// `cached`. (A watch-list's freshness proof is the proxy's own one-item LIST.)
    async fn get(
        &self,
        c: &TlsClient,
        path_and_query: &str,
        token: Option<&str>,
        cached: bool,
    ) -> (StatusCode, Value) {
        let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
        let (path, query) = (path.to_owned(), query.to_owned());
        let seen = || self.sim.sim.request_count(|r| r.path == path && r.query == query);
        let before = seen();
        let mut b = Request::get(format!("https://localhost:{}{path_and_query}", self.proxy.addr.port()))
            .header("accept", ACCEPT);
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let resp = tokio::time::timeout(
            Duration::from_secs(10),
            c.request(b.body(Full::new(Bytes::new())).unwrap()),
        )
        .await
        .expect("answered")
        .expect("request");
        assert_eq!(resp.version(), Version::HTTP_2);
        let status = resp.status();
        let is_watch = path_and_query.contains("watch=1");
        let body = if is_watch {
            // The initial events, until the initial-events-end bookmark.
            let mut body = resp.into_body();
            let mut buf = Vec::new();
            let mut events = Vec::new();
            while let Ok(Some(Ok(f))) = tokio::time::timeout(Duration::from_secs(5), body.frame()).await {
                if let Some(d) = f.data_ref() {
                    buf.extend_from_slice(d);
                }
                while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    events.push(serde_json::from_slice::<Value>(&line).unwrap());
                }
                if events.iter().any(|e| e["type"] == "BOOKMARK") {
                    break;
                }
            }
            Value::Array(events)
        } else {
            serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes())
                .unwrap_or(Value::Null)
        };
        if cached {
            assert_eq!(seen(), before, "{path_and_query} served from the cache");
        }
        (status, body)
    }
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_kubelet_and_kube_proxy_are_served_from_the_cache_as_a_1_34_apiserver_authorizes_them() {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, "node fleet test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let env = start(&ca_pem).await;
    let n1 = node_client(&issuer, "system:node:n1", &["system:nodes"]);

    // Its pods: a LIST at rv=0 and a watch-list, both with spec.nodeName=n1, from the cache.
    let (s, l) =
        env.get(&n1, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&resourceVersion=0", None, true).await;
    assert_eq!((s, names(&l)), (StatusCode::OK, vec!["p1".to_string()]), "{l}");
    let (s, events) = env
        .get(
            &n1,
            "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dn1",
            None,
            true,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let added: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "ADDED")
        .map(|e| e["object"]["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(added, ["p1"]);
    // Its own Node (by name, and by metadata.name selector), its pods' Secret and ConfigMap.
    assert_eq!(env.get(&n1, "/api/v1/nodes/n1?resourceVersion=0", None, true).await.0, StatusCode::OK);
    let (s, l) =
        env.get(&n1, "/api/v1/nodes?fieldSelector=metadata.name%3Dn1&resourceVersion=0", None, true).await;
    assert_eq!((s, names(&l)), (StatusCode::OK, vec!["n1".to_string()]));
    assert_eq!(
        env.get(&n1, "/api/v1/namespaces/ns/secrets/s-p1?resourceVersion=0", None, true).await.0,
        StatusCode::OK
    );
    assert_eq!(
        env.get(&n1, "/api/v1/namespaces/ns/configmaps/c-p1?resourceVersion=0", None, true).await.0,
        StatusCode::OK
    );

    // Another node's: 403 with the apiserver's words (the Node authorizer's reason).
    let (s, st) =
        env.get(&n1, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn2&resourceVersion=0", None, true).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(
        st["message"],
        "pods is forbidden: User \"system:node:n1\" cannot list resource \"pods\" in API group \"\" at the cluster scope: can only list/watch pods with spec.nodeName field selector"
    );
    // Its own name beside another's (terms are ANDed; the Node authorizer allows the request
    // for the one term naming the node): allowed, and nothing of n2's. `spec.host` is the
    // apiserver's alias of `spec.nodeName`, which the authorizer does not read as one.
    for both in ["spec.nodeName%3Dn1%2Cspec.nodeName%3Dn2", "spec.nodeName%3Dn1%2Cspec.host%3Dn2"] {
        let (s, l) =
            env.get(&n1, &format!("/api/v1/pods?fieldSelector={both}&resourceVersion=0"), None, true).await;
        assert_eq!((s, names(&l)), (StatusCode::OK, Vec::<String>::new()), "{both}: {l}");
        let watch = format!(
            "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&fieldSelector={both}"
        );
        let (s, events) = env.get(&n1, &watch, None, true).await;
        let types: Vec<&str> =
            events.as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!((s, types), (StatusCode::OK, vec!["BOOKMARK"]), "{both}: {events}");
    }
    let (s, _) =
        env.get(&n1, "/api/v1/pods?fieldSelector=spec.host%3Dn2&resourceVersion=0", None, true).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "the alias alone names no node to the authorizer");
    let (s, st) = env.get(&n1, "/api/v1/namespaces/ns/secrets/s-p2?resourceVersion=0", None, true).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(
        st["message"].as_str().unwrap().ends_with("no relationship found between node 'n1' and this object"),
        "{st}"
    );
    let (s, st) = env.get(&n1, "/api/v1/nodes?resourceVersion=0", None, true).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(st["message"]
        .as_str()
        .unwrap()
        .ends_with("node 'n1' cannot read all nodes, only its own Node object"));

    // kube-proxy: Services and EndpointSlices with its label selector, from the cache.
    // kube-proxy authenticates with its service-account token (no client certificate).
    let selector =
        "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name";
    let kp = {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(testdata("server-ca.crt")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let cfg =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        let conn = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(cfg)
            .https_only()
            .enable_http2()
            .build();
        Client::builder(TokioExecutor::new()).http2_only(true).build(conn)
    };
    let (s, l) = env
        .get(&kp, &format!("/api/v1/services?{selector}&resourceVersion=0"), Some("kube-proxy-token"), true)
        .await;
    assert_eq!((s, names(&l)), (StatusCode::OK, vec!["web".to_string()]), "{l}");
    let (s, l) = env
        .get(
            &kp,
            &format!("/apis/discovery.k8s.io/v1/endpointslices?{selector}&resourceVersion=0"),
            Some("kube-proxy-token"),
            true,
        )
        .await;
    assert_eq!((s, names(&l)), (StatusCode::OK, vec!["web-1".to_string()]), "{l}");

    env.proxy.shutdown().await;
    let _ = std::fs::remove_dir_all(&env.dir);
}
