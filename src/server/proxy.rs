//! Forward upstream: a request the cache does not serve goes to the apiserver unchanged and
//! its answer comes back unchanged, streamed both ways (`upstream::Upstream::forward` does
//! the work; this maps transport failures to a Status).
//!
//! Called by `Server::forward`.

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::body::{self, Body};
use crate::error::Error;
use crate::upstream::Upstream;

pub async fn forward(upstream: &Upstream, req: Request<Incoming>) -> Response<Body> {
    match upstream.forward(req).await {
        Ok(resp) => resp.map(|b| b.map_err(Into::into).boxed_unsync()),
        Err(e) => {
            tracing::warn!(error = %e, "forwarding upstream failed");
            body::error(Error::ServiceUnavailable(format!(
                "the upstream apiserver could not be reached: {e}"
            )))
        }
    }
}
