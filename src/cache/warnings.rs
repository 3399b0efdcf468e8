//! The upstream's `Warning`s about a resource: an apiserver sends a deprecated API's warning
//! (`299 - "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"`, a
//! custom resource version marked deprecated) on every answer about it, whatever the verb, so
//! the cache's answers carry the ones its last full list got, as the apiserver's would.
//!
//! Set by `reflector` when a list is installed ([`Writer::set_warnings`]); read by
//! `server::serve` for every cached answer ([`Reader::warnings`]).

use std::sync::Arc;

use super::{Reader, Writer};

impl Writer {
    /// The `Warning` header values of the upstream's answer to the cache's list or watch, those
    /// about the resource: naming its version and kind (`v1 Endpoints`,
    /// `example.com/v1beta1 Widget`), as a deprecated API's do. Others are about the proxy's own
    /// request (a legacy token's warning, relayed by the apiserver's authenticator) and are not
    /// its clients' (found by a review); a custom resource version's own `deprecationWarning`
    /// text, which need not name it, is lost.
    pub fn set_warnings(&self, mut warnings: Vec<String>) {
        let about = format!("{} {}", self.shared.kind.api_version(), self.shared.kind.kind);
        warnings.retain(|w| w.contains(&about));
        let mut w = self.shared.warnings.lock();
        if w[..] != warnings[..] {
            *w = Arc::from(warnings);
        }
    }
}

impl Reader {
    /// The `Warning` header values a cached answer about this resource carries.
    pub fn warnings(&self) -> Arc<[String]> {
        self.shared.warnings.lock().clone()
    }
}
