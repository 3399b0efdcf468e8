//! Authentication of bearer tokens by TokenReview on the upstream (authentication.k8s.io/v1).
//! Results are cached under the token's SHA-256 (never the token itself): success ≈2 min,
//! failure ≈10 s, bounded; identical concurrent reviews share one request.
//!
//! Called by `auth::Auth::authenticate`. Tokens never reach logs or metrics.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use super::cache::{Lookup, TtlCache};
use super::user::UserInfo;
use crate::metrics::{Metrics, Review};
use crate::upstream::{Upstream, UpstreamError};

pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// Cache lifetimes and size.
#[derive(Clone, Debug)]
pub struct AuthnOptions {
    pub success_ttl: Duration,
    pub failure_ttl: Duration,
    pub capacity: usize,
}

impl Default for AuthnOptions {
    fn default() -> Self {
        AuthnOptions {
            success_ttl: Duration::from_secs(120),
            failure_ttl: Duration::from_secs(10),
            capacity: 10_000,
        }
    }
}

/// See the module doc.
pub struct TokenAuthenticator {
    upstream: Upstream,
    metrics: Arc<Metrics>,
    opts: AuthnOptions,
    cache: TtlCache<[u8; 32], Option<Arc<UserInfo>>>,
}

impl TokenAuthenticator {
    pub fn new(upstream: Upstream, opts: AuthnOptions, metrics: Arc<Metrics>) -> TokenAuthenticator {
        let cache = TtlCache::new(opts.capacity);
        TokenAuthenticator { upstream, metrics, opts, cache }
    }

    /// The user of `token`, `None` when the upstream says it is not valid. An unreachable
    /// upstream is an error and is not cached.
    pub async fn review(&self, token: &str) -> Result<(Option<Arc<UserInfo>>, Lookup), UpstreamError> {
        self.cache
            .get_or_fetch(sha256(token.as_bytes()), || async {
                let body = json!({"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":token}});
                let started = tokio::time::Instant::now();
                let answer = self.upstream.post_json(TOKEN_REVIEWS, Bytes::from(body.to_string())).await;
                self.metrics.review(Review::Token, started.elapsed().as_secs_f64());
                let answer = answer?;
                let user = parse_answer(&answer)?.map(Arc::new);
                let ttl = if user.is_some() { self.opts.success_ttl } else { self.opts.failure_ttl };
                Ok((user, ttl))
            })
            .await
    }
}

/// The bearer token of an `Authorization` header (`Bearer <token>`, scheme case-insensitive).
pub fn bearer_token(value: &http::HeaderValue) -> Option<&str> {
    let v = value.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// `status.authenticated` and `status.user` of a TokenReview answer.
pub fn parse_answer(body: &[u8]) -> Result<Option<UserInfo>, UpstreamError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| UpstreamError::Decode(format!("TokenReview answer: {e}")))?;
    let status = v.get("status").cloned().unwrap_or(Value::Null);
    if status.get("authenticated").and_then(Value::as_bool) != Some(true) {
        return Ok(None);
    }
    let u = status.get("user").cloned().unwrap_or(Value::Null);
    let name = u.get("username").and_then(Value::as_str).unwrap_or("").to_owned();
    if name.is_empty() {
        return Ok(None);
    }
    let strs = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let extra: BTreeMap<String, Vec<String>> = u
        .get("extra")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), strs(Some(v)))).collect())
        .unwrap_or_default();
    Ok(Some(
        UserInfo {
            name,
            uid: u.get("uid").and_then(Value::as_str).unwrap_or("").to_owned(),
            groups: strs(u.get("groups")),
            extra,
        }
        .with_authenticated_group(),
    ))
}

/// SHA-256 through rustls' ring provider (ring is not a direct dependency).
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    if let Some(suite) = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256.tls13() {
        let digest = suite.common.hash_provider.hash(data);
        out.copy_from_slice(&digest.as_ref()[..32]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_is_sha256() {
        let h = sha256(b"abc");
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn bearer_tokens() {
        let h = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert_eq!(bearer_token(&h("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&h("bearer   abc ")), Some("abc"));
        assert_eq!(bearer_token(&h("Basic abc")), None);
        assert_eq!(bearer_token(&h("Bearer ")), None);
    }

    #[test]
    fn token_review_answers() {
        let ok = br#"{"status":{"authenticated":true,"user":{"username":"alice","uid":"1","groups":["devs"],"extra":{"k":["v"]}}}}"#;
        let u = parse_answer(ok).unwrap().unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, ["devs", "system:authenticated"]);
        assert_eq!(u.extra["k"], ["v"]);
        assert_eq!(parse_answer(br#"{"status":{"error":"invalid"}}"#).unwrap(), None);
        assert_eq!(parse_answer(br#"{"status":{"authenticated":true,"user":{}}}"#).unwrap(), None);
        assert!(parse_answer(b"<html>").is_err());
    }
}
