//! Integration: real Kubernetes clients through the proxy — the `kube` crate's watcher and
//! reflector, and `kubectl` (from `$KUBECTL`; skipped loudly when unset).

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client, Config};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

fn kube_client(env: &Env) -> Client {
    let mut cfg = Config::new(env.proxy_url("").parse().unwrap());
    cfg.default_namespace = "ns".into();
    Client::try_from(cfg).unwrap()
}

/// Runs a kube reflector over a watcher; returns its store and task.
fn spawn_reflector(
    api: Api<ConfigMap>,
    wc: watcher::Config,
) -> (reflector::Store<ConfigMap>, tokio::task::JoinHandle<()>) {
    let (store, writer) = reflector::store();
    let stream = reflector(writer, watcher(api, wc)).applied_objects();
    let task = tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                eprintln!("watcher error: {e}");
            }
        }
    });
    (store, task)
}

/// Waits until the store holds exactly `want` (names, sorted).
async fn converges(store: &reflector::Store<ConfigMap>, want: &[&str], timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut names: Vec<String> = store.state().iter().map(|c| c.metadata.name.clone().unwrap()).collect();
        names.sort();
        if names == want {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "store never converged: {names:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The kube reflector syncs through the proxy and sees a change made upstream.
async fn reflector_sees_upstream_changes(wc: watcher::Config) {
    let env = start().await;
    env.create_cm("ns", "a", json!({"app": "x"}));
    let rv = env.create_cm("ns", "b", json!({"app": "x"}));
    env.synced_to(rv).await;
    let api: Api<ConfigMap> = Api::namespaced(kube_client(&env), "ns");
    let (store, task) = spawn_reflector(api, wc);
    tokio::time::timeout(Duration::from_secs(10), store.wait_until_ready()).await.expect("synced").unwrap();
    assert_eq!(store.state().len(), 2);
    env.create_cm("ns", "c", json!({"app": "x"}));
    env.delete_cm("ns", "a");
    converges(&store, &["b", "c"], Duration::from_secs(10)).await;
    task.abort();
}

#[tokio::test]
async fn kube_watcher_list_then_watch() {
    reflector_sees_upstream_changes(watcher::Config::default()).await;
}

#[tokio::test]
async fn kube_watcher_any_semantic_list() {
    let mut wc = watcher::Config::default().any_semantic();
    wc.page_size = None;
    reflector_sees_upstream_changes(wc).await;
}

#[tokio::test]
async fn kube_watcher_streaming_list() {
    reflector_sees_upstream_changes(watcher::Config::default().streaming_lists()).await;
}

fn kubectl() -> Option<String> {
    match std::env::var("KUBECTL") {
        Ok(k) if !k.is_empty() => Some(k),
        _ => {
            eprintln!(
                "\n*** SKIPPED: KUBECTL is not set; the kubectl tests did not run (.ci/run sets it) ***\n"
            );
            None
        }
    }
}

fn kubeconfig(env: &Env) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("kwc-kubectl-{}-{}", std::process::id(), env.proxy.addr.port()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: p\n  cluster:\n    server: {}\ncontexts:\n- name: p\n  context:\n    cluster: p\n    user: u\n    namespace: ns\ncurrent-context: p\nusers:\n- name: u\n  user: {{}}\n",
            env.proxy_url("")
        ),
    )
    .unwrap();
    path
}

async fn run(
    kubectl: &str,
    kc: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(kubectl);
    cmd.arg("--kubeconfig")
        .arg(kc)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl runs");
    if let Some(input) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut si = child.stdin.take().unwrap();
        si.write_all(input.as_bytes()).await.unwrap();
    }
    drop(child.stdin.take());
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("kubectl in time")
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[tokio::test]
async fn kubectl_get_watch_and_apply() {
    let Some(kubectl) = kubectl() else { return };
    let env = start().await;
    let rv = env.create_cm("ns", "from-upstream", json!({"app": "k"}));
    env.synced_to(rv).await;
    let kc = kubeconfig(&env);

    let (ok, out, err) = run(&kubectl, &kc, &["get", "configmaps"], None).await;
    assert!(ok, "kubectl get failed: {err}");
    assert!(out.contains("from-upstream"), "{out}");
    let (ok, out, err) = run(&kubectl, &kc, &["get", "configmaps", "-o", "json"], None).await;
    assert!(ok, "{err}");
    assert!(out.contains("\"from-upstream\""), "{out}");
    let (ok, out, err) =
        run(&kubectl, &kc, &["get", "--raw", "/api/v1/namespaces/ns/configmaps?resourceVersion=0"], None)
            .await;
    assert!(ok, "{err}");
    assert!(out.contains("ConfigMapList"), "{out}");

    // Chunked lists (limit + continue), label and field selectors.
    env.create_cm("ns", "second", json!({"app": "other"}));
    let rv = env.create_cm("ns", "third", json!({"app": "k"}));
    env.synced_to(rv).await;
    let (ok, out, err) =
        run(&kubectl, &kc, &["get", "configmaps", "--chunk-size=2", "-o", "name"], None).await;
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["configmap/from-upstream", "configmap/second", "configmap/third"]
    );
    let (ok, out, err) = run(&kubectl, &kc, &["get", "configmaps", "-l", "app=k", "-o", "name"], None).await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["configmap/from-upstream", "configmap/third"]);
    let (ok, out, err) = run(
        &kubectl,
        &kc,
        &["get", "configmaps", "--field-selector", "metadata.name=second", "-o", "name"],
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "configmap/second");
    let (ok, _, err) = run(&kubectl, &kc, &["get", "configmaps", "--field-selector", "data.x=1"], None).await;
    assert!(!ok && err.contains("is not a known field selector"), "{err}");

    // apply: GET (404) then POST through the proxy; the cache sees it.
    let manifest = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"applied","namespace":"ns"},"data":{"k":"v"}}"#;
    let (ok, out, err) = run(&kubectl, &kc, &["apply", "--validate=false", "-f", "-"], Some(manifest)).await;
    assert!(ok, "kubectl apply failed: {out} {err}");
    let (ok, out, err) =
        run(&kubectl, &kc, &["get", "configmap", "applied", "-o", "jsonpath={.data.k}"], None).await;
    assert!(ok && out == "v", "{out} {err}");

    // get -w (JSON output: the watch is served from the cache) sees a change made upstream.
    let mut child = tokio::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["get", "configmaps", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut created = false;
    while !seen.iter().any(|l: &String| l.contains("late-arrival")) {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .expect("kubectl -w output in time")
            .unwrap();
        let Some(line) = line else { panic!("kubectl -w ended: {seen:?}") };
        seen.push(line);
        if !created && seen.iter().any(|l| l.contains("applied")) {
            env.create_cm("ns", "late-arrival", json!({}));
            created = true;
        }
    }
    child.kill().await.ok();
}

/// A client whose resourceVersion is older than the proxy's history (here: it lands on a new
/// replica that started after the changes) gets a 410, relists, and ends with the upstream's state.
#[tokio::test]
async fn kube_watcher_survives_a_proxy_side_410() {
    let mut env = start().await;
    env.create_cm("ns", "a", json!({}));
    let rv = env.create_cm("ns", "b", json!({}));
    env.synced_to(rv).await;
    let api: Api<ConfigMap> = Api::namespaced(kube_client(&env), "ns");
    let (store, task) = spawn_reflector(api, watcher::Config::default());
    tokio::time::timeout(Duration::from_secs(10), store.wait_until_ready()).await.expect("synced").unwrap();

    // The replica goes away; the upstream changes; a new replica comes up at the same address
    // with a history that starts after those changes.
    let addr = env.proxy.addr;
    let old = std::mem::replace(&mut env.proxy, {
        let args = serve_args(env.sim.addr, &["configmaps"]);
        // Bind the replacement only after the old one is gone: placeholder first.
        let mut placeholder = args.clone();
        placeholder.insecure_listen = Some("127.0.0.1:0".parse().unwrap());
        kube_watchcache::app::start(&placeholder).await.unwrap()
    });
    old.shutdown().await;
    env.delete_cm("ns", "a");
    env.create_cm("ns", "c", json!({}));
    let mut args = serve_args(env.sim.addr, &["configmaps"]);
    args.insecure_listen = Some(addr);
    let replica = kube_watchcache::app::start(&args).await.expect("the new replica binds the same address");
    assert!(replica.wait_ready(Duration::from_secs(10)).await);
    let (floor, _) = replica.readers()[0].window();
    assert!(floor.0 > rv, "the client's RV is older than the new replica's history");
    let placeholder = std::mem::replace(&mut env.proxy, replica);
    placeholder.shutdown().await;

    // The new replica answers the old RV with ERROR 410; the client relists and converges.
    converges(&store, &["b", "c"], Duration::from_secs(30)).await;
    task.abort();
}
