//! The sim's Node authorizer: what a Kubernetes 1.34 apiserver run with
//! `--authorization-mode=Node,RBAC` (AuthorizeNodeWithSelectors on, its default since 1.32)
//! decides for kubelets, so that the sim's users get the answers a real cluster gives.
//!
//! Sources (kubernetes/kubernetes, v1.34):
//! - plugin/pkg/auth/authorizer/node/node_authorizer.go — `NodeAuthorizer.Authorize` and its
//!   `authorize*` helpers, with their reasons, copied below;
//! - pkg/auth/nodeidentifier/default.go — who is a node: a user named `system:node:<name>` in
//!   group `system:nodes`;
//! - plugin/pkg/auth/authorizer/node/graph_populator.go and pkg/api/v1/pod/util.go
//!   (`VisitPodSecretNames`, `VisitPodConfigmapNames`) — the graph: node ← pod ← secret /
//!   configmap / persistentvolumeclaim ← persistentvolume, pod ← serviceaccount;
//! - plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go `NodeRules` — the static rules
//!   for everything the authorizer does not subdivide (a subset: the ones kubelets and the
//!   tests here use; listed in `static_rules`);
//! - https://kubernetes.io/docs/reference/access-authn-authz/node/ — the documented behaviour.
//!
//! The graph is read on demand from the sim's store: a review reads the pods bound to the node
//! (`Store::on_node`, an index kept with every write, as the apiserver's graph is kept by its
//! informers) and follows their references. Scanning every pod per review instead saturated the
//! sim at 10 000 kubelets (20 000 pods, ~90 reviews/s: two cores, writes slowed to 5–50/s).
//!
//! Called by `review::access_review_answer` when the script enables it.

use serde_json::Value;

use super::Sim;
use kube_watchcache::resource::ObjectKey;
use kube_watchcache::selector::RawTerm;

/// The Node authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// No opinion, with the reason the apiserver would give (may be empty).
    NoOpinion(String),
}

fn no(reason: impl Into<String>) -> Decision {
    Decision::NoOpinion(reason.into())
}

/// What the review asks, as the authorizer sees it.
pub struct Request<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    /// The field selector's requirements (empty when none, or when it did not parse).
    pub fields: &'a [RawTerm],
    /// A non-resource request (the Node authorizer only looks at resource requests).
    pub non_resource: bool,
}

/// nodeidentifier: `Some(name)` for a node identity (name may be empty: an unidentifiable node).
fn node_identity<'a>(user: &'a str, groups: &[String]) -> Option<&'a str> {
    let name = user.strip_prefix("system:node:")?;
    groups.iter().any(|g| g == "system:nodes").then_some(name)
}

/// `NodeAuthorizer.Authorize`.
pub fn authorize(sim: &Sim, r: &Request<'_>) -> Decision {
    let Some(node) = node_identity(r.user, r.groups) else {
        return no("");
    };
    if node.is_empty() {
        return no(format!("unknown node for user {:?}", r.user));
    }
    if !r.non_resource {
        match (r.group, r.resource) {
            ("", "secrets") => return read_namespaced_object(sim, node, Vertex::Secret, r),
            ("", "configmaps") => return read_namespaced_object(sim, node, Vertex::ConfigMap, r),
            ("", "persistentvolumeclaims") if r.subresource == "status" => {
                return status_update(sim, node, Vertex::Pvc, r)
            }
            ("", "persistentvolumeclaims") => return get(sim, node, Vertex::Pvc, r),
            ("", "persistentvolumes") => return get(sim, node, Vertex::Pv, r),
            ("", "serviceaccounts") => return create_token(sim, node, r),
            ("coordination.k8s.io", "leases") => return lease(node, r),
            ("storage.k8s.io", "csinodes") => return csi_node(node, r),
            ("", "nodes") => return node_object(node, r),
            ("", "pods") => return pod(sim, node, r),
            _ => {}
        }
    }
    if static_rules(r) {
        Decision::Allow
    } else {
        no("")
    }
}

/// The object kinds of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Vertex {
    Pod,
    Secret,
    ConfigMap,
    Pvc,
    Pv,
    ServiceAccount,
}

fn status_update(sim: &Sim, node: &str, v: Vertex, r: &Request<'_>) -> Decision {
    if !matches!(r.verb, "update" | "patch") {
        return no("can only get/update/patch this type");
    }
    related(sim, node, v, r)
}

fn get(sim: &Sim, node: &str, v: Vertex, r: &Request<'_>) -> Decision {
    if r.verb != "get" {
        return no("can only get individual resources of this type");
    }
    if !r.subresource.is_empty() {
        return no("cannot get subresource");
    }
    related(sim, node, v, r)
}

fn read_namespaced_object(sim: &Sim, node: &str, v: Vertex, r: &Request<'_>) -> Decision {
    if !matches!(r.verb, "get" | "list" | "watch") {
        return no("can only read resources of this type");
    }
    if !r.subresource.is_empty() {
        return no("cannot read subresource");
    }
    if r.namespace.is_empty() {
        return no("can only read namespaced object of this type");
    }
    related(sim, node, v, r)
}

/// `authorize`: a named object with a path to the node in the graph.
fn related(sim: &Sim, node: &str, v: Vertex, r: &Request<'_>) -> Decision {
    if r.name.is_empty() {
        return no("No Object name found");
    }
    if has_path(sim, node, v, r.namespace, r.name) {
        Decision::Allow
    } else {
        no(format!("no relationship found between node '{node}' and this object"))
    }
}

fn create_token(sim: &Sim, node: &str, r: &Request<'_>) -> Decision {
    if r.verb != "create" || r.name.is_empty() {
        return no("can only create tokens for individual service accounts");
    }
    if r.subresource != "token" {
        return no("can only create token subresource of serviceaccount");
    }
    if has_path(sim, node, Vertex::ServiceAccount, r.namespace, r.name) {
        Decision::Allow
    } else {
        no(format!("no relationship found between node '{node}' and this object"))
    }
}

fn lease(node: &str, r: &Request<'_>) -> Decision {
    if !matches!(r.verb, "get" | "create" | "update" | "patch" | "delete") {
        return no("can only get, create, update, patch, or delete a node lease");
    }
    if r.namespace != "kube-node-lease" {
        return no("can only access leases in the \"kube-node-lease\" system namespace");
    }
    if r.verb != "create" && r.name != node {
        return no("can only access node lease with the same name as the requesting node");
    }
    Decision::Allow
}

fn csi_node(node: &str, r: &Request<'_>) -> Decision {
    if !matches!(r.verb, "get" | "create" | "update" | "patch" | "delete") {
        return no("can only get, create, update, patch, or delete a CSINode");
    }
    if !r.subresource.is_empty() {
        return no("cannot authorize CSINode subresources");
    }
    if r.verb != "create" && r.name != node {
        return no("can only access CSINode with the same name as the requesting node");
    }
    Decision::Allow
}

/// `authorizeNode` (AuthorizeNodeWithSelectors): its own Node only, compared by name (a
/// `metadata.name` field selector sets the request's name).
fn node_object(node: &str, r: &Request<'_>) -> Decision {
    match (r.subresource, r.verb) {
        ("", "create" | "update" | "patch") => Decision::Allow,
        ("", "get" | "list" | "watch") => match r.name {
            n if n == node => Decision::Allow,
            "" => no(format!("node '{node}' cannot read all nodes, only its own Node object")),
            other => no(format!("node '{node}' cannot read '{other}', only its own Node object")),
        },
        ("status", "update" | "patch") => Decision::Allow,
        _ => no(""),
    }
}

/// `authorizePod` (AuthorizeNodeWithSelectors): list / watch only with
/// `spec.nodeName=<itself>`, or a single pod related to the node.
fn pod(sim: &Sim, node: &str, r: &Request<'_>) -> Decision {
    match (r.subresource, r.verb) {
        ("", "get") => get(sim, node, Vertex::Pod, r),
        ("", "list" | "watch") => {
            if r.fields.iter().any(|t| t.field == "spec.nodeName" && t.equals && t.value == node) {
                return Decision::Allow;
            }
            if !r.name.is_empty() {
                return related(sim, node, Vertex::Pod, r);
            }
            no("can only list/watch pods with spec.nodeName field selector")
        }
        // Mirror pods; NodeRestriction admission limits them to the node's own.
        ("", "create" | "delete") => Decision::Allow,
        ("status", "update" | "patch") => Decision::Allow,
        ("eviction", "create") => Decision::Allow,
        _ => no(""),
    }
}

/// A subset of `NodeRules()` (policy.go), enough for kubelets and kube-proxy-like node users:
/// read services, endpoints and endpointslices... as listed.
fn static_rules(r: &Request<'_>) -> bool {
    let rules: &[(&[&str], &str, &[&str])] = &[
        (&["get", "list", "watch"], "", &["services"]),
        (&["create", "update", "patch"], "", &["events"]),
        (&["create", "update", "patch"], "events.k8s.io", &["events"]),
        (&["create", "get", "list", "watch"], "certificates.k8s.io", &["certificatesigningrequests"]),
        (&["create"], "authentication.k8s.io", &["tokenreviews"]),
        (&["create"], "authorization.k8s.io", &["subjectaccessreviews", "localsubjectaccessreviews"]),
        (&["get", "list", "watch"], "node.k8s.io", &["runtimeclasses"]),
        (&["get", "list", "watch"], "storage.k8s.io", &["csidrivers", "storageclasses"]),
    ];
    !r.non_resource
        && r.subresource.is_empty()
        && rules.iter().any(|(verbs, group, resources)| {
            verbs.contains(&r.verb) && *group == r.group && resources.contains(&r.resource)
        })
}

/// Whether object `v` `ns/name` has a path to `node` in the graph.
fn has_path(sim: &Sim, node: &str, v: Vertex, ns: &str, name: &str) -> bool {
    let pods = pods_on(sim, node);
    match v {
        Vertex::Pod => pods.iter().any(|p| meta(p, "namespace") == ns && meta(p, "name") == name),
        Vertex::Pv => pods.iter().any(|p| {
            pvc_names(p)
                .iter()
                .any(|claim| pvc_volume(sim, meta(p, "namespace"), claim).is_some_and(|pv| pv == name))
        }),
        _ => pods.iter().filter(|p| meta(p, "namespace") == ns).any(|p| match v {
            Vertex::Secret => secret_names(p).iter().any(|s| s == name),
            Vertex::ConfigMap => configmap_names(p).iter().any(|c| c == name),
            Vertex::Pvc => pvc_names(p).iter().any(|c| c == name),
            Vertex::ServiceAccount => p["spec"]["serviceAccountName"].as_str().unwrap_or("default") == name,
            Vertex::Pod | Vertex::Pv => false,
        }),
    }
}

fn meta<'v>(o: &'v Value, key: &str) -> &'v str {
    o["metadata"][key].as_str().unwrap_or("")
}

/// The pods bound to `node`, as JSON.
fn pods_on(sim: &Sim, node: &str) -> Vec<Value> {
    let store = sim.store();
    let Some(res) = store.kinds.by_name("pods") else { return Vec::new() };
    store
        .on_node(res, node)
        .iter()
        .filter_map(|o| serde_json::from_slice(&o.typed_chunks().concat()).ok())
        .collect()
}

/// `spec.volumeName` of a PersistentVolumeClaim.
fn pvc_volume(sim: &Sim, ns: &str, claim: &str) -> Option<String> {
    let store = sim.store();
    let res = store.kinds.by_name("persistentvolumeclaims")?;
    let o = store.get(res, &ObjectKey::new(ns, claim))?;
    let v: Value = serde_json::from_slice(&o.typed_chunks().concat()).ok()?;
    v["spec"]["volumeName"].as_str().map(str::to_owned)
}

/// Every container of a pod (init, regular, ephemeral).
fn containers(p: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |k| p["spec"][k].as_array().into_iter().flatten())
}

fn volumes(p: &Value) -> impl Iterator<Item = &Value> {
    p["spec"]["volumes"].as_array().into_iter().flatten()
}

fn push(out: &mut Vec<String>, v: &Value) {
    if let Some(s) = v.as_str().filter(|s| !s.is_empty()) {
        out.push(s.to_owned());
    }
}

/// `VisitPodSecretNames` (the volume plugins kubelets mount secrets for).
fn secret_names(p: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for s in p["spec"]["imagePullSecrets"].as_array().into_iter().flatten() {
        push(&mut out, &s["name"]);
    }
    for c in containers(p) {
        for e in c["envFrom"].as_array().into_iter().flatten() {
            push(&mut out, &e["secretRef"]["name"]);
        }
        for e in c["env"].as_array().into_iter().flatten() {
            push(&mut out, &e["valueFrom"]["secretKeyRef"]["name"]);
        }
    }
    for v in volumes(p) {
        push(&mut out, &v["secret"]["secretName"]);
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            push(&mut out, &s["secret"]["name"]);
        }
        for plugin in
            ["azureFile", "cephfs", "cinder", "flexVolume", "iscsi", "rbd", "scaleIO", "storageos", "csi"]
        {
            let refs = &v[plugin];
            push(&mut out, &refs["secretName"]);
            push(&mut out, &refs["secretRef"]["name"]);
            push(&mut out, &refs["nodePublishSecretRef"]["name"]);
        }
    }
    out
}

/// `VisitPodConfigmapNames`.
fn configmap_names(p: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for c in containers(p) {
        for e in c["envFrom"].as_array().into_iter().flatten() {
            push(&mut out, &e["configMapRef"]["name"]);
        }
        for e in c["env"].as_array().into_iter().flatten() {
            push(&mut out, &e["valueFrom"]["configMapKeyRef"]["name"]);
        }
    }
    for v in volumes(p) {
        push(&mut out, &v["configMap"]["name"]);
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            push(&mut out, &s["configMap"]["name"]);
        }
    }
    out
}

/// The claims of a pod: `persistentVolumeClaim.claimName`, and `<pod>-<volume>` for generic
/// ephemeral volumes.
fn pvc_names(p: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for v in volumes(p) {
        push(&mut out, &v["persistentVolumeClaim"]["claimName"]);
        if v.get("ephemeral").is_some_and(|e| !e.is_null()) {
            out.push(format!("{}-{}", meta(p, "name"), v["name"].as_str().unwrap_or("")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimOptions;
    use serde_json::json;

    fn cluster() -> Sim {
        let sim = Sim::new(SimOptions { objects: 0, ..SimOptions::default() });
        let _ = sim.create("namespaces", "", json!({"metadata": {"name": "ns"}}));
        let pod = |name: &str, node: &str, secret: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
                   "spec": {"nodeName": node, "serviceAccountName": format!("sa-{name}"),
                            "imagePullSecrets": [{"name": format!("pull-{name}")}],
                            "containers": [{"name": "c", "image": "i",
                                "env": [{"name": "E", "valueFrom": {"configMapKeyRef": {"name": format!("env-{name}"), "key": "k"}}}],
                                "envFrom": [{"secretRef": {"name": format!("envfrom-{name}")}}]}],
                            "volumes": [{"name": "s", "secret": {"secretName": secret}},
                                        {"name": "c", "configMap": {"name": format!("cm-{name}")}},
                                        {"name": "p", "projected": {"sources": [{"secret": {"name": format!("proj-{name}")}}]}},
                                        {"name": "d", "persistentVolumeClaim": {"claimName": format!("claim-{name}")}},
                                        {"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}})
        };
        sim.create("pods", "ns", pod("p1", "n1", "s1")).unwrap();
        sim.create("pods", "ns", pod("p2", "n2", "s2")).unwrap();
        sim.create(
            "persistentvolumeclaims",
            "ns",
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "claim-p1", "namespace": "ns"}, "spec": {"volumeName": "pv1"}}),
        )
        .unwrap();
        sim
    }

    struct Ask<'a> {
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        sub: &'a str,
        ns: &'a str,
        name: &'a str,
        fields: Vec<RawTerm>,
    }

    fn ask<'a>(verb: &'a str, resource: &'a str, ns: &'a str, name: &'a str) -> Ask<'a> {
        Ask { verb, group: "", resource, sub: "", ns, name, fields: Vec::new() }
    }

    fn decide(sim: &Sim, user: &str, groups: &[&str], a: &Ask<'_>) -> Decision {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        authorize(
            sim,
            &Request {
                user,
                groups: &groups,
                verb: a.verb,
                group: a.group,
                resource: a.resource,
                subresource: a.sub,
                namespace: a.ns,
                name: a.name,
                fields: &a.fields,
                non_resource: false,
            },
        )
    }

    fn node_field(v: &str) -> Vec<RawTerm> {
        vec![RawTerm { field: "spec.nodeName".into(), equals: true, value: v.into() }]
    }

    /// node_authorizer.go, case by case, for kubelet n1.
    #[test]
    fn a_kubelet_reads_its_own_node_pods_and_their_objects_only() {
        let sim = cluster();
        let n1 = |a: &Ask<'_>| decide(&sim, "system:node:n1", &["system:nodes", "system:authenticated"], a);
        let allow = Decision::Allow;
        // authorizeNode: its own Node by name (a metadata.name selector sets the name).
        assert_eq!(n1(&ask("get", "nodes", "", "n1")), allow);
        assert_eq!(n1(&ask("watch", "nodes", "", "n1")), allow);
        assert_eq!(
            n1(&ask("list", "nodes", "", "")),
            no("node 'n1' cannot read all nodes, only its own Node object")
        );
        assert_eq!(
            n1(&ask("get", "nodes", "", "n2")),
            no("node 'n1' cannot read 'n2', only its own Node object")
        );
        assert_eq!(n1(&Ask { sub: "status", ..ask("patch", "nodes", "", "n1") }), allow);
        // authorizePod: list/watch with spec.nodeName=<itself> only.
        assert_eq!(n1(&Ask { fields: node_field("n1"), ..ask("list", "pods", "", "") }), allow);
        assert_eq!(n1(&Ask { fields: node_field("n1"), ..ask("watch", "pods", "", "") }), allow);
        assert_eq!(
            n1(&Ask { fields: node_field("n2"), ..ask("list", "pods", "", "") }),
            no("can only list/watch pods with spec.nodeName field selector")
        );
        let not_equal = vec![RawTerm { field: "spec.nodeName".into(), equals: false, value: "n1".into() }];
        assert_eq!(
            n1(&Ask { fields: not_equal, ..ask("list", "pods", "", "") }),
            no("can only list/watch pods with spec.nodeName field selector")
        );
        assert_eq!(
            n1(&ask("list", "pods", "", "")),
            no("can only list/watch pods with spec.nodeName field selector")
        );
        assert_eq!(n1(&ask("get", "pods", "ns", "p1")), allow);
        assert_eq!(
            n1(&ask("get", "pods", "ns", "p2")),
            no("no relationship found between node 'n1' and this object")
        );
        assert_eq!(n1(&ask("watch", "pods", "ns", "p1")), allow, "a single related pod by name");
        assert_eq!(n1(&Ask { sub: "status", ..ask("patch", "pods", "ns", "p1") }), allow);
        // authorizeReadNamespacedObject + the graph: its pods' secrets and configmaps.
        for s in ["s1", "pull-p1", "envfrom-p1", "proj-p1"] {
            assert_eq!(n1(&ask("get", "secrets", "ns", s)), allow, "{s}");
            assert_eq!(n1(&ask("watch", "secrets", "ns", s)), allow, "{s} (metadata.name watch)");
        }
        for c in ["cm-p1", "env-p1"] {
            assert_eq!(n1(&ask("get", "configmaps", "ns", c)), allow, "{c}");
        }
        assert_eq!(
            n1(&ask("get", "secrets", "ns", "s2")),
            no("no relationship found between node 'n1' and this object")
        );
        assert_eq!(n1(&ask("list", "secrets", "ns", "")), no("No Object name found"));
        assert_eq!(n1(&ask("list", "secrets", "", "")), no("can only read namespaced object of this type"));
        assert_eq!(n1(&ask("create", "secrets", "ns", "s1")), no("can only read resources of this type"));
        // authorizeGet: claims and their volumes; generic ephemeral volumes' claims.
        assert_eq!(n1(&ask("get", "persistentvolumeclaims", "ns", "claim-p1")), allow);
        assert_eq!(n1(&ask("get", "persistentvolumeclaims", "ns", "p1-e")), allow);
        assert_eq!(n1(&ask("get", "persistentvolumes", "", "pv1")), allow);
        assert_eq!(
            n1(&ask("list", "persistentvolumeclaims", "ns", "")),
            no("can only get individual resources of this type")
        );
        assert_eq!(
            n1(&ask("get", "persistentvolumeclaims", "ns", "claim-p2")),
            no("no relationship found between node 'n1' and this object")
        );
        // authorizeCreateToken: its pods' service accounts.
        assert_eq!(n1(&Ask { sub: "token", ..ask("create", "serviceaccounts", "ns", "sa-p1") }), allow);
        assert_eq!(
            n1(&Ask { sub: "token", ..ask("create", "serviceaccounts", "ns", "sa-p2") }),
            no("no relationship found between node 'n1' and this object")
        );
        // authorizeLease.
        let lease = |verb, ns, name| Ask { group: "coordination.k8s.io", ..ask(verb, "leases", ns, name) };
        assert_eq!(n1(&lease("update", "kube-node-lease", "n1")), allow);
        assert_eq!(
            n1(&lease("update", "kube-node-lease", "n2")),
            no("can only access node lease with the same name as the requesting node")
        );
        assert_eq!(
            n1(&lease("get", "default", "n1")),
            no("can only access leases in the \"kube-node-lease\" system namespace")
        );
        // The static rules (services for kube-proxy-like node users), nothing else.
        assert_eq!(n1(&ask("watch", "services", "", "")), allow);
        assert_eq!(n1(&ask("list", "deployments", "", "")), no(""));
        // Not a node: no opinion, whatever the name says.
        assert_eq!(
            decide(&sim, "system:node:n1", &["system:authenticated"], &ask("get", "nodes", "", "n1")),
            no("")
        );
        assert_eq!(
            decide(&sim, "system:node:", &["system:nodes"], &ask("get", "nodes", "", "")),
            no("unknown node for user \"system:node:\"")
        );
    }
}
