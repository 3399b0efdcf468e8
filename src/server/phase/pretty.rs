//! Phase 6: JSON indented for people, as the apiserver indents it (`server::indent`): for a
//! request with `?pretty=true` or a `curl` / `Wget` / browser user agent, every JSON answer
//! the proxy makes itself — objects and lists from the cache, its Statuses, the refusals of the
//! phases after this one — is indented; watches (no `Content-Length`: a stream) and protobuf are
//! not, as the apiserver's are not, and forwarded answers are the upstream's own (it got the
//! same query and user agent). Sits inside `admit` (the indented answer is what its in-flight
//! permit, write-stall cut and deadline hold: drained outside it, a small answer's permit was
//! freed at once while its indented copy waited for a client that never read it), outside
//! every later phase that answers, and inside `compress` (a large indented list is then gzip'd
//! as the apiserver gzips it); the refusals of `sizes` and `admit` are not indented. An answer
//! is never held whole twice: up to 1 MiB of compact JSON is indented whole with its
//! `Content-Length`; a larger answer is indented as it is sent, chunked, as the apiserver
//! sends a large answer.

use bytes::Bytes;
use futures_util::{stream, StreamExt};
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, USER_AGENT};
use http::HeaderValue;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use super::{pass, FromUpstream, Next, Phase, Req, Resp};
use crate::server::{body, gzip, indent};

#[derive(Clone)]
pub struct Pretty;

impl<B: Send + Sync + 'static> Phase<B> for Pretty {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        let wanted =
            indent::wanted(req.uri().query(), req.headers().get(USER_AGENT).map(HeaderValue::as_bytes));
        let resp = pass(next, req).await;
        if !wanted || !indentable(&resp) {
            return resp;
        }
        let (mut parts, mut b) = resp.into_parts();
        // A small answer is indented whole, with its `Content-Length` (as the apiserver's fits
        // its write buffer). A larger one is indented as it streams, chunked (as the apiserver
        // sends a large answer): never held whole.
        let mut compact: Vec<Bytes> = Vec::new();
        let mut read = 0;
        while read <= WHOLE_MAX {
            match b.frame().await {
                None => {
                    let mut ind = indent::Indenter::default();
                    let mut pretty = Vec::with_capacity(read + read / 2);
                    compact.iter().for_each(|c| ind.feed(c, &mut pretty));
                    parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(pretty.len()));
                    return http::Response::from_parts(parts, body::full(pretty));
                }
                Some(Ok(f)) => {
                    if let Some(d) = f.into_data().ok().filter(|d| !d.is_empty()) {
                        read += d.len();
                        compact.push(d);
                    }
                }
                // The body failed after its head: the answer fails too (the connection is cut
                // short, as the client would have seen it), never a complete-looking empty one
                // (which gzip would have made a valid stream).
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "an answer to indent failed");
                    parts.headers.remove(CONTENT_LENGTH);
                    let failed = stream::iter([Err::<Frame<Bytes>, _>(e)]);
                    return http::Response::from_parts(parts, StreamBody::new(failed).boxed_unsync());
                }
            }
        }
        parts.headers.remove(CONTENT_LENGTH);
        // Larger than the gzip threshold, though its length is not told.
        parts.extensions.insert(gzip::Large);
        let mut ind = indent::Indenter::default();
        let pieces = stream::iter(compact.into_iter().map(Ok))
            .chain(b.into_data_stream())
            .map(move |r| r.map(|d| ind.piece(&d)))
            .filter(|r| std::future::ready(r.as_ref().map_or(true, |p| !p.is_empty())))
            .map(|r| r.map(Frame::data));
        http::Response::from_parts(parts, StreamBody::new(pieces).boxed_unsync())
    }
}

/// Compact bytes read before an answer is indented as it streams rather than whole.
const WHOLE_MAX: usize = 1 << 20;

/// A whole JSON answer of the proxy's own: not forwarded, not a stream (a list has its
/// `Content-Length`, a Status a body of known size; a watch neither), not encoded.
fn indentable(resp: &Resp) -> bool {
    let h = resp.headers();
    resp.extensions().get::<FromUpstream>().is_none()
        && (h.contains_key(CONTENT_LENGTH) || http_body::Body::size_hint(resp.body()).exact().is_some())
        && !h.contains_key(CONTENT_ENCODING)
        && h.get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{request, text};

    /// The rest of the stack: answers a JSON document as `ctype`, whole (with its
    /// `Content-Length`) or streamed, marked forwarded if `forwarded`.
    #[derive(Clone)]
    struct Answer {
        ctype: &'static str,
        length: bool,
        forwarded: bool,
    }

    impl Next<String> for Answer {
        async fn run(&self, _req: Req<String>) -> Resp {
            let b = Bytes::from_static(b"{\"a\":[1,{}]}\n");
            let body =
                if self.length { body::full(b.clone()) } else { body::lazy(std::iter::once(b.clone())) };
            let mut resp = http::Response::new(body);
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(self.ctype));
            if self.length {
                resp.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(b.len()));
            }
            if self.forwarded {
                resp.extensions_mut().insert(FromUpstream);
            }
            resp
        }
    }

    async fn answer(path: &str, agent: &str, next: Answer) -> (Option<String>, String) {
        let mut req = request(path);
        req.headers_mut().insert(USER_AGENT, HeaderValue::from_str(agent).unwrap());
        let resp = Pretty.call(req, &next).await;
        let len = resp.headers().get(CONTENT_LENGTH).map(|v| v.to_str().unwrap().to_owned());
        (len, text(resp).await)
    }

    /// The rest of the stack answering a large list in 64 KiB chunks, with its length.
    #[derive(Clone)]
    struct Large(Vec<Bytes>);

    impl Next<String> for Large {
        async fn run(&self, _req: Req<String>) -> Resp {
            let len: usize = self.0.iter().map(Bytes::len).sum();
            let mut resp = http::Response::new(body::chunks(self.0.clone()));
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(len));
            resp
        }
    }

    /// Over 1 MiB compact, an answer is indented as it streams: no `Content-Length` (chunked,
    /// as the apiserver sends a large answer), marked large for gzip, the same bytes as the
    /// whole's indentation; just under, it is indented whole with its length.
    #[tokio::test]
    async fn a_large_answer_is_indented_as_it_streams() {
        let item = r#"{"metadata":{"name":"n","labels":{"a":"b"}},"data":{"k":"a string, with: {brackets} and \"quotes\""}}"#;
        for (n, streamed) in [(20_000, true), (5_000, false)] {
            let compact = format!("{{\"items\":[{}]}}\n", vec![item; n].join(","));
            let chunks: Vec<Bytes> =
                compact.as_bytes().chunks(64 * 1024).map(Bytes::copy_from_slice).collect();
            assert_eq!(compact.len() > WHOLE_MAX, streamed);
            let mut req = request("/api/v1/configmaps");
            req.headers_mut().insert(USER_AGENT, HeaderValue::from_static("curl/8.5.0"));
            let resp = Pretty.call(req, &Large(chunks)).await;
            let want = indent::indent(compact.as_bytes());
            let len =
                resp.headers().get(CONTENT_LENGTH).map(|v| v.to_str().unwrap().parse::<usize>().unwrap());
            assert_eq!(len, (!streamed).then_some(want.len()));
            assert_eq!(resp.extensions().get::<gzip::Large>().is_some(), streamed);
            assert_eq!(text(resp).await.as_bytes(), &want[..]);
        }
    }

    /// The rest of the stack answering a list whose body fails after its first chunk.
    #[derive(Clone)]
    struct Failing;

    impl Next<String> for Failing {
        async fn run(&self, _req: Req<String>) -> Resp {
            let chunks: Vec<Result<Frame<Bytes>, body::BoxError>> =
                vec![Ok(Frame::data(Bytes::from_static(b"{\"items\":["))), Err("upstream cut".into())];
            let mut resp = http::Response::new(StreamBody::new(stream::iter(chunks)).boxed_unsync());
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(200_000));
            resp
        }
    }

    /// A body that fails while it is read to be indented makes the indented answer fail too,
    /// with no `Content-Length` to be mistaken for a complete empty answer.
    #[tokio::test]
    async fn an_answer_failing_while_indented_fails() {
        let mut req = request("/api/v1/configmaps");
        req.headers_mut().insert(USER_AGENT, HeaderValue::from_static("curl/8.5.0"));
        let resp = Pretty.call(req, &Failing).await;
        assert!(resp.headers().get(CONTENT_LENGTH).is_none());
        let got = http_body_util::BodyExt::collect(resp.into_body()).await;
        assert_eq!(got.err().map(|e| e.to_string()).as_deref(), Some("upstream cut"));
    }

    #[tokio::test]
    async fn only_the_proxys_own_whole_json_answers_are_indented() {
        let json = Answer { ctype: "application/json", length: true, forwarded: false };
        let pretty = "{\n  \"a\": [\n    1,\n    {}\n  ]\n}";
        assert_eq!(
            answer("/api/v1/pods", "curl/8.5.0", json.clone()).await,
            (Some("30".into()), pretty.into())
        );
        assert_eq!(answer("/api/v1/pods?pretty=1", "kubectl", json.clone()).await.1, pretty);
        let compact = "{\"a\":[1,{}]}\n";
        assert_eq!(answer("/api/v1/pods", "kubectl/v1.28", json.clone()).await.1, compact);
        assert_eq!(answer("/api/v1/pods?pretty=false", "curl/8.5.0", json).await.1, compact);
        // A stream (a watch), protobuf, a forwarded answer: as they are.
        let stream = Answer { ctype: "application/json", length: false, forwarded: false };
        assert_eq!(answer("/api/v1/pods?watch=1", "curl/8.5.0", stream).await.1, compact);
        let proto = Answer { ctype: "application/vnd.kubernetes.protobuf", length: true, forwarded: false };
        assert_eq!(answer("/api/v1/pods", "curl/8.5.0", proto).await.1, compact);
        let forwarded = Answer { ctype: "application/json", length: true, forwarded: true };
        assert_eq!(answer("/api/v1/pods", "curl/8.5.0", forwarded).await.1, compact);
    }
}
