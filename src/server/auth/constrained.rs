//! Constrained impersonation (KEP-5284; beta and on by default in Kubernetes 1.36): the modes
//! the apiserver's `WithConstrainedImpersonation` filter tries, in its order —
//! `associated-node`, `arbitrary-node`, `serviceaccount`, `user-info`, then legacy
//! `impersonate` — each as the list of authorization checks it makes and the user it yields.
//! A constrained mode first asks `impersonate-on:<mode>:<verb>` on the request's own attributes,
//! then `impersonate:<mode>` on what is wanted (in `authentication.k8s.io`); the first mode whose
//! checks all pass decides, and when none does the first mode's refusal is the answer.
//!
//! Called by `auth::Auth::impersonate` when constrained impersonation is on (the upstream's
//! version, or `--feature-gates`); pure: the checks are run there.

use super::authz::Attributes;
use super::impersonate::{split_service_account, Wanted};
use super::user::{UserInfo, ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED};
use crate::selector::{is_dns1123_subdomain, is_dns1123_subdomain_name};

/// The service-account token's extra naming the node its pod runs on.
pub const NODE_NAME_KEY: &str = "authentication.kubernetes.io/node-name";
/// What the `associated-node` mode's checks see of the requestor's extra: its keys alone.
const ASSOCIATED_KEYS: &str = "authentication.kubernetes.io/associated-node-keys";
const GROUP: &str = "authentication.k8s.io";
/// Groups or extra values from which a wildcard check is tried first (`manyAuthorizationChecksInLoop`).
const MANY: usize = 4;

/// One authorization check of a mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Asked as `user` (the requestor when `None`); denied: the mode fails with its 403.
    Ask { user: Option<UserInfo>, attrs: Attributes },
    /// Asked; allowed: the next `skip` checks are not needed; denied: they are.
    Wildcard { attrs: Attributes, skip: usize },
    /// Refused without asking, with this reason.
    Refuse { attrs: Attributes, reason: String },
}

/// A mode that applies to what is wanted: its checks, and who the request acts as once they
/// pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mode {
    pub name: &'static str,
    pub checks: Vec<Check>,
    pub user: UserInfo,
}

/// The modes that apply to `w` asked by `requestor` for a request of attributes `request`
/// (`None`: a request without attributes, for which only legacy impersonation is tried), in
/// the apiserver's order; legacy impersonation is always the last.
pub fn modes(w: &Wanted, requestor: &UserInfo, request: Option<&Attributes>) -> Vec<Mode> {
    let only_name = w.groups.is_empty() && w.uid.is_none() && w.extra.is_empty();
    let node = node_name(&w.user);
    let sa = split_service_account(&w.user);
    let mut out = Vec::new();
    if let Some(request) = request {
        let associated = node.is_some()
            && only_name
            && split_service_account(&requestor.name).is_some()
            && requestor
                .extra
                .get(NODE_NAME_KEY)
                .is_some_and(|v| v.len() == 1 && Some(v[0].as_str()) == node);
        if associated {
            out.push(associated_node(w, requestor, request));
        }
        if node.is_some() && only_name {
            out.push(constrained("arbitrary-node", w, None, request));
        }
        if sa.is_some() && only_name {
            out.push(constrained("serviceaccount", w, None, request));
        }
        if node.is_none() && sa.is_none() {
            out.push(constrained("user-info", w, None, request));
        }
    }
    out.push(legacy(w));
    out
}

/// `isNodeUsername`: `system:node:<a DNS subdomain>`.
fn node_name(user: &str) -> Option<&str> {
    user.strip_prefix("system:node:").filter(|n| is_dns1123_subdomain_name(n))
}

fn attrs(group: &str, verb: &str, resource: &str, name: &str) -> Attributes {
    Attributes {
        verb: verb.into(),
        group: group.into(),
        version: "v1".into(),
        resource: resource.into(),
        name: name.into(),
        ..Attributes::default()
    }
}

/// `associatedNodeImpersonationMode`: a service account's pod acting as its own node. Its
/// checks see the requestor's extra as its keys alone, and `impersonate:associated-node` is
/// asked for every node (`*`).
fn associated_node(w: &Wanted, requestor: &UserInfo, request: &Attributes) -> Mode {
    let mut seen = requestor.clone();
    seen.extra = [(ASSOCIATED_KEYS.to_string(), requestor.extra.keys().cloned().collect())].into();
    let mut m = constrained("associated-node", w, Some(&seen), request);
    for c in &mut m.checks {
        if let Check::Ask { attrs, .. } = c {
            if attrs.verb == "impersonate:associated-node" {
                attrs.name = "*".into();
            }
        }
    }
    m
}

/// A constrained mode (`newConstrainedImpersonationMode`): `impersonate-on:<mode>:<verb>` on
/// the request, then its `impersonate:<mode>` checks.
fn constrained(name: &'static str, w: &Wanted, seen: Option<&UserInfo>, request: &Attributes) -> Mode {
    let mut on = request.clone();
    on.verb = format!("impersonate-on:{name}:{}", request.verb);
    let mut checks = vec![Check::Ask { user: seen.cloned(), attrs: on }];
    let mut m = state(&format!("impersonate:{name}"), true, w);
    for c in &mut m.checks {
        if let Check::Ask { user, .. } = c {
            *user = seen.cloned();
        }
    }
    checks.append(&mut m.checks);
    Mode { name, checks, user: m.user }
}

fn legacy(w: &Wanted) -> Mode {
    let mut m = state("impersonate", false, w);
    m.name = "legacy";
    m
}

/// `impersonationModeState.check`: the user name, the uid, the groups, the extra, then the
/// user acted as.
fn state(verb: &str, constrained: bool, w: &Wanted) -> Mode {
    // Legacy impersonation names users, groups and service accounts in the core group.
    let name_group = if constrained { GROUP } else { "" };
    let mut checks = Vec::new();
    let mut groups = w.groups.clone();
    let mut user = attrs(name_group, verb, "users", &w.user);
    match (constrained.then(|| node_name(&w.user)).flatten(), split_service_account(&w.user)) {
        (Some(node), _) => {
            user.resource = "nodes".into();
            user.name = node.into();
            // Unreachable through the modes (a node mode wants the name alone), kept as Go has it.
            groups = vec!["system:nodes".into()];
        }
        (None, Some((ns, sa))) => {
            user.resource = "serviceaccounts".into();
            user.namespace = ns.into();
            user.name = sa.into();
            if groups.is_empty() {
                groups = vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}")];
            }
        }
        (None, None) => {}
    }
    checks.push(Check::Ask { user: None, attrs: user });
    if let Some(uid) = &w.uid {
        checks.push(Check::Ask { user: None, attrs: attrs(GROUP, verb, "uids", uid) });
    }
    group_checks(verb, name_group, constrained, &w.groups, &mut checks);
    extra_checks(verb, constrained, w, &mut checks);
    if w.user == ANONYMOUS {
        if !groups.iter().any(|g| g == UNAUTHENTICATED) {
            groups.push(UNAUTHENTICATED.into());
        }
    } else if !groups.iter().any(|g| g == UNAUTHENTICATED || g == AUTHENTICATED) {
        groups.push(AUTHENTICATED.into());
    }
    let user = UserInfo {
        name: w.user.clone(),
        uid: w.uid.clone().unwrap_or_default(),
        groups,
        extra: w.extra.clone(),
    };
    Mode { name: "", checks, user }
}

/// `authorizeGroups`.
fn group_checks(verb: &str, group: &str, constrained: bool, wanted: &[String], out: &mut Vec<Check>) {
    if wanted.is_empty() {
        return;
    }
    if constrained {
        if wanted.iter().any(String::is_empty) {
            let reason = "impersonating the empty string group is not allowed".into();
            out.push(Check::Refuse { attrs: attrs(group, verb, "groups", ""), reason });
            return;
        }
        if wanted.iter().any(|g| g == "system:masters") {
            let reason = "impersonating the system:masters group is not allowed".into();
            out.push(Check::Refuse { attrs: attrs(group, verb, "groups", "system:masters"), reason });
            return;
        }
        if wanted.len() >= MANY {
            out.push(Check::Wildcard { attrs: attrs(group, verb, "groups", "*"), skip: wanted.len() });
        }
    }
    out.extend(wanted.iter().map(|g| Check::Ask { user: None, attrs: attrs(group, verb, "groups", g) }));
}

/// `authorizeExtra`.
fn extra_checks(verb: &str, constrained: bool, w: &Wanted, out: &mut Vec<Check>) {
    if w.extra.is_empty() {
        return;
    }
    let extra = |sub: &str, name: &str| Attributes {
        subresource: sub.into(),
        ..attrs(GROUP, verb, "userextras", name)
    };
    if constrained {
        if let Some(reason) = invalid_extra(w) {
            out.push(Check::Refuse { attrs: extra("", ""), reason });
            return;
        }
        let values: usize = w.extra.values().map(Vec::len).sum();
        if w.extra.len() >= MANY || values >= MANY {
            out.push(Check::Wildcard { attrs: extra("*", "*"), skip: values });
        }
    }
    for (k, vs) in &w.extra {
        out.extend(vs.iter().map(|v| Check::Ask { user: None, attrs: extra(k, v) }));
    }
}

/// `validateExtra`: why constrained impersonation refuses these extra keys or values.
fn invalid_extra(w: &Wanted) -> Option<String> {
    for (key, values) in &w.extra {
        if key.is_empty() {
            return Some("impersonating the empty string key in extra is not allowed".into());
        }
        if let Some(e) = domain_prefixed_path(key) {
            return Some(format!("impersonating an invalid key in extra is not allowed: {e}"));
        }
        if *key != key.to_lowercase() {
            return Some(format!(
                "impersonating a non-lowercase key in extra is not allowed: {}",
                crate::resource::go_quote(key)
            ));
        }
        if values.is_empty() {
            return Some("impersonating empty values in extra is not allowed".into());
        }
        if values.iter().any(String::is_empty) {
            return Some("impersonating the empty string value in extra is not allowed".into());
        }
    }
    None
}

/// apimachinery's `IsDomainPrefixedPath` at field `extra.key`: `<DNS subdomain>/<path>`, the
/// path made of `[A-Za-z0-9/\-._~%!$&'()*+,;=:]`; its errors as `ToAggregate` writes them.
fn domain_prefixed_path(key: &str) -> Option<String> {
    const PATH: &str = "Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')";
    let invalid =
        |v: &str, why: &str| format!("extra.key: Invalid value: {}: {why}", crate::resource::go_quote(v));
    let Some((host, path)) = key.split_once('/').filter(|(h, p)| !h.is_empty() && !p.is_empty()) else {
        return Some(invalid(key, "must be a domain-prefixed path (such as \"acme.io/foo\")"));
    };
    let mut errs: Vec<String> = is_dns1123_subdomain(host).iter().map(|e| invalid(host, e)).collect();
    let path_char = |c: char| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c);
    if !path.chars().all(path_char) {
        errs.push(invalid(path, PATH));
    }
    match errs.len() {
        0 => None,
        1 => errs.pop(),
        _ => Some(format!("[{}]", errs.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(user: &str) -> Wanted {
        Wanted { user: user.into(), ..Wanted::default() }
    }

    fn list_pods() -> Attributes {
        Attributes {
            verb: "list".into(),
            version: "v1".into(),
            resource: "pods".into(),
            ..Attributes::default()
        }
    }

    fn names(ms: &[Mode]) -> Vec<&str> {
        ms.iter().map(|m| m.name).collect()
    }

    fn verbs(m: &Mode) -> Vec<String> {
        m.checks
            .iter()
            .map(|c| match c {
                Check::Ask { attrs, .. } | Check::Wildcard { attrs, .. } | Check::Refuse { attrs, .. } => {
                    format!("{} {}/{} {}", attrs.verb, attrs.resource, attrs.subresource, attrs.name)
                }
            })
            .collect()
    }

    #[test]
    fn each_wanted_user_has_the_apiservers_modes_in_order() {
        let pod_sa = UserInfo {
            name: "system:serviceaccount:kube-system:agent".into(),
            extra: [(NODE_NAME_KEY.to_string(), vec!["n1".to_string()]), ("x".to_string(), vec![])].into(),
            ..UserInfo::default()
        };
        let r = Some(list_pods());
        let ms = modes(&wanted("system:node:n1"), &pod_sa, r.as_ref());
        assert_eq!(names(&ms), ["associated-node", "arbitrary-node", "legacy"]);
        // Its own node only, and only a service account with exactly one node name.
        assert_eq!(
            names(&modes(&wanted("system:node:n2"), &pod_sa, r.as_ref())),
            ["arbitrary-node", "legacy"]
        );
        let plain = UserInfo { name: "alice".into(), ..pod_sa.clone() };
        assert_eq!(
            names(&modes(&wanted("system:node:n1"), &plain, r.as_ref())),
            ["arbitrary-node", "legacy"]
        );
        assert_eq!(
            names(&modes(&wanted("system:serviceaccount:ns:sa"), &plain, r.as_ref())),
            ["serviceaccount", "legacy"]
        );
        assert_eq!(names(&modes(&wanted("bob"), &plain, r.as_ref())), ["user-info", "legacy"]);
        // A node or service account with anything but its name: legacy alone.
        let mut w = wanted("system:node:n1");
        w.groups = vec!["g".into()];
        assert_eq!(names(&modes(&w, &plain, r.as_ref())), ["legacy"]);
        // An invalid node name is a plain user name.
        assert_eq!(names(&modes(&wanted("system:node:N_1"), &plain, r.as_ref())), ["user-info", "legacy"]);
        // No request attributes: legacy alone.
        assert_eq!(names(&modes(&wanted("bob"), &plain, None)), ["legacy"]);

        let a = &ms[0];
        assert_eq!(
            verbs(a),
            ["impersonate-on:associated-node:list pods/ ", "impersonate:associated-node nodes/ *"]
        );
        for c in &a.checks {
            let Check::Ask { user: Some(u), .. } = c else { panic!("{c:?}") };
            assert_eq!(u.name, pod_sa.name);
            assert_eq!(u.extra[ASSOCIATED_KEYS], ["authentication.kubernetes.io/node-name", "x"]);
        }
        assert_eq!(a.user.groups, ["system:nodes", AUTHENTICATED]);
        assert_eq!(a.user.name, "system:node:n1");
        assert_eq!(verbs(&ms[1])[1], "impersonate:arbitrary-node nodes/ n1");
        // Legacy: the node's name in the core group, its groups as wanted.
        assert_eq!(verbs(&ms[2]), ["impersonate users/ system:node:n1"]);
        assert_eq!(
            ms[2].checks[0],
            Check::Ask { user: None, attrs: attrs("", "impersonate", "users", "system:node:n1") }
        );
        assert_eq!(ms[2].user.groups, [AUTHENTICATED]);
    }

    #[test]
    fn user_info_checks_as_the_apiserver() {
        let mut w = wanted("bob");
        w.uid = Some("u1".into());
        w.groups = vec!["a".into(), "b".into()];
        w.extra = [("example.com/scope".to_string(), vec!["1".to_string(), "2".to_string()])].into();
        let ms = modes(&w, &UserInfo::default(), Some(&list_pods()));
        assert_eq!(
            verbs(&ms[0]),
            [
                "impersonate-on:user-info:list pods/ ",
                "impersonate:user-info users/ bob",
                "impersonate:user-info uids/ u1",
                "impersonate:user-info groups/ a",
                "impersonate:user-info groups/ b",
                "impersonate:user-info userextras/example.com/scope 1",
                "impersonate:user-info userextras/example.com/scope 2",
            ]
        );
        assert_eq!(ms[0].user.groups, ["a", "b", AUTHENTICATED]);
        assert_eq!(ms[0].user.uid, "u1");
        // Legacy, in 1.36's order: name, uid, groups, extra; users and groups in the core group.
        assert_eq!(
            verbs(&ms[1])[..3],
            ["impersonate users/ bob", "impersonate uids/ u1", "impersonate groups/ a"]
        );
        let Check::Ask { attrs: g, .. } = &ms[1].checks[2] else { panic!() };
        assert_eq!(g.group, "");

        // Many groups or extra values: a wildcard first.
        w.groups = (0..4).map(|i| format!("g{i}")).collect();
        w.extra.insert("example.com/more".into(), vec!["3".into(), "4".into()]);
        let m = &modes(&w, &UserInfo::default(), Some(&list_pods()))[0];
        assert!(m.checks.contains(&Check::Wildcard {
            attrs: attrs(GROUP, "impersonate:user-info", "groups", "*"),
            skip: 4
        }));
        assert!(m.checks.iter().any(|c| matches!(c, Check::Wildcard { attrs, skip: 4 }
            if attrs.resource == "userextras" && attrs.subresource == "*" && attrs.name == "*")));
    }

    #[test]
    fn constrained_impersonation_refuses_what_legacy_allows() {
        let refusal = |w: &Wanted| {
            modes(w, &UserInfo::default(), Some(&list_pods()))[0].checks.iter().find_map(|c| match c {
                Check::Refuse { reason, .. } => Some(reason.clone()),
                _ => None,
            })
        };
        let with_groups =
            |g: &[&str]| Wanted { groups: g.iter().map(|s| s.to_string()).collect(), ..wanted("bob") };
        assert_eq!(
            refusal(&with_groups(&["a", ""])).as_deref(),
            Some("impersonating the empty string group is not allowed")
        );
        assert_eq!(
            refusal(&with_groups(&["system:masters"])).as_deref(),
            Some("impersonating the system:masters group is not allowed")
        );
        let with_extra = |k: &str, v: &[&str]| Wanted {
            extra: [(k.to_string(), v.iter().map(|s| s.to_string()).collect())].into(),
            ..wanted("bob")
        };
        assert_eq!(refusal(&with_extra("example.com/a", &["1"])), None);
        assert_eq!(
            refusal(&with_extra("scopes", &["1"])).as_deref(),
            Some(
                "impersonating an invalid key in extra is not allowed: extra.key: Invalid value: \"scopes\": \
                 must be a domain-prefixed path (such as \"acme.io/foo\")"
            )
        );
        assert!(refusal(&with_extra("Example.com/a", &["1"]))
            .unwrap()
            .contains("a lowercase RFC 1123 subdomain"));
        assert_eq!(
            refusal(&with_extra("example.com/A", &["1"])).as_deref(),
            Some("impersonating a non-lowercase key in extra is not allowed: \"example.com/A\"")
        );
        assert_eq!(
            refusal(&with_extra("example.com/a", &[""])).as_deref(),
            Some("impersonating the empty string value in extra is not allowed")
        );
        assert_eq!(
            refusal(&with_extra("example.com/a b", &["1"])).as_deref(),
            Some(
                "impersonating an invalid key in extra is not allowed: extra.key: Invalid value: \"a b\": \
                 Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')"
            )
        );
        // Both halves wrong: both errors, aggregated.
        assert!(refusal(&with_extra("Ex/a b", &["1"]))
            .unwrap()
            .contains(": [extra.key: Invalid value: \"Ex\": "));
        // Legacy refuses none of them without asking.
        let w = with_groups(&["system:masters", ""]);
        let legacy = modes(&w, &UserInfo::default(), Some(&list_pods())).pop().unwrap();
        assert!(legacy.checks.iter().all(|c| matches!(c, Check::Ask { .. })));
    }
}
