//! `Impersonate-*` headers, handled as the apiserver's impersonation filter does: parsed, each
//! wanted value checked with a SubjectAccessReview for verb `impersonate` (users or
//! serviceaccounts, groups, uids, userextras), and the request then acts as the impersonated
//! user. Also writes the headers the proxy itself sends when it forwards a certificate caller.
//!
//! Called by `auth::Auth::impersonate` and `upstream` forwarding (through `server::proxy`).

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::authz::Attributes;
use super::user::{UserInfo, ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED};
use crate::selector::{is_dns1123_label_name, is_dns1123_subdomain_name};

pub const USER: &str = "impersonate-user";
pub const GROUP: &str = "impersonate-group";
pub const UID: &str = "impersonate-uid";
pub const EXTRA_PREFIX: &str = "impersonate-extra-";

const SA_PREFIX: &str = "system:serviceaccount:";

/// What the caller asks to act as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    pub user: String,
    pub groups: Vec<String>,
    pub uid: Option<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

fn is_impersonation(name: &HeaderName) -> bool {
    let n = name.as_str();
    n == USER || n == GROUP || n == UID || n.starts_with(EXTRA_PREFIX)
}

/// The wanted identity, `Ok(None)` without impersonation headers, `Err` for an invalid
/// combination (groups, uid or extra without a user; non-UTF-8 values). As the apiserver's
/// `buildImpersonationRequests`: the first `Impersonate-User` and `Impersonate-Uid` are read
/// (Go's `Header.Get`), an empty one is no request at all, and every group and extra value
/// counts, empty or not.
pub fn parse(headers: &HeaderMap) -> Result<Option<Wanted>, Refused> {
    if !headers.keys().any(is_impersonation) {
        return Ok(None);
    }
    let text = |v: &HeaderValue| {
        v.to_str().map(str::to_owned).map_err(|_| Refused::Invalid("invalid impersonation header".into()))
    };
    let mut w = Wanted::default();
    for g in headers.get_all(GROUP) {
        w.groups.push(text(g)?);
    }
    if let Some(u) = headers.get(UID) {
        w.uid = Some(text(u)?).filter(|u| !u.is_empty());
    }
    for (name, v) in headers {
        // The name is lowercase already (as Go's `strings.ToLower` before unescaping): an
        // escaped capital (`%41`) stays a capital, as in the apiserver.
        if let Some(key) = name.as_str().strip_prefix(EXTRA_PREFIX) {
            w.extra.entry(unescape_extra_key(key)?).or_default().push(text(v)?);
        }
    }
    if let Some(u) = headers.get(USER) {
        w.user = text(u)?;
    }
    if w.user.is_empty() {
        if w.groups.is_empty() && w.uid.is_none() && w.extra.is_empty() {
            // Only empty user or uid headers: nothing is impersonated.
            return Ok(None);
        }
        return Err(Refused::WithoutUser(w));
    }
    Ok(Some(w))
}

/// Why impersonation headers are refused before anything is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Groups, a uid or extra without a user: 400, [`without_user`]'s message.
    WithoutUser(Wanted),
    /// A value that is not UTF-8 (500).
    Invalid(String),
}

/// The apiserver's 400 message for impersonation without a user: constrained impersonation's
/// (`%#v` of the wanted `user.DefaultInfo`) or legacy impersonation's (`%v` of the
/// `ObjectReference`s it would check: groups, extra values, the uid).
pub fn without_user(w: &Wanted, constrained: bool) -> String {
    let q = |s: &str| crate::resource::go_quote(s);
    if constrained {
        let list = |v: &[String]| v.iter().map(|s| q(s)).collect::<Vec<_>>().join(", ");
        let groups = if w.groups.is_empty() {
            "[]string(nil)".to_string()
        } else {
            format!("[]string{{{}}}", list(&w.groups))
        };
        let extra = if w.extra.is_empty() {
            "map[string][]string(nil)".to_string()
        } else {
            let kv: Vec<String> =
                w.extra.iter().map(|(k, v)| format!("{}:[]string{{{}}}", q(k), list(v))).collect();
            format!("map[string][]string{{{}}}", kv.join(", "))
        };
        let uid = q(w.uid.as_deref().unwrap_or(""));
        return format!(
            "requested &user.DefaultInfo{{Name:\"\", UID:{uid}, Groups:{groups}, Extra:{extra}}} without impersonating a user name"
        );
    }
    // `v1.ObjectReference`'s fields: Kind Namespace Name UID APIVersion ResourceVersion FieldPath.
    let reference =
        |kind: &str, name: &str, api: &str, path: &str| format!("{{{kind}  {name}  {api}  {path}}}");
    let mut refs: Vec<String> = w.groups.iter().map(|g| reference("Group", g, "", "")).collect();
    for (k, vs) in &w.extra {
        refs.extend(vs.iter().map(|v| reference("UserExtra", v, "authentication.k8s.io/v1", k)));
    }
    if let Some(uid) = &w.uid {
        refs.push(reference("UID", uid, "authentication.k8s.io/v1", ""));
    }
    format!("requested [{}] without impersonating a user", refs.join(" "))
}

/// The apiserver's `unescapeExtraKey`: `url.PathUnescape`, or the key as it came when an
/// escape in it is malformed (a `%` not followed by two hex digits), never a partial decoding.
/// A decoding that is not UTF-8 is refused (Go would keep its bytes; none of them can be
/// named in a SubjectAccessReview's JSON).
fn unescape_extra_key(key: &str) -> Result<String, Refused> {
    let b = key.as_bytes();
    let malformed = b.iter().enumerate().any(|(i, &c)| {
        c == b'%' && !(b.len() > i + 2 && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit())
    });
    if malformed {
        return Ok(key.to_owned());
    }
    match percent_decode_str(key).decode_utf8() {
        Ok(k) => Ok(k.into_owned()),
        Err(_) => Err(Refused::Invalid("invalid impersonation extra key".into())),
    }
}

fn attrs(group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
    Attributes {
        verb: "impersonate".into(),
        group: group.into(),
        resource: resource.into(),
        subresource: sub.into(),
        namespace: ns.into(),
        name: name.into(),
        ..Attributes::default()
    }
}

/// The checks the apiserver makes, in its order: the user (or service account), each group,
/// each extra value, the uid.
pub fn checks(w: &Wanted) -> Vec<Attributes> {
    let mut out = Vec::new();
    match split_service_account(&w.user) {
        Some((ns, name)) => out.push(attrs("", "serviceaccounts", "", ns, name)),
        None => out.push(attrs("", "users", "", "", &w.user)),
    }
    for g in &w.groups {
        out.push(attrs("", "groups", "", "", g));
    }
    for (k, vs) in &w.extra {
        for v in vs {
            out.push(attrs("authentication.k8s.io", "userextras", k, "", v));
        }
    }
    if let Some(uid) = &w.uid {
        out.push(attrs("authentication.k8s.io", "uids", "", "", uid));
    }
    out
}

/// The user the request acts as once every check passed (impersonation.go): a service
/// account without wanted groups gets its service-account groups; a user other than
/// `system:anonymous` gets `system:authenticated` unless it wants `system:authenticated` or
/// `system:unauthenticated`; `system:anonymous` gets `system:unauthenticated` unless wanted.
pub fn user(w: &Wanted) -> UserInfo {
    let mut groups = w.groups.clone();
    if let Some((ns, _)) = split_service_account(&w.user) {
        if groups.is_empty() {
            groups = vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}")];
        }
    }
    if w.user != ANONYMOUS {
        if !groups.iter().any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED) {
            groups.push(AUTHENTICATED.into());
        }
    } else if !groups.iter().any(|g| g == UNAUTHENTICATED) {
        groups.push(UNAUTHENTICATED.into());
    }
    UserInfo { name: w.user.clone(), uid: w.uid.clone().unwrap_or_default(), groups, extra: w.extra.clone() }
}

/// `serviceaccount.SplitUsername`: `system:serviceaccount:<ns>:<name>` with exactly two parts,
/// a valid namespace (DNS label) and service-account name (DNS subdomain); anything else is a
/// plain user name (`system:serviceaccount:ns:a:b`, `system:serviceaccount:ns:`).
pub fn split_service_account(user: &str) -> Option<(&str, &str)> {
    let (ns, name) = user.strip_prefix(SA_PREFIX)?.split_once(':')?;
    (is_dns1123_label_name(ns) && is_dns1123_subdomain_name(name)).then_some((ns, name))
}

/// Removes every `Impersonate-*` header.
pub fn strip(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers.keys().filter(|n| is_impersonation(n)).cloned().collect();
    for n in names {
        headers.remove(n);
    }
}

/// What an extra key escapes in its header name: everything but `[a-z0-9-_.]`. Header names
/// arrive lowercased (the apiserver lowercases before it unescapes), so a capital must travel
/// escaped to arrive as a capital (`Abc` → `impersonate-extra-%41bc`).
const EXTRA_KEY: &AsciiSet = &{
    let mut set = NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');
    let mut c = b'A';
    while c <= b'Z' {
        set = set.add(c);
        c += 1;
    }
    set
};

/// Sets the headers that make the upstream act as exactly `u` (sent with the proxy's
/// credentials). Every group is stated, `system:authenticated` included, so the apiserver's
/// impersonation filter adds none of its own: it adds the service-account groups to a
/// service-account name impersonated without groups, and `system:authenticated` to any other
/// user without it or `system:unauthenticated`, whatever this proxy took the name for (issue
/// 30: a name the two read differently must not gain groups upstream). `system:anonymous`
/// without `system:unauthenticated` (a certificate `CN=system:anonymous`) cannot be sent
/// exactly (the filter would add it) and is an error. Every value must be header-safe, so that
/// the upstream reads back exactly what was authorized here; a value that is not is an error
/// and nothing is sent.
pub fn set(headers: &mut HeaderMap, u: &UserInfo) -> Result<(), String> {
    strip(headers);
    u.check_header_safe()?;
    let value = |s: &str| {
        HeaderValue::from_bytes(s.as_bytes()).map_err(|_| format!("{s:?} cannot be sent in a header"))
    };
    let has = |group: &str| u.groups.iter().any(|g| g == group);
    let complete =
        if u.name == ANONYMOUS { has(UNAUTHENTICATED) } else { has(AUTHENTICATED) || has(UNAUTHENTICATED) };
    if !complete {
        return Err(format!(
            "user {:?} with groups {:?} cannot be impersonated upstream: the apiserver would add a group",
            u.name, u.groups
        ));
    }
    headers.insert(USER, value(&u.name)?);
    for g in &u.groups {
        headers.append(GROUP, value(g)?);
    }
    if !u.uid.is_empty() {
        headers.insert(UID, value(&u.uid)?);
    }
    for (k, vs) in &u.extra {
        let name = format!("{EXTRA_PREFIX}{}", utf8_percent_encode(k, EXTRA_KEY));
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("extra key {k:?}"))?;
        for v in vs {
            headers.append(name.clone(), value(v)?);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        m
    }

    #[test]
    fn parses_and_checks_like_the_apiserver() {
        assert_eq!(parse(&h(&[("accept", "x")])), Ok(None));
        let w = parse(&h(&[
            ("impersonate-user", "bob"),
            ("impersonate-group", "g1"),
            ("impersonate-extra-Scopes%2Fx", "s"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(w.extra["scopes/x"], ["s"]);
        let c = checks(&w);
        assert_eq!(c.len(), 3);
        assert_eq!((c[0].resource.as_str(), c[0].name.as_str()), ("users", "bob"));
        assert_eq!((c[1].resource.as_str(), c[1].name.as_str()), ("groups", "g1"));
        assert_eq!((c[2].resource.as_str(), c[2].subresource.as_str()), ("userextras", "scopes/x"));
        assert_eq!(user(&w).groups, ["g1", "system:authenticated"]);
        assert!(parse(&h(&[("impersonate-group", "g1")])).is_err());
    }

    /// As Go's `Header.Get` in the apiserver's filter: the first user and uid are taken, an
    /// empty one asks for nothing (the request acts as its caller, as the apiserver's does).
    #[test]
    fn empty_and_repeated_headers_as_the_apiserver_reads_them() {
        assert_eq!(parse(&h(&[("impersonate-user", "")])), Ok(None));
        assert_eq!(parse(&h(&[("impersonate-user", ""), ("impersonate-uid", "")])), Ok(None));
        assert!(parse(&h(&[("impersonate-user", ""), ("impersonate-group", "g")])).is_err());
        assert!(parse(&h(&[("impersonate-uid", "u")])).is_err());
        let w = parse(&h(&[("impersonate-user", "bob"), ("impersonate-user", "eve")])).unwrap().unwrap();
        assert_eq!(w.user, "bob");
        let w = parse(&h(&[("impersonate-user", "bob"), ("impersonate-uid", "")])).unwrap().unwrap();
        assert_eq!(w.uid, None, "an empty uid is not checked nor set");
        assert_eq!(checks(&w).len(), 1);
        let w = parse(&h(&[("impersonate-user", "bob"), ("impersonate-group", "")])).unwrap().unwrap();
        assert_eq!(w.groups, [""], "an empty group is asked for, as in Go");
        // The first value decides, as `Header.Get`: an empty first user is no user.
        assert_eq!(parse(&h(&[("impersonate-user", ""), ("impersonate-user", "eve")])), Ok(None));
    }

    #[test]
    fn service_accounts() {
        let w = parse(&h(&[("impersonate-user", "system:serviceaccount:ns:sa")])).unwrap().unwrap();
        let c = checks(&w);
        assert_eq!(
            (c[0].resource.as_str(), c[0].namespace.as_str(), c[0].name.as_str()),
            ("serviceaccounts", "ns", "sa")
        );
        assert_eq!(
            user(&w).groups,
            ["system:serviceaccounts", "system:serviceaccounts:ns", "system:authenticated"]
        );
    }

    #[test]
    fn set_round_trips_through_parse() {
        let u = UserInfo {
            name: "alice".into(),
            uid: "u".into(),
            groups: vec!["devs".into(), "system:authenticated".into()],
            extra: [("a/b".to_string(), vec!["1".to_string()])].into(),
        };
        let mut headers = h(&[("impersonate-user", "evil"), ("impersonate-group", "system:masters")]);
        set(&mut headers, &u).unwrap();
        let w = parse(&headers).unwrap().unwrap();
        assert_eq!(w.user, "alice");
        assert_eq!(w.groups, ["devs", "system:authenticated"]);
        assert_eq!(w.uid.as_deref(), Some("u"));
        assert_eq!(w.extra["a/b"], ["1"]);
    }

    /// Issue 21 item 2: a value a header would change is never sent; nothing is sent then.
    #[test]
    fn set_refuses_values_a_header_would_change() {
        let with = |name: &str, groups: &[&str]| UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        };
        for u in [
            with("mallory", &[" system:masters"]),
            with("mallory", &["system:masters "]),
            with("mallory", &["\tsystem:masters"]),
            with(" ", &[]),
            with("", &[]),
            with("mal\rlory", &[]),
            with("mallory", &["a\nImpersonate-Group: system:masters"]),
            with("mallory", &[""]),
        ] {
            let mut headers = h(&[("impersonate-user", "evil")]);
            assert!(set(&mut headers, &u).is_err(), "{u:?}");
            assert!(parse(&headers).unwrap().is_none(), "nothing left for {u:?}");
        }
        // Inner spaces and non-ASCII letters arrive unchanged.
        let mut headers = HeaderMap::new();
        set(&mut headers, &with("José Ñ", &["team a", AUTHENTICATED])).unwrap();
        assert_eq!(headers[USER].as_bytes(), "José Ñ".as_bytes());
        assert_eq!(headers[GROUP], "team a");
    }

    /// Issue 21 item 3: a certificate `CN=system:serviceaccount:ns:sa` with no O is forwarded
    /// with exactly its groups: an explicit `system:authenticated`, so the apiserver adds no
    /// service-account groups.
    #[test]
    fn a_service_account_certificate_user_gets_no_service_account_groups_upstream() {
        let u = UserInfo {
            name: "system:serviceaccount:ns:sa".into(),
            groups: vec![AUTHENTICATED.into()],
            ..UserInfo::default()
        };
        let mut headers = HeaderMap::new();
        set(&mut headers, &u).unwrap();
        let groups: Vec<&str> = headers.get_all(GROUP).iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(groups, [AUTHENTICATED]);
        // What the apiserver then builds from the headers: exactly the certificate's groups.
        assert_eq!(user(&parse(&headers).unwrap().unwrap()).groups, [AUTHENTICATED]);
        // A plain user's groups are stated too: nothing is left for the apiserver to add.
        let mut headers = HeaderMap::new();
        set(&mut headers, &UserInfo { name: "bob".into(), ..u.clone() }).unwrap();
        let groups: Vec<&str> = headers.get_all(GROUP).iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(groups, [AUTHENTICATED]);
    }

    /// Issue 30 §2: Go's `ValidateServiceAccountName` bounds only the whole name (253), not its
    /// dot-separated parts; a 64-character name is a service account to the apiserver, so here
    /// too, and whatever this proxy took a name for, the user it forwards keeps exactly its
    /// groups (every one stated, the apiserver adds none).
    #[test]
    fn service_account_names_are_validated_as_go_does() {
        let long = "a".repeat(64);
        for sa in [
            format!("system:serviceaccount:team-a:{long}"),
            format!("system:serviceaccount:team-a:x.{long}.y"),
        ] {
            assert!(split_service_account(&sa).is_some(), "{sa}");
            let w = parse(&h(&[("impersonate-user", &sa)])).unwrap().unwrap();
            assert_eq!(checks(&w)[0].resource, "serviceaccounts", "{sa}");
            // The certificate user of that name has only its own groups upstream.
            let u = UserInfo { name: sa.clone(), groups: vec![AUTHENTICATED.into()], ..UserInfo::default() };
            let mut headers = HeaderMap::new();
            set(&mut headers, &u).unwrap();
            assert_eq!(user(&parse(&headers).unwrap().unwrap()).groups, [AUTHENTICATED], "{sa}");
        }
        let too_long = format!("system:serviceaccount:ns:{}", "a".repeat(254));
        for plain in [
            &*too_long,
            "system:serviceaccount:ns:a..b",
            "system:serviceaccount:ns:.a",
            "system:serviceaccount:ns:a-.b",
            "system:serviceaccount:ns:A",
        ] {
            assert!(split_service_account(plain).is_none(), "{plain}");
        }
        assert!(split_service_account(&format!("system:serviceaccount:ns:{}", "a".repeat(253))).is_some());
    }

    /// Issue 30 §3: what cannot be impersonated exactly is not forwarded; capitals in extra
    /// keys travel escaped and arrive as they were authorized.
    #[test]
    fn identities_round_trip_exactly_or_not_at_all() {
        let anon = |groups: &[&str]| UserInfo {
            name: ANONYMOUS.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        };
        // The impersonation filter would add system:unauthenticated to a CN=system:anonymous.
        assert!(set(&mut HeaderMap::new(), &anon(&["devs"])).is_err());
        assert!(set(&mut HeaderMap::new(), &anon(&[])).is_err());
        let mut headers = HeaderMap::new();
        set(&mut headers, &anon(&["devs", UNAUTHENTICATED])).unwrap();
        assert_eq!(user(&parse(&headers).unwrap().unwrap()).groups, ["devs", UNAUTHENTICATED]);
        // A user in system:unauthenticated (O=system:unauthenticated) stays out of
        // system:authenticated upstream.
        let u =
            UserInfo { name: "carol".into(), groups: vec![UNAUTHENTICATED.into()], ..UserInfo::default() };
        let mut headers = HeaderMap::new();
        set(&mut headers, &u).unwrap();
        assert_eq!(user(&parse(&headers).unwrap().unwrap()).groups, [UNAUTHENTICATED]);
        // A user with neither is refused rather than completed by the apiserver.
        assert!(set(&mut HeaderMap::new(), &UserInfo { name: "dave".into(), ..UserInfo::default() }).is_err());
        // Extra keys: capitals escaped, read back unchanged.
        let u = UserInfo {
            name: "erin".into(),
            groups: vec![AUTHENTICATED.into()],
            extra: [("Abc/Déf".to_string(), vec!["v".to_string()])].into(),
            ..UserInfo::default()
        };
        let mut headers = HeaderMap::new();
        set(&mut headers, &u).unwrap();
        assert!(headers.contains_key("impersonate-extra-%41bc%2F%44%C3%A9f"), "{headers:?}");
        assert_eq!(parse(&headers).unwrap().unwrap().extra, u.extra);
    }

    /// Smaller differences from the apiserver (issue 21).
    #[test]
    fn service_account_names_extra_keys_and_unauthenticated_as_the_apiserver() {
        for plain in [
            "system:serviceaccount:ns:a:b",
            "system:serviceaccount:ns:",
            "system:serviceaccount::sa",
            "system:serviceaccount:NS:sa",
        ] {
            let w = parse(&h(&[("impersonate-user", plain)])).unwrap().unwrap();
            assert_eq!(checks(&w)[0].resource, "users", "{plain}");
            assert_eq!(user(&w).groups, [AUTHENTICATED], "{plain}");
        }
        assert_eq!(
            split_service_account("system:serviceaccount:kube-system:a.b"),
            Some(("kube-system", "a.b"))
        );
        // Lowercased before unescaping: an escaped capital stays.
        let w =
            parse(&h(&[("impersonate-user", "bob"), ("impersonate-extra-%41cme", "x")])).unwrap().unwrap();
        assert_eq!(w.extra.keys().collect::<Vec<_>>(), ["Acme"]);
        // A malformed escape keeps the whole key as it came (Go's `url.PathUnescape` fails),
        // never decoded in part.
        for (raw, want) in [("%41b%zz", "%41b%zz"), ("%41b%4", "%41b%4"), ("a%", "a%"), ("%41b%25", "Ab%")] {
            let w = parse(&h(&[("impersonate-user", "bob"), (&format!("impersonate-extra-{raw}"), "x")]))
                .unwrap()
                .unwrap();
            assert_eq!(w.extra.keys().collect::<Vec<_>>(), [want], "{raw}");
        }
        assert!(parse(&h(&[("impersonate-user", "bob"), ("impersonate-extra-%ff", "x")])).is_err());
        // system:unauthenticated wanted: no system:authenticated added.
        let w = parse(&h(&[("impersonate-user", "bob"), ("impersonate-group", UNAUTHENTICATED)]))
            .unwrap()
            .unwrap();
        assert_eq!(user(&w).groups, [UNAUTHENTICATED]);
        let w = parse(&h(&[("impersonate-user", ANONYMOUS)])).unwrap().unwrap();
        assert_eq!(user(&w).groups, [UNAUTHENTICATED]);
        let w =
            parse(&h(&[("impersonate-user", "bob"), ("impersonate-group", AUTHENTICATED)])).unwrap().unwrap();
        assert_eq!(user(&w).groups, [AUTHENTICATED]);
    }
}
