//! Tests for the cache: writer/reader semantics, replay windows, fan-out, selectors on
//! watches, relist diffs, bookmarks (paused time).

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::*;
use crate::selector::{FieldSelector, LabelSelector};

fn cms() -> ResourceKind {
    ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true)
}

fn obj(w: &Writer, ns: &str, name: &str, rv: u64, app: &str) -> Object {
    let json = format!(
        r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"{rv}","labels":{{"app":"{app}"}}}},"data":{{"k":"{rv}"}}}}"#
    );
    w.parse(Bytes::from(json)).unwrap()
}

fn setup() -> (Writer, Reader) {
    let (mut w, r) = new(cms(), CacheOptions { watcher_queue: 64, ..Default::default() });
    let items = vec![obj(&w, "a", "x", 5, "a"), obj(&w, "a-b", "y", 6, "a"), obj(&w, "b", "z", 7, "b")];
    w.replace(items, Rv(10));
    (w, r)
}

fn req(filter: Filter, start: WatchStart, bookmarks: bool) -> WatchRequest {
    WatchRequest { filter, start, bookmarks, deadline: Instant::now() + Duration::from_secs(30) }
}

fn parse_frame(f: &Bytes) -> (String, String, String) {
    let v: serde_json::Value = serde_json::from_slice(f).unwrap();
    (
        v["type"].as_str().unwrap().to_owned(),
        v["object"]["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        v["object"]["metadata"]["resourceVersion"].as_str().unwrap_or("").to_owned(),
    )
}

async fn take(w: &mut Watch, n: usize) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for _ in 0..n {
        match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
            Ok(Some(f)) => out.push(parse_frame(&f)),
            _ => break,
        }
    }
    out
}

#[tokio::test]
async fn lists_in_key_order_without_type_meta() {
    let (_w, r) = setup();
    let snap = r.snapshot();
    let body = r.list(&snap, &Filter::default(), None).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_vec()).unwrap();
    assert_eq!(v["kind"], "ConfigMapList");
    assert_eq!(v["metadata"]["resourceVersion"], "10");
    let names: Vec<_> =
        v["items"].as_array().unwrap().iter().map(|i| i["metadata"]["namespace"].clone()).collect();
    assert_eq!(names, vec!["a-b", "a", "b"], "byte order of namespace/name");
    assert!(v["items"][0].get("kind").is_none());
}

#[tokio::test]
async fn pages_carry_tokens_and_remaining_counts() {
    let (_w, r) = setup();
    let snap = r.snapshot();
    let page = Page { limit: 2, start: None, token_rv: 10 };
    let body = r.list(&snap, &Filter::default(), Some(page)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_vec()).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 2);
    assert_eq!(v["metadata"]["remainingItemCount"], 1);
    let tok = crate::params::ContinueToken::decode(v["metadata"]["continue"].as_str().unwrap()).unwrap();
    assert_eq!(tok.rv, 10);
    assert_eq!(tok.start, "a/x\u{0}");
    let body = r
        .list(&snap, &Filter::default(), Some(Page { limit: 2, start: Some(tok.start), token_rv: 10 }))
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_vec()).unwrap();
    assert_eq!(v["items"][0]["metadata"]["name"], "z");
    assert!(v["metadata"].get("continue").is_none());
    assert!(v["metadata"].get("remainingItemCount").is_none());
}

#[tokio::test]
async fn namespace_scope_uses_relative_keys() {
    let (_w, r) = setup();
    let f = Filter::new(Some("a".into()), None, LabelSelector::default(), FieldSelector::default());
    let body = r.list(&r.snapshot(), &f, None).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_vec()).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 1, "a-b/y is not in namespace a");
    assert_eq!(v["items"][0]["metadata"]["name"], "x");
}

#[tokio::test]
async fn watch_replays_history_then_live_in_order() {
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 11, "a")).unwrap();
    w.apply(EventType::Added, obj(&w, "a", "n", 12, "a")).unwrap();
    let mut watch = r.watch(req(Filter::default(), WatchStart::After(Rv(11)), false)).unwrap();
    w.apply(EventType::Deleted, obj(&w, "a", "n", 13, "a")).unwrap();
    let got = take(&mut watch, 2).await;
    assert_eq!(
        got,
        vec![("ADDED".into(), "n".into(), "12".into()), ("DELETED".into(), "n".into(), "13".into())]
    );
}

#[tokio::test]
async fn too_old_watch_is_refused_with_the_floor() {
    let (_w, r) = setup();
    let e = r.watch(req(Filter::default(), WatchStart::After(Rv(9)), false)).err().unwrap();
    assert_eq!(e.to_string(), "too old resource version: 9 (10)");
    assert!(r.watch(req(Filter::default(), WatchStart::After(Rv(10)), false)).is_ok());
}

#[tokio::test]
async fn stale_events_are_refused() {
    let (mut w, _r) = setup();
    assert!(w.apply(EventType::Modified, obj(&w, "a", "x", 10, "a")).is_err());
}

#[tokio::test]
async fn initial_events_then_end_bookmark_then_live() {
    let (mut w, r) = setup();
    let mut watch = r.watch(req(Filter::default(), WatchStart::InitialEvents, true)).unwrap();
    w.apply(EventType::Modified, obj(&w, "b", "z", 11, "b")).unwrap();
    let got = take(&mut watch, 5).await;
    let types: Vec<_> = got.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(types, vec!["ADDED", "ADDED", "ADDED", "BOOKMARK", "MODIFIED"]);
    assert_eq!(got[3].2, "10");
}

/// A legacy watch from RV 0 or unset (a `/watch/` path: not defaulted to a watch-list) gets the
/// same state, with bookmarks allowed, but no initial-events-end bookmark (the cacher's).
#[tokio::test]
async fn a_legacy_watch_of_the_state_has_no_end_bookmark() {
    let (mut w, r) = setup();
    let mut watch = r.watch(req(Filter::default(), WatchStart::State, true)).unwrap();
    w.apply(EventType::Modified, obj(&w, "b", "z", 11, "b")).unwrap();
    let got = take(&mut watch, 4).await;
    let types: Vec<_> = got.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(types, vec!["ADDED", "ADDED", "ADDED", "MODIFIED"]);
}

#[tokio::test]
async fn end_bookmark_is_annotated() {
    let (_w, r) = setup();
    let mut watch = r.watch(req(Filter::default(), WatchStart::InitialEvents, true)).unwrap();
    for _ in 0..3 {
        watch.next().await.unwrap();
    }
    let f = watch.next().await.unwrap();
    assert_eq!(
        std::str::from_utf8(&f).unwrap(),
        "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"10\",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}\n"
    );
}

#[tokio::test]
async fn label_selector_turns_modified_into_added_and_deleted() {
    let (mut w, r) = setup();
    let f = Filter::new(None, None, LabelSelector::parse("app=a").unwrap(), FieldSelector::default());
    let mut watch = r.watch(req(f, WatchStart::After(Rv(10)), false)).unwrap();
    w.apply(EventType::Modified, obj(&w, "a", "x", 11, "b")).unwrap(); // leaves
    w.apply(EventType::Modified, obj(&w, "b", "z", 12, "b")).unwrap(); // never selected
    w.apply(EventType::Modified, obj(&w, "a", "x", 13, "a")).unwrap(); // enters
    let got = take(&mut watch, 2).await;
    assert_eq!(
        got,
        vec![("DELETED".into(), "x".into(), "11".into()), ("ADDED".into(), "x".into(), "13".into())]
    );
}

/// The type is 1.36's `convertToWatchEvent`'s, from the store's previous object, for every
/// watcher: an upstream ADDED of an object the cache holds is a MODIFIED, a MODIFIED of one it
/// does not hold an ADDED, a DELETED of one it does not hold nothing (each only after the cache
/// missed something). Before, the unfiltered watcher got the upstream's types as received and
/// a filtered one a MODIFIED as an ADDED but the others as received (found by a review).
#[tokio::test]
async fn event_types_follow_the_stores_previous_object_as_the_apiserver_does() {
    let (mut w, r) = setup();
    let mut all = r.watch(req(Filter::default(), WatchStart::After(Rv(10)), false)).unwrap();
    let mut selected = r.watch(req(label("a"), WatchStart::After(Rv(10)), false)).unwrap();
    w.apply(EventType::Added, obj(&w, "a", "x", 11, "a")).unwrap(); // held: MODIFIED
    w.apply(EventType::Modified, obj(&w, "a", "new", 12, "a")).unwrap(); // not held: ADDED
    w.apply(EventType::Deleted, obj(&w, "a", "gone", 13, "a")).unwrap(); // not held: nothing
    w.apply(EventType::Deleted, obj(&w, "a", "new", 14, "a")).unwrap(); // held: DELETED
    let want: Vec<(String, String, String)> = vec![
        ("MODIFIED".into(), "x".into(), "11".into()),
        ("ADDED".into(), "new".into(), "12".into()),
        ("DELETED".into(), "new".into(), "14".into()),
    ];
    assert_eq!(take(&mut all, 3).await, want);
    assert_eq!(take(&mut selected, 3).await, want);
    // Nothing else was sent (the DELETED at 13): a bookmark-free watch has nothing pending.
    w.apply(EventType::Modified, obj(&w, "a", "x", 15, "a")).unwrap();
    assert_eq!(take(&mut all, 1).await, vec![("MODIFIED".into(), "x".into(), "15".into())]);
}

/// A restored state's staleness counts from when it was saved (its file's age) until the
/// upstream proves it current, not from the process's start (found by a review: a state saved
/// hours before, whose resumed watch failed, was served as fresh for `--max-staleness`).
#[tokio::test(start_paused = true)]
async fn a_restored_states_staleness_counts_from_its_save() {
    let (mut w, r) = new(cms(), CacheOptions::default());
    w.restore(Vec::new(), Rv(7), Vec::new(), Rv(7)).unwrap();
    w.restored_age(Duration::from_secs(3600));
    assert!(!r.proven_here());
    tokio::time::advance(Duration::from_secs(5)).await;
    let s = r.staleness().unwrap();
    assert!(s >= Duration::from_secs(3605) && s < Duration::from_secs(3606), "{s:?}");
    // The resumed watch accepted from its RV is no proof of a restored state (an apiserver
    // accepts a watch from a compacted RV, then sends its 410 as an event).
    w.proven();
    assert!(!r.proven_here());
    assert!(r.staleness().unwrap() >= Duration::from_secs(3600));
    // Its first bookmark is (as is a watch accepted and quiet for a second after, which the
    // reflector reports with `confirmed`): its age no longer counts.
    w.bookmark(Rv(8));
    assert!(r.proven_here());
    assert!(r.staleness().unwrap() < Duration::from_secs(1));
}

#[tokio::test]
async fn slow_watcher_is_closed_and_others_continue() {
    let (mut w, r) = setup();
    let mut slow = r.watch(req(Filter::default(), WatchStart::After(Rv(10)), false)).unwrap();
    let mut fast = r.watch(req(Filter::default(), WatchStart::After(Rv(10)), false)).unwrap();
    let mut got_fast = 0;
    for i in 0..200u64 {
        w.apply(EventType::Modified, obj(&w, "a", "x", 11 + i, "a")).unwrap();
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(1), fast.next()).await {
            got_fast += 1;
        }
    }
    assert_eq!(got_fast, 200);
    assert_eq!(r.watcher_stats().terminated, 1, "the slow watcher was terminated");
    let mut n = 0;
    while let Some(_f) = slow.next().await {
        n += 1;
    }
    assert_eq!(n, 64, "the slow watcher gets what was queued, then its stream ends");
}

/// Drains a watch until its stream ends (bounded).
async fn drain(w: &mut Watch) -> Option<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
            Ok(Some(f)) => out.push(parse_frame(&f)),
            Ok(None) => return Some(out),
            Err(_) => return None,
        }
    }
}

fn label(app: &str) -> Filter {
    Filter::new(None, None, LabelSelector::parse(&format!("app={app}")).unwrap(), FieldSelector::default())
}

/// Issue 31: a relist to a list RV past the cache ends every watch that started before it,
/// those with an empty difference too (an object created and deleted in the gap leaves no
/// difference), with no difference and no BOOKMARK, in every representation.
#[tokio::test]
async fn relist_past_the_cache_ends_every_watch_and_sends_nothing() {
    let (mut w, r) = setup();
    let ns = |n: &str| Filter::new(Some(n.into()), None, Default::default(), Default::default());
    let mut all = r.watch(req(Filter::default(), WatchStart::After(Rv(10)), false)).unwrap();
    let mut ns_a = r.watch(req(ns("a"), WatchStart::After(Rv(10)), true)).unwrap();
    // Nothing of app=b nor of namespace b differs: before issue 31 these stayed open (app=b
    // with a BOOKMARK at 20), though ghost g (app=b, namespace b) lived in (10, 20).
    let mut app_b = r.watch(req(label("b"), WatchStart::After(Rv(10)), true)).unwrap();
    let mut ns_b = r.watch(req(ns("b"), WatchStart::After(Rv(10)), false)).unwrap();
    let meta = Filter { repr: crate::metadata_only::Repr::Metadata, ..ns("b") };
    let mut meta_b = r.watch(req(meta, WatchStart::After(Rv(10)), true)).unwrap();
    // Upstream state at 20: x changed at 15, y deleted, q added at 18, z unchanged.
    let items = vec![obj(&w, "a", "x", 15, "a"), obj(&w, "b", "z", 7, "b"), obj(&w, "c", "q", 18, "a")];
    w.replace(items, Rv(20));
    for (who, watch) in [
        ("all", &mut all),
        ("ns a", &mut ns_a),
        ("app=b", &mut app_b),
        ("ns b", &mut ns_b),
        ("metadata", &mut meta_b),
    ] {
        assert_eq!(drain(watch).await, Some(vec![]), "{who}: ended, nothing sent");
    }
    assert_eq!(r.watcher_stats().live, 0);
    assert_eq!(r.watcher_stats().ended_at_relist, 5);
    assert_eq!(r.window(), (Rv(20), Rv(20)));
    // A re-watch from any RV the ended clients may hold, up to the list RV excluded, is 410.
    for rv in [10, 15, 19] {
        let e = r.watch(req(Filter::default(), WatchStart::After(Rv(rv)), false)).err().unwrap();
        assert_eq!(e.to_string(), format!("too old resource version: {rv} (20)"));
    }
    // The state inside the gap is not served: Exact reads there go upstream.
    assert!(r.snapshot_at(Rv(15)).is_none());
    // A watch from the list RV gets the events after it.
    let mut again = r.watch(req(label("b"), WatchStart::After(Rv(20)), true)).unwrap();
    w.apply(EventType::Modified, obj(&w, "b", "z", 21, "b")).unwrap();
    assert_eq!(take(&mut again, 1).await, vec![("MODIFIED".into(), "z".into(), "21".into())]);
}

/// The one case a relist may keep a watch: the cache had already applied every upstream event
/// up to the list RV (list RV == cache RV) and nothing the watch selects differs. A watch a
/// difference concerns still ends.
#[tokio::test]
async fn relist_at_the_cache_rv_keeps_the_watches_no_difference_concerns() {
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "a")).unwrap();
    let mut app_b = r.watch(req(label("b"), WatchStart::After(Rv(10)), true)).unwrap();
    let mut all = r.watch(req(Filter::default(), WatchStart::After(Rv(12)), false)).unwrap();
    // A list at 12 that disagrees about y (an inconsistent upstream): only watches of y end.
    let items = vec![obj(&w, "a", "x", 12, "a"), obj(&w, "b", "z", 7, "b")];
    w.replace(items, Rv(12));
    assert_eq!(drain(&mut all).await, Some(vec![]));
    assert_eq!(r.watcher_stats().live, 1);
    // The client of the ended watch resumes from 12, where the cache showed it y: refused (the
    // history starts after 12), so it relists rather than keep y for ever; not ready until
    // the upstream moves past 12.
    let e = r.watch(req(Filter::default(), WatchStart::After(Rv(12)), false)).err().unwrap();
    assert_eq!(e.to_string(), "too old resource version: 12 (12)");
    assert!(!r.progress().ready);
    w.apply(EventType::Modified, obj(&w, "b", "z", 13, "b")).unwrap();
    assert_eq!(take(&mut app_b, 1).await, vec![("MODIFIED".into(), "z".into(), "13".into())], "no BOOKMARK");
    assert!(r.progress().ready);
}

/// The same relist with no watch open (nobody to end): the RV the wrong state was served at
/// is still refused, and the cache is not ready until the upstream moves past it — a client
/// that listed y at 12 must not resume from 12 and keep it.
#[tokio::test]
async fn a_relist_at_the_cache_rv_that_differs_distrusts_that_rv() {
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "a")).unwrap();
    w.replace(vec![obj(&w, "a", "x", 12, "a"), obj(&w, "b", "z", 7, "b")], Rv(12));
    assert!(!r.progress().ready);
    let e = r.watch(req(Filter::default(), WatchStart::After(Rv(12)), false)).err().unwrap();
    assert_eq!(e.to_string(), "too old resource version: 12 (12)");
    assert!(r.snapshot_at(Rv(12)).is_none());
    w.bookmark(Rv(13));
    assert!(r.progress().ready);
    // The same list again changes nothing: no difference, the cache's RV trusted.
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "a")).unwrap();
    let same: Vec<Object> = r.snapshot().store.values().map(|o| (**o).clone()).collect();
    w.replace(same, Rv(12));
    assert!(r.progress().ready);
    assert!(r.watch(req(Filter::default(), WatchStart::After(Rv(12)), false)).is_ok());
}

/// A state proven the upstream's at 13 while the cache was at 10, whose watch registers only
/// after a relist landed below 13 (the upstream's storage went back): its snapshot and 13 are
/// of the gone history, so the watch starts from the cache's own state and RV (the events the
/// upstream issues again up to 13 reach it).
#[tokio::test]
async fn a_proven_start_after_a_relist_is_the_caches_own_state() {
    let (mut w, r) = setup();
    let store = super::store::filled(vec![obj(&w, "a", "x", 5, "a"), obj(&w, "c", "gone", 12, "a")]);
    let snapshot = Snapshot { store, rv: Rv(10), lists: r.lists(), histories: 0 };
    w.replace(vec![obj(&w, "a", "x", 5, "a"), obj(&w, "a", "y", 9, "a")], Rv(9));
    let mut wl = r.watch(req(label("a"), WatchStart::Proven { rv: Rv(13), snapshot }, true)).unwrap();
    w.apply(EventType::Added, obj(&w, "a", "z", 11, "a")).unwrap();
    let got = take(&mut wl, 4).await;
    let names: Vec<(&str, &str)> = got.iter().map(|e| (e.0.as_str(), e.1.as_str())).collect();
    assert_eq!(names, [("ADDED", "x"), ("ADDED", "y"), ("BOOKMARK", ""), ("ADDED", "z")], "{got:?}");
    assert_eq!(got[2].2, "9", "the end bookmark at the cache's RV");
}

/// A relist in the same history (a 410, its list at 11) landing between the proof at 13 and
/// the watch's start changes nothing: the snapshot is still the state at 13 (a review: taking
/// the cache's state at 11 would have told the client it had synced below what was proven).
#[tokio::test]
async fn a_proven_start_after_a_relist_ahead_keeps_its_proven_state() {
    let (mut w, r) = setup();
    let snap = r.snapshot();
    w.replace(vec![obj(&w, "a", "x", 5, "a"), obj(&w, "a", "n", 11, "a")], Rv(11));
    let mut wl = r.watch(req(label("a"), WatchStart::Proven { rv: Rv(13), snapshot: snap }, true)).unwrap();
    let got = take(&mut wl, 3).await;
    let names: Vec<(&str, &str, &str)> =
        got.iter().map(|e| (e.0.as_str(), e.1.as_str(), e.2.as_str())).collect();
    assert_eq!(names, [("ADDED", "y", "6"), ("ADDED", "x", "5"), ("BOOKMARK", "", "13")], "{got:?}");
}

#[tokio::test]
async fn relist_ends_watchers_that_started_ahead_of_the_cache() {
    let (mut w, r) = setup();
    // While the cache is at 10, the upstream has moved on: z deleted at 11, x2 and y2 created
    // at 12 and 13. A watch-list whose initial state was proven the upstream's at 13, and a
    // watch from a write's RV (13): neither stream ever held the cache's state at 10.
    let store = super::store::filled(vec![obj(&w, "a", "x", 5, "b"), obj(&w, "c", "x2", 12, "a")]);
    let snapshot = Snapshot { store, rv: Rv(10), lists: r.lists(), histories: 0 };
    let mut wl = r.watch(req(label("a"), WatchStart::Proven { rv: Rv(13), snapshot }, true)).unwrap();
    let mut from_write = r.watch(req(label("b"), WatchStart::After(Rv(13)), false)).unwrap();
    // A watch from beyond the list RV keeps waiting.
    let mut future = r.watch(req(Filter::default(), WatchStart::After(Rv(30)), false)).unwrap();
    // Then x2 deleted at 14, y2 modified at 15, and the relist at 16.
    let items = vec![obj(&w, "a", "x", 5, "a"), obj(&w, "a-b", "y", 6, "a"), obj(&w, "c", "y2", 15, "b")];
    w.replace(items, Rv(16));
    let got = drain(&mut wl).await.expect("the watch-list ends");
    assert_eq!(got.last().map(|e| (e.0.as_str(), e.2.as_str())), Some(("BOOKMARK", "13")));
    assert!(got.iter().all(|e| e.0 == "ADDED" || e.0 == "BOOKMARK"), "no difference sent: {got:?}");
    assert_eq!(drain(&mut from_write).await, Some(vec![]));
    assert_eq!(r.watcher_stats().live, 1, "only the watch from 30 stays");
    assert_eq!(r.watcher_stats().ended_at_relist, 2);
    w.apply(EventType::Modified, obj(&w, "a", "x", 31, "a")).unwrap();
    assert_eq!(take(&mut future, 1).await, vec![("MODIFIED".into(), "x".into(), "31".into())]);
}

/// The upstream's storage went back (etcd restored from a backup taken at 8, without
/// `--bump-revision`): its consistent list is at 8, below the cache's 12. The cache takes 8,
/// as the apiserver's watch cache does; every watch ends, one no difference concerns and one
/// from a future RV too (their RVs name other states now); and the upstream's next changes,
/// at RVs the old history used as well, are applied — kept at 12, the cache would drop every
/// one up to 12 as stale while claiming to be current.
#[tokio::test]
async fn a_relist_below_the_cache_rv_takes_the_list_rv_and_ends_every_watch() {
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "a")).unwrap();
    let mut all = r.watch(req(Filter::default(), WatchStart::After(Rv(12)), true)).unwrap();
    let mut app_b = r.watch(req(label("b"), WatchStart::After(Rv(12)), false)).unwrap();
    let mut future = r.watch(req(Filter::default(), WatchStart::After(Rv(30)), false)).unwrap();
    // A probe saw the upstream at 14 before its storage went back.
    r.upstream_at(Rv(14));
    // The restored state: z (app=b) as it was, x back at 5.
    let items = vec![obj(&w, "a", "x", 5, "a"), obj(&w, "a-b", "y", 6, "a"), obj(&w, "b", "z", 7, "b")];
    w.replace(items, Rv(8));
    for (who, watch) in [("all", &mut all), ("app=b", &mut app_b), ("from 30", &mut future)] {
        assert_eq!(drain(watch).await, Some(vec![]), "{who}: ended, nothing sent");
    }
    assert_eq!(r.watcher_stats().live, 0);
    let p = r.progress();
    assert!(p.ready && p.rv == Rv(8), "served at the list's RV: {p:?}");
    assert_eq!(r.window(), (Rv(8), Rv(8)));
    let e = r.watch(req(Filter::default(), WatchStart::After(Rv(7)), false)).err().unwrap();
    assert_eq!(e.to_string(), "too old resource version: 7 (8)");
    // A client of the gone history may resume from up to 14, the newest RV the upstream was
    // seen at before (a probe): those are checked against the upstream (`server::serve`), whose
    // 410 names the new floor; beyond, a watch that waits as any watch from a future RV.
    assert!([9, 12, 14].iter().all(|rv| r.gone_ahead(Rv(*rv))));
    assert!(![8, 15].iter().any(|rv| r.gone_ahead(Rv(*rv))));
    assert_eq!(r.gone(Rv(12)).to_string(), "too old resource version: 12 (8)");
    let mut waits = r.watch(req(Filter::default(), WatchStart::After(Rv(15)), false)).unwrap();
    // The upstream's next changes, at 9 and 10.
    let mut again = r.watch(req(Filter::default(), WatchStart::After(Rv(8)), false)).unwrap();
    w.apply(EventType::Added, obj(&w, "c", "q", 9, "a")).unwrap();
    w.apply(EventType::Modified, obj(&w, "a", "x", 10, "a")).unwrap();
    assert_eq!(
        take(&mut again, 2).await,
        vec![("ADDED".into(), "q".into(), "9".into()), ("MODIFIED".into(), "x".into(), "10".into())]
    );
    let snap = r.snapshot();
    assert_eq!(snap.rv, Rv(10));
    let names: Vec<_> = snap.store.values().map(|o| (o.header.name().to_owned(), o.header.rv.0)).collect();
    assert_eq!(names, [("y".to_owned(), 6), ("x".to_owned(), 10), ("z".to_owned(), 7), ("q".to_owned(), 9)]);
    // Reached by the cache in the new history: an RV like any other.
    w.apply(EventType::Modified, obj(&w, "a", "x", 11, "a")).unwrap();
    assert!(!r.gone_ahead(Rv(11)) && r.gone_ahead(Rv(12)));
    let mut from_11 = r.watch(req(Filter::default(), WatchStart::After(Rv(11)), false)).unwrap();
    w.apply(EventType::Modified, obj(&w, "a", "x", 16, "a")).unwrap();
    assert_eq!(take(&mut from_11, 1).await, vec![("MODIFIED".into(), "x".into(), "16".into())]);
    assert_eq!(take(&mut waits, 1).await, vec![("MODIFIED".into(), "x".into(), "16".into())]);
    assert!(!r.gone_ahead(Rv(14)));
}

/// Two reads found the upstream behind at once (a Most Recent LIST's probe and its metadata
/// proof, both before the relist landed): the second request, for the gone RV, must not make a
/// second relist distrust every RV up to it — the cache would stay unready until the upstream
/// passed the old RV (seen against kube-apiserver 1.28.7). Nor is one made afterwards kept.
#[tokio::test(start_paused = true)]
async fn a_relist_request_for_a_gone_rv_is_dropped() {
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "a")).unwrap();
    r.request_relist(Rv(12), r.lists(), "behind".into());
    let (at, _) = w.relist_requested().await;
    w.set_not_ready(Some("behind".into()));
    w.distrust_through(at);
    r.request_relist(Rv(12), r.lists(), "behind, again".into());
    w.replace(vec![obj(&w, "a", "x", 5, "a")], Rv(8));
    assert!(r.progress().ready);
    r.request_relist(Rv(12), r.lists(), "behind, late".into());
    assert!(r.progress().ready, "a request for an RV above the cache's is dropped");
    let pending = tokio::time::timeout(Duration::from_secs(60), w.relist_requested()).await;
    assert!(pending.is_err(), "no relist for the gone RV: {pending:?}");
    assert!(r.relist_reason().is_none());
    // Distrusting a gone RV is a no-op too.
    w.distrust_through(Rv(12));
    w.apply(EventType::Modified, obj(&w, "a", "x", 9, "a")).unwrap();
    assert!(r.watch(req(Filter::default(), WatchStart::After(Rv(8)), false)).is_ok());
    // A request at or below the cache's RV still stands.
    r.request_relist(Rv(9), r.lists(), "inconsistent".into());
    assert_eq!(w.relist_requested().await.0, Rv(9));
}

/// A finding made before a full list landed is of a state that is gone: the consistency check
/// read the cache at 11, a relist (a 410) landed at 20 meanwhile, then the check reported the
/// old state inconsistent. Acted on, it would distrust every RV up to 20 — every watch started
/// from the new list ending, every client relisting again — for nothing.
#[tokio::test(start_paused = true)]
async fn a_relist_request_made_before_a_relist_landed_is_dropped() {
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 11, "a")).unwrap();
    let found_at = r.lists();
    w.replace(vec![obj(&w, "a", "x", 15, "a")], Rv(20));
    let mut request = req(Filter::default(), WatchStart::After(Rv(20)), false);
    request.deadline = Instant::now() + Duration::from_secs(300); // past the 60 s waited below
    let mut from_20 = r.watch(request).unwrap();
    // Reported after the relist: dropped at once, the cache stays ready.
    r.request_relist(Rv(11), found_at, "inconsistent at 11".into());
    assert!(r.progress().ready && r.relist_reason().is_none());
    // Reported before it, taken by the reflector after: dropped then.
    let found_at = r.lists();
    r.request_relist(Rv(20), found_at, "inconsistent at 20".into());
    assert!(!r.progress().ready);
    w.replace(vec![obj(&w, "a", "x", 15, "a")], Rv(20));
    let pending = tokio::time::timeout(Duration::from_secs(60), w.relist_requested()).await;
    assert!(pending.is_err(), "no relist for a state that is gone: {pending:?}");
    assert!(r.progress().ready);
    w.apply(EventType::Modified, obj(&w, "a", "x", 21, "a")).unwrap();
    assert_eq!(take(&mut from_20, 1).await, vec![("MODIFIED".into(), "x".into(), "21".into())]);
    // One made after the last list stands, and events applied before the reflector takes it
    // do not make the cache (known wrong) ready again.
    r.request_relist(Rv(21), r.lists(), "inconsistent at 21".into());
    w.apply(EventType::Modified, obj(&w, "a", "x", 22, "a")).unwrap();
    w.bookmark(Rv(23));
    assert_eq!((r.progress().ready, r.progress().rv), (false, Rv(23)));
    assert_eq!(w.relist_requested().await.0, Rv(21));
}

/// The server saw the cache ready, then (before the watch registered) the consistency check
/// found it wrong: the watch is refused, not started on the wrong state (its initial events
/// would hold the ghosts until the relist ends it). Once the relist is in, watches start again.
#[tokio::test(start_paused = true)]
async fn a_watch_is_refused_once_the_cache_is_found_wrong() {
    let (mut w, r) = setup();
    w.apply(EventType::Added, obj(&w, "a", "ghost", 11, "a")).unwrap();
    assert!(r.progress().ready);
    r.request_relist(Rv(11), r.lists(), "inconsistent".into());
    for start in [WatchStart::InitialEvents, WatchStart::After(Rv(11)), WatchStart::Now] {
        let refused = r.watch(req(Filter::default(), start.clone(), true));
        assert!(matches!(refused, Err(Error::Relisting)), "{start:?}: {:?}", refused.map(|_| ()));
    }
    let (at, _) = w.relist_requested().await;
    w.distrust_through(at);
    w.replace(vec![obj(&w, "a", "x", 12, "a")], Rv(12));
    let mut watch = r.watch(req(Filter::default(), WatchStart::InitialEvents, false)).unwrap();
    assert_eq!(take(&mut watch, 1).await, vec![("ADDED".into(), "x".into(), "12".into())]);
}

#[tokio::test(start_paused = true)]
async fn a_watcher_ended_at_a_relist_gets_no_bookmark_at_the_list_rv() {
    let (mut w, r) = setup();
    let mut request = req(Filter::default(), WatchStart::After(Rv(10)), true);
    request.deadline = Instant::now() + Duration::from_secs(300);
    let mut watch = r.watch(request).unwrap();
    w.replace(vec![obj(&w, "a", "x", 15, "a")], Rv(20));
    // Past the bookmark time before the stream is read: the queue is closed, so no bookmark.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(drain(&mut watch).await, Some(vec![]));
}

#[tokio::test]
async fn a_most_recent_watch_never_gets_410_after_a_relist() {
    let (mut w, r) = setup();
    // The probe gave 12; a relist at 20 lands before the watch registers.
    w.replace(vec![obj(&w, "a", "x", 15, "a")], Rv(20));
    let histories = r.histories();
    let start = |rv| WatchStart::MostRecent { rv: Rv(rv), histories };
    let mut watch = r.watch(req(Filter::default(), start(12), false)).unwrap();
    w.apply(EventType::Modified, obj(&w, "a", "x", 21, "a")).unwrap();
    assert_eq!(take(&mut watch, 1).await, vec![("MODIFIED".into(), "x".into(), "21".into())]);
    // Without a relist it is a watch from that RV.
    let mut watch = r.watch(req(Filter::default(), start(20), false)).unwrap();
    assert_eq!(take(&mut watch, 1).await, vec![("MODIFIED".into(), "x".into(), "21".into())]);
}

/// A Most Recent start probed in a history the cache has left since (the upstream's storage
/// went back: a list below its RV landed) starts at the cache's RV, not from the probed RV,
/// which would skip the new history's changes up to it (review).
#[tokio::test]
async fn a_most_recent_watch_probed_in_a_gone_history_starts_now() {
    let (mut w, r) = setup();
    w.replace(vec![obj(&w, "a", "x", 15, "a")], Rv(20));
    let probed = WatchStart::MostRecent { rv: Rv(30), histories: r.histories() };
    // Went back: listed at 18, below the cache's 20; the new history moves on to 22.
    w.replace(vec![obj(&w, "a", "x", 15, "a")], Rv(18));
    let mut watch = r.watch(req(Filter::default(), probed, false)).unwrap();
    w.apply(EventType::Modified, obj(&w, "a", "x", 22, "a")).unwrap();
    assert_eq!(take(&mut watch, 1).await, vec![("MODIFIED".into(), "x".into(), "22".into())]);
}

#[tokio::test]
async fn empty_indexed_selector_values_get_live_events() {
    let pods = ResourceKind::new("", "v1", "pods", "Pod", true, true);
    let (mut w, r) = new(pods.clone(), CacheOptions::default());
    w.replace(vec![], Rv(10));
    let f = Filter::new(
        None,
        None,
        LabelSelector::default(),
        FieldSelector::parse("spec.nodeName=", &pods).unwrap(),
    );
    let mut unscheduled = r.watch(req(f, WatchStart::After(Rv(10)), false)).unwrap();
    w.apply(EventType::Added, pod(&w, "p1", 11, "")).unwrap();
    w.apply(EventType::Modified, pod(&w, "p1", 12, "n1")).unwrap();
    assert_eq!(
        take(&mut unscheduled, 2).await,
        vec![("ADDED".into(), "p1".into(), "11".into()), ("DELETED".into(), "p1".into(), "12".into())]
    );
    // `metadata.namespace=` on a cluster-scoped kind selects every object.
    let crs =
        ResourceKind::new("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", false, true);
    let (mut w, r) = new(crs.clone(), CacheOptions::default());
    w.replace(vec![], Rv(10));
    let f = Filter::new(
        None,
        None,
        LabelSelector::default(),
        FieldSelector::parse("metadata.namespace=", &crs).unwrap(),
    );
    let mut watch = r.watch(req(f, WatchStart::After(Rv(10)), false)).unwrap();
    let cr = w
        .parse(Bytes::from(r#"{"kind":"ClusterRole","apiVersion":"rbac.authorization.k8s.io/v1","metadata":{"name":"c","resourceVersion":"11"}}"#))
        .unwrap();
    w.apply(EventType::Added, cr).unwrap();
    assert_eq!(take(&mut watch, 1).await, vec![("ADDED".into(), "c".into(), "11".into())]);
}

#[tokio::test]
async fn a_selective_page_has_a_continue_token_whenever_items_remain() {
    let (_w, r) = setup();
    let snap = r.snapshot();
    // Key order: a-b/y (app=a), a/x (app=a), b/z (app=b). Two app=a items, limit 2: z remains,
    // not selected, yet the page carries a token (the next page is empty), and no count.
    let body = r.list(&snap, &label("a"), Some(Page { limit: 2, start: None, token_rv: 10 })).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_vec()).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 2);
    assert!(v["metadata"].get("remainingItemCount").is_none());
    let tok = crate::params::ContinueToken::decode(v["metadata"]["continue"].as_str().unwrap()).unwrap();
    assert_eq!(tok.start, "a/x\u{0}");
    let body =
        r.list(&snap, &label("a"), Some(Page { limit: 2, start: Some(tok.start), token_rv: 10 })).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_vec()).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 0);
    assert!(v["metadata"].get("continue").is_none());
    // The last item selected at the limit: nothing remains, no token.
    let body = r.list(&snap, &label("b"), Some(Page { limit: 1, start: None, token_rv: 10 })).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_vec()).unwrap();
    assert!(v["metadata"].get("continue").is_none());
    // `metadata.name=x` in a namespace reads one key: no token though items follow it.
    let (mut w, r) = setup();
    w.apply(EventType::Added, obj(&w, "a", "y2", 11, "a")).unwrap();
    let snap = r.snapshot();
    let f = Filter::new(
        Some("a".into()),
        None,
        LabelSelector::default(),
        FieldSelector::parse("metadata.name=x", &cms()).unwrap(),
    );
    let body = r.list(&snap, &f, Some(Page { limit: 1, start: None, token_rv: 10 })).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_vec()).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert!(v["metadata"].get("continue").is_none());
}

#[tokio::test]
async fn exact_snapshots_are_rebuilt_from_history() {
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 11, "a")).unwrap();
    w.apply(EventType::Deleted, obj(&w, "b", "z", 12, "b")).unwrap();
    w.apply(EventType::Added, obj(&w, "c", "q", 13, "a")).unwrap();
    let at = r.snapshot_at(Rv(10)).unwrap();
    let rvs: Vec<u64> = at.store.values().map(|o| o.header.rv.0).collect();
    assert_eq!(rvs, vec![6, 5, 7]);
    assert!(r.snapshot_at(Rv(9)).is_none());
    assert!(r.snapshot_at(Rv(14)).is_none());
    assert_eq!(r.snapshot_at(Rv(12)).unwrap().store.len(), 2);
}

/// Issue 24: an RV the cache moved past `--history-window` ago is no longer served exactly,
/// even on a quiet resource whose newest event never leaves the history; the RV the cache is
/// at stays servable however old.
#[tokio::test(start_paused = true)]
async fn exact_reads_expire_a_window_after_the_cache_moved_past_them() {
    let (mut w, r) = setup();
    let window = r.options().history_window;
    w.apply(EventType::Modified, obj(&w, "a", "x", 11, "a")).unwrap();
    tokio::time::advance(Duration::from_secs(10)).await;
    w.bookmark(Rv(50));
    tokio::time::advance(window - Duration::from_secs(11)).await;
    // 10 was passed (by 11) window - 1 s ago, 11 (by the bookmark) 10 s later.
    assert!(r.snapshot_at(Rv(10)).is_some());
    assert!(r.snapshot_at(Rv(11)).is_some());
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(r.snapshot_at(Rv(10)).is_none(), "passed by 11 more than the window ago");
    assert!(r.snapshot_at(Rv(11)).is_some(), "passed by the bookmark less than the window ago");
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(r.snapshot_at(Rv(49)).is_none());
    // The cache is still at 50: the current state is always servable.
    tokio::time::advance(10 * window).await;
    assert_eq!(r.snapshot_at(Rv(50)).map(|s| s.rv), Some(Rv(50)));
    // A relist moves the cache too.
    w.replace(vec![obj(&w, "a", "x", 60, "a")], Rv(70));
    assert!(r.snapshot_at(Rv(50)).is_none(), "below the relist's floor");
    tokio::time::advance(window).await;
    assert!(r.snapshot_at(Rv(70)).is_some());
}

#[tokio::test(start_paused = true)]
async fn periodic_bookmarks_follow_the_cache_rv() {
    let (mut w, r) = setup();
    let mut request = req(Filter::default(), WatchStart::After(Rv(10)), true);
    request.deadline = Instant::now() + Duration::from_secs(70);
    let mut watch = r.watch(request).unwrap();
    w.bookmark(Rv(15));
    let start = Instant::now();
    let f = watch.next().await.unwrap();
    assert_eq!(parse_frame(&f).0, "BOOKMARK");
    assert_eq!(parse_frame(&f).2, "15");
    assert_eq!(start.elapsed().as_secs(), 60);
    w.bookmark(Rv(16));
    let f = watch.next().await.unwrap();
    assert_eq!(parse_frame(&f).2, "16");
    assert_eq!(start.elapsed().as_secs(), 68, "one bookmark 2 s before the deadline");
    assert!(watch.next().await.is_none());
    assert_eq!(start.elapsed().as_secs(), 70);
}

/// A watch ends at its deadline even when events are waiting for it: a client reading as fast
/// as they come kept its queue from ever being empty, and the deadline was looked at only then
/// (a review: a watch outlived its `timeoutSeconds`, which bounds what its authorization allowed).
#[tokio::test(start_paused = true)]
async fn a_busy_watch_ends_at_its_deadline() {
    let (mut w, r) = setup();
    let mut request = req(Filter::default(), WatchStart::After(Rv(10)), false);
    request.deadline = Instant::now() + Duration::from_secs(5);
    let mut watch = r.watch(request).unwrap();
    w.apply(EventType::Modified, obj(&w, "a", "x", 11, "a")).unwrap();
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "b")).unwrap();
    assert_eq!(parse_frame(&watch.next().await.unwrap()).2, "11");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(watch.next().await.is_none(), "the event at 12 waits, the deadline has passed");
}

/// Periodic bookmarks carry news only; the one 2 s before the deadline goes out even when
/// nothing happened (at the start RV), as the apiserver's does, so the client re-watches from
/// a fresh RV.
#[tokio::test(start_paused = true)]
async fn a_quiet_watch_gets_only_the_bookmark_before_its_deadline() {
    let (_w, r) = setup();
    let mut request = req(Filter::default(), WatchStart::After(Rv(10)), true);
    request.deadline = Instant::now() + Duration::from_secs(70);
    let start = Instant::now();
    let mut watch = r.watch(request).unwrap();
    let f = watch.next().await.unwrap();
    assert_eq!(parse_frame(&f), ("BOOKMARK".into(), "".into(), "10".into()));
    assert_eq!(start.elapsed().as_secs(), 68, "none at 60 s: the cache did not move");
    assert!(watch.next().await.is_none());
    assert_eq!(start.elapsed().as_secs(), 70);
    // Without `allowWatchBookmarks`, none at all.
    let mut request = req(Filter::default(), WatchStart::After(Rv(10)), false);
    request.deadline = Instant::now() + Duration::from_secs(70);
    let mut watch = r.watch(request).unwrap();
    assert!(watch.next().await.is_none());
    // A watch from a future RV gets no bookmark behind its start.
    let mut request = req(Filter::default(), WatchStart::After(Rv(40)), true);
    request.deadline = Instant::now() + Duration::from_secs(70);
    let mut watch = r.watch(request).unwrap();
    assert!(watch.next().await.is_none());
}

/// A quiet watch-list gets its end-of-initial-events bookmark and no other at that RV: the
/// apiserver's watcher sends one at its start RV only while none was (`wasBookmarkAfterRvSent`;
/// a review: a second one went out 2 s before the deadline). A change after it brings the
/// pre-deadline bookmark back.
#[tokio::test(start_paused = true)]
async fn a_quiet_watch_list_gets_its_end_bookmark_and_no_other_at_its_rv() {
    let (mut w, r) = setup();
    let mut request = req(Filter::default(), WatchStart::InitialEvents, true);
    request.deadline = Instant::now() + Duration::from_secs(70);
    let start = Instant::now();
    let mut watch = r.watch(request).unwrap();
    let mut frames = Vec::new();
    while let Some(f) = watch.next().await {
        frames.push(parse_frame(&f));
    }
    let bookmarks: Vec<_> = frames.iter().filter(|f| f.0 == "BOOKMARK").collect();
    assert_eq!(bookmarks.len(), 1, "{frames:?}");
    assert_eq!(bookmarks[0].2, "10");
    assert_eq!(start.elapsed().as_secs(), 70);
    // With a change after the end bookmark: the one before the deadline carries it.
    let mut request = req(Filter::default(), WatchStart::InitialEvents, true);
    request.deadline = Instant::now() + Duration::from_secs(70);
    let mut watch = r.watch(request).unwrap();
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "a")).unwrap();
    let mut frames = Vec::new();
    while let Some(f) = watch.next().await {
        frames.push(parse_frame(&f));
    }
    let last = frames.last().unwrap();
    assert_eq!((last.0.as_str(), last.2.as_str()), ("BOOKMARK", "12"), "{frames:?}");
}

#[tokio::test(start_paused = true)]
async fn waits_for_freshness_then_times_out() {
    let (mut w, r) = setup();
    let r2 = r.clone();
    let waiter = tokio::spawn(async move { r2.wait_for(Rv(12), Duration::from_secs(3)).await });
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "a")).unwrap();
    assert!(waiter.await.unwrap().is_ok());
    let e = r.wait_for(Rv(100), Duration::from_secs(3)).await.unwrap_err();
    assert_eq!(e.to_string(), "Timeout: Too large resource version: 100, current: 12");
}

fn pod(w: &Writer, name: &str, rv: u64, node: &str) -> Object {
    let json = format!(
        r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"spec":{{"nodeName":"{node}"}}}}"#
    );
    w.parse(Bytes::from(json)).unwrap()
}

#[tokio::test]
async fn kubelet_watchers_are_found_by_node() {
    let pods = ResourceKind::new("", "v1", "pods", "Pod", true, true);
    let (mut w, r) = new(pods.clone(), CacheOptions::default());
    w.replace(vec![pod(&w, "p", 5, "")], Rv(10));
    let node = |n: &str| {
        let f = Filter::new(
            None,
            None,
            LabelSelector::default(),
            FieldSelector::parse(&format!("spec.nodeName={n}"), &pods).unwrap(),
        );
        r.watch(req(f, WatchStart::After(Rv(10)), false)).unwrap()
    };
    let mut n1 = node("n1");
    let mut n2 = node("n2");
    // Binding to n1: ADDED for n1 only; moving away: DELETED for n1.
    w.apply(EventType::Modified, pod(&w, "p", 11, "n1")).unwrap();
    w.apply(EventType::Modified, pod(&w, "p", 12, "")).unwrap();
    assert_eq!(
        take(&mut n1, 2).await,
        vec![("ADDED".into(), "p".into(), "11".into()), ("DELETED".into(), "p".into(), "12".into())]
    );
    assert!(tokio::time::timeout(Duration::from_millis(50), n2.next()).await.is_err(), "n2 saw nothing");
    // The index means the n2 watcher was never even offered the events.
    let st = r.shared.state.lock();
    assert_eq!(st.watchers.len(), 2);
    assert_eq!(st.watchers.offered(), 2, "one watcher examined per event");
}

/// An event reaches the watchers of every slot it concerns, each once: a pod moving from one
/// node straight to another is DELETED for the first node's kubelet, ADDED for the second's, and
/// MODIFIED for a watcher of its namespace; a watcher of another namespace is never offered it.
#[tokio::test]
async fn a_pod_moving_between_nodes_reaches_both_kubelets_and_its_namespace() {
    let pods = ResourceKind::new("", "v1", "pods", "Pod", true, true);
    let (mut w, r) = new(pods.clone(), CacheOptions::default());
    w.replace(vec![pod(&w, "p", 5, "n1")], Rv(10));
    let watch = |ns: Option<&str>, fields: &str| {
        let f = Filter::new(
            ns.map(str::to_owned),
            None,
            LabelSelector::default(),
            FieldSelector::parse(fields, &pods).unwrap(),
        );
        r.watch(req(f, WatchStart::After(Rv(10)), false)).unwrap()
    };
    let mut n1 = watch(None, "spec.nodeName=n1");
    let mut n2 = watch(None, "spec.nodeName=n2");
    let mut ns = watch(Some("ns"), "");
    let mut other = watch(Some("other"), "");
    w.apply(EventType::Modified, pod(&w, "p", 11, "n2")).unwrap();
    assert_eq!(take(&mut n1, 1).await, vec![("DELETED".into(), "p".into(), "11".into())]);
    assert_eq!(take(&mut n2, 1).await, vec![("ADDED".into(), "p".into(), "11".into())]);
    assert_eq!(take(&mut ns, 1).await, vec![("MODIFIED".into(), "p".into(), "11".into())]);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), other.next()).await.is_err(),
        "other saw nothing"
    );
    for (watch, name) in [(&mut n1, "n1"), (&mut n2, "n2"), (&mut ns, "ns")] {
        assert!(tokio::time::timeout(Duration::from_millis(50), watch.next()).await.is_err(), "{name}: once");
    }
    let st = r.shared.state.lock();
    assert_eq!(st.watchers.offered(), 3, "the two kubelets and the namespace's watcher, not the other");
}

/// Watches of one object by name (a kubelet's Secrets and ConfigMaps, its own Node) get its
/// every event, created, changed and deleted, and are never offered another object's — the
/// others' events in the namespace cost them nothing, however many kubelets watch there.
#[tokio::test]
async fn watchers_of_one_object_are_found_by_its_key() {
    let (mut w, r) = setup();
    let cms = cms();
    let watch = |r: &Reader, ns: Option<&str>, fields: &str, kind: &ResourceKind| {
        let f = Filter::new(
            ns.map(str::to_owned),
            None,
            LabelSelector::default(),
            FieldSelector::parse(fields, kind).unwrap(),
        );
        r.watch(req(f, WatchStart::Now, false)).unwrap()
    };
    let mut named: Vec<Watch> = (0..50).map(|_| watch(&r, Some("b"), "metadata.name=y", &cms)).collect();
    let mut everywhere = watch(&r, None, "metadata.name=y", &cms);
    let offered = r.shared.state.lock().watchers.offered();
    for (i, name) in ["x", "z", "w"].iter().enumerate() {
        w.apply(EventType::Added, obj(&w, "b", name, 20 + i as u64, "a")).unwrap();
    }
    w.apply(EventType::Added, obj(&w, "b", "y", 30, "a")).unwrap();
    w.apply(EventType::Modified, obj(&w, "b", "y", 31, "a")).unwrap();
    w.apply(EventType::Deleted, obj(&w, "b", "y", 32, "a")).unwrap();
    let want: Vec<(String, String, String)> = [("ADDED", "30"), ("MODIFIED", "31"), ("DELETED", "32")]
        .map(|(t, rv)| (t.into(), "y".into(), rv.into()))
        .into();
    for watch in named.iter_mut().chain(std::iter::once(&mut everywhere)) {
        assert_eq!(take(watch, 3).await, want);
        assert!(tokio::time::timeout(Duration::from_millis(20), watch.next()).await.is_err(), "nothing else");
    }
    // The 50 were offered y's three events only; the one of every namespace all six.
    assert_eq!(r.shared.state.lock().watchers.offered() - offered, 50 * 3 + 6);

    // A cluster-scoped resource: a kubelet's own Node.
    let nodes = ResourceKind::new("", "v1", "nodes", "Node", false, true);
    let (mut w, r) = new(nodes.clone(), CacheOptions::default());
    w.replace(vec![], Rv(10));
    let node = |w: &Writer, name: &str, rv: u64| {
        let json = format!(
            r#"{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"{name}","resourceVersion":"{rv}"}}}}"#
        );
        w.parse(Bytes::from(json)).unwrap()
    };
    let mut own: Vec<Watch> =
        (1..=20).map(|i| watch(&r, None, &format!("metadata.name=n{i}"), &nodes)).collect();
    for i in 1..=20 {
        w.apply(EventType::Added, node(&w, &format!("n{i}"), 10 + i)).unwrap();
    }
    for (i, watch) in own.iter_mut().enumerate() {
        assert_eq!(
            take(watch, 1).await,
            vec![("ADDED".into(), format!("n{}", i + 1), format!("{}", 11 + i))]
        );
    }
    assert_eq!(
        r.shared.state.lock().watchers.offered(),
        20,
        "each Node's event offered to its kubelet alone"
    );
}

/// A change that keeps an object's uid, labels and fields shares its key (and strings) with the
/// version before; one that changes them keys the store by its own, so the tree never keeps an
/// older version's strings alive once that version has left the history. A warm restart's
/// replayed history shares the same way.
#[test]
fn a_version_shares_its_key_with_the_one_before_unless_its_strings_changed() {
    let (mut w, r) = new(cms(), CacheOptions::default());
    w.replace(vec![obj(&w, "ns", "c", 5, "a")], Rv(10));
    let key = ObjectKey::new("ns", "c");
    let stored = |r: &Reader| {
        let st = r.shared.state.lock();
        let (k, o) = st.store.get_key_value(&key).unwrap();
        (k.clone(), o.clone())
    };
    let (_, v1) = stored(&r);
    w.apply(EventType::Modified, obj(&w, "ns", "c", 11, "a")).unwrap();
    let (k2, v2) = stored(&r);
    assert_eq!(v2.header.rv, Rv(11));
    assert!(v2.header.key.same_allocation(&v1.header.key), "same strings: one key for both");
    assert!(k2.same_allocation(&v2.header.key));
    w.apply(EventType::Modified, obj(&w, "ns", "c", 12, "b")).unwrap();
    let (k3, v3) = stored(&r);
    assert_eq!(v3.header.labels().get("app"), Some("b"));
    assert!(!v3.header.key.same_allocation(&v2.header.key));
    assert!(k3.same_allocation(&v3.header.key), "the store keyed by the new version's own key");
    // A warm restart's history replays the same way.
    let (mut w2, r2) = new(cms(), CacheOptions::default());
    let events = vec![
        (EventType::Modified, obj(&w2, "ns", "c", 11, "a")),
        (EventType::Modified, obj(&w2, "ns", "c", 12, "b")),
    ];
    w2.restore(vec![obj(&w2, "ns", "c", 5, "a")], Rv(10), events, Rv(12)).unwrap();
    {
        let st = r2.shared.state.lock();
        let ev: Vec<_> = st.history.since(Rv(10)).unwrap();
        let (k, o) = st.store.get_key_value(&key).unwrap();
        assert!(ev[0].object.header.key.same_allocation(&ev[0].prev.as_ref().unwrap().header.key));
        assert!(!ev[1].object.header.key.same_allocation(&ev[0].object.header.key));
        assert!(k.same_allocation(&o.header.key) && o.header.rv == Rv(12));
    }
    // Whatever shares what, each version reads back its own RV and labels.
    assert_eq!((v1.header.rv, v1.header.labels().get("app")), (Rv(5), Some("a")));
    let list = r.list(&r.snapshot(), &Filter::default(), None).unwrap();
    let all = list.into_chunks().collect::<Vec<_>>().concat();
    let v: serde_json::Value = serde_json::from_slice(&all).unwrap();
    assert_eq!(v["items"][0]["metadata"]["resourceVersion"], "12");
}

#[tokio::test]
async fn big_lists_stream_in_bounded_chunks_and_stay_valid_json() {
    let (mut w, r) = new(cms(), CacheOptions::default());
    let mut items = Vec::new();
    for i in 0..300u64 {
        // Every tenth object is larger than half a chunk and goes out without a copy.
        let size = if i % 10 == 0 { 40_000 } else { 2_000 };
        let json = format!(
            r#"{{"metadata":{{"name":"c{i:03}","namespace":"ns","resourceVersion":"{}"}},"data":{{"k":"{}"}}}}"#,
            i + 1,
            "x".repeat(size)
        );
        items.push(w.parse(Bytes::from(json)).unwrap());
    }
    w.replace(items, Rv(1000));
    let body = r.list(&r.snapshot(), &Filter::default(), None).unwrap();
    let len = body.len;
    let chunks: Vec<Bytes> = body.into_chunks().collect();
    assert!(chunks.len() > 10);
    assert!(chunks.iter().all(|c| c.len() <= 64 * 1024 + 32 * 1024 + 64), "bounded chunks");
    let all = chunks.concat();
    assert_eq!(all.len(), len, "Content-Length matches the body");
    let v: serde_json::Value = serde_json::from_slice(&all).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 300);
    assert_eq!(v["items"][299]["metadata"]["name"], "c299");
}

/// A cache with two watchers from RV 10: `slow` (bookmarks as asked) never reads, so its queue
/// (64) holds events 11..=74; `fast` took each as it came. `rv` is the next event's RV.
struct SlowAndFast {
    w: Writer,
    r: Reader,
    slow: Watch,
    fast: Watch,
    rv: u64,
}

async fn slow_and_fast(bookmarks: bool) -> SlowAndFast {
    let (mut w, r) = setup();
    let long = |bookmarks| WatchRequest {
        deadline: Instant::now() + Duration::from_secs(300),
        ..req(Filter::default(), WatchStart::After(Rv(10)), bookmarks)
    };
    let slow = r.watch(long(bookmarks)).unwrap();
    let mut fast = r.watch(long(false)).unwrap();
    for rv in 11..75u64 {
        w.apply(EventType::Modified, obj(&w, "a", "x", rv, "a")).unwrap().finish().await;
        assert_eq!(parse_frame(&fast.next().await.unwrap()).2, rv.to_string());
    }
    SlowAndFast { w, r, slow, fast, rv: 75 }
}

#[tokio::test(start_paused = true)]
async fn a_watcher_that_drains_within_the_budget_keeps_its_stream() {
    let SlowAndFast { mut w, r, mut slow, mut fast, rv } = slow_and_fast(false).await;
    tokio::time::advance(Duration::from_secs(2)).await; // the budget refills to 100 ms
    let t0 = Instant::now();
    let d = w.apply(EventType::Modified, obj(&w, "a", "x", rv, "a")).unwrap();
    assert_eq!(d.blocked(), 1, "the slow watcher's queue is full");
    let reader = async {
        tokio::time::sleep(Duration::from_millis(40)).await;
        slow.next().await.unwrap() // frees one slot within the budget
    };
    let ((), first) = tokio::join!(d.finish(), reader);
    assert_eq!(parse_frame(&first).2, "11");
    assert_eq!(Instant::now() - t0, Duration::from_millis(40), "the writer waited only until it drained");
    assert_eq!(r.watcher_stats().terminated, 0);
    // Every event, in order, including the one that had to wait.
    let rest = take(&mut slow, 64).await;
    let rvs: Vec<u64> = rest.iter().map(|e| e.2.parse().unwrap()).collect();
    assert_eq!(rvs, (12..=rv).collect::<Vec<_>>());
    assert_eq!(parse_frame(&fast.next().await.unwrap()).2, rv.to_string());
}

#[tokio::test(start_paused = true)]
async fn a_stalled_watcher_costs_at_most_the_budget_then_is_closed() {
    let SlowAndFast { mut w, r, mut slow, mut fast, rv } = slow_and_fast(false).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let t0 = Instant::now();
    w.apply(EventType::Modified, obj(&w, "a", "x", rv, "a")).unwrap().finish().await;
    assert_eq!(Instant::now() - t0, Duration::from_millis(100), "waited the whole budget, no more");
    assert_eq!(r.watcher_stats().terminated, 1);
    assert_eq!(r.watcher_stats().live, 1);
    // The budget is spent: the next events cost nothing, and the fast watcher has them all.
    let t1 = Instant::now();
    for next in rv + 1..rv + 5 {
        w.apply(EventType::Modified, obj(&w, "a", "x", next, "a")).unwrap().finish().await;
    }
    assert_eq!(Instant::now(), t1);
    let got = take(&mut fast, 5).await;
    let rvs: Vec<u64> = got.iter().map(|e| e.2.parse().unwrap()).collect();
    assert_eq!(rvs, (rv..rv + 5).collect::<Vec<_>>());
    // The closed watcher gets what it had queued, then its stream ends.
    let mut n = 0;
    while slow.next().await.is_some() {
        n += 1;
    }
    assert_eq!(n, 64);
}

#[tokio::test(start_paused = true)]
async fn a_bookmark_never_overtakes_a_delivery_still_waiting() {
    let SlowAndFast { mut w, r, mut slow, fast: _fast, rv } = slow_and_fast(true).await;
    // Past the bookmark time: the slow watch emits a bookmark as soon as its queue is empty.
    tokio::time::advance(Duration::from_secs(61)).await;
    let d = w.apply(EventType::Modified, obj(&w, "a", "x", rv, "a")).unwrap();
    let reader = async {
        let mut seen = Vec::new();
        while seen.last().map(|(_, _, v): &(String, String, String)| v != &rv.to_string()).unwrap_or(true) {
            seen.push(parse_frame(&slow.next().await.unwrap()));
        }
        seen
    };
    let ((), seen) = tokio::join!(d.finish(), reader);
    let mut last = 10;
    for (ty, _, v) in &seen {
        let v: u64 = v.parse().unwrap();
        assert!(v >= last, "{ty} at {v} after {last}: {seen:?}");
        assert!(ty != "BOOKMARK" || v < rv, "bookmark at {v} before event {rv} was delivered");
        last = v;
    }
    assert_eq!(seen.last().unwrap().0, "MODIFIED");
    assert_eq!(r.watcher_stats().terminated, 0);
}

/// After the reflector stopped (shutdown), a watch request still arriving on a draining
/// connection is refused: it would never get an event nor be ended (a tier above waited on such
/// a watch for its whole timeout).
#[tokio::test]
async fn no_watch_starts_once_the_watchers_are_closed() {
    let (mut w, r) = setup();
    let mut open = r.watch(req(Filter::default(), WatchStart::After(Rv(10)), false)).unwrap();
    w.close_watchers();
    assert_eq!(drain(&mut open).await, Some(vec![]), "the open watch ends");
    let refused = r.watch(req(Filter::default(), WatchStart::After(Rv(10)), false));
    assert!(matches!(refused, Err(Error::ServiceUnavailable(_))));
}

#[tokio::test(start_paused = true)]
async fn a_sampled_delivery_observes_its_lag_when_the_watch_yields_it() {
    let hist = prometheus::HistogramVec::new(
        prometheus::HistogramOpts::new("lag", "lag").buckets(vec![0.001, 0.01, 1.0]),
        &["resource"],
    )
    .unwrap();
    let opts = CacheOptions { delivery_lag: DeliveryLag(Some(hist.clone())), ..Default::default() };
    let (mut w, r) = new(cms(), opts);
    w.replace(vec![], Rv(10));
    let h = hist.with_label_values(&["configmaps"]);
    let mut watchers: Vec<Watch> =
        (0..100).map(|_| r.watch(req(Filter::default(), WatchStart::Now, false)).unwrap()).collect();
    w.apply(EventType::Added, obj(&w, "a", "x", 11, "a")).unwrap();
    assert_eq!(h.get_sample_count(), 0, "observed at the body, not at the fan-out");
    tokio::time::advance(Duration::from_millis(5)).await;
    for watch in &mut watchers {
        assert_eq!(take(watch, 1).await.len(), 1);
    }
    // The event's first delivery and one in SAMPLE_EVERY of the 99 others.
    assert_eq!(h.get_sample_count(), 1 + 99 / lag::SAMPLE_EVERY);
    let mean = h.get_sample_sum() / h.get_sample_count() as f64;
    assert!((0.0049..0.006).contains(&mean), "{mean}");
}

#[tokio::test(start_paused = true)]
async fn the_cache_lag_counts_while_the_upstream_is_seen_ahead() {
    let (mut w, r) = setup();
    assert_eq!(r.lag(), Some(Duration::ZERO));
    r.upstream_at(Rv(10));
    assert_eq!(r.lag(), Some(Duration::ZERO), "the cache is there already");
    r.upstream_at(Rv(12));
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(r.lag(), Some(Duration::from_secs(3)));
    w.apply(EventType::Added, obj(&w, "a", "n", 11, "a")).unwrap();
    assert_eq!(r.lag(), Some(Duration::from_secs(3)), "still behind 12");
    w.bookmark(Rv(12));
    assert_eq!(r.lag(), Some(Duration::ZERO));
}

/// A configmap `c<i>` at `rv` with 200 bytes of data, as a list item (no type members).
fn sized_cm(i: usize, rv: u64) -> String {
    format!(
        r#"{{"metadata":{{"name":"c{i:04}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"k":"{}"}}}}"#,
        "x".repeat(200)
    )
}

/// A list page whose objects are mostly superseded is given back (`cache::pages`): its last
/// objects are copied out (the same bytes and RV), and the page is freed once the history
/// lets go of the versions it held; a page still mostly live is kept, and what it holds
/// beyond its live objects is counted with the objects.
#[tokio::test]
async fn a_mostly_superseded_list_page_is_given_back() {
    let (mut w, r) = new(cms(), CacheOptions { history_max_events: 10, ..Default::default() });
    let json = sized_cm;
    // Two pages of 3 000 configmaps of ~300 B, as a list's pages arrive (one buffer each).
    let page = |w: &Writer, from: usize| {
        let items: Vec<String> = (from..from + 3000).map(|i| json(i, 1 + i as u64)).collect();
        let body = Bytes::from(items.join(","));
        let mut at = 0;
        let objects: Vec<Object> = items
            .iter()
            .map(|it| {
                let o = w.parse(body.slice(at..at + it.len())).unwrap();
                at += it.len() + 1;
                o
            })
            .collect();
        (body, objects)
    };
    let (first, mut items) = page(&w, 0);
    let (second, more) = page(&w, 3000);
    items.extend(more);
    w.replace(items, Rv(10_000));
    let mut rv = 10_000;
    let mut last: Vec<u64> = (1..=6000).collect();
    let mut change = |w: &mut Writer, i: usize| {
        rv += 1;
        last[i] = rv;
        drop(w.apply(EventType::Modified, w.parse(Bytes::from(json(i, rv))).unwrap()).unwrap());
    };
    // 90 % of the first page changed, 10 % of the second (the copies are made a few at each
    // event, among objects still changing); then the history moves on.
    let mut raced = false;
    for i in (0..2700).chain(3000..3300) {
        change(&mut w, i);
        if !raced && w.pages.pending() > 0 {
            // An object still to be copied changes before its turn: its copy is not put back.
            change(&mut w, 2999);
            raced = true;
        }
    }
    assert!(raced, "a pass was planned");
    for _ in 0..10 {
        change(&mut w, 0);
    }
    // No copy ever put back a version older than the one the store held.
    for (i, rv) in last.iter().enumerate() {
        assert_eq!(r.get("ns", &format!("c{i:04}")).unwrap().header.rv, Rv(*rv), "c{i:04}");
    }
    assert!(first.is_unique(), "the first page is freed");
    assert!(!second.is_unique(), "the second page is kept: 90 % of it is live");
    // An object copied out of the first page reads as it did, at its RV.
    let o = r.get("ns", "c2900").unwrap();
    assert_eq!(o.header.rv, Rv(2901));
    let typed = String::from_utf8(o.typed_bytes().to_vec()).unwrap();
    assert_eq!(typed, json(2900, 2901).replacen('{', r#"{"kind":"ConfigMap","apiVersion":"v1","#, 1));
    assert!(!first.as_ptr_range().contains(&o.body.as_ptr()));
    // The second page holds 300 superseded versions beyond its live objects: counted.
    let pinned = w.shared.pinned.load(Ordering::Relaxed);
    assert!((300 * 250..300 * 350).contains(&pinned), "{pinned}");
    let usage = r.memory();
    let live: u64 = r.snapshot().store.values().map(|o| (o.kept_bytes() + memory::STORE_ENTRY) as u64).sum();
    assert_eq!(usage.objects, live + pinned, "{usage:?}");
}

/// A warm start's objects are slices of their state block's buffer, as a list's are of its
/// pages: a block mostly superseded is given back the same way.
#[tokio::test]
async fn a_mostly_superseded_state_block_is_given_back() {
    let (mut w, r) = new(cms(), CacheOptions { history_max_events: 10, ..Default::default() });
    let json = sized_cm;
    // One block of 3 000 saved objects' bodies, back to back, and the headers they were saved with.
    let texts: Vec<String> = (0..3000).map(|i| json(i, 1 + i as u64)).collect();
    let parsed: Vec<Object> = texts.iter().map(|t| w.parse(Bytes::from(t.clone())).unwrap()).collect();
    let block = Bytes::from(parsed.iter().flat_map(|o| o.body.to_vec()).collect::<Vec<u8>>());
    let mut at = 0;
    let base: Vec<Object> = parsed
        .iter()
        .map(|o| {
            let body = block.slice(at..at + o.body.len());
            at += o.body.len();
            Object::restored(&w.shared.typing, o.header.clone(), body)
        })
        .collect();
    w.restore(base, Rv(3000), Vec::new(), Rv(3000)).unwrap();
    assert_eq!(r.get("ns", "c0007").unwrap().typed_bytes(), parsed[7].typed_bytes());
    let mut rv = 3000;
    for i in (0..2700).chain(std::iter::repeat_n(0, 10)) {
        rv += 1;
        drop(w.apply(EventType::Modified, w.parse(Bytes::from(json(i, rv))).unwrap()).unwrap());
    }
    assert!(block.is_unique(), "the block is freed");
    let o = r.get("ns", "c2900").unwrap();
    assert_eq!((o.header.rv, o.typed_bytes()), (Rv(2901), parsed[2900].typed_bytes()));
}

/// A relist while a pass's copies are pending: the copies of the old list's objects are never
/// put into the new store; every object reads as the new list (or a later event) has it.
#[tokio::test]
async fn a_relist_drops_the_copies_still_pending() {
    let (mut w, r) = new(cms(), CacheOptions { history_max_events: 10, ..Default::default() });
    let list = |w: &Writer, rv: u64| {
        let texts: Vec<String> = (0..3000).map(|i| sized_cm(i, rv + i as u64)).collect();
        let page = Bytes::from(texts.join(","));
        let mut at = 0;
        texts
            .iter()
            .map(|t| {
                let o = w.parse(page.slice(at..at + t.len())).unwrap();
                at += t.len() + 1;
                o
            })
            .collect::<Vec<Object>>()
    };
    let first = list(&w, 1);
    w.replace(first, Rv(5000));
    let mut rv = 5000;
    let mut i = 0;
    while w.pages.pending() == 0 {
        rv += 1;
        drop(w.apply(EventType::Modified, w.parse(Bytes::from(sized_cm(i, rv))).unwrap()).unwrap());
        i += 1;
        assert!(i < 3000, "a pass was planned");
    }
    // The relist: every object at a new RV, past everything before.
    let second = list(&w, 100_000);
    w.replace(second, Rv(200_000));
    for k in 0..40 {
        drop(
            w.apply(EventType::Modified, w.parse(Bytes::from(sized_cm(2999, 200_001 + k))).unwrap()).unwrap(),
        );
    }
    w.bookmark(Rv(300_000));
    for n in 0..2999 {
        assert_eq!(r.get("ns", &format!("c{n:04}")).unwrap().header.rv, Rv(100_000 + n as u64), "c{n:04}");
    }
    assert_eq!(r.get("ns", "c2999").unwrap().header.rv, Rv(200_040));
}

/// A store filled from a list holds what inserting the list in order gives: every key once, a
/// repeated key's later object (a relist's and a warm restart's base), whether the list comes
/// in key order (two passes) or not (one by one).
mod filled {
    use proptest::prelude::*;

    use super::*;

    fn entries(s: &Store) -> Vec<(String, u64)> {
        s.iter().map(|(k, o)| (k.as_str().to_owned(), o.header.rv.0)).collect()
    }

    fn check(w: &Writer, names: &[(u8, u16)]) -> Result<(), TestCaseError> {
        let list: Vec<Object> = names
            .iter()
            .enumerate()
            .map(|(i, (ns, n))| obj(w, &format!("ns-{ns}"), &format!("cm-{n:03}"), i as u64 + 1, "a"))
            .collect();
        let mut want = Store::new();
        for o in list.clone() {
            want.insert(o.header.key.clone(), Arc::new(o));
        }
        let got = store::filled(list);
        prop_assert_eq!(got.len(), want.len());
        prop_assert_eq!(entries(&got), entries(&want));
        Ok(())
    }

    proptest! {
        #[test]
        fn holds_what_inserting_in_order_holds(names in proptest::collection::vec((0u8..3, 0u16..400), 0..600)) {
            let (w, _r) = new(cms(), CacheOptions::default());
            check(&w, &names)?;
            let sorted: std::collections::BTreeSet<(u8, u16)> = names.iter().copied().collect();
            check(&w, &sorted.into_iter().collect::<Vec<_>>())?;
        }
    }
}

/// A cache dropped for `--cache-memory-limit` has nothing to save once released (its writer
/// empties it while it still reads as ready): the state file saved before it stays.
#[test]
fn a_released_cache_is_never_saved() {
    let (mut w, r) = setup();
    assert_eq!(r.saved().expect("saved while cached").base.len(), 3);
    r.release_at_stop();
    assert!(r.saved().is_none(), "released: not saved, even before it is emptied");
    w.close_watchers();
    w.stopped();
    assert!(r.progress().ready && r.saved().is_none());
}

/// Found wrong at `at` while events after `at` came in: a client may have listed or watched
/// up to the cache's RV on the wrong state, so the relist's floor is above that RV, not `at`
/// (a resume there would be accepted with nothing replayed: the difference never sent).
#[test]
fn a_cache_found_wrong_distrusts_every_rv_it_served() {
    let (mut w, r) = setup();
    w.apply(EventType::Modified, obj(&w, "a", "x", 12, "a")).unwrap();
    w.set_not_ready(Some("differs".into()));
    w.distrust_through(Rv(11));
    let fixed = vec![obj(&w, "a", "x", 12, "a"), obj(&w, "b", "z", 7, "b"), obj(&w, "c", "missed", 9, "c")];
    w.replace(fixed, Rv(12));
    w.bookmark(Rv(15));
    assert!(r.progress().ready);
    let e = r.watch(req(Filter::default(), WatchStart::After(Rv(12)), false)).err().unwrap();
    assert_eq!(e.to_string(), "too old resource version: 12 (12)");
    assert!(r.watch(req(Filter::default(), WatchStart::After(Rv(15)), false)).is_ok());
}

/// The relist lands at the very RV the wrong cache had reached (nothing written upstream
/// since): that RV is distrusted, so a LIST answered there would send its client to a watch
/// that answers 410, and again. The cache stays unready until the upstream moves past it.
#[test]
fn a_relist_at_the_distrusted_rv_waits_for_the_upstream_to_move() {
    let (mut w, r) = setup();
    w.set_not_ready(Some("differs".into()));
    w.distrust_through(Rv(10));
    let fixed = vec![obj(&w, "a", "x", 5, "a"), obj(&w, "c", "missed", 9, "c")];
    w.replace(fixed, Rv(10));
    let p = r.progress();
    assert!(!p.ready, "not served at an RV every client of the wrong cache may hold");
    assert!(p.last_error.as_deref().is_some_and(|e| e.contains("found wrong")), "{:?}", p.last_error);
    w.bookmark(Rv(13));
    assert!(r.progress().ready, "past it: served again");
    let e = r.watch(req(Filter::default(), WatchStart::After(Rv(10)), false)).err().unwrap();
    assert_eq!(e.to_string(), "too old resource version: 10 (10)");
    assert!(r.watch(req(Filter::default(), WatchStart::After(Rv(13)), false)).is_ok());
}

/// A watch-list's proof (`server::consistent`): the store's selection must be exactly the
/// upstream's items, same keys and versions in key order, nothing more or less.
#[test]
fn a_selection_is_proven_by_exactly_its_keys_and_versions() {
    let (_w, r) = setup();
    let store = r.snapshot().store;
    let ns = |n: &str| Filter::new(Some(n.into()), None, Default::default(), Default::default());
    let holds = |f: Filter, v: &[(&str, &str, u64)]| {
        r.selects_exactly(&store, f, v.iter().map(|(a, b, c)| (*a, *b, Rv(*c))))
    };
    // Key order, as etcd's: "a-b/y" before "a/x".
    assert!(holds(label("a"), &[("a-b", "y", 6), ("a", "x", 5)]));
    assert!(holds(ns("a"), &[("a", "x", 5)]), "the namespace's own, not a-b's");
    assert!(holds(label("c"), &[]), "an empty selection");
    assert!(!holds(label("a"), &[("a-b", "y", 7), ("a", "x", 5)]), "another version");
    assert!(!holds(label("a"), &[("a", "x", 5)]), "one the upstream lacks");
    assert!(!holds(label("a"), &[("a-b", "y", 6), ("a", "x", 5), ("b", "w", 8)]), "one the cache lacks");
    assert!(!holds(label("a"), &[("a", "x", 5), ("a-b", "y", 6)]), "another order");
    assert!(!holds(label("a"), &[("b", "y", 6), ("a", "x", 5)]), "another namespace");
}

/// A page of pods by node, read as the apiserver reads it from its `spec.nodeName` index (a
/// Most Recent or NotOlderThan list from its start): continued only if a later pod is on the
/// node, not merely because other nodes' pods sort after it. Read otherwise (an Exact list, a
/// continuation: from the snapshot's whole range), any later pod continues it.
#[test]
fn a_page_of_a_nodes_pods_read_from_the_index_continues_only_on_that_node() {
    let pods = ResourceKind::new("", "v1", "pods", "Pod", true, true);
    let (mut w, r) = new(pods.clone(), CacheOptions::default());
    let items =
        vec![pod(&w, "a", 2, "n1"), pod(&w, "b", 3, "n1"), pod(&w, "c", 4, "n2"), pod(&w, "d", 5, "")];
    w.replace(items, Rv(10));
    let snap = r.snapshot();
    let on = |node: &str, index: bool| {
        let f = FieldSelector::parse(&format!("spec.nodeName={node}"), &pods).unwrap();
        Filter::new(None, None, LabelSelector::default(), f).with_node_index(index)
    };
    let page = || Some(crate::cache::list::Page { limit: 2, start: None, token_rv: 10 });
    let continued = |f: &Filter| r.list(&snap, f, page()).unwrap().continue_token.is_some();
    assert!(!continued(&on("n1", true)), "n1's two pods are the whole of n1");
    assert!(continued(&on("n1", false)), "from the whole range: c and d follow");
    // A third pod on n1, after the page: continued.
    w.apply(EventType::Added, pod(&w, "e", 11, "n1")).unwrap();
    let snap = r.snapshot();
    let continued = |f: &Filter| r.list(&snap, f, page()).unwrap().continue_token.is_some();
    assert!(continued(&on("n1", true)));
    // Only pods: another resource's list never reads an index.
    let (mut w2, r2) = new(cms(), CacheOptions::default());
    w2.replace(
        vec![obj(&w2, "a", "x", 5, "a"), obj(&w2, "a", "y", 6, "a"), obj(&w2, "b", "z", 7, "b")],
        Rv(10),
    );
    let f = Filter::new(None, None, LabelSelector::default(), FieldSelector::default()).with_node_index(true);
    let one = Some(crate::cache::list::Page { limit: 1, start: None, token_rv: 10 });
    assert!(r2.list(&r2.snapshot(), &f, one).unwrap().continue_token.is_some());
}
