//! The `Status` answers of authentication and authorization, in the apiserver's exact shapes:
//! 401 `Unauthorized` and 403 `Forbidden` (`responsewriters.Forbidden` + `apierrors.NewForbidden`).
//!
//! The texts are built here; `crate::error::Error` renders them. Called by `auth` (and so by
//! `phase::authenticate`, `phase::authorize`).

use http::{HeaderValue, Response};

use super::authz::Attributes;
use crate::error::Error;
use crate::server::body::{self, Body};

/// 401 for missing or invalid credentials.
pub fn unauthorized() -> Response<Body> {
    body::error(Error::Unauthorized)
}

/// Why a caller's X.509 v1 client certificate is refused (kube-apiserver accepts them; rustls
/// does not verify them).
pub const V1_CERTIFICATE: &str = "Unauthorized: the client certificate is X.509 version 1, which kube-watchcache does not accept; issue a version 3 certificate with extendedKeyUsage clientAuth";

/// 401 with the apiserver's shape and a message saying why.
pub fn unauthorized_with(message: &str) -> Response<Body> {
    body::error(Error::UnauthorizedWith(message.to_owned()))
}

/// `forbiddenMessage` of the apiserver (k8s.io/apiserver endpoints/handlers/responsewriters).
pub fn forbidden_message(user: &str, a: &Attributes) -> String {
    let msg = match &a.path {
        Some(path) => format!("User {} cannot {} path {}", q(user), a.verb, q(path)),
        None => {
            let resource = match a.subresource.as_str() {
                "" => a.resource.clone(),
                sub => format!("{}/{sub}", a.resource),
            };
            if a.namespace.is_empty() {
                format!(
                    "User {} cannot {} resource {} in API group {} at the cluster scope",
                    q(user),
                    a.verb,
                    q(&resource),
                    q(&a.group)
                )
            } else {
                format!(
                    "User {} cannot {} resource {} in API group {} in the namespace {}",
                    q(user),
                    a.verb,
                    q(&resource),
                    q(&a.group),
                    q(&a.namespace)
                )
            }
        }
    };
    // The apiserver's sanitizer: nothing that looks like HTML.
    msg.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// 403 with `apierrors.NewForbidden(groupResource, name, forbiddenMessage[: reason])`.
pub fn forbidden(user: &str, a: &Attributes, reason: &str) -> Response<Body> {
    let mut err = forbidden_message(user, a);
    if !reason.is_empty() {
        err = format!("{err}: {reason}");
    }
    let gr = if a.group.is_empty() { a.resource.clone() } else { format!("{}.{}", a.resource, a.group) };
    let message = if gr.is_empty() {
        format!("forbidden: {err}")
    } else if a.name.is_empty() {
        format!("{gr} is forbidden: {err}")
    } else {
        format!("{gr} {} is forbidden: {err}", q(&a.name))
    };
    let mut resp = body::error(Error::Forbidden {
        message,
        name: a.name.clone(),
        group: a.group.clone(),
        kind: a.resource.clone(),
    });
    resp.headers_mut().insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    resp
}

/// Go's `%q` for the strings that appear here (user names, resources, namespaces, paths).
fn q(s: &str) -> String {
    crate::resource::go_quote(s)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn attrs(verb: &str, group: &str, resource: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            namespace: ns.into(),
            name: name.into(),
            ..Attributes::default()
        }
    }

    fn message(r: Response<Body>) -> Value {
        let b = futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(r.into_body()))
            .unwrap()
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&b).unwrap()
    }

    #[test]
    fn forbidden_texts_match_the_apiserver() {
        let v = message(forbidden("dev-user", &attrs("list", "", "pods", "ns", ""), ""));
        assert_eq!(
            v["message"],
            r#"pods is forbidden: User "dev-user" cannot list resource "pods" in API group "" in the namespace "ns""#
        );
        assert_eq!(v["details"], json!({"kind":"pods"}));
        assert_eq!(v["reason"], "Forbidden");
        let v = message(forbidden("dev", &attrs("watch", "apps", "deployments", "", ""), ""));
        assert_eq!(
            v["message"],
            r#"deployments.apps is forbidden: User "dev" cannot watch resource "deployments" in API group "apps" at the cluster scope"#
        );
        let v = message(forbidden("dev", &attrs("get", "", "configmaps", "ns", "cm1"), "no rule"));
        assert_eq!(
            v["message"],
            r#"configmaps "cm1" is forbidden: User "dev" cannot get resource "configmaps" in API group "" in the namespace "ns": no rule"#
        );
        assert_eq!(v["details"], json!({"name":"cm1","kind":"configmaps"}));
        let metrics =
            Attributes { verb: "get".into(), path: Some("/metrics".into()), ..Attributes::default() };
        let v = message(forbidden("system:anonymous", &metrics, ""));
        assert_eq!(v["message"], r#"forbidden: User "system:anonymous" cannot get path "/metrics""#);
        assert_eq!(v["details"], json!({}));
    }

    #[test]
    fn bodies_keep_the_apiserver_member_order() {
        let b = futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(
            unauthorized().into_body(),
        ))
        .unwrap()
        .unwrap()
        .to_bytes();
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            // With the encoder's newline, as recorded (`v1.28.7-raw/pretty.json`, "401 Status").
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"Unauthorized\",\"reason\":\"Unauthorized\",\"code\":401}\n"
        );
    }

    #[test]
    fn unauthorized_body() {
        let r = unauthorized();
        assert_eq!(r.status(), 401);
        let v = message(r);
        assert_eq!(
            v,
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401})
        );
    }
}
