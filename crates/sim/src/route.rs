//! URL → what is asked for: a discovery document, or a resource target (collection, object,
//! subresource, legacy `/watch/` prefix). Pure; called by `http`.

use super::kinds::Kinds;

/// A resource URL, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub res: usize,
    /// The namespace from the URL (`None` for cluster-wide or cluster-scoped requests).
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    /// Legacy `/api/v1/watch/…` path.
    pub force_watch: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Version,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/<g>`
    Group(String),
    /// `/api/v1` or `/apis/<g>/<v>`
    Resources(String, String),
    Health,
    Resource(Target),
    /// Known group/version, unknown resource: 404 Status.
    NoSuchResource,
    /// Unknown path: plain-text `404 page not found`.
    PageNotFound,
}

/// Routes the decoded path (Go's `req.URL.Path`), split on every `/`: an encoded `/` (`%2F`)
/// separates segments, as in the apiserver's routing.
pub fn route(kinds: &Kinds, path: &str) -> Route {
    let path = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    let segs: Vec<&str> = path.trim_start_matches('/').trim_end_matches('/').split('/').collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz"] | ["readyz"] | ["livez"] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["api", "v1"] => Route::Resources(String::new(), "v1".into()),
        ["api", "v1", rest @ ..] => resource(kinds, "", "v1", rest),
        ["apis", g] if kinds.groups().iter().any(|(kg, _)| kg == g) => Route::Group((*g).into()),
        ["apis", g, v] if kinds.groups().contains(&(*g, *v)) => Route::Resources((*g).into(), (*v).into()),
        ["apis", g, v, rest @ ..] if kinds.groups().contains(&(*g, *v)) => resource(kinds, g, v, rest),
        _ => Route::PageNotFound,
    }
}

fn resource(kinds: &Kinds, group: &str, version: &str, rest: &[&str]) -> Route {
    let (force_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let find = |r: &str| kinds.find(group, version, r);
    let namespaced = |i: usize| kinds.kind(i).namespaced;
    let t = |res, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| {
        Route::Resource(Target {
            res,
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
            sub: sub.map(str::to_owned),
            force_watch,
        })
    };
    let is_ns = |s: &str| s == "namespaces";
    let has_sub = |i: usize, sub: &str| kinds.all[i].subresources.contains(&sub);
    match rest {
        [r] => find(r).map_or(Route::NoSuchResource, |i| t(i, None, None, None)),
        // `namespaces/<ns>/<resource>` wins over `<cluster resource>/<name>/<sub>`.
        [n, ns, r] if is_ns(n) && find(r).is_some_and(namespaced) => {
            t(find(r).unwrap_or(0), Some(ns), None, None)
        }
        [n, _, r] if is_ns(n) && find(r).is_some() => Route::NoSuchResource,
        [r, name] => match find(r) {
            Some(i) if !namespaced(i) => t(i, None, Some(name), None),
            _ => Route::NoSuchResource,
        },
        [r, name, sub] => match find(r) {
            Some(i) if !namespaced(i) && has_sub(i, sub) => t(i, None, Some(name), Some(sub)),
            _ => Route::NoSuchResource,
        },
        [n, ns, r, name] if is_ns(n) => match find(r) {
            Some(i) if namespaced(i) => t(i, Some(ns), Some(name), None),
            _ => Route::NoSuchResource,
        },
        [n, ns, r, name, sub] if is_ns(n) => match find(r) {
            Some(i) if namespaced(i) && has_sub(i, sub) => t(i, Some(ns), Some(name), Some(sub)),
            _ => Route::NoSuchResource,
        },
        _ => Route::NoSuchResource,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(
        k: &Kinds,
        res: &str,
        ns: Option<&str>,
        name: Option<&str>,
        sub: Option<&str>,
        w: bool,
    ) -> Route {
        Route::Resource(Target {
            res: k.by_name(res).unwrap(),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
            sub: sub.map(Into::into),
            force_watch: w,
        })
    }

    #[test]
    fn routes_like_the_apiserver() {
        let k = Kinds::builtin();
        assert_eq!(route(&k, "/api/v1/configmaps"), target(&k, "configmaps", None, None, None, false));
        assert_eq!(
            route(&k, "/api/v1/namespaces/a/configmaps"),
            target(&k, "configmaps", Some("a"), None, None, false)
        );
        assert_eq!(route(&k, "/api/v1/namespaces/a"), target(&k, "namespaces", None, Some("a"), None, false));
        assert_eq!(
            route(&k, "/api/v1/namespaces/a/status"),
            target(&k, "namespaces", None, Some("a"), Some("status"), false)
        );
        assert_eq!(
            route(&k, "/api/v1/watch/namespaces/a/pods/p"),
            target(&k, "pods", Some("a"), Some("p"), None, true)
        );
        assert_eq!(
            route(&k, "/api/v1/namespaces/a/pods/p/log"),
            target(&k, "pods", Some("a"), Some("p"), Some("log"), false)
        );
        assert_eq!(
            route(&k, "/apis/apps/v1/deployments"),
            target(&k, "apps/deployments", None, None, None, false)
        );
        assert_eq!(route(&k, "/api/v1/namespaces/default/nodes"), Route::NoSuchResource);
        assert_eq!(route(&k, "/api/v1/namespaces/a/nosuchresources"), Route::NoSuchResource);
        assert_eq!(route(&k, "/apis/nosuch.example.com/v1/widgets"), Route::PageNotFound);
        assert_eq!(route(&k, "/apis/apps"), Route::Group("apps".into()));
        assert_eq!(route(&k, "/api/v1"), Route::Resources(String::new(), "v1".into()));
        // The decoded path is routed: `%2F` separates, other escapes are their characters.
        assert_eq!(
            route(&k, "/api/v1/namespaces/a%2Fpods%2Fp/log"),
            target(&k, "pods", Some("a"), Some("p"), Some("log"), false)
        );
        assert_eq!(
            route(&k, "/%61pi/v1/namespaces/a/configmaps"),
            target(&k, "configmaps", Some("a"), None, None, false)
        );
    }
}
