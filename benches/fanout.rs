//! Fan-out (issue 4, bench 4): the cost of one `Writer::apply` of a MODIFIED pod (store insert,
//! framing, history push, dispatch) with N registered watchers (`WatchStart::Now`):
//! - `all_watchers/N`: N cluster-wide watchers, each receives every event (O(N));
//! - `kubelet/N`: N kubelets, watcher i with `fieldSelector=spec.nodeName=node-i`; an event
//!   concerns one node, and the node index makes it ~constant in N;
//! - `no_watchers`: the apply alone, the floor of both curves;
//! - `all_watchers_protobuf/N`, `kubelet_protobuf/N`: the same with protobuf watchers (issue 17):
//!   each event is transcoded once (its object version is new) and framed once for all of them;
//! - `kubelet_status/N`, `kubelet_status_protobuf/N`: kubelets again, each event also changing
//!   the pod's status near its end (a container's `restartCount`), as a kubelet's own status
//!   writes do, rather than only its `resourceVersion`;
//! - `one_object/N`: N watches of one object each (`metadata.name` in its namespace, as a
//!   kubelet watches its Node and the Secrets its pods mount), pod i's by watcher i: found by
//!   the object's key, ~constant in N (they were offered every event of their namespace).
//!
//! Only the applies are timed (`iter_custom`); the objects are prepared before and the
//! watchers' queues drained after each chunk, so no watcher is closed for being slow (checked).
//!
//! Run: `cargo bench --bench fanout`; smoke: `BENCH_SMOKE=1 cargo bench --bench fanout`.

mod support;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kube_watchcache::cache::{CacheOptions, Filter, Reader, Watch, WatchRequest, WatchStart, Writer};
use kube_watchcache::metadata_only::Repr;
use kube_watchcache::resource::{EventType, Object, Rv};
use kube_watchcache::selector::{FieldSelector, LabelSelector};
use support::PodSpec;

/// Applies timed between two drains; the watcher queues hold twice that.
const CHUNK: u64 = 64;

/// What each event changes.
#[derive(Clone, Copy, PartialEq)]
enum Change {
    /// The `resourceVersion` only.
    Rv,
    /// A container's `restartCount` in the status too.
    Status,
}

/// Who watches.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// Everything, cluster-wide.
    All,
    /// `spec.nodeName=node-i` for watcher i (one per node).
    Kubelet,
    /// Pod i's namespace and name for watcher i.
    Object,
}

struct Fixture {
    writer: Writer,
    reader: Reader,
    watches: Vec<Watch>,
    /// One parsed pod per store entry; events are these with a new RV.
    pool: Vec<Object>,
    nodes: usize,
    shape: Shape,
    change: Change,
    next_rv: u64,
    /// Pod of the next event.
    cursor: usize,
    rt: tokio::runtime::Runtime,
}

impl Fixture {
    fn new(shape: Shape, watchers: usize, repr: Repr, change: Change) -> Fixture {
        let pods = support::size(10_000, 200);
        let nodes = if shape == Shape::Kubelet { watchers.max(1) } else { 100 };
        let opts = CacheOptions {
            watcher_queue: 2 * CHUNK as usize,
            history_max_events: 4096,
            ..Default::default()
        };
        let (writer, reader) = support::filled_cache(pods, nodes, opts);
        let pool: Vec<Object> =
            (0..pods).map(|i| support::pod(&PodSpec { i, rv: i as u64 + 1, nodes, generation: 0 })).collect();
        let rt = support::runtime();
        let kind = support::pods();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(24 * 3600);
        let watches = (0..watchers)
            .map(|i| {
                let filter = match shape {
                    Shape::All => Filter::default(),
                    Shape::Kubelet => match FieldSelector::parse(&format!("spec.nodeName=node-{i}"), &kind) {
                        Ok(f) => Filter::new(None, None, LabelSelector::default(), f),
                        Err(e) => panic!("{e}"),
                    },
                    Shape::Object => {
                        let h = &pool[i % pool.len()].header;
                        let (ns, name) = (h.namespace().to_owned(), h.name().to_owned());
                        Filter::new(Some(ns), Some(name), LabelSelector::default(), FieldSelector::default())
                    }
                }
                .with_repr(repr);
                let req = WatchRequest { filter, start: WatchStart::Now, bookmarks: false, deadline };
                match reader.watch(req) {
                    Ok(w) => w,
                    Err(e) => panic!("watch: {e}"),
                }
            })
            .collect();
        Fixture {
            writer,
            reader,
            watches,
            pool,
            nodes,
            shape,
            change,
            next_rv: pods as u64 + 1,
            cursor: 0,
            rt,
        }
    }

    /// Times `iters` applies, draining the interested watchers every `CHUNK`.
    fn run(&mut self, iters: u64) -> Duration {
        let mut timed = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let k = left.min(CHUNK) as usize;
            let mut batch = Vec::with_capacity(k);
            let mut touched = Vec::with_capacity(k);
            for _ in 0..k {
                let i = self.cursor % self.pool.len();
                self.cursor += 1;
                let obj = self.pool[i].with_rv(Rv(self.next_rv));
                batch.push(match self.change {
                    Change::Rv => obj,
                    Change::Status => restarted(&self.writer, &obj, self.next_rv),
                });
                self.next_rv += 1;
                touched.push(if self.shape == Shape::Object { i } else { i % self.nodes });
            }
            let start = Instant::now();
            for obj in batch {
                if let Err(e) = self.writer.apply(EventType::Modified, obj) {
                    panic!("apply: {e}");
                }
            }
            timed += start.elapsed();
            self.drain(&touched);
            left -= k as u64;
        }
        timed
    }

    fn drain(&mut self, touched_nodes: &[usize]) {
        let _rt = self.rt.enter();
        match self.shape {
            Shape::All => self.watches.iter_mut().for_each(|w| {
                support::drain(w);
            }),
            Shape::Kubelet | Shape::Object => {
                for &n in touched_nodes {
                    if let Some(w) = self.watches.get_mut(n) {
                        support::drain(w);
                    }
                }
            }
        }
    }

    /// Every watcher is still registered: none was closed for being slow.
    fn check(&self) {
        let stats = self.reader.watcher_stats();
        assert_eq!(stats.terminated, 0, "a watcher was closed: drain too late");
        assert_eq!(stats.live, self.watches.len());
    }
}

/// `obj` with its container's `restartCount` set to `n`, parsed by the cache's writer (as the
/// reflector parses what the upstream sends).
fn restarted(w: &Writer, obj: &Object, n: u64) -> Object {
    let json = String::from_utf8_lossy(&obj.typed_bytes()).replacen(
        r#""restartCount":0"#,
        &format!(r#""restartCount":{n}"#),
        1,
    );
    assert!(json.contains(&format!(r#""restartCount":{n}"#)), "the bench pod has a restartCount");
    match w.parse(json.into()) {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    }
}

fn fanout(c: &mut Criterion) {
    let sizes = [support::size(1_000, 10), support::size(5_000, 50), support::size(10_000, 100)];
    let mut g = c.benchmark_group("fanout_apply");

    g.throughput(Throughput::Elements(1));
    let mut f = Fixture::new(Shape::All, 0, Repr::Full, Change::Rv);
    g.bench_function("no_watchers", |b| b.iter_custom(|iters| f.run(iters)));
    f.check();
    drop(f);

    for (repr, suffix) in [(Repr::Full, ""), (Repr::FullProto, "_protobuf")] {
        for &n in &sizes {
            let mut f = Fixture::new(Shape::All, n, repr, Change::Rv);
            // Throughput in deliveries: each apply reaches every watcher.
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::new(format!("all_watchers{suffix}"), n), &n, |b, _| {
                b.iter_custom(|iters| f.run(iters))
            });
            f.check();
        }
    }
    for (repr, suffix) in [(Repr::Full, ""), (Repr::FullProto, "_protobuf")] {
        for &n in &sizes {
            bench_kubelets(&mut g, n, repr, Change::Rv, suffix);
        }
    }
    for (repr, suffix) in [(Repr::Full, ""), (Repr::FullProto, "_protobuf")] {
        bench_kubelets(&mut g, sizes[0], repr, Change::Status, &format!("_status{suffix}"));
    }
    for &n in &sizes {
        let mut f = Fixture::new(Shape::Object, n, Repr::Full, Change::Rv);
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("one_object", n), &n, |b, _| b.iter_custom(|iters| f.run(iters)));
        f.check();
        let offered = f.reader.watcher_stats().offered;
        let events = f.next_rv - f.pool.len() as u64 - 1;
        assert!(offered <= events, "watches of one object examined {offered} times for {events} events");
    }
    g.finish();
}

fn bench_kubelets(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    n: usize,
    repr: Repr,
    change: Change,
    suffix: &str,
) {
    {
        let mut f = Fixture::new(Shape::Kubelet, n, repr, change);
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new(format!("kubelet{suffix}"), n), &n, |b, _| {
            b.iter_custom(|iters| f.run(iters))
        });
        f.check();
        let offered = f.reader.watcher_stats().offered;
        let events = f.next_rv - f.pool.len() as u64 - 1;
        assert!(offered <= 2 * events, "kubelet fan-out examined {offered} watchers for {events} events");
    }
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = fanout
}
criterion_main!(benches);
