//! Seats for SubjectAccessReviews in the air, shared in turn between those waiting: a freed seat
//! goes to the next *key* (a user at an address, as the review rate is counted) that has a check
//! waiting, round robin, not to the check that has waited longest. One caller with a hundred
//! distinct checks queued (its burst) then delays another caller's single check by one review,
//! not by its hundred — as API Priority and Fairness shares a level's seats between flows.
//!
//! A wait is bounded by the caller (`None` past it); a waiter that gives up, or is dropped
//! after a seat was handed to it, never keeps one.
//!
//! Taken by `authz::Authorizer::check`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// See the module doc.
pub struct FairSeats {
    state: Arc<Mutex<State>>,
}

struct State {
    free: usize,
    /// Each key's waiters, oldest first (some may have given up: skipped when their turn comes).
    queues: HashMap<String, VecDeque<oneshot::Sender<()>>>,
    /// The keys with waiters, in the order their turns come.
    turns: VecDeque<String>,
}

/// A seat; given to the next in turn (or back) when dropped.
pub struct Seat {
    state: Arc<Mutex<State>>,
}

impl FairSeats {
    pub fn new(seats: usize) -> FairSeats {
        let state = State { free: seats, queues: HashMap::new(), turns: VecDeque::new() };
        FairSeats { state: Arc::new(Mutex::new(state)) }
    }

    /// A seat for `key`, at once or in its turn within `wait`; `None` past it.
    pub async fn take(&self, key: &str, wait: Duration) -> Option<Seat> {
        let rx = {
            let mut st = self.state.lock();
            if st.free > 0 && st.turns.is_empty() {
                st.free -= 1;
                return Some(Seat { state: self.state.clone() });
            }
            let (tx, rx) = oneshot::channel();
            let st = &mut *st;
            // A key has a turn exactly while it has a queue (`release` drops both together), even
            // one whose waiters all gave up: a key takes no second turn by giving up and
            // coming back.
            if !st.queues.contains_key(key) {
                st.turns.push_back(key.to_owned());
            }
            let queue = st.queues.entry(key.to_owned()).or_default();
            queue.retain(|w| !w.is_closed());
            queue.push_back(tx);
            rx
        };
        let mut waiting = Waiting { rx, state: &self.state, seated: false };
        if let Ok(Ok(())) = tokio::time::timeout(wait, &mut waiting.rx).await {
            waiting.seated = true;
            return Some(Seat { state: self.state.clone() });
        }
        None
    }

    /// Seats free now (tests and metrics).
    pub fn free(&self) -> usize {
        self.state.lock().free
    }
}

/// A waiter in a queue; when dropped without its seat, a seat handed to it meanwhile goes on.
struct Waiting<'a> {
    rx: oneshot::Receiver<()>,
    state: &'a Arc<Mutex<State>>,
    seated: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.seated {
            return;
        }
        self.rx.close();
        if self.rx.try_recv().is_ok() {
            release(self.state);
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        release(&self.state);
    }
}

/// A seat freed: to the next key in turn that still has a waiter, or back to the free ones.
fn release(state: &Mutex<State>) {
    let mut st = state.lock();
    let st = &mut *st;
    while let Some(key) = st.turns.pop_front() {
        let Some(queue) = st.queues.get_mut(&key) else { continue };
        let next = queue.pop_front();
        if queue.is_empty() {
            st.queues.remove(&key);
        } else {
            st.turns.push_back(key);
        }
        // A waiter that gave up has closed its end: the seat goes on to the next.
        if next.is_some_and(|tx| tx.send(()).is_ok()) {
            return;
        }
    }
    st.free += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    const LONG: Duration = Duration::from_secs(60);

    /// A waiter for `key`, started (queued) in its own task.
    fn waiter(seats: &Arc<FairSeats>, key: &'static str) -> tokio::task::JoinHandle<Option<Seat>> {
        let seats = seats.clone();
        tokio::spawn(async move { seats.take(key, LONG).await })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_seat_goes_to_the_next_key_in_turn_not_to_the_longest_waiting_check() {
        let seats = Arc::new(FairSeats::new(2));
        let held_a = [seats.take("a", LONG).await.unwrap(), seats.take("a", LONG).await.unwrap()];
        let (a1, a2, a3) = (waiter(&seats, "a"), waiter(&seats, "a"), waiter(&seats, "a"));
        settle().await;
        let b = waiter(&seats, "b");
        settle().await;
        let [first, second] = held_a;
        drop(first);
        settle().await;
        assert!(a1.is_finished(), "a's first waiter has the first turn");
        assert!(!b.is_finished());
        drop(second);
        settle().await;
        assert!(b.is_finished(), "b's one check comes before a's two others");
        assert!(!a2.is_finished() && !a3.is_finished());
        let seated_a1 = a1.await.unwrap().expect("seated");
        drop(seated_a1);
        settle().await;
        assert!(a2.is_finished(), "then a's, in order");
        assert!(!a3.is_finished());
        assert_eq!(seats.free(), 0);
    }

    /// A caller that gives up its waiting checks and sends new ones keeps one turn, not one
    /// per time it came back.
    #[tokio::test(start_paused = true)]
    async fn giving_up_and_coming_back_takes_no_extra_turn() {
        let seats = Arc::new(FairSeats::new(1));
        let held = seats.take("x", LONG).await.unwrap();
        for _ in 0..5 {
            assert!(seats.take("a", Duration::from_secs(1)).await.is_none());
        }
        let (a, b) = (waiter(&seats, "a"), waiter(&seats, "b"));
        settle().await;
        let turns = seats.state.lock().turns.clone();
        assert_eq!(turns.len(), 2, "one turn each: {turns:?}");
        drop(held);
        settle().await;
        assert!(a.is_finished() && !b.is_finished());
        drop(a.await.unwrap());
        settle().await;
        assert!(b.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_keeps_no_seat() {
        let seats = FairSeats::new(1);
        let held = seats.take("a", LONG).await.unwrap();
        assert!(seats.take("b", Duration::from_secs(5)).await.is_none(), "none within its wait");
        drop(held);
        assert_eq!(seats.free(), 1, "the seat back, not handed to the one gone");
        let again = seats.take("c", Duration::ZERO).now_or_never().expect("at once");
        assert!(again.is_some());
        assert_eq!(seats.free(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_seat_handed_to_a_waiter_dropped_before_it_woke_goes_on() {
        let seats = Arc::new(FairSeats::new(1));
        let held = seats.take("a", LONG).await.unwrap();
        let mut gone = Box::pin(seats.take("b", LONG));
        assert!((&mut gone).now_or_never().is_none(), "queued");
        let next = waiter(&seats, "c");
        settle().await;
        drop(held); // handed to b, which has not run since
        drop(gone);
        settle().await;
        assert!(next.is_finished(), "c seated");
        let seated = next.await.unwrap();
        assert!(seated.is_some());
        drop(seated);
        assert_eq!(seats.free(), 1, "one seat, never more");
    }
}
