//! Integration: JSON indented for people as kube-apiserver 1.28.7 indents it
//! (`tests/recordings/v1.28.7-raw/pretty.json`, `record_pretty.py`): `?pretty=true`, or a user
//! agent starting with `curl`, `Wget` or `Mozilla/5.0`, gets `json.MarshalIndent`'s bytes for
//! what the proxy answers itself (cached objects and lists, metadata-only, its Statuses); a
//! watch stays compact; a forwarded answer is the upstream's own (the sim indents as the
//! recording does).

use crate::common;

use common::*;
use http::Method;
use kube_watchcache::server::indent::indent;
use serde_json::{json, Value};

const CURL: &str = "curl/8.5.0";

fn recording() -> Value {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/recordings/v1.28.7-raw/pretty.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Each compact answer of the recording, indented, is the apiserver's answer to curl, to
/// Wget and to `?pretty=true`; `pretty=false` overrides curl's user agent.
#[test]
fn indentation_is_the_recorded_apiservers() {
    let rec = recording();
    let rows = rec["requests"].as_array().unwrap();
    let mut checked = 0;
    for r in rows.iter().filter(|r| r.get("compact").is_some()) {
        let (name, compact) = (r["name"].as_str().unwrap(), r["compact"].as_str().unwrap());
        let pretty = indent(compact.as_bytes());
        for how in ["curl", "wget", "pretty=true"] {
            assert_eq!(std::str::from_utf8(&pretty).unwrap(), r[how].as_str().unwrap(), "{name}, {how}");
        }
        assert_eq!(r["curl, pretty=false"], r["compact"], "{name}");
        checked += 1;
    }
    assert!(checked >= 9, "{checked} rows");
    // The watch curl saw is compact, one event per line.
    let watch = rows.iter().find(|r| r["name"] == "watch as curl").unwrap()["curl"].as_str().unwrap();
    assert!(
        watch.starts_with("{\"type\":\"ADDED\",\"object\":{\"kind\":\"ConfigMap\"") && watch.ends_with("}\n"),
        "{watch}"
    );
}

async fn as_(env: &Env, path: &str, agent: &str) -> Resp {
    send(&env.client, Method::GET, &env.proxy_url(path), None, &[("user-agent", agent)]).await
}

fn text(r: &Resp) -> &str {
    std::str::from_utf8(&r.body).unwrap()
}

#[tokio::test]
async fn the_proxys_own_answers_are_indented_for_people_and_watches_are_not() {
    let rec = recording();
    let env = start().await;
    env.ns("p");
    let odd = json!({"apiVersion":"v1","kind":"ConfigMap",
        "metadata":{"name":"odd","labels":{"app":"p"},"annotations":{"note":"a<b>&\"c\"\\ {x}: [y], z"}},
        "data":{"empty":"","unicode":"é\u{2028}✓","json":"{\"k\":[1,{}]}","nl":"a\nb\tc"}});
    let rv = rv_of(&env.sim.sim.create("configmaps", "p", odd).unwrap());
    env.synced_to(rv).await;

    let meta = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    for (path, accept) in [
        ("/api/v1/namespaces/p/configmaps/odd?resourceVersion=0", "application/json"),
        ("/api/v1/namespaces/p/configmaps?resourceVersion=0", "application/json"),
        ("/api/v1/namespaces/p/configmaps?limit=1&resourceVersion=0", "application/json"),
        ("/api/v1/namespaces/none/configmaps?resourceVersion=0", "application/json"),
        ("/api/v1/namespaces/p/configmaps?resourceVersion=0", meta),
        // A Status of the cache (404) and one of the proxy's refusals (400).
        ("/api/v1/namespaces/p/configmaps/none?resourceVersion=0", "application/json"),
        ("/api/v1/namespaces/p/configmaps?labelSelector=a%3D%3D%3Db", "application/json"),
    ] {
        let asked = env.upstream_exact(path);
        let compact = send(
            &env.client,
            Method::GET,
            &env.proxy_url(path),
            None,
            &[("accept", accept), ("user-agent", "kubectl")],
        )
        .await;
        assert!(compact.body.ends_with(b"}\n"), "{path}: compact, with the encoder's newline");
        // The Statuses name nothing of the namespace: byte for byte the recorded ones.
        let recorded = |name: &str| {
            rec["requests"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap()["compact"].clone()
        };
        if path.contains("/none?") {
            assert_eq!(text(&compact), recorded("404 Status"), "{path}");
        } else if path.contains("labelSelector") {
            assert_eq!(text(&compact), recorded("400 Status (bad selector)"), "{path}");
        }
        let pretty = indent(&compact.body);
        for (p, agent) in [(path.to_string(), CURL), (format!("{path}&pretty=true"), "kubectl")] {
            let r = send(
                &env.client,
                Method::GET,
                &env.proxy_url(&p),
                None,
                &[("accept", accept), ("user-agent", agent)],
            )
            .await;
            assert_eq!(r.status, compact.status, "{p}");
            assert_eq!(r.body, pretty, "{p} as {agent}");
            assert_eq!(r.headers["content-length"], pretty.len().to_string().as_str(), "{p}");
            assert!(text(&r).starts_with("{\n  \"kind\": \""), "{p}: {}", text(&r));
        }
        let r = send(
            &env.client,
            Method::GET,
            &env.proxy_url(&format!("{path}&pretty=false")),
            None,
            &[("accept", accept), ("user-agent", CURL)],
        )
        .await;
        assert_eq!(r.body, compact.body, "{path}: pretty=false wins over curl");
        assert_eq!(env.upstream_exact(path), asked, "{path}: served by the proxy");
    }

    // A watch from the cache, as curl: compact events.
    let mut w = open_watch_with(
        &env.client,
        &env.proxy_url(&format!(
            "/api/v1/namespaces/p/configmaps?watch=true&resourceVersion={rv}&pretty=true"
        )),
        &[("user-agent", CURL)],
    )
    .await;
    env.create_cm("p", "later", json!({}));
    let line = w.next_line(std::time::Duration::from_secs(5)).await.expect("an event");
    let one_line = line.iter().filter(|b| **b == b'\n').count() == 1;
    assert!(
        line.starts_with(b"{\"type\":\"ADDED\",\"object\":{") && one_line,
        "{}",
        String::from_utf8_lossy(&line)
    );

    // Forwarded (a Most Recent GET): the upstream's own answer, which the sim indents as the
    // recorded apiserver does — not indented twice.
    let path = "/api/v1/namespaces/p/configmaps/odd";
    let asked = env.upstream_exact(path);
    let r = as_(&env, path, CURL).await;
    assert_eq!(env.upstream_exact(path), asked + 1, "forwarded");
    let direct = send(&env.client, Method::GET, &env.sim_url(path), None, &[("user-agent", CURL)]).await;
    assert_eq!(r.body, direct.body);
    assert!(
        text(&r).starts_with("{\n  \"kind\": \"ConfigMap\",\n  \"apiVersion\": \"v1\",\n  \"metadata\": {\n")
    );
}
