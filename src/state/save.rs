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
use crate::resource::Object;
use crate::upstream::Upstream;

/// Writes the state files.
pub struct Saver {
    opts: StateOptions,
    upstream: Upstream,
    metrics: Arc<Metrics>,
    identity: Mutex<Option<Identity>>,
}

impl Saver {
    pub fn new(
        opts: StateOptions,
        upstream: Upstream,
        metrics: Arc<Metrics>,
        identity: Option<Identity>,
    ) -> Saver {
        Saver { opts, upstream, metrics, identity: Mutex::new(identity) }
    }

    /// Saves every `--state-sync-period` until `stop` turns true.
    pub async fn run(self: Arc<Self>, readers: impl Fn() -> Vec<Reader>, mut stop: watch::Receiver<bool>) {
        if self.opts.sync_period.is_zero() {
            return;
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.opts.sync_period) => {}
                _ = crate::shutdown::until_true(&mut stop) => return,
            }
            self.save_all(&readers()).await;
        }
    }

    /// Writes the state of every reader whose resource `--state-resources` allows and that has
    /// something consistent to save (synced, ready).
    pub async fn save_all(&self, readers: &[Reader]) {
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
            if r.progress().unservable {
                // Its last state on disk would come back ready at a restart, as old as the
                // object it cannot parse (`cache::unparsable`): gone, it starts cold.
                match std::fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(resource, "state file removed: the cache cannot parse an object")
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(resource, error = %e, "could not remove a state file"),
                }
                continue;
            }
            // The snapshot is O(1); encoding (the objects' headers and bytes copied into the
            // file's buffer) and writing are done off the runtime's threads.
            let (reader, id) = (r.clone(), identity.clone());
            let written = tokio::task::spawn_blocking(move || {
                let Some(saved) = snapshot(&reader, &id) else { return Ok(None) };
                let bytes = format::encode(&saved);
                file::write_atomic(&path, &bytes).map(|()| Some((saved.rv, bytes.len())))
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
    use crate::resource::{ResourceKind, Rv};
    use crate::upstream::UpstreamOptions;

    /// A cache that cannot parse an object leaves no state on disk: its last one would come
    /// back ready at a restart, as old as that object.
    #[tokio::test]
    async fn an_unservable_cache_leaves_no_state_file() {
        let dir = std::env::temp_dir().join(format!("kwc-save-unservable-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = StateOptions {
            dir: dir.clone(),
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
        let json = r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"7"}}"#;
        w.replace(vec![w.parse(bytes::Bytes::from(json)).unwrap()], Rv(7));
        let path = dir.join(file::name_of("", "configmaps"));
        saver.save_all(std::slice::from_ref(&r)).await;
        assert!(path.exists(), "a ready cache is saved");
        w.unparsable("bad".into());
        saver.save_all(std::slice::from_ref(&r)).await;
        assert!(!path.exists(), "removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
