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

use super::format::{self, Identity, Saved};
use super::{file, Refusal, StateOptions};
use crate::cache::Writer;
use crate::metrics::Metrics;
use bytes::Bytes;

use crate::resource::{EventType, Object, ResourceKind, Rv};
use crate::upstream::Upstream;

/// What was read from `--state-dir` at start: per file, its state or why it is unusable.
pub struct Loaded {
    pub files: Vec<(String, Result<Saved, Refusal>)>,
}

impl Loaded {
    /// Reads every state file (blocking I/O; before the first upstream request). Files of
    /// resources `--state-resources` excludes are removed, unread.
    pub fn read(opts: &StateOptions) -> Loaded {
        if let Err(e) = file::ensure_dir(&opts.dir) {
            tracing::warn!(dir = %opts.dir.display(), error = %e, "--state-dir cannot be created");
        }
        let entries = match file::read_all(&opts.dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %opts.dir.display(), error = %e, "--state-dir cannot be read; starting cold");
                return Loaded { files: Vec::new() };
            }
        };
        let mut files = Vec::new();
        for (name, bytes) in entries {
            let state = match bytes {
                Ok(b) => format::decode(&b).map_err(Refusal::from),
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
        Loaded { files }
    }
}

/// The loaded states of this cluster, by `group/resource`, each handed out once.
pub struct Warm {
    states: Mutex<HashMap<(String, String), Saved>>,
}

impl Warm {
    /// Keeps the states taken from `identity`'s cluster; refuses the others (and all of them
    /// when the identity is unknown).
    pub fn new(loaded: Loaded, identity: &Result<Identity, String>, metrics: &Metrics) -> Warm {
        let mut states = HashMap::new();
        for (name, state) in loaded.files {
            let checked = state.and_then(|s| match identity {
                Err(e) => Err(Refusal::IdentityUnknown(e.clone())),
                Ok(id) if *id != s.identity => {
                    Err(Refusal::OtherCluster { saved: describe(&s.identity), now: describe(id) })
                }
                Ok(_) => Ok(s),
            });
            match checked {
                Ok(s) => {
                    states.insert((s.group.clone(), s.resource.clone()), s);
                }
                Err(r) => refused(metrics, &name, &r),
            }
        }
        Warm { states: Mutex::new(states) }
    }

    /// The state saved for `kind`'s resource, once.
    pub fn take(&self, kind: &ResourceKind) -> Option<Saved> {
        self.states.lock().remove(&(kind.group.clone(), kind.resource.clone()))
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
) -> Option<Rv> {
    let resource = writer.kind().group_resource();
    match check_and_fill(upstream, writer, saved).await {
        Ok((rv, objects, events)) => {
            metrics.state_load("restored");
            tracing::info!(resource, rv = %rv, objects, events, "cache restored from --state-dir; resuming the upstream watch there");
            Some(rv)
        }
        Err(r) => {
            refused(metrics, &resource, &r);
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
    let page =
        upstream.list_page(&kind, 1, None, None).await.map_err(|e| Refusal::Unchecked(e.to_string()))?;
    if page.rv < saved.rv {
        return Err(Refusal::UpstreamBehind { saved: saved.rv, upstream: page.rv });
    }
    let rv = saved.rv;
    let (n, m) = fill(writer, saved)?;
    Ok((rv, n, m))
}

/// Puts a decoded state into the empty cache of `writer`: every object must parse as the
/// resource's, every event be newer than the one before. No upstream check (see [`restore`]);
/// also the fuzz target's way into the cache. Returns how many objects and events.
pub fn fill(writer: &mut Writer, saved: Saved) -> Result<(usize, usize), Refusal> {
    let (n, m) = (saved.objects.len(), saved.events.len());
    if let Some((t, _)) = saved
        .events
        .iter()
        .find(|(t, _)| !matches!(t, EventType::Added | EventType::Modified | EventType::Deleted))
    {
        return Err(Refusal::BadObject(format!("event type {t:?}")));
    }
    let base = parse_all(writer, saved.objects)?;
    let (types, bytes): (Vec<EventType>, Vec<Bytes>) = saved.events.into_iter().unzip();
    let events = types.into_iter().zip(parse_all(writer, bytes)?).collect();
    writer.restore(base, saved.floor, events, saved.rv)?;
    Ok((n, m))
}

/// Below this many objects one thread parses them all.
const PARALLEL_FROM: usize = 4096;

/// Parses every object, in order, on up to `available_parallelism` threads: parsing is most of
/// a warm start's time (100 000 pods: ~300 MB of JSON), and no upstream request waits on it.
fn parse_all(writer: &Writer, items: Vec<Bytes>) -> Result<Vec<Object>, Refusal> {
    let bad = |e: crate::resource::ParseError| Refusal::BadObject(e.to_string());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if threads < 2 || items.len() < PARALLEL_FROM {
        return items.into_iter().map(|b| writer.parse(b).map_err(bad)).collect();
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = items
            .chunks(chunk)
            .map(|c| {
                s.spawn(move || c.iter().map(|b| writer.parse(b.clone())).collect::<Result<Vec<_>, _>>())
            })
            .collect();
        let mut out = Vec::with_capacity(items.len());
        for p in parts {
            let part = p.join().map_err(|_| Refusal::BadObject("a parser thread panicked".into()))?;
            out.extend(part.map_err(bad)?);
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{self, CacheOptions};

    fn cm(i: usize) -> Bytes {
        Bytes::from(format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"c{i}","namespace":"n","resourceVersion":"{}"}}}}"#,
            i + 1
        ))
    }

    #[test]
    fn objects_are_parsed_in_order_on_several_threads_and_one_bad_object_refuses_all() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (writer, _reader) = cache::new(kind, CacheOptions::default());
        let n = PARALLEL_FROM * 2 + 3;
        let parsed = parse_all(&writer, (0..n).map(cm).collect()).expect("parses");
        assert_eq!(parsed.len(), n);
        assert!(parsed
            .iter()
            .enumerate()
            .all(|(i, o)| o.header.name() == format!("c{i}") && o.header.rv.0 == i as u64 + 1));
        let mut items: Vec<Bytes> = (0..n).map(cm).collect();
        items[n - 2] = Bytes::from_static(b"{not json");
        assert!(matches!(parse_all(&writer, items), Err(Refusal::BadObject(_))));
    }
}
