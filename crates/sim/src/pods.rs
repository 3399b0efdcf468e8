//! What kube-apiserver (1.28 to 1.36) and its default admission plugins do to a pod, as far as
//! a client can see: the defaults every write gets, what ServiceAccount admission adds on
//! create (the `kube-api-access-*` projected volume and its mounts), and the update validation
//! that refuses a change of any spec field but the few mutable ones (422
//! `pod updates may not change fields other than …`).
//!
//! Recorded from a real v1.28.7 apiserver in `tests/recordings/v1.28.7-raw/pod-update.json`:
//! the stored pod after create, the 422 of a whole-pod PUT of the pod as first sent (the old
//! bench writer), an allowed image change, and a refused env change. The Status equals the
//! apiserver's up to the message's diff: the apiserver appends a `cmp.Diff` of its internal Go
//! structs, the sim a diff of the JSON fields that differ (same first line, same details).
//!
//! Called by `write.rs` (create and update of `pods`).

use serde_json::{json, Map, Value};

use kube_watchcache::error::{Cause, Error};

/// The fields `ValidatePodUpdate` lets change (pkg/apis/core/validation, 1.28).
const MUTABLE: &str = "pod updates may not change fields other than `spec.containers[*].image`,\
`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to \
existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was \
previously negative)";

/// Defaults of every pod write (SetDefaults_PodSpec / _Container) and of the admission plugins
/// that run on create and update (DefaultTolerationSeconds, Priority).
pub fn defaults(spec: &mut Map<String, Value>) {
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
        ("priority", json!(0)),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
    ] {
        spec.entry(k).or_insert(v);
    }
    for list in ["initContainers", "containers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(list) {
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                let pull = match c.get("image").and_then(Value::as_str) {
                    Some(i) if i.ends_with(":latest") || !i.rsplit('/').next().unwrap_or(i).contains(':') => {
                        "Always"
                    }
                    _ => "IfNotPresent",
                };
                c.entry("resources").or_insert(json!({}));
                c.entry("terminationMessagePath").or_insert(json!("/dev/termination-log"));
                c.entry("terminationMessagePolicy").or_insert(json!("File"));
                c.entry("imagePullPolicy").or_insert(json!(pull));
            }
        }
    }
    // DefaultTolerationSeconds: 300 s for not-ready and unreachable nodes.
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    if let Value::Array(ts) = tolerations {
        for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
            if !ts.iter().any(|t| t.get("key").and_then(Value::as_str) == Some(key)) {
                ts.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
}

/// ServiceAccount admission on create: the account name (and its deprecated copy) and, unless
/// `automountServiceAccountToken: false`, the projected token volume mounted in every container.
pub fn admit_create(spec: &mut Map<String, Value>, suffix: &str) {
    let sa =
        spec.get("serviceAccountName").and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or("default");
    let sa = sa.to_owned();
    spec.insert("serviceAccountName".into(), json!(sa));
    spec.insert("serviceAccount".into(), json!(sa));
    if spec.get("automountServiceAccountToken") == Some(&json!(false)) {
        return;
    }
    const PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    let name = format!("kube-api-access-{suffix}");
    let volume = json!({"name": name, "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ], "defaultMode": 420}});
    if let Value::Array(vs) = spec.entry("volumes").or_insert_with(|| json!([])) {
        vs.push(volume);
    }
    for list in ["initContainers", "containers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(list) {
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
                if let Value::Array(ms) = mounts {
                    if !ms.iter().any(|m| m.get("mountPath").and_then(Value::as_str) == Some(PATH)) {
                        ms.push(json!({"name": name, "readOnly": true, "mountPath": PATH}));
                    }
                }
            }
        }
    }
}

/// `ValidatePodUpdate`'s spec rule: `new` (defaulted) may differ from `old` only in the mutable
/// fields. The 422 otherwise.
pub fn validate_update(name: &str, old: &Value, new: &Value) -> Result<(), Error> {
    let empty = Map::new();
    let old_spec = old.get("spec").and_then(Value::as_object).unwrap_or(&empty);
    let new_spec = new.get("spec").and_then(Value::as_object).unwrap_or(&empty);
    let tolerations =
        |s: &Map<String, Value>| s.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    let (old_t, new_t) = (tolerations(old_spec), tolerations(new_spec));
    let grace = |s: &Map<String, Value>| s.get("terminationGracePeriodSeconds").and_then(Value::as_i64);
    let grace_ok = grace(old_spec) == grace(new_spec)
        || (grace(old_spec).is_some_and(|g| g < 0) && grace(new_spec) == Some(1));
    let (a, b) = (masked(old_spec), masked(new_spec));
    if a == b && grace_ok && old_t.iter().all(|t| new_t.contains(t)) {
        return Ok(());
    }
    Err(Error::Invalid {
        kind: "Pod".into(),
        group: String::new(),
        name: name.into(),
        causes: vec![Cause::forbidden("spec", &format!("{MUTABLE}\n{}", diff(&a, &b)))],
    })
}

/// The spec without what may change.
fn masked(spec: &Map<String, Value>) -> Map<String, Value> {
    let mut s = spec.clone();
    for k in ["activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"] {
        s.remove(k);
    }
    for list in ["initContainers", "containers"] {
        if let Some(Value::Array(cs)) = s.get_mut(list) {
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                c.remove("image");
            }
        }
    }
    s
}

/// `  core.PodSpec{` then `- ` / `+ ` lines for each field that differs, as the apiserver's
/// diff starts (its body names Go fields; this one JSON fields).
fn diff(old: &Map<String, Value>, new: &Map<String, Value>) -> String {
    let mut out = String::from("  core.PodSpec{\n");
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let (a, b) = (old.get(k), new.get(k));
        if a != b {
            let show = |v: Option<&Value>| v.map_or("nil".to_owned(), Value::to_string);
            out.push_str(&format!("- \t{k}: {},\n+ \t{k}: {},\n", show(a), show(b)));
        }
    }
    out.push_str("  }\n");
    out
}
