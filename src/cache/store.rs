//! The store: one resource's current objects by key, a persistent ordered map (`imbl`'s B+tree,
//! clones are O(1) snapshots). Owns how it is built from a complete list ([`filled`]: the first
//! sync, every relist, a warm restart's base) and how one version replaces another
//! ([`upsert`]). Called by `cache::Writer::replace`, `cache::Writer::apply` and `cache::persist`.

use std::sync::Arc;

use crate::resource::{Object, ObjectKey};

/// The current objects, ordered by key; clones are O(1) snapshots.
pub type Store = imbl::OrdMap<ObjectKey, Arc<Object>>;

/// A store holding `objects` (a later object of the same key replaces an earlier one, as
/// inserting them in order would), its leaves full when they come in key order, as a list's do.
///
/// The B+tree splits a full leaf in halves, so keys inserted in order leave every leaf half
/// full (8 of 16 entries: ~54 B per object of leaves for a `(key, pointer)` entry of 24 B). In
/// key order, the objects are put in in two passes, every other one first (the leaves then hold
/// 8 keys spread over 16 of the list's), then the ones between, each of which lands in a leaf
/// with room: leaves are full (~27 B per object). Nothing is sorted or copied to do so (a
/// temporary copy would stay in the heap as much as the leaves save); objects out of key order
/// (never from an apiserver) are inserted one by one, as before.
pub fn filled(objects: Vec<Object>) -> Store {
    let mut store = Store::new();
    if !objects.windows(2).all(|w| w[0].header.key < w[1].header.key) {
        for o in objects {
            store.insert(o.header.key.clone(), Arc::new(o));
        }
        return store;
    }
    let mut between = Vec::with_capacity(objects.len() / 2);
    for (i, o) in objects.into_iter().enumerate() {
        let o = Arc::new(o);
        if i % 2 == 0 {
            store.insert(o.header.key.clone(), o);
        } else {
            between.push(o);
        }
    }
    for o in between {
        store.insert(o.header.key.clone(), o);
    }
    store
}

/// Puts a new version of an object in the store; returns it and the version it replaced. When
/// its key, uid, labels and fields are those of the version it replaces (most changes: a status,
/// a spec), it takes that version's key allocation (`Header::share_key`) and is put in its
/// place (one walk of the tree); otherwise it is inserted with its own key, which the tree then
/// holds, so no entry keeps an older version's strings alive.
pub fn upsert(store: &mut Store, mut obj: Object) -> (Arc<Object>, Option<Arc<Object>>) {
    if let Some(slot) = store.get_mut(&obj.header.key) {
        if obj.header.share_key(&slot.header) {
            let obj = Arc::new(obj);
            let prev = std::mem::replace(slot, obj.clone());
            return (obj, Some(prev));
        }
    }
    let obj = Arc::new(obj);
    let prev = store.insert(obj.header.key.clone(), obj.clone());
    (obj, prev)
}
