//! Authorization by SubjectAccessReview on the upstream (authorization.k8s.io/v1): the caller's
//! user, uid, groups and extra with the request's attributes. Decisions are cached (allowed ≈5
//! min, denied ≈30 s, bounded LRU) and identical concurrent checks share one review.
//! Reviews sent upstream are bounded per user (a token bucket each, `--authorization-review-qps`
//! and `--authorization-review-burst`), past which the caller gets 429: one caller asking for
//! many distinct names cannot make unbounded reviews; and at most [`MAX_REVIEWS_IN_THE_AIR`] are
//! in the air for all users together (the rest wait for one to end, at most [`SEAT_WAIT`], then
//! 429; a freed seat goes round robin to the next user at an address with a check waiting,
//! `seats::FairSeats`). A decision whose user and attributes
//! exceed [`MAX_KEY_BYTES`] is cached under the SHA-256 of its review instead of the whole.
//!
//! Called by `auth::Auth::authorize` for every read served from the cache, `/metrics`, and the
//! `impersonate` checks.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use super::cache::{Lookup, TtlCache};
use super::rate::{Buckets, Rate};
use super::seats::FairSeats;
use super::selectors::{self, Requirement};
use super::user::UserInfo;
use crate::metrics::{Metrics, Review};
use crate::upstream::{Upstream, UpstreamError};

pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// A decision cache key that would hold more than this (user and attributes, in bytes) is
/// replaced by the SHA-256 of the review it stands for.
pub const MAX_KEY_BYTES: usize = 4 * 1024;

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
    /// SubjectAccessReviews sent upstream per second per user (0: unbounded), and the burst.
    pub review_qps: f64,
    pub review_burst: u32,
}

/// Why a decision could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Over the user's `--authorization-review-qps`: the caller should retry (429).
    #[error("SubjectAccessReview rate limit of the user reached")]
    Limited,
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

/// The decision cache's key: the user and attributes, or, when they are large, the digest of
/// the review (a 30 KB name is not kept 10 000 times).
// Unboxed: `Whole` is the key it always was (no allocation more per lookup); `Digest` is rare.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Whole(Arc<UserInfo>, Attributes),
    Digest([u8; 32]),
}

impl Key {
    fn new(user: &Arc<UserInfo>, attrs: &Attributes) -> Key {
        if key_bytes(user, attrs) <= MAX_KEY_BYTES {
            return Key::Whole(user.clone(), attrs.clone());
        }
        Key::Digest(super::authn::sha256(review_body(user, attrs).to_string().as_bytes()))
    }
}

/// About what a key holding `user` and `attrs` takes.
fn key_bytes(user: &UserInfo, a: &Attributes) -> usize {
    let strs = |v: &[String]| v.iter().map(String::len).sum::<usize>();
    let reqs = |r: &[Requirement]| r.iter().map(|r| r.key.len() + strs(&r.values)).sum::<usize>();
    user.name.len()
        + user.uid.len()
        + strs(&user.groups)
        + user.extra.iter().map(|(k, v)| k.len() + strs(v)).sum::<usize>()
        + [&a.verb, &a.group, &a.version, &a.resource, &a.subresource, &a.namespace, &a.name]
            .iter()
            .map(|s| s.len())
            .sum::<usize>()
        + a.path.as_ref().map_or(0, String::len)
        + reqs(&a.field_selector)
        + reqs(&a.label_selector)
}

impl Default for AuthzOptions {
    fn default() -> Self {
        AuthzOptions {
            allowed_ttl: Duration::from_secs(300),
            denied_ttl: Duration::from_secs(30),
            capacity: 10_000,
            review_qps: 20.0,
            review_burst: 100,
        }
    }
}

/// See the module doc.
pub struct Authorizer {
    upstream: Upstream,
    metrics: Arc<Metrics>,
    opts: AuthzOptions,
    cache: TtlCache<Key, Decision>,
    /// Reviews per user name and client address (`rate::user_at`).
    users: Buckets<String>,
    /// Reviews in the air for all users together ([`MAX_REVIEWS_IN_THE_AIR`]).
    in_the_air: FairSeats,
}

/// SubjectAccessReviews in the air at once for the whole proxy. They go as the proxy, in its
/// own API Priority and Fairness flow beside its relists: many users' checks at once (10 000
/// kubelets starting, or callers with many identities) wait here for one to end rather than
/// queue there ahead of the proxy's own reads. At ~1–2 ms a review, 64 pass 30 000 a second.
pub const MAX_REVIEWS_IN_THE_AIR: usize = 64;

/// How long a check waits for one of those seats before its caller gets 429.
pub const SEAT_WAIT: Duration = Duration::from_secs(5);

impl Authorizer {
    pub fn new(upstream: Upstream, opts: AuthzOptions, metrics: Arc<Metrics>) -> Authorizer {
        let cache = TtlCache::new(opts.capacity);
        // Per user and client address: a DaemonSet's pods under one service account on 5 000
        // nodes are 5 000 keys for each such account; kept well past a large cluster's (~100 B
        // each), so a start storm does not keep forgetting (and refilling) them.
        let users =
            Buckets::with_capacity(Rate { qps: opts.review_qps, burst: opts.review_burst }, REVIEW_KEYS);
        let in_the_air = FairSeats::new(MAX_REVIEWS_IN_THE_AIR);
        Authorizer { upstream, metrics, opts, cache, users, in_the_air }
    }

    /// The (cached) decision for `user` doing `attrs`, asked from `source` by the authenticated
    /// user `by` (the impersonator when `user` is impersonated: the pair's review rate is spent,
    /// `limits::acting`, and `by`'s turn at the seats). An unreachable upstream, or the review rate bound at that
    /// address, is an error and is not cached.
    pub async fn check(
        &self,
        user: &Arc<UserInfo>,
        attrs: &Attributes,
        source: Option<IpAddr>,
        by: &str,
    ) -> Result<(Decision, Lookup), CheckError> {
        let key = crate::server::limits::user_at(&crate::server::limits::acting(by, &user.name), source);
        // Seats go round robin between authenticated users (an impersonator's names take turns
        // within its own: a review), the rate is the pair's.
        let seat_key = crate::server::limits::user_at(by, source);
        // The user's review rate is spent before a slot is made (`get_or_fetch_admitted`).
        let admit = || if self.users.take(&key) { Ok(()) } else { Err(CheckError::Limited) };
        self.cache
            .get_or_fetch_admitted(Key::new(user, attrs), admit, || async {
                let body = Bytes::from(review_body(user, attrs).to_string());
                // Waited for a short while only: requests queued here hold their in-flight
                // permits, and a slow upstream must not let them take every permit (429 past it,
                // as past the user's rate).
                let Some(_seat) = self.in_the_air.take(&seat_key, SEAT_WAIT).await else {
                    return Err(CheckError::Limited);
                };
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

/// (user, client address) review budgets remembered at once.
const REVIEW_KEYS: usize = 200_000;

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

    /// Many users' checks at once: at most `MAX_REVIEWS_IN_THE_AIR` reviews go upstream, the
    /// next waits (not refused) and goes when one ends.
    #[tokio::test]
    async fn reviews_in_the_air_are_bounded_for_all_users_together() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // An upstream that accepts and never answers: every review stays in the air, each on a
        // connection of its own (HTTP/1.1 in the clear): connections counted are reviews sent.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                conns.push(c);
            }
        });
        let upstream = Upstream::new(&crate::upstream::UpstreamOptions {
            upstream: Some(format!("http://{addr}")),
            ..Default::default()
        })
        .unwrap();
        let authz = Arc::new(Authorizer::new(upstream, AuthzOptions::default(), Arc::new(Metrics::new())));
        let check = |i: usize| {
            let authz = authz.clone();
            tokio::spawn(async move {
                let user = Arc::new(UserInfo { name: format!("user-{i}"), ..UserInfo::default() });
                let attrs =
                    Attributes { verb: "get".into(), resource: "pods".into(), ..Attributes::default() };
                authz.check(&user, &attrs, None, &user.name).await.map(|_| ())
            })
        };
        let until = |want: usize, within: Duration| {
            let accepted = accepted.clone();
            async move {
                tokio::time::timeout(within, async {
                    while accepted.load(Ordering::SeqCst) < want {
                        tokio::task::yield_now().await;
                    }
                })
                .await
                .is_ok()
            }
        };
        let mut waiting: Vec<_> = (0..MAX_REVIEWS_IN_THE_AIR).map(check).collect();
        assert!(until(MAX_REVIEWS_IN_THE_AIR, Duration::from_secs(5)).await, "every seat's review sent");
        let next = check(MAX_REVIEWS_IN_THE_AIR);
        // Given time it would have had to connect, it has not: it waits for a seat.
        assert!(!until(MAX_REVIEWS_IN_THE_AIR + 1, Duration::from_millis(300)).await, "one more sent");
        assert!(!next.is_finished(), "waits, not refused");
        // One gives up: its seat goes to the one waiting, whose review is sent.
        waiting.pop().unwrap().abort();
        assert!(until(MAX_REVIEWS_IN_THE_AIR + 1, Duration::from_secs(5)).await, "sent once a seat is free");
        // Every seat taken again: one more waits at most `SEAT_WAIT`, then is refused (429).
        let late = check(MAX_REVIEWS_IN_THE_AIR + 1);
        let refused = tokio::time::timeout(SEAT_WAIT * 2, late).await.expect("not held for ever").unwrap();
        assert!(matches!(refused, Err(CheckError::Limited)), "{refused:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), MAX_REVIEWS_IN_THE_AIR + 1, "never sent");
        for t in waiting {
            t.abort();
        }
        next.abort();
        held.abort();
    }

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
    fn a_large_key_is_a_digest_that_still_tells_reviews_apart() {
        let u = Arc::new(UserInfo { name: "alice".into(), ..UserInfo::default() });
        let a = |name: String| Attributes {
            verb: "get".into(),
            resource: "pods".into(),
            name,
            ..Attributes::default()
        };
        assert!(matches!(Key::new(&u, &a("p".into())), Key::Whole(..)));
        let (x, y) = (a("x".repeat(30_000)), a(format!("{}y", "x".repeat(29_999))));
        let (kx, ky) = (Key::new(&u, &x), Key::new(&u, &y));
        assert!(matches!(kx, Key::Digest(_)));
        assert_ne!(kx, ky);
        assert_eq!(kx, Key::new(&u, &x));
        let bob = Arc::new(UserInfo { name: "bob".into(), ..UserInfo::default() });
        assert_ne!(kx, Key::new(&bob, &x), "the user is part of it");
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
