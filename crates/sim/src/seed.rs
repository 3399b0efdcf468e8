//! Sample objects and churn: the namespaces every cluster has, then `objects` configmaps and
//! pods (~2 KiB each, labelled `app=…`, pods on `node-i` with a `status.phase`) spread over
//! namespaces `ns-0..`, nodes `node-0..`; a background task that updates random seeded
//! objects at `churn_per_sec`; and one that renews node heartbeat Leases at
//! `lease_churn_per_sec`. Called by `Sim::new` / `Sim::start`.

use std::time::Duration;

use serde_json::{json, Value};

use super::{write, Sim};
use kube_watchcache::resource::ObjectKey;

const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-node-lease", "kube-public", "kube-system"];

/// Objects per seeded namespace.
const PER_NAMESPACE: usize = 1000;

fn res(sim: &Sim, name: &str) -> usize {
    sim.store().kinds.by_name(name).unwrap_or(0)
}

/// The namespaces a fresh cluster has.
pub fn system(sim: &Sim) {
    let ns = res(sim, "namespaces");
    for name in SYSTEM_NAMESPACES {
        let _ = write::create(sim, ns, "", json!({"metadata": {"name": name}}));
    }
}

/// Seeded layout: namespace count and node count for `n` objects.
fn layout(n: usize) -> (usize, usize) {
    (n.div_ceil(PER_NAMESPACE).max(1), (n / 100).clamp(1, 100))
}

fn filler(i: usize) -> String {
    // ~1.5 KiB of text so that objects weigh ~2 KiB like small real ones.
    format!("{i:08}-").repeat(170)
}

/// Creates `n` objects: half configmaps `cm-i`, half pods `pod-i`.
pub fn objects(sim: &Sim, n: usize) {
    if n == 0 {
        return;
    }
    let (namespaces, nodes) = layout(n);
    let (ns_res, node_res, cm_res, pod_res) =
        (res(sim, "namespaces"), res(sim, "nodes"), res(sim, "configmaps"), res(sim, "pods"));
    for i in 0..namespaces {
        let _ = write::create(sim, ns_res, "", json!({"metadata": {"name": format!("ns-{i}")}}));
    }
    for i in 0..nodes {
        let node = json!({
            "metadata": {"name": format!("node-{i}"), "labels": {"kubernetes.io/hostname": format!("node-{i}")}},
            "spec": {"podCIDR": format!("10.244.{}.0/24", i % 256)},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        let _ = write::create(sim, node_res, "", node);
    }
    for i in 0..n {
        let ns = format!("ns-{}", (i / 2) % namespaces);
        let app = format!("app-{}", i % 10);
        let result = if i % 2 == 0 {
            let cm = json!({
                "metadata": {"name": format!("cm-{}", i / 2), "labels": {"app": app}},
                "data": {"config": filler(i)},
            });
            write::create(sim, cm_res, &ns, cm)
        } else {
            let phase = ["Running", "Pending", "Succeeded"][i % 3];
            let pod = json!({
                "metadata": {"name": format!("pod-{}", i / 2), "labels": {"app": app}, "annotations": {"sim/filler": filler(i)}},
                "spec": {"nodeName": format!("node-{}", i % nodes), "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
                "status": {"phase": phase},
            });
            write::create(sim, pod_res, &ns, pod)
        };
        if let Err(e) = result {
            tracing::warn!(error = ?e, "seeding failed");
        }
    }
}

/// Updates random seeded objects at `churn_per_sec` until the task is aborted.
pub async fn churn(sim: Sim, _stop: tokio::sync::watch::Receiver<bool>) {
    let rate = sim.opts().churn_per_sec;
    let n = sim.opts().objects;
    let (namespaces, _) = layout(n);
    let (cm_res, pod_res) = (res(&sim, "configmaps"), res(&sim, "pods"));
    if n == 0 {
        let _ =
            write::create(&sim, cm_res, "default", json!({"metadata": {"name": "sim-churn"}, "data": {}}));
    }
    let period = Duration::from_secs_f64((1.0 / rate).max(0.01));
    let per_tick = rate * period.as_secs_f64();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut budget = 0.0;
    let mut counter = 0u64;
    loop {
        tick.tick().await;
        budget += per_tick;
        while budget >= 1.0 {
            budget -= 1.0;
            counter += 1;
            let (r, ns, name) = if n == 0 {
                (cm_res, "default".to_owned(), "sim-churn".to_owned())
            } else {
                let i = fastrand::usize(..n);
                let r = if i % 2 == 0 { cm_res } else { pod_res };
                let prefix = if i % 2 == 0 { "cm" } else { "pod" };
                (r, format!("ns-{}", (i / 2) % namespaces), format!("{prefix}-{}", i / 2))
            };
            let Some(o) = sim.store().get(r, &ObjectKey::new(&ns, &name)) else { continue };
            let mut v = write::to_value(&o);
            if let Some(m) = v.as_object_mut() {
                let meta = super::store::meta_mut(m);
                let ann = meta.entry("annotations").or_insert_with(|| json!({}));
                if let Value::Object(a) = ann {
                    a.insert("sim/churn".into(), json!(counter.to_string()));
                }
            }
            if let Err(e) = write::update(&sim, r, &ns, &name, v, false, write::Writer::Internal) {
                tracing::debug!(error = ?e, "churn update failed");
            }
        }
    }
}

/// Node heartbeat Leases renewed by the lease churn (one per simulated kubelet).
const HEARTBEAT_LEASES: usize = 50;

/// Renews Leases `node-i` in `kube-node-lease` round robin at `lease_churn_per_sec`, as
/// kubelets do (every 10 s each in a real cluster): writes to a resource nobody caches that move
/// the global revision. Runs until the task is aborted.
pub async fn lease_churn(sim: Sim) {
    let rate = sim.opts().lease_churn_per_sec;
    let lease_res = res(&sim, "coordination.k8s.io/leases");
    let ns = "kube-node-lease";
    let count = HEARTBEAT_LEASES.min(rate.ceil().max(1.0) as usize);
    for i in 0..count {
        let lease = json!({
            "metadata": {"name": format!("node-{i}")},
            "spec": {"holderIdentity": format!("node-{i}"), "leaseDurationSeconds": 40, "renewTime": micro_time()},
        });
        if let Err(e) = write::create(&sim, lease_res, ns, lease) {
            tracing::debug!(error = ?e, "lease create failed");
        }
    }
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval(period.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut i = 0usize;
    loop {
        tick.tick().await;
        i = (i + 1) % count;
        let name = format!("node-{i}");
        let Some(o) = sim.store().get(lease_res, &ObjectKey::new(ns, &name)) else { continue };
        let mut v = write::to_value(&o);
        if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("renewTime".into(), json!(micro_time()));
        }
        if let Err(e) = write::update(&sim, lease_res, ns, &name, v, false, write::Writer::Internal) {
            tracing::debug!(error = ?e, "lease renewal failed");
        }
    }
}

/// Now as a `metav1.MicroTime` (`2026-11-23T10:31:28.123456Z`), as Lease renewals carry it.
fn micro_time() -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_micros())
        .unwrap_or(0);
    let secs = super::encode::now_rfc3339();
    format!("{}.{micros:06}Z", secs.trim_end_matches('Z'))
}
