//! The buffers a full list's objects are slices of (a LIST page's body, about 500 objects; a
//! state file's block of bodies at a warm start), and giving them back when few of their
//! objects are left: one object that never changes keeps its whole page alive (~1 MB for
//! 500 configmaps), long after its 499 neighbours were superseded and left the history, and
//! none of it is counted by `--cache-memory-limit` but that object's own bytes.
//!
//! [`Pages::of`] records where the objects of a list lie (the address range of each page's
//! run of bodies, told apart in list order: the next page's first body does not start just
//! after the previous body); the writer tells [`Pages::superseded`]
//! of every listed version it replaces or deletes, and once a quarter of the regions' bytes
//! is superseded, [`Pages::plan`] walks the store: the objects of a region less than
//! [`KEEP_NUM`]/[`KEEP_DEN`] live are copied into buffers of their own
//! ([`Object::compacted`](crate::resource::Object::compacted): the same bytes and header, the
//! lazily made forms let go), so the region is freed once the history lets go of its
//! superseded versions. What a region keeps beyond its live objects is [`Pages::waste`],
//! counted with the cache's objects (`cache::memory`).
//!
//! The regions are only address ranges, never dereferenced: an object lies in one if its
//! body starts inside it. A region whose page was freed may later hold a newer object's
//! buffer; that object is then counted live there (the region looks fuller) or copied once
//! more, and its replacement counted as superseded — never wrong bytes, at worst a copy made
//! for nothing or a count a little high until the next pass.
//!
//! Owned by `cache::Writer` (`replace`, `restore`, `apply`); pure but for the copies.

use std::sync::Arc;

use bytes::Bytes;

use super::Store;
use crate::resource::{Object, ObjectKey};

/// In list order, an object whose body starts less than this after the previous one's end
/// is in the same page (a compact list's items are 1–2 bytes apart: `,` or `,{`; a state
/// block's bodies 0); the next page starts after its own list envelope (its `kind`,
/// `apiVersion`, `metadata`, more than this) or elsewhere. Bodies in allocations of their own
/// are at least 8 bytes apart even when the allocator puts them side by side (glibc's chunk
/// header), so they never make a page.
const GAP: usize = 8;

/// A region is kept while at least `KEEP_NUM / KEEP_DEN` of its bytes are live objects'.
pub const KEEP_NUM: usize = 2;
pub const KEEP_DEN: usize = 3;

/// Regions totalling less are not worth a pass over the store (what they may waste is small).
const MIN_PASS: usize = 64 << 10;

/// Address range `[start, end)` of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Region {
    start: usize,
    end: usize,
}

impl Region {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// The regions of the current list generation (see the module doc).
#[derive(Debug, Default)]
pub struct Pages {
    /// Sorted by `start`, disjoint.
    regions: Vec<Region>,
    /// Their bytes.
    total: usize,
    /// Bytes of listed versions replaced or deleted since the last pass.
    superseded: usize,
    /// Bytes the kept regions held beyond their live objects at the last pass.
    kept_waste: usize,
    /// Objects a pass found in regions to give back, still to copy (last first), each as the
    /// store held it then.
    pending: Vec<(ObjectKey, Arc<Object>)>,
}

fn range(body: &Bytes) -> (usize, usize) {
    let start = body.as_ptr() as usize;
    (start, start + body.len())
}

impl Pages {
    /// The regions the bodies of `objects`, in list order, lie in: a run of bodies each
    /// starting just after the one before is a page. A run of one object is left out (a page
    /// of one object keeps nothing but itself; an object in a buffer of its own is no page).
    pub fn of<'a>(objects: impl Iterator<Item = &'a Object>) -> Pages {
        let mut runs: Vec<(Region, usize)> = Vec::new();
        for o in objects {
            let (start, end) = range(&o.body);
            match runs.last_mut() {
                Some((r, n)) if start >= r.end && start - r.end < GAP => {
                    r.end = end;
                    *n += 1;
                }
                _ => runs.push((Region { start, end }, 1)),
            }
        }
        let mut pages: Vec<Region> = runs.into_iter().filter(|(_, n)| *n > 1).map(|(r, _)| r).collect();
        pages.sort_unstable_by_key(|r| r.start);
        // Disjoint, whatever the order was.
        let mut regions: Vec<Region> = Vec::with_capacity(pages.len());
        for p in pages {
            match regions.last_mut() {
                Some(r) if p.start < r.end => r.end = r.end.max(p.end),
                _ => regions.push(p),
            }
        }
        let total = regions.iter().map(Region::len).sum();
        Pages { regions, total, superseded: 0, kept_waste: 0, pending: Vec::new() }
    }

    /// The region `body` lies in.
    fn region_of(&self, body: &Bytes) -> Option<usize> {
        let at = body.as_ptr() as usize;
        let i = self.regions.partition_point(|r| r.start <= at).checked_sub(1)?;
        (at < self.regions[i].end).then_some(i)
    }

    /// A version was replaced or deleted; true when enough of the regions is superseded that
    /// a pass ([`Pages::plan`]) is due.
    pub fn superseded(&mut self, old: &Object) -> bool {
        if self.regions.is_empty() || self.region_of(&old.body).is_none() {
            return false;
        }
        self.superseded += old.body.len();
        self.total >= MIN_PASS && self.superseded >= self.total / 4
    }

    /// Bytes the regions keep beyond their live objects (an estimate between passes: what
    /// was superseded since the last one counts whole, even if its region was freed).
    pub fn waste(&self) -> usize {
        self.kept_waste + self.superseded
    }

    /// A pass over `store`: the objects to copy out of their regions (those less than
    /// `KEEP_NUM / KEEP_DEN` live) become pending ([`Pages::take_pending`]), those regions and
    /// those with no live object left are forgotten; the counts start again. Returns how many
    /// objects and bytes are to be copied.
    pub fn plan(&mut self, store: &Store) -> (usize, usize) {
        let mut live = vec![0usize; self.regions.len()];
        let mut members: Vec<(usize, &ObjectKey, &Arc<Object>)> = Vec::new();
        for (k, o) in store.iter() {
            if let Some(i) = self.region_of(&o.body) {
                live[i] += o.body.len();
                members.push((i, k, o));
            }
        }
        let sparse = |i: usize| live[i] == 0 || live[i] * KEEP_DEN < self.regions[i].len() * KEEP_NUM;
        let mut copy: Vec<(ObjectKey, Arc<Object>)> = members
            .into_iter()
            .filter(|(i, _, _)| sparse(*i))
            .map(|(_, k, o)| (k.clone(), o.clone()))
            .collect();
        copy.reverse();
        let mut kept = Vec::with_capacity(self.regions.len());
        let mut waste = 0;
        for (i, r) in self.regions.iter().enumerate() {
            if !sparse(i) {
                kept.push(*r);
                waste += r.len() - live[i].min(r.len());
            }
        }
        self.total = kept.iter().map(Region::len).sum();
        self.regions = kept;
        self.superseded = 0;
        self.kept_waste = waste;
        let planned = (copy.len(), copy.iter().map(|(_, o)| o.body.len()).sum());
        self.pending.extend(copy);
        planned
    }

    /// Up to `n` pending objects to copy (in key order), each as the store held it at the pass:
    /// one changed or deleted since is no longer to be copied.
    pub fn take_pending(&mut self, n: usize) -> Vec<(ObjectKey, Arc<Object>)> {
        let keep = self.pending.len().saturating_sub(n);
        let mut taken = self.pending.split_off(keep);
        taken.reverse();
        taken
    }

    /// Objects still to copy (for tests).
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Bytes of the regions recorded.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Regions recorded (for tests).
    #[cfg(test)]
    pub fn regions(&self) -> usize {
        self.regions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{typing, ResourceKind};

    fn kind() -> ResourceKind {
        ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true)
    }

    /// Groups of configmaps (first index, how many, bytes of data each), every object a slice
    /// of one buffer, the groups 64 KiB apart in it (pages, at known addresses).
    fn pages(groups: &[(usize, usize, usize)]) -> Vec<Vec<Object>> {
        let k = kind();
        let mut buf = Vec::new();
        let mut spans = Vec::new();
        for &(from, n, size) in groups {
            if !buf.is_empty() {
                buf.extend(std::iter::repeat_n(b' ', 64 << 10));
            }
            let mut span = Vec::new();
            for i in from..from + n {
                let it = format!(
                    r#"{{"metadata":{{"name":"c{i:05}","namespace":"ns","resourceVersion":"{}"}},"data":{{"k":"{}"}}}}"#,
                    i + 1,
                    "x".repeat(size)
                );
                span.push((buf.len(), buf.len() + it.len()));
                buf.extend_from_slice(it.as_bytes());
                buf.push(b',');
            }
            spans.push(span);
        }
        let buf = Bytes::from(buf);
        spans
            .into_iter()
            .map(|span| {
                span.into_iter()
                    .map(|(a, b)| Object::parse(&k, &typing(&k), buf.slice(a..b)).unwrap())
                    .collect()
            })
            .collect()
    }

    fn store(objects: &[Arc<Object>]) -> Store {
        let mut s = Store::new();
        for o in objects {
            s.insert(o.header.key.clone(), o.clone());
        }
        s
    }

    #[test]
    fn a_page_is_one_region_and_pages_apart_are_two() {
        let groups = pages(&[(0, 100, 100), (100, 100, 100)]);
        let (xs, ys) = (&groups[0], &groups[1]);
        assert_eq!(Pages::of(xs.iter().chain(ys.iter())).regions(), 2);
        let one = Pages::of(xs.iter());
        assert_eq!(one.regions(), 1);
        assert!(one.region_of(&xs[57].body).is_some());
        assert!(one.region_of(&ys[0].body).is_none(), "64 KiB further");
        assert!(one.region_of(&Bytes::from(vec![1u8; 10])).is_none(), "another buffer");
        assert!(Pages::of(std::iter::empty()).region_of(&xs[0].body).is_none());
        // Pages side by side in memory are still two: the second's first item comes after
        // its list envelope. Objects in buffers of their own make no region.
        let k = kind();
        let item =
            |i: usize| format!(r#"{{"metadata":{{"name":"c{i}","namespace":"ns","resourceVersion":"1"}}}}"#);
        let env =
            r#"]},{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":["#;
        // The first `n` items, parsed as slices of one buffer holding `text`.
        let sliced = |text: String, n: usize| -> Vec<Object> {
            let buf = Bytes::from(text.clone());
            (0..n)
                .map(|i| {
                    let at = text.find(&item(i)).unwrap();
                    Object::parse(&k, &typing(&k), buf.slice(at..at + item(i).len())).unwrap()
                })
                .collect()
        };
        let objects =
            sliced([item(0), ",".into(), item(1), env.into(), item(2), ",".into(), item(3)].concat(), 4);
        let two = Pages::of(objects.iter());
        assert_eq!(two.regions(), 2);
        assert_ne!(two.region_of(&objects[1].body), two.region_of(&objects[2].body));
        let own: Vec<Object> = objects.iter().map(Object::compacted).collect();
        assert_eq!(Pages::of(own.iter()).regions(), 0);
        // Buffers of their own side by side, as the allocator may place them (8 bytes apart at
        // the least): no page either, whatever the heap's layout.
        let side = sliced([item(0), "\0".repeat(8), item(1), "\0".repeat(8), item(2)].concat(), 3);
        assert_eq!(Pages::of(side.iter()).regions(), 0);
    }

    #[test]
    fn a_pass_copies_the_objects_of_a_sparse_region_and_keeps_a_full_one() {
        // Two pages of ~1.1 MB each.
        let mut groups = pages(&[(0, 1000, 1000), (1000, 1000, 1000)]);
        let ys: Vec<Arc<Object>> = groups.pop().unwrap().into_iter().map(Arc::new).collect();
        let xs: Vec<Arc<Object>> = groups.pop().unwrap().into_iter().map(Arc::new).collect();
        let mut pages = Pages::of(xs.iter().chain(ys.iter()).map(|o| o.as_ref()));
        assert_eq!(pages.regions(), 2);
        // 900 of the first page's objects superseded, 100 of the second's: the pass is due
        // at a quarter of the whole (~500 objects).
        let mut due_at = None;
        for (n, o) in xs.iter().take(900).chain(ys.iter().take(100)).enumerate() {
            if pages.superseded(o) && due_at.is_none() {
                due_at = Some(n + 1);
            }
        }
        let due_at = due_at.expect("a pass is due");
        assert!((490..=510).contains(&due_at), "due after {due_at} objects");
        let bytes = |os: &[Arc<Object>]| os.iter().map(|o| o.body.len()).sum::<usize>();
        assert_eq!(pages.waste(), bytes(&xs[..900]) + bytes(&ys[..100]));
        let mut live: Vec<Arc<Object>> = xs[900..].to_vec();
        live.extend(ys[100..].iter().cloned());
        let planned = pages.plan(&store(&live));
        assert_eq!(planned, (100, bytes(&xs[900..])));
        let mut copy = pages.take_pending(60);
        copy.extend(pages.take_pending(60));
        assert_eq!(pages.pending(), 0);
        // Only the first page's survivors are copied (10 % live), in key order; the second
        // (90 %) stays.
        assert_eq!(copy.len(), 100);
        assert!(copy.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(copy.iter().all(|(k, o)| xs[900..].iter().any(|x| Arc::ptr_eq(x, o) && &x.header.key == k)));
        assert_eq!(pages.regions(), 1);
        let second = pages.regions[0];
        assert!(pages.region_of(&ys[0].body).is_some() && pages.region_of(&xs[950].body).is_none());
        assert_eq!(pages.waste(), second.len() - bytes(&ys[100..]));
        // The copied region is forgotten: superseding its objects counts nothing.
        assert!(!pages.superseded(&xs[950]));
        assert_eq!(pages.waste(), second.len() - bytes(&ys[100..]));
    }

    #[test]
    fn a_region_with_nothing_left_is_forgotten_and_small_lists_make_no_pass() {
        let xs = pages(&[(0, 100, 100)]).pop().unwrap();
        let mut pages = Pages::of(xs.iter());
        assert!(xs.iter().all(|o| !pages.superseded(o)), "under MIN_PASS: never due");
        assert_eq!(pages.plan(&Store::new()), (0, 0));
        assert!(pages.take_pending(10).is_empty());
        assert_eq!((pages.regions(), pages.waste()), (0, 0));
        assert!(!pages.superseded(&xs[0]), "nothing recorded any more");
    }
}
