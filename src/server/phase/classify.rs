//! Phase 8: classification (pure, `server::classify`): whether the cache may serve the request
//! and how, or why it goes upstream, or the apiserver's own refusal of it (answered by
//! `dispatch` once `authorize` has let the caller through, as the apiserver validates after
//! authorizing). The decision goes into the extensions as [`Classified`], with the request's
//! metrics label.

use std::sync::Arc;

use super::{context, context_mut, pass, Classified, Next, Phase, Req, Resp};
use crate::resource::ResourceKind;
use crate::server::catalog::{Catalog, Resources};
use crate::server::classify::{self, ForwardReason, RequestInfo, Route};

#[derive(Clone)]
pub struct Classify {
    /// The cached resources (a snapshot is taken per request).
    pub resources: Arc<Resources>,
}

impl<B: Send + Sync + 'static> Phase<B> for Classify {
    async fn call<S: Next<B>>(&self, mut req: Req<B>, next: &S) -> Resp {
        let computed;
        let info = match context(&req).and_then(|c| c.info.as_ref()) {
            Some(i) => i,
            None => {
                computed = classify::request_info(req.method(), req.uri().path(), req.uri().query());
                &computed
            }
        };
        // Go reads the header's bytes as they are (`é` in a parameter is no reason to ignore
        // the header); bytes that are not UTF-8 are the apiserver's to read.
        let accept_header = req.headers().get(http::header::ACCEPT);
        let accept = accept_header.and_then(|v| std::str::from_utf8(v.as_bytes()).ok());
        let catalog = self.resources.snapshot();
        let route = if accept_header.is_some() && accept.is_none() {
            Route::Forward(ForwardReason::Accept)
        } else {
            classify::classify(req.method(), req.uri().path(), req.uri().query(), accept, &catalog.kinds[..])
        };
        // A label only for cached resources: bounded whatever callers send.
        let resource = cached_resource(info, &catalog.kinds);
        let classified = match route {
            Route::Reject(e) => {
                Classified::Refuse { error: Arc::new(e), encoding: classify::error_encoding(accept) }
            }
            Route::Forward(ForwardReason::NotCached) if dropped(info, &catalog) => {
                // Not cached because of --cache-memory-limit: said apart (metrics, logs).
                Classified::Forward(ForwardReason::MemoryLimit)
            }
            Route::Forward(reason) => {
                if reason == ForwardReason::NotCached
                    && info.is_resource_request
                    && info.subresource.is_empty()
                {
                    // With a wildcard, a resource just installed is cached at once.
                    self.resources.missed(&info.api_group, &info.resource);
                }
                Classified::Forward(reason)
            }
            Route::Cache(_) if crate::upstream::upgrade_protocol(req.headers()).is_some() => {
                Classified::Forward(ForwardReason::Upgrade)
            }
            Route::Cache(cr) => {
                let key = (cr.kind.group.clone(), cr.kind.version.clone(), cr.kind.resource.clone());
                if catalog.caches.contains_key(&key) {
                    Classified::Cache { cr, catalog, key }
                } else {
                    // Retired between the two looks: the upstream answers.
                    Classified::Forward(ForwardReason::NotCached)
                }
            }
        };
        let ctx = context_mut(&mut req);
        ctx.classified = Some(classified);
        ctx.label = resource;
        pass(next, req).await
    }
}

/// Whether the request is about a resource `--cache-memory-limit` stopped caching.
fn dropped(info: &RequestInfo, catalog: &Catalog) -> bool {
    !catalog.dropped.is_empty()
        && info.is_resource_request
        && info.subresource.is_empty()
        && catalog.dropped.contains_key(&(
            info.api_group.clone(),
            info.api_version.clone(),
            info.resource.clone(),
        ))
}

/// The `group/resource` of a request about a cached resource, else empty (uncached resources,
/// discovery, non-resource paths are not labelled: their names come from callers).
fn cached_resource(info: &RequestInfo, kinds: &[Arc<ResourceKind>]) -> String {
    if !info.is_resource_request {
        return String::new();
    }
    kinds
        .iter()
        .find(|k| k.group == info.api_group && k.resource == info.resource)
        .map(|k| k.group_resource())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{configmaps, request, run_seen, upstream};

    fn decided(seen: Option<http::Extensions>) -> Option<Classified> {
        seen?.get::<super::super::RequestContext>()?.classified.clone()
    }

    #[tokio::test]
    async fn refusals_cached_reads_and_forwards_are_classified() {
        let (_w, r) = configmaps();
        let resources = Arc::new(Resources::default());
        resources.add(&upstream(), r);
        let s = Classify { resources };
        // Not cached: upstream.
        let (_, seen) = run_seen(s.clone(), request("/api/v1/pods?resourceVersion=0")).await;
        assert!(matches!(decided(seen), Some(Classified::Forward(ForwardReason::NotCached))));
        // Cached: served, with its label.
        let (_, seen) = run_seen(s.clone(), request("/api/v1/configmaps?resourceVersion=0")).await;
        let ctx = seen.unwrap().get::<super::super::RequestContext>().cloned().unwrap();
        assert!(matches!(ctx.classified, Some(Classified::Cache { .. })));
        assert_eq!(ctx.label, "configmaps");
        // The apiserver's own refusal of bad list options: classified, answered after authorization.
        let (_, seen) =
            run_seen(s, request("/api/v1/configmaps?resourceVersion=0&resourceVersionMatch=Exact")).await;
        match decided(seen) {
            Some(Classified::Refuse { error, encoding: classify::ErrorEncoding::Json }) => {
                assert_eq!(error.to_status().code.as_u16(), 422)
            }
            _ => panic!("a refusal"),
        }
    }

    /// An `Accept` header is read as Go reads it, bytes and all (a review: a byte past ASCII
    /// made it absent, JSON, where the apiserver negotiates it): UTF-8 is negotiated, anything
    /// else is the apiserver's.
    #[tokio::test]
    async fn an_accept_header_past_ascii_is_negotiated_or_forwarded() {
        let (_w, r) = configmaps();
        let resources = Arc::new(Resources::default());
        resources.add(&upstream(), r);
        let s = Classify { resources };
        let with = |accept: &[u8]| {
            let mut req = request("/api/v1/configmaps?resourceVersion=0");
            req.headers_mut().insert(http::header::ACCEPT, http::HeaderValue::from_bytes(accept).unwrap());
            req
        };
        let (_, seen) = run_seen(s.clone(), with("application/vnd.kubernetes.protobuf;x=é".as_bytes())).await;
        let ctx = seen.unwrap().get::<super::super::RequestContext>().cloned().unwrap();
        match ctx.classified {
            // An unknown parameter: the apiserver's (forwarded), not the JSON of no header.
            Some(Classified::Forward(ForwardReason::Accept)) => {}
            _ => panic!("not as expected"),
        }
        let (_, seen) =
            run_seen(s.clone(), with("application/vnd.kubernetes.protobuf, é/é".as_bytes())).await;
        match decided(seen) {
            Some(Classified::Cache { cr, .. }) => assert!(cr.repr.is_proto()),
            _ => panic!("not as expected"),
        }
        let (_, seen) = run_seen(s, with(b"application/json;x=\xff")).await;
        assert!(matches!(decided(seen), Some(Classified::Forward(ForwardReason::Accept))));
    }

    /// A WebSocket watch (a browser console's) of a cached resource is the apiserver's to
    /// answer (`101`, one event per message): forwarded, not a chunked stream from the cache.
    #[tokio::test]
    async fn an_upgrade_of_a_cached_read_is_forwarded() {
        let (_w, r) = configmaps();
        let resources = Arc::new(Resources::default());
        resources.add(&upstream(), r);
        let s = Classify { resources };
        let ws = |path: &str| {
            let mut req = request(path);
            req.headers_mut().insert("connection", http::HeaderValue::from_static("Upgrade"));
            req.headers_mut().insert("upgrade", http::HeaderValue::from_static("websocket"));
            req
        };
        let (_, seen) = run_seen(s.clone(), ws("/api/v1/configmaps?watch=1&resourceVersion=0")).await;
        assert!(matches!(decided(seen), Some(Classified::Forward(ForwardReason::Upgrade))));
        // The same watch without the upgrade: the cache's.
        let (_, seen) = run_seen(s, request("/api/v1/configmaps?watch=1&resourceVersion=0")).await;
        assert!(matches!(decided(seen), Some(Classified::Cache { .. })));
    }

    #[tokio::test]
    async fn a_resource_dropped_for_memory_is_forwarded_under_its_own_reason() {
        let (_w, r) = configmaps();
        let kind = r.kind().clone();
        let resources = Arc::new(Resources::default());
        resources.add(&upstream(), r);
        resources.set_dropped(&kind, "over the limit".into());
        let s = Classify { resources: resources.clone() };
        for path in ["/api/v1/configmaps?resourceVersion=0", "/api/v1/namespaces/ns/configmaps/a"] {
            let (_, seen) = run_seen(s.clone(), request(path)).await;
            assert!(matches!(decided(seen), Some(Classified::Forward(ForwardReason::MemoryLimit))), "{path}");
        }
        // Another resource is still just not cached; the dropped one is no longer cached at all.
        let (_, seen) = run_seen(s.clone(), request("/api/v1/pods?resourceVersion=0")).await;
        assert!(matches!(decided(seen), Some(Classified::Forward(ForwardReason::NotCached))));
        assert!(resources.snapshot().caches.is_empty());
        resources.remove(&kind);
        let (_, seen) = run_seen(s, request("/api/v1/configmaps?resourceVersion=0")).await;
        assert!(matches!(decided(seen), Some(Classified::Forward(ForwardReason::NotCached))));
    }
}
