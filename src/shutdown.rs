//! The stop signal every long-running task watches: a `watch` channel of `bool` that turns
//! true once. Used by the listener and its connections (`server`), the reflectors and the
//! cache supervisors (`caches`); depends on nothing of the crate.

use tokio::sync::watch;

/// Resolves once the flag is true (or its sender is gone).
pub async fn until_true(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await.map(|_| ());
}
