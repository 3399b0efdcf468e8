//! `--cache-memory-limit`: the caches' memory kept under a byte limit. Every
//! `--cache-memory-check-period`, and at once after any cache installed a full list, the
//! governor measures every running cache (`cache::memory`: objects, lazily made forms, the
//! history's share) and acts as `plan` decides: past the limit it shortens the largest
//! histories (down to [`HISTORY_FLOOR`] events; older RVs then answer 410 "too old" as after
//! any eviction), then drops the largest caches (their reads are forwarded with the reason
//! `memory_limit`, their watches end and clients re-watch upstream, `/readyz?verbose` lists
//! them without failing, a log line says why); well under the limit it gives histories their
//! length back and takes dropped caches back, one at a time.
//!
//! Started by `app` when the flag is set; acts on `caches::Caching` (drop, readmit) and the
//! caches' readers (history caps); reports through `metrics`.

pub mod limit;
pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::cache::Budget;
use crate::caches::Caching;
use crate::metrics::Metrics;
use crate::server::catalog::Resources;
use plan::{Action, Cache, Dropped};

/// The fewest events a history is shortened to: kube-apiserver's watch cache lower bound
/// (docs/apiserver-watch-cache.md §2.2).
pub const HISTORY_FLOOR: usize = 100;

/// Runs the governor until `stop` turns true, measuring every `period` (and whenever a cache
/// rings `budget.check`: after a full list, or a list refused for the limit).
pub async fn run(
    caching: Caching,
    catalog: Arc<Resources>,
    budget: Arc<Budget>,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let metrics = caching.metrics.clone();
    metrics.memory_limit(budget.limit, ACTIONS);
    tracing::info!(limit = budget.limit, ?period, "cache memory limit");
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = budget.check.notified() => {}
            _ = crate::shutdown::until_true(&mut stop) => return,
        }
        // A sweep walks every cached object: on the blocking pool, not on a worker that
        // serves requests.
        let (c, cat, b, m) = (caching.clone(), catalog.clone(), budget.clone(), metrics.clone());
        if let Err(e) = tokio::task::spawn_blocking(move || sweep(&c, &cat, &b, &m)).await {
            tracing::error!(error = %e, "cache memory sweep failed");
        }
    }
}

/// One measurement of every cache, and what the plan says to do about it. A cache whose list
/// was refused counts with what that list had brought (what it would hold) in the plan, never
/// in the budget's measured total (which lists in flight are checked against: only what is
/// held).
pub fn sweep(caching: &Caching, catalog: &Arc<Resources>, budget: &Budget, metrics: &Metrics) {
    let limit = budget.limit;
    let started = std::time::Instant::now();
    let running = caching.running();
    let caches: Vec<Cache> = running
        .iter()
        .map(|(name, r)| {
            let mut usage = r.memory();
            metrics.cache_memory(&r.kind().group_resource(), usage.objects, usage.history);
            usage.objects = usage.objects.max(r.refused_list());
            let configured = r.options().history_max_events;
            Cache {
                name: name.clone(),
                usage,
                floor: HISTORY_FLOOR.min(configured),
                shortened: usage.history_cap < configured,
            }
        })
        .collect();
    let dropped: Vec<Dropped> =
        caching.dropped().into_iter().map(|(name, bytes)| Dropped { name, bytes }).collect();
    let total: u64 = caches.iter().map(|c| c.usage.total()).sum();
    tracing::debug!(caches = caches.len(), total, limit, took = ?started.elapsed(), "caches measured");
    let reader = |name: &str| running.iter().find(|(n, _)| n == name).map(|(_, r)| r);
    for action in plan::plan(limit, &caches, &dropped) {
        metrics.memory_action(action_label(&action));
        match action {
            Action::Shorten { name, cap } => {
                if let Some(r) = reader(&name) {
                    tracing::info!(resource = %name, events = cap, total, limit, "over --cache-memory-limit: history shortened");
                    r.limit_history(cap);
                }
            }
            Action::Drop { name, bytes } => {
                let why =
                    format!("dropped at {total} of --cache-memory-limit {limit} bytes; it kept {bytes}");
                tracing::warn!(resource = %name, bytes, total, limit, "over --cache-memory-limit: no longer cached, its requests are forwarded");
                caching.drop_for_memory(&name, bytes, why, catalog);
                if let Some(r) = reader(&name) {
                    metrics.cache_memory(&r.kind().group_resource(), 0, 0);
                    metrics.forget_cache(&r.kind().group_resource());
                }
            }
            Action::Unlimit { name } => {
                if let Some(r) = reader(&name) {
                    tracing::info!(resource = %name, total, limit, "under --cache-memory-limit again: history back to its length");
                    r.unlimit_history();
                }
            }
            Action::Readmit { name } => {
                tracing::info!(resource = %name, total, limit, "under --cache-memory-limit again: caching it again");
                caching.readmit(&name, catalog);
            }
        }
    }
    // Each running cache as counted now, not as measured above: a list installed meanwhile
    // (`ListAccount::installed`) raised the total by what it brought, which the measurement
    // taken before it would take back until the next sweep, letting other lists in past the
    // limit by up to a whole resource (found by review, 2026-11-29).
    budget.set_measured(caching.running().iter().map(|(_, r)| r.kept()).sum());
    // As the catalog has them: a readmitted resource is dropped until its new cache is served.
    metrics.memory_dropped(catalog.snapshot().dropped.len());
}

/// The `action` label of `watchcache_cache_memory_actions_total`.
pub fn action_label(a: &Action) -> &'static str {
    match a {
        Action::Shorten { .. } => "history_shortened",
        Action::Drop { .. } => "dropped",
        Action::Unlimit { .. } => "history_restored",
        Action::Readmit { .. } => "readmitted",
    }
}

/// Every `action` label.
pub const ACTIONS: &[&str] = &["history_shortened", "dropped", "history_restored", "readmitted"];
