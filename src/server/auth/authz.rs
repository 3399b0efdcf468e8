//! Authorization by SubjectAccessReview on the upstream (authorization.k8s.io/v1): the caller's
//! user, uid, groups and extra with the request's attributes. Decisions are cached (allowed ≈5
//! min, denied ≈30 s, bounded LRU) and identical concurrent checks share one review.
//!
//! Called by `auth::Auth::authorize` for every read served from the cache, `/metrics`, and the
//! `impersonate` checks.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use super::cache::{Lookup, TtlCache};
use super::selectors::{self, Requirement};
use super::user::UserInfo;
use crate::metrics::{Metrics, Review};
use crate::upstream::{Upstream, UpstreamError};

pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// What is asked: a resource request (`path: None`) or a non-resource URL (`path: Some`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub path: Option<String>,
    /// `resourceAttributes.fieldSelector` / `labelSelector` requirements (list, watch and
    /// deletecollection only; see `selectors`). Part of the decision cache's key.
    pub field_selector: Vec<Requirement>,
    pub label_selector: Vec<Requirement>,
}

/// The upstream's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// Cache lifetimes and size.
#[derive(Clone, Debug)]
pub struct AuthzOptions {
    pub allowed_ttl: Duration,
    pub denied_ttl: Duration,
    pub capacity: usize,
}

impl Default for AuthzOptions {
    fn default() -> Self {
        AuthzOptions {
            allowed_ttl: Duration::from_secs(300),
            denied_ttl: Duration::from_secs(30),
            capacity: 10_000,
        }
    }
}

/// See the module doc.
pub struct Authorizer {
    upstream: Upstream,
    metrics: Arc<Metrics>,
    opts: AuthzOptions,
    cache: TtlCache<(Arc<UserInfo>, Attributes), Decision>,
}

impl Authorizer {
    pub fn new(upstream: Upstream, opts: AuthzOptions, metrics: Arc<Metrics>) -> Authorizer {
        let cache = TtlCache::new(opts.capacity);
        Authorizer { upstream, metrics, opts, cache }
    }

    /// The (cached) decision for `user` doing `attrs`. An unreachable upstream is an error and
    /// is not cached.
    pub async fn check(
        &self,
        user: &Arc<UserInfo>,
        attrs: &Attributes,
    ) -> Result<(Decision, Lookup), UpstreamError> {
        let key = (user.clone(), attrs.clone());
        self.cache
            .get_or_fetch(key, || async {
                let body = Bytes::from(review_body(user, attrs).to_string());
                let started = tokio::time::Instant::now();
                let answer = self.upstream.post_json(ACCESS_REVIEWS, body).await;
                self.metrics.review(Review::Access, started.elapsed().as_secs_f64());
                let answer = answer?;
                let d = parse_answer(&answer)?;
                let ttl = if d.allowed { self.opts.allowed_ttl } else { self.opts.denied_ttl };
                Ok((d, ttl))
            })
            .await
    }
}

/// The SubjectAccessReview request body.
pub fn review_body(user: &UserInfo, a: &Attributes) -> Value {
    let mut spec = json!({"user": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        spec["uid"] = user.uid.clone().into();
    }
    if !user.extra.is_empty() {
        spec["extra"] = json!(user.extra);
    }
    match &a.path {
        Some(path) => spec["nonResourceAttributes"] = json!({"path": path, "verb": a.verb}),
        None => {
            let mut ra = json!({"verb": a.verb, "group": a.group, "resource": a.resource});
            for (k, v) in [
                ("version", &a.version),
                ("subresource", &a.subresource),
                ("namespace", &a.namespace),
                ("name", &a.name),
            ] {
                if !v.is_empty() {
                    ra[k] = v.clone().into();
                }
            }
            if let Some(f) = selectors::to_json(&a.field_selector) {
                ra["fieldSelector"] = f;
            }
            if let Some(l) = selectors::to_json(&a.label_selector) {
                ra["labelSelector"] = l;
            }
            spec["resourceAttributes"] = ra;
        }
    }
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
}

/// Reads `status.allowed` / `status.denied` / `status.reason`.
pub fn parse_answer(body: &[u8]) -> Result<Decision, UpstreamError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| UpstreamError::Decode(format!("SubjectAccessReview answer: {e}")))?;
    let status = v.get("status").cloned().unwrap_or(Value::Null);
    let allowed = status.get("allowed").and_then(Value::as_bool).unwrap_or(false)
        && !status.get("denied").and_then(Value::as_bool).unwrap_or(false);
    let reason = status.get("reason").and_then(Value::as_str).unwrap_or("").to_owned();
    Ok(Decision { allowed, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn review_body_carries_user_and_attributes() {
        let u = UserInfo {
            name: "alice".into(),
            uid: "u1".into(),
            groups: vec!["devs".into()],
            extra: [("scopes".to_string(), vec!["a".to_string()])].into(),
        };
        let a = Attributes {
            verb: "list".into(),
            version: "v1".into(),
            resource: "pods".into(),
            namespace: "ns".into(),
            ..Attributes::default()
        };
        assert_eq!(
            review_body(&u, &a),
            json!({"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{
                "user":"alice","uid":"u1","groups":["devs"],"extra":{"scopes":["a"]},
                "resourceAttributes":{"verb":"list","group":"","resource":"pods","version":"v1","namespace":"ns"}}})
        );
        // A kubelet's pod watch carries its field selector (KEP-4601), kube-proxy's its labels.
        let w = Attributes {
            verb: "watch".into(),
            version: "v1".into(),
            resource: "pods".into(),
            field_selector: selectors::field("spec.nodeName=n1"),
            label_selector: selectors::label("!service.kubernetes.io/headless"),
            ..Attributes::default()
        };
        assert_eq!(
            review_body(&u, &w)["spec"]["resourceAttributes"],
            json!({"verb":"watch","group":"","resource":"pods","version":"v1",
                   "fieldSelector":{"requirements":[{"key":"spec.nodeName","operator":"In","values":["n1"]}]},
                   "labelSelector":{"requirements":[{"key":"service.kubernetes.io/headless","operator":"DoesNotExist"}]}})
        );
        let m = Attributes { verb: "get".into(), path: Some("/metrics".into()), ..Attributes::default() };
        assert_eq!(
            review_body(&u, &m)["spec"]["nonResourceAttributes"],
            json!({"path":"/metrics","verb":"get"})
        );
    }

    #[test]
    fn answers() {
        assert!(parse_answer(br#"{"status":{"allowed":true}}"#).unwrap().allowed);
        assert!(!parse_answer(br#"{"status":{"allowed":true,"denied":true}}"#).unwrap().allowed);
        let d = parse_answer(br#"{"status":{"allowed":false,"reason":"nope"}}"#).unwrap();
        assert_eq!(d, Decision { allowed: false, reason: "nope".into() });
        assert!(parse_answer(b"{}").is_ok_and(|d| !d.allowed));
        assert!(parse_answer(b"not json").is_err());
    }
}
