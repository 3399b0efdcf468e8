//! Who is calling: the authenticated user (name, uid, groups, extra) and how the proxy learnt
//! it, which decides how a forwarded request is sent upstream.
//!
//! Built by `auth::authn` (tokens), `auth::x509` (client certificates) and `auth::impersonate`;
//! read by `auth::authz` and the phases (`phase::authenticate`, `phase::dispatch`).

use std::collections::BTreeMap;
use std::sync::Arc;

pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const AUTHENTICATED: &str = "system:authenticated";

/// A user as the apiserver's `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn anonymous() -> UserInfo {
        UserInfo { name: ANONYMOUS.into(), groups: vec![UNAUTHENTICATED.into()], ..UserInfo::default() }
    }

    /// Whether every part of this identity can be sent in an `Impersonate-*` header and read
    /// back unchanged (`header_safe`); `Err` names the first part that cannot.
    pub fn check_header_safe(&self) -> Result<(), String> {
        let parts = std::iter::once(("user name", &self.name))
            .chain(self.groups.iter().map(|g| ("group", g)))
            .chain((!self.uid.is_empty()).then_some(("uid", &self.uid)))
            .chain(self.extra.values().flatten().map(|v| ("extra value", v)));
        for (what, v) in parts {
            if !header_safe(v) {
                return Err(format!("{what} {v:?} cannot be forwarded in a header unchanged"));
            }
        }
        Ok(())
    }

    /// Adds `system:authenticated` like the apiserver's `AuthenticatedGroupAdder`: not for
    /// `system:anonymous`, nor for a user already in `system:authenticated` or
    /// `system:unauthenticated`.
    pub fn with_authenticated_group(mut self) -> UserInfo {
        if self.name != ANONYMOUS && !self.groups.iter().any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED) {
            self.groups.push(AUTHENTICATED.into());
        }
        self
    }
}

/// Whether `s` arrives unchanged when sent as an HTTP header value: not empty, no leading or
/// trailing whitespace (HTTP/1.1 parsers drop it: RFC 9110 §5.5), no control characters (not
/// allowed in a field value, or cut at a line end). An identity that is not header-safe would
/// be authorized as one string here and act as another upstream (issue 21: `O=" system:masters"`
/// arrived as `system:masters`).
pub fn header_safe(s: &str) -> bool {
    !s.is_empty() && s.trim_matches([' ', '\t']) == s && !s.chars().any(char::is_control)
}

/// How the caller proved who they are.
#[derive(Clone, Debug)]
pub enum Credential {
    /// `--auth=none`: nobody is checked; forwarded requests go with the proxy's credentials.
    Trusted,
    /// No credentials, `--anonymous-auth` on: forwarded unchanged, without any credentials.
    Anonymous,
    /// A bearer token (the caller's `Authorization` header, forwarded unchanged with its
    /// request). Not kept here: a header value is a slice of its HTTP/1.1 connection's read
    /// buffer (up to 1 MiB), and a caller lives as long as its watch.
    Token,
    /// A client certificate verified against `--client-ca-file`: forwarded with the proxy's
    /// credentials and impersonation headers.
    Certificate,
}

/// An authenticated request's caller.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Who authenticated.
    pub user: Arc<UserInfo>,
    /// Who the request acts as: `user`, or the user it impersonates.
    pub effective: Arc<UserInfo>,
    /// Whether `effective` came from the caller's `Impersonate-*` headers.
    pub impersonating: bool,
    pub credential: Credential,
}

impl Caller {
    pub fn new(user: UserInfo, credential: Credential) -> Caller {
        let user = Arc::new(user);
        Caller { effective: user.clone(), user, impersonating: false, credential }
    }

    pub fn trusted() -> Caller {
        Caller::new(UserInfo { name: "system:unsecured".into(), ..UserInfo::default() }, Credential::Trusted)
    }
}

/// A TLS connection whose client certificate is X.509 version 1: the handshake completed
/// (so that a clear 401 can be sent), but nothing is authenticated from it and every request
/// on the connection gets 401. Put into each request's extensions by the listener.
#[derive(Clone, Copy, Debug)]
pub struct VersionOneCertificate;

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        }
    }

    /// Go's `AuthenticatedGroupAdder` (issue 30 §3): nothing for `system:anonymous`, nor for a
    /// user already in `system:authenticated` or `system:unauthenticated`.
    #[test]
    fn the_group_adder_is_the_apiservers() {
        assert_eq!(user("bob", &["devs"]).with_authenticated_group().groups, ["devs", AUTHENTICATED]);
        assert_eq!(user("bob", &[]).with_authenticated_group().groups, [AUTHENTICATED]);
        assert_eq!(user("bob", &[UNAUTHENTICATED]).with_authenticated_group().groups, [UNAUTHENTICATED]);
        assert_eq!(
            user("bob", &[AUTHENTICATED, "x"]).with_authenticated_group().groups,
            [AUTHENTICATED, "x"]
        );
        assert_eq!(user(ANONYMOUS, &["devs"]).with_authenticated_group().groups, ["devs"]);
    }
}
