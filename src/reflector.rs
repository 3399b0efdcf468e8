//! The single writer of one resource's cache: LIST (paged) → WATCH from the list RV →
//! on a broken stream re-watch from the cache RV → relist only when the upstream says that RV
//! is gone (asked whole from that RV first, as client-go does). Exponential backoff with
//! jitter between failures.
//!
//! Spawned by `app` once per cached resource; holds that resource's `cache::Writer`, talks to
//! the apiserver through `upstream::Upstream`.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;

use crate::cache::Writer;
use crate::metrics::Metrics;
use crate::resource::{EventType, Rv};
use crate::upstream::{RawEvent, Upstream, UpstreamError};

/// Tunables of the list/watch loop.
#[derive(Clone, Debug)]
pub struct ReflectorOptions {
    /// Page size of upstream LISTs.
    pub page_size: u32,
    /// Upstream watch timeout (seconds); the watch is renewed from the cache RV when it ends.
    pub watch_timeout_secs: u32,
    /// A watch that delivers nothing (no event, no bookmark) for this long is given up and
    /// renewed: the connection may be partitioned without a FIN (the apiserver sends a BOOKMARK
    /// about every 60 s even on a quiet resource).
    pub watch_idle_timeout: Duration,
    /// Rung when the upstream answers 404 for the resource (a CRD deleted, a version no longer
    /// served): `caches` rediscovers.
    pub on_not_found: Option<std::sync::Arc<tokio::sync::Notify>>,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// After an object that cannot be parsed (`cache::unparsable`), the wait (times a random
    /// factor in [1, 2)) before the next full list, which brings the cache back only if every
    /// object of it parses; it doubles, up to ten times this, while lists keep holding one.
    pub unparsable_retry: Duration,
    /// `--max-staleness`: past it without proof of being current, the cache's watches are
    /// ended (`Writer::end_watchers_if_stale`); zero: never.
    pub max_staleness: Duration,
    /// A watch closed cleanly within this long with nothing in it is a failure, waited out
    /// with the backoff (client-go's `watchHandler`: "very short watch", 1 s).
    pub short_watch: Duration,
}

impl Default for ReflectorOptions {
    fn default() -> Self {
        ReflectorOptions {
            page_size: 500,
            watch_timeout_secs: 300,
            watch_idle_timeout: Duration::from_secs(150),
            on_not_found: None,
            backoff_initial: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            unparsable_retry: Duration::from_secs(60),
            max_staleness: Duration::ZERO,
            short_watch: Duration::from_secs(1),
        }
    }
}

/// Where the loop stands.
enum State {
    /// Nothing usable: a full LIST is needed.
    Empty,
    /// The cache holds the state at `rv`: watch from there.
    Synced { rv: Rv },
    /// The cache was restored from `--state-dir` at `rv` and no watch from there has brought
    /// anything yet: the upstream has not shown that it still has `rv`. Watched as `Synced`,
    /// but a 410 now means the state is older than the upstream's watch window — from before
    /// the proxy's downtime, perhaps long before — so the cache is not ready while it relists
    /// (as at a cold start), rather than serving that state meanwhile.
    Resuming { rv: Rv },
    /// The upstream no longer has the cache's `after` for a watch (410): a full list, asked
    /// first at least as new as `after` and whole (client-go's relist at its last RV: an
    /// apiserver's watch cache answers it, where a consistent or paginated list is read from
    /// etcd on 1.28–1.30 — for every proxy at once after an apiserver restart), else `Empty`'s.
    Relist { after: Rv },
}

/// Why a watch ended.
enum WatchEnd {
    /// Clean end: re-watch at once; `early`: before its `timeoutSeconds` (the upstream ended
    /// it: a drain, its watch cache re-initialised, perhaps on a restored storage), so the
    /// upstream is first asked whether it went back.
    Closed { early: bool },
    /// The upstream no longer has our RV (410): relist.
    Gone,
    /// A failure (what, its message, and the answer's `retryAfterSeconds`): back off, at
    /// least that long, then re-watch.
    Failed(Failure, String, Duration),
    /// The consistency check found the cache different from the upstream: relist (the cache
    /// stays not ready, its reads forwarded, until the list is in).
    Inconsistent(Rv, String),
    /// An event's object cannot be parsed (the parse error): the cache is unservable until a
    /// full list parses whole.
    Unparsable(String),
}

/// What failed: the LIST or the WATCH, and how. Its metric reason (`list_unreachable`,
/// `watch_http_500`, `watch_stalled`, `error_event_500`, …) is derived from it, never parsed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    List(Cause),
    Watch(Cause),
    /// The watch went silent for longer than its stall bound.
    WatchStalled,
    /// The watch was accepted and closed within `ReflectorOptions::short_watch` with nothing in it.
    WatchShort,
    /// An ERROR event other than 410 / Expired / Gone, with its Status code.
    ErrorEvent(u16),
}

/// How an upstream request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    Unreachable,
    Http(u16),
    Decode,
    Discovery,
}

impl Cause {
    fn of(e: &UpstreamError) -> Cause {
        match e {
            UpstreamError::Transport(_) => Cause::Unreachable,
            UpstreamError::Status { code, .. } => Cause::Http(*code),
            UpstreamError::Decode(_) => Cause::Decode,
            UpstreamError::Discovery(_) => Cause::Discovery,
        }
    }

    fn label(self) -> String {
        match self {
            Cause::Unreachable => "unreachable".into(),
            Cause::Http(code) => format!("http_{code}"),
            Cause::Decode => "decode".into(),
            Cause::Discovery => "discovery".into(),
        }
    }
}

impl Failure {
    /// The `reason` label of `watchcache_reflector_errors_total`.
    fn reason(self) -> String {
        match self {
            Failure::List(c) => format!("list_{}", c.label()),
            Failure::Watch(c) => format!("watch_{}", c.label()),
            Failure::WatchStalled => "watch_stalled".into(),
            Failure::WatchShort => "watch_short".into(),
            Failure::ErrorEvent(code) => format!("error_event_{code}"),
        }
    }

    /// The upstream no longer serves the resource (a CRD deleted): rediscovery is due.
    fn not_found(self) -> bool {
        matches!(self, Failure::List(Cause::Http(404)) | Failure::Watch(Cause::Http(404)))
    }
}

/// Failures of one reflector: counted by reason in `watchcache_reflector_errors_total`, and
/// logged at warn at most once per [`WARN_EVERY`] (with how many were not logged since).
struct Failures {
    resource: String,
    /// The wait before a list after an object that cannot be parsed: `unparsable_retry`,
    /// doubling up to ten times it while lists keep holding such an object.
    unparsable_retry: Duration,
    on_not_found: Option<std::sync::Arc<tokio::sync::Notify>>,
    last_warn: Option<tokio::time::Instant>,
    unlogged: u64,
    /// Since when lists or watches have failed without a list installed, an event applied or a
    /// watch ended cleanly in between (`end_stale_watchers`).
    failing_since: Option<tokio::time::Instant>,
    /// The RV a list asked for whole was installed at (`relist`): a watch from it answered
    /// 410 before bringing anything is relisted consistently, not whole again — an upstream
    /// replica whose watch cache is behind another's could otherwise make a relist-and-410
    /// loop with no backoff (a review).
    whole_at: Option<Rv>,
}

/// The least time between two warnings of one reflector.
const WARN_EVERY: Duration = Duration::from_secs(30);

impl Failures {
    fn new(resource: &str, opts: &ReflectorOptions) -> Self {
        Failures {
            resource: resource.to_owned(),
            unparsable_retry: opts.unparsable_retry,
            on_not_found: opts.on_not_found.clone(),
            last_warn: None,
            unlogged: 0,
            failing_since: None,
            whole_at: None,
        }
    }

    /// A failure that is no cause of its own for the log (a list refused by the byte budget).
    fn failing(&mut self) {
        self.failing_since.get_or_insert_with(tokio::time::Instant::now);
    }

    /// The upstream answered as it should.
    fn recovered(&mut self) {
        self.failing_since = None;
    }

    fn record(&mut self, metrics: &Metrics, failure: Failure, rv: Rv, what: &str, error: &str) {
        self.failing();
        let reason = failure.reason();
        let reason = reason.as_str();
        metrics.reflector_error(&self.resource, reason);
        if failure.not_found() {
            if let Some(n) = &self.on_not_found {
                n.notify_one();
            }
        }
        let now = tokio::time::Instant::now();
        if self.last_warn.is_some_and(|t| now.duration_since(t) < WARN_EVERY) {
            self.unlogged += 1;
            tracing::debug!(resource = %self.resource, rv = %rv, reason, error, "{what}");
            return;
        }
        tracing::warn!(resource = %self.resource, rv = %rv, reason, error, similar_since_last = self.unlogged, "{what}");
        self.last_warn = Some(now);
        self.unlogged = 0;
    }
}

/// Exponential backoff with jitter: each sleep is the current step times a random factor in
/// [1, 2) (client-go's `Jitter(d, 1.0)`), but never more than `max` (`backoff_max`, 30 s: the
/// README's bound); the step doubles up to `max`.
struct Backoff {
    next: Duration,
    initial: Duration,
    max: Duration,
}

impl Backoff {
    fn new(o: &ReflectorOptions) -> Self {
        Backoff { next: o.backoff_initial, initial: o.backoff_initial, max: o.backoff_max }
    }
    fn reset(&mut self) {
        self.next = self.initial;
    }
    /// [`Backoff::wait`], at least `floor` (an answer's `retryAfterSeconds`, up to the max).
    async fn wait_at_least(&mut self, floor: Duration) {
        let started = tokio::time::Instant::now();
        self.wait().await;
        tokio::time::sleep_until(started + floor.min(self.max)).await;
    }

    async fn wait(&mut self) {
        // A step past the max is drawn in [max/2, max], never the max itself: proxies whose
        // backoff reached it stay spread out over a long outage (a review: every one retried
        // on the same 30 s grid; client-go draws fresh jitter each time).
        let d = match self.next.mul_f64(1.0 + fastrand::f64()) {
            d if d > self.max => self.max.mul_f64(0.5 + fastrand::f64() / 2.0),
            d => d,
        };
        self.next = (self.next * 2).min(self.max);
        tokio::time::sleep(d).await;
    }
}

/// Runs the reflector until `stop` turns true.
pub async fn run(
    upstream: Upstream,
    mut writer: Writer,
    opts: ReflectorOptions,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let resource = writer.kind().group_resource();
    let mut backoff = Backoff::new(&opts);
    let mut failures = Failures::new(&resource, &opts);
    // A cache restored from `--state-dir` resumes the upstream watch from its RV (a 410 there
    // relists as after any watch).
    let mut state = match writer.progress_rv() {
        Rv(0) => State::Empty,
        rv => State::Resuming { rv },
    };
    loop {
        if *stop.borrow() {
            break;
        }
        let mut ctx = Ctx { upstream: &upstream, opts: &opts, metrics: &metrics, resource: &resource };
        state = tokio::select! {
            s = step(&mut ctx, &mut writer, &mut backoff, &mut failures, state) => s,
            _ = crate::shutdown::until_true(&mut stop) => break,
        };
    }
    writer.close_watchers();
    writer.stopped();
}

/// What every step reads.
struct Ctx<'a> {
    upstream: &'a Upstream,
    opts: &'a ReflectorOptions,
    metrics: &'a Metrics,
    resource: &'a str,
}

async fn step(
    ctx: &mut Ctx<'_>,
    writer: &mut Writer,
    backoff: &mut Backoff,
    failures: &mut Failures,
    state: State,
) -> State {
    let (opts, metrics, resource) = (ctx.opts, ctx.metrics, ctx.resource);
    match state {
        State::Empty | State::Relist { .. } => match relist(ctx, writer, state, &mut failures.whole_at).await
        {
            (Ok(listed), _) => listed_ok(ctx, writer, backoff, failures, listed).await,
            (Err(e), next) => {
                failures.record(
                    metrics,
                    Failure::List(Cause::of(&e)),
                    writer.progress_rv(),
                    "upstream list failed; retrying",
                    &e.to_string(),
                );
                // Before the first sync there is nothing to serve; after it, keep serving the
                // last known state (Any reads stay available while the upstream is away).
                if writer.progress_rv() == Rv(0) {
                    writer.set_not_ready(Some(e.to_string()));
                }
                end_stale_watchers(writer, opts, failures, resource);
                backoff.wait_at_least(e.retry_after()).await;
                next
            }
        },
        State::Synced { rv: from } | State::Resuming { rv: from } => {
            watched(ctx, writer, backoff, failures, state, from).await
        }
    }
}

/// A full list: whole from the RV a watch lost (`State::Relist`, when the byte budget has
/// room for the cache's size, counted before it is asked), else paged and consistent
/// (`list_all`); with the state to try
/// again from if it fails. A 410 or 504 "Too large resource version" to the first (an
/// upstream whose watch cache is behind, or whose storage went back) falls back to the second
/// at once, as client-go's reflector does; another Status keeps the RV for the next try; a
/// transport failure or timeout (a whole list may take longer than an own request's bound)
/// does not.
async fn relist(
    ctx: &Ctx<'_>,
    writer: &mut Writer,
    state: State,
    whole_at: &mut Option<Rv>,
) -> (Result<Listed, UpstreamError>, State) {
    let (upstream, opts) = (ctx.upstream, ctx.opts);
    *whole_at = None;
    let State::Relist { after } = state else {
        return (list_all(upstream, writer, opts).await, State::Empty);
    };
    match list_whole(upstream, writer, after).await {
        Ok(Some(listed)) => {
            if let Listed::Installed(rv) = listed {
                *whole_at = Some(rv);
            }
            (Ok(listed), State::Empty)
        }
        Ok(None) => (list_all(upstream, writer, opts).await, State::Empty),
        Err(e) if e.is_gone() || e.is_too_large_rv() => {
            tracing::info!(resource = ctx.resource, rv = %after, error = %e, "the upstream cannot list from the cache's resourceVersion; listing consistently");
            (list_all(upstream, writer, opts).await, State::Empty)
        }
        Err(e @ UpstreamError::Status { .. }) => (Err(e), State::Relist { after }),
        Err(e) => (Err(e), State::Empty),
    }
}

/// After a list that was answered: installed, refused for the byte budget, or unparsable.
async fn listed_ok(
    ctx: &Ctx<'_>,
    writer: &mut Writer,
    backoff: &mut Backoff,
    failures: &mut Failures,
    listed: Listed,
) -> State {
    let (opts, metrics, resource) = (ctx.opts, ctx.metrics, ctx.resource);
    match listed {
        Listed::Refused(bytes) => {
            // --cache-memory-limit: the governor makes room or drops this cache (which
            // stops this reflector); until then, retry with the backoff.
            tracing::info!(resource, bytes, "list refused: it would pass --cache-memory-limit; retrying");
            if writer.progress_rv() == Rv(0) {
                writer.set_not_ready(Some(format!("its list passed --cache-memory-limit at {bytes} bytes")));
            }
            failures.failing();
            end_stale_watchers(writer, opts, failures, resource);
            backoff.wait().await;
            State::Empty
        }
        Listed::Unparsable(e) => {
            unparsable(ctx, writer, failures, &e).await;
            State::Empty
        }
        Listed::Installed(rv) => {
            metrics.relist(resource);
            failures.recovered();
            backoff.reset();
            failures.unparsable_retry = opts.unparsable_retry;
            State::Synced { rv }
        }
    }
}

/// One upstream watch from `from` (the cache's RV) and what follows its end.
async fn watched(
    ctx: &Ctx<'_>,
    writer: &mut Writer,
    backoff: &mut Backoff,
    failures: &mut Failures,
    state: State,
    from: Rv,
) -> State {
    let (upstream, opts, metrics, resource) = (ctx.upstream, ctx.opts, ctx.metrics, ctx.resource);
    let resuming = matches!(state, State::Resuming { .. });
    let (end, rv) = watch_once(upstream, writer, opts, metrics, resource, from).await;
    // A watch that delivered something proved the upstream healthy: the next failure
    // starts the backoff over (else each drop of a long-lived connection would wait
    // longer than the one before).
    if rv > from {
        backoff.reset();
        failures.recovered();
    }
    // Still resuming a restored state while the upstream neither brought nor confirmed
    // anything (`Writer::confirmed`).
    let confirmed = writer.confirmed_here();
    let watching =
        |rv| if resuming && rv == from && !confirmed { State::Resuming { rv } } else { State::Synced { rv } };
    match end {
        WatchEnd::Closed { early } => {
            backoff.reset();
            failures.recovered();
            // An apiserver whose storage was restored (etcd without a revision bump)
            // ends its watches cleanly when its watch cache re-initialises; a re-watch
            // from our RV, ahead of it, is accepted and waits in silence, and after the
            // quiet second the gone state would pass for current (a review).
            if early && went_back(upstream, writer, opts).await {
                metrics.reflector_error(resource, "upstream_behind");
                return State::Empty;
            }
            watching(rv)
        }
        WatchEnd::Inconsistent(at, why) => {
            metrics.reflector_error(resource, "inconsistent");
            tracing::warn!(resource, rv = %rv, reason = %why, "relisting: the cache differs from the upstream");
            writer.set_not_ready(Some(why));
            // Clients may hold what the wrong cache served at any RV up to `rv`.
            writer.distrust_through(at);
            State::Empty
        }
        WatchEnd::Unparsable(e) => {
            unparsable(ctx, writer, failures, &e).await;
            State::Empty
        }
        WatchEnd::Gone => {
            metrics.reflector_error(resource, "expired");
            tracing::info!(resource, rv = %rv, "upstream says our resourceVersion is gone; relisting");
            if resuming && rv == from && !confirmed {
                writer.set_not_ready(Some(format!(
                    "restored at resourceVersion {rv}, which the upstream no longer has; relisting"
                )));
            }
            if rv == from && failures.whole_at == Some(from) {
                // Just listed whole at this RV, and 410 at once: listed consistently.
                State::Empty
            } else {
                State::Relist { after: rv }
            }
        }
        WatchEnd::Failed(r, e, after) => {
            failures.record(metrics, r, rv, "upstream watch failed; re-watching", &e);
            end_stale_watchers(writer, opts, failures, resource);
            backoff.wait_at_least(after).await;
            if went_back(upstream, writer, opts).await {
                metrics.reflector_error(resource, "upstream_behind");
                return State::Empty;
            }
            watching(rv)
        }
    }
}

/// After a failed list or watch: a cache whose lists or watches have failed for longer than
/// `--max-staleness`, without proof of being current for as long, ends its watches
/// (`Writer::end_watchers_if_stale`). Both: a quiet resource's cache may have no proof for
/// minutes while healthy, and one failure (a connection reset, an apiserver rolling) is no
/// reason to send every watch of it upstream at once (a review).
fn end_stale_watchers(writer: &mut Writer, opts: &ReflectorOptions, failures: &Failures, resource: &str) {
    if failures.failing_since.is_none_or(|t| t.elapsed() <= opts.max_staleness) {
        return;
    }
    let ended = writer.end_watchers_if_stale(opts.max_staleness);
    if ended > 0 {
        tracing::info!(
            resource,
            watches = ended,
            "ended the cache's watches: no proof of being current for longer than --max-staleness; their clients re-watch, upstream"
        );
    }
}

/// The upstream sent an object the cache cannot parse (`error`): every watch of the cache
/// ends and its requests are forwarded (`cache::unparsable`); the next full list, after
/// `unparsable_retry` (doubling up to ten times it while lists keep holding such an object),
/// brings it back if every object of it parses.
async fn unparsable(ctx: &Ctx<'_>, writer: &mut Writer, failures: &mut Failures, error: &str) {
    let resource = ctx.resource;
    ctx.metrics.unparseable(resource);
    ctx.metrics.reflector_error(resource, "unparsable");
    let why = format!("an object cannot be parsed ({error}); forwarded until a full list parses whole");
    let ended = writer.unparsable(why);
    let (step, most) = (failures.unparsable_retry, ctx.opts.unparsable_retry * 10);
    failures.unparsable_retry = (step * 2).min(most);
    let retry = step.mul_f64(1.0 + fastrand::f64()).min(most);
    tracing::warn!(resource, error, watches_ended = ended, ?retry, "the upstream sent an object that cannot be parsed: forwarding every request of the resource, listing again later");
    tokio::time::sleep(retry).await;
}

/// Before re-watching after a failed watch (a connection lost: an apiserver restart, which
/// an etcd restore needs), whether the upstream's storage went back: a consistent one-item
/// LIST below the cache's RV. Its watch from the cache's RV would be accepted and wait,
/// silently, until the upstream issued that RV again; the cache relists instead
/// (`Writer::replace` takes the lower RV). An upstream that cannot answer within
/// [`PROBE_TIMEOUT`] (or the watch's idle timeout, if shorter; a partitioned connection never
/// answers): re-watch as before.
async fn went_back(upstream: &Upstream, writer: &Writer, opts: &ReflectorOptions) -> bool {
    let before = writer.progress_rv();
    let wait = opts.watch_idle_timeout.min(PROBE_TIMEOUT);
    let probe = tokio::time::timeout(wait, upstream.list_page(writer.kind(), 1, None, None));
    match probe.await {
        Ok(Ok(page)) if page.rv < before => {
            writer.upstream_went_back(before, page.rv, "re-watch probe");
            true
        }
        _ => false,
    }
}

/// A watch that ends cleanly this long before its `timeoutSeconds` was ended by the upstream.
const EARLY_MARGIN: Duration = Duration::from_secs(2);

/// The longest the probe before a re-watch may delay it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an accepted watch must go without an ERROR before it proves the cache current
/// (`watch_once`): the apiserver's 410 for a compacted RV follows its 200 at once.
const ACCEPTED_QUIET: Duration = Duration::from_secs(1);

/// What a full list came to.
enum Listed {
    /// Installed at this RV.
    Installed(Rv),
    /// Given up after this many bytes: it would pass `--cache-memory-limit`.
    Refused(u64),
    /// Not installed: an item cannot be parsed (the parse error).
    Unparsable(String),
}

/// Lists every page and installs the result (unless `--cache-memory-limit` refuses it on the
/// way, page by page: a list larger than the room left is never held whole).
async fn list_all(
    upstream: &Upstream,
    writer: &mut Writer,
    opts: &ReflectorOptions,
) -> Result<Listed, UpstreamError> {
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    let mut list_rv = None;
    let mut account = writer.list_account();
    let mut listed = 0u64;
    let mut pages = crate::upstream::Pages::default();
    let mut warnings = None;
    loop {
        let page = page_with_retries(upstream, writer, opts, token.as_deref()).await?;
        pages.check(page.rv, page.continue_token.as_deref())?;
        list_rv.get_or_insert(page.rv);
        warnings.get_or_insert(page.warnings);
        let remaining = page.remaining.unwrap_or(0);
        for raw in page.items {
            match writer.parse(raw) {
                Ok(o) => {
                    listed += o.kept_bytes() as u64;
                    items.push(o)
                }
                // A list without it would not be the upstream's state.
                Err(e) => return Ok(Listed::Unparsable(e.to_string())),
            }
        }
        let whole = expected_whole(account.listed() + listed, items.len(), remaining);
        if !account.add(std::mem::take(&mut listed), whole) {
            return Ok(Listed::Refused(account.refused_at()));
        }
        match page.continue_token {
            Some(t) if !t.is_empty() => token = Some(t),
            _ => break,
        }
    }
    let rv = list_rv.unwrap_or_default();
    writer.replace(items, rv);
    writer.set_warnings(warnings.unwrap_or_default());
    account.installed();
    Ok(Listed::Installed(rv))
}

/// The whole state at least as new as `after` (`Upstream::list_since`), installed unless the
/// byte budget refuses it once it is in; `None` when the upstream paged it unasked.
async fn list_whole(
    upstream: &Upstream,
    writer: &mut Writer,
    after: Rv,
) -> Result<Option<Listed>, UpstreamError> {
    // The cache's size is counted before the list is asked for (`--cache-memory-limit`);
    // without room for it, the paged list, refused page by page.
    let mut account = writer.list_account();
    if !account.reserve_its_size() {
        return Ok(None);
    }
    // Counted as it arrives, beyond the reservation: past the budget's room the list would be
    // refused once in; the paged list is refused page by page, counted at its expected size.
    let mut arrived = 0u64;
    let mut admit = |n: u64| {
        arrived += n;
        let beyond = arrived.saturating_sub(account.listed());
        beyond == 0 || account.try_add(beyond)
    };
    let Some(page) = upstream.list_since(writer.kind(), after, &mut admit).await? else {
        tracing::info!(resource = %writer.kind().group_resource(), "the whole relist passed the memory limit's room; listing it paged");
        return Ok(None);
    };
    // The first page of a paged answer (an upstream that paginates unasked), or a state older
    // than asked (an upstream that does not read `resourceVersion` as "not older than": it
    // would move the cache back): listed paged and consistent.
    if page.continue_token.is_some() || page.rv < after {
        return Ok(None);
    }
    let mut items = Vec::with_capacity(page.items.len());
    let mut listed = 0u64;
    for raw in page.items {
        match writer.parse(raw) {
            Ok(o) => {
                listed += o.kept_bytes() as u64;
                items.push(o)
            }
            Err(e) => return Ok(Some(Listed::Unparsable(e.to_string()))),
        }
    }
    if !account.settle(listed) {
        return Ok(Some(Listed::Refused(account.refused_at())));
    }
    writer.replace(items, page.rv);
    writer.set_warnings(page.warnings);
    account.installed();
    Ok(Some(Listed::Installed(page.rv)))
}

/// Times a page after the first is asked again when the upstream is too busy for it (429) or
/// failed it (5xx), with the same continue token (valid until compaction), before the whole
/// list is given up (client-go retries such answers of any request up to 10 times).
const PAGE_RETRIES: u32 = 4;

/// One page of a list; one after the first is asked again on 429 / 5xx after the backoff or
/// the answer's `retryAfterSeconds`, whichever is longer (a review: one failed page of a list
/// of hundreds threw the pages before it away, and under APF pressure a relist could never
/// land).
async fn page_with_retries(
    upstream: &Upstream,
    writer: &Writer,
    opts: &ReflectorOptions,
    token: Option<&str>,
) -> Result<crate::upstream::ListPage, UpstreamError> {
    let mut wait = opts.backoff_initial;
    let mut tries = 0;
    loop {
        match upstream.list_page(writer.kind(), opts.page_size, token, None).await {
            Err(e @ UpstreamError::Status { code, .. })
                if token.is_some() && tries < PAGE_RETRIES && (code == 429 || (500..600).contains(&code)) =>
            {
                let after = e.retry_after();
                let backoff = wait.mul_f64(1.0 + fastrand::f64()).min(opts.backoff_max);
                tracing::debug!(resource = %writer.kind().group_resource(), code, "a list page failed; asking for it again");
                tokio::time::sleep(after.min(opts.backoff_max).max(backoff)).await;
                wait = (wait * 2).min(opts.backoff_max);
                tries += 1;
            }
            other => return other,
        }
    }
}

/// What a list is expected to bring in all: `bytes` for its first `items` objects, scaled by
/// the `remaining` ones the upstream says are still to come (`remainingItemCount`).
fn expected_whole(bytes: u64, items: usize, remaining: u64) -> u64 {
    match u64::try_from(items) {
        Ok(n) if n > 0 => bytes.saturating_add(bytes.saturating_mul(remaining) / n),
        _ => bytes,
    }
}

#[derive(Deserialize)]
struct BookmarkObject {
    metadata: BookmarkMeta,
}

#[derive(Deserialize)]
struct BookmarkMeta {
    #[serde(rename = "resourceVersion", default)]
    resource_version: String,
}

#[derive(Deserialize)]
struct StatusObject {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
    /// Read leniently: a strange value is no reason to misread the Status.
    #[serde(default)]
    details: Option<serde_json::Value>,
}

/// One upstream watch from `rv`; returns how it ended and the cache RV reached.
async fn watch_once(
    upstream: &Upstream,
    writer: &mut Writer,
    opts: &ReflectorOptions,
    metrics: &Metrics,
    resource: &str,
    mut rv: Rv,
) -> (WatchEnd, Rv) {
    // The answer's head is bounded like the stream: a pooled connection that was partitioned
    // while idle takes the request and never answers (nothing else would end that wait).
    let since = tokio::time::Instant::now();
    let started = tokio::time::timeout(
        opts.watch_idle_timeout,
        upstream.watch(writer.kind(), rv, opts.watch_timeout_secs),
    );
    let mut stream = match started.await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) if e.is_gone() => return (WatchEnd::Gone, rv),
        Ok(Err(e)) => {
            let after = e.retry_after();
            return (WatchEnd::Failed(Failure::Watch(Cause::of(&e)), e.to_string(), after), rv);
        }
        Err(_) => {
            let why = format!(
                "no answer to the watch request for {:?}; the connection may be partitioned",
                opts.watch_idle_timeout
            );
            return (WatchEnd::Failed(Failure::WatchStalled, why, Duration::ZERO), rv);
        }
    };
    // Its warnings about the resource, for a cache restored without a list too.
    writer.set_warnings(std::mem::take(&mut stream.warnings));
    // An accepted watch is proof that the cache is current only once no ERROR followed it: the
    // apiserver answers a compacted RV with a 200 and then a 410 event, and a cache stale for
    // minutes was taken as fresh in between (review). A quiet resource may bring no event nor
    // bookmark for long (1.28 sends bookmarks only once it has seen an event), so the quiet
    // watch itself is the proof.
    let mut quiet_until = Some(tokio::time::Instant::now() + ACCEPTED_QUIET);
    let mut received = false;
    loop {
        let quiet = async {
            match quiet_until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            biased;
            (at, why) = writer.relist_requested() => return (WatchEnd::Inconsistent(at, why), rv),
            next = tokio::time::timeout(opts.watch_idle_timeout, stream.next()) => next,
            () = quiet => {
                writer.confirmed();
                quiet_until = None;
                continue;
            }
        };
        let next = match next {
            Ok(next) => next,
            Err(_) => {
                let why = format!(
                    "nothing received for {:?}; the connection may be partitioned",
                    opts.watch_idle_timeout
                );
                return (WatchEnd::Failed(Failure::WatchStalled, why, Duration::ZERO), rv);
            }
        };
        let ev: RawEvent = match next {
            Ok(Some(ev)) => ev,
            Ok(None) if !received && since.elapsed() < opts.short_watch => {
                // client-go's "very short watch": an error, so the re-watch waits its backoff
                // (a review: a load balancer, or an aggregated server ignoring `watch`, that
                // answers 200 and closes made a loop of watches and probes as fast as it answered).
                let why =
                    format!("very short watch: closed within {:?} with nothing received", opts.short_watch);
                return (WatchEnd::Failed(Failure::WatchShort, why, Duration::ZERO), rv);
            }
            Ok(None) => {
                let ran = since.elapsed();
                let early = ran + EARLY_MARGIN < Duration::from_secs(u64::from(opts.watch_timeout_secs));
                return (WatchEnd::Closed { early }, rv);
            }
            Err(e) => {
                let after = e.retry_after();
                return (WatchEnd::Failed(Failure::Watch(Cause::of(&e)), e.to_string(), after), rv);
            }
        };
        received = true;
        match ev.kind {
            EventType::Added | EventType::Modified | EventType::Deleted => match writer.parse(ev.object) {
                Ok(obj) => {
                    let orv = obj.header.rv;
                    match writer.apply(ev.kind, obj) {
                        Ok(dispatch) => {
                            dispatch.finish().await;
                            rv = orv;
                            metrics.event(resource);
                        }
                        Err(e) => tracing::debug!(resource, error = %e, "ignoring upstream event"),
                    }
                }
                // Skipped, its event would be lost to every watcher: the cache stops serving.
                Err(e) => return (WatchEnd::Unparsable(e.to_string()), rv),
            },
            EventType::Bookmark => {
                if let Ok(b) = serde_json::from_slice::<BookmarkObject>(&ev.object) {
                    if let Ok(brv) = Rv::parse(&b.metadata.resource_version) {
                        if brv > rv {
                            writer.bookmark(brv);
                            rv = brv;
                        } else if brv == rv {
                            // Nothing happened up to now: the cache is current (a quiet
                            // resource's only proof between its watches).
                            writer.proven();
                        }
                    }
                }
            }
            EventType::Error => {
                let st: StatusObject = serde_json::from_slice(&ev.object).unwrap_or(StatusObject {
                    code: 0,
                    reason: String::new(),
                    message: String::new(),
                    details: None,
                });
                if st.code == 410 || st.reason == "Expired" || st.reason == "Gone" {
                    return (WatchEnd::Gone, rv);
                }
                let failure = Failure::ErrorEvent(st.code);
                let why = format!("ERROR event {}: {}", st.code, st.message);
                let after = st
                    .details
                    .as_ref()
                    .and_then(|d| d.get("retryAfterSeconds"))
                    .and_then(serde_json::Value::as_u64)
                    .map_or(Duration::ZERO, Duration::from_secs);
                return (WatchEnd::Failed(failure, why, after), rv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_expected_to_bring_its_bytes_so_far_scaled_by_the_items_to_come() {
        // 1 000 items of 2 000 bytes, 200 to come: 2.4 MB in all.
        assert_eq!(expected_whole(2_000_000, 1000, 200), 2_400_000);
        // The last page, or an upstream that does not say: what came.
        assert_eq!(expected_whole(2_000_000, 1000, 0), 2_000_000);
        // Nothing parsed yet: nothing to scale.
        assert_eq!(expected_whole(0, 0, 5000), 0);
        assert_eq!(expected_whole(u64::MAX, 1, u64::MAX), u64::MAX);
    }

    /// Issue 32: failures are typed; their metric reasons are the labels they always were, and
    /// only a 404 (of the LIST or the WATCH) rings rediscovery.
    #[test]
    fn failure_reasons_and_rediscovery() {
        let cases = [
            (Failure::List(Cause::Unreachable), "list_unreachable", false),
            (Failure::List(Cause::Http(404)), "list_http_404", true),
            (Failure::Watch(Cause::Http(404)), "watch_http_404", true),
            (Failure::Watch(Cause::Http(500)), "watch_http_500", false),
            (Failure::Watch(Cause::Decode), "watch_decode", false),
            (Failure::List(Cause::Discovery), "list_discovery", false),
            (Failure::WatchStalled, "watch_stalled", false),
            (Failure::ErrorEvent(404), "error_event_404", false),
        ];
        for (f, reason, not_found) in cases {
            assert_eq!((f.reason().as_str(), f.not_found()), (reason, not_found), "{f:?}");
        }
    }

    /// The probe before a re-watch finds the upstream below the cache (its storage went back):
    /// the cache is not ready and a relist pending at once, before the list is sent — not ready
    /// only once the list lands, which a large resource, failing lists or the byte budget could
    /// put off for ever while the gone history's events were served (found by a review).
    #[tokio::test]
    async fn an_upstream_found_behind_before_a_re_watch_makes_the_cache_unready_at_once() {
        use crate::resource::ResourceKind;
        let body =
            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"50"},"items":[]}"#;
        let upstream = crate::upstream::testutil::answering(body, &[]).await;
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = crate::cache::new(kind, crate::cache::CacheOptions::default());
        w.replace(Vec::new(), Rv(100));
        assert!(r.progress().ready);
        assert!(went_back(&upstream, &w, &ReflectorOptions::default()).await);
        assert!(!r.progress().ready, "not ready before the relist is even sent");
        assert!(r.relist_reason().is_some_and(|why| why.contains("below the cache's 100")));
        // The relist, at the upstream's RV, clears the request.
        w.replace(Vec::new(), Rv(50));
        assert!(r.relist_reason().is_none());
    }

    /// A watch the upstream accepts and then answers with a 410 ERROR (a compacted RV) does
    /// not make a stale restored cache fresh; one that stays quiet does, and confirms it (a
    /// quiet resource brings no bookmark on 1.28: a review found a restored quiet resource
    /// unconfirmed for hours). Paused time: the staleness is read, never slept for.
    #[tokio::test(start_paused = true)]
    async fn an_accepted_watch_proves_the_cache_only_once_no_error_followed() {
        use crate::resource::ResourceKind;
        use crate::upstream::testutil::{chunked_body, client_of, handler, serve};
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 100 (200)","reason":"Expired","code":410}}"#;
        for answer_gone in [true, false] {
            let addr = serve(handler(move |_, _| async move {
                let body = if answer_gone {
                    chunked_body(&[gone])
                } else {
                    // Accepted, then nothing for as long as the test lasts.
                    http_body_util::BodyExt::boxed_unsync(http_body_util::StreamBody::new(
                        futures_util::stream::pending::<
                            Result<hyper::body::Frame<bytes::Bytes>, crate::server::body::BoxError>,
                        >(),
                    ))
                };
                http::Response::builder().header("content-type", "application/json").body(body).unwrap()
            }))
            .await;
            let upstream = client_of(addr);
            let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
            let (mut w, r) = crate::cache::new(kind, crate::cache::CacheOptions::default());
            // A state restored from `--state-dir`, saved an hour before.
            w.restore(Vec::new(), Rv(100), Vec::new(), Rv(100)).unwrap();
            w.restored_age(Duration::from_secs(3600));
            tokio::time::advance(Duration::from_secs(600)).await;
            let stale = |r: &crate::cache::Reader| r.staleness().unwrap();
            assert!(stale(&r) >= Duration::from_secs(4199), "{:?}", stale(&r));
            let metrics = Metrics::new();
            let opts = ReflectorOptions::default();
            let watching = watch_once(&upstream, &mut w, &opts, &metrics, "configmaps", Rv(100));
            if answer_gone {
                assert!(matches!(watching.await.0, WatchEnd::Gone));
                assert!(stale(&r) >= Duration::from_secs(4199), "a 410 after the 200 proves nothing");
                assert!(!r.proven_here());
            } else {
                let mut watching = Box::pin(watching);
                // Past the quiet second, the watch still open.
                let open = tokio::time::timeout(ACCEPTED_QUIET * 3, &mut watching).await;
                assert!(open.is_err(), "the watch stays open");
                // The restored state's too: its age no longer counts, and it is the process's
                // own (a later 410 relists it as any, the server ready meanwhile).
                assert!(
                    stale(&r) < Duration::from_secs(10),
                    "a quiet accepted watch proves it: {:?}",
                    stale(&r)
                );
                assert!(r.proven_here());
            }
        }
    }

    /// A watch from the RV a whole list was just installed at, answered 410 before bringing
    /// anything (an upstream replica whose watch cache is behind another's), is relisted
    /// consistently, not whole again: that loop had no backoff (a review). Otherwise a 410 is
    /// relisted whole from the RV it lost.
    #[tokio::test]
    async fn a_410_right_after_a_whole_relist_is_relisted_consistently() {
        use crate::resource::ResourceKind;
        use crate::upstream::testutil::{chunked_body, handler, serve};
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 150 (200)","reason":"Expired","code":410}}"#;
        for just_whole in [true, false] {
            let addr = serve(handler(move |_, _| async move {
                http::Response::builder()
                    .header("content-type", "application/json")
                    .body(chunked_body(&[gone]))
                    .unwrap()
            }))
            .await;
            let upstream = crate::upstream::testutil::client_of(addr);
            let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
            let (mut w, _r) = crate::cache::new(kind, crate::cache::CacheOptions::default());
            w.replace(Vec::new(), Rv(150));
            let (opts, metrics) = (ReflectorOptions::default(), Metrics::new());
            let mut ctx = Ctx { upstream: &upstream, opts: &opts, metrics: &metrics, resource: "configmaps" };
            let (mut backoff, mut failures) = (Backoff::new(&opts), Failures::new("configmaps", &opts));
            failures.whole_at = just_whole.then_some(Rv(150));
            let next =
                step(&mut ctx, &mut w, &mut backoff, &mut failures, State::Synced { rv: Rv(150) }).await;
            match (next, just_whole) {
                (State::Empty, true) => {}
                (State::Relist { after }, false) => assert_eq!(after, Rv(150)),
                _ => panic!("{just_whole}: not as expected"),
            }
        }
    }

    /// A watch refused with a `retryAfterSeconds` (a 429 under APF, which admits watches too;
    /// an ERROR event carrying one) is re-watched no sooner: the failure carries it.
    #[tokio::test]
    async fn a_refused_watch_carries_its_retry_after() {
        use crate::resource::ResourceKind;
        use crate::upstream::testutil::{chunked_body, full, handler, serve};
        let busy = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{"retryAfterSeconds":7},"code":429}"#;
        let event = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcd leader changed","reason":"InternalError","details":{"retryAfterSeconds":3},"code":500}}"#;
        for (as_event, want) in [(false, 7), (true, 3)] {
            let addr = serve(handler(move |_, _| async move {
                let (code, body) = if as_event { (200, chunked_body(&[event])) } else { (429, full(busy)) };
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap()
            }))
            .await;
            let upstream = crate::upstream::testutil::client_of(addr);
            let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
            let (mut w, _r) = crate::cache::new(kind, crate::cache::CacheOptions::default());
            w.replace(Vec::new(), Rv(100));
            let (opts, metrics) = (ReflectorOptions::default(), Metrics::new());
            match watch_once(&upstream, &mut w, &opts, &metrics, "configmaps", Rv(100)).await.0 {
                WatchEnd::Failed(_, why, after) => assert_eq!(after, Duration::from_secs(want), "{why}"),
                _ => panic!("a failure"),
            }
        }
    }

    /// A full list installs the upstream's `Warning`s with it (a deprecated API's): the cached
    /// answers carry them (`serve`).
    #[tokio::test]
    async fn a_list_brings_the_upstreams_warnings() {
        use crate::resource::ResourceKind;
        let body =
            r#"{"kind":"EndpointsList","apiVersion":"v1","metadata":{"resourceVersion":"50"},"items":[]}"#;
        let upstream = crate::upstream::testutil::answering(
            body,
            &[
                ("warning", r#"299 - "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice""#),
                // About the proxy's own token, not the resource: not its clients'.
                ("warning", r#"299 - "Use tokens from the TokenRequest API or manually created secret-based tokens instead of auto-generated secret-based tokens.""#),
            ],
        )
        .await;
        let kind = ResourceKind::new("", "v1", "endpoints", "Endpoints", true, true);
        let (mut w, r) = crate::cache::new(kind, crate::cache::CacheOptions::default());
        assert!(r.warnings().is_empty());
        assert!(matches!(
            list_all(&upstream, &mut w, &ReflectorOptions::default()).await,
            Ok(Listed::Installed(_))
        ));
        assert_eq!(
            &r.warnings()[..],
            [r#"299 - "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice""#
                .to_owned()]
        );
    }

    /// After a watch's 410 the relist is asked whole from the RV the watch lost (client-go's:
    /// an apiserver's watch cache answers it, not etcd); a 410 or a 504 "Too large resource
    /// version" to it falls back to a consistent paged list at once; another Status (a 429)
    /// keeps the RV for the next try, a page answered unasked is listed paged.
    #[tokio::test]
    async fn a_relist_after_a_410_is_asked_whole_from_the_lost_rv_first() {
        use crate::resource::ResourceKind;
        use crate::upstream::testutil::{full, handler, serve};
        let list = |rv: &str, cont: &str| {
            format!(
                r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"{cont}}},"items":[{{"metadata":{{"name":"a","namespace":"n","resourceVersion":"{rv}"}}}}]}}"#
            )
        };
        let expired = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 100 (200)","reason":"Expired","code":410}"#;
        let too_large = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: Too large resource version: 100, current: 90","reason":"Timeout","details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}"#;
        let busy = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}"#;
        // (the answer to the whole list, the queries sent, the RV installed or none, next state)
        type Case = (u16, String, &'static [&'static str], Option<u64>, Option<u64>);
        let cases: [Case; 6] = [
            // Older than asked (an upstream that does not read the RV as "not older than").
            (200, list("90", ""), &["resourceVersion=100", "limit=500"], Some(160), None),
            (200, list("150", ""), &["resourceVersion=100"], Some(150), None),
            (410, expired.into(), &["resourceVersion=100", "limit=500"], Some(160), None),
            (504, too_large.into(), &["resourceVersion=100", "limit=500"], Some(160), None),
            (429, busy.into(), &["resourceVersion=100"], None, Some(100)),
            (200, list("150", r#","continue":"x""#), &["resourceVersion=100", "limit=500"], Some(160), None),
        ];
        for (code, whole, want_queries, want_rv, want_next) in cases {
            let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let (seen, whole) = (log.clone(), whole.clone());
            let addr = serve(handler(move |_, req| {
                let (seen, whole) = (seen.clone(), whole.clone());
                async move {
                    let q = req.uri().query().unwrap_or("").to_owned();
                    seen.lock().push(q.clone());
                    let (code, body) =
                        if q.contains("limit=") { (200, list("160", "")) } else { (code, whole) };
                    http::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(full(body))
                        .unwrap()
                }
            }))
            .await;
            let upstream = crate::upstream::testutil::client_of(addr);
            let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
            let (mut w, r) = crate::cache::new(kind, crate::cache::CacheOptions::default());
            w.replace(Vec::new(), Rv(100));
            let (opts, metrics) = (ReflectorOptions::default(), Metrics::new());
            let ctx = Ctx { upstream: &upstream, opts: &opts, metrics: &metrics, resource: "configmaps" };
            let (listed, next) = relist(&ctx, &mut w, State::Relist { after: Rv(100) }, &mut None).await;
            assert_eq!(&log.lock()[..], want_queries, "{code}");
            match (listed, want_rv) {
                (Ok(Listed::Installed(rv)), Some(want)) => {
                    assert_eq!(rv, Rv(want), "{code}");
                    assert_eq!(r.progress().rv, Rv(want), "{code}");
                }
                (Err(e), None) => assert_eq!(e.status_code(), Some(code)),
                _ => panic!("{code}: not as expected"),
            }
            match (next, want_next) {
                (State::Relist { after }, Some(want)) => assert_eq!(after, Rv(want), "{code}"),
                (State::Empty, None) => {}
                _ => panic!("{code}: next state not as expected"),
            }
        }
    }

    /// An upstream that repeats a continue token (or pages at another RV) fails the list
    /// instead of having it read for ever while its items pile up (found by a review).
    #[tokio::test]
    async fn a_list_whose_upstream_repeats_a_continue_token_fails() {
        use crate::resource::ResourceKind;
        use crate::upstream::testutil::{full, handler, serve};
        for second_rv in ["50", "51"] {
            let addr = serve(handler(move |_, req| async move {
                let continued = req.uri().query().is_some_and(|q| q.contains("continue="));
                let rv = if continued { second_rv } else { "50" };
                let body = format!(
                    r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}","continue":"again"}},"items":[]}}"#
                );
                http::Response::builder().header("content-type", "application/json").body(full(body)).unwrap()
            }))
            .await;
            let upstream = crate::upstream::testutil::client_of(addr);
            let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
            let (mut w, _r) = crate::cache::new(kind, crate::cache::CacheOptions::default());
            let listed = tokio::time::timeout(
                Duration::from_secs(10),
                list_all(&upstream, &mut w, &ReflectorOptions::default()),
            )
            .await
            .expect("the list ends");
            let err = listed.err().map(|e| e.to_string()).unwrap_or_default();
            let want = if second_rv == "50" { "continue token twice" } else { "at resourceVersion 51" };
            assert!(err.contains(want), "{second_rv}: {err}");
        }
    }

    /// The README promises a backoff of 0.8 s doubling to 30 s: with the jitter, no sleep may
    /// pass `backoff_max` (before: up to 60 s once the step reached 30 s).
    #[tokio::test(start_paused = true)]
    async fn backoff_never_sleeps_longer_than_its_max() {
        let opts = ReflectorOptions::default();
        let mut b = Backoff::new(&opts);
        let mut slept = Vec::new();
        for _ in 0..12 {
            let t = tokio::time::Instant::now();
            b.wait().await;
            slept.push(t.elapsed());
        }
        assert!(
            slept[0] >= Duration::from_millis(800) && slept[0] < Duration::from_millis(1600),
            "{slept:?}"
        );
        // (The paused clock advances to timer ticks: up to 1 ms past the deadline.)
        let max = Duration::from_secs(30) + Duration::from_millis(1);
        assert!(slept.iter().all(|d| *d <= max), "{slept:?}");
        // Once the step reached the max (0.8 s × 2⁶ > 30 s) every sleep is drawn in [15, 30] s,
        // not the same for every proxy.
        assert!(slept[7..].iter().all(|d| *d >= Duration::from_secs(15)), "{slept:?}");
        let mut distinct = slept[7..].to_vec();
        distinct.dedup();
        assert!(distinct.len() > 1, "jittered at the max: {slept:?}");
        b.reset();
        let t = tokio::time::Instant::now();
        b.wait().await;
        assert!(t.elapsed() < Duration::from_millis(1600));
    }
}
