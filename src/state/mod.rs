//! Warm restarts (`--state-dir`, issue 33): each cached resource's objects, history and RV,
//! with what identifies the upstream cluster, kept on disk so that a restarted proxy serves
//! the same cache, at the same resourceVersions, before it has listed anything.
//!
//! | file | owns |
//! | --- | --- |
//! | [`format`] | the bytes of a state file: magic, version, identity, each object's header and bytes, CRC-32s; writing them (pure) |
//! | `decode` | reading them back, no JSON parsed, blocks decoded on every core (pure) |
//! | `file` | atomic writes (0600, fsync, rename), reading the directory |
//! | `restore` | start: files read before any upstream request, refused unless the cluster, the version and the upstream RV agree |
//! | `save` | every `--state-sync-period` and once at shutdown, after the watches were drained |
//!
//! When a restored state is served: after the upstream confirmed who it is (the `kube-system`
//! namespace's UID, fetched with the proxy's own credentials, and the server URL) and, per
//! resource, that its current RV (a `limit=1` LIST) is not behind the saved one — one small
//! request each instead of a full LIST. A state that cannot be trusted is refused, logged
//! with its reason, counted in `watchcache_state_loads_total{result}`, and the resource starts
//! cold. Used by `app` (load, saver, shutdown) and `caches` (a cache filled before its reflector
//! starts).

pub mod format;

mod decode;
mod file;
mod restore;
mod save;

use std::path::PathBuf;
use std::time::Duration;

pub use decode::{decode, decode_from};
pub use format::{encode, reseal, DecodeError, Identity, Saved, SavedObject};
pub use restore::{fill, restore, Loaded, Warm};
pub use save::Saver;

use crate::cache::RestoreError;
use crate::resource::Rv;
use crate::upstream::Upstream;
use crate::wanted::Wanted;

/// `--state-dir`, `--state-sync-period`, `--state-resources`.
#[derive(Clone, Debug)]
pub struct StateOptions {
    pub dir: PathBuf,
    pub sync_period: Duration,
    /// Which cached resources are written (default: all but `secrets`).
    pub resources: Wanted,
}

impl StateOptions {
    /// Whether the state of `(group, resource)` may be on disk. Secrets only when named: a
    /// wildcard never takes them, whatever its exclusions (`*,-events` writes no Secret).
    pub fn persists(&self, group: &str, resource: &str) -> bool {
        let w = &self.resources;
        let secrets = group.is_empty() && resource == "secrets";
        w.names(group, resource) || (w.all && !secrets && !w.is_excluded(group, resource))
    }
}

#[cfg(test)]
mod persists_tests {
    use super::*;

    fn opts(resources: &[&str]) -> StateOptions {
        let entries: Vec<String> = resources.iter().map(|s| s.to_string()).collect();
        StateOptions {
            dir: PathBuf::new(),
            sync_period: Duration::from_secs(60),
            resources: Wanted::parse(&entries).unwrap(),
        }
    }

    #[test]
    fn secrets_are_written_only_when_named() {
        for wildcard in [&["*"][..], &["*", "-events"], &["*", "-secrets"]] {
            let o = opts(wildcard);
            assert!(!o.persists("", "secrets"), "{wildcard:?}");
            assert!(o.persists("", "configmaps"), "{wildcard:?}");
            // A custom resource called secrets is not the core one.
            assert!(o.persists("example.com", "secrets"), "{wildcard:?}");
        }
        assert!(!opts(&["*", "-events"]).persists("", "events"));
        assert!(opts(&["configmaps", "secrets"]).persists("", "secrets"));
        assert!(opts(&["*", "secrets"]).persists("", "secrets"));
        assert!(!opts(&["configmaps"]).persists("", "secrets"));
    }
}

/// Why a saved state is not used (the resource then starts cold).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("unreadable: {0}")]
    Unreadable(String),
    #[error("not trusted: {0}")]
    Untrusted(String),
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("the upstream cluster's identity could not be fetched: {0}")]
    IdentityUnknown(String),
    #[error("saved from another cluster ({saved}), the upstream is {now}")]
    OtherCluster { saved: String, now: String },
    #[error("saved for version {saved}, the upstream serves {served}")]
    OtherVersion { saved: String, served: String },
    #[error("the upstream's current resourceVersion could not be read: {0}")]
    Unchecked(String),
    #[error("the upstream is at resourceVersion {upstream}, behind the saved {saved} (etcd restored from a backup?)")]
    UpstreamBehind { saved: Rv, upstream: Rv },
    #[error("a saved object cannot be used: {0}")]
    BadObject(String),
    #[error("the saved history is inconsistent: {0}")]
    Restore(#[from] RestoreError),
    #[error(
        "the resource is not cached at start (not served by the upstream now); a cache started later lists"
    )]
    NotCached,
    #[error("{bytes} bytes of state past --cache-memory-limit ({limit} bytes) with the smaller states; the resource lists")]
    MemoryLimit { bytes: u64, limit: u64 },
    #[error("the file {file} holds the state of {holds}, whose file is another (a copy?)")]
    Misnamed { file: String, holds: String },
}

impl Refusal {
    /// The `result` label of `watchcache_state_loads_total`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::Unreadable(_) => "unreadable",
            Refusal::Untrusted(_) => "untrusted",
            Refusal::Decode(d) => d.as_str(),
            Refusal::IdentityUnknown(_) => "identity_unknown",
            Refusal::OtherCluster { .. } => "other_cluster",
            Refusal::OtherVersion { .. } => "other_version",
            Refusal::Unchecked(_) => "unchecked",
            Refusal::UpstreamBehind { .. } => "upstream_behind",
            Refusal::Misnamed { .. } => "misnamed",
            Refusal::BadObject(_) | Refusal::Restore(_) => "corrupt",
            Refusal::NotCached => "not_cached",
            Refusal::MemoryLimit { .. } => "memory_limit",
        }
    }
}

/// Every `result` of `watchcache_state_loads_total` (created at 0).
pub const LOAD_RESULTS: &[&str] = &[
    "restored",
    "unreadable",
    "untrusted",
    "truncated",
    "corrupt",
    "checksum",
    "format_version",
    "identity_unknown",
    "misnamed",
    "other_cluster",
    "other_version",
    "unchecked",
    "upstream_behind",
    "not_cached",
    "memory_limit",
];

#[derive(serde::Deserialize)]
struct Namespace {
    metadata: NamespaceMeta,
}

#[derive(serde::Deserialize)]
struct NamespaceMeta {
    #[serde(default)]
    uid: String,
}

/// The upstream cluster's identity: its URL and the `kube-system` namespace's UID.
/// Times an answer a warm start needs (the cluster's identity, a resource's current RV) is
/// asked for before the saved states it would check are given up: one 429 under APF, a 503
/// or a timeout from an apiserver restarting with the proxy sent every resource to a full
/// list — from etcd on 1.28–1.30, from every replica at once (found by a review).
const CHECK_TRIES: u32 = 5;

/// The bound of one try of [`checked`].
const CHECK_TRY_TIMEOUT: Duration = Duration::from_secs(10);

/// `ask` until it is answered, refused for good (a 4xx other than 429, an answer that cannot
/// be read) or [`CHECK_TRIES`] tries failed; each try within [`CHECK_TRY_TIMEOUT`], then 1 s
/// doubling, jittered, or the answer's `retryAfterSeconds` if longer (at most 30 s).
pub(crate) async fn checked<T, F, Fut>(mut ask: F) -> Result<T, crate::upstream::UpstreamError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::upstream::UpstreamError>>,
{
    use crate::upstream::UpstreamError;
    let mut wait = Duration::from_secs(1);
    let mut tries = 1;
    loop {
        let answer = match tokio::time::timeout(CHECK_TRY_TIMEOUT, ask()).await {
            Ok(a) => a,
            Err(_) => Err(UpstreamError::Transport(format!("no answer within {CHECK_TRY_TIMEOUT:?}"))),
        };
        match answer {
            Err(e) if e.is_transient() && tries < CHECK_TRIES => {
                let pause =
                    wait.mul_f64(1.0 + fastrand::f64()).max(e.retry_after()).min(Duration::from_secs(30));
                tracing::debug!(error = %e, ?pause, "a warm start's check failed; asking again");
                tokio::time::sleep(pause).await;
                wait *= 2;
                tries += 1;
            }
            other => return other,
        }
    }
}

pub async fn identity(upstream: &Upstream) -> Result<Identity, String> {
    let body =
        checked(|| upstream.get_json("/api/v1/namespaces/kube-system")).await.map_err(|e| e.to_string())?;
    let ns: Namespace = serde_json::from_slice(&body).map_err(|e| format!("kube-system namespace: {e}"))?;
    if ns.metadata.uid.is_empty() {
        return Err("the kube-system namespace has no uid".into());
    }
    Ok(Identity { server: upstream.base_url().to_owned(), cluster_uid: ns.metadata.uid })
}

#[cfg(test)]
mod checked_tests {
    use super::*;
    use crate::upstream::UpstreamError;

    fn status(code: u16, retry_after: Option<u64>) -> UpstreamError {
        let details =
            retry_after.map_or(serde_json::json!({}), |s| serde_json::json!({ "retryAfterSeconds": s }));
        let status = serde_json::json!({ "kind": "Status", "code": code, "details": details });
        UpstreamError::Status { code, status: Some(status), body: bytes::Bytes::new() }
    }

    /// A warm start's check is asked again on 429 (after its `retryAfterSeconds`), 5xx and no
    /// answer, up to its bound; a 4xx refusal is final. Paused time: the waits are measured.
    #[tokio::test(start_paused = true)]
    async fn a_check_is_asked_again_while_the_upstream_is_busy() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        let run = |answers: Vec<Option<UpstreamError>>| async move {
            let tries = AtomicU32::new(0);
            let answers = parking_lot::Mutex::new(answers.into_iter());
            let t = tokio::time::Instant::now();
            let r = checked(|| {
                tries.fetch_add(1, SeqCst);
                let next = answers.lock().next();
                async move {
                    match next {
                        Some(Some(e)) => Err(e),
                        Some(None) => Ok(()),
                        // No answer at all: a try's own bound ends it.
                        None => std::future::pending().await,
                    }
                }
            })
            .await;
            (r.map_err(|e| e.status_code()), tries.load(SeqCst), t.elapsed())
        };
        // 429 with retryAfterSeconds 3, a 503, then the answer.
        let (r, tries, took) = run(vec![Some(status(429, Some(3))), Some(status(503, None)), None]).await;
        assert_eq!((r, tries), (Ok(()), 3));
        assert!(took >= Duration::from_secs(5) && took <= Duration::from_secs(8), "{took:?}");
        // Forbidden: final at once.
        let (r, tries, took) = run(vec![Some(status(403, None))]).await;
        assert_eq!((r, tries, took), (Err(Some(403)), 1, Duration::ZERO));
        // Never answered: five tries of 10 s each, and the waits between.
        let (r, tries, took) = run(Vec::new()).await;
        assert_eq!((r, tries), (Err(None), CHECK_TRIES));
        assert!(took >= Duration::from_secs(65), "{took:?}");
    }
}
