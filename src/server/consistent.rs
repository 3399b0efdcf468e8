//! Most Recent reads (resourceVersion unset) from the cache, for a proxy whose upstream offers
//! no way to ask "has my watch stream delivered everything up to revision R?".
//!
//! The apiserver's own cache proves freshness by asking etcd for a progress notification on its
//! watch. The proxy cannot: other resources (Leases, Events) move the revision many times a
//! second, and the cached resource's stream reaches that revision only on its own next event or
//! an upstream BOOKMARK (about once a minute). So the proxy proves what it can, and never waits
//! blindly:
//!
//! - **Probe** (Most Recent LIST, and a watch without initial events): one coalesced upstream
//!   `LIST ?limit=1` gives a revision R sent after the request arrived. A LIST is served from
//!   the cache when the cache RV is already ≥ R (or reaches it within `--consistent-read-wait`,
//!   0 by default); otherwise it is forwarded at once. After three probes in a row that could
//!   not prove freshness, only one LIST in eight probes; the others are forwarded without one,
//!   so a busy cluster pays for at most a few useless probes. A watch needs no proof: it
//!   starts after R (events ≤ R skipped, bookmarks held until the cache passes R).
//! - **Metadata proof** (a Most Recent LIST the probe could not prove): one upstream consistent
//!   LIST of the request's own selection and limit as `PartialObjectMetadataList` (keys and
//!   resourceVersions, no bodies) at revision R. If the cache's page has exactly the same
//!   objects at the same versions (and the same continuation), the cache's state *is* the
//!   state at R: the cache's bytes are served with list RV R (an RV the upstream issued; a
//!   continue token at R is served by the upstream, tokens being interchangeable). Otherwise the
//!   LIST is forwarded. Objects created and deleted again before R do not matter to a LIST.
//!   At most [`MAX_OWN_READS`] upstream reads of these two kinds at once for the whole proxy,
//!   [`MAX_OWN_READS_PER_USER`] on behalf of one user; past that, forwarded (`OwnRead`). A
//!   proof of a LIST without a limit (or one past a page) also takes a long list's slot.
//! - **Initial lists** (watch-list, `sendInitialEvents=true` with RV unset, what client-go ≥
//!   1.34 informers send): one coalesced, paginated upstream consistent LIST of the watch's own
//!   namespace and selectors, metadata only, at RV L. If the cache has already reached L when
//!   the first page lands, the rest is not fetched and the cache's own state is sent. Else the
//!   same proof as above: once the cache's state selects exactly the listed objects at their
//!   versions (waited for up to [`PROOF_WAIT`] while the cache receives what it lacks), it is
//!   the state at L, sent from a snapshot, and the live stream is the cache's from L
//!   (`WatchStart::Proven`); past the wait, forwarded. No object body is read upstream, and
//!   nothing is copied per start. The long-lived watch never goes upstream. At most
//!   `MAX_LONG_INITIAL_LISTS` lists longer than a page at once for the whole proxy; a start
//!   waits `SLOT_WAIT` for one (or for the cache to reach the list's RV), then is forwarded.
//!
//! Reads are shared through [`Flights`]: a request only shares a read sent after it arrived.
//! Each reads the cache's RV before it is sent: an answer below it is an upstream whose storage
//! went back (etcd restored without a revision bump), and has the cache relisted.
//! Used by `server::serve`; with `flights`, the only place in `server` that asks the upstream
//! on its own behalf.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::flights::Flights;
use crate::cache::{Filter, Reader, Snapshot};
use crate::resource::Rv;
use crate::upstream::{MetadataPage, Selection, Upstream};

/// Proofs of one kind that failed in a row before that kind is thinned out.
const MISSES_BEFORE_THINNING: u32 = 3;
/// While thinned out, one Most Recent LIST in this many still tries that kind of proof.
const THINNED_PROBE_EVERY: u32 = 8;

/// How one kind of proof has fared lately: after [`MISSES_BEFORE_THINNING`] failures in a row
/// only one request in [`THINNED_PROBE_EVERY`] tries it, so a kind that keeps failing (probes
/// while other resources move the revision, metadata proofs while the resource itself churns)
/// costs few useless upstream reads; one success restores it.
#[derive(Default)]
pub struct Streak {
    misses: AtomicU32,
    thinned: AtomicU32,
}

impl Streak {
    /// Whether this request should try the proof.
    pub fn should_try(&self) -> bool {
        self.misses.load(Ordering::Relaxed) < MISSES_BEFORE_THINNING
            || self.thinned.fetch_add(1, Ordering::Relaxed).is_multiple_of(THINNED_PROBE_EVERY)
    }

    /// Records whether the proof held.
    pub fn record(&self, proven: bool) {
        if proven {
            self.misses.store(0, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
    }
}
/// Page size of initial lists' metadata (client-go's pager and the reflector use 500 too).
const INITIAL_PAGE: u32 = 500;
/// An upstream read that takes longer than this is given up (then: forward).
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a watch-list's start waits for the cache to hold the state the upstream listed
/// (the apiserver's own cache waits as long for freshness); past it the watch is forwarded.
pub(crate) const PROOF_WAIT: Duration = Duration::from_secs(3);

/// Upstream reads the proxy makes as itself for callers' requests — metadata proofs and
/// initial lists (their first page; a longer one holds its read through) — in the air at once,
/// across every resource. They go in the proxy's own API Priority and Fairness flow, which
/// every caller's TokenReviews and SubjectAccessReviews share too: one caller sending
/// Most Recent LISTs or watch-lists that share no read (`x>1`, `x>2`, … — one review, each a
/// read of its own; a review found the watch-lists unbounded) must not pile them up there.
/// Past it a proof's LIST is forwarded at once, a watch-list start waits up to
/// [`OWN_READ_WAIT`] (first come, first served) and then is forwarded: under the caller's own
/// identity and flow, where the apiserver charges it.
const MAX_OWN_READS: usize = 64;
static OWN_READS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_OWN_READS);
/// Of [`MAX_OWN_READS`], at most this many for one user's requests in the air (by the user who
/// authenticated, not one it impersonates; each request counts, whichever's read is sent), so
/// one user cannot hold the proxy's reads from the others: past it that user's Most Recent
/// LISTs are forwarded at once, its watch-list starts wait up to [`OWN_READ_WAIT`] for one of
/// its own to end (a controller manager's restart starts tens at once), then are forwarded.
/// Not counted with `--auth=none` (every caller is the proxy).
const MAX_OWN_READS_PER_USER: usize = 8;
/// How long a watch-list start waits for one of [`OWN_READS`].
const OWN_READ_WAIT: Duration = Duration::from_secs(5);
static OWN_READS_BY_USER: std::sync::LazyLock<
    parking_lot::Mutex<std::collections::HashMap<Arc<str>, usize>>,
> = std::sync::LazyLock::new(Default::default);

/// One of a user's [`MAX_OWN_READS_PER_USER`], taken by each of its requests that may need a
/// read as the proxy (whichever request's read is in the air: a flight's later reads run the
/// first request's closure), given back when the request is answered.
struct UserShare(Arc<str>);

/// Rung when a user's share is given back (those waiting try again).
static SHARE_FREED: tokio::sync::Notify = tokio::sync::Notify::const_new();

impl UserShare {
    fn take(user: &Arc<str>) -> Result<UserShare, String> {
        let mut by_user = OWN_READS_BY_USER.lock();
        let n = by_user.entry(user.clone()).or_default();
        if *n >= MAX_OWN_READS_PER_USER {
            return Err(format!("{MAX_OWN_READS_PER_USER} upstream reads for this user in the air"));
        }
        *n += 1;
        Ok(UserShare(user.clone()))
    }

    /// A share for `user` (`None`: `--auth=none`, nothing counted), waiting up to `wait` for
    /// one of the user's own to be given back (zero: not at all).
    async fn wait(user: Option<&Arc<str>>, wait: Duration) -> Result<Option<UserShare>, String> {
        let Some(user) = user else { return Ok(None) };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let freed = SHARE_FREED.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match UserShare::take(user) {
                Ok(share) => return Ok(Some(share)),
                Err(e) if wait.is_zero() => return Err(e),
                Err(e) => {
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return Err(e);
                    }
                }
            }
        }
    }
}

impl Drop for UserShare {
    fn drop(&mut self) {
        {
            let mut by_user = OWN_READS_BY_USER.lock();
            if let Some(n) = by_user.get_mut(&self.0) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    by_user.remove(&self.0);
                }
            }
        }
        SHARE_FREED.notify_waiters();
    }
}

/// One of [`OWN_READS`], waiting up to `wait` for it (zero: not at all); held by the read.
async fn own_read(wait: Duration) -> Result<tokio::sync::SemaphorePermit<'static>, String> {
    let permit = if wait.is_zero() {
        OWN_READS.try_acquire().ok()
    } else {
        tokio::time::timeout(wait, OWN_READS.acquire()).await.ok().and_then(Result::ok)
    };
    permit.ok_or_else(|| format!("{MAX_OWN_READS} upstream reads in the air"))
}

/// Initial lists read past their first page (selections of more than [`INITIAL_PAGE`]
/// objects: controllers' informers, not kubelets') at once, across every resource, and metadata
/// proofs of LISTs without a limit or past a page (which read whole selections; refused at once
/// past it, the LIST forwarded): each holds
/// its selection's keys and versions (~90 B an object) while it proves, and is read as the
/// proxy. One caller's watch-lists of distinct selections (`a!=1`, `a!=2`, … each a flight of its
/// own) made as many whole-collection reads as its in-flight share allowed (found by a review:
/// 400 of 150 000 pods, gigabytes). Past it a start waits up to [`SLOT_WAIT`] for one (or for
/// the cache to reach the list's RV: then nothing more is read), then is forwarded, under the
/// caller's own identity and flow. Sized for a control plane's restart (kube-controller-manager,
/// the scheduler and a few operators: some tens of distinct long selections, each read in
/// seconds), so that their starts wait rather than go upstream; ~400 MiB at most at 150 000
/// objects each.
const MAX_LONG_INITIAL_LISTS: usize = 32;
/// How long a start waits for a slot of [`LONG_INITIAL_LISTS`] (within its read's
/// [`READ_TIMEOUT`]).
const SLOT_WAIT: Duration = Duration::from_secs(20);
static LONG_INITIAL_LISTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_LONG_INITIAL_LISTS);

/// A metadata-only upstream page, or why there is none.
type MetadataResult = Result<Arc<MetadataPage>, String>;

/// The initial state of a watch-list, proven from one upstream consistent metadata LIST.
#[derive(Clone)]
pub enum Initial {
    /// The cache had reached the list's RV: its own state is fresh.
    Cache,
    /// `snapshot`'s selection is the upstream's state at `rv` (same objects, same versions),
    /// the cache being behind `rv`.
    Proven { rv: Rv, snapshot: Snapshot },
}

/// A probe's answer: a revision the upstream issued after a request arrived, and the cache's
/// history (`Reader::histories`) it was answered in: a start from it is of that history only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fresh {
    pub rv: Rv,
    pub histories: u64,
}

/// The consistent-read machinery of one resource.
pub struct Prober {
    upstream: Upstream,
    reader: Reader,
    probes: Arc<Flights<(), Result<Fresh, String>>>,
    initial: Arc<Flights<Selection, Result<Initial, String>>>,
    metadata: Arc<Flights<(Selection, Option<u32>), MetadataResult>>,
    /// How probes (`LIST ?limit=1`) and metadata proofs have fared.
    pub probes_streak: Streak,
    pub metadata_streak: Streak,
}

impl Prober {
    pub fn new(upstream: Upstream, reader: Reader) -> Arc<Prober> {
        Arc::new(Prober {
            upstream,
            reader,
            probes: Arc::default(),
            initial: Arc::default(),
            metadata: Arc::default(),
            probes_streak: Streak::default(),
            metadata_streak: Streak::default(),
        })
    }

    /// A revision the upstream issued after `arrived` (a coalesced `LIST ?limit=1`), and the
    /// cache's history it was read in (`Reader::histories`).
    ///
    /// The cache's RV is read before the probe is sent: the upstream's answer is at least every
    /// RV it issued before, unless its storage went back (etcd restored without
    /// `--bump-revision`); then the cache is relisted (as by the consistency check), never
    /// proven fresh by an RV below its own.
    pub async fn fresh_rv(&self, arrived: Instant) -> Result<Fresh, String> {
        let upstream = self.upstream.clone();
        let reader = self.reader.clone();
        let fetch = move || {
            let (upstream, reader) = (upstream.clone(), reader.clone());
            async move {
                // The history first: a relist between the two reads then shows as a new history, never
                // as an upstream below a cache RV read from the history after it.
                let histories = reader.histories();
                let before = reader.progress().rv;
                match tokio::time::timeout(READ_TIMEOUT, upstream.list_page(reader.kind(), 1, None, None))
                    .await
                {
                    Ok(r) => {
                        let rv = r.map(|p| p.rv).map_err(|e| e.to_string())?;
                        not_behind(&reader, before, rv)?;
                        // Answered from a history that is gone since (the cache relisted below
                        // its RV meanwhile): a watch from it would skip the new history's
                        // changes up to it (review).
                        if reader.histories() != histories {
                            return Err("the upstream's storage went back during the probe".into());
                        }
                        Ok(Fresh { rv, histories })
                    }
                    Err(_) => Err("probe timed out".to_owned()),
                }
            }
        };
        self.probes.join((), arrived, fetch).await.unwrap_or_else(|| Err("probe task ended".into()))
    }

    /// What the upstream has now (sent after `arrived`) in `sel`'s first `limit` items, metadata
    /// only: keys and resourceVersions, to compare with the cache; for `user`'s request
    /// (`None`: `--auth=none`), refused at once past [`MAX_OWN_READS`] or the user's share, and
    /// past [`MAX_LONG_INITIAL_LISTS`] for a read of more than a page.
    pub async fn metadata(
        &self,
        sel: Selection,
        limit: Option<u32>,
        arrived: Instant,
        user: Option<Arc<str>>,
    ) -> MetadataResult {
        let _share = UserShare::wait(user.as_ref(), Duration::ZERO).await?;
        let (upstream, reader) = (self.upstream.clone(), self.reader.clone());
        let key = (sel.clone(), limit);
        let fetch = move || {
            let (upstream, reader, sel) = (upstream.clone(), reader.clone(), sel.clone());
            async move {
                let _one = own_read(Duration::ZERO).await?;
                let _long = match limit {
                    Some(l) if l <= INITIAL_PAGE => None,
                    _ => Some(LONG_INITIAL_LISTS.try_acquire().map_err(|_| {
                        format!("{MAX_LONG_INITIAL_LISTS} lists of more than one page in the air")
                    })?),
                };
                // The history first: a relist between the two reads then shows as a new history, never
                // as an upstream below a cache RV read from the history after it.
                let histories = reader.histories();
                let before = reader.progress().rv;
                match tokio::time::timeout(READ_TIMEOUT, upstream.list_metadata(reader.kind(), &sel, limit))
                    .await
                {
                    Ok(r) => {
                        let page = r.map_err(|e| e.to_string())?;
                        not_behind(&reader, before, page.rv)?;
                        // Answered from a history that is gone since (the cache relisted below
                        // its RV meanwhile): its RV names another state now.
                        if reader.histories() != histories {
                            return Err("the upstream's storage went back during the metadata list".into());
                        }
                        Ok(Arc::new(page))
                    }
                    Err(_) => Err("metadata list timed out".to_owned()),
                }
            }
        };
        self.metadata
            .join(key, arrived, fetch)
            .await
            .unwrap_or_else(|| Err("metadata list task ended".into()))
    }

    /// The initial state of a watch-list of `sel` (selecting as `filter` does, without a
    /// shard) that arrived at `arrived`, for `user`'s request (`None`: `--auth=none`): it waits
    /// up to [`OWN_READ_WAIT`] for one of its user's shares, its read as long again for one
    /// of [`MAX_OWN_READS`].
    pub async fn initial(
        &self,
        sel: Selection,
        filter: Filter,
        arrived: Instant,
        user: Option<Arc<str>>,
    ) -> Result<Initial, String> {
        let _share = UserShare::wait(user.as_ref(), OWN_READ_WAIT).await?;
        let (upstream, reader) = (self.upstream.clone(), self.reader.clone());
        let key = sel.clone();
        let fetch = move || {
            let (upstream, reader, sel, filter) =
                (upstream.clone(), reader.clone(), sel.clone(), filter.clone());
            async move {
                let one = own_read(OWN_READ_WAIT).await?;
                let listed =
                    match tokio::time::timeout(READ_TIMEOUT, list_initial(&upstream, &reader, &sel)).await {
                        Ok(r) => r?,
                        Err(_) => return Err("initial list timed out".to_owned()),
                    };
                // Read: the proof below asks the upstream nothing.
                drop(one);
                match listed {
                    Listed::Fresh => Ok(Initial::Cache),
                    // A long list's slot is held while it proves (its items are held).
                    Listed::Ahead(meta, histories, _slot) => prove(&reader, &filter, &meta, histories).await,
                }
            }
        };
        self.initial.join(key, arrived, fetch).await.unwrap_or_else(|| Err("initial list task ended".into()))
    }
}

/// What the upstream listed for a watch-list.
enum Listed {
    /// The cache had reached its RV when the first page landed (the rest was not read).
    Fresh,
    /// Every item of the selection, metadata only, at an RV ahead of the cache; the cache's
    /// histories when it was asked for ([`Reader::histories`]); a slot of
    /// [`LONG_INITIAL_LISTS`] when it took more than one page.
    Ahead(MetadataPage, u64, Option<tokio::sync::SemaphorePermit<'static>>),
}

/// Lists `sel` upstream, metadata only (RV unset: a consistent read), stopping after the first
/// page when the cache has already reached that page's RV.
async fn list_initial(upstream: &Upstream, reader: &Reader, sel: &Selection) -> Result<Listed, String> {
    let kind = reader.kind();
    // The history first: a relist between the two reads then shows as a new history, never
    // as an upstream below a cache RV read from the history after it.
    let histories = reader.histories();
    let before = reader.progress().rv;
    let first = upstream.list_metadata(kind, sel, Some(INITIAL_PAGE)).await.map_err(|e| e.to_string())?;
    not_behind(reader, before, first.rv)?;
    let p = reader.progress();
    if p.ready && p.rv >= first.rv {
        return Ok(Listed::Fresh);
    }
    let slot = match first.continue_token.as_deref() {
        Some(t) if !t.is_empty() => {
            // Waiting for a slot, the cache may reach the page's RV: then nothing more is read.
            let mut progress = reader.subscribe();
            let reached = progress.wait_for(|p| p.ready && p.rv >= first.rv);
            let slot = tokio::time::timeout(SLOT_WAIT, async {
                tokio::select! {
                    slot = LONG_INITIAL_LISTS.acquire() => slot.ok(),
                    ok = async { reached.await.is_ok() } => if ok { None } else { std::future::pending().await },
                }
            });
            match slot.await {
                Ok(Some(slot)) => Some(slot),
                Ok(None) => return Ok(Listed::Fresh),
                Err(_) => {
                    return Err(format!(
                        "{MAX_LONG_INITIAL_LISTS} initial lists of more than one page in the air"
                    ))
                }
            }
        }
        _ => None,
    };
    let all = upstream.list_metadata_from(kind, sel, None, Some(first)).await.map_err(|e| e.to_string())?;
    if all.continue_token.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err("the upstream's metadata list did not end".to_owned());
    }
    Ok(Listed::Ahead(all, histories, slot))
}

/// Waits up to [`PROOF_WAIT`] for the cache to reach the list's RV or to select exactly its
/// objects at their versions: then the state at the list's RV *is* the cache's (an object
/// changed, added or removed after the cache's RV and up to the list's would show in one or
/// the other; one created and deleted between them is in neither state), and the watch starts
/// from it with no object body read upstream. The cache, behind, receives what it lacks within
/// its stream's delay; one that does not is left to the upstream (forward). A state of another
/// history than the list's (`histories`: the upstream's storage went back since it answered)
/// proves nothing: its RV names another state upstream, and events after the new history's
/// list RV up to it would be skipped.
async fn prove(
    reader: &Reader,
    filter: &Filter,
    meta: &MetadataPage,
    histories: u64,
) -> Result<Initial, String> {
    let versions = || meta.items.iter().map(|(ns, name, rv)| (ns.as_str(), name.as_str(), *rv));
    let same = |snap: &Snapshot| {
        snap.histories == histories && reader.selects_exactly(&snap.store, filter.clone(), versions())
    };
    match wait_for_state(reader, meta.rv, Instant::now() + PROOF_WAIT, same).await {
        Some(Some(snap)) => Ok(Initial::Proven { rv: meta.rv, snapshot: snap }),
        Some(None) => Ok(Initial::Cache),
        None => {
            Err(format!("the cache did not hold the upstream's state at {} within {PROOF_WAIT:?}", meta.rv))
        }
    }
}

/// First pause before comparing the cache's state again; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// Until `deadline`: `Some(None)` once the cache has reached `rv`, `Some(Some(snapshot))` once
/// `same` holds for a snapshot of it (ready, behind `rv`), `None` past the deadline. `same`
/// reads the whole selection, so it is asked again only after the cache moved and a pause
/// that doubles (about ten times in all, however fast events come), never per event; a pause
/// ends as soon as the cache reaches `rv`.
async fn wait_for_state(
    reader: &Reader,
    rv: Rv,
    deadline: Instant,
    mut same: impl FnMut(&Snapshot) -> bool,
) -> Option<Option<Snapshot>> {
    let mut progress = reader.subscribe();
    let mut compared: Option<(Rv, u64)> = None;
    let mut pause = FIRST_PAUSE;
    loop {
        let (ready, unservable) = {
            let p = progress.borrow_and_update();
            (p.ready, p.unservable)
        };
        // It will not move until a list parses whole (`cache::unparsable`): forwarded.
        if unservable {
            return None;
        }
        if ready {
            let snap = reader.snapshot();
            if snap.rv >= rv {
                return Some(None);
            }
            // A relist at the same RV is another state: compared again.
            if compared != Some((snap.rv, snap.lists)) {
                compared = Some((snap.rv, snap.lists));
                if same(&snap) {
                    return Some(Some(snap));
                }
                drop(snap);
                // The pause ends early once the cache reaches `rv` (no comparison is needed).
                let until = deadline.min(Instant::now() + pause);
                let reached = progress.wait_for(|p| (p.ready && p.rv >= rv) || p.unservable);
                if let Ok(Err(_)) = tokio::time::timeout_at(until, reached).await {
                    return None;
                }
                pause = (pause * 2).min(LONGEST_PAUSE);
                if Instant::now() < deadline {
                    continue;
                }
            }
        }
        match tokio::time::timeout_at(deadline, progress.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return None,
        }
    }
}

/// A consistent read sent after the cache's RV was read as `before` answered at `upstream`: at
/// least every RV the upstream issued before it, unless its storage went back (etcd restored
/// without `--bump-revision`). Then the cache is relisted, as by the consistency check
/// (`Writer::replace` takes the lower RV), and the read proves nothing: `Err`, the request is
/// forwarded.
fn not_behind(reader: &Reader, before: Rv, upstream: Rv) -> Result<(), String> {
    if upstream >= before {
        return Ok(());
    }
    reader.upstream_went_back(before, upstream, "consistent read");
    Err(format!("the upstream is at {upstream}, below the cache's {before}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{new, CacheOptions};
    use crate::resource::{EventType, ResourceKind};

    /// The tests of the process-wide bounds (`OWN_READS`, `LONG_INITIAL_LISTS`, the users'
    /// shares) run one at a time: under `cargo test` they share one process.
    static BOUNDS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Takes [`BOUNDS`] once the test before has given every permit and share back (its
    /// aborted tasks are dropped with its runtime, just after its lock).
    async fn bounds_to_myself() -> tokio::sync::MutexGuard<'static, ()> {
        let guard = BOUNDS.lock().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while OWN_READS.available_permits() < MAX_OWN_READS
            || LONG_INITIAL_LISTS.available_permits() < MAX_LONG_INITIAL_LISTS
            || !OWN_READS_BY_USER.lock().is_empty()
        {
            assert!(tokio::time::Instant::now() < deadline, "the bounds given back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        guard
    }

    /// An upstream that accepts connections and never answers (every read stays in the air),
    /// the connections it accepted, and its task.
    async fn silent_upstream() -> (Upstream, Arc<AtomicU32>, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU32::new(0));
        let counted = accepted.clone();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                conns.push(c);
            }
        });
        (crate::upstream::testutil::client_of(addr), accepted, held)
    }

    /// A filter selecting every object.
    fn every() -> crate::cache::Filter {
        crate::cache::Filter::new(
            None,
            None,
            crate::selector::LabelSelector::default(),
            crate::selector::FieldSelector::default(),
        )
    }

    /// A configmaps cache ready at RV 10, empty.
    fn cache_at_10() -> (crate::cache::Writer, Reader) {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions::default());
        w.replace(Vec::new(), Rv(10));
        (w, r)
    }

    fn cm(w: &crate::cache::Writer, name: &str, rv: u64) -> crate::resource::Object {
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}}}}"#
        );
        w.parse(bytes::Bytes::from(json)).unwrap()
    }

    /// A probe answered from the history the cache has left since (it relisted below its RV
    /// while the probe was out) names no revision of the new one: no fresh RV. The upstream
    /// answers only when told (a signal, no timing).
    #[tokio::test]
    async fn a_probe_answered_from_a_gone_history_is_no_fresh_rv() {
        use crate::upstream::testutil::{full, handler, serve};
        let (asked_tx, mut asked) = tokio::sync::mpsc::unbounded_channel::<()>();
        let release = Arc::new(tokio::sync::Notify::new());
        let r2 = release.clone();
        let addr = serve(handler(move |_, _| {
            let (asked_tx, release) = (asked_tx.clone(), r2.clone());
            async move {
                let _ = asked_tx.send(());
                release.notified().await;
                let body = r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"20"},"items":[]}"#;
                http::Response::builder().header("content-type", "application/json").body(full(body)).unwrap()
            }
        }))
        .await;
        for went_back in [false, true] {
            let (mut w, r) = cache_at_10();
            let prober = Prober::new(crate::upstream::testutil::client_of(addr), r.clone());
            let probing = tokio::spawn(async move { prober.fresh_rv(Instant::now()).await });
            asked.recv().await.unwrap();
            if went_back {
                // Listed at 8, below the cache's 10: another history.
                w.replace(Vec::new(), Rv(8));
            }
            release.notify_one();
            let got = probing.await.unwrap();
            if went_back {
                assert!(got.as_ref().is_err_and(|e| e.contains("went back during the probe")), "{got:?}");
            } else {
                assert_eq!(got.map(|f| f.rv), Ok(Rv(20)));
            }
        }
    }

    /// At most `MAX_OWN_READS` metadata proofs read upstream at once, whatever their
    /// keys: the next is refused at once (its LIST forwarded), and a slot comes back when a read
    /// ends (here: its only waiter gave up, which cancels it).
    #[tokio::test]
    async fn metadata_proofs_in_the_air_are_bounded_across_keys() {
        let _one_at_a_time = bounds_to_myself().await;
        // An upstream that accepts and never answers: every read stays in the air.
        let (upstream, _accepted, held) = silent_upstream().await;
        let (_w, r) = cache_at_10();
        let prober = Prober::new(upstream, r);
        let sel =
            || Selection { namespace: None, label_selector: String::new(), field_selector: String::new() };
        let mut waiting = Vec::new();
        for limit in 0..MAX_OWN_READS as u32 {
            let p = prober.clone();
            waiting.push(tokio::spawn(async move {
                p.metadata(sel(), Some(limit + 1), Instant::now(), None).await
            }));
        }
        let until = |f: fn() -> bool| async move {
            tokio::time::timeout(Duration::from_secs(5), async {
                while !f() {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .is_ok()
        };
        assert!(until(|| OWN_READS.available_permits() == 0).await, "every slot taken");
        let refused = prober.metadata(sel(), Some(100_000), Instant::now(), None).await;
        assert!(refused.is_err_and(|e| e.contains("upstream reads in the air")));
        // One waiter gives up: its read is cancelled and its slot comes back.
        waiting.pop().unwrap().abort();
        assert!(until(|| OWN_READS.available_permits() == 1).await, "the slot is back");
        let next = tokio::time::timeout(
            Duration::from_millis(200),
            prober.metadata(sel(), Some(100_001), Instant::now(), None),
        )
        .await;
        assert!(next.is_err(), "in the air, not refused");
        for t in waiting {
            t.abort();
        }
        held.abort();
    }

    /// One user's requests hold at most `MAX_OWN_READS_PER_USER` of the proxy's upstream reads,
    /// metadata proofs and watch-list starts alike (a review: `labelSelector=x>1`, `x>2`, … one
    /// access review, each a read as the proxy): past them that user's next read is refused at
    /// once (its request forwarded as itself), while another user's still goes up; a read
    /// ended gives its share back. A watch-list start waits for the proxy's slots (it does not
    /// wait for its user's share).
    #[tokio::test]
    async fn one_users_upstream_reads_are_bounded_and_others_go_on() {
        let _one_at_a_time = bounds_to_myself().await;
        let (upstream, _accepted, held) = silent_upstream().await;
        let (_w, r) = cache_at_10();
        let prober = Prober::new(upstream, r);
        let sel = |labels: &str| Selection {
            namespace: None,
            label_selector: labels.to_owned(),
            field_selector: String::new(),
        };
        let filter = every();
        let mallory: Arc<str> = Arc::from("mallory");
        let in_air = || OWN_READS_BY_USER.lock().get("mallory").copied().unwrap_or(0);
        let mut held_reads = Vec::new();
        for i in 0..MAX_OWN_READS_PER_USER {
            let (p, u, f) = (prober.clone(), mallory.clone(), filter.clone());
            held_reads.push(if i % 2 == 0 {
                tokio::spawn(async move {
                    p.metadata(sel(&format!("x>{i}")), Some(1), Instant::now(), Some(u)).await.map(|_| ())
                })
            } else {
                tokio::spawn(async move {
                    p.initial(sel(&format!("x>{i}")), f, Instant::now(), Some(u)).await.map(|_| ())
                })
            });
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while in_air() < MAX_OWN_READS_PER_USER {
            assert!(tokio::time::Instant::now() < deadline, "every share taken in time");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let refused = prober.metadata(sel("x>100"), Some(1), Instant::now(), Some(mallory.clone())).await;
        assert!(refused.is_err_and(|e| e.contains("for this user")), "a LIST's proof at once");
        // A watch-list start waits for one of its user's reads to end (a controller manager's
        // burst of starts), the others' going on.
        let (p, u, f) = (prober.clone(), mallory.clone(), filter.clone());
        let waiting =
            tokio::spawn(
                async move { p.initial(sel("x>101"), f, Instant::now(), Some(u)).await.map(|_| ()) },
            );
        // Another user's read goes up (in the air, not refused).
        let alice = tokio::time::timeout(
            Duration::from_millis(200),
            prober.initial(sel("x>102"), filter.clone(), Instant::now(), Some(Arc::from("alice"))),
        )
        .await;
        assert!(alice.is_err(), "in the air, not refused");
        assert!(!waiting.is_finished(), "waiting for its user's share");
        // One of mallory's reads ends: the waiting start takes its share.
        held_reads.pop().unwrap().abort();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "its read in the air");
        assert_eq!(in_air(), MAX_OWN_READS_PER_USER, "the share given back is the start's");
        let refused = prober.metadata(sel("x>103"), Some(1), Instant::now(), Some(mallory.clone())).await;
        assert!(refused.is_err_and(|e| e.contains("for this user")));
        waiting.abort();
        for t in held_reads {
            t.abort();
        }
        held.abort();
    }

    /// A watch-list start takes one of the proxy's `MAX_OWN_READS` for its first page: with
    /// every one taken it waits (first come, first served) and goes up when one is given back.
    #[tokio::test]
    async fn a_watch_list_start_waits_for_the_proxys_reads() {
        let _one_at_a_time = bounds_to_myself().await;
        // Connections accepted: each read in the air has its own (HTTP/1.1).
        let (upstream, accepted, held) = silent_upstream().await;
        let (_w, r) = cache_at_10();
        let prober = Prober::new(upstream, r);
        let sel =
            || Selection { namespace: None, label_selector: String::new(), field_selector: String::new() };
        let filter = every();
        let mut proofs = Vec::new();
        for limit in 0..MAX_OWN_READS as u32 {
            let p = prober.clone();
            proofs.push(tokio::spawn(async move {
                p.metadata(sel(), Some(limit + 1), Instant::now(), None).await
            }));
        }
        let all = MAX_OWN_READS as u32;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while accepted.load(Ordering::SeqCst) < all {
            assert!(tokio::time::Instant::now() < deadline, "every proof's read in the air in time");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let p = prober.clone();
        let start =
            tokio::spawn(async move { p.initial(sel(), filter, Instant::now(), None).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!start.is_finished(), "waiting for a read");
        assert_eq!(accepted.load(Ordering::SeqCst), all, "nothing more sent");
        proofs.pop().unwrap().abort();
        // The start takes the slot given back: its read goes up.
        while accepted.load(Ordering::SeqCst) == all {
            assert!(tokio::time::Instant::now() < deadline, "the start's read sent in time");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(OWN_READS.available_permits(), 0, "taken by the start");
        assert!(!start.is_finished(), "its read in the air");
        start.abort();
        for t in proofs {
            t.abort();
        }
        held.abort();
    }

    /// At most `MAX_LONG_INITIAL_LISTS` watch-list starts read a selection longer than a page
    /// at once, whatever their selectors: the next waits for a slot (and takes the one a
    /// cancelled read gives back) or for the cache to reach the list's RV, which ends its wait
    /// with nothing more read (it is refused after `SLOT_WAIT`: untested, 20 s). A selection
    /// of one page takes none.
    #[tokio::test]
    async fn initial_lists_longer_than_a_page_are_bounded_across_selections() {
        let _one_at_a_time = bounds_to_myself().await;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // First pages (no `continue=`) answered at revision 20 with a continuation; continued
        // pages never answered: every long read stays in the air.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let continued = Arc::new(AtomicU32::new(0));
        let seen = continued.clone();
        let held = tokio::spawn(async move {
            while let Ok((mut c, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match c.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end);
                        if head.lines().next().unwrap().contains("continue=") {
                            seen.fetch_add(1, Ordering::SeqCst);
                            std::future::pending::<()>().await;
                        }
                        // A long selection: a full first page (500) and a continuation.
                        let long = head.contains("labelSelector");
                        let items: Vec<String> = (0..if long { INITIAL_PAGE } else { 0 })
                            .map(|i| format!(r#"{{"metadata":{{"name":"o-{i}","namespace":"ns","resourceVersion":"5"}}}}"#))
                            .collect();
                        let body = format!(
                            r#"{{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{{"resourceVersion":"20"{}}},"items":[{}]}}"#,
                            if long { r#","continue":"next""# } else { "" },
                            items.join(",")
                        );
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if c.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let upstream = crate::upstream::testutil::client_of(addr);
        let (mut w, r) = cache_at_10();
        let prober = Prober::new(upstream, r.clone());
        let sel = |labels: &str| Selection {
            namespace: None,
            label_selector: labels.to_owned(),
            field_selector: String::new(),
        };
        let filter = every();
        let start = |labels: String| {
            let (p, f) = (prober.clone(), filter.clone());
            // Each start its own user's: the users' shares are another test's.
            let user = Some(Arc::from(labels.as_str()));
            tokio::spawn(async move { p.initial(sel(&labels), f, Instant::now(), user).await.map(|_| ()) })
        };
        let mut waiting: Vec<_> = (0..MAX_LONG_INITIAL_LISTS).map(|i| start(format!("a!={i}"))).collect();
        // Until every long read is in the air (each took its slot before asking).
        while continued.load(Ordering::SeqCst) < MAX_LONG_INITIAL_LISTS as u32 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(LONG_INITIAL_LISTS.available_permits(), 0);
        // A selection of one page needs no slot: proven (nothing listed, nothing cached).
        assert!(prober.initial(sel(""), filter.clone(), Instant::now(), None).await.is_ok());
        // The next long one waits, and takes the slot of a read given up.
        let next = start("a!=next".into());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!next.is_finished(), "waiting for a slot");
        assert_eq!(continued.load(Ordering::SeqCst), MAX_LONG_INITIAL_LISTS as u32);
        waiting.pop().unwrap().abort();
        while continued.load(Ordering::SeqCst) == MAX_LONG_INITIAL_LISTS as u32 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!next.is_finished(), "its read in the air");
        // With every slot taken, one more waits, until the cache reaches the list's RV: its
        // own state is fresh, nothing more is read.
        let last = start("a!=last".into());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!last.is_finished(), "waiting for a slot");
        w.bookmark(Rv(20));
        assert!(last.await.unwrap().is_ok(), "the cache's own state");
        assert_eq!(continued.load(Ordering::SeqCst), MAX_LONG_INITIAL_LISTS as u32 + 1, "nothing more read");
        next.abort();
        for t in waiting {
            t.abort();
        }
        held.abort();
    }

    /// A proof that does not hold is tried again only after the cache moved and a pause that
    /// doubles: about ten whole-selection reads in 3 s of an event every millisecond, not 3 000
    /// (a review: each is a walk of the selection on the runtime's threads).
    #[tokio::test(start_paused = true)]
    async fn a_failing_proof_reads_the_selection_a_bounded_number_of_times() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions::default());
        w.replace(vec![cm(&w, "a", 5)], Rv(10));
        let churn = tokio::spawn(async move {
            for rv in 11..4000 {
                w.apply(EventType::Modified, cm(&w, "a", rv)).unwrap().finish().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let mut reads = 0;
        let started = Instant::now();
        let got = wait_for_state(&r, Rv(1_000_000), started + PROOF_WAIT, |_| {
            reads += 1;
            false
        })
        .await;
        assert!(got.is_none());
        assert_eq!(started.elapsed(), PROOF_WAIT);
        assert!((5..=15).contains(&reads), "{reads} reads of the selection");
        churn.abort();
        // One that holds, and a cache that reaches the RV, end the wait at once.
        let (mut w, r) =
            new(ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true), CacheOptions::default());
        w.replace(vec![cm(&w, "a", 5)], Rv(10));
        let got = wait_for_state(&r, Rv(20), Instant::now() + PROOF_WAIT, |s| s.rv == Rv(10)).await;
        assert!(matches!(got, Some(Some(ref s)) if s.rv == Rv(10)));
        let reached = tokio::spawn({
            let r = r.clone();
            async move { wait_for_state(&r, Rv(12), Instant::now() + PROOF_WAIT, |_| false).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.apply(EventType::Modified, cm(&w, "a", 12)).unwrap().finish().await;
        assert!(matches!(reached.await.unwrap(), Some(None)));
    }

    /// A cache that reaches the RV during a pause between two comparisons ends the wait then,
    /// not when the pause is over (up to 500 ms later).
    #[tokio::test(start_paused = true)]
    async fn reaching_the_rv_ends_a_pause_at_once() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions::default());
        w.replace(vec![cm(&w, "a", 5)], Rv(10));
        let waiter = tokio::spawn(async move {
            let got = wait_for_state(&r, Rv(12), Instant::now() + PROOF_WAIT, |_| false).await;
            (got.is_some_and(|s| s.is_none()), Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.apply(EventType::Modified, cm(&w, "a", 11)).unwrap().finish().await;
        // The waiter compares at 11, then pauses 20 ms.
        tokio::time::sleep(Duration::from_millis(5)).await;
        w.apply(EventType::Modified, cm(&w, "a", 12)).unwrap().finish().await;
        let applied = Instant::now();
        let (reached, at) = waiter.await.unwrap();
        assert!(reached);
        assert_eq!(at, applied, "the wait ended {:?} after the cache reached the RV", at - applied);
    }

    /// A relist that lands at the RV already compared is another state, compared again.
    #[tokio::test(start_paused = true)]
    async fn a_relist_at_the_same_rv_is_compared_again() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions::default());
        w.replace(vec![cm(&w, "a", 5)], Rv(10));
        let waiter = tokio::spawn(async move {
            let holds_b = |s: &Snapshot| s.store.keys().any(|k| k.as_str() == "ns/b");
            wait_for_state(&r, Rv(20), Instant::now() + PROOF_WAIT, holds_b).await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.replace(vec![cm(&w, "a", 5), cm(&w, "b", 7)], Rv(10));
        // The list differs from the cache at 10: 10 is distrusted, the cache not ready until
        // the upstream moves past it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.bookmark(Rv(11));
        let got = waiter.await.unwrap();
        assert!(
            matches!(got, Some(Some(ref s)) if s.rv == Rv(11) && s.store.len() == 2),
            "{:?}",
            got.map(|s| s.map(|s| s.rv))
        );
    }

    /// The upstream's storage goes back after it listed (at 20, in the gone history), and the
    /// new history's state holds the listed versions: no proof (20 names another state now, and
    /// the new history's events up to it would be skipped); the start is forwarded. Found by a
    /// review; before, `Proven { rv: 20 }` from the new history's state at 9.
    #[tokio::test(start_paused = true)]
    async fn a_state_of_another_history_proves_nothing() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions::default());
        w.replace(vec![cm(&w, "a", 5)], Rv(10));
        let histories = r.histories();
        let meta = MetadataPage {
            rv: Rv(20),
            continue_token: None,
            remaining: None,
            items: vec![("ns".into(), "a".into(), Rv(5)), ("ns".into(), "b".into(), Rv(7))],
        };
        let filter = every();
        let reader = r.clone();
        let proving = tokio::spawn(async move { prove(&reader, &filter, &meta, histories).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Went back: listed at 8, below the cache's 10, then the new history moves on.
        w.replace(vec![cm(&w, "a", 5), cm(&w, "b", 7)], Rv(8));
        w.bookmark(Rv(9));
        assert!(r.progress().ready && r.histories() == histories + 1);
        let got = proving.await.unwrap();
        assert!(got.as_ref().is_err_and(|e| e.contains("did not hold")), "{:?}", got.map(|_| ()));
    }

    #[test]
    fn a_proof_that_keeps_failing_is_thinned_out_and_one_success_restores_it() {
        let s = Streak::default();
        for _ in 0..MISSES_BEFORE_THINNING {
            assert!(s.should_try());
            s.record(false);
        }
        let tried: Vec<bool> = (0..16).map(|_| s.should_try()).collect();
        assert_eq!(tried.iter().filter(|t| **t).count(), 2, "one in eight: {tried:?}");
        s.record(true);
        assert!((0..5).all(|_| s.should_try()), "restored");
    }
}
