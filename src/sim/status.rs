//! Write-path failures the crate's `Error` has no variant for yet (409 AlreadyExists / Conflict,
//! 422 on an object, 405, 415), rendered by adjusting the `Status` that `Error::to_status`
//! produces — so `crate::error` stays the one renderer.
//!
//! TODO(lead): move these variants into `crate::error::Error`; then `Failure` collapses to
//! `Error`. Until then the direct write API (`Sim::create` …) reports them as
//! `Error::BadRequest(<the apiserver message>)`.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

use super::http::{error_response, full, Body};
use crate::error::Error;
use crate::resource::{go_quote, ResourceKind};

/// A failed request of the simulated apiserver.
#[derive(Debug)]
pub enum Failure {
    Api(Error),
    AlreadyExists {
        kind: Box<ResourceKind>,
        name: String,
    },
    Conflict {
        kind: Box<ResourceKind>,
        name: String,
    },
    /// 422 on an object: `(cause reason, cause message, field)`.
    Invalid {
        kind: Box<ResourceKind>,
        name: String,
        causes: Vec<(&'static str, String, String)>,
    },
    MethodNotAllowed,
    UnsupportedMediaType,
    /// A Status already rendered (by `Error::to_status`, then adjusted).
    Raw(StatusCode, Bytes),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::Api(e)
    }
}

impl Failure {
    fn code_reason_message_details(&self) -> (u16, &'static str, String, Value) {
        match self {
            Failure::Api(_) | Failure::Raw(..) => (500, "", String::new(), Value::Null),
            Failure::AlreadyExists { kind, name } => (
                409,
                "AlreadyExists",
                format!("{} {} already exists", kind.group_resource(), go_quote(name)),
                details(kind, name),
            ),
            Failure::Conflict { kind, name } => (
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {}: the object has been modified; please apply your changes to the latest version and try again",
                    kind.group_resource(),
                    go_quote(name)
                ),
                details(kind, name),
            ),
            Failure::Invalid { kind, name, causes } => {
                let texts: Vec<String> = causes.iter().map(|(_, m, f)| format!("{f}: {m}")).collect();
                let joined =
                    if texts.len() == 1 { texts[0].clone() } else { format!("[{}]", texts.join(", ")) };
                let mut d = json!({"name": name, "kind": kind.kind});
                if !kind.group.is_empty() {
                    d["group"] = json!(kind.group);
                }
                d["causes"] = causes
                    .iter()
                    .map(|(r, m, f)| json!({"reason": r, "message": m, "field": f}))
                    .collect::<Vec<_>>()
                    .into();
                (422, "Invalid", format!("{} {} is invalid: {joined}", kind.kind, go_quote(name)), d)
            }
            Failure::MethodNotAllowed => (
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource".into(),
                json!({}),
            ),
            Failure::UnsupportedMediaType => (
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json".into(),
                json!({}),
            ),
        }
    }

    pub fn into_response(self) -> Response<Body> {
        match self {
            Failure::Api(e) => return error_response(e),
            Failure::Raw(code, body) => {
                let mut resp = Response::new(full(body));
                *resp.status_mut() = code;
                resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                return resp;
            }
            _ => {}
        }
        let (code, reason, message, details) = self.code_reason_message_details();
        let st = Error::BadRequest(message).to_status();
        let mut v: Value = serde_json::from_slice(&st.body).unwrap_or_else(|_| json!({}));
        v["code"] = json!(code);
        v["reason"] = json!(reason);
        let details = if details.is_null() { None } else { Some(details) };
        let body = render_ordered(&v, details);
        let mut resp = Response::new(full(Bytes::from(body)));
        *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        resp
    }
}

fn details(kind: &ResourceKind, name: &str) -> Value {
    let mut d = json!({"name": name});
    if !kind.group.is_empty() {
        d["group"] = json!(kind.group);
    }
    d["kind"] = json!(kind.resource);
    d
}

/// Writes the Status members in the apiserver's order (serde_json maps are sorted).
fn render_ordered(v: &Value, details: Option<Value>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(
        b"{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\"",
    );
    for key in ["message", "reason"] {
        out.extend_from_slice(format!(",\"{key}\":").as_bytes());
        let _ = serde_json::to_writer(&mut out, &v[key]);
    }
    if let Some(d) = details {
        out.extend_from_slice(b",\"details\":");
        write_details(&mut out, &d);
    }
    out.extend_from_slice(format!(",\"code\":{}}}", v["code"]).as_bytes());
    out
}

fn write_details(out: &mut Vec<u8>, d: &Value) {
    out.push(b'{');
    let mut first = true;
    for key in ["name", "group", "kind", "causes"] {
        if let Some(x) = d.get(key) {
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(format!("\"{key}\":").as_bytes());
            let _ = serde_json::to_writer(&mut *out, x);
        }
    }
    out.push(b'}');
}

impl From<Failure> for Error {
    fn from(f: Failure) -> Error {
        match f {
            Failure::Api(e) => e,
            Failure::Raw(code, body) => {
                let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                let m = v["message"].as_str().unwrap_or("").to_owned();
                if code == StatusCode::GONE {
                    Error::Expired(m)
                } else {
                    Error::BadRequest(m)
                }
            }
            other => Error::BadRequest(other.code_reason_message_details().2),
        }
    }
}
