//! Per-watcher delivery accounting: which of the writer's changes arrived, which twice, and
//! whether resourceVersions strictly increased.
//!
//! Pure bookkeeping, fed by `watchers` (one [`Tracker`] per watch client) and settled by the
//! phase runner against the writer's log ([`Tracker::lost`]). The writer numbers its changes
//! (`seq`, stamped in an annotation) so a watcher marks them in a bitset without consulting the
//! log while events stream in.

/// What one event turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A writer change of this phase, first time, in order.
    Fresh,
    /// A writer change of this phase, first time, but its RV is not above the previous event's.
    OutOfOrder,
    /// A writer change seen before, or an unstamped event repeating the previous RV.
    Duplicate,
    /// An event that is not a change of this phase (earlier phase, seeding), in order.
    Other,
}

/// Delivery state of one watch client.
#[derive(Debug, Default)]
pub struct Tracker {
    /// First writer sequence number of this phase; lower ones are not accounted.
    base: u64,
    /// Bit `s - base` is set once change `s` was seen.
    seen: Vec<u64>,
    /// RV of the last event accepted in order.
    last_rv: u64,
    /// Distinct writer changes of this phase received.
    pub received: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Events stamped with a sequence number no writer of this phase could have reached (more
    /// than [`MAX_SPAN`] past `base`): not accounted in the bitset, whose size a number read
    /// from the network would otherwise set.
    pub implausible: u64,
}

/// The most writer changes one phase accounts (a bitset of 8 MiB at most per watcher).
pub const MAX_SPAN: u64 = 1 << 26;

impl Tracker {
    /// A tracker whose watch starts after `start_rv` and accounts writer changes `base..`.
    pub fn new(base: u64, start_rv: u64) -> Tracker {
        Tracker { base, last_rv: start_rv, ..Tracker::default() }
    }

    pub fn last_rv(&self) -> u64 {
        self.last_rv
    }

    /// A bookmark at `rv`: later events must be above it (never moves backwards).
    pub fn bookmark(&mut self, rv: u64) {
        self.last_rv = self.last_rv.max(rv);
    }

    /// A relist answered at `rv` (the `restart` scenario's informers): the watch resumes there.
    /// A list older than what was already seen is time travel, counted out of order.
    pub fn relisted(&mut self, rv: u64) {
        if rv < self.last_rv {
            self.out_of_order += 1;
        }
        self.last_rv = rv;
    }

    /// Whether writer change `seq` of this phase arrived as an event.
    pub fn has(&self, seq: u64) -> bool {
        seq >= self.base && self.bit(seq)
    }

    fn bit(&self, seq: u64) -> bool {
        let i = (seq - self.base) as usize;
        self.seen.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn set(&mut self, seq: u64) {
        let i = (seq - self.base) as usize;
        if self.seen.len() <= i / 64 {
            self.seen.resize(i / 64 + 1, 0);
        }
        self.seen[i / 64] |= 1 << (i % 64);
    }

    /// Accounts one ADDED / MODIFIED / DELETED event with resourceVersion `rv`, stamped with the
    /// writer's `seq` when it is a writer change.
    pub fn observe(&mut self, rv: u64, seq: Option<u64>) -> Seen {
        let in_order = rv > self.last_rv;
        let seen = match seq {
            Some(s) if s >= self.base && s - self.base >= MAX_SPAN => {
                self.implausible += 1;
                Seen::Other
            }
            Some(s) if s >= self.base => {
                if self.bit(s) {
                    self.duplicated += 1;
                    return Seen::Duplicate;
                }
                self.set(s);
                self.received += 1;
                if in_order {
                    Seen::Fresh
                } else {
                    self.out_of_order += 1;
                    Seen::OutOfOrder
                }
            }
            _ if in_order => Seen::Other,
            _ if rv == self.last_rv => {
                self.duplicated += 1;
                Seen::Duplicate
            }
            _ => {
                self.out_of_order += 1;
                Seen::OutOfOrder
            }
        };
        if in_order {
            self.last_rv = rv;
        }
        seen
    }

    /// How many of the `expected` writer changes (sequence numbers of this phase that match
    /// this watcher's selector, ascending) arrived.
    pub fn arrived(&self, expected: impl IntoIterator<Item = u64>) -> u64 {
        expected.into_iter().filter(|&s| s >= self.base && self.bit(s)).count() as u64
    }

    /// How many of the `expected` writer changes (sequence numbers of this phase that match
    /// this watcher's selector) never arrived.
    pub fn lost(&self, expected: impl IntoIterator<Item = u64>) -> u64 {
        expected.into_iter().filter(|&s| s >= self.base && !self.bit(s)).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_stream_is_clean() {
        let mut t = Tracker::new(10, 100);
        assert_eq!(t.observe(101, Some(10)), Seen::Fresh);
        assert_eq!(t.observe(102, None), Seen::Other);
        assert_eq!(t.observe(105, Some(11)), Seen::Fresh);
        assert_eq!(t.observe(300, Some(200)), Seen::Fresh, "sparse sequence numbers grow the bitset");
        assert_eq!((t.received, t.duplicated, t.out_of_order), (3, 0, 0));
        assert_eq!(t.lost([10, 11, 200]), 0);
        assert_eq!(t.last_rv(), 300);
    }

    /// A sequence number read from the network cannot size the bitset: one past any phase's
    /// reach is counted apart, nothing allocated for it.
    #[test]
    fn an_implausible_sequence_number_allocates_nothing() {
        let mut t = Tracker::new(5, 0);
        assert_eq!(t.observe(1, Some(5 + MAX_SPAN)), Seen::Other);
        assert_eq!(t.observe(2, Some(u64::MAX)), Seen::Other);
        assert_eq!((t.implausible, t.received, t.seen.len()), (2, 0, 0));
        assert_eq!(t.observe(3, Some(6)), Seen::Fresh);
        assert_eq!((t.arrived([5, 6]), t.lost([5, 6])), (1, 1));
    }

    #[test]
    fn missing_changes_are_lost() {
        let mut t = Tracker::new(0, 0);
        t.observe(1, Some(0));
        t.observe(3, Some(2));
        assert_eq!(t.lost([0, 1, 2, 3]), 2);
        assert_eq!(t.lost([]), 0);
    }

    #[test]
    fn repeated_changes_are_duplicates_not_reorders() {
        let mut t = Tracker::new(0, 0);
        t.observe(1, Some(0));
        t.observe(2, Some(1));
        assert_eq!(t.observe(1, Some(0)), Seen::Duplicate, "a replay after a reconnect");
        assert_eq!(t.observe(2, None), Seen::Duplicate, "an unstamped event repeating the last RV");
        assert_eq!((t.received, t.duplicated, t.out_of_order), (2, 2, 0));
        assert_eq!(t.last_rv(), 2);
    }

    #[test]
    fn lower_rvs_are_out_of_order() {
        let mut t = Tracker::new(0, 0);
        t.observe(5, Some(1));
        assert_eq!(t.observe(4, Some(0)), Seen::OutOfOrder);
        assert_eq!(t.observe(3, None), Seen::OutOfOrder);
        assert_eq!(t.observe(6, Some(2)), Seen::Fresh);
        assert_eq!((t.received, t.duplicated, t.out_of_order), (3, 0, 2));
        assert_eq!(t.lost([0, 1, 2]), 0, "reordered changes still arrived");
    }

    #[test]
    fn bookmarks_and_relists_move_the_resume_point() {
        let mut t = Tracker::new(0, 10);
        t.bookmark(20);
        t.bookmark(15);
        assert_eq!(t.last_rv(), 20, "a bookmark never moves back");
        assert_eq!(t.observe(18, Some(0)), Seen::OutOfOrder);
        t.relisted(30);
        assert_eq!((t.last_rv(), t.out_of_order), (30, 1));
        t.relisted(25);
        assert_eq!((t.last_rv(), t.out_of_order), (25, 2), "a list older than what was seen");
        assert!(t.has(0) && !t.has(1));
    }

    #[test]
    fn earlier_phases_and_the_start_rv_are_not_accounted() {
        let mut t = Tracker::new(100, 50);
        assert_eq!(t.observe(50, None), Seen::Duplicate, "the start RV itself must not come back");
        assert_eq!(t.observe(51, Some(7)), Seen::Other, "a change of an earlier phase");
        assert_eq!(t.lost([5, 100]), 1, "only this phase's changes count");
    }
}
