//! Writing the caches to `--state-dir`: every `--state-sync-period` while running (a crash
//! loses at most that much) and once at shutdown, after the reflectors stopped and the watches
//! were drained. Never without the upstream's identity (a state that names no cluster could
//! not be checked at the next start).
//!
//! Driven by `app`: [`Saver::run`] in the background, [`Saver::save_all`] at shutdown.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::format::{self, Identity, Saved, SavedObject};
use super::{file, StateOptions};
use crate::cache::Reader;
use crate::metrics::Metrics;
use crate::resource::{Object, ResourceKind};
use crate::upstream::Upstream;

/// Writes the state files.
pub struct Saver {
    opts: StateOptions,
    upstream: Upstream,
    metrics: Arc<Metrics>,
    identity: Mutex<Option<Identity>>,
    /// One `save_all` at a time: the periodic one may still be writing when the shutdown's
    /// starts, and both write the same temporary files.
    saving: tokio::sync::Mutex<()>,
}

impl Saver {
    pub fn new(
        opts: StateOptions,
        upstream: Upstream,
        metrics: Arc<Metrics>,
        identity: Option<Identity>,
    ) -> Saver {
        Saver { opts, upstream, metrics, identity: Mutex::new(identity), saving: tokio::sync::Mutex::new(()) }
    }

    /// Saves every `--state-sync-period` until `stop` turns true; `caches` gives the caches
    /// running and the kinds of those dropped for `--cache-memory-limit`.
    pub async fn run(
        self: Arc<Self>,
        caches: impl Fn() -> (Vec<Reader>, Vec<ResourceKind>),
        mut stop: watch::Receiver<bool>,
    ) {
        let periodic = !self.opts.sync_period.is_zero();
        let mut next_save = tokio::time::Instant::now() + self.opts.sync_period;
        let mut scan = tokio::time::interval(DISCARD_SCAN);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next_save), if periodic => {
                    let (readers, dropped) = caches();
                    self.save_all(&readers, &dropped).await;
                    next_save = tokio::time::Instant::now() + self.opts.sync_period;
                }
                _ = scan.tick() => {
                    let (readers, dropped) = caches();
                    self.remove_discarded(&readers, &dropped).await;
                }
                _ = crate::shutdown::until_true(&mut stop) => return,
            }
        }
    }

    /// Removes at once the files of the caches that became known wrong, unparsable or stale
    /// since the last save ([`discarded`]): kept until the next save (a minute, or the
    /// shutdown with `--state-sync-period=0`), a crash meanwhile brought the state the proxy
    /// had refused back ready at the restart (found by a review); and those of the caches
    /// `dropped` for `--cache-memory-limit` (`Caching::dropped_kinds`: dropped now, or since the
    /// last call — a cache taken back before the next save, not synced yet, neither rewrote nor
    /// removed the file of its state before the drop; a review).
    async fn remove_discarded(&self, readers: &[Reader], dropped: &[ResourceKind]) {
        let _one = self.saving.lock().await;
        for kind in dropped.iter().filter(|k| self.opts.persists(&k.group, &k.resource)) {
            let path = self.opts.dir.join(file::name_of(&kind.group, &kind.resource));
            let resource = kind.group_resource();
            let _ = tokio::task::spawn_blocking(move || {
                if path.exists() {
                    remove(&path, &resource, "the cache was dropped for --cache-memory-limit");
                }
            })
            .await;
        }
        for r in readers {
            let kind = r.kind();
            if !self.opts.persists(&kind.group, &kind.resource) {
                continue;
            }
            if let Some(why) = discarded(r) {
                let path = self.opts.dir.join(file::name_of(&kind.group, &kind.resource));
                let resource = kind.group_resource();
                // Blocking (a stat, an unlink, the directory's fsync): off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || {
                    if path.exists() {
                        remove(&path, &resource, why);
                    }
                })
                .await;
            }
        }
    }

    /// Writes the state of every reader whose resource `--state-resources` allows and that has
    /// something consistent to save (synced, ready), and removes the files of the caches
    /// `dropped` for `--cache-memory-limit`: no longer kept up to date, such a file would come
    /// back ready at a restart, older than `--state-sync-period` promises (by days, perhaps).
    pub async fn save_all(&self, readers: &[Reader], dropped: &[ResourceKind]) {
        let _one = self.saving.lock().await;
        for kind in dropped.iter().filter(|k| self.opts.persists(&k.group, &k.resource)) {
            let path = self.opts.dir.join(file::name_of(&kind.group, &kind.resource));
            remove(&path, &kind.group_resource(), "the cache was dropped for --cache-memory-limit");
        }
        let Some(identity) = self.identity().await else { return };
        let started = tokio::time::Instant::now();
        let mut total = 0u64;
        for r in readers {
            let kind = r.kind();
            if !self.opts.persists(&kind.group, &kind.resource) {
                continue;
            }
            let path = self.opts.dir.join(file::name_of(&kind.group, &kind.resource));
            let resource = kind.group_resource();
            if let Some(why) = discarded(r) {
                // Its last state on disk would come back ready at a restart: gone, it starts
                // cold.
                remove(&path, &resource, why);
                continue;
            }
            // The snapshot is O(1); encoding (the objects' headers and bytes copied into the
            // file's buffer) and writing are done off the runtime's threads.
            let (reader, id) = (r.clone(), identity.clone());
            // Dated when the state was last proven current, not when written: a cache kept
            // through an upstream outage, or restored and not proven yet, is saved as old as
            // it is (a restart counts its staleness from the file's time; found by a review).
            let proven_at = r.staleness().and_then(|s| std::time::SystemTime::now().checked_sub(s));
            let written = tokio::task::spawn_blocking(move || {
                let Some(saved) = snapshot(&reader, &id) else {
                    // Nothing consistent to save: if the cache became unservable or distrusted
                    // since `discarded` was asked, its last file must go now (a review: it was
                    // neither replaced nor removed).
                    if let Some(why) = discarded(&reader) {
                        remove(&path, &reader.kind().group_resource(), why);
                    }
                    return Ok(None);
                };
                let bytes = format::encode(&saved);
                // A file the next start would not trust is not written (`write_atomic`).
                file::write_atomic(&path, &bytes, proven_at).map(|()| Some((saved.rv, bytes.len())))
            })
            .await;
            match written {
                Ok(Ok(None)) => {}
                Ok(Ok(Some((rv, n)))) => {
                    total += n as u64;
                    self.metrics.state_saved(&resource, n as u64, true);
                    tracing::debug!(resource, rv = %rv, bytes = n, "state saved");
                }
                Ok(Err(e)) => {
                    self.metrics.state_saved(&resource, 0, false);
                    tracing::warn!(resource, error = %e, dir = %self.opts.dir.display(), "state not saved");
                }
                Err(e) => {
                    self.metrics.state_saved(&resource, 0, false);
                    tracing::warn!(resource, error = %e, "state not saved");
                }
            }
        }
        // Files of resources no longer cached here (a custom resource deleted, an API turned
        // off: its cache retired while running) or named otherwise: kept, a restart would
        // restore a state nothing has kept up to date — the deleted resource's objects, if it
        // was made again (a review). Such a resource cached again starts cold.
        let cached: std::collections::HashSet<String> =
            readers.iter().map(|r| file::name_of(&r.kind().group, &r.kind().resource)).collect();
        if let Ok(names) = file::state_names(&self.opts.dir) {
            for name in names.iter().filter(|n| !cached.contains(*n)) {
                remove(&self.opts.dir.join(name), name, "its resource is not cached any more");
            }
        }
        let took = started.elapsed();
        tracing::info!(bytes = total, took = ?took, dir = %self.opts.dir.display(), "caches saved to --state-dir");
    }

    /// The identity to write; fetched again when the start could not (a state is never written
    /// without one).
    async fn identity(&self) -> Option<Identity> {
        if let Some(id) = self.identity.lock().clone() {
            return Some(id);
        }
        match tokio::time::timeout(Duration::from_secs(10), super::identity(&self.upstream)).await {
            Ok(Ok(id)) => {
                *self.identity.lock() = Some(id.clone());
                Some(id)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "state not saved: the upstream cluster's identity is unknown");
                None
            }
            Err(_) => {
                tracing::warn!("state not saved: no answer for the upstream cluster's identity");
                None
            }
        }
    }
}

/// How often the files of caches that became known wrong are looked for
/// ([`Saver::remove_discarded`]).
const DISCARD_SCAN: Duration = Duration::from_secs(1);

/// Removes a state file that must not come back at a restart (a missing one is fine).
fn remove(path: &std::path::Path, resource: &str, why: &str) {
    match file::remove_durable(path) {
        Ok(()) => tracing::info!(resource, "state file removed: {why}"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(resource, error = %e, "could not remove a state file"),
    }
}

/// Why the state on disk of `r`'s cache must go, if it must: the cache cannot parse an object
/// (`cache::unparsable`: the state is as old as that object), or it is not ready after it was
/// synced — found different from the upstream, the upstream's storage gone back, a restored
/// state the upstream no longer has — and relisting: what it last saved is known wrong or
/// from before a downtime, and a crash before the relist lands would bring it back ready. Not
/// a cache dropped for `--cache-memory-limit` (it may be emptied: `save_all` removes its file
/// by its kind).
fn discarded(r: &Reader) -> Option<&'static str> {
    let p = r.progress();
    if p.unservable {
        Some("the cache cannot parse an object")
    } else if !p.ready && p.rv > crate::resource::Rv(0) && !r.released() {
        Some("the cache is known wrong or stale and relisting")
    } else {
        None
    }
}

/// The reader's state as a file's contents.
fn snapshot(r: &Reader, identity: &Identity) -> Option<Saved> {
    let p = r.saved()?;
    let kind = r.kind();
    Some(Saved {
        identity: identity.clone(),
        group: kind.group.clone(),
        version: kind.version.clone(),
        resource: kind.resource.clone(),
        builtin: kind.builtin,
        rv: p.rv,
        floor: p.floor,
        objects: p.base.values().map(|o| saved(o)).collect(),
        events: p.events.iter().map(|e| (e.kind, saved(&e.object))).collect(),
    })
}

/// An object as saved: its header and body shared, not copied.
fn saved(o: &Object) -> SavedObject {
    SavedObject { header: o.header.clone(), body: o.body.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{self, CacheOptions};
    use crate::resource::Rv;
    use crate::upstream::UpstreamOptions;

    const CM: &str = r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"7"}}"#;

    /// A saver into `dir` (made) for every resource, and a configmaps cache ready at RV 7 with
    /// one object.
    fn saver_and_cache(dir: &std::path::Path) -> (Saver, cache::Writer, Reader) {
        std::fs::create_dir_all(dir).unwrap();
        let opts = StateOptions {
            dir: dir.to_owned(),
            sync_period: Duration::from_secs(60),
            resources: crate::wanted::Wanted::parse(&["*".into()]).unwrap(),
        };
        let upstream = Upstream::new(&UpstreamOptions {
            upstream: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        })
        .unwrap();
        let id = Identity { server: "http://127.0.0.1:9".into(), cluster_uid: "u".into() };
        let saver = Saver::new(opts, upstream, Arc::new(Metrics::new()), Some(id));
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = cache::new(kind, CacheOptions::default());
        w.replace(vec![w.parse(bytes::Bytes::from(CM)).unwrap()], Rv(7));
        (saver, w, r)
    }

    /// A cache that cannot parse an object, or is known wrong, leaves no state on disk: its last
    /// one would come back ready at a restart.
    #[tokio::test]
    async fn an_unservable_or_known_wrong_cache_leaves_no_state_file() {
        let dir = std::env::temp_dir().join(format!("kwc-save-unservable-{}", fastrand::u64(..)));
        let (saver, mut w, r) = saver_and_cache(&dir);
        let json = CM;
        let path = dir.join(file::name_of("", "configmaps"));
        saver.save_all(std::slice::from_ref(&r), &[]).await;
        assert!(path.exists(), "a ready cache is saved");
        w.unparsable("bad".into());
        saver.save_all(std::slice::from_ref(&r), &[]).await;
        assert!(!path.exists(), "removed");

        // Listed again, saved again; then found different from the upstream: not ready while
        // it relists, and its file goes (a crash before the relist would restore it).
        w.replace(vec![w.parse(bytes::Bytes::from(json)).unwrap()], Rv(8));
        saver.save_all(std::slice::from_ref(&r), &[]).await;
        assert!(path.exists(), "saved again once listed");
        r.request_relist(Rv(8), r.lists(), "inconsistent with the upstream".into());
        saver.save_all(std::slice::from_ref(&r), &[]).await;
        assert!(!path.exists(), "a cache known wrong leaves no state");
        // A cache before its first sync (not ready at RV 0) leaves another's file alone.
        w.replace(vec![w.parse(bytes::Bytes::from(json)).unwrap()], Rv(9));
        saver.save_all(std::slice::from_ref(&r), &[]).await;
        let (_w2, syncing) = cache::new(r.kind().clone(), CacheOptions::default());
        saver.save_all(std::slice::from_ref(&syncing), &[]).await;
        assert!(path.exists(), "a syncing cache removes nothing");
        // Dropped for --cache-memory-limit: no longer saved, and its file goes.
        r.release_at_stop();
        saver.save_all(&[], &[r.kind().clone()]).await;
        assert!(!path.exists(), "a dropped cache leaves no state");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A cache found wrong between two saves has its file removed within a second, even with
    /// no periodic save (`--state-sync-period=0`): a crash before the next save brought it back
    /// ready (a review). So does one dropped for the memory limit, taken back or not.
    #[tokio::test(start_paused = true)]
    async fn a_cache_found_wrong_between_saves_loses_its_file_at_once() {
        let dir = std::env::temp_dir().join(format!("kwc-save-discard-{}", fastrand::u64(..)));
        let (mut saver, mut w, r) = saver_and_cache(&dir);
        saver.opts.sync_period = Duration::ZERO;
        let saver = Arc::new(saver);
        let path = dir.join(file::name_of("", "configmaps"));
        saver.save_all(std::slice::from_ref(&r), &[]).await;
        assert!(path.exists());
        let (stop_tx, stop) = watch::channel(false);
        let readers = vec![r.clone()];
        let dropped = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let d = dropped.clone();
        let task = tokio::spawn(saver.clone().run(move || (readers.clone(), d.lock().clone()), stop));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(path.exists(), "a ready cache's file stays");
        r.request_relist(Rv(7), r.lists(), "inconsistent with the upstream".into());
        tokio::time::sleep(DISCARD_SCAN * 2).await;
        assert!(!path.exists(), "removed within a scan");
        // Listed and saved again; then dropped for --cache-memory-limit and taken back, ready
        // again before any save: its file from before the drop goes within a scan all the same.
        w.replace(vec![w.parse(bytes::Bytes::from(CM)).unwrap()], Rv(8));
        saver.save_all(std::slice::from_ref(&r), &[]).await;
        assert!(path.exists());
        dropped.lock().push(r.kind().clone());
        tokio::time::sleep(DISCARD_SCAN * 2).await;
        assert!(!path.exists(), "a dropped cache's file removed within a scan");
        stop_tx.send(true).unwrap();
        task.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The file of a resource no longer cached (a custom resource deleted while the proxy ran:
    /// its cache retired) or of another name (a copy) goes at the next save: a restart would
    /// restore a state nothing kept up to date (a review). Temporary files are not touched.
    #[tokio::test]
    async fn files_of_resources_not_cached_go_at_the_next_save() {
        let dir = std::env::temp_dir().join(format!("kwc-save-retired-{}", fastrand::u64(..)));
        let (saver, _w, r) = saver_and_cache(&dir);
        let widgets = dir.join(file::name_of("example.com", "widgets"));
        let copy = dir.join("core_configmaps.old.state");
        let temporary = dir.join(".core_configmaps.state.tmp-1");
        for p in [&widgets, &copy, &temporary] {
            std::fs::write(p, b"x").unwrap();
        }
        saver.save_all(std::slice::from_ref(&r), &[]).await;
        assert!(dir.join(file::name_of("", "configmaps")).exists());
        assert!(!widgets.exists(), "a resource not cached any more");
        assert!(!copy.exists(), "a copy");
        assert!(temporary.exists(), "not a state file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
