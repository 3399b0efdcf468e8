//! Forward upstream: a request the cache does not serve goes to the apiserver and its answer
//! comes back unchanged, streamed both ways (`upstream::Upstream::forward` does the work; this
//! picks whose identity it carries and maps transport failures to a Status).
//!
//! Identities stay apart: a token caller's request goes with its own `Authorization` unchanged;
//! an anonymous caller's goes with no credentials; a certificate caller's goes with the proxy's
//! credentials and `Impersonate-*` headers naming the (authorized) effective user. With
//! `--auth=none` (a trusted loopback sidecar) requests go as the proxy itself, like `kubectl
//! proxy`: the proxy's credentials replace the caller's `Authorization`, and `Impersonate-*`
//! headers are dropped. Called by `Server::forward`.

use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::auth::{impersonate, Caller, Credential};
use super::body::{self, Body};
use crate::error::Error;
use crate::upstream::Upstream;

pub async fn forward(upstream: &Upstream, req: Request<Incoming>, caller: &Caller) -> Response<Body> {
    let sent = match caller.credential {
        Credential::Certificate => {
            let mut imp = HeaderMap::new();
            if let Err(e) = impersonate::set(&mut imp, &caller.effective) {
                return body::error(Error::Internal(e));
            }
            upstream.forward_impersonating(req, imp).await
        }
        Credential::Trusted => upstream.forward_as_proxy(req).await,
        // Never the proxy's credentials: the token caller's own header, or none at all.
        Credential::Anonymous | Credential::Token(_) => upstream.forward(req).await,
    };
    match sent {
        Ok(resp) => resp.map(|b| b.map_err(Into::into).boxed_unsync()),
        Err(e) => {
            tracing::warn!(error = %e, "forwarding upstream failed");
            body::error(Error::ServiceUnavailable(format!(
                "the upstream apiserver could not be reached: {e}"
            )))
        }
    }
}
