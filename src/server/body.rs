//! Response bodies built by the proxy itself: fixed chunks (lists, objects, errors) and
//! watch streams. The body type is shared with forwarded responses.
//!
//! Used by `server::serve` and `server::handle`.

use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;

use crate::cache::Watch;

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

/// A watch stream: one frame per event, flushed as it comes.
pub fn watch(w: Watch) -> Body {
    let s =
        stream::unfold(
            w,
            |mut w| async move { w.next().await.map(|b| (Ok::<_, BoxError>(Frame::data(b)), w)) },
        );
    StreamBody::new(s).boxed_unsync()
}
