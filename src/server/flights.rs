//! Coalesced upstream reads that are fresh for every request sharing them: at most one read
//! per key in the air, and one queued behind it.
//!
//! A request may share a read only if that read was *sent* after the request arrived (then the
//! read's answer is at least as new as what the upstream had when the request arrived). So a
//! request that arrives while a read is already in the air waits for the next one, which is
//! sent the moment the current one lands; every request arriving meanwhile joins that same
//! next read. N concurrent requests cost at most two upstream reads, and none waits for more
//! than two.
//!
//! Used by `server::consistent` for consistent-read probes (one key) and for the initial lists
//! of watch-lists (keyed by namespace and selectors).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

type Result<V> = watch::Receiver<Option<V>>;

struct Slot<V> {
    /// The read in the air: when it was sent, and where its answer goes.
    sent: Instant,
    current: Result<V>,
    /// Requests that arrived after `current` was sent share this read; it is sent when
    /// `current` lands.
    next: Option<(watch::Sender<Option<V>>, Result<V>)>,
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
    /// on a task of its own, so a caller that gives up does not cancel the others' read.
    /// `None` if the read's task died without an answer.
    pub async fn join<F, Fut>(self: &Arc<Self>, key: K, arrived: Instant, fetch: F) -> Option<V>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = V> + Send + 'static,
    {
        let mut rx = {
            let mut slots = self.slots.lock();
            // A slot whose task died (its sender is gone) is replaced.
            if slots.get(&key).is_some_and(|s| s.current.has_changed().is_err()) {
                slots.remove(&key);
            }
            match slots.get_mut(&key) {
                Some(slot) if slot.sent >= arrived => slot.current.clone(),
                Some(slot) => match &slot.next {
                    Some((_, rx)) => rx.clone(),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        slot.next = Some((tx, rx.clone()));
                        rx
                    }
                },
                None => {
                    let (tx, rx) = watch::channel(None);
                    let slot = Slot { sent: Instant::now(), current: rx.clone(), next: None };
                    slots.insert(key.clone(), slot);
                    tokio::spawn(self.clone().fly(key, tx, fetch));
                    rx
                }
            }
        };
        let answer = rx.wait_for(Option::is_some).await.ok()?;
        answer.clone()
    }

    /// Runs reads of `key` back to back while requests queue behind them.
    async fn fly<F, Fut>(self: Arc<Self>, key: K, mut tx: watch::Sender<Option<V>>, fetch: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = V> + Send + 'static,
    {
        loop {
            let v = fetch().await;
            tx.send_replace(Some(v));
            let mut slots = self.slots.lock();
            let Some(slot) = slots.get_mut(&key) else { return };
            match slot.next.take() {
                Some((next_tx, next_rx)) => {
                    slot.sent = Instant::now();
                    slot.current = next_rx;
                    tx = next_tx;
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
