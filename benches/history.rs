//! History lookups (issue 4, bench 6) with a 10 000-event history over 10 000 pods:
//! - `snapshot_at/undo/K`: `Reader::snapshot_at(rv)` K events back (binary search, then K undo
//!   steps on a persistent copy of the store; what Exact and paginated lists use);
//! - `watch_after/replay/K`: `Reader::watch` with `WatchStart::After(rv)` K events back (binary
//!   search, the frame of each of the K events for this watcher, registration; the request is
//!   built and the watch dropped outside the timing), and the same with a label selector that
//!   keeps 1 event in 10.
//!
//! Run: `cargo bench --bench history`; smoke: `BENCH_SMOKE=1 cargo bench --bench history`.

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use kube_watchcache::cache::{CacheOptions, Filter, Reader, WatchRequest, WatchStart};
use kube_watchcache::resource::Rv;
use kube_watchcache::selector::{FieldSelector, LabelSelector};

fn history(c: &mut Criterion) {
    let pods = support::size(10_000, 200);
    let events = support::size(10_000, 200);
    let opts = CacheOptions { history_window: Duration::from_secs(24 * 3600), ..Default::default() };
    let (mut w, reader) = support::filled_cache(pods, 100, opts);
    let newest = support::churn(&mut w, pods, 100, pods as u64 + 1, events) - 1;
    let (floor, cache_rv) = reader.window();
    assert_eq!((floor, cache_rv), (Rv(pods as u64), Rv(newest)));
    let backs = [0, events / 100, events / 2, events];

    let mut g = c.benchmark_group("history");
    for &k in &backs {
        let rv = Rv(newest - k as u64);
        let snap = reader.snapshot_at(rv).map(|s| s.store.len());
        assert_eq!(snap, Some(pods), "snapshot_at({rv})");
        g.throughput(Throughput::Elements(k.max(1) as u64));
        g.bench_with_input(BenchmarkId::new("snapshot_at/undo", k), &rv, |b, &rv| {
            b.iter(|| reader.snapshot_at(black_box(rv)).map(|s| s.rv))
        });
    }
    assert!(reader.snapshot_at(Rv(floor.0 - 1)).is_none());

    let everything = Filter::default();
    let rt = support::runtime();
    for &k in &backs {
        let rv = Rv(newest - k as u64);
        g.throughput(Throughput::Elements(k.max(1) as u64));
        assert_eq!(replayed(&reader, &everything, rv, &rt), k);
        g.bench_with_input(BenchmarkId::new("watch_after/replay", k), &rv, |b, &rv| {
            b.iter_batched(|| request(&everything, rv), |req| reader.watch(req), BatchSize::SmallInput)
        });
    }
    let app3 = match LabelSelector::parse("app=app-3") {
        Ok(s) => Filter::new(None, None, s, FieldSelector::default()),
        Err(e) => panic!("{e}"),
    };
    let rv = Rv(floor.0);
    // Pod j % pods is modified by event j: app-3 pods are one in ten.
    assert_eq!(replayed(&reader, &app3, rv, &rt), events / 10);
    g.throughput(Throughput::Elements(events as u64));
    g.bench_with_input(BenchmarkId::new("watch_after/replay_label_app_eq", events), &rv, |b, &rv| {
        b.iter_batched(|| request(&app3, rv), |req| reader.watch(req), BatchSize::SmallInput)
    });
    g.finish();
    assert_eq!(reader.watcher_stats().live, 0);
}

/// A watch request after `rv`, without bookmarks.
fn request(filter: &Filter, rv: Rv) -> WatchRequest {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
    WatchRequest { filter: filter.clone(), start: WatchStart::After(rv), bookmarks: false, deadline }
}

/// How many frames a watch after `rv` replays at once.
fn replayed(reader: &Reader, filter: &Filter, rv: Rv, rt: &tokio::runtime::Runtime) -> usize {
    let _rt = rt.enter();
    match reader.watch(request(filter, rv)) {
        Ok(mut w) => support::drain(&mut w),
        Err(e) => panic!("watch after {rv}: {e}"),
    }
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = history
}
criterion_main!(benches);
