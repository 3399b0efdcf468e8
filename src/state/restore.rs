//! The start of a warm restart: the state files are read (before any upstream request),
//! decoded, matched against the upstream's identity ([`Warm::new`]), and each resource's
//! state is put into its empty cache by [`restore`] once the upstream's current RV is known
//! not to be behind it. Every refusal is logged with its reason and counted; the resource
//! then starts cold (a full LIST).
//!
//! Called by `app` (load, `Warm`) and by `caches` (restore, in the reflector's task before the
//! reflector runs).

use std::collections::HashMap;

use parking_lot::Mutex;

use super::file::resource_of;
use super::format::{DecodeError, Identity, Saved, SavedObject};
use super::{decode_from, file, Refusal, StateOptions};
use crate::cache::Writer;
use crate::metrics::Metrics;
use crate::resource::{ResourceKind, Rv};
use crate::upstream::Upstream;

/// What was read from `--state-dir` at start: per file, its state or why it is unusable.
pub struct Loaded {
    pub files: Vec<(String, Result<Saved, Refusal>)>,
    /// When each file was written (its modification time), by name.
    pub written: HashMap<String, std::time::SystemTime>,
}

impl Loaded {
    /// Reads every state file (blocking I/O; before the first upstream request). Files of
    /// resources `--state-resources` excludes are removed, unread. With `--cache-memory-limit`
    /// (`memory_limit`, bytes), the files are taken smallest first while their sizes together
    /// stay within it (a state costs about its file's size in memory: the objects' bytes and
    /// headers, the history); the rest are refused unread (`memory_limit`) and their resources
    /// list, through the budget like any list. Decoding them all first held every state at
    /// once, whatever the limit (a limit lowered after an OOM kill, the `emptyDir` kept).
    pub fn read(opts: &StateOptions, memory_limit: Option<u64>) -> Loaded {
        Loaded::read_until(opts, memory_limit, &std::sync::atomic::AtomicBool::new(false))
    }

    /// [`Loaded::read`], stopping before the next file once `given_up` is set (the start gave
    /// up waiting: a slow or hung mount; what was read is dropped).
    pub fn read_until(
        opts: &StateOptions,
        memory_limit: Option<u64>,
        given_up: &std::sync::atomic::AtomicBool,
    ) -> Loaded {
        if let Err(e) = file::ensure_dir(&opts.dir) {
            tracing::warn!(dir = %opts.dir.display(), error = %e, "--state-dir cannot be created");
        } else if let Err(e) = file::writable(&opts.dir) {
            tracing::error!(dir = %opts.dir.display(), error = %e,
                "--state-dir is not writable by this process: no state will be saved (a hostPath \
                 volume is created root-owned: make the directory writable by the proxy's user, \
                 65532 in the image)");
        }
        let entries = match file::open_all(&opts.dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %opts.dir.display(), error = %e, "--state-dir cannot be read; starting cold");
                return Loaded { files: Vec::new(), written: HashMap::new() };
            }
        };
        let admitted = admitted(&entries, opts, memory_limit);
        let mut files = Vec::new();
        let mut written = HashMap::new();
        for (name, opened) in entries {
            if given_up.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            // Excluded by its name: removed without being read (its content is checked again
            // below, once decoded, for a file whose name and content disagree).
            if resource_of(&name).is_some_and(|(g, r)| !opts.persists(g, r)) {
                file::remove(&opts.dir, &name);
                continue;
            }
            if let Some(t) = opened.as_ref().ok().and_then(|(_, meta)| meta.modified().ok()) {
                written.insert(name.clone(), t);
            }
            let state = match opened {
                // Another user's file, or one others may write: not read.
                Ok((mut f, meta)) => match file::untrusted(&meta) {
                    Some(why) => Err(Refusal::Untrusted(why)),
                    None if !admitted.contains(&name) => {
                        Err(Refusal::MemoryLimit { bytes: meta.len(), limit: memory_limit.unwrap_or(0) })
                    }
                    None => {
                        let len = meta.len();
                        let t = std::time::Instant::now();
                        let decoded = decode_from(&mut f, len);
                        tracing::debug!(file = name, bytes = len, took = ?t.elapsed(), "state file read");
                        decoded.map_err(|e| match e {
                            DecodeError::Io(e) => Refusal::Unreadable(e),
                            e => Refusal::from(e),
                        })
                    }
                },
                // `O_NOFOLLOW` on a symbolic link.
                #[cfg(unix)]
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    Err(Refusal::Untrusted("a symbolic link, not followed".into()))
                }
                Err(e) => Err(Refusal::Unreadable(e.to_string())),
            };
            if let Ok(s) = &state {
                if !opts.persists(&s.group, &s.resource) {
                    file::remove(&opts.dir, &name);
                    continue;
                }
            }
            files.push((name, state));
        }
        Loaded { files, written }
    }
}

/// The state files (by name) that fit within `limit` together, smallest first (all of them
/// without a limit); only those that will be read count (not an excluded resource's, nor an
/// untrusted one).
fn admitted(
    entries: &[file::Found],
    opts: &StateOptions,
    limit: Option<u64>,
) -> std::collections::HashSet<String> {
    let read = |n: &String, m: &std::fs::Metadata| {
        resource_of(n).is_none_or(|(g, r)| opts.persists(g, r)) && file::untrusted(m).is_none()
    };
    let mut sized: Vec<(u64, &String)> = entries
        .iter()
        .filter_map(|(n, o)| o.as_ref().ok().filter(|(_, m)| read(n, m)).map(|(_, m)| (m.len(), n)))
        .collect();
    sized.sort();
    let mut total = 0u64;
    let mut out = std::collections::HashSet::new();
    for (len, name) in sized {
        total = total.saturating_add(len);
        if limit.is_some_and(|l| total > l) {
            break;
        }
        out.insert(name.clone());
    }
    out
}

/// The loaded states of this cluster, by `group/resource`, each handed out once.
pub struct Warm {
    states: Mutex<HashMap<(String, String), Saved>>,
    /// When each state was saved (its file's modification time).
    written: HashMap<(String, String), std::time::SystemTime>,
    /// Where the files are (`--state-dir`): one refused for good is removed ([`restore`]).
    dir: Option<std::path::PathBuf>,
}

impl Warm {
    /// Keeps the states taken from `identity`'s cluster; refuses the others (and all of them
    /// when the identity is unknown).
    pub fn new(loaded: Loaded, identity: &Result<Identity, String>, metrics: &Metrics) -> Warm {
        let mut states = HashMap::new();
        let mut written = HashMap::new();
        for (name, state) in loaded.files {
            let checked = state.and_then(|s| match identity {
                // Only the file named for its content: a copy (`x.old.state`) would be taken
                // in its place, keyed by what it holds (a review).
                _ if name != file::name_of(&s.group, &s.resource) => {
                    Err(Refusal::Misnamed { file: name.clone(), holds: file::name_of(&s.group, &s.resource) })
                }
                Err(e) => Err(Refusal::IdentityUnknown(e.clone())),
                Ok(id) if *id != s.identity => {
                    Err(Refusal::OtherCluster { saved: describe(&s.identity), now: describe(id) })
                }
                Ok(_) => Ok(s),
            });
            match checked {
                Ok(s) => {
                    if let Some(t) = loaded.written.get(&name) {
                        written.insert((s.group.clone(), s.resource.clone()), *t);
                    }
                    states.insert((s.group.clone(), s.resource.clone()), s);
                }
                Err(r) => refused(metrics, &name, &r),
            }
        }
        Warm { states: Mutex::new(states), written, dir: None }
    }

    /// The same, its files in `dir`.
    pub fn in_dir(mut self, dir: std::path::PathBuf) -> Warm {
        self.dir = Some(dir);
        self
    }

    /// The state saved for `kind`'s resource, once.
    pub fn take(&self, kind: &ResourceKind) -> Option<Saved> {
        self.states.lock().remove(&(kind.group.clone(), kind.resource.clone()))
    }

    /// Drops the states no cache took at start (a resource the upstream does not serve now),
    /// each logged and counted (`not_cached`): a cache started later, once discovery finds
    /// its resource — seconds or days on — lists rather than restores a state from before the
    /// downtime, and the states are not held in memory meanwhile.
    pub fn drop_untaken(&self, metrics: &Metrics, dir: &std::path::Path) {
        let rest = std::mem::take(&mut *self.states.lock());
        for ((group, resource), _) in rest {
            // Its file too: the next start would restore it (ready, old) if the resource is
            // served again by then.
            file::remove(dir, &file::name_of(&group, &resource));
            let name = if group.is_empty() { resource } else { format!("{resource}.{group}") };
            refused(metrics, &name, &Refusal::NotCached);
        }
    }

    /// How many states are still waiting for their cache.
    pub fn len(&self) -> usize {
        self.states.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn describe(id: &Identity) -> String {
    format!("{} kube-system uid {}", id.server, id.cluster_uid)
}

fn refused(metrics: &Metrics, what: &str, r: &Refusal) {
    metrics.state_load(r.as_str());
    tracing::warn!(state = what, result = r.as_str(), reason = %r, "saved state refused; starting this resource cold");
}

/// Puts `saved` into the empty cache of `writer` once the upstream's current RV (a `limit=1`
/// LIST) is known not to be behind it; returns the RV the reflector resumes its watch from,
/// or `None` (refused, logged, counted: the reflector lists).
pub async fn restore(
    upstream: &Upstream,
    writer: &mut Writer,
    saved: Saved,
    metrics: &Metrics,
    warm: Option<&Warm>,
) -> Option<Rv> {
    let resource = writer.kind().group_resource();
    let file = file::name_of(&saved.group, &saved.resource);
    let written = warm.and_then(|w| w.written.get(&(saved.group.clone(), saved.resource.clone())).copied());
    // Its staleness counts from when it was last proven (its file's time; one in the future is
    // taken as unknown, and old) until the upstream's stream brings something.
    if let Some(t) = written {
        let age = t.elapsed().unwrap_or(std::time::Duration::from_secs(24 * 3600));
        writer.restored_age(age.saturating_sub(writer.age()));
    }
    match check_and_fill(upstream, writer, saved).await {
        Ok((rv, objects, events)) => {
            metrics.state_load("restored");
            tracing::info!(resource, rv = %rv, objects, events, "cache restored from --state-dir; resuming the upstream watch there");
            Some(rv)
        }
        Err(r) => {
            refused(metrics, &resource, &r);
            // Refused for good (not for an upstream that did not answer): its file goes, or a
            // crash before the first save would leave it for the next start, which could take
            // it — an upstream behind it may have passed its RV by then, in another history
            // (found by a review).
            if !matches!(r, Refusal::Unchecked(_)) {
                if let Some(dir) = warm.and_then(|w| w.dir.as_deref()) {
                    file::remove(dir, &file);
                }
            }
            None
        }
    }
}

async fn check_and_fill(
    upstream: &Upstream,
    writer: &mut Writer,
    saved: Saved,
) -> Result<(Rv, usize, usize), Refusal> {
    let kind = writer.kind().clone();
    if saved.version != kind.version {
        return Err(Refusal::OtherVersion { saved: saved.version, served: kind.version });
    }
    let page = super::checked(|| upstream.list_page(&kind, 1, None, None))
        .await
        .map_err(|e| Refusal::Unchecked(e.to_string()))?;
    if page.rv < saved.rv {
        return Err(Refusal::UpstreamBehind { saved: saved.rv, upstream: page.rv });
    }
    let rv = saved.rv;
    let (n, m) = off_worker(|| fill(writer, saved))?;
    Ok((rv, n, m))
}

/// Runs `f`, CPU for a while (100 000 pods' objects and tree take ~0.4 s), without holding
/// an async worker: on the multi-thread runtime the worker's other tasks (`/livez`, other
/// resources' reflectors, requests) move to another thread meanwhile (`block_in_place`); on a
/// current-thread runtime, which cannot hand its tasks over, `f` runs in place.
fn off_worker<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Puts a decoded state into the empty cache of `writer`: its objects are rebuilt from their
/// saved headers and bytes (nothing parsed but a sample, [`check_sample`]), every event must
/// be newer than the one before. No upstream check (see [`restore`]); also the fuzz target's
/// way into the cache. Returns how many objects and events.
pub fn fill(writer: &mut Writer, saved: Saved) -> Result<(usize, usize), Refusal> {
    let kind = writer.kind();
    if (&saved.group, &saved.resource) != (&kind.group, &kind.resource) || saved.builtin != kind.builtin {
        return Err(Refusal::BadObject(format!(
            "saved for {}/{} (built-in: {}), this cache is {} (built-in: {})",
            saved.group,
            saved.resource,
            saved.builtin,
            kind.group_resource(),
            kind.builtin
        )));
    }
    let (n, m) = (saved.objects.len(), saved.events.len());
    check_sample(writer, &saved)?;
    let base = saved.objects.into_iter().map(|o| writer.restored(o.header, o.body)).collect();
    let events = saved.events.into_iter().map(|(t, o)| (t, writer.restored(o.header, o.body))).collect();
    writer.restore(base, saved.floor, events, saved.rv)?;
    Ok((n, m))
}

/// One object in this many (and the first) is parsed again at a load.
const SAMPLE_EVERY: usize = 1000;

/// Parses a sample of the saved objects and compares what the parse derives with the saved
/// headers: a build that derives them differently (without a new format version) is caught
/// here, not by a client. Corruption is the checksums' business; 100 000 pods cost ~100 parses.
fn check_sample(writer: &Writer, saved: &Saved) -> Result<(), Refusal> {
    let all = saved.objects.iter().chain(saved.events.iter().map(|(_, o)| o));
    for o in all.step_by(SAMPLE_EVERY) {
        agrees(writer, o)?;
    }
    Ok(())
}

/// Whether `o`'s bytes parse into its saved header and body.
fn agrees(writer: &Writer, o: &SavedObject) -> Result<(), Refusal> {
    let typed = writer.restored(o.header.clone(), o.body.clone()).typed_bytes();
    let parsed =
        writer.parse(typed).map_err(|e| Refusal::BadObject(format!("{}: {e}", o.header.key.as_str())))?;
    if parsed.header != o.header || parsed.body != o.body {
        return Err(Refusal::BadObject(format!(
            "{}: the saved header disagrees with the object's bytes",
            o.header.key.as_str()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{self, CacheOptions};
    use crate::resource::Header;
    use bytes::Bytes;

    /// Only the file named for what it holds is taken: a copy (`core_configmaps.old.state`)
    /// sorted after the real one was taken in its place, keyed by its content (a review).
    #[test]
    fn a_file_not_named_for_its_resource_is_refused() {
        let id = Identity { server: "https://a".into(), cluster_uid: "u".into() };
        let saved = |rv| Saved {
            identity: id.clone(),
            group: String::new(),
            version: "v1".into(),
            resource: "configmaps".into(),
            builtin: true,
            rv: Rv(rv),
            floor: Rv(rv),
            objects: Vec::new(),
            events: Vec::new(),
        };
        let loaded = Loaded {
            files: vec![
                ("core_configmaps.state".into(), Ok(saved(10))),
                ("core_configmaps.state.old.state".into(), Ok(saved(5))),
            ],
            written: HashMap::new(),
        };
        let metrics = Metrics::new();
        let warm = Warm::new(loaded, &Ok(id.clone()), &metrics);
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        assert_eq!(warm.take(&kind).map(|s| s.rv), Some(Rv(10)), "the real one");
        assert!(metrics.render().contains(r#"watchcache_state_loads_total{result="misnamed"} 1"#));
    }

    fn cm(i: usize) -> Bytes {
        Bytes::from(format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"c{i}","namespace":"n","resourceVersion":"{}","labels":{{"a":"{i}"}}}}}}"#,
            i + 1
        ))
    }

    fn saved_of(writer: &Writer, n: usize) -> Saved {
        let objects = (0..n)
            .map(|i| {
                let o = writer.parse(cm(i)).expect("parses");
                SavedObject { header: o.header.clone(), body: o.body.clone() }
            })
            .collect();
        Saved {
            identity: Identity { server: "https://k".into(), cluster_uid: "u".into() },
            group: String::new(),
            version: "v1".into(),
            resource: "configmaps".into(),
            builtin: true,
            rv: Rv(n as u64),
            floor: Rv(n as u64),
            objects,
            events: Vec::new(),
        }
    }

    fn cache() -> (Writer, crate::cache::Reader) {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        cache::new(kind, CacheOptions::default())
    }

    fn writer() -> Writer {
        cache().0
    }

    /// A restored state's staleness starts at its file's time (when it was last proven): the
    /// time read with the files reaches the cache of the resource it holds.
    #[tokio::test]
    async fn a_restored_state_is_as_stale_as_its_file_is_old() {
        let body =
            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"100"},"items":[]}"#;
        let upstream = crate::upstream::testutil::answering(body, &[]).await;
        let (mut w, r) = cache();
        let saved = saved_of(&w, 3);
        let identity = saved.identity.clone();
        let name = file::name_of("", "configmaps");
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let loaded =
            Loaded { files: vec![(name.clone(), Ok(saved))], written: HashMap::from([(name, hour_ago)]) };
        let metrics = Metrics::new();
        let warm = Warm::new(loaded, &Ok(identity), &metrics);
        let saved = warm.take(w.kind()).expect("taken");
        assert_eq!(restore(&upstream, &mut w, saved, &metrics, Some(&warm)).await, Some(Rv(3)));
        let s = r.staleness().unwrap();
        assert!(
            s >= std::time::Duration::from_secs(3600) && s < std::time::Duration::from_secs(3660),
            "{s:?}"
        );
    }

    #[test]
    fn saved_objects_are_rebuilt_as_the_parse_made_them() {
        let (mut w, reader) = cache();
        let saved = saved_of(&w, 3);
        let want: Vec<_> = (0..3).map(|i| w.parse(cm(i)).unwrap()).collect();
        assert_eq!(fill(&mut w, saved).expect("restores"), (3, 0));
        for o in want {
            let got = reader.get("n", o.header.name()).expect("restored");
            assert_eq!(got.header, o.header);
            assert_eq!(got.typed_bytes(), o.typed_bytes());
        }
    }

    #[test]
    fn a_sampled_header_that_disagrees_with_its_bytes_refuses_the_state() {
        let w = writer();
        for at in [0, SAMPLE_EVERY] {
            let mut saved = saved_of(&w, SAMPLE_EVERY + 1);
            let h = &saved.objects[at].header;
            let mut labels: Vec<(&str, &str)> = h.labels().iter().collect();
            labels.push(("a", "not what the bytes say"));
            let fields: Vec<(&str, &str)> = h.fields().iter().collect();
            saved.objects[at].header = Header::new(h.namespace(), h.name(), h.rv, &h.uid(), labels, fields);
            let e = fill(&mut writer(), saved).unwrap_err();
            assert!(e.to_string().contains("disagrees"), "{e}");
            assert_eq!(e.as_str(), "corrupt");
        }
    }

    #[test]
    fn a_state_of_another_resource_or_typing_is_refused() {
        let w = writer();
        let mut other = saved_of(&w, 1);
        other.resource = "secrets".into();
        assert!(matches!(fill(&mut writer(), other), Err(Refusal::BadObject(_))));
        let mut custom = saved_of(&w, 1);
        custom.builtin = false;
        assert!(matches!(fill(&mut writer(), custom), Err(Refusal::BadObject(_))));
    }

    /// With one worker, a task spawned before the fill runs while the fill still holds its
    /// thread: the fill let the worker go. (In place, the fill would wait out its timeout.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_fill_lets_its_worker_go_to_other_tasks() {
        let on_the_worker = tokio::spawn(async {
            let (tx, rx) = std::sync::mpsc::channel();
            tokio::spawn(async move { tx.send(()).expect("the fill waits") });
            off_worker(|| rx.recv_timeout(std::time::Duration::from_secs(10)))
        });
        assert_eq!(on_the_worker.await.expect("joins"), Ok(()), "the other task ran during the fill");
    }

    #[test]
    fn off_a_runtime_or_on_a_current_thread_one_the_fill_runs_in_place() {
        assert_eq!(off_worker(|| 7), 7);
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        assert_eq!(rt.block_on(async { off_worker(|| 8) }), 8);
    }

    #[test]
    fn an_excluded_resources_file_is_removed_unread() {
        let dir = std::env::temp_dir().join(format!("kwc-restore-excluded-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        // Not a state file at all: decoding it would refuse it, not remove it.
        std::fs::write(dir.join("core_secrets.state"), b"garbage").unwrap();
        std::fs::write(dir.join("core_configmaps.state"), b"garbage").unwrap();
        let opts = StateOptions {
            dir: dir.clone(),
            sync_period: std::time::Duration::from_secs(60),
            resources: crate::wanted::Wanted::parse(&["*".into(), "-secrets".into()]).unwrap(),
        };
        let loaded = Loaded::read(&opts, None);
        assert!(!dir.join("core_secrets.state").exists(), "excluded: removed");
        let names: Vec<_> = loaded.files.iter().map(|(n, s)| (n.as_str(), s.is_err())).collect();
        assert_eq!(names, [("core_configmaps.state", true)], "only the included file was read (and refused)");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// With `--cache-memory-limit`, the states are taken smallest first while they fit
    /// together; the others are refused unread (their resources list, through the budget).
    #[test]
    fn states_past_the_memory_limit_are_refused_unread() {
        let dir = std::env::temp_dir().join(format!("kwc-restore-limit-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        // Not state files: read, they would be refused as corrupt, not for the limit.
        for (name, len) in
            [("core_pods.state", 5000), ("core_configmaps.state", 1000), ("core_nodes.state", 2000)]
        {
            std::fs::write(dir.join(name), vec![b'x'; len]).unwrap();
        }
        let opts = StateOptions {
            dir: dir.clone(),
            sync_period: std::time::Duration::from_secs(60),
            resources: crate::wanted::Wanted::parse(&["*".into()]).unwrap(),
        };
        let results = |limit| {
            // Smaller than all, but excluded (removed unread): not counted against the limit.
            std::fs::write(dir.join("core_secrets.state"), vec![b'x'; 600]).unwrap();
            let loaded = Loaded::read(&opts, limit);
            assert!(!dir.join("core_secrets.state").exists(), "excluded: removed");
            let mut r: Vec<(String, &'static str)> = loaded
                .files
                .iter()
                .map(|(n, s)| (n.clone(), s.as_ref().err().map_or("ok", |e| e.as_str())))
                .collect();
            r.sort();
            r
        };
        let limited = results(Some(3500));
        assert_eq!(
            limited,
            [
                ("core_configmaps.state".to_string(), "corrupt"),
                ("core_nodes.state".to_string(), "corrupt"),
                ("core_pods.state".to_string(), "memory_limit"),
            ],
            "the two smallest fit (and were read), the largest not"
        );
        assert!(results(None).iter().all(|(_, r)| *r != "memory_limit"));
        assert!(results(Some(100)).iter().all(|(_, r)| *r == "memory_limit"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
