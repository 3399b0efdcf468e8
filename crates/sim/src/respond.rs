//! What every handler of the simulated apiserver answers with: the body type and its builders,
//! `Error` rendering, JSON responses, content negotiation and request-body reading. Used by
//! `http` (the front) and the handlers it dispatches to (`discovery`, `read`, `watch`,
//! `write`, `subresource`, `review`), none of which uses `http`.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};

use kube_watchcache::error::Error;
pub use kube_watchcache::server::classify::autoneg::{self, ErrorEncoding};

/// Every response body of the sim.
pub type Body = BoxBody<Bytes, Infallible>;

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

/// A body that streams what is sent on `rx` (watches, followed logs) and ends when the
/// sender is dropped.
pub fn channel_body(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Body {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    BodyExt::boxed(StreamBody::new(stream))
}

/// A body made of ready chunks (list responses: no copy of the stored bytes).
pub fn chunks_body(chunks: Vec<Bytes>) -> Body {
    let stream = futures_util::stream::iter(chunks.into_iter().map(|b| Ok::<_, Infallible>(Frame::data(b))));
    BodyExt::boxed(StreamBody::new(stream))
}

/// `resp` indented as the apiserver indents JSON for people (`?pretty=true`, a `curl` user
/// agent: `server::indent`), if it is JSON; protobuf stays as it is.
pub async fn indented(resp: Response<Body>) -> Response<Body> {
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if !json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(compact) = body.collect().await.map(|c| c.to_bytes());
    let pretty = kube_watchcache::server::indent::indent(&compact);
    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(pretty.len()));
    Response::from_parts(parts, full(pretty))
}

/// An `Error` rendered by the crate's one renderer, with the sim's body type.
pub fn error_response(e: Error) -> Response<Body> {
    e.into_response::<Full<Bytes>>().map(BodyExt::boxed)
}

pub fn json(status: StatusCode, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// What the client accepts, among what the sim can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    Json,
    Table,
    /// `as=PartialObjectMetadata;g=meta.k8s.io;v=v1`: metadata only, one object (GET).
    Metadata,
    /// `as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`: metadata only, a list (LIST).
    MetadataList,
    /// `application/vnd.kubernetes.protobuf` (built-in kinds).
    Protobuf,
    /// Protobuf, `as=PartialObjectMetadata` (any kind).
    ProtoMetadata,
    /// Protobuf, `as=PartialObjectMetadataList` (any kind).
    ProtoMetadataList,
}

impl Accept {
    /// The apiserver's `asPartialObjectMetadata[List]` refusal when the representation does
    /// not fit the answer (recorded in `v1.28.7-raw/metadata-only.json`, `edges`): `go_type` is
    /// the internal type, e.g. `*core.ConfigMapList`.
    pub fn check_form(
        self,
        is_list: bool,
        kind: &kube_watchcache::resource::ResourceKind,
    ) -> Result<(), Error> {
        let package = match kind.group.split('.').next() {
            _ if !kind.builtin => "unstructured",
            Some("") | None => "core",
            Some(p) => p,
        };
        let name = if kind.builtin { kind.kind.as_str() } else { "Unstructured" };
        let go_type = |list: bool| format!("*{package}.{name}{}", if list { "List" } else { "" });
        match (self, is_list) {
            (Accept::Metadata | Accept::ProtoMetadata, true) => Err(Error::TransformNotAcceptable(format!(
                "you requested PartialObjectMetadata, but the requested object is a list ({})",
                go_type(true)
            ))),
            // A custom resource's object is unstructured: the apiserver's transform finds it is
            // not a list only when it converts it (recorded 500, no reason).
            (Accept::MetadataList | Accept::ProtoMetadataList, false) if !kind.builtin => {
                Err(Error::InternalRaw("content is not a list".into()))
            }
            (Accept::MetadataList | Accept::ProtoMetadataList, false) => {
                Err(Error::TransformNotAcceptable(format!(
                    "you requested PartialObjectMetadataList, but the requested object is not a list ({})",
                    go_type(false)
                )))
            }
            _ => Ok(()),
        }
    }
}

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Content negotiation: the most preferred clause the sim can produce — JSON, a Table, metadata
/// only, or protobuf (whole objects of built-in kinds, metadata of any; recorded in
/// `v1.28.7-raw/protobuf.json`) — else 406 with the apiserver's texts (accept-unsupported.json,
/// crd-accept-protobuf.json). The clauses are goautoneg's, in its order (`autoneg`); a clause
/// is taken or skipped as the apiserver's `acceptMediaTypeOptions` and the resource scope's
/// `AllowsMediaTypeTransform` do (a `g`/`v` without `as` is no transform it knows; a stream
/// other than `watch`, a server version but `v1`, skip the clause).
/// `get`: a GET of one object, whose 406 names no stream type (recorded).
pub fn negotiate(headers: &http::HeaderMap, builtin: bool, get: bool) -> Result<Accept, Error> {
    let Some(raw) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty())
    else {
        return Ok(Accept::Json);
    };
    let mut saw_unknown_as = false;
    for c in autoneg::parse(raw).clauses {
        let proto = c.ty == "application" && c.sub == "vnd.kubernetes.protobuf";
        if !proto && !c.matches("json") {
            continue;
        }
        // `application/*` alone: a built-in kind's serializers match none of it (recorded 406);
        // a custom resource's JSON does (recorded 200).
        if c.ty == "application" && c.sub == "*" && builtin {
            continue;
        }
        let set = |name| c.param(name).is_some_and(|v| !v.is_empty());
        // A resource scope allows its meta group's version as the server version (`v1`).
        if (set("stream") && c.param("stream") != Some("watch")) || (set("sv") && c.param("sv") != Some("v1"))
        {
            continue;
        }
        let (g, v) = (c.param("g"), c.param("v"));
        let meta_v1 = g == Some("meta.k8s.io") && v == Some("v1");
        match c.param("as") {
            None if g.is_some() || v.is_some() => continue,
            None if proto && !builtin => continue,
            None if proto => return Ok(Accept::Protobuf),
            None => return Ok(Accept::Json),
            Some("Table") if !proto && meta_v1 => return Ok(Accept::Table),
            Some(form @ ("PartialObjectMetadata" | "PartialObjectMetadataList")) if meta_v1 => {
                return Ok(match (form == "PartialObjectMetadata", proto) {
                    (true, false) => Accept::Metadata,
                    (false, false) => Accept::MetadataList,
                    (true, true) => Accept::ProtoMetadata,
                    (false, true) => Accept::ProtoMetadataList,
                });
            }
            Some(_) => saw_unknown_as = true,
        }
    }
    if saw_unknown_as || !builtin {
        // A custom resource's serializers name protobuf too (recorded), though its objects
        // cannot be written in it.
        let types = "application/json, application/yaml, application/vnd.kubernetes.protobuf";
        return Err(Error::MediaTypesNotAccepted(types.into()));
    }
    let streams = if get {
        ""
    } else {
        ", application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch"
    };
    Err(Error::NotAcceptable(format!(
        "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf{streams}"
    )))
}

/// How a refusal's `Status` is written: the apiserver's `ErrorNegotiated` (`autoneg`) — by the
/// first clause without a transform, protobuf or JSON, else raw indented JSON without a
/// newline (`WriteRawJSON`; recorded in v1.28.7-raw/protobuf.json). The sim writes no YAML: a
/// YAML error is JSON here.
pub fn error_encoding(headers: &http::HeaderMap) -> ErrorEncoding {
    let raw = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    match autoneg::error_encoding(raw) {
        ErrorEncoding::Yaml => ErrorEncoding::Json,
        how => how,
    }
}

/// An `Error` as a Status written the `how` way (JSON if protobuf cannot encode it).
pub fn error_response_as(e: Error, how: ErrorEncoding) -> Response<Body> {
    if how == ErrorEncoding::RawJson {
        let compact = e.to_status().body;
        let (mut parts, _) = e.into_response::<Bytes>().into_parts();
        let pretty = kube_watchcache::server::indent::indent(&compact);
        let raw = Bytes::copy_from_slice(pretty.strip_suffix(b"\n").unwrap_or(&pretty));
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, full(raw));
    }
    if how != ErrorEncoding::Protobuf {
        return error_response(e);
    }
    let (mut parts, json) = e.into_response::<Bytes>().into_parts();
    match kube_watchcache::proto::encode_status(&json) {
        Ok(pb) => {
            parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
            Response::from_parts(parts, full(pb))
        }
        Err(_) => Response::from_parts(parts, full(json)),
    }
}

/// A protobuf response (objects and lists; watches say `;stream=watch`).
pub fn protobuf(status: StatusCode, body: Body, watch: bool) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let ct =
        if watch { kube_watchcache::proto::WATCH_CONTENT_TYPE } else { kube_watchcache::proto::CONTENT_TYPE };
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    resp
}

/// The apiserver's request body limit (`MaxRequestBodyBytes`, 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Reads a request body: past [`MAX_BODY_BYTES`] the apiserver's 413 (`limitedReadBody`).
pub async fn body_bytes(req: Request<Incoming>) -> Result<Bytes, Error> {
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY_BYTES);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(Error::RequestEntityTooLarge(format!("limit is {MAX_BODY_BYTES}")))
        }
        Err(e) => Err(Error::BadRequest(format!("unable to read request body: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: &str) -> http::HeaderMap {
        let mut m = http::HeaderMap::new();
        m.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        m
    }

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(&http::HeaderMap::new(), true, false).unwrap(), Accept::Json);
        assert_eq!(
            negotiate(&h("application/vnd.kubernetes.protobuf, */*"), true, false).unwrap(),
            Accept::Protobuf
        );
        // Recorded: protobuf-first custom resources get JSON; q orders the clauses.
        assert_eq!(
            negotiate(&h("application/vnd.kubernetes.protobuf, */*"), false, false).unwrap(),
            Accept::Json
        );
        assert_eq!(
            negotiate(&h("application/vnd.kubernetes.protobuf;q=0.5, application/json"), true, false)
                .unwrap(),
            Accept::Json
        );
        assert_eq!(
            negotiate(&h("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"), false, false)
                .unwrap(),
            Accept::ProtoMetadataList
        );
        assert_eq!(
            error_encoding(&h("application/vnd.kubernetes.protobuf, application/json")),
            ErrorEncoding::Protobuf
        );
        assert_eq!(
            error_encoding(&h(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
            )),
            ErrorEncoding::Json
        );
        // Only transforms: raw JSON, indented, no newline (WriteRawJSON).
        let only = h("application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1");
        assert_eq!(error_encoding(&only), ErrorEncoding::RawJson);
        assert_eq!(error_encoding(&http::HeaderMap::new()), ErrorEncoding::Json);
        assert_eq!(
            negotiate(&h("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"), true, false)
                .unwrap(),
            Accept::Table
        );
        assert_eq!(
            negotiate(&h("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"), true, false)
                .unwrap(),
            Accept::MetadataList
        );
        assert!(negotiate(
            &h("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v2"),
            true,
            false
        )
        .is_err());
        assert!(negotiate(&h("application/vnd.kubernetes.protobuf"), false, false).is_err());
        assert!(negotiate(&h("text/html"), true, false).is_err());
        // `application/*` alone (v1.28.7-raw/protobuf.json, negotiation 7, 20, 46, 59): a
        // built-in kind's 406, whose GET names no stream type; a custom resource's JSON.
        let msg = |get| match negotiate(&h("application/*"), true, get) {
            Err(Error::NotAcceptable(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(msg(false), "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch");
        assert_eq!(msg(true), "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf");
        assert_eq!(negotiate(&h("application/*"), false, true).unwrap(), Accept::Json);
        // goautoneg's order and exact names (`autoneg`): a concrete type before a wildcard
        // whatever q; nothing lowercased; `g`/`v` without `as` and other streams skipped.
        assert_eq!(
            negotiate(&h("*/*, application/vnd.kubernetes.protobuf;q=0.5"), true, false).unwrap(),
            Accept::Protobuf
        );
        assert!(negotiate(&h("Application/JSON"), true, false).is_err());
        assert_eq!(
            negotiate(
                &h("application/vnd.kubernetes.protobuf;g=meta.k8s.io;v=v1, application/json"),
                true,
                false
            )
            .unwrap(),
            Accept::Json
        );
        assert_eq!(
            negotiate(&h("application/vnd.kubernetes.protobuf;stream=x, application/json"), true, false)
                .unwrap(),
            Accept::Json
        );
        assert_eq!(negotiate(&h("application/json;q=0"), true, false).unwrap(), Accept::Json);
    }
}
