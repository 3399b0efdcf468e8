//! crossbeam against what the cache uses (issue 19): is there a place where crossbeam is the
//! better tool? Two candidates, each measured against today's code in the same run:
//!
//! - **Per-watcher queues.** The writer puts each event's frame (an RV and a `Bytes`) into the
//!   queue of every interested watcher with a non-blocking send, under the cache's lock; each
//!   watcher is an async task that must be *woken* when its queue gets a frame. Today: a bounded
//!   `tokio::sync::mpsc` channel (`try_send` / `recv().await`). Candidate: a
//!   `crossbeam_queue::ArrayQueue` (lock-free, bounded) with a `futures` `AtomicWaker` for the
//!   wake-up (crossbeam's own channels park OS threads and cannot wake a task).
//!   - `watcher_queue/send/*`: what the writer pays under the lock: one frame into each of
//!     `WATCHERS` queues (receivers idle; drained untimed).
//!   - `watcher_queue/deliver/*`: end to end on a 2-worker runtime: the frame into every queue,
//!     until every watcher task has received it (wake-ups, cross-thread hand-off).
//!   - `watcher_queue/idle_bytes_per_queue` (printed): the resident memory of an idle queue.
//!     An `ArrayQueue` allocates its whole capacity up front; so a third variant,
//!     `crossbeam_segqueue`, grows in blocks as tokio's channel does, bounded by a counter.
//! - **Store snapshots.** A read takes a snapshot of the resource's persistent map and serves it
//!   without the lock, across `.await`s. Today: `parking_lot::Mutex<imbl::OrdMap>` and an O(1)
//!   clone under the lock. Candidate: the map behind a `crossbeam_epoch::Atomic`, read with a
//!   pinned guard (a guard cannot live across `.await`, so the reader still clones the map out).
//!   - `snapshot/*`: one snapshot taken, while another thread applies changes.
//!
//! Run: `cargo bench --bench queues`; smoke: `BENCH_SMOKE=1 cargo bench --bench queues`.
//! Results and the decision: README "Concurrency primitives, and why not crossbeam".

mod support;

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_queue::{ArrayQueue, SegQueue};
use futures_util::task::AtomicWaker;
use tokio::sync::mpsc;

/// One queued frame, as `cache::watchers::Delivery`.
#[derive(Clone)]
struct Delivery {
    #[allow(dead_code)]
    rv: u64,
    frame: Bytes,
}

/// The queue length per watcher (`CacheOptions::watcher_queue`'s default).
const QUEUE: usize = 1000;

/// A bounded queue with an async receiver: the two implementations measured.
trait Queue: Send + Sync + 'static {
    type Rx: Send + 'static;
    fn pair() -> (Self, Self::Rx)
    where
        Self: Sized;
    /// Non-blocking; false when full (the cache sets that watcher aside, to wait for it outside
    /// its lock within a time budget; not modelled here: no queue here is ever full).
    fn try_send(&self, d: Delivery) -> bool;
    fn recv(rx: &mut Self::Rx) -> impl std::future::Future<Output = Option<Delivery>> + Send;
    /// Takes what is queued without waiting.
    fn drain(rx: &mut Self::Rx) -> usize;
}

/// Today's: tokio's bounded mpsc channel.
struct Tokio(mpsc::Sender<Delivery>);

impl Queue for Tokio {
    type Rx = mpsc::Receiver<Delivery>;
    fn pair() -> (Self, Self::Rx) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Tokio(tx), rx)
    }
    fn try_send(&self, d: Delivery) -> bool {
        self.0.try_send(d).is_ok()
    }
    async fn recv(rx: &mut Self::Rx) -> Option<Delivery> {
        rx.recv().await
    }
    fn drain(rx: &mut Self::Rx) -> usize {
        let mut n = 0;
        while rx.try_recv().is_ok() {
            n += 1;
        }
        n
    }
}

/// The next frame from `pop`, waiting for `waker` when there is none; `None` once `closed`.
async fn pop_or_wait(
    waker: &AtomicWaker,
    closed: &AtomicBool,
    pop: impl Fn() -> Option<Delivery>,
) -> Option<Delivery> {
    poll_fn(|cx| {
        if let Some(d) = pop() {
            return Poll::Ready(Some(d));
        }
        waker.register(cx.waker());
        // Again after registering: a push between the first pop and the registration woke
        // nobody.
        match pop() {
            Some(d) => Poll::Ready(Some(d)),
            None if closed.load(Ordering::Acquire) => Poll::Ready(None),
            None => Poll::Pending,
        }
    })
    .await
}

/// The candidate: crossbeam's lock-free bounded queue and an `AtomicWaker`.
struct Shared {
    q: ArrayQueue<Delivery>,
    waker: AtomicWaker,
    closed: AtomicBool,
}

struct Crossbeam(Arc<Shared>);

impl Drop for Crossbeam {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.waker.wake();
    }
}

impl Queue for Crossbeam {
    type Rx = Arc<Shared>;
    fn pair() -> (Self, Self::Rx) {
        let s = Arc::new(Shared {
            q: ArrayQueue::new(QUEUE),
            waker: AtomicWaker::new(),
            closed: AtomicBool::new(false),
        });
        (Crossbeam(s.clone()), s)
    }
    fn try_send(&self, d: Delivery) -> bool {
        let ok = self.0.q.push(d).is_ok();
        self.0.waker.wake();
        ok
    }
    async fn recv(rx: &mut Self::Rx) -> Option<Delivery> {
        pop_or_wait(&rx.waker, &rx.closed, || rx.q.pop()).await
    }
    fn drain(rx: &mut Self::Rx) -> usize {
        let mut n = 0;
        while rx.q.pop().is_some() {
            n += 1;
        }
        n
    }
}

/// The candidate without preallocation: crossbeam's unbounded segmented queue (blocks of 31
/// slots, allocated as it grows, like tokio's channel), bounded by a counter, and an
/// `AtomicWaker`.
struct SegShared {
    q: SegQueue<Delivery>,
    len: AtomicUsize,
    waker: AtomicWaker,
    closed: AtomicBool,
}

struct Segmented(Arc<SegShared>);

impl Drop for Segmented {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.waker.wake();
    }
}

impl Queue for Segmented {
    type Rx = Arc<SegShared>;
    fn pair() -> (Self, Self::Rx) {
        let s = Arc::new(SegShared {
            q: SegQueue::new(),
            len: AtomicUsize::new(0),
            waker: AtomicWaker::new(),
            closed: AtomicBool::new(false),
        });
        (Segmented(s.clone()), s)
    }
    fn try_send(&self, d: Delivery) -> bool {
        // One writer per queue (the cache's lock): the check and the push need no CAS loop.
        if self.0.len.load(Ordering::Acquire) >= QUEUE {
            return false;
        }
        self.0.len.fetch_add(1, Ordering::AcqRel);
        self.0.q.push(d);
        self.0.waker.wake();
        true
    }
    async fn recv(rx: &mut Self::Rx) -> Option<Delivery> {
        let pop = |rx: &SegShared| {
            rx.q.pop().inspect(|_| {
                rx.len.fetch_sub(1, Ordering::AcqRel);
            })
        };
        pop_or_wait(&rx.waker, &rx.closed, || pop(rx)).await
    }
    fn drain(rx: &mut Self::Rx) -> usize {
        let mut n = 0;
        while rx.q.pop().is_some() {
            rx.len.fetch_sub(1, Ordering::AcqRel);
            n += 1;
        }
        n
    }
}

/// Resident bytes of this process (`/proc/self/statm`), 0 where there is none.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<usize>().ok()).unwrap_or(0) * 4096
}

/// What an idle watcher's queue costs in memory: `n` of them made, resident bytes per queue.
/// The queues are returned, to be dropped after every kind was measured (freed memory would be
/// reused by the next kind and hide its cost).
fn idle_bytes<Q: Queue>(n: usize) -> (usize, Vec<(Q, Q::Rx)>) {
    let before = rss();
    let pairs: Vec<(Q, Q::Rx)> = (0..n).map(|_| Q::pair()).collect();
    (rss().saturating_sub(before) / n, pairs)
}

fn frame() -> Delivery {
    Delivery { rv: 7, frame: Bytes::from(vec![b'x'; 2_600]) }
}

/// The writer's side alone: one frame into each queue, timed; the queues drained untimed.
fn send_only<Q: Queue>(watchers: usize, iters: u64) -> Duration {
    let (txs, mut rxs): (Vec<Q>, Vec<Q::Rx>) = (0..watchers).map(|_| Q::pair()).unzip();
    let d = frame();
    let mut timed = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let chunk = (iters - done).min(QUEUE as u64 / 2);
        let t = Instant::now();
        for _ in 0..chunk {
            for tx in &txs {
                assert!(tx.try_send(d.clone()), "full");
            }
        }
        timed += t.elapsed();
        for rx in &mut rxs {
            assert_eq!(Q::drain(rx), chunk as usize);
        }
        done += chunk;
    }
    timed
}

/// End to end: watcher tasks on a 2-worker runtime each await `per_watcher` frames; timed from
/// the first send to the last receipt. Sent in chunks of half a queue, each chunk received by
/// every watcher before the next (as a writer meets watchers that keep up: never a full queue).
fn deliver<Q: Queue>(rt: &tokio::runtime::Runtime, watchers: usize, per_watcher: u64) -> Duration {
    let (txs, rxs): (Vec<Q>, Vec<Q::Rx>) = (0..watchers).map(|_| Q::pair()).unzip();
    let received = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(watchers);
    for mut rx in rxs {
        let (received, started) = (received.clone(), started.clone());
        tasks.push(rt.spawn(async move {
            started.fetch_add(1, Ordering::Relaxed);
            for _ in 0..per_watcher {
                match Q::recv(&mut rx).await {
                    Some(d) => {
                        std::hint::black_box(d.frame.len());
                        received.fetch_add(1, Ordering::Release);
                    }
                    None => panic!("closed early"),
                }
            }
        }));
    }
    while started.load(Ordering::Relaxed) < watchers {
        std::thread::yield_now();
    }
    let d = frame();
    let t = Instant::now();
    let mut sent = 0;
    while sent < per_watcher {
        let chunk = (per_watcher - sent).min(QUEUE as u64 / 2);
        for _ in 0..chunk {
            for tx in &txs {
                assert!(tx.try_send(d.clone()), "a watcher fell a whole queue behind");
            }
        }
        sent += chunk;
        while received.load(Ordering::Acquire) < sent as usize * watchers {
            std::thread::yield_now();
        }
    }
    let elapsed = t.elapsed();
    for task in tasks {
        if let Err(e) = rt.block_on(task) {
            panic!("watcher: {e}");
        }
    }
    elapsed
}

fn watcher_queue(c: &mut Criterion) {
    // Memory, not time: printed beside the timings (criterion has no unit for it). First, while
    // the heap is fresh, so that what the queues allocate shows in the resident size.
    let n = support::size(10_000, 100);
    let (tokio_b, q1) = idle_bytes::<Tokio>(n);
    let (array_b, q2) = idle_bytes::<Crossbeam>(n);
    let (seg_b, q3) = idle_bytes::<Segmented>(n);
    println!(
        "watcher_queue/idle_bytes_per_queue ({n} queues of {QUEUE}): tokio_mpsc {tokio_b} B, \
         crossbeam_arrayqueue {array_b} B, crossbeam_segqueue {seg_b} B"
    );
    drop((q1, q2, q3));
    let mut g = c.benchmark_group("watcher_queue");
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).build() {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    };
    for watchers in [support::size(1_000, 10), support::size(10_000, 20)] {
        g.throughput(Throughput::Elements(watchers as u64));
        g.bench_with_input(BenchmarkId::new("send/tokio_mpsc", watchers), &watchers, |b, &w| {
            b.iter_custom(|iters| send_only::<Tokio>(w, iters))
        });
        g.bench_with_input(BenchmarkId::new("send/crossbeam_arrayqueue", watchers), &watchers, |b, &w| {
            b.iter_custom(|iters| send_only::<Crossbeam>(w, iters))
        });
        g.bench_with_input(BenchmarkId::new("send/crossbeam_segqueue", watchers), &watchers, |b, &w| {
            b.iter_custom(|iters| send_only::<Segmented>(w, iters))
        });
        g.bench_with_input(BenchmarkId::new("deliver/tokio_mpsc", watchers), &watchers, |b, &w| {
            b.iter_custom(|iters| deliver::<Tokio>(&rt, w, iters))
        });
        g.bench_with_input(BenchmarkId::new("deliver/crossbeam_arrayqueue", watchers), &watchers, |b, &w| {
            b.iter_custom(|iters| deliver::<Crossbeam>(&rt, w, iters))
        });
        g.bench_with_input(BenchmarkId::new("deliver/crossbeam_segqueue", watchers), &watchers, |b, &w| {
            b.iter_custom(|iters| deliver::<Segmented>(&rt, w, iters))
        });
    }
    g.finish();
}

type Map = imbl::OrdMap<String, Arc<Bytes>>;

fn map(n: usize) -> Map {
    (0..n).map(|i| (format!("ns-{}/pod-{i:06}", i % 50), Arc::new(Bytes::from(vec![b'x'; 64])))).collect()
}

/// A thread that keeps changing the map (as the reflector applies events) until `stop`.
fn churner(
    stop: Arc<AtomicBool>,
    mut apply: impl FnMut(u64) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            apply(i);
            i += 1;
            std::thread::sleep(Duration::from_micros(50));
        }
    })
}

fn snapshot(c: &mut Criterion) {
    let mut g = c.benchmark_group("snapshot");
    let n = support::size(10_000, 100);
    let key = move |i: u64| format!("ns-{}/pod-{:06}", i % 50, i % n as u64);
    g.throughput(Throughput::Elements(1));

    // Today: the map behind a parking_lot mutex, cloned under it.
    let locked = Arc::new(parking_lot::Mutex::new(map(n)));
    let stop = Arc::new(AtomicBool::new(false));
    let w = {
        let locked = locked.clone();
        churner(stop.clone(), move |i| {
            locked.lock().insert(key(i), Arc::new(Bytes::from_static(b"changed")));
        })
    };
    g.bench_function(BenchmarkId::new("parking_lot_mutex_clone", n), |b| {
        b.iter(|| std::hint::black_box(locked.lock().clone()))
    });
    stop.store(true, Ordering::Relaxed);
    let _ = w.join();

    // The candidate: an epoch-managed pointer to the current map; the writer publishes a new
    // version (copy-on-write) and defers the old one's destruction. The reader pins, loads and
    // clones the map out, to keep it across `.await`s.
    let current = Arc::new(crossbeam_epoch::Atomic::new(map(n)));
    let stop = Arc::new(AtomicBool::new(false));
    let w = {
        let current = current.clone();
        churner(stop.clone(), move |i| {
            let guard = crossbeam_epoch::pin();
            let old = current.load(Ordering::Acquire, &guard);
            // SAFETY: `old` was loaded under `guard` and is only destroyed through
            // `defer_destroy` after every guard that could see it is gone.
            let mut next = unsafe { old.deref() }.clone();
            next.insert(key(i), Arc::new(Bytes::from_static(b"changed")));
            let prev = current.swap(crossbeam_epoch::Owned::new(next), Ordering::AcqRel, &guard);
            // SAFETY: `prev` is unreachable from `current` now; readers pinned before the swap
            // keep it alive until they unpin.
            unsafe { guard.defer_destroy(prev) };
        })
    };
    g.bench_function(BenchmarkId::new("crossbeam_epoch_load_clone", n), |b| {
        b.iter(|| {
            let guard = crossbeam_epoch::pin();
            let m = current.load(Ordering::Acquire, &guard);
            // SAFETY: loaded under `guard`, which outlives this use.
            std::hint::black_box(unsafe { m.deref() }.clone())
        })
    });
    stop.store(true, Ordering::Relaxed);
    let _ = w.join();
    // SAFETY: no other thread holds the pointer any more (the churner has been joined).
    unsafe { drop(current.load(Ordering::Acquire, crossbeam_epoch::unprotected()).into_owned()) };
    g.finish();
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = watcher_queue, snapshot
}
criterion_main!(benches);
