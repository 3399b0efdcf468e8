//! The end of one event's dispatch: deliveries that did not fit a watcher's queue wait, outside
//! the cache lock, for at most the writer's shared time budget (as the apiserver's
//! `dispatchEvent`: every blocked watcher gets its chance while the timer runs; once it fires
//! the rest are closed without waiting). A watcher that drains in time keeps its stream and
//! gets the event in order; one that does not is closed (stream ends; counted as terminated).
//!
//! Returned by `Writer::apply`; the reflector awaits [`Fanout::finish`]. Dropping it
//! unfinished closes the blocked watchers at once (no budget). Until it ends, watchers'
//! BOOKMARKs stay at the previous RV, so a bookmark never overtakes an undelivered event.

use std::sync::atomic::Ordering;

use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

use super::watchers::{Blocked, WatcherId};
use super::Writer;
use crate::resource::Rv;

/// One applied event whose delivery may still be pending for some watchers.
pub struct Fanout<'w> {
    pub(super) writer: &'w mut Writer,
    pub(super) rv: Rv,
    /// Still to deliver, in reverse order of dispatch (popped from the end).
    pub(super) blocked: Vec<Blocked>,
    /// The watcher whose delivery is being awaited (closed if the wait is cancelled).
    pub(super) in_flight: Option<WatcherId>,
}

impl<'w> Fanout<'w> {
    pub(super) fn new(writer: &'w mut Writer, rv: Rv, mut blocked: Vec<Blocked>) -> Self {
        blocked.reverse();
        Fanout { writer, rv, blocked, in_flight: None }
    }

    /// How many watchers had a full queue when the event was applied.
    pub fn blocked(&self) -> usize {
        self.blocked.len()
    }

    /// Delivers to the blocked watchers within the time budget; closes those that stay full.
    pub async fn finish(mut self) {
        if self.blocked.is_empty() {
            return;
        }
        let start = Instant::now();
        let available = self.writer.budget.take_available(start);
        let deadline = start + available;
        let mut fired = available.is_zero();
        let mut slow = Vec::new();
        let mut late = 0u64;
        while let Some(b) = self.blocked.pop() {
            let delivery = match b.tx.try_send(b.delivery) {
                Ok(()) => {
                    late += 1;
                    continue;
                }
                Err(TrySendError::Closed(_)) => continue,
                Err(TrySendError::Full(d)) => d,
            };
            if fired {
                slow.push(b.id);
                continue;
            }
            self.in_flight = Some(b.id);
            let sent = tokio::time::timeout_at(deadline, b.tx.send(delivery)).await;
            let id = self.in_flight.take();
            match sent {
                Err(_) => {
                    fired = true;
                    slow.extend(id);
                }
                Ok(Ok(())) => late += 1,
                Ok(Err(_)) => {}
            }
        }
        let used = Instant::now().saturating_duration_since(start);
        self.writer.budget.return_unused(available.saturating_sub(used));
        if !slow.is_empty() || late > 0 {
            let mut st = self.writer.shared.state.lock();
            st.watchers.add_delivered(late);
            if !slow.is_empty() {
                st.watchers.terminate(slow);
            }
        }
    }
}

impl Drop for Fanout<'_> {
    fn drop(&mut self) {
        let unfinished: Vec<WatcherId> =
            self.in_flight.take().into_iter().chain(self.blocked.drain(..).map(|b| b.id)).collect();
        if !unfinished.is_empty() {
            self.writer.shared.state.lock().watchers.terminate(unfinished);
        }
        self.writer.shared.dispatched.store(self.rv.0, Ordering::Release);
    }
}
