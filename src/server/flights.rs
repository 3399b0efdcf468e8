//! Coalesced upstream reads that are fresh for every request sharing them: at most one read
//! per key in the air, and one queued behind it.
//!
//! A request may share a read only if that read was *sent* after the request arrived (then the
//! read's answer is at least as new as what the upstream had when the request arrived). So a
//! request that arrives while a read is already in the air waits for the next one, which is
//! sent the moment the current one lands; every request arriving meanwhile joins that same
//! next read. N concurrent requests cost at most two upstream reads, and none waits for more
//! than two. A read every request of which has gone (their clients reset) is cancelled: the
//! proxy makes these reads as itself, and none runs upstream for nobody.
//!
//! Used by `server::consistent` for consistent-read probes (one key) and for the initial lists
//! of watch-lists (keyed by namespace and selectors).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures_util::FutureExt;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

/// Where one read's answer goes; the requests sharing it subscribe. Only they count as its
/// receivers: once the last of them gives up (its client went away), the read is cancelled
/// ([`Flights::fly`]) — a caller opening and resetting requests with ever other keys must not
/// leave reads running upstream, under the proxy's identity, that nobody waits for.
type Answer<V> = Arc<watch::Sender<Option<V>>>;

struct Slot<V> {
    /// The read in the air: when it was sent, and where its answer goes.
    sent: Instant,
    current: Answer<V>,
    /// Requests that arrived after `current` was sent share this read; it is sent when
    /// `current` lands.
    next: Option<Answer<V>>,
}

/// Coalesced reads, by key.
pub struct Flights<K, V> {
    slots: Mutex<HashMap<K, Slot<V>>>,
}

impl<K, V> Default for Flights<K, V> {
    fn default() -> Self {
        Flights { slots: Mutex::new(HashMap::new()) }
    }
}

impl<K, V> Flights<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The answer of a read of `key` sent at or after `arrived`: joins the read in the air if
    /// it qualifies, else the queued one (queuing it if needed). `fetch` makes one read; it runs
    /// on a task of its own, so a caller that gives up does not cancel the others' read (the
    /// read is cancelled once no caller waits for it). `None` if the read's task died or the
    /// read was cancelled without an answer.
    pub async fn join<F, Fut>(self: &Arc<Self>, key: K, arrived: Instant, fetch: F) -> Option<V>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = V> + Send + 'static,
    {
        let mut rx = {
            let mut slots = self.slots.lock();
            match slots.get_mut(&key) {
                Some(slot) if slot.sent >= arrived => slot.current.subscribe(),
                Some(slot) => slot.next.get_or_insert_with(|| Arc::new(watch::channel(None).0)).subscribe(),
                None => {
                    let tx = Arc::new(watch::channel(None).0);
                    let rx = tx.subscribe();
                    tokio::spawn(self.clone().fly(key.clone(), tx.clone(), fetch));
                    slots.insert(key, Slot { sent: Instant::now(), current: tx, next: None });
                    rx
                }
            }
        };
        let answer = rx.wait_for(Option::is_some).await.ok()?;
        answer.clone()
    }

    /// Runs reads of `key` back to back while requests queue behind them; a read whose every
    /// request gave up is cancelled (dropped: its upstream request ends). A read that panics
    /// ends the slot: its requests and the queued ones get `None`, the next request a new slot.
    async fn fly<F, Fut>(self: Arc<Self>, key: K, mut tx: Answer<V>, fetch: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = V> + Send + 'static,
    {
        loop {
            let read = std::panic::AssertUnwindSafe(fetch()).catch_unwind();
            // Checked first: a queued read whose requests all left is never started.
            let v = tokio::select! {
                biased;
                _ = tx.closed() => None,
                v = read => Some(v),
            };
            let mut slots = self.slots.lock();
            let Some(slot) = slots.get_mut(&key) else { return };
            match v {
                Some(Err(_)) => {
                    slots.remove(&key);
                    return;
                }
                Some(Ok(v)) => {
                    tx.send_replace(Some(v));
                }
                // A request joined after the last one left (under this lock): read again
                // for it, sent now, which its arrival allows.
                None if tx.receiver_count() > 0 => {
                    slot.sent = Instant::now();
                    continue;
                }
                // Nobody waits for it: dropped. Its sender goes with the slot or is replaced
                // by the queued read's.
                None => {}
            }
            match slot.next.take() {
                Some(next) => {
                    slot.sent = Instant::now();
                    slot.current = next.clone();
                    tx = next;
                }
                None => {
                    slots.remove(&key);
                    return;
                }
            }
        }
    }

    /// Keys with a read in the air (tests, diagnostics).
    pub fn in_flight(&self) -> usize {
        self.slots.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A fetch that counts its calls and answers the call number after `delay`.
    fn counting(
        calls: Arc<AtomicUsize>,
        delay: Duration,
    ) -> impl Fn() -> futures_util::future::BoxFuture<'static, usize> {
        move || {
            let calls = calls.clone();
            Box::pin(async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(delay).await;
                n
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_share_only_reads_sent_after_they_arrived() {
        let f: Arc<Flights<&str, usize>> = Arc::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let fetch = counting(calls.clone(), Duration::from_millis(100));
        // Ten requests at once share one read.
        let t0 = Instant::now();
        let spawn = |arrived: Instant| {
            let f = f.clone();
            let fetch = counting(calls.clone(), Duration::from_millis(100));
            tokio::spawn(async move { f.join("k", arrived, fetch).await })
        };
        let first: Vec<_> = (0..10).map(|_| spawn(t0)).collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Requests arriving while it is in the air do not join it: they share the next one.
        let t1 = Instant::now();
        let later: Vec<_> = (0..10).map(|_| spawn(t1)).collect();
        for h in first {
            assert_eq!(h.await.unwrap(), Some(1));
        }
        for h in later {
            assert_eq!(h.await.unwrap(), Some(2));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "twenty requests, two reads");
        assert_eq!(f.in_flight(), 0);
        // Another key has its own reads.
        assert_eq!(f.join("other", Instant::now(), fetch).await, Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_arrived_before_the_send_joins_it() {
        let f: Arc<Flights<(), usize>> = Arc::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let arrived = Instant::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let a = tokio::spawn({
            let f = f.clone();
            let fetch = counting(calls.clone(), Duration::from_millis(50));
            async move { f.join((), Instant::now(), fetch).await }
        });
        tokio::task::yield_now().await;
        // Arrived before the read was sent: it may share it.
        assert_eq!(f.join((), arrived, counting(calls.clone(), Duration::from_millis(50))).await, Some(1));
        assert_eq!(a.await.unwrap(), Some(1));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// Counts the reads that ended without an answer (dropped: cancelled).
    struct Cancelled(Arc<AtomicUsize>, bool);

    impl Drop for Cancelled {
        fn drop(&mut self) {
            if !self.1 {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn cancellable(
        cancelled: Arc<AtomicUsize>,
    ) -> impl Fn() -> futures_util::future::BoxFuture<'static, usize> {
        move || {
            let cancelled = cancelled.clone();
            Box::pin(async move {
                let mut guard = Cancelled(cancelled, false);
                tokio::time::sleep(Duration::from_secs(10)).await;
                guard.1 = true;
                5
            })
        }
    }

    /// A caller resetting its requests (each with another key) leaves no read running that
    /// nobody waits for; a read some request still waits for goes on.
    #[tokio::test(start_paused = true)]
    async fn a_read_nobody_waits_for_any_more_is_cancelled() {
        let f: Arc<Flights<&str, usize>> = Arc::default();
        let cancelled = Arc::new(AtomicUsize::new(0));
        let spawn = |key: &'static str| {
            let (f, fetch) = (f.clone(), cancellable(cancelled.clone()));
            tokio::spawn(async move { f.join(key, Instant::now(), fetch).await })
        };
        let (gone, stays, shared) = (spawn("a"), spawn("b"), spawn("b"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(f.in_flight(), 2);
        gone.abort();
        stays.abort();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(cancelled.load(Ordering::SeqCst), 1, "a's read is cancelled, b's goes on");
        assert_eq!(f.in_flight(), 1);
        assert_eq!(shared.await.unwrap(), Some(5), "b's other request gets the answer");
        assert_eq!(cancelled.load(Ordering::SeqCst), 1);
        assert_eq!(f.in_flight(), 0);
        // A queued read nobody waits for any more is never sent.
        let (first, joined) = (spawn("c"), spawn("c"));
        tokio::time::sleep(Duration::from_millis(1)).await;
        let late = {
            let (f, fetch) = (f.clone(), cancellable(cancelled.clone()));
            tokio::spawn(async move { f.join("c", Instant::now(), fetch).await })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        late.abort();
        assert_eq!(first.await.unwrap(), Some(5));
        assert_eq!(joined.await.unwrap(), Some(5));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(f.in_flight(), 0, "the queued read was dropped, not sent");
        assert_eq!(cancelled.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_whose_task_died_is_replaced() {
        let f: Arc<Flights<(), usize>> = Arc::default();
        let h = tokio::spawn({
            let f = f.clone();
            async move {
                f.join((), Instant::now(), || async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    panic!("read failed hard")
                })
                .await
            }
        });
        assert_eq!(h.await.unwrap(), None, "the waiter learns the read is gone");
        assert_eq!(f.join((), Instant::now(), || async { 7 }).await, Some(7));
    }
}
