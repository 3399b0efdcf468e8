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
