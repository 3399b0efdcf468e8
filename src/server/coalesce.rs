//! Deferred wake-ups for multiplexed connections: a connection task that is woken runs only
//! after the tasks already runnable on its worker (a `yield_now` first). When one event wakes
//! the many HTTP/2 streams of a connection, they all queue their DATA frames before the
//! connection task runs once for all of them, instead of once per stream.
//!
//! Without it, tokio runs a task woken by the running task next (the LIFO slot): each stream's
//! send woke its connection, which ran a full poll (stream store, flow control, flush) for that
//! one frame. Measured with 10 000 watches on 100 connections: 12 % less CPU and p99 delivery
//! lag 655 → 176 ms in a paired run. After each poll it runs the connection's
//! `batch::Flusher`, so the frames of all those streams leave in one write. Used by
//! `server::listener` for HTTP/2 connections only (HTTP/1 has one response per connection:
//! nothing to share).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

use super::batch::Flusher;

type Yield = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Writes out what a poll of the connection buffered (`batch::Flusher`, type-erased).
pub trait FlushAfterPoll: Send {
    fn flush_after_poll(&self, cx: &mut Context<'_>);
}

impl<T: AsyncWrite + Unpin + Send> FlushAfterPoll for Flusher<T> {
    fn flush_after_poll(&self, cx: &mut Context<'_>) {
        // Pending: the socket wakes this task when it can take more. An error is kept by the
        // batch and fails the connection's next write.
        if let Poll::Ready(Err(e)) = self.poll_flush(cx) {
            tracing::debug!(error = %e, "connection write failed");
        }
    }
}

/// A future whose every wake-up is deferred behind the runnable tasks.
pub struct Coalesce<F> {
    inner: Pin<Box<F>>,
    /// The pending deferral: woken spuriously meanwhile, the inner future is not polled.
    deferral: Option<Yield>,
    /// The first poll runs at once (nothing to coalesce yet).
    started: bool,
    /// Runs after every poll of `inner`.
    flusher: Option<Box<dyn FlushAfterPoll>>,
}

impl<F: Future> Coalesce<F> {
    pub fn new(inner: F) -> Self {
        Coalesce { inner: Box::pin(inner), deferral: None, started: false, flusher: None }
    }

    /// Writes out the connection's batched writes after each of its polls.
    pub fn flushing(mut self, flusher: Box<dyn FlushAfterPoll>) -> Self {
        self.flusher = Some(flusher);
        self
    }
}

impl<F: Future> Future for Coalesce<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        if this.started {
            let deferral = this.deferral.get_or_insert_with(|| Box::pin(tokio::task::yield_now()));
            if deferral.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.deferral = None;
        }
        this.started = true;
        let out = this.inner.as_mut().poll(cx);
        if let Some(f) = &this.flusher {
            f.flush_after_poll(cx);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// `seen` gets how many of 10 runnable tasks had run when the waiter resumed, the waiter
    /// being woken from a task on the (single) worker, as a stream wakes its connection.
    async fn run(coalesce: bool) -> usize {
        let done = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicUsize::new(usize::MAX));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (d, s) = (done.clone(), seen.clone());
        let body = async move {
            rx.recv().await;
            s.store(d.load(Ordering::SeqCst), Ordering::SeqCst);
        };
        let waiter = if coalesce { tokio::spawn(Coalesce::new(body)) } else { tokio::spawn(body) };
        let d = done.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await; // the waiter is parked on rx
            for _ in 0..10 {
                let d = d.clone();
                tokio::spawn(async move {
                    d.fetch_add(1, Ordering::SeqCst);
                });
            }
            tx.send(()).unwrap(); // wakes the waiter from a worker while the 10 are runnable
        })
        .await
        .unwrap();
        waiter.await.unwrap();
        seen.load(Ordering::SeqCst)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_woken_connection_runs_after_the_runnable_tasks() {
        assert_eq!(run(true).await, 10, "deferred behind all runnable tasks");
        // Without it the waker's LIFO slot runs the connection first (what this module fixes).
        assert!(run(false).await < 10);
    }

    #[tokio::test]
    async fn output_passes_through() {
        assert_eq!(Coalesce::new(async { 7 }).await, 7);
    }
}
