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
    /// The `Warning` header values of the upstream's answer to the list just installed.
    pub fn set_warnings(&self, warnings: Vec<String>) {
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
