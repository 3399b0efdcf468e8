//! Authentication of bearer tokens by TokenReview on the upstream (authentication.k8s.io/v1).
//! Results are cached under the token's SHA-256 (never the token itself): success ≈2 min in a
//! bounded cache, failure ≈10 s in a separate small one (so a flood of bad tokens costs nothing
//! once seen, and never evicts a real user's entry); identical concurrent reviews share one
//! request; reviews sent upstream are bounded per second (a token bucket), past which the
//! caller gets 429 rather than costing the proxy's API Priority and Fairness budget upstream.
//! Each source address (an IPv6 /64) has its own quarter of that bound, so that a flood of
//! bad tokens from one place does not take every new valid token's review. A token valid at its
//! last review is remembered (its hash and user) for [`RENEWAL_WINDOW`] × its answer's life,
//! and when that answer expires it is reviewed again from a bucket of its own (a quarter of it
//! per user, so tokens minted for one account cannot spend it all; past it, the shared way)
//! and seats of its own: unknown tokens from a few addresses (four quarters) spend the shared
//! bucket, and every user whose answer expired got 429 for as long as they did (the apiserver
//! checks tokens in-process and has no such bound). A token longer
//! than `max_token_bytes` is refused without a review (`auth::Auth::authenticate`). A request
//! whose token is not known waits for its review in one of a bounded number of seats
//! (`waiting`): requests piled on one review cannot hold every in-flight permit.
//!
//! Called by `auth::Auth::authenticate`. Tokens never reach logs or metrics.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use super::cache::{Lookup, TtlCache};
use super::rate::{self, Bucket, Buckets, Rate};
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
    /// Longer bearer tokens are refused without a review (`--authentication-token-max-length`).
    pub max_token_bytes: usize,
}

/// The share of the TokenReview rate one source address may use.
pub const SOURCE_SHARE: u32 = 4;

/// How many of its answer's lives a valid token is remembered for its renewal.
pub const RENEWAL_WINDOW: u32 = 30;

impl Default for AuthnOptions {
    fn default() -> Self {
        AuthnOptions {
            success_ttl: Duration::from_secs(120),
            failure_ttl: Duration::from_secs(10),
            capacity: 10_000,
            review_qps: 50.0,
            review_burst: 100,
            max_token_bytes: 16 * 1024,
        }
    }
}

/// Why a token could not be reviewed.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Over `--authentication-token-review-qps`: the caller should retry (429).
    #[error("TokenReview rate limit reached")]
    Limited,
    /// Every seat of the source, or of the whole, waits on a review already (`waiting`): 429.
    #[error("too many requests waiting on TokenReviews")]
    Busy,
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
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
    /// Tokens valid at their last review (their user's name), for longer than `cache` holds
    /// their answer.
    valid_before: TtlCache<[u8; 32], Arc<str>>,
    bucket: Bucket,
    /// Reviews of `valid_before`'s tokens: the same rate, apart from `bucket`; a quarter of it
    /// per user (tokens minted for one account share one budget); past them, `bucket`'s way.
    renewals: Bucket,
    renewals_by_user: Buckets<Arc<str>>,
    /// A share of `bucket` per source address.
    sources: Buckets<IpAddr>,
    /// Requests waiting on a review, per source and in all; renewals' apart.
    waiting: super::waiting::Waiting,
    renewals_waiting: super::waiting::Waiting,
}

impl TokenAuthenticator {
    pub fn new(upstream: Upstream, opts: AuthnOptions, metrics: Arc<Metrics>) -> TokenAuthenticator {
        let cache = TtlCache::new(opts.capacity);
        let rejected = TtlCache::new((opts.capacity / 8).max(64));
        let valid_before = TtlCache::new(opts.capacity);
        let bucket = Bucket::new(opts.review_qps, opts.review_burst);
        let renewals = Bucket::new(opts.review_qps, opts.review_burst);
        let renewals_by_user =
            Buckets::new(Rate { qps: opts.review_qps, burst: opts.review_burst }.share(SOURCE_SHARE));
        let sources =
            Buckets::new(Rate { qps: opts.review_qps, burst: opts.review_burst }.share(SOURCE_SHARE));
        TokenAuthenticator {
            upstream,
            metrics,
            opts,
            cache,
            rejected,
            valid_before,
            bucket,
            renewals,
            renewals_by_user,
            sources,
            waiting: Default::default(),
            renewals_waiting: Default::default(),
        }
    }

    /// The longest token reviewed.
    pub fn max_token_bytes(&self) -> usize {
        self.opts.max_token_bytes
    }

    /// The user of `token` (sent from `source`), `None` when the upstream says it is not
    /// valid. An unreachable upstream, or a review rate bound (the source's share, or the
    /// whole), is an error and is not cached.
    pub async fn review(
        &self,
        token: &str,
        source: Option<IpAddr>,
    ) -> Result<(Option<Arc<UserInfo>>, Lookup), ReviewError> {
        let key = sha256(token.as_bytes());
        if self.rejected.peek(&key).is_some() {
            return Ok((None, Lookup::Hit));
        }
        // A review to send or to wait for (the token not known): a seat of the source's, held
        // until it is in (a renewal's of their own). A known token takes none (and is looked
        // up below, which keeps it recently used).
        let renewal = self.valid_before.peek(&key);
        let waiting = if renewal.is_some() { &self.renewals_waiting } else { &self.waiting };
        let _seat = match self.cache.peek(&key) {
            Some(_) => None,
            None => Some(waiting.take(source.map(rate::source_key)).ok_or(ReviewError::Busy)?),
        };
        // The review's rate is spent before a slot is made (`get_or_fetch_admitted`).
        let admit = || {
            let renewed =
                renewal.as_ref().is_some_and(|user| self.renewals_by_user.take(user) && self.renewals.take());
            let allowed = renewed
                || (source.is_none_or(|ip| self.sources.take(&rate::source_key(ip))) && self.bucket.take());
            if allowed {
                Ok(())
            } else {
                Err(ReviewError::Limited)
            }
        };
        self.cache
            .get_or_fetch_admitted(key, admit, || async {
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
                    self.valid_before.remove(&key);
                    return Ok((None, Duration::ZERO));
                }
                if let Some(u) = &user {
                    self.valid_before.insert(key, Arc::from(u.name.as_str()), self.opts.success_ttl * RENEWAL_WINDOW);
                }
                Ok((user, self.opts.success_ttl))
            })
            .await
    }
}

/// The bearer token of an `Authorization` header, read as the apiserver's bearer token
/// authenticator reads it (`strings.SplitN(auth, " ", 3)` of the header value without its
/// surrounding blanks; the scheme `bearer` in any case; the token is the second part and must
/// not be empty): `Bearer  <token>` (two spaces) carries no token; `Bearer <token> <more>`
/// carries `<token>`. Read as bytes, as Go reads a header: a token that is not text is still a
/// token, which no review accepts (a review: it was taken as no credentials, so anonymous).
pub fn bearer_token(value: &http::HeaderValue) -> Option<Bearer<'_>> {
    let v = value.as_bytes().trim_ascii();
    let mut parts = v.splitn(3, |b| *b == b' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
        return None;
    }
    Some(std::str::from_utf8(token).map_or(Bearer::NotText, Bearer::Token))
}

/// A bearer token as [`bearer_token`] finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bearer<'a> {
    Token(&'a str),
    /// Bytes that are not UTF-8: 401, as the apiserver's review of it is.
    NotText,
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

    /// Renewals: a quarter of the rate per user, then the shared bucket's way: one account's
    /// many tokens spend their quarter and what the shared bucket has left, no more, and
    /// another user's renewal still goes.
    #[tokio::test]
    async fn renewals_are_shared_out_per_user_then_fall_back_to_the_shared_bucket() {
        use crate::upstream::testutil::{client_of, full, handler, serve};
        use http_body_util::BodyExt;
        // Every token is valid; its user is what comes before its `-`.
        let addr = serve(handler(|_, req: http::Request<hyper::body::Incoming>| async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let v: Value = serde_json::from_slice(&body).unwrap();
            let user = v["spec"]["token"].as_str().unwrap().split('-').next().unwrap().to_owned();
            let answer = json!({"status": {"authenticated": true, "user": {"username": user}}});
            http::Response::builder()
                .header("content-type", "application/json")
                .body(full(answer.to_string()))
                .unwrap()
        }))
        .await;
        // No refill within the test: 8 reviews in all, a quarter (2) of the renewals per user.
        let opts = AuthnOptions { review_qps: 0.001, review_burst: 8, ..AuthnOptions::default() };
        let a = TokenAuthenticator::new(client_of(addr), opts, Arc::new(Metrics::new()));
        let tokens = ["bob-1", "bob-2", "bob-3", "bob-4", "bob-5", "alice-1"];
        for t in tokens {
            assert!(a.review(t, None).await.unwrap().0.is_some(), "{t}");
        }
        // Their answers expire (the cache forgets them; they are remembered valid).
        for t in tokens {
            a.cache.remove(&sha256(t.as_bytes()));
        }
        // bob: his quarter, then the shared bucket's last two (6 of its 8 spent above), then 429.
        let mut renewed = Vec::new();
        for t in &tokens[..5] {
            renewed.push(a.review(t, None).await.is_ok());
        }
        assert_eq!(renewed, [true, true, true, true, false]);
        // alice: a quarter of her own, whatever bob spent.
        assert!(a.review("alice-1", None).await.is_ok());
    }

    #[test]
    fn sha256_is_sha256() {
        let h = sha256(b"abc");
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn bearer_tokens() {
        let h = |s: &str| http::HeaderValue::from_str(s).unwrap();
        let token = |t| Some(Bearer::Token(t));
        assert_eq!(bearer_token(&h("Bearer abc")), token("abc"));
        assert_eq!(bearer_token(&h("bearer abc ")), token("abc"), "the value is trimmed");
        assert_eq!(bearer_token(&h("Bearer abc def")), token("abc"), "the second part");
        let bytes = |b: &[u8]| http::HeaderValue::from_bytes(b).unwrap();
        assert_eq!(bearer_token(&bytes(b"Bearer \xffabc")), Some(Bearer::NotText));
        assert_eq!(bearer_token(&bytes(b"Bearer abc \xff")), token("abc"));
        assert_eq!(bearer_token(&bytes(b"Basic \xffabc")), None);
        // Go: `parts[1]` is empty, the token authenticator does not authenticate.
        assert_eq!(bearer_token(&h("Bearer  abc")), None);
        assert_eq!(bearer_token(&h("bearer   abc ")), None);
        assert_eq!(bearer_token(&h("Bearer\tabc")), None);
        assert_eq!(bearer_token(&h("Basic abc")), None);
        assert_eq!(bearer_token(&h("Bearer ")), None);
        assert_eq!(bearer_token(&h("Bearer")), None);
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
