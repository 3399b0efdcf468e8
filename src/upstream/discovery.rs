//! Discovery: which version, kind and scope each wanted resource has on the upstream.
//!
//! Called by `caches` at startup and at each rediscovery with the configured resources
//! ("pods", "apps/deployments", "example.com/widgets"), or, for the wildcard `*`, for every
//! resource the upstream serves ([`Round::everything`]). Uses the plain discovery documents
//! (`/api/v1`, `/apis`, `/apis/<group>/<version>`), not the aggregated v2 form, so it works on
//! every apiserver; a [`Round`] fetches each document once.

use std::collections::HashMap;

use serde::Deserialize;

use super::{Upstream, UpstreamError};
use crate::resource::ResourceKind;

/// `APIResourceList`, only what discovery needs.
#[derive(Deserialize)]
pub(crate) struct ApiResourceList {
    #[serde(default)]
    pub resources: Vec<ApiResource>,
}

#[derive(Deserialize, Clone)]
pub(crate) struct ApiResource {
    pub name: String,
    #[serde(default)]
    pub namespaced: bool,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub verbs: Vec<String>,
}

/// `APIGroupList`, only what discovery needs.
#[derive(Deserialize)]
pub(crate) struct ApiGroupList {
    #[serde(default)]
    pub groups: Vec<ApiGroup>,
}

#[derive(Deserialize)]
pub(crate) struct ApiGroup {
    pub name: String,
    #[serde(default)]
    pub versions: Vec<GroupVersion>,
    #[serde(default, rename = "preferredVersion")]
    pub preferred_version: Option<GroupVersion>,
}

#[derive(Deserialize, Clone)]
pub(crate) struct GroupVersion {
    pub version: String,
}

/// Splits `"apps/deployments"` into `("apps", "deployments")`; `"pods"` is the core group.
pub(crate) fn split_wanted(wanted: &str) -> Result<(&str, &str), UpstreamError> {
    crate::wanted::group_resource(wanted).ok_or_else(|| {
        UpstreamError::Discovery(format!("\"{wanted}\" is not a resource name (want \"group/resource\")"))
    })
}

/// Custom resources must have a dot in their group, so a dotless group is built in. A dotted
/// group may be either (`networking.k8s.io` is built in, `gateway.networking.k8s.io` a CRD):
/// [`Upstream::discover`] asks the upstream's own list encoding ([`list_is_typed`]).
pub(crate) fn is_builtin(group: &str) -> bool {
    !group.contains('.')
}

/// Whether a LIST body is in the typed encoding of built-in (and aggregated) APIs, which starts
/// with `"kind"`, rather than the unstructured encoding of custom resources, whose keys are
/// sorted (`"apiVersion"` first). `None` when the body is neither.
pub(crate) fn list_is_typed(body: &[u8]) -> Option<bool> {
    let rest = std::str::from_utf8(body).ok()?.trim_start().strip_prefix('{')?.trim_start();
    if rest.starts_with("\"kind\"") {
        Some(true)
    } else if rest.starts_with("\"apiVersion\"") {
        Some(false)
    } else {
        None
    }
}

/// The versions to look in for `group`: the preferred one first, then the others as listed.
pub(crate) fn group_versions(groups: &ApiGroupList, group: &str) -> Option<Vec<String>> {
    let g = groups.groups.iter().find(|g| g.name == group)?;
    let mut out: Vec<String> = g.preferred_version.iter().map(|v| v.version.clone()).collect();
    for v in &g.versions {
        if !out.contains(&v.version) {
            out.push(v.version.clone());
        }
    }
    Some(out)
}

/// Finds `resource` in one version's resource list; subresources (`pods/log`) never match.
/// `Ok(None)` when absent; an error when present but not both listable and watchable.
pub(crate) fn find_resource(
    list: &ApiResourceList,
    group: &str,
    version: &str,
    resource: &str,
    wanted: &str,
) -> Result<Option<ResourceKind>, UpstreamError> {
    let Some(r) = list.resources.iter().find(|r| r.name == resource) else {
        return Ok(None);
    };
    let missing: Vec<&str> =
        ["list", "watch"].into_iter().filter(|v| !r.verbs.iter().any(|x| x == v)).collect();
    if !missing.is_empty() {
        return Err(UpstreamError::Discovery(format!(
            "resource \"{wanted}\" cannot be cached: its verbs lack {}",
            missing.join(" and ")
        )));
    }
    Ok(Some(ResourceKind::new(group, version, resource, &r.kind, r.namespaced, is_builtin(group))))
}

/// What a wildcard discovery found: the resources to cache (named `group/resource`, `resource`
/// for the core group) and those skipped, with why (forbidden to list, aggregated API…).
#[derive(Debug, Default)]
pub struct Everything {
    pub kinds: Vec<(String, ResourceKind)>,
    pub skipped: Vec<Skipped>,
    /// `(group, version)`s the upstream lists but whose discovery document this round could
    /// not read (a 429 under APF, a 5xx, a 404 from a replica still registering its CRDs): what
    /// is cached in them stays as it is (a review: their caches were retired, every watch of
    /// them ended, and cached anew cold by the next round).
    pub unread: Vec<(String, String)>,
}

/// A resource a wildcard does not cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub name: String,
    pub reason: SkipReason,
    pub detail: String,
}

/// Why a discovered resource is not cached (a bounded metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SkipReason {
    /// Its LIST answered 403: the proxy's account may not list it.
    Forbidden,
    /// Served by an aggregated API server (an APIService with a service): the apiserver does
    /// not cache those either; requests are forwarded.
    Aggregated,
    /// Its group's discovery document or its LIST failed for another reason.
    Failed,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Forbidden => "forbidden",
            SkipReason::Aggregated => "aggregated",
            SkipReason::Failed => "failed",
        }
    }
}

/// `APIServiceList`, only whether each group/version is served by another server.
#[derive(Deserialize)]
struct ApiServiceList {
    #[serde(default)]
    items: Vec<ApiService>,
}

#[derive(Deserialize)]
struct ApiService {
    #[serde(default)]
    spec: ApiServiceSpec,
}

#[derive(Deserialize, Default)]
struct ApiServiceSpec {
    #[serde(default)]
    group: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    service: Option<serde_json::Value>,
}

/// The name a wildcard gives a discovered resource: `group/resource`, or `resource` in core.
pub fn name_of(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{group}/{resource}")
    }
}

/// One round of discovery: each document is fetched at most once, however many resources are
/// resolved in the round (rediscovery asks for `/apis` once, not once per cached resource).
pub struct Round<'a> {
    up: &'a Upstream,
    groups: Option<ApiGroupList>,
    lists: HashMap<String, ApiResourceList>,
}

impl<'a> Round<'a> {
    pub fn new(up: &'a Upstream) -> Round<'a> {
        Round { up, groups: None, lists: HashMap::new() }
    }

    async fn groups(&mut self) -> Result<&ApiGroupList, UpstreamError> {
        if self.groups.is_none() {
            self.groups = Some(self.up.get_doc("/apis").await?);
        }
        self.groups.as_ref().ok_or_else(|| UpstreamError::Decode("no /apis document".into()))
    }

    async fn list(&mut self, path: &str) -> Result<&ApiResourceList, UpstreamError> {
        if !self.lists.contains_key(path) {
            let doc = self.up.get_doc(path).await?;
            self.lists.insert(path.to_owned(), doc);
        }
        self.lists.get(path).ok_or_else(|| UpstreamError::Decode(format!("no {path} document")))
    }

    /// The preferred version's [`ResourceKind`] of one wanted "group/resource". A resource
    /// that is unknown, or that cannot be listed and watched, is an error naming it.
    pub async fn resolve(&mut self, w: &str) -> Result<ResourceKind, UpstreamError> {
        let kind = self.locate(w).await?;
        self.probe(w, kind).await
    }

    /// Whether the upstream still serves `known` (a cached resource) the same way, from the
    /// discovery documents only (no probe LIST: a periodic rediscovery of N cached resources
    /// costs the round's documents, not N LISTs). `Ok(None)`: unchanged.
    pub async fn recheck(
        &mut self,
        w: &str,
        known: &ResourceKind,
    ) -> Result<Option<ResourceKind>, UpstreamError> {
        let mut now = self.locate(w).await?;
        now.builtin = known.builtin;
        if &now == known {
            return Ok(None);
        }
        self.probe(w, now).await.map(Some)
    }

    /// `resolve` without the probe LIST.
    async fn locate(&mut self, w: &str) -> Result<ResourceKind, UpstreamError> {
        let (group, resource) = split_wanted(w.trim())?;
        let versions = if group.is_empty() {
            vec!["v1".to_owned()]
        } else {
            group_versions(self.groups().await?, group).ok_or_else(|| {
                UpstreamError::Discovery(format!(
                    "resource \"{w}\": the upstream serves no API group \"{group}\""
                ))
            })?
        };
        let mut found = None;
        for version in &versions {
            let path =
                if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
            found = find_resource(self.list(&path).await?, group, version, resource, w)?;
            if found.is_some() {
                break;
            }
        }
        found.ok_or_else(|| {
            UpstreamError::Discovery(format!(
                "resource \"{w}\" not found on the upstream (looked in {})",
                versions
                    .iter()
                    .map(|v| if group.is_empty() { v.clone() } else { format!("{group}/{v}") })
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    /// A one-item LIST: a resource named explicitly that the proxy may not list cannot be
    /// cached (a configuration error, not something to retry); for a dotted group it also
    /// tells a built-in encoding from a custom resource's.
    async fn probe(&mut self, w: &str, mut kind: ResourceKind) -> Result<ResourceKind, UpstreamError> {
        let group = kind.group.clone();
        let group = group.as_str();
        match self.up.typed_encoding(&kind).await {
            Ok(typed) if !is_builtin(group) => kind.builtin = typed,
            Ok(_) => {}
            Err(UpstreamError::Status { code: 403, status, body }) => {
                let e = UpstreamError::Status { code: 403, status, body };
                return Err(UpstreamError::Discovery(format!(
                    "resource \"{w}\" cannot be cached: the proxy may not list it ({e}); grant list and watch on it, or remove it from --resources"
                )));
            }
            // A built-in's encoding is known: any other failure (the upstream erring or busy)
            // is the reflector's to retry, as it was before the probe existed.
            Err(e) if is_builtin(group) => {
                tracing::warn!(resource = %w, error = %e, "cannot probe the list of a cached resource; its reflector retries");
            }
            Err(e) => return Err(e),
        }
        Ok(kind)
    }

    /// Every resource the upstream serves itself (not through an aggregated API server) that can
    /// be listed and watched, at the first version of its group that lists it (the preferred one
    /// first), less `excluded`; subresources never. Each is tried with a one-item LIST (which also tells a dotted group's built-in
    /// encoding from a custom resource's) unless it is among `known` (cached already): one the
    /// proxy may not list is skipped, as is one whose group cannot be read.
    pub async fn everything(
        &mut self,
        excluded: &(dyn Fn(&str, &str) -> bool + Sync),
        known: &[ResourceKind],
    ) -> Result<Everything, UpstreamError> {
        let aggregated = self.up.aggregated().await?;
        let mut gvs: Vec<(String, String)> = vec![(String::new(), "v1".to_owned())];
        let groups = self.groups().await?;
        for g in &groups.groups {
            for v in group_versions(groups, &g.name).unwrap_or_default() {
                gvs.push((g.name.clone(), v));
            }
        }
        let mut out = Everything::default();
        // (group, resource) already placed: a resource is cached at the first version listing
        // it, the preferred one first.
        let mut seen: std::collections::HashSet<(String, String)> = Default::default();
        for (group, version) in gvs {
            let agg = aggregated.contains(&(group.clone(), version.clone()));
            let path =
                if group.is_empty() { "/api/v1".to_owned() } else { format!("/apis/{group}/{version}") };
            let resources: Vec<ApiResource> = match self.list(&path).await {
                Ok(l) => l.resources.to_vec(),
                Err(e @ UpstreamError::Transport(_)) => return Err(e),
                Err(e) => {
                    let reason = if agg { SkipReason::Aggregated } else { SkipReason::Failed };
                    if !agg {
                        out.unread.push((group.clone(), version.clone()));
                    }
                    out.skipped.push(Skipped {
                        name: format!("{group}/{version}"),
                        reason,
                        detail: e.to_string(),
                    });
                    continue;
                }
            };
            for r in resources {
                let cacheable =
                    !r.name.contains('/') && ["list", "watch"].iter().all(|v| r.verbs.iter().any(|x| x == v));
                if !cacheable || excluded(&group, &r.name) || !seen.insert((group.clone(), r.name.clone())) {
                    continue;
                }
                let name = name_of(&group, &r.name);
                if agg {
                    let detail = format!("served by an aggregated API server ({group}/{version})");
                    out.skipped.push(Skipped { name, reason: SkipReason::Aggregated, detail });
                    continue;
                }
                let mut kind =
                    ResourceKind::new(&group, &version, &r.name, &r.kind, r.namespaced, is_builtin(&group));
                // Cached already (same version, kind, scope): it could be listed, and its
                // encoding is known; no LIST again.
                if let Some(k) = known.iter().find(|k| {
                    (&k.group, &k.version, &k.resource, &k.kind, k.namespaced)
                        == (&kind.group, &kind.version, &kind.resource, &kind.kind, kind.namespaced)
                }) {
                    out.kinds.push((name, k.clone()));
                    continue;
                }
                match self.up.typed_encoding(&kind).await {
                    Ok(typed) => {
                        if !is_builtin(&group) {
                            kind.builtin = typed;
                        }
                        out.kinds.push((name, kind));
                    }
                    Err(e @ UpstreamError::Transport(_)) => return Err(e),
                    Err(UpstreamError::Status { code: 404, .. }) => {} // gone meanwhile
                    Err(e) => {
                        let reason = match e {
                            UpstreamError::Status { code: 403, .. } => SkipReason::Forbidden,
                            _ => SkipReason::Failed,
                        };
                        out.skipped.push(Skipped { name, reason, detail: e.to_string() });
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Upstream {
    /// For each wanted "group/resource", the preferred version's [`ResourceKind`]. A resource
    /// that is unknown, or that cannot be listed and watched, is an error naming it.
    pub async fn discover(&self, wanted: &[String]) -> Result<Vec<ResourceKind>, UpstreamError> {
        let mut round = Round::new(self);
        let mut out = Vec::with_capacity(wanted.len());
        for w in wanted {
            out.push(round.resolve(w).await?);
        }
        Ok(out)
    }

    /// The group/versions served by aggregated API servers (APIServices with a `service`),
    /// from `apiregistration.k8s.io`. Empty when the proxy may not read them or the upstream
    /// has none (403, 404; logged): then nothing is known to be aggregated, and an aggregated
    /// resource that can be listed and watched would be cached through the apiserver's
    /// proxying. Any other failure (a 5xx, a 429, a timeout) fails the round, which changes
    /// nothing: a passing failure must not let the round cache an aggregated resource, whose
    /// server may filter what each requester sees.
    async fn aggregated(&self) -> Result<std::collections::HashSet<(String, String)>, UpstreamError> {
        match self.get_doc::<ApiServiceList>("/apis/apiregistration.k8s.io/v1/apiservices").await {
            Ok(l) => Ok(l
                .items
                .into_iter()
                .filter(|a| a.spec.service.as_ref().is_some_and(|s| !s.is_null()))
                .map(|a| (a.spec.group, a.spec.version))
                .collect()),
            Err(e @ UpstreamError::Status { code: 403 | 404, .. }) => {
                tracing::warn!(error = %e, "cannot list APIServices: aggregated APIs cannot be told apart (grant list on apiregistration.k8s.io/apiservices)");
                Ok(Default::default())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the upstream encodes `kind` typed (built in) or unstructured (a custom resource),
    /// from the shape of a one-item LIST.
    async fn typed_encoding(&self, kind: &ResourceKind) -> Result<bool, UpstreamError> {
        let body = self.get_json(&format!("{}?limit=1", kind.collection_path(None))).await?;
        list_is_typed(&body).ok_or_else(|| {
            UpstreamError::Decode(format!(
                "the list of {} is neither a typed nor an unstructured list",
                kind.group_resource()
            ))
        })
    }

    async fn get_doc<T: for<'de> Deserialize<'de>>(&self, path: &str) -> Result<T, UpstreamError> {
        let body = self.get_json(path).await?;
        serde_json::from_slice(&body)
            .map_err(|e| UpstreamError::Decode(format!("discovery document {path}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wanted_names() {
        assert_eq!(split_wanted("pods").unwrap(), ("", "pods"));
        assert_eq!(split_wanted("apps/deployments").unwrap(), ("apps", "deployments"));
        assert_eq!(split_wanted("example.com/widgets").unwrap(), ("example.com", "widgets"));
        for bad in ["", "/pods", "apps/", "apps/v1/deployments"] {
            assert!(matches!(split_wanted(bad), Err(UpstreamError::Discovery(_))), "{bad}");
        }
    }

    #[test]
    fn dotless_groups_are_built_in_dotted_ones_are_asked() {
        for g in ["", "apps", "batch"] {
            assert!(is_builtin(g), "{g}");
        }
        // Dotted groups are decided by the upstream's list encoding, not their name.
        for g in ["networking.k8s.io", "gateway.networking.k8s.io", "example.com"] {
            assert!(!is_builtin(g), "{g}");
        }
    }

    #[test]
    fn list_encoding_tells_built_in_from_custom() {
        // Typed (recorded from a real apiserver: networking.k8s.io ingresses).
        let typed = br#"{"kind":"IngressList","apiVersion":"networking.k8s.io/v1","metadata":{"resourceVersion":"5"},"items":[]}"#;
        assert_eq!(list_is_typed(typed), Some(true));
        // Unstructured (a CRD's list: keys sorted).
        let custom = br#" {"apiVersion":"gateway.networking.k8s.io/v1","items":[],"kind":"GatewayList","metadata":{"continue":"","resourceVersion":"5"}}"#;
        assert_eq!(list_is_typed(custom), Some(false));
        for bad in [&b""[..], b"[]", b"{}", br#"{"items":[]}"#, b"\xff"] {
            assert_eq!(list_is_typed(bad), None);
        }
    }

    #[test]
    fn preferred_version_first_then_others() {
        let groups: ApiGroupList = serde_json::from_str(
            r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"autoscaling",
            "versions":[{"groupVersion":"autoscaling/v2","version":"v2"},{"groupVersion":"autoscaling/v1","version":"v1"}],
            "preferredVersion":{"groupVersion":"autoscaling/v2","version":"v2"}}]}"#,
        )
        .unwrap();
        assert_eq!(group_versions(&groups, "autoscaling").unwrap(), ["v2", "v1"]);
        assert!(group_versions(&groups, "apps").is_none());
    }

    #[test]
    fn subresources_and_verbs() {
        let list: ApiResourceList = serde_json::from_str(
            r#"{"resources":[
              {"name":"pods","singularName":"pod","namespaced":true,"kind":"Pod","verbs":["create","delete","get","list","watch"]},
              {"name":"pods/log","singularName":"","namespaced":true,"kind":"Pod","verbs":["get"]},
              {"name":"bindings","singularName":"binding","namespaced":true,"kind":"Binding","verbs":["create"]}]}"#,
        )
        .unwrap();
        let pods = find_resource(&list, "", "v1", "pods", "pods").unwrap().unwrap();
        assert_eq!(pods, ResourceKind::new("", "v1", "pods", "Pod", true, true));
        assert!(find_resource(&list, "", "v1", "log", "log").unwrap().is_none());
        let e = find_resource(&list, "", "v1", "bindings", "bindings").unwrap_err().to_string();
        assert_eq!(e, "discovery: resource \"bindings\" cannot be cached: its verbs lack list and watch");
    }
}
