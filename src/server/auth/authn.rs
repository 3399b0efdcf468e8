//! Authentication of bearer tokens by TokenReview on the upstream (authentication.k8s.io/v1).
//! Results are cached under the token's SHA-256 (never the token itself): success ≈2 min in a
//! bounded cache, failure ≈10 s in a separate small one (so a flood of bad tokens costs nothing
//! once seen, and never evicts a real user's entry); identical concurrent reviews share one
//! request; reviews sent upstream are bounded per second (a token bucket), past which the
//! caller gets 429 rather than costing the proxy's API Priority and Fairness budget upstream.
//!
//! Called by `auth::Auth::authenticate`. Tokens never reach logs or metrics.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::time::Instant;

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
    /// TokenReviews sent upstream per second at most (0: unbounded), and the burst above it
    /// (`--authentication-token-review-qps`, `--authentication-token-review-burst`).
    pub review_qps: f64,
    pub review_burst: u32,
}

impl Default for AuthnOptions {
    fn default() -> Self {
        AuthnOptions {
            success_ttl: Duration::from_secs(120),
            failure_ttl: Duration::from_secs(10),
            capacity: 10_000,
            review_qps: 50.0,
            review_burst: 100,
        }
    }
}

/// Why a token could not be reviewed.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Over `--authentication-token-review-qps`: the caller should retry (429).
    #[error("TokenReview rate limit reached")]
    Limited,
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

/// A token bucket: `qps` tokens a second, at most `burst` saved.
struct Bucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(qps: f64, burst: u32) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket { qps, burst, state: Mutex::new((burst, Instant::now())) }
    }

    fn take(&self) -> bool {
        if self.qps <= 0.0 {
            return true;
        }
        let now = Instant::now();
        let mut st = self.state.lock();
        let (tokens, last) = *st;
        let tokens = (tokens + now.saturating_duration_since(last).as_secs_f64() * self.qps).min(self.burst);
        if tokens < 1.0 {
            *st = (tokens, now);
            return false;
        }
        *st = (tokens - 1.0, now);
        true
    }
}

/// See the module doc.
pub struct TokenAuthenticator {
    upstream: Upstream,
    metrics: Arc<Metrics>,
    opts: AuthnOptions,
    /// Valid tokens (and reviews in flight, which concurrent callers share).
    cache: TtlCache<[u8; 32], Option<Arc<UserInfo>>>,
    /// Rejected tokens, apart: they never push a valid one out.
    rejected: TtlCache<[u8; 32], ()>,
    bucket: Bucket,
}

impl TokenAuthenticator {
    pub fn new(upstream: Upstream, opts: AuthnOptions, metrics: Arc<Metrics>) -> TokenAuthenticator {
        let cache = TtlCache::new(opts.capacity);
        let rejected = TtlCache::new((opts.capacity / 8).max(64));
        let bucket = Bucket::new(opts.review_qps, opts.review_burst);
        TokenAuthenticator { upstream, metrics, opts, cache, rejected, bucket }
    }

    /// The user of `token`, `None` when the upstream says it is not valid. An unreachable
    /// upstream, or the review rate bound, is an error and is not cached.
    pub async fn review(&self, token: &str) -> Result<(Option<Arc<UserInfo>>, Lookup), ReviewError> {
        let key = sha256(token.as_bytes());
        if self.rejected.peek(&key).is_some() {
            return Ok((None, Lookup::Hit));
        }
        self.cache
            .get_or_fetch(key, || async {
                if !self.bucket.take() {
                    return Err(ReviewError::Limited);
                }
                let body = json!({"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":token}});
                let started = tokio::time::Instant::now();
                let answer = self.upstream.post_json(TOKEN_REVIEWS, Bytes::from(body.to_string())).await;
                self.metrics.review(Review::Token, started.elapsed().as_secs_f64());
                let answer = answer?;
                let user = parse_answer(&answer)?.map(Arc::new);
                if user.is_none() {
                    // Shared with the concurrent callers of this review, then only `rejected`
                    // remembers it.
                    self.rejected.insert(key, (), self.opts.failure_ttl);
                    return Ok((None, Duration::ZERO));
                }
                Ok((user, self.opts.success_ttl))
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

/// SHA-256 (`ring`): the token cache's key, never the token itself.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
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

    #[tokio::test(start_paused = true)]
    async fn the_review_bucket_refills_at_its_rate() {
        let b = Bucket::new(2.0, 3);
        assert!((0..3).all(|_| b.take()), "the burst");
        assert!(!b.take());
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(b.take(), "one more after 1/qps");
        assert!(!b.take());
        assert!((0..1000).all(|_| Bucket::new(0.0, 1).take()), "0 is unbounded");
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
