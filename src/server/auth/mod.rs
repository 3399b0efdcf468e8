//! Who may do what: authentication of every request (client certificate, bearer token by
//! TokenReview, optional anonymous), impersonation, and authorization by SubjectAccessReview of
//! every read served from the cache.
//!
//! `app` builds one [`Auth`] (or none for `--auth=none`); the phases call
//! [`Auth::authenticate`] → [`Auth::impersonate`] (`phase::authenticate`) → (classify) →
//! [`Auth::authorize`] (`phase::authorize`; `phase::health` for the checks' detail).
//!
//! | file | owns |
//! | --- | --- |
//! | `user` | [`UserInfo`], [`Caller`], [`Credential`] |
//! | `peer` | [`PeerUser`]: a connection's certificate user, checked at each request |
//! | `x509` | CN / O of a verified client certificate |
//! | `client_ca` | `--client-ca-file`'s verifier, reloaded, and its generation |
//! | `authn` | TokenReview + cache |
//! | `authz` | SubjectAccessReview + cache, [`Attributes`] |
//! | `impersonate` | `Impersonate-*` headers |
//! | `constrained` | constrained impersonation's modes and their checks |
//! | `cache` | the bounded, coalescing TTL cache both use |
//! | `rate` | token buckets: review rates per source, per user and address |
//! | `seats` | SubjectAccessReviews' seats in the air, handed round robin between users at addresses |
//! | `waiting` | seats for requests waiting on a TokenReview, per source and in all |
//! | `status` | 401 / 403 bodies |

pub mod authn;
pub mod authz;
pub mod cache;
pub mod client_ca;
pub mod constrained;
pub mod impersonate;
pub mod peer;
pub mod rate;
pub mod seats;
pub mod selectors;
pub mod status;
pub mod user;
pub mod waiting;
pub mod x509;

use std::sync::Arc;

use http::header::AUTHORIZATION;
use http::{HeaderMap, Request, Response};

pub use authn::AuthnOptions;
pub use authz::{Attributes, AuthzOptions};
pub use peer::PeerUser;
pub use user::{Caller, Credential, UserInfo, VersionOneCertificate};

use super::body::{self, Body};
use crate::error::Error;
use crate::metrics::{Metrics, Review};
use crate::upstream::Upstream;

/// How callers are checked.
#[derive(Clone, Debug, Default)]
pub struct AuthOptions {
    /// Requests without credentials act as `system:anonymous` instead of getting 401.
    pub anonymous: bool,
    pub authn: AuthnOptions,
    pub authz: AuthzOptions,
    /// Constrained impersonation (1.36's `ConstrainedImpersonation`): its modes are tried
    /// before legacy impersonation, and impersonation without a user is refused with its text.
    pub constrained_impersonation: bool,
}

/// Authentication and authorization against the upstream.
pub struct Auth {
    anonymous: bool,
    constrained: bool,
    metrics: Arc<Metrics>,
    tokens: authn::TokenAuthenticator,
    authz: authz::Authorizer,
    /// Rate-limited reviews and failed reviews: warned about at most every half minute each.
    limited_warn: crate::warn_gate::WarnGate,
    failed_warn: crate::warn_gate::WarnGate,
    review_limited_warn: crate::warn_gate::WarnGate,
    review_failed_warn: crate::warn_gate::WarnGate,
}

impl Auth {
    pub fn new(upstream: Upstream, opts: AuthOptions, metrics: Arc<Metrics>) -> Auth {
        Auth {
            anonymous: opts.anonymous,
            constrained: opts.constrained_impersonation,
            tokens: authn::TokenAuthenticator::new(upstream.clone(), opts.authn, metrics.clone()),
            authz: authz::Authorizer::new(upstream, opts.authz, metrics.clone()),
            metrics,
            limited_warn: Default::default(),
            failed_warn: Default::default(),
            review_limited_warn: Default::default(),
            review_failed_warn: Default::default(),
        }
    }

    /// The caller of `req` (sent from `source`): its verified client certificate first (unless
    /// its chain has expired since the handshake or is no longer trusted), then its bearer
    /// token, then anonymous when allowed and no certificate failed. An invalid token is 401
    /// even with anonymous access on (the apiserver's `FailOnError` union).
    pub async fn authenticate<B>(
        &self,
        req: &Request<B>,
        source: Option<std::net::IpAddr>,
    ) -> Result<Caller, Response<Body>> {
        if req.extensions().get::<VersionOneCertificate>().is_some() {
            return Err(status::unauthorized_with(status::V1_CERTIFICATE));
        }
        // A chain that expired since its handshake, or that a reloaded `--client-ca-file` no
        // longer trusts, fails like the apiserver's per-request verification: the request may
        // still be authenticated by its token, never anonymous (the `FailOnError` union; a
        // review: a kept-open or resumed connection authenticated for as long as it was used).
        let peer = req.extensions().get::<PeerUser>();
        let failed = peer.is_some_and(|p| !p.valid_at(std::time::SystemTime::now()));
        if failed {
            tracing::debug!(
                "the client certificate chain has expired, or --client-ca-file no longer trusts it"
            );
        }
        if let Some(PeerUser { user: u, .. }) = peer.filter(|_| !failed) {
            // Forwarded requests name this user in Impersonate-* headers: an identity that a
            // header would change is refused rather than authorized as one string and sent as
            // another.
            if let Err(why) = u.check_header_safe() {
                static REFUSED: crate::warn_gate::WarnGate = crate::warn_gate::WarnGate::new();
                const WHAT: &str = "client certificate refused: its subject cannot be forwarded unchanged";
                match REFUSED.pass() {
                    Some(held) => tracing::warn!(reason = %why, similar_since_last = held, "{WHAT}"),
                    None => tracing::debug!(reason = %why, "{WHAT}"),
                }
                return Err(status::unauthorized());
            }
            return Ok(Caller::new((**u).clone(), Credential::Certificate));
        }
        let token = req.headers().get(AUTHORIZATION).and_then(authn::bearer_token);
        if let Some(token) = token {
            let authn::Bearer::Token(token) = token else {
                tracing::debug!("a bearer token that is not UTF-8; answering 401");
                return Err(status::unauthorized());
            };
            if token.len() > self.tokens.max_token_bytes() {
                tracing::debug!(
                    len = token.len(),
                    "bearer token over --authentication-token-max-length; answering 401"
                );
                return Err(status::unauthorized());
            }
            let review = self.tokens.review(token, source).await;
            let hit = matches!(review, Ok((_, cache::Lookup::Hit)));
            self.metrics.auth_cache(Review::Token, hit);
            return match review {
                Ok((Some(u), how)) => {
                    tracing::debug!(user = %u.name, cache = ?how, "token authenticated");
                    Ok(Caller::new((*u).clone(), Credential::Token))
                }
                Ok((None, _)) => Err(status::unauthorized()),
                Err(authn::ReviewError::Limited) => {
                    const WHAT: &str = "TokenReview rate limit reached (--authentication-token-review-qps, \
                                        or this source's share of it); answering 429";
                    match self.limited_warn.pass() {
                        Some(held) => tracing::warn!(source = ?source, similar_since_last = held, "{WHAT}"),
                        None => tracing::debug!(source = ?source, "{WHAT}"),
                    }
                    Err(super::limits::too_many())
                }
                Err(authn::ReviewError::Busy) => {
                    tracing::debug!(source = ?source, "too many requests waiting on TokenReviews; answering 429");
                    Err(super::limits::too_many())
                }
                Err(e) => {
                    match self.failed_warn.pass() {
                        Some(held) => {
                            tracing::warn!(error = %e, similar_since_last = held, "TokenReview failed; answering 401")
                        }
                        None => tracing::debug!(error = %e, "TokenReview failed; answering 401"),
                    }
                    Err(status::unauthorized())
                }
            };
        }
        if self.anonymous && !failed {
            return Ok(Caller::new(UserInfo::anonymous(), Credential::Anonymous));
        }
        Err(status::unauthorized())
    }

    /// Applies the caller's `Impersonate-*` headers: every wanted value must be allowed for
    /// verb `impersonate`, or, with constrained impersonation on, by one of its modes on the
    /// request's attributes (`request`), else 403 like the apiserver.
    pub async fn impersonate(
        &self,
        mut caller: Caller,
        headers: &HeaderMap,
        request: Option<&Attributes>,
        source: Option<std::net::IpAddr>,
    ) -> Result<Caller, Response<Body>> {
        let wanted = match impersonate::parse(headers) {
            Ok(None) => return Ok(caller),
            Ok(Some(w)) => w,
            Err(impersonate::Refused::WithoutUser(w)) => {
                return Err(body::error(Error::BadRequest(impersonate::without_user(&w, self.constrained))))
            }
            Err(impersonate::Refused::Invalid(e)) => return Err(body::error(Error::Internal(e))),
        };
        let user = if self.constrained {
            self.constrained_user(&caller.user, &wanted, request, source).await?
        } else {
            for a in impersonate::checks(&wanted) {
                self.authorize(&caller.user, &a, source, &caller.user.name).await?;
            }
            impersonate::user(&wanted)
        };
        tracing::debug!(user = %caller.user.name, as_user = %wanted.user, "impersonating");
        caller.effective = Arc::new(user);
        caller.impersonating = true;
        Ok(caller)
    }

    /// The user `requestor` acts as by the first constrained impersonation mode whose checks
    /// all pass (`constrained::modes`), or the first failing mode's 403.
    async fn constrained_user(
        &self,
        requestor: &Arc<UserInfo>,
        wanted: &impersonate::Wanted,
        request: Option<&Attributes>,
        source: Option<std::net::IpAddr>,
    ) -> Result<UserInfo, Response<Body>> {
        use constrained::Check;
        let mut first = None;
        'modes: for mode in constrained::modes(wanted, requestor, request) {
            let mut skip = 0;
            for check in mode.checks {
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                // As Go's `checkAuthorization`: a check that cannot be decided fails its mode
                // (its answer — 429, 500 — is that mode's refusal) and the next mode is tried; a
                // wildcard that cannot be decided is not allowed.
                let refusal = match check {
                    Check::Refuse { attrs, reason } => status::forbidden(&requestor.name, &attrs, &reason),
                    Check::Wildcard { attrs, skip: n } => {
                        if self
                            .decide(requestor, &attrs, source, &requestor.name)
                            .await
                            .is_ok_and(|d| d.allowed)
                        {
                            skip = n;
                        }
                        continue;
                    }
                    Check::Ask { user, attrs } => {
                        let asking = user.map_or_else(|| requestor.clone(), Arc::new);
                        match self.decide(&asking, &attrs, source, &requestor.name).await {
                            Ok(d) if d.allowed => continue,
                            Ok(d) => status::forbidden(&requestor.name, &attrs, &d.reason),
                            Err(resp) => resp,
                        }
                    }
                };
                if first.is_none() {
                    first = Some(refusal);
                }
                continue 'modes;
            }
            tracing::debug!(user = %requestor.name, mode = mode.name, "impersonation mode allowed");
            return Ok(mode.user);
        }
        Err(first.unwrap_or_else(|| body::error(Error::Internal("all impersonation modes failed".into()))))
    }

    /// Allows `user` (asking from `source`) to do `attrs`, or answers 403 (500 when the
    /// upstream cannot decide; 429 past the reviews allowed to the authenticated user `by` at
    /// that address — the impersonator when `user` is impersonated).
    pub async fn authorize(
        &self,
        user: &Arc<UserInfo>,
        attrs: &Attributes,
        source: Option<std::net::IpAddr>,
        by: &str,
    ) -> Result<(), Response<Body>> {
        let d = self.decide(user, attrs, source, by).await?;
        if d.allowed {
            Ok(())
        } else {
            Err(status::forbidden(&user.name, attrs, &d.reason))
        }
    }

    /// The upstream's decision on `user` doing `attrs` (a cached one when it has one), or the
    /// answer when there is none (429, 500).
    async fn decide(
        &self,
        user: &Arc<UserInfo>,
        attrs: &Attributes,
        source: Option<std::net::IpAddr>,
        by: &str,
    ) -> Result<authz::Decision, Response<Body>> {
        let check = self.authz.check(user, attrs, source, by).await;
        self.metrics.auth_cache(Review::Access, matches!(check, Ok((_, cache::Lookup::Hit))));
        match check {
            Ok((d, how)) => {
                tracing::debug!(user = %user.name, verb = %attrs.verb, resource = %attrs.resource,
                    namespace = %attrs.namespace, allowed = d.allowed, cache = ?how, "authorization");
                Ok(d)
            }
            Err(authz::CheckError::Limited) => {
                const WHAT: &str = "SubjectAccessReview rate limit of the user at its address reached (--authorization-review-qps); answering 429";
                match self.review_limited_warn.pass() {
                    Some(held) => {
                        tracing::warn!(user = %user.name, source = ?source, similar_since_last = held, "{WHAT}")
                    }
                    None => tracing::debug!(user = %user.name, source = ?source, "{WHAT}"),
                }
                Err(super::limits::too_many())
            }
            Err(e) => {
                // The upstream's answer to the proxy's own review (naming its identity and its
                // rights) is for the log, not the caller.
                match self.review_failed_warn.pass() {
                    Some(held) => {
                        tracing::warn!(error = %e, similar_since_last = held, "SubjectAccessReview failed")
                    }
                    None => tracing::debug!(error = %e, "SubjectAccessReview failed"),
                }
                Err(body::error(Error::Internal("authorization check failed".into())))
            }
        }
    }
}
