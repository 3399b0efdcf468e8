//! Discovery: which version, kind and scope each wanted resource has on the upstream.
//!
//! Called once by `app` at startup with the configured resources ("pods", "apps/deployments",
//! "example.com/widgets"). Uses the plain discovery documents (`/api/v1`, `/apis`,
//! `/apis/<group>/<version>`), not the aggregated v2 form, so it works on every apiserver.

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

#[derive(Deserialize)]
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
    let bad =
        || UpstreamError::Discovery(format!("\"{wanted}\" is not a resource name (want \"group/resource\")"));
    let (group, resource) = match wanted.split_once('/') {
        Some((g, r)) => (g, r),
        None => ("", wanted),
    };
    if resource.is_empty() || resource.contains('/') || (wanted.contains('/') && group.is_empty()) {
        return Err(bad());
    }
    Ok((group, resource))
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

impl Upstream {
    /// For each wanted "group/resource", the preferred version's [`ResourceKind`]. A resource
    /// that is unknown, or that cannot be listed and watched, is an error naming it.
    pub async fn discover(&self, wanted: &[String]) -> Result<Vec<ResourceKind>, UpstreamError> {
        let mut groups: Option<ApiGroupList> = None;
        let mut lists: HashMap<String, ApiResourceList> = HashMap::new();
        let mut out = Vec::with_capacity(wanted.len());
        for w in wanted {
            let (group, resource) = split_wanted(w.trim())?;
            let versions = if group.is_empty() {
                vec!["v1".to_owned()]
            } else {
                if groups.is_none() {
                    groups = Some(self.get_doc("/apis").await?);
                }
                groups.as_ref().and_then(|g| group_versions(g, group)).ok_or_else(|| {
                    UpstreamError::Discovery(format!(
                        "resource \"{w}\": the upstream serves no API group \"{group}\""
                    ))
                })?
            };
            let mut found = None;
            for version in &versions {
                let path = if group.is_empty() {
                    format!("/api/{version}")
                } else {
                    format!("/apis/{group}/{version}")
                };
                if !lists.contains_key(&path) {
                    let doc = self.get_doc(&path).await?;
                    lists.insert(path.clone(), doc);
                }
                if let Some(list) = lists.get(&path) {
                    found = find_resource(list, group, version, resource, w)?;
                }
                if found.is_some() {
                    break;
                }
            }
            if let Some(kind) = found.as_mut().filter(|_| !is_builtin(group)) {
                kind.builtin = self.typed_encoding(kind).await?;
            }
            out.push(found.ok_or_else(|| {
                UpstreamError::Discovery(format!(
                    "resource \"{w}\" not found on the upstream (looked in {})",
                    versions
                        .iter()
                        .map(|v| if group.is_empty() { v.clone() } else { format!("{group}/{v}") })
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?);
        }
        Ok(out)
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
