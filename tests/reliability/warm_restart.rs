//! Integration: warm restarts (`--state-dir`, issue 33 item 1) in front of the simulated
//! apiserver. A proxy saves at shutdown (and every `--state-sync-period`); the next one serves
//! the same objects at the same RVs before any full upstream LIST, watchers resume at every RV
//! of the restored history with exactly the events after it, a state the upstream compacted
//! past relists (410 for what the relist does not cover), and every state that cannot be
//! trusted — corrupt, truncated, another format version, another cluster, an upstream behind
//! it — is refused with its reason and the proxy starts cold. Secrets stay off the disk unless
//! asked for.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use kube_watchcache::app::{self, Running};
use kube_watchcache::config::ServeArgs;
use kube_watchcache::resource::Rv;
use kube_watchcache::state::{self, format};
use kube_watchcache_sim::{Sim, SimHandle, SimOptions};
use serde_json::{json, Value};

const CM: &str = "/api/v1/configmaps";

fn temp_dir(name: &str) -> PathBuf {
    let d =
        std::env::temp_dir().join(format!("kwc-warm-{name}-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn sim() -> SimHandle {
    let s =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .expect("sim starts");
    let _ = s.sim.create("namespaces", "", json!({"metadata":{"name":"w"}}));
    s
}

fn args(sim: &SimHandle, dir: &Path, resources: &[&str]) -> ServeArgs {
    let mut a = serve_args(sim.addr, resources);
    a.state_dir = Some(dir.to_path_buf());
    a
}

async fn proxy(args: &ServeArgs) -> Running {
    let p = app::start(args).await.expect("proxy starts");
    assert!(p.wait_ready(Duration::from_secs(10)).await, "proxy ready");
    p
}

fn cm(sim: &SimHandle, name: &str, data: &str) -> u64 {
    let o = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":"w"},"data":{"k":data}});
    let r = match sim.sim.update("configmaps", "w", o.clone()) {
        Ok(r) => r,
        Err(_) => sim.sim.create("configmaps", "w", o).expect("create"),
    };
    rv_of(&r)
}

/// Full LISTs of configmaps the sim answered (the reflector's pages; not the `limit=1` check,
/// nor the consistency check's metadata-only LISTs).
fn full_lists(sim: &SimHandle) -> usize {
    sim.sim.request_count(|r| common::reflector_list(r, CM))
}

async fn get(client: &HttpClient, p: &Running, path: &str) -> Value {
    let r = send(client, http::Method::GET, &format!("http://{}{path}", p.addr), None, &[]).await;
    assert_eq!(r.status.as_u16(), 200, "{path}: {}", String::from_utf8_lossy(&r.body));
    r.json()
}

async fn metric(client: &HttpClient, p: &Running, series: &str) -> u64 {
    let r =
        send(client, http::Method::GET, &format!("http://{}/watchcache/metrics", p.addr), None, &[]).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The sim's own configmaps, as (name, RV).
async fn truth(client: &HttpClient, sim: &SimHandle) -> Vec<(String, u64)> {
    let r = send(client, http::Method::GET, &format!("http://{}{CM}", sim.addr), None, &[]).await;
    items(&r.json())
}

fn items(list: &Value) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["metadata"]["name"].as_str().unwrap().to_owned(), rv_of(o)))
        .collect();
    v.sort();
    v
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join("core_configmaps.state")
}

/// A proxy that cached configmaps and saw `n` changes, shut down; returns the changes' RVs.
async fn saved_run(sim: &SimHandle, dir: &Path, n: usize) -> Vec<u64> {
    let a = proxy(&args(sim, dir, &["configmaps", "secrets"])).await;
    let mut rvs = Vec::new();
    for i in 0..n {
        rvs.push(cm(sim, &format!("c{}", i % 4), &format!("v{i}")));
    }
    let r = a.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
    r.wait_for(Rv(*rvs.last().unwrap()), Duration::from_secs(5)).await.expect("caught up");
    a.shutdown().await;
    rvs
}

#[tokio::test]
async fn a_restarted_proxy_serves_the_saved_cache_at_once_at_the_same_rvs() {
    let (sim, dir, client) = (sim().await, temp_dir("same"), client());
    let _ = sim.sim.create("secrets", "w", json!({"metadata":{"name":"s"},"data":{"k":"c2VjcmV0"}}));
    let rvs = saved_run(&sim, &dir, 12).await;
    assert!(state_file(&dir).exists(), "configmaps written at shutdown");
    assert!(!dir.join("core_secrets.state").exists(), "secrets are not written by default");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(state_file(&dir)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    let lists = full_lists(&sim);
    let truth = truth(&client, &sim).await;

    let b = proxy(&args(&sim, &dir, &["configmaps", "secrets"])).await;
    let list = get(&client, &b, &format!("{CM}?resourceVersion=0")).await;
    assert_eq!(items(&list), truth);
    assert_eq!(list["metadata"]["resourceVersion"], json!(rvs.last().unwrap().to_string()));
    assert_eq!(full_lists(&sim), lists, "no full upstream LIST of configmaps after a warm start");
    assert_eq!(metric(&client, &b, "watchcache_state_loads_total{result=\"restored\"}").await, 1);
    // Once after a warm start, the consistency check compares the restored cache with the
    // upstream at its RV.
    let consistent = "watchcache_consistency_checks_total{resource=\"configmaps\",result=\"consistent\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&client, &b, consistent).await == 0 {
        assert!(Instant::now() < deadline, "checked after the warm start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The reflector resumed the upstream watch: a change made now reaches the cache.
    let rv = cm(&sim, "after", "x");
    b.readers()[0].wait_for(Rv(rv), Duration::from_secs(5)).await.expect("watch resumed");
    assert_eq!(full_lists(&sim), lists);
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn watchers_resume_at_every_rv_of_the_restored_history_with_exactly_the_events_after_it() {
    let (sim, dir, client) = (sim().await, temp_dir("resume"), client());
    let rvs = saved_run(&sim, &dir, 10).await;
    let saved = state::decode(&std::fs::read(state_file(&dir)).unwrap()).unwrap();
    assert_eq!(saved.events.len(), rvs.len(), "the whole history is saved");
    let b = proxy(&args(&sim, &dir, &["configmaps"])).await;
    // Every change the sim made, the live ones of the loop included.
    let mut all = rvs.clone();
    for from in saved.floor.0..=*rvs.last().unwrap() {
        let mut w =
            open_watch(&client, &format!("http://{}{CM}?watch=1&resourceVersion={from}", b.addr)).await;
        assert_eq!(w.status.as_u16(), 200);
        let want: Vec<u64> = all.iter().copied().filter(|&r| r > from).collect();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let e = w.next(Duration::from_secs(5)).await.expect("event");
            assert_ne!(e["type"], "ERROR", "from {from}: {e}");
            got.push(rv_of(&e["object"]));
        }
        assert_eq!(got, want, "watch from {from}");
        // Nothing more: the next thing on the stream is a change made now.
        let now = cm(&sim, "c0", &format!("now{from}"));
        let e = w.next(Duration::from_secs(5)).await.expect("live event");
        assert_eq!(rv_of(&e["object"]), now, "from {from}");
        all.push(now);
    }
    // An Exact LIST at a restored RV is forwarded: the upstream may have compacted it while the
    // proxy was away, and answers for itself (here: it still has it).
    let query = format!("resourceVersion={}&resourceVersionMatch=Exact", rvs[0]);
    let before = sim.sim.request_count(|r| r.path == CM && r.query == query);
    get(&client, &b, &format!("{CM}?{query}")).await;
    let after = sim.sim.request_count(|r| r.path == CM && r.query == query);
    assert_eq!(after, before + 1, "forwarded");
    // Before the restored floor: 410, as before the restart.
    let mut w =
        open_watch(&client, &format!("http://{}{CM}?watch=1&resourceVersion={}", b.addr, saved.floor.0 - 1))
            .await;
    let e = w.next(Duration::from_secs(5)).await.expect("an ERROR event");
    assert_eq!(e["object"]["code"], 410, "{e}");
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_state_the_upstream_compacted_past_is_relisted_under_the_relist_rules() {
    let (sim, dir, client) = (sim().await, temp_dir("compacted"), client());
    let rvs = saved_run(&sim, &dir, 6).await;
    // While the proxy is away: a change, a deletion, then the upstream compacts.
    let changed = cm(&sim, "c1", "while-away");
    sim.sim.delete("configmaps", "w", "c2").expect("delete");
    sim.sim.compact();
    let lists = full_lists(&sim);
    let b = app::start(&args(&sim, &dir, &["configmaps"])).await.expect("starts");
    assert!(b.wait_ready(Duration::from_secs(10)).await);
    // The resumed watch got 410: one relist, then the cache is the truth (no ghost of c2).
    let r = b.readers()[0].clone();
    r.wait_for(Rv(changed + 1), Duration::from_secs(10)).await.expect("relisted");
    assert_eq!(full_lists(&sim), lists + 1, "one relist");
    assert_eq!(common::whole_relists(&sim, CM), 1, "asked whole from the restored RV (the watch cache's)");
    let truth = truth(&client, &sim).await;
    assert_eq!(items(&get(&client, &b, &format!("{CM}?resourceVersion=0")).await), truth);
    assert!(!truth.iter().any(|(n, _)| n == "c2"));
    // A watch from a restored RV now answers 410 (the relist covered that gap).
    let mut w =
        open_watch(&client, &format!("http://{}{CM}?watch=1&resourceVersion={}", b.addr, rvs[2])).await;
    let e = w.next(Duration::from_secs(5)).await.expect("an ERROR event");
    assert_eq!(e["object"]["code"], 410, "{e}");
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts a proxy on `dir`, expects a cold start with `reason` counted, and the truth served.
async fn refused(sim: &SimHandle, dir: &Path, reason: &str) {
    let client = client();
    let lists = full_lists(sim);
    let p = proxy(&args(sim, dir, &["configmaps"])).await;
    let series = format!("watchcache_state_loads_total{{result=\"{reason}\"}}");
    assert_eq!(metric(&client, &p, &series).await, 1, "{reason}");
    assert_eq!(metric(&client, &p, "watchcache_state_loads_total{result=\"restored\"}").await, 0);
    assert_eq!(full_lists(sim), lists + 1, "{reason}: cold start (a full LIST)");
    if reason == "upstream_behind" {
        // Refused for good at restore: its file is gone at once (a crash before the next save
        // left it for a start that could take it, once the upstream had passed its RV).
        assert!(!state_file(dir).exists(), "the refused state file is removed");
    }
    let truth = truth(&client, sim).await;
    assert_eq!(items(&get(&client, &p, &format!("{CM}?resourceVersion=0")).await), truth);
    // Its own state, written at shutdown, replaces the refused file.
    p.shutdown().await;
}

#[tokio::test]
async fn every_state_that_cannot_be_trusted_is_refused_with_its_reason() {
    let (sim, dir) = (sim().await, temp_dir("refused"));
    saved_run(&sim, &dir, 4).await;
    let good = std::fs::read(state_file(&dir)).unwrap();
    let reseal = |s: &format::Saved| state::encode(s);
    let saved = state::decode(&good).unwrap();

    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let mut version = good.clone();
    version[8..12].copy_from_slice(&7u32.to_le_bytes());
    let mut ahead = saved.clone();
    ahead.rv = Rv(saved.rv.0 + 1_000_000);
    let mut other = saved.clone();
    other.identity.cluster_uid = "another-cluster".into();
    // A saved header that disagrees with its object's bytes (the first object saved, at the
    // floor or the first event, is one of the sample parsed again at a load).
    let mut bad_header = saved.clone();
    let first = match bad_header.objects.first_mut() {
        Some(o) => o,
        None => &mut bad_header.events[0].1,
    };
    let h = &first.header;
    let mut labels: Vec<(&str, &str)> = h.labels().iter().collect();
    labels.push(("saved", "not in the bytes"));
    let fields: Vec<(&str, &str)> = h.fields().iter().collect();
    first.header =
        kube_watchcache::resource::Header::new(h.namespace(), h.name(), h.rv, &h.uid(), labels, fields);
    // A file of format version 1 (the objects' JSON only): started cold, then saved anew.
    let mut v1 = format::MAGIC.to_vec();
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&[0; 40]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("checksum", flipped),
        ("truncated", good[..good.len() - 10].to_vec()),
        ("format_version", version),
        ("format_version", v1),
        ("corrupt", b"not a state file at all".to_vec()),
        ("corrupt", reseal(&bad_header)),
        ("upstream_behind", reseal(&ahead)),
        ("other_cluster", reseal(&other)),
    ];
    for (reason, bytes) in cases {
        std::fs::write(state_file(&dir), bytes).unwrap();
        refused(&sim, &dir, reason).await;
    }
    // A good state in a file others may write, or another user's: not read (whoever could
    // write it could make the proxy serve objects the upstream never had).
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        std::fs::write(state_file(&dir), &good).unwrap();
        std::fs::set_permissions(state_file(&dir), std::fs::Permissions::from_mode(0o666)).unwrap();
        refused(&sim, &dir, "untrusted").await;
        // A symbolic link in the file's place (to a good state of the proxy's own): not followed.
        let elsewhere = dir.with_extension("elsewhere");
        std::fs::write(&elsewhere, &good).unwrap();
        std::fs::remove_file(state_file(&dir)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, state_file(&dir)).unwrap();
        refused(&sim, &dir, "untrusted").await;
        let _ = std::fs::remove_file(&elsewhere);
        if std::fs::metadata(&dir).unwrap().uid() == 0 {
            std::fs::write(state_file(&dir), &good).unwrap();
            std::os::unix::fs::chown(state_file(&dir), Some(4242), None).unwrap();
            refused(&sim, &dir, "untrusted").await;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn another_cluster_behind_the_same_url_is_refused() {
    let (sim_a, dir) = (sim().await, temp_dir("cluster"));
    saved_run(&sim_a, &dir, 3).await;
    // A new cluster (another kube-system uid); the URL differs too, so rewrite it to match:
    // only the uid tells them apart.
    let sim_b = sim().await;
    let mut s = state::decode(&std::fs::read(state_file(&dir)).unwrap()).unwrap();
    s.identity.server = format!("http://{}", sim_b.addr);
    std::fs::write(state_file(&dir), state::encode(&s)).unwrap();
    refused(&sim_b, &dir, "other_cluster").await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A state larger than `--cache-memory-limit` (a limit lowered after an OOM kill, the volume
/// kept) is refused unread: the resource lists instead, through the budget, and is served.
#[tokio::test]
async fn a_state_past_the_memory_limit_is_refused_and_the_resource_lists() {
    let (sim, dir, client) = (sim().await, temp_dir("limit"), client());
    let rvs = saved_run(&sim, &dir, 3).await;
    let saved = std::fs::read(state_file(&dir)).unwrap();
    let size = saved.len() as u64;
    let mut a = args(&sim, &dir, &["configmaps"]);
    a.cache_memory_limit = kube_watchcache::memory::limit::Limit::Bytes(size - 1);
    // (Not waited ready: a limit this low may drop the cache the list fills; reads then go
    // upstream.)
    let p = app::start(&a).await.expect("proxy starts");
    assert_eq!(metric(&client, &p, "watchcache_state_loads_total{result=\"memory_limit\"}").await, 1);
    assert_eq!(metric(&client, &p, "watchcache_state_loads_total{result=\"restored\"}").await, 0);
    // Served (from the list, or forwarded while it is not in or was dropped), never the state.
    let list = get(&client, &p, &format!("{CM}?limit=500&resourceVersion=0")).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(3), "{list}");
    assert!(
        list["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().unwrap() >= *rvs.last().unwrap()
    );
    p.shutdown().await;
    // Within the limit, the same state is restored (put back: a cache the low limit dropped
    // left no file).
    std::fs::write(state_file(&dir), &saved).unwrap();
    let mut a = args(&sim, &dir, &["configmaps"]);
    a.cache_memory_limit = kube_watchcache::memory::limit::Limit::Bytes(size);
    let p = proxy(&a).await;
    assert_eq!(metric(&client, &p, "watchcache_state_loads_total{result=\"restored\"}").await, 1);
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_write_interrupted_before_its_rename_leaves_the_previous_state_in_use() {
    let (sim, dir, client) = (sim().await, temp_dir("crash"), client());
    let rvs = saved_run(&sim, &dir, 3).await;
    let good = std::fs::read(state_file(&dir)).unwrap();
    // Every prefix of a newer file, as a crash would leave it under its temporary name.
    // (Left by a crash long enough ago: a younger one may be another process's write going on.)
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    for n in [0, 7, good.len() / 2, good.len() - 1] {
        let tmp = dir.join(format!("core_configmaps.state.tmp-{n}"));
        std::fs::write(&tmp, &good[..n]).unwrap();
        std::fs::File::options().write(true).open(&tmp).unwrap().set_modified(long_ago).unwrap();
    }
    let p = proxy(&args(&sim, &dir, &["configmaps"])).await;
    assert_eq!(metric(&client, &p, "watchcache_state_loads_total{result=\"restored\"}").await, 1);
    let list = get(&client, &p, &format!("{CM}?resourceVersion=0")).await;
    assert_eq!(list["metadata"]["resourceVersion"], json!(rvs.last().unwrap().to_string()));
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 1, "temporary files removed: {left:?}");
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_state_is_written_every_sync_period_and_secrets_only_when_named() {
    let (sim, dir) = (sim().await, temp_dir("period"));
    let _ = sim.sim.create("secrets", "w", json!({"metadata":{"name":"s"},"data":{"k":"c2VjcmV0"}}));
    let mut a = args(&sim, &dir, &["configmaps", "secrets"]);
    a.state_sync_period = Duration::from_millis(200);
    a.state_resources = vec!["configmaps".into(), "secrets".into()];
    let p = proxy(&a).await;
    let rv = cm(&sim, "periodic", "1");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let saved = std::fs::read(state_file(&dir)).ok().and_then(|b| state::decode(&b).ok());
        // (configmaps and secrets are written one after the other in a round)
        if saved.is_some_and(|s| s.rv.0 >= rv) && dir.join("core_secrets.state").exists() {
            break;
        }
        assert!(Instant::now() < deadline, "the periodic save did not write RV {rv}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secrets = state::decode(&std::fs::read(dir.join("core_secrets.state")).unwrap()).unwrap();
    assert_eq!(secrets.objects.len(), 1, "named in --state-resources: written");
    p.shutdown().await;
    // Excluded again: the next start removes it unread.
    let p = proxy(&args(&sim, &dir, &["configmaps", "secrets"])).await;
    assert!(!dir.join("core_secrets.state").exists());
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's "Time to ready" figures: 100 000 pods (override with `KWC_WARM_PODS`), time
/// from `app::start` to ready cold (upstream LIST) and warm (`--state-dir`), and the file's
/// size. `cargo test --test reliability -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: ~1 min in a debug build"]
async fn time_to_ready_cold_and_warm() {
    let pods: usize = std::env::var("KWC_WARM_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let seeded = Instant::now();
    // The sim seeds half configmaps, half pods.
    let sim = Sim::start(SimOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        objects: 2 * pods,
        ..Default::default()
    })
    .await
    .expect("sim starts");
    println!("seeded {} objects in {:?}", 2 * pods, seeded.elapsed());
    let dir = temp_dir("measure");
    let mut a = args(&sim, &dir, &["pods"]);
    a.state_sync_period = Duration::ZERO;
    let mut line = String::new();
    for round in ["cold", "warm", "warm"] {
        let t = Instant::now();
        let p = app::start(&a).await.expect("starts");
        assert!(p.wait_ready(Duration::from_secs(600)).await);
        let ready = t.elapsed();
        assert_eq!(p.readers()[0].len(), pods);
        let t = Instant::now();
        p.shutdown().await;
        let saved = t.elapsed();
        let bytes = std::fs::metadata(dir.join("core_pods.state")).map(|m| m.len()).unwrap_or(0);
        line += &format!("{round}: ready in {ready:?}; shutdown with save {saved:?}, file {bytes} bytes\n");
    }
    println!("{pods} pods\n{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_cluster_whose_identity_cannot_be_read_gets_no_saved_state() {
    let (sim, dir) = (sim().await, temp_dir("identity"));
    saved_run(&sim, &dir, 3).await;
    // No kube-system namespace to read the cluster's UID from: nothing saved can be checked.
    sim.sim.delete("namespaces", "", "kube-system").expect("delete kube-system");
    refused(&sim, &dir, "identity_unknown").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn most_recent_reads_after_a_warm_start_see_what_changed_while_the_proxy_was_away() {
    let (sim, dir, client) = (sim().await, temp_dir("recent"), client());
    saved_run(&sim, &dir, 3).await;
    // While the proxy is away (nothing compacted): the resumed watch will bring it.
    let away = cm(&sim, "away", "1");
    let lists = full_lists(&sim);
    let b = proxy(&args(&sim, &dir, &["configmaps"])).await;
    // At once, before the cache may have caught up: a Most Recent LIST is the truth (forwarded
    // or proven by the upstream probe, never the restored state alone).
    let list = get(&client, &b, CM).await;
    assert_eq!(items(&list), truth(&client, &sim).await);
    assert!(items(&list).iter().any(|(n, rv)| n == "away" && *rv == away));
    b.readers()[0].wait_for(Rv(away), Duration::from_secs(5)).await.expect("caught up by the resumed watch");
    assert_eq!(full_lists(&sim), lists, "no relist: the saved RV was still in the upstream's window");
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A state whose resource is not served at start is dropped (`not_cached`): when discovery
/// finds the resource later, its cache lists rather than restoring a state from before the
/// downtime, however long that was.
#[tokio::test]
async fn a_state_of_a_resource_not_served_at_start_is_dropped_not_restored_later() {
    let (sim, dir, client) = (sim().await, temp_dir("later"), client());
    saved_run(&sim, &dir, 4).await;
    assert!(state_file(&dir).exists());
    sim.sim.set_served("configmaps", false).unwrap();
    let lists = full_lists(&sim);
    let b = proxy(&args(&sim, &dir, &["configmaps", "secrets"])).await;
    assert_eq!(metric(&client, &b, "watchcache_state_loads_total{result=\"not_cached\"}").await, 1);
    assert!(!state_file(&dir).exists(), "its file goes too: the next start would restore it");
    sim.sim.set_served("configmaps", true).unwrap();
    let changed = cm(&sim, "c1", "after");
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        if let Some(r) = b.readers().into_iter().find(|r| r.kind().resource == "configmaps") {
            break r;
        }
        assert!(Instant::now() < deadline, "configmaps discovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    r.wait_for(Rv(changed), Duration::from_secs(10)).await.expect("synced");
    assert_eq!(metric(&client, &b, "watchcache_state_loads_total{result=\"restored\"}").await, 0);
    assert_eq!(full_lists(&sim), lists + 1, "listed, not restored");
    assert_eq!(
        items(&get(&client, &b, &format!("{CM}?resourceVersion=0")).await),
        truth(&client, &sim).await
    );
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
