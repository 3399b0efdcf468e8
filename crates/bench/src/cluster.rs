//! What the bench writes to an external cluster besides its pods: node-heartbeat-like Lease
//! churn (real `coordination.k8s.io/v1` Leases `bench-lease-<i>` in namespace `bench-0`, each
//! renewed every ~10 s as a kubelet renews its node Lease), and `--cleanup` (every pod and
//! Lease the bench made, then the namespaces it created, labelled [`CREATED_BY`]).
//!
//! Called by `phase` (the churn, during each phase of an external run) and `modes` (cleanup at
//! the end). The in-process sim churns its own Leases instead (`SimOptions::lease_churn_per_sec`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::env::{send, Remote};
use super::scenario::{Plan, CREATED_BY, NAMESPACES};

/// Where the Leases live.
pub const LEASE_NAMESPACE: &str = "bench-0";
/// How often one Lease is renewed (a kubelet renews its node Lease every 10 s).
const RENEW_EVERY: Duration = Duration::from_secs(10);

/// How many Leases a churn of `rate` renewals per second keeps (each renewed every 10 s).
pub fn lease_count(rate: f64) -> usize {
    if rate <= 0.0 {
        return 0;
    }
    ((rate * RENEW_EVERY.as_secs_f64()).ceil() as usize).max(1)
}

/// What the churn did in one phase.
#[derive(Debug, Default)]
pub struct LeaseLog {
    pub renewed: u64,
    pub failed: u64,
    pub first_error: Option<String>,
}

/// Renews Leases round-robin at `plan.sizes.lease_churn_per_sec` until `stop`; a Lease that
/// does not exist yet is created.
pub async fn churn(plan: Plan, remote: Arc<Remote>, mut stop: watch::Receiver<bool>) -> LeaseLog {
    let log = Mutex::new(LeaseLog::default());
    let rate = plan.sizes.lease_churn_per_sec;
    let count = lease_count(rate);
    if count == 0 {
        return log.into_inner();
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut i = fastrand::usize(..count);
    loop {
        tokio::select! {
            _ = tick.tick() => {},
            _ = stop.wait_for(|s| *s) => break,
        }
        i = (i + 1) % count;
        let result = renew(&remote, i).await;
        let mut l = log.lock();
        match result {
            Ok(()) => l.renewed += 1,
            Err(e) => {
                l.failed += 1;
                l.first_error.get_or_insert(e);
            }
        }
    }
    log.into_inner()
}

/// `2026-11-25T15:00:00.123456Z`: a `MicroTime`.
fn micro_time_now() -> String {
    let now = jiff::Timestamp::now();
    format!("{}.{:06}Z", now.strftime("%Y-%m-%dT%H:%M:%S"), now.subsec_microsecond())
}

/// A merge-patch of `spec.renewTime`; on 404 the Lease is created.
async fn renew(r: &Remote, i: usize) -> Result<(), String> {
    let name = format!("bench-lease-{i}");
    let now = micro_time_now();
    let patch = json!({"spec": {"renewTime": now}});
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}");
    let mut req =
        r.target.request(Method::PATCH, &path, Some(Bytes::from(patch.to_string()))).ok_or("bad URL")?;
    req.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/merge-patch+json"));
    match send(&r.client, req).await {
        Ok(_) => Ok(()),
        Err(e) if e.contains(": HTTP 404 ") => {
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE, "labels": {"app": "bench"}},
                "spec": {"holderIdentity": format!("bench-node-{i}"), "leaseDurationSeconds": 40, "renewTime": now},
            });
            let path = format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases");
            let req = r
                .target
                .request(Method::POST, &path, Some(Bytes::from(lease.to_string())))
                .ok_or("bad URL")?;
            send(&r.client, req).await.map(drop)
        }
        Err(e) => Err(e),
    }
}

/// What `--cleanup` removed.
#[derive(Debug, Default, PartialEq)]
pub struct Cleaned {
    pub pods: usize,
    pub leases: usize,
    pub namespaces: Vec<String>,
}

/// Deletes the plan's pods (at once: no kubelet confirms a graceful deletion), the Leases the
/// churn may have made, then the namespaces `bench-0..9` that carry [`CREATED_BY`] (ones that
/// existed before the bench stay). Objects already gone are fine.
pub async fn cleanup(plan: &Plan, r: Arc<Remote>) -> Result<Cleaned, String> {
    let mut paths = Vec::new();
    for i in 0..plan.sizes.objects {
        let (ns, name) = Plan::object_key(i);
        paths.push((true, format!("/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")));
    }
    for i in 0..lease_count(plan.sizes.lease_churn_per_sec) {
        let path =
            format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/bench-lease-{i}");
        paths.push((false, path));
    }
    let next = Arc::new(Mutex::new(paths.into_iter()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (r, next) = (r.clone(), next.clone());
        tasks.spawn(async move {
            let (mut pods, mut leases) = (0, 0);
            loop {
                let Some((pod, path)) = next.lock().next() else { return Ok::<_, String>((pods, leases)) };
                let Some(req) = r.target.request(Method::DELETE, &path, None) else {
                    return Err("bad URL".into());
                };
                match send(&r.client, req).await {
                    Ok(_) if pod => pods += 1,
                    Ok(_) => leases += 1,
                    Err(e) if e.contains(": HTTP 404 ") => {}
                    Err(e) => return Err(e),
                }
            }
        });
    }
    let mut done = Cleaned::default();
    while let Some(t) = tasks.join_next().await {
        let (p, l) = t.map_err(|e| e.to_string())??;
        done.pods += p;
        done.leases += l;
    }
    for n in 0..NAMESPACES {
        let path = format!("/api/v1/namespaces/bench-{n}");
        let req = r.target.request(Method::GET, &path, None).ok_or("bad URL")?;
        let ns: Value = match send(&r.client, req).await {
            Ok(body) => serde_json::from_slice(&body).map_err(|e| format!("{path}: {e}"))?,
            Err(e) if e.contains(": HTTP 404 ") => continue,
            Err(e) => return Err(e),
        };
        if ns.pointer(&format!("/metadata/labels/{}", CREATED_BY.0.replace('/', "~1")))
            != Some(&json!(CREATED_BY.1))
        {
            continue;
        }
        let req = r.target.request(Method::DELETE, &path, None).ok_or("bad URL")?;
        match send(&r.client, req).await {
            Ok(_) => done.namespaces.push(format!("bench-{n}")),
            Err(e) if e.contains(": HTTP 404 ") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_count_and_micro_time() {
        assert_eq!(lease_count(0.0), 0);
        assert_eq!(lease_count(20.0), 200);
        assert_eq!(lease_count(0.01), 1);
        let t = micro_time_now();
        assert_eq!(t.len(), "2026-11-25T15:00:00.123456Z".len(), "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[19] == b'.', "{t}");
    }
}
