//! An upstream WATCH: the request, and the stream that splits the chunked body into event lines.
//!
//! Called by `reflector`, which reads [`WatchStream::next`] in a loop. Lines may span frames and
//! several may share one frame; a line that fits in one frame is a zero-copy slice of it, and
//! each event's `object` is a zero-copy slice of its line.

use std::borrow::Cow;

use bytes::{Buf, Bytes, BytesMut};
use http::Method;
use http_body::Body;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::client::status_error;
use super::{BoxBody, BoxError, Upstream, UpstreamError};
use crate::resource::{EventType, ResourceKind, Rv};

/// A line longer than this is treated as a broken stream rather than buffered without bound
/// (the apiserver's own request limit is 3 MiB per object; watch lines carry one object).
const MAX_LINE: usize = 64 << 20;

/// One watch event as received.
#[derive(Debug)]
pub struct RawEvent {
    pub kind: EventType,
    /// The raw bytes of `object`, a slice of the received line.
    pub object: Bytes,
}

impl RawEvent {
    /// For an ERROR event, its `Status` as an [`UpstreamError::Status`] (so that
    /// [`UpstreamError::is_gone`] tells a 410 `too old resource version`); `None` otherwise.
    pub fn error(&self) -> Option<UpstreamError> {
        if self.kind != EventType::Error {
            return None;
        }
        let status = serde_json::from_slice::<serde_json::Value>(&self.object).ok();
        let code = status.as_ref().and_then(|s| s.get("code")).and_then(|c| c.as_u64()).unwrap_or(500);
        let code = http::StatusCode::from_u16(u16::try_from(code).unwrap_or(500))
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        Some(status_error(code, self.object.clone()))
    }
}

#[derive(Deserialize)]
struct RawEventJson<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// The events of one upstream watch, in order.
pub struct WatchStream {
    body: BoxBody,
    /// The rest of the current frame, after the last complete line taken from it.
    frame: Bytes,
    /// A line begun in an earlier frame.
    partial: BytesMut,
    done: bool,
    /// The answer's `Warning` header values (a deprecated API's).
    pub warnings: Vec<String>,
}

impl WatchStream {
    /// A stream over any body (the upstream's, or a scripted one in tests).
    pub fn from_body<B>(body: B) -> WatchStream
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        WatchStream {
            body: body.map_err(Into::into).boxed_unsync(),
            frame: Bytes::new(),
            partial: BytesMut::new(),
            done: false,
            warnings: Vec::new(),
        }
    }

    /// The next event: `Ok(None)` at the clean end of the stream, `Err` on a transport error or
    /// a line that is not a watch event. Empty lines are skipped.
    pub async fn next(&mut self) -> Result<Option<RawEvent>, UpstreamError> {
        loop {
            while let Some(line) = self.take_line()? {
                if let Some(ev) = parse_line(line)? {
                    return Ok(Some(ev));
                }
            }
            if self.done {
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.frame = data;
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Err(super::client::transport("watch stream", &*e));
                }
                None => {
                    self.done = true;
                    // The apiserver ends every event with '\n'; accept a final unterminated one.
                    if self.partial.iter().any(|b| !b.is_ascii_whitespace()) {
                        let last = self.partial.split().freeze();
                        return parse_line(last);
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// The next complete line from what has been received, without its '\n'.
    fn take_line(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        match self.frame.iter().position(|&b| b == b'\n') {
            Some(i) => {
                let line = self.frame.split_to(i + 1);
                if self.partial.is_empty() {
                    Ok(Some(line.slice(..i)))
                } else {
                    self.partial.extend_from_slice(&line[..i]);
                    Ok(Some(self.partial.split().freeze()))
                }
            }
            None => {
                if self.partial.len() + self.frame.len() > MAX_LINE {
                    self.done = true;
                    return Err(UpstreamError::Decode(format!("watch event longer than {MAX_LINE} bytes")));
                }
                self.partial.extend_from_slice(&self.frame);
                self.frame.advance(self.frame.len());
                Ok(None)
            }
        }
    }
}

/// `{"type":…,"object":…}` → a [`RawEvent`]; `None` for a blank line.
fn parse_line(line: Bytes) -> Result<Option<RawEvent>, UpstreamError> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let raw: RawEventJson<'_> = serde_json::from_slice(&line)
        .map_err(|e| UpstreamError::Decode(format!("watch event: {e}: {}", preview(&line))))?;
    let kind = EventType::parse(&raw.kind)
        .ok_or_else(|| UpstreamError::Decode(format!("watch event of unknown type {:?}", raw.kind)))?;
    Ok(Some(RawEvent { kind, object: line.slice_ref(raw.object.get().as_bytes()) }))
}

fn preview(line: &[u8]) -> String {
    let s = String::from_utf8_lossy(&line[..line.len().min(120)]);
    super::config::one_line(&s)
}

/// `?watch=true&allowWatchBookmarks=true&resourceVersion=<rv>&timeoutSeconds=<t>`.
pub(crate) fn watch_query(rv: Rv, timeout_secs: u32) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("watch", "true")
        .append_pair("allowWatchBookmarks", "true")
        .append_pair("resourceVersion", &rv.to_string())
        .append_pair("timeoutSeconds", &timeout_secs.to_string())
        .finish()
}

impl Upstream {
    /// A WATCH with the proxy's own credentials from `rv`. Waits at most 60 s for the response
    /// headers; the stream itself has no overall timeout (the upstream ends it after
    /// `timeout_secs`). A non-2xx answer is [`UpstreamError::Status`].
    pub async fn watch(
        &self,
        kind: &ResourceKind,
        rv: Rv,
        timeout_secs: u32,
    ) -> Result<WatchStream, UpstreamError> {
        let path = format!("{}?{}", kind.collection_path(None), watch_query(rv, timeout_secs));
        let req = self.inner.own_request(Method::GET, &path, None)?;
        let resp = self.inner.send_own(req).await?;
        let warnings = super::client::warnings(resp.headers());
        Ok(WatchStream { warnings, ..WatchStream::from_body(resp.into_body()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::testutil::chunked_body;

    async fn collect(chunks: &[&str]) -> Vec<Result<(EventType, String), String>> {
        let mut w = WatchStream::from_body(chunked_body(chunks));
        let mut out = Vec::new();
        loop {
            match w.next().await {
                Ok(Some(ev)) => out.push(Ok((ev.kind, String::from_utf8(ev.object.to_vec()).unwrap()))),
                Ok(None) => break,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    break;
                }
            }
        }
        out
    }

    const A: &str = r#"{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"243"}}}"#;
    const B: &str = r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"250"}}}"#;
    // From `restart-watch-too-old`.
    const E: &str = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 197 (395)","reason":"Expired","code":410}}"#;

    fn obj(line: &str) -> String {
        line[line.find(r#""object":"#).unwrap() + 9..line.len() - 1].to_owned()
    }

    #[tokio::test]
    async fn one_event_per_frame() {
        let got = collect(&[&format!("{A}\n"), &format!("{B}\n")]).await;
        assert_eq!(got, vec![Ok((EventType::Added, obj(A))), Ok((EventType::Bookmark, obj(B)))]);
    }

    #[tokio::test]
    async fn events_split_across_frames_and_several_per_frame() {
        let all = format!("{A}\n{B}\n\n{A}\n{E}\n");
        // Every split point, including inside escapes and right after '\n'.
        for cut in 1..all.len() {
            let (x, y) = all.split_at(cut);
            let got = collect(&[x, y]).await;
            assert_eq!(got.len(), 4, "cut at {cut}");
            assert_eq!(got[3], Ok((EventType::Error, obj(E))));
        }
        // Byte by byte.
        let bytes: Vec<String> = all.chars().map(String::from).collect();
        let refs: Vec<&str> = bytes.iter().map(String::as_str).collect();
        let got = collect(&refs).await;
        assert_eq!(got.iter().filter(|e| e.is_ok()).count(), 4);
    }

    #[tokio::test]
    async fn error_event_is_gone() {
        let mut w = WatchStream::from_body(chunked_body(&[&format!("{E}\n")]));
        let ev = w.next().await.unwrap().unwrap();
        let err = ev.error().unwrap();
        assert!(err.is_gone());
        assert_eq!(err.status_code(), Some(410));
        assert!(err.to_string().contains("too old resource version: 197 (395)"), "{err}");
        assert!(w.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn unterminated_last_line_and_crlf_are_accepted() {
        let got = collect(&[&format!("{A}\r\n"), B]).await;
        assert_eq!(got, vec![Ok((EventType::Added, obj(A))), Ok((EventType::Bookmark, obj(B)))]);
    }

    #[tokio::test]
    async fn garbage_and_unknown_types_are_errors() {
        let got = collect(&["{\"type\":\"ADDED\"\n"]).await;
        assert!(matches!(&got[0], Err(e) if e.starts_with("unexpected upstream response: watch event")));
        let got = collect(&[r#"{"type":"RENAMED","object":{}}"#, "\n"]).await;
        assert!(matches!(&got[0], Err(e) if e.contains("unknown type")), "{got:?}");
    }

    #[tokio::test]
    async fn transport_error_mid_stream() {
        let body = crate::upstream::testutil::failing_body(&format!("{A}\n{{\"ty"));
        let mut w = WatchStream::from_body(body);
        assert!(w.next().await.unwrap().is_some());
        let e = w.next().await.unwrap_err();
        assert!(matches!(e, UpstreamError::Transport(_)), "{e}");
    }

    #[test]
    fn watch_query_shape() {
        assert_eq!(
            watch_query(Rv(11), 290),
            "watch=true&allowWatchBookmarks=true&resourceVersion=11&timeoutSeconds=290"
        );
    }
}
