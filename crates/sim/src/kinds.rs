//! The resources the simulated apiserver serves, and how URLs and the direct write API name
//! them.
//!
//! Used by every other `sim` file: `store` keeps one object map per entry of [`Kinds`],
//! `http` resolves URLs with [`Kinds::find`], `discovery` lists them.

use kube_watchcache::resource::ResourceKind;

/// One served resource: its kind plus what discovery says about it.
#[derive(Clone, Debug)]
pub struct Served {
    pub kind: ResourceKind,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    /// Subresources listed in discovery (`pods/log`, `deployments/status`, …).
    pub subresources: &'static [&'static str],
}

/// The fixed table of served resources; an index into it names a resource everywhere in `sim`.
#[derive(Clone, Debug)]
pub struct Kinds {
    pub all: Vec<Served>,
}

/// The widget CRD's group (a `CustomResourceDefinition` would be `widgets.example.com`).
pub const WIDGET_GROUP: &str = "example.com";

/// Gateway API's group: custom resources although the group ends in `.k8s.io`.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

impl Kinds {
    pub fn builtin() -> Kinds {
        let r = |group, version, resource, kind, namespaced, builtin, singular, short_names, subresources| {
            Served {
                kind: ResourceKind::new(group, version, resource, kind, namespaced, builtin),
                singular,
                short_names,
                subresources,
            }
        };
        Kinds {
            all: vec![
                r(
                    "",
                    "v1",
                    "pods",
                    "Pod",
                    true,
                    true,
                    "pod",
                    &["po"],
                    &["log", "exec", "attach", "status", "binding"],
                ),
                r("", "v1", "nodes", "Node", false, true, "node", &["no"], &["status"]),
                r("", "v1", "namespaces", "Namespace", false, true, "namespace", &["ns"], &["status"]),
                r("", "v1", "configmaps", "ConfigMap", true, true, "configmap", &["cm"], &[]),
                r("", "v1", "secrets", "Secret", true, true, "secret", &[], &[]),
                r("", "v1", "services", "Service", true, true, "service", &["svc"], &["status"]),
                r(
                    "",
                    "v1",
                    "persistentvolumeclaims",
                    "PersistentVolumeClaim",
                    true,
                    true,
                    "persistentvolumeclaim",
                    &["pvc"],
                    &["status"],
                ),
                r(
                    "",
                    "v1",
                    "persistentvolumes",
                    "PersistentVolume",
                    false,
                    true,
                    "persistentvolume",
                    &["pv"],
                    &["status"],
                ),
                r("", "v1", "events", "Event", true, true, "event", &["ev"], &[]),
                r(
                    "apps",
                    "v1",
                    "deployments",
                    "Deployment",
                    true,
                    true,
                    "deployment",
                    &["deploy"],
                    &["status"],
                ),
                r("batch", "v1", "jobs", "Job", true, true, "job", &[], &["status"]),
                r("coordination.k8s.io", "v1", "leases", "Lease", true, true, "lease", &[], &[]),
                r(
                    "discovery.k8s.io",
                    "v1",
                    "endpointslices",
                    "EndpointSlice",
                    true,
                    true,
                    "endpointslice",
                    &[],
                    &[],
                ),
                r(WIDGET_GROUP, "v1", "widgets", "Widget", true, false, "widget", &[], &["status"]),
                // A custom resource in a `*.k8s.io` group (Gateway API is a CRD).
                r(GATEWAY_GROUP, "v1", "gateways", "Gateway", true, false, "gateway", &["gtw"], &["status"]),
            ],
        }
    }

    /// The resource served at `group`/`version`/`resource`.
    pub fn find(&self, group: &str, version: &str, resource: &str) -> Option<usize> {
        self.all
            .iter()
            .position(|s| s.kind.group == group && s.kind.version == version && s.kind.resource == resource)
    }

    /// Resolves the direct API's names: `"pods"`, `"apps/deployments"`,
    /// `"example.com/widgets"` (a version segment, `"apps/v1/deployments"`, is accepted too).
    pub fn by_name(&self, name: &str) -> Option<usize> {
        let parts: Vec<&str> = name.split('/').collect();
        let (group, resource) = match parts.as_slice() {
            [r] => ("", *r),
            [g, r] => (*g, *r),
            [g, _v, r] => (*g, *r),
            _ => return None,
        };
        let group = if group == "core" { "" } else { group };
        self.all.iter().position(|s| s.kind.group == group && s.kind.resource == resource)
    }

    /// API groups other than core, in the order discovery lists them.
    pub fn groups(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for s in &self.all {
            let gv = (s.kind.group.as_str(), s.kind.version.as_str());
            if !gv.0.is_empty() && !out.contains(&gv) {
                out.push(gv);
            }
        }
        out
    }

    pub fn kind(&self, i: usize) -> &ResourceKind {
        &self.all[i].kind
    }

    pub fn namespaces(&self) -> usize {
        self.all.iter().position(|s| s.kind.group.is_empty() && s.kind.resource == "namespaces").unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_direct_names() {
        let k = Kinds::builtin();
        assert_eq!(k.kind(k.by_name("pods").unwrap()).kind, "Pod");
        assert_eq!(k.kind(k.by_name("apps/deployments").unwrap()).kind, "Deployment");
        assert_eq!(k.kind(k.by_name("example.com/widgets").unwrap()).kind, "Widget");
        assert!(k.by_name("nosuch").is_none());
        assert_eq!(k.find("batch", "v1", "jobs"), k.by_name("batch/jobs"));
        assert_eq!(
            k.groups(),
            vec![
                ("apps", "v1"),
                ("batch", "v1"),
                ("coordination.k8s.io", "v1"),
                ("discovery.k8s.io", "v1"),
                ("example.com", "v1"),
                (GATEWAY_GROUP, "v1")
            ]
        );
    }
}
