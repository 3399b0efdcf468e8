//! The crate's error type and the ONE place that turns an error into the apiserver's
//! `Status` JSON and HTTP status code.
//!
//! Every module returns `Error`; `server` calls `Error::to_status` (or `into_response`) when a
//! request fails, and `server::serve` uses the same JSON inside watch ERROR events. Messages are
//! the apiserver's texts, byte for byte (docs/apiserver-watch-cache.md §1.3, §1.4, §2.3–2.5, §8.2).

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use crate::resource::{go_quote, ResourceKind, Rv};

/// One cause of a 422 `Invalid` (a `field.Error`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueForbidden`, `FieldValueNotSupported`, `FieldValueInvalid`, …
    pub reason: &'static str,
    /// `Forbidden: …` / `Unsupported value: …`
    pub message: String,
    pub field: String,
}

impl Cause {
    pub fn forbidden(field: &str, detail: &str) -> Cause {
        Cause { reason: "FieldValueForbidden", message: format!("Forbidden: {detail}"), field: field.into() }
    }

    /// `FieldValueRequired` (`Required value: …`), e.g. a create without name or generateName.
    pub fn required(field: &str, detail: &str) -> Cause {
        Cause {
            reason: "FieldValueRequired",
            message: format!("Required value: {detail}"),
            field: field.into(),
        }
    }

    pub fn not_supported(field: &str, value: &str, supported: &[&str]) -> Cause {
        let list: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
        Cause {
            reason: "FieldValueNotSupported",
            message: format!("Unsupported value: {}: supported values: {}", go_quote(value), list.join(", ")),
            field: field.into(),
        }
    }
}

/// Everything that can go wrong while classifying, serving or forwarding a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 422 on ListOptions validation (docs/apiserver-watch-cache.md §1.3).
    #[error("ListOptions invalid: {causes:?}")]
    InvalidListOptions { causes: Vec<Cause> },
    /// 400 BadRequest with an apiserver text (field labels, continue tokens, selectors …).
    #[error("{0}")]
    BadRequest(String),
    /// 401 for missing or invalid credentials.
    #[error("Unauthorized")]
    Unauthorized,
    /// 401 with a message saying why (a caller's X.509 v1 certificate).
    #[error("{0}")]
    UnauthorizedWith(String),
    /// 504 of the apiserver's timeout filter for a request past `--request-timeout`.
    #[error("Timeout: request did not complete within the allotted timeout")]
    Timeout,
    /// 403 with the apiserver's full message (`pods is forbidden: User …`) and details.
    #[error("{message}")]
    Forbidden { message: String, name: String, group: String, kind: String },
    /// 404 for a missing object.
    #[error("{} {} not found", .resource, .name)]
    NotFound { resource: String, group: String, name: String },
    /// 404 `the server could not find the requested resource`.
    #[error("the server could not find the requested resource")]
    NoSuchResource,
    /// 410 `too old resource version: N (M)` (watch ERROR event form).
    #[error("too old resource version: {requested} ({oldest})")]
    TooOldResourceVersion { requested: Rv, oldest: Rv },
    /// 410 Expired with a literal message (e.g. list too old).
    #[error("{0}")]
    Expired(String),
    /// 410 Expired for a continue token whose revision was compacted; `continue_token` (rv −1,
    /// same start) goes into the Status `metadata.continue` (compaction-continue-expired).
    #[error("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")]
    ExpiredContinue { continue_token: String },
    /// 409 on create: `configmaps "x" already exists`.
    #[error("{} {} already exists", group_resource(.resource, .group), go_quote(.name))]
    AlreadyExists { resource: String, group: String, name: String },
    /// 409 on update with a stale `metadata.resourceVersion`.
    #[error("Operation cannot be fulfilled on {} {}: the object has been modified; please apply your changes to the latest version and try again", group_resource(.resource, .group), go_quote(.name))]
    Conflict { resource: String, group: String, name: String },
    /// 422 on an object (`ConfigMap "x" is invalid: …`); `kind` is the Kind (`ConfigMap`).
    #[error("{} {} is invalid: {}", .kind, go_quote(.name), join_causes(.causes))]
    Invalid { kind: String, group: String, name: String, causes: Vec<Cause> },
    /// 413 `Request entity too large: …`: a body past the apiserver's 3 MiB, a JSON patch of
    /// more operations than it applies (`NewRequestEntityTooLargeError`, no details).
    #[error("Request entity too large: {0}")]
    RequestEntityTooLarge(String),
    /// 422 `Invalid`, `details: {}`, and `NewGenericServerResponse`'s fixed text (it drops the
    /// server's own message): a JSON patch that does not apply.
    #[error("the server rejected our request due to an error in our request")]
    Unprocessable,
    /// 405 for a verb the resource does not serve.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// 415 for a PATCH of a custom resource with a content type that is not one of its patch
    /// types (`NewUnsupportedMediaTypeError`: named, no details).
    #[error("the body of the request was in an unknown format - accepted media types include: {0}")]
    UnsupportedMediaType(String),
    /// 415 for a request with a body whose content type a built-in kind's route does not
    /// consume: go-restful's own text, through `NewGenericServerResponse` (`details: {}`).
    #[error("415: Unsupported Media Type")]
    UnsupportedMediaTypeRoute,
    /// 504 `Timeout: Too large resource version: N, current: C`, with `Retry-After: 1` from a
    /// watch cache (`retry_after` 1); from etcd (`retry_after` 0: the apiserver's storage,
    /// a kind it does not cache, events) without it (recorded: events-not-cached.json).
    #[error("Timeout: Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: Rv, current: Rv, retry_after: u32 },
    /// 429 while a resource's cache is (re)initializing.
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: u32 },
    /// 500 with no reason: the cacher's raw storage errors (non-numeric RV on GET/WATCH).
    #[error("{0}")]
    InternalRaw(String),
    /// 500 InternalError.
    #[error("Internal error occurred: {0}")]
    Internal(String),
    /// 503 when the upstream cannot be reached.
    #[error("{0}")]
    ServiceUnavailable(String),
    /// 406 NotAcceptable from content negotiation (`406: Not Acceptable\n\nAvailable
    /// representations: …`), rendered with `"details":{}` like the apiserver.
    #[error("{0}")]
    NotAcceptable(String),
    /// 406 NotAcceptable from the serializer (`only the following media types are accepted:
    /// …`), rendered without `details` (accept-unsupported.json, step 2).
    #[error("only the following media types are accepted: {0}")]
    MediaTypesNotAccepted(String),
    /// 406 NotAcceptable from the response transform (`you requested PartialObjectMetadata,
    /// but the requested object is a list (*core.ConfigMapList)`), without `details`.
    #[error("{0}")]
    TransformNotAcceptable(String),
    /// An object asked for in protobuf has no exact protobuf encoding: never sent to a client,
    /// the request goes upstream instead (`server::serve`).
    #[error("no exact protobuf encoding")]
    NoExactEncoding,
    /// The cache cannot hold the upstream's state (an object it cannot parse,
    /// `cache::unparsable`): never sent to a client, the request goes upstream instead
    /// (`server::serve`).
    #[error("the cache cannot parse an object of this resource")]
    Unparsable,
    /// The cache was found wrong and a relist is pending (`cache::relist`): never sent to a
    /// client; `server::serve` answers as for a cache that is not ready.
    #[error("the cache is relisting")]
    Relisting,
}

/// `configmaps` or `widgets.example.com`.
fn group_resource(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// `field: message`, or `[a: x, b: y]` for several causes (Go's `ErrorList.ToAggregate`).
fn join_causes(causes: &[Cause]) -> String {
    let fields: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
    if fields.len() == 1 {
        fields[0].clone()
    } else {
        format!("[{}]", fields.join(", "))
    }
}

fn cause_json(causes: &[Cause]) -> Vec<CauseJson<'_>> {
    causes.iter().map(|c| CauseJson { reason: c.reason, message: &c.message, field: &c.field }).collect()
}

#[derive(Serialize)]
struct StatusJson<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: Meta<'a>,
    status: &'static str,
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details<'a>>,
    code: u16,
}

/// The Status `metadata`: empty but for the expired-continue Status.
#[derive(Serialize, Default)]
struct Meta<'a> {
    #[serde(rename = "continue", skip_serializing_if = "str::is_empty")]
    continue_token: &'a str,
}

#[derive(Serialize, Default)]
struct Details<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    group: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    kind: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    causes: Vec<CauseJson<'a>>,
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "is_zero")]
    retry_after_seconds: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct CauseJson<'a> {
    reason: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    field: &'a str,
}

/// An error rendered as the apiserver renders it.
pub struct Status {
    pub code: StatusCode,
    /// `Retry-After` header value, when the apiserver sends one.
    pub retry_after: Option<u32>,
    /// The `Status` object JSON (no trailing newline).
    pub body: Bytes,
}

impl Error {
    pub fn not_found(kind: &ResourceKind, name: &str) -> Error {
        Error::NotFound { resource: kind.resource.clone(), group: kind.group.clone(), name: name.into() }
    }

    /// The apiserver's `Status` for this error.
    pub fn to_status(&self) -> Status {
        let msg = self.to_string();
        let (code, reason, details, retry_after): (u16, &str, Option<Details>, Option<u32>) = match self {
            Error::InvalidListOptions { causes } => {
                let message = format!("ListOptions.meta.k8s.io \"\" is invalid: {}", join_causes(causes));
                let details = Details {
                    group: "meta.k8s.io",
                    kind: "ListOptions",
                    causes: cause_json(causes),
                    ..Default::default()
                };
                return render(422, "Invalid", &message, Some(details), None);
            }
            Error::Invalid { kind, group, name, causes } => (
                422,
                "Invalid",
                Some(Details { name, group, kind, causes: cause_json(causes), ..Default::default() }),
                None,
            ),
            Error::AlreadyExists { resource, group, name } => (
                409,
                "AlreadyExists",
                Some(Details { name, group, kind: resource, ..Default::default() }),
                None,
            ),
            Error::Conflict { resource, group, name } => {
                (409, "Conflict", Some(Details { name, group, kind: resource, ..Default::default() }), None)
            }
            Error::MethodNotAllowed => (405, "MethodNotAllowed", Some(Details::default()), None),
            Error::UnsupportedMediaType(_) => (415, "UnsupportedMediaType", None, None),
            Error::UnsupportedMediaTypeRoute => (415, "UnsupportedMediaType", Some(Details::default()), None),
            Error::ExpiredContinue { continue_token } => {
                return render_with_meta(410, "Expired", &msg, None, None, Meta { continue_token });
            }
            Error::BadRequest(_) => (400, "BadRequest", None, None),
            Error::RequestEntityTooLarge(_) => (413, "RequestEntityTooLarge", None, None),
            Error::Unprocessable => (422, "Invalid", Some(Details::default()), None),
            Error::Unauthorized | Error::UnauthorizedWith(_) => (401, "Unauthorized", None, None),
            Error::Timeout => (504, "Timeout", Some(Details::default()), None),
            Error::Forbidden { name, group, kind, .. } => {
                (403, "Forbidden", Some(Details { name, group, kind, ..Default::default() }), None)
            }
            Error::NotFound { resource, group, name } => {
                let gr = if group.is_empty() { resource.clone() } else { format!("{resource}.{group}") };
                let message = format!("{gr} {} not found", go_quote(name));
                let details = Details { name, group, kind: resource, ..Default::default() };
                return render(404, "NotFound", &message, Some(details), None);
            }
            Error::NoSuchResource => (404, "NotFound", Some(Details::default()), None),
            Error::TooOldResourceVersion { .. } | Error::Expired(_) => (410, "Expired", None, None),
            Error::TooLargeResourceVersion { retry_after, .. } => (
                504,
                "Timeout",
                Some(Details {
                    causes: vec![CauseJson {
                        reason: "ResourceVersionTooLarge",
                        message: "Too large resource version",
                        field: "",
                    }],
                    retry_after_seconds: *retry_after,
                    ..Default::default()
                }),
                (*retry_after > 0).then_some(*retry_after),
            ),
            Error::TooManyRequests { retry_after, .. } => (
                429,
                "TooManyRequests",
                Some(Details { retry_after_seconds: *retry_after, ..Default::default() }),
                Some(*retry_after),
            ),
            Error::InternalRaw(_) => (500, "", None, None),
            Error::Internal(_) => (500, "InternalError", None, None),
            Error::ServiceUnavailable(_) | Error::Unparsable | Error::Relisting => {
                (503, "ServiceUnavailable", None, None)
            }
            Error::NotAcceptable(_) => (406, "NotAcceptable", Some(Details::default()), None),
            Error::MediaTypesNotAccepted(_) | Error::TransformNotAcceptable(_) | Error::NoExactEncoding => {
                (406, "NotAcceptable", None, None)
            }
        };
        render(code, reason, &msg, details, retry_after)
    }

    /// A full HTTP response carrying this error's `Status`.
    pub fn into_response<B>(self) -> http::Response<B>
    where
        B: From<Bytes>,
    {
        self.response()
    }

    /// [`Error::into_response`] of a borrowed error.
    pub fn response<B>(&self) -> http::Response<B>
    where
        B: From<Bytes>,
    {
        let st = self.to_status();
        // As the apiserver's `json.Encoder` writes it: the Status and a newline (an ERROR
        // event's object, `to_status`, has none).
        let mut body = Vec::with_capacity(st.body.len() + 1);
        body.extend_from_slice(&st.body);
        body.push(b'\n');
        let mut resp = http::Response::new(B::from(Bytes::from(body)));
        *resp.status_mut() = st.code;
        let h = resp.headers_mut();
        h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        h.insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-cache, private"));
        if let Some(ra) = st.retry_after {
            h.insert(http::header::RETRY_AFTER, http::HeaderValue::from(ra));
        }
        resp
    }
}

fn render(
    code: u16,
    reason: &str,
    message: &str,
    details: Option<Details>,
    retry_after: Option<u32>,
) -> Status {
    render_with_meta(code, reason, message, details, retry_after, Meta::default())
}

fn render_with_meta(
    code: u16,
    reason: &str,
    message: &str,
    details: Option<Details>,
    retry_after: Option<u32>,
    metadata: Meta,
) -> Status {
    let json = StatusJson {
        kind: "Status",
        api_version: "v1",
        metadata,
        status: "Failure",
        message,
        reason,
        details,
        code,
    };
    let body = serde_json::to_vec(&json).unwrap_or_default();
    Status {
        code: StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        retry_after,
        body: Bytes::from(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(e: &Error) -> serde_json::Value {
        serde_json::from_slice(&e.to_status().body).unwrap()
    }

    #[test]
    fn too_old_matches_reference() {
        let e = Error::TooOldResourceVersion { requested: Rv(999), oldest: Rv(1000) };
        assert_eq!(
            std::str::from_utf8(&e.to_status().body).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 999 (1000)","reason":"Expired","code":410}"#
        );
    }

    #[test]
    fn too_large_matches_reference() {
        let e = Error::TooLargeResourceVersion { requested: Rv(1500), current: Rv(1200), retry_after: 1 };
        let st = e.to_status();
        assert_eq!(st.code, 504);
        assert_eq!(st.retry_after, Some(1));
        assert_eq!(
            std::str::from_utf8(&st.body).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: Too large resource version: 1500, current: 1200","reason":"Timeout","details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}"#
        );
    }

    /// Issue 32 §1: the two Status bodies once built by hand, in the apiserver's field order.
    #[test]
    fn timeout_and_unauthorized_with_a_reason_in_the_apiservers_shape() {
        let st = Error::Timeout.to_status();
        assert_eq!(st.code, 504);
        assert_eq!(
            std::str::from_utf8(&st.body).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: request did not complete within the allotted timeout","reason":"Timeout","details":{},"code":504}"#
        );
        let st = Error::UnauthorizedWith("Unauthorized: why".into()).to_status();
        assert_eq!(
            std::str::from_utf8(&st.body).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized: why","reason":"Unauthorized","code":401}"#
        );
    }

    #[test]
    fn not_found_for_core_and_custom() {
        let pods = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let v = json(&Error::not_found(&pods, "nope"));
        assert_eq!(v["message"], r#"configmaps "nope" not found"#);
        assert_eq!(v["details"], serde_json::json!({"name":"nope","kind":"configmaps"}));
        let w = ResourceKind::new("capture.example.com", "v1", "widgets", "Widget", true, false);
        let v = json(&Error::not_found(&w, "nope"));
        assert_eq!(v["message"], r#"widgets.capture.example.com "nope" not found"#);
        assert_eq!(
            v["details"],
            serde_json::json!({"name":"nope","group":"capture.example.com","kind":"widgets"})
        );
    }

    #[test]
    fn invalid_with_two_causes() {
        let e = Error::InvalidListOptions {
            causes: vec![
                Cause::forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ),
                Cause::not_supported("resourceVersionMatch", "Exact", &["NotOlderThan"]),
            ],
        };
        let v = json(&e);
        assert_eq!(v["code"], 422);
        assert_eq!(
            v["message"],
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]"
        );
        assert_eq!(v["details"]["causes"].as_array().unwrap().len(), 2);
        assert_eq!(v["details"]["group"], "meta.k8s.io");
    }

    #[test]
    fn raw_internal_has_no_reason() {
        let v = json(&Error::InternalRaw("boom".into()));
        assert_eq!(v["code"], 500);
        assert!(v.get("reason").is_none());
    }

    #[test]
    fn initializing_sets_retry_after() {
        let e = Error::TooManyRequests { message: "storage is (re)initializing".into(), retry_after: 2 };
        let st = e.to_status();
        assert_eq!(st.retry_after, Some(2));
        assert_eq!(
            std::str::from_utf8(&st.body).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"storage is (re)initializing","reason":"TooManyRequests","details":{"retryAfterSeconds":2},"code":429}"#
        );
    }

    fn text(e: &Error) -> String {
        String::from_utf8(e.to_status().body.to_vec()).unwrap()
    }

    #[test]
    fn already_exists_and_conflict() {
        let e =
            Error::AlreadyExists { resource: "configmaps".into(), group: String::new(), name: "dup".into() };
        assert_eq!(e.to_status().code, 409);
        assert_eq!(
            text(&e),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"dup\" already exists","reason":"AlreadyExists","details":{"name":"dup","kind":"configmaps"},"code":409}"#
        );
        let e =
            Error::Conflict { resource: "widgets".into(), group: "example.com".into(), name: "w1".into() };
        assert_eq!(e.to_status().code, 409);
        assert_eq!(
            text(&e),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be fulfilled on widgets.example.com \"w1\": the object has been modified; please apply your changes to the latest version and try again","reason":"Conflict","details":{"name":"w1","group":"example.com","kind":"widgets"},"code":409}"#
        );
    }

    #[test]
    fn invalid_object() {
        let e = Error::Invalid {
            kind: "ConfigMap".into(),
            group: String::new(),
            name: String::new(),
            causes: vec![Cause::required("metadata.name", "name or generateName is required")],
        };
        assert_eq!(e.to_status().code, 422);
        assert_eq!(
            text(&e),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required","reason":"Invalid","details":{"kind":"ConfigMap","causes":[{"reason":"FieldValueRequired","message":"Required value: name or generateName is required","field":"metadata.name"}]},"code":422}"#
        );
    }

    #[test]
    fn method_and_media_type() {
        let st = Error::MethodNotAllowed.to_status();
        assert_eq!(st.code, 405);
        assert_eq!(
            std::str::from_utf8(&st.body).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server does not allow this method on the requested resource","reason":"MethodNotAllowed","details":{},"code":405}"#
        );
        let v = json(&Error::UnsupportedMediaType("application/json-patch+json".into()));
        assert_eq!(v["code"], 415);
        assert_eq!(v["reason"], "UnsupportedMediaType");
        assert!(v["message"]
            .as_str()
            .unwrap()
            .starts_with("the body of the request was in an unknown format"));
    }

    /// compaction-continue-expired.json, step 1.
    #[test]
    fn expired_continue_carries_the_new_token() {
        let e = Error::ExpiredContinue {
            continue_token: "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiYzFcdTAwMDAifQ".into(),
        };
        assert_eq!(e.to_status().code, 410);
        assert_eq!(
            text(&e),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{"continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiYzFcdTAwMDAifQ"},"status":"Failure","message":"The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.","reason":"Expired","code":410}"#
        );
    }

    /// accept-unsupported.json, steps 1 and 2.
    #[test]
    fn not_acceptable_bodies() {
        let e = Error::NotAcceptable("406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch".into());
        assert_eq!(
            text(&e),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch","reason":"NotAcceptable","details":{},"code":406}"#
        );
        let e = Error::MediaTypesNotAccepted(
            "application/json, application/yaml, application/vnd.kubernetes.protobuf".into(),
        );
        assert_eq!(
            text(&e),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf","reason":"NotAcceptable","code":406}"#
        );
    }
}
