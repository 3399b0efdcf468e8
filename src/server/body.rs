//! Response bodies built by the proxy itself: fixed chunks (lists, objects, errors) and
//! watch streams. The body type is shared with forwarded responses.
//!
//! Used by `server::serve`, `server::proxy` and the phases.

use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;

use crate::cache::Watch;
use crate::server::classify::ErrorEncoding;

/// Error type of every body the server sends.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every response the server sends.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A body made of ready chunks, sent as they are (no copy).
pub fn chunks(chunks: Vec<Bytes>) -> Body {
    let frames = chunks.into_iter().filter(|c| !c.is_empty()).map(|c| Ok::<_, BoxError>(Frame::data(c)));
    StreamBody::new(stream::iter(frames)).boxed_unsync()
}

/// A body whose chunks are produced on demand, as the connection takes them.
pub fn lazy(chunks: impl Iterator<Item = Bytes> + Send + 'static) -> Body {
    StreamBody::new(stream::iter(chunks.map(|c| Ok::<_, BoxError>(Frame::data(c))))).boxed_unsync()
}

/// A body holding one buffer.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed_unsync()
}

/// The apiserver `Status` response for an error.
pub fn error(e: crate::error::Error) -> http::Response<Body> {
    e.into_response::<Bytes>().map(full)
}

/// The apiserver `Status` response for an error written as the client's `Accept` has it (the
/// apiserver's `ErrorNegotiated`): in protobuf (JSON if the Status cannot be encoded), or, when
/// the client accepts only transforms, as `WriteRawJSON` does — indented, no final newline.
/// YAML is never asked for here (`classify` forwards such clients): JSON.
pub fn error_as(e: crate::error::Error, how: ErrorEncoding) -> http::Response<Body> {
    error_ref_as(&e, how)
}

/// [`error_as`] of a borrowed error.
pub fn error_ref_as(e: &crate::error::Error, how: ErrorEncoding) -> http::Response<Body> {
    let resp = e.response::<Bytes>();
    if how == ErrorEncoding::RawJson {
        let (mut parts, json) = resp.into_parts();
        let pretty = super::indent::indent(&json);
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let raw = pretty.slice(..pretty.len() - usize::from(pretty.ends_with(b"\n")));
        return http::Response::from_parts(parts, full(raw));
    }
    if how != ErrorEncoding::Protobuf {
        return resp.map(full);
    }
    let (mut parts, json) = resp.into_parts();
    match crate::proto::encode_status(&json) {
        Ok(pb) => {
            parts.headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(crate::proto::CONTENT_TYPE),
            );
            http::Response::from_parts(parts, full(pb))
        }
        Err(_) => http::Response::from_parts(parts, full(json)),
    }
}

/// A watch stream: the events as they come, flushed as they come. Events that are already
/// queued when the connection asks for more go out as one frame (one write, full TLS records):
/// a watcher that fell behind catches up with fewer writes, an idle one pays nothing.
pub fn watch(w: Watch) -> Body {
    WatchBody(w).boxed_unsync()
}

/// At most this many bytes of queued events are joined into one frame.
const COALESCE_BYTES: usize = 64 * 1024;

struct WatchBody(Watch);

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        let w = &mut self.get_mut().0;
        let first = match w.poll_next(cx) {
            Poll::Ready(Some(f)) => f,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        let mut more: Vec<Bytes> = Vec::new();
        let mut len = first.len();
        while len < COALESCE_BYTES {
            // `Pending` registers the waker, as the next call would; `None` (the end) is seen
            // again by the next call, after what is joined here has gone out.
            let Poll::Ready(Some(f)) = w.poll_next(cx) else { break };
            len += f.len();
            more.push(f);
        }
        let data = if more.is_empty() {
            first
        } else {
            let mut b = bytes::BytesMut::with_capacity(len);
            b.extend_from_slice(&first);
            more.iter().for_each(|f| b.extend_from_slice(f));
            b.freeze()
        };
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}
