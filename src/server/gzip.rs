//! gzip of large responses served from the cache, the way the apiserver compresses its
//! non-watch responses (1.36, `responsewriters/writers.go` + `compression.go`).
//!
//! Called by `phase::compress` on every answer the cache served before it is sent; forwarded
//! responses never come here (the upstream decided their encoding). The apiserver's rule:
//!
//! * the request's first `Accept-Encoding` header, split at `,`, has a token that is exactly
//!   `gzip` once surrounding white space is trimmed (`ContentEncodingSupported`). So
//!   `gzip, deflate` and `deflate,gzip` ask for gzip; `gzip;q=0`, `gzip;q=1`, `GZIP`, `*` and
//!   `identity` do not (no q-values, no wildcard, case-sensitive: a client that gets identity
//!   where it allowed gzip still reads it, so matching the apiserver byte for byte is safe);
//! * the body is larger than 128 KiB (`defaultGzipThresholdBytes`; the apiserver measures its
//!   first write, which for a streamed list is the buffered prefix, i.e. the whole body once it
//!   passes the threshold);
//! * level 1 (`gzipContentEncodingLevel`), `Content-Encoding: gzip`, `Vary: Accept-Encoding`
//!   added, no `Content-Length` (chunked).
//!
//! Watch streams are never compressed in 1.36. Here that follows from the size test: only
//! bodies whose length is known up front (`Content-Length`, which cached LISTs carry and
//! watches never do), or that are marked [`Large`] (an indented list over 1 MiB, sent as it is
//! made), can pass it, so the body is never buffered to decide.
//!
//! The body is compressed as it is sent: each frame of the inner body goes through one
//! [`GzEncoder`] and whatever compressed bytes it produced go out as the next frame; the
//! gzip trailer follows the last frame.

use std::io::Write;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, VARY};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;

use super::body::{Body, BoxError};

/// Bodies strictly larger than this are compressed (`defaultGzipThresholdBytes`).
pub const THRESHOLD_BYTES: u64 = 128 * 1024;
/// The apiserver's `gzipContentEncodingLevel`: least CPU, ratio close to the higher levels.
pub const LEVEL: u32 = 1;

/// Whether the request asks for gzip by the apiserver's rule (see the module doc).
pub fn accepts_gzip(req_headers: &HeaderMap) -> bool {
    // Go's Header.Get: the first value only.
    let Some(v) = req_headers.get(ACCEPT_ENCODING) else {
        return false;
    };
    // Invalid UTF-8 cannot be part of a `gzip` token; the lossy form keeps the other tokens.
    String::from_utf8_lossy(v.as_bytes()).split(',').any(|t| t.trim() == "gzip")
}

/// Compresses `resp` when the request accepts gzip and the response is a 200 whose
/// `Content-Length` exceeds [`THRESHOLD_BYTES`] and that has no `Content-Encoding` yet;
/// returns it unchanged otherwise.
pub fn maybe_compress(req_headers: &HeaderMap, resp: Response<Body>) -> Response<Body> {
    let large = resp.extensions().get::<Large>().is_some()
        || content_length(resp.headers()).is_some_and(|n| n > THRESHOLD_BYTES);
    if resp.status() != StatusCode::OK
        || resp.headers().contains_key(CONTENT_ENCODING)
        || !large
        || !accepts_gzip(req_headers)
    {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    parts.headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    parts.headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    Response::from_parts(parts, compress(body))
}

/// Marks a response larger than [`THRESHOLD_BYTES`] whose length is not told (an indented
/// list sent as it is made, `phase::pretty`).
#[derive(Clone, Copy, Debug)]
pub struct Large;

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// `body` gzip-compressed at [`LEVEL`], frame by frame (see the module doc).
pub fn compress(body: Body) -> Body {
    GzipBody { inner: body, enc: Some(GzEncoder::new(Vec::new(), Compression::new(LEVEL))), trailers: None }
        .boxed_unsync()
}

/// The streaming encoder behind [`compress`].
struct GzipBody {
    inner: Body,
    /// `None` once the gzip trailer was sent (or the inner body failed).
    enc: Option<GzEncoder<Vec<u8>>>,
    /// Trailers of the inner body, sent after the gzip trailer.
    trailers: Option<HeaderMap>,
}

impl GzipBody {
    /// Ends the gzip stream: its last compressed bytes and the trailer (never empty).
    fn finish(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        let enc = self.enc.take()?;
        Some(enc.finish().map(|tail| Frame::data(Bytes::from(tail))).map_err(BoxError::from))
    }
}

impl http_body::Body for GzipBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let Some(enc) = this.enc.as_mut() else {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    this.enc = None;
                    return Poll::Ready(Some(Err(e)));
                }
                None => return Poll::Ready(this.finish()),
            };
            match frame.into_data() {
                Ok(data) => {
                    if let Err(e) = enc.write_all(&data) {
                        this.enc = None;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                    let out = std::mem::take(enc.get_mut());
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                    // Nothing produced yet (the encoder is still filling its window): next frame.
                }
                Err(frame) => {
                    // Trailers end a body: close the gzip stream, then hand them on.
                    this.trailers = frame.into_trailers().ok();
                    return Poll::Ready(this.finish());
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.enc.is_none() && self.trailers.is_none()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use flate2::read::GzDecoder;
    use futures_util::stream;
    use http_body::Body as _;
    use http_body_util::StreamBody;

    use super::*;
    use crate::server::body;

    fn req(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        GzDecoder::new(b).read_to_end(&mut out).expect("valid gzip");
        out
    }

    /// Pseudo-random bytes: incompressible, so the encoder has to emit as it goes.
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut r = fastrand::Rng::with_seed(seed);
        (0..n).map(|_| r.u8(..)).collect()
    }

    fn response(len: usize, headers: &[(&'static str, &str)]) -> Response<Body> {
        let mut resp = Response::new(body::full(vec![b'x'; len]));
        resp.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(len));
        for (k, v) in headers {
            resp.headers_mut().append(*k, HeaderValue::from_str(v).unwrap());
        }
        resp
    }

    #[test]
    fn accept_encoding_follows_the_apiservers_rule() {
        // (first header value, gzip?) — ContentEncodingSupported: comma-split, trimmed, exact.
        let table: &[(&str, bool)] = &[
            ("gzip", true),
            ("gzip, deflate, br", true),
            ("deflate,gzip", true),
            ("br ,  gzip  , zstd", true),
            ("\tgzip\t", true),
            ("", false),
            ("identity", false),
            ("gzip;q=0", false),
            // Any parameter makes the token differ from `gzip`, even an acceptable q.
            ("gzip;q=1.0", false),
            ("gzip ;q=0.5", false),
            // Case-sensitive, no wildcard, no alias.
            ("GZIP", false),
            ("Gzip, deflate", false),
            ("*", false),
            ("x-gzip", false),
            ("gzipped", false),
            ("deflate", false),
        ];
        for (value, want) in table {
            assert_eq!(accepts_gzip(&req(&[value])), *want, "Accept-Encoding: {value:?}");
        }
        assert!(!accepts_gzip(&HeaderMap::new()), "no header");
        // Go's Header.Get reads the first value only.
        assert!(!accepts_gzip(&req(&["identity", "gzip"])));
        assert!(accepts_gzip(&req(&["gzip", "identity"])));
        // Bytes that are not UTF-8 do not hide a gzip token next to them.
        let mut h = HeaderMap::new();
        h.insert(ACCEPT_ENCODING, HeaderValue::from_bytes(b"\xff\xfe, gzip").unwrap());
        assert!(accepts_gzip(&h));
    }

    #[tokio::test]
    async fn large_ok_response_is_compressed_with_the_apiservers_headers() {
        let len = THRESHOLD_BYTES as usize + 1;
        let resp = response(len, &[("vary", "Origin"), ("content-type", "application/json")]);
        let out = maybe_compress(&req(&["gzip"]), resp);
        let h = out.headers();
        assert_eq!(h.get(CONTENT_ENCODING).unwrap(), "gzip");
        assert!(h.get(CONTENT_LENGTH).is_none(), "chunked: no Content-Length");
        let vary: Vec<_> = h.get_all(VARY).iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(vary, ["Origin", "Accept-Encoding"], "Vary is added to, not replaced");
        assert_eq!(h.get("content-type").unwrap(), "application/json");
        let b = out.into_body().collect().await.unwrap().to_bytes();
        assert!(b.len() < len / 10, "compressed: {} bytes", b.len());
        assert_eq!(gunzip(&b), vec![b'x'; len]);
    }

    /// An indented list sent as it is made (`phase::pretty`): no length, marked large, and
    /// compressed like any large answer; unmarked, a body of unknown length is not.
    #[tokio::test]
    async fn a_large_answer_of_untold_length_is_compressed_when_marked() {
        for marked in [true, false] {
            let mut resp = response(1000, &[]);
            resp.headers_mut().remove(CONTENT_LENGTH);
            if marked {
                resp.extensions_mut().insert(Large);
            }
            let out = maybe_compress(&req(&["gzip"]), resp);
            assert_eq!(out.headers().get(CONTENT_ENCODING).is_some(), marked);
            let b = out.into_body().collect().await.unwrap().to_bytes();
            let plain = if marked { gunzip(&b) } else { b.to_vec() };
            assert_eq!(plain, vec![b'x'; 1000]);
        }
    }

    #[tokio::test]
    async fn other_responses_pass_unchanged() {
        let at = THRESHOLD_BYTES as usize;
        let cases: Vec<(&str, HeaderMap, Response<Body>)> = vec![
            ("exactly the threshold", req(&["gzip"]), response(at, &[])),
            ("not asked", req(&["identity"]), response(at + 1, &[])),
            ("no header", HeaderMap::new(), response(at + 1, &[])),
            ("already encoded", req(&["gzip"]), response(at + 1, &[("content-encoding", "br")])),
            ("length unknown (watch)", req(&["gzip"]), {
                let mut r = response(at + 1, &[]);
                r.headers_mut().remove(CONTENT_LENGTH);
                r
            }),
            ("not 200", req(&["gzip"]), {
                let mut r = response(at + 1, &[]);
                *r.status_mut() = StatusCode::NOT_FOUND;
                r
            }),
            ("bad length", req(&["gzip"]), {
                let mut r = response(at + 1, &[]);
                r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from_static("lots"));
                r
            }),
        ];
        for (what, h, resp) in cases {
            let before = resp.headers().clone();
            let out = maybe_compress(&h, resp);
            assert_eq!(out.headers(), &before, "{what}: headers unchanged");
            let b = out.into_body().collect().await.unwrap().to_bytes();
            assert!(b.iter().all(|&c| c == b'x'), "{what}: identity body");
        }
    }

    #[tokio::test]
    async fn frames_in_valid_gzip_out_equal_after_decompression() {
        // Text-like frames of uneven sizes, an empty one among them.
        let frames: Vec<Bytes> = (0..200)
            .map(|i| Bytes::from(format!("{{\"i\":{i},\"pad\":\"{}\"}},", "ab".repeat(i * 37 % 900))))
            .chain([Bytes::new(), Bytes::from_static(b"]}\n")])
            .collect();
        let want: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let mut gz = compress(body::chunks(frames));
        let mut out = Vec::new();
        let mut n = 0;
        while let Some(f) = gz.frame().await {
            let data = f.unwrap().into_data().expect("only data frames");
            assert!(!data.is_empty(), "no empty frames");
            out.extend_from_slice(&data);
            n += 1;
        }
        assert!(gz.is_end_stream());
        assert!(n >= 1);
        assert_eq!(gunzip(&out), want);
        assert!(out.len() < want.len() / 4, "compressed: {} of {}", out.len(), want.len());
    }

    #[tokio::test]
    async fn output_streams_before_the_input_ends() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
        let s = stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
        });
        let mut gz = compress(StreamBody::new(s).boxed_unsync());
        let mut want = Vec::new();
        let mut got = Vec::new();
        // 1 MiB of noise in 64 KiB frames: compressed bytes come out while the input is open.
        for i in 0..16 {
            let chunk = noise(64 * 1024, i);
            want.extend_from_slice(&chunk);
            tx.send(Bytes::from(chunk)).await.unwrap();
            // Take every frame ready now without waiting for more input.
            while let Some(Some(f)) = futures_util::FutureExt::now_or_never(gz.frame()) {
                got.extend_from_slice(&f.unwrap().into_data().unwrap());
            }
        }
        assert!(got.len() > 512 * 1024, "only {} bytes out before the end of the input", got.len());
        drop(tx);
        while let Some(f) = gz.frame().await {
            got.extend_from_slice(&f.unwrap().into_data().unwrap());
        }
        assert_eq!(gunzip(&got), want);
    }

    #[tokio::test]
    async fn inner_errors_propagate_and_end_the_body() {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> =
            vec![Ok(Frame::data(Bytes::from(noise(100_000, 7)))), Err("upstream went away".into())];
        let mut gz = compress(StreamBody::new(stream::iter(frames)).boxed_unsync());
        let mut err = None;
        while let Some(f) = gz.frame().await {
            if let Err(e) = f {
                err = Some(e.to_string());
            }
        }
        assert_eq!(err.as_deref(), Some("upstream went away"));
        assert!(gz.is_end_stream());
    }

    #[tokio::test]
    async fn trailers_follow_the_gzip_trailer() {
        let mut t = HeaderMap::new();
        t.insert("x-check", HeaderValue::from_static("1"));
        let frames: Vec<Result<Frame<Bytes>, BoxError>> =
            vec![Ok(Frame::data(Bytes::from_static(b"hello "))), Ok(Frame::trailers(t.clone()))];
        let mut gz = compress(StreamBody::new(stream::iter(frames)).boxed_unsync());
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(f) = gz.frame().await {
            let f = f.unwrap();
            assert!(trailers.is_none(), "nothing after the trailers");
            match f.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => trailers = f.into_trailers().ok(),
            }
        }
        assert_eq!(gunzip(&data), b"hello ");
        assert_eq!(trailers, Some(t));
    }
}
