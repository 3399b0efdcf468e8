//! The sim refuses the pod updates a real apiserver refuses (issue 18 item 3), checked against
//! `tests/recordings/v1.28.7-raw/pod-update.json` (kube-apiserver v1.28.7, see the recordings
//! README): what create stores (defaults and ServiceAccount admission), a whole-pod PUT of the
//! pod as first sent (422), an image change (200), an env change (422), a merge-patch of an
//! annotation (200). Then the bench's old writer (whole-pod PUTs) run against the sim: the run
//! fails, loudly, with the apiserver's message.

use crate::common;

use std::time::Duration;

use http::{Method, StatusCode};
use kube_watchcache_bench::{self as bench, BenchArgs, Scenario};
use kube_watchcache_sim::{Sim, SimOptions};
use serde_json::{json, Value};

fn recording() -> Value {
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/recordings/v1.28.7-raw/pod-update.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// The `kube-api-access-<suffix>` names made equal, so that two pods' specs compare.
fn unsuffixed(v: &Value) -> Value {
    let text = v.to_string();
    let re = regex::Regex::new(r"kube-api-access-[a-z0-9]{5}").unwrap();
    serde_json::from_str(&re.replace_all(&text, "kube-api-access-XXXXX")).unwrap()
}

async fn send(
    client: &common::HttpClient,
    m: Method,
    url: &str,
    body: &Value,
    ct: &str,
) -> (StatusCode, Value) {
    let r = common::send(client, m, url, Some(body.clone()), &[("content-type", ct)]).await;
    (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

/// Everything but the message's diff (the apiserver's is of its Go structs).
fn first_lines(status: &Value) -> Value {
    let mut s = status.clone();
    let cut = |v: &mut Value| {
        let m = v.as_str().unwrap().split('\n').next().unwrap().to_owned();
        *v = json!(m);
    };
    cut(&mut s["message"]);
    cut(&mut s["details"]["causes"][0]["message"]);
    s
}

#[tokio::test]
async fn the_sim_stores_and_refuses_pod_writes_as_the_apiserver_does() {
    let rec = recording();
    let handle =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .unwrap();
    let client = common::client();
    let base = format!("http://{}", handle.addr);
    let url = format!("{base}/api/v1/namespaces/rec-put/pods");
    let _ = send(
        &client,
        Method::POST,
        &format!("{base}/api/v1/namespaces"),
        &json!({"metadata": {"name": "rec-put"}}),
        "application/json",
    )
    .await;

    let (code, created) =
        send(&client, Method::POST, &url, &rec["create"]["request"], "application/json").await;
    assert_eq!(code, StatusCode::CREATED, "{created}");
    assert_eq!(
        unsuffixed(&created["spec"]),
        unsuffixed(&rec["create"]["body"]["spec"]),
        "what create stores: defaults and ServiceAccount admission"
    );

    // The old bench writer: the pod as first sent, with the stored RV.
    let mut old = rec["put_as_created"]["request"].clone();
    old["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    let (code, status) = send(&client, Method::PUT, &format!("{url}/p1"), &old, "application/json").await;
    assert_eq!(code.as_u16(), rec["put_as_created"]["code"]);
    let want: Value = serde_json::from_str(rec["put_as_created"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(first_lines(&status), first_lines(&want));
    assert!(status["message"].as_str().unwrap().contains("volumes"), "the diff names what changed: {status}");

    // An image change is allowed.
    let mut image = created.clone();
    image["spec"]["containers"][0]["image"] = json!("registry.k8s.io/pause:3.10");
    let (code, stored) = send(&client, Method::PUT, &format!("{url}/p1"), &image, "application/json").await;
    assert_eq!(code.as_u16(), rec["put_image_only"]["code"], "{stored}");
    assert_eq!(stored["spec"]["containers"][0]["image"], "registry.k8s.io/pause:3.10");

    // An env var is not.
    let mut env = stored.clone();
    env["spec"]["containers"][0]["env"] = json!([{"name": "A", "value": "b"}]);
    let (code, status) = send(&client, Method::PUT, &format!("{url}/p1"), &env, "application/json").await;
    assert_eq!(code.as_u16(), rec["put_env_added"]["code"]);
    let want: Value = serde_json::from_str(rec["put_env_added"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(first_lines(&status), first_lines(&want));

    // A merge-patch of the bench annotations is (what the writer does now).
    let patch = json!({"metadata": {"annotations": {"kube-watchcache.io/bench-seq": "4"}}});
    let (code, _) =
        send(&client, Method::PATCH, &format!("{url}/p1"), &patch, "application/merge-patch+json").await;
    assert_eq!(code.as_u16(), rec["merge_patch_annotation"]["code"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_run_whose_writes_the_sim_refuses_fails_and_says_why() {
    let handle =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .unwrap();
    let proxy = kube_watchcache::app::start(&common::serve_args(handle.addr, &["pods"])).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let mut a = BenchArgs::new(Scenario::WatchFanout, Duration::from_secs(2));
    a.direct = Some(format!("http://{}", handle.addr));
    a.target = Some(format!("http://{}", proxy.addr));
    a.watchers = Some(5);
    a.objects = Some(20);
    a.object_size = Some(400);
    a.events_per_sec = Some(20.0);
    a.lease_churn = Some(0.0);
    a.put_writes = true;
    let report = bench::measure(&a).await.expect("the run completes");
    let problems = report.problems.join("\n");
    assert!(problems.contains("writes failed"), "{problems}");
    assert!(
        problems.contains("pod updates may not change fields other than"),
        "the apiserver's own message: {problems}"
    );
    assert!(report.table().contains("writes failed"));
    // The exit code: `run` fails (the pods exist now; seeding them again would be a PUT too).
    a.skip_seed = true;
    let err = bench::run(a).await.expect_err("a non-zero exit");
    assert!(err.contains("writes failed") && err.contains("422"), "{err}");
}
