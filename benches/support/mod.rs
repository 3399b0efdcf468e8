//! Shared by every bench in `benches/`: realistic ~2.5 KiB pods as the apiserver encodes them,
//! caches filled with them, the criterion configuration and the smoke mode for CI.
//!
//! Smoke mode (tiny sizes, ~0.1 s per bench) is on when `BENCH_SMOKE=1` is set, when criterion
//! runs in test mode (`cargo bench -- --test`), or when the binary is run without `--bench`
//! (`cargo test --benches`): then every bench runs once on small inputs.

#![allow(dead_code)] // each bench binary uses a different part of this module

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::Criterion;
use kube_watchcache::cache::{self, CacheOptions, Reader, Watch, Writer};
use kube_watchcache::resource::{typing, EventType, Object, ResourceKind, Rv};

/// The core `pods` resource.
pub fn pods() -> ResourceKind {
    ResourceKind::new("", "v1", "pods", "Pod", true, true)
}

/// Whether to run with tiny sizes and times (see the module doc).
pub fn smoke() -> bool {
    let env = std::env::var("BENCH_SMOKE").is_ok_and(|v| !v.is_empty() && v != "0");
    let args: Vec<String> = std::env::args().collect();
    let test_mode = args.iter().any(|a| a == "--test") || !args.iter().any(|a| a == "--bench");
    env || test_mode
}

/// `full` normally, `small` in smoke mode.
pub fn size(full: usize, small: usize) -> usize {
    if smoke() {
        small
    } else {
        full
    }
}

/// Short measurements and modest sample sizes: the whole `cargo bench` stays well under
/// 10 minutes on a 2-core machine.
pub fn criterion() -> Criterion {
    let c = Criterion::default().without_plots().nresamples(20_000);
    if smoke() {
        c.warm_up_time(Duration::from_millis(100))
            .measurement_time(Duration::from_millis(100))
            .sample_size(10)
    } else {
        c.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(30)
    }
}

/// Where pod `i` lives: 100 pods per namespace, `app-(i % 10)`, on `node-(i % nodes)`.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub i: usize,
    pub rv: u64,
    pub nodes: usize,
    /// Extra annotation value (changes the bytes of a MODIFIED object).
    pub generation: u64,
}

impl PodSpec {
    pub fn namespace(&self) -> String {
        format!("ns-{}", self.i / 100)
    }
    pub fn node(&self) -> String {
        format!("node-{}", self.i % self.nodes.max(1))
    }
}

/// A Deployment's pod, ~2.5 KiB (about 2,590 bytes), members in the apiserver's order: labels,
/// annotations, ownerReferences, managedFields (kube-controller-manager + kubelet), spec with
/// one container, status with conditions and a container status.
pub fn pod_json(p: &PodSpec) -> Bytes {
    let i = p.i;
    let ns = p.namespace();
    let node = p.node();
    let app = format!("app-{}", i % 10);
    let tier = ["web", "api", "db"][i % 3];
    let hash = format!("{:010x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 24);
    let uid = format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", i, i % 0xffff, i % 0xfff, i % 0xfff, i);
    let rv = p.rv;
    let gen = p.generation;
    let ip = format!("10.244.{}.{}", (i / 250) % 256, i % 250 + 2);
    let ts = "2025-11-03T09:14:27Z";
    let json = format!(
        concat!(
            r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{app}-{hash}-{i:05}","generateName":"{app}-{hash}-","#,
            r#""namespace":"{ns}","uid":"{uid}","resourceVersion":"{rv}","creationTimestamp":"{ts}","#,
            r#""labels":{{"app":"{app}","pod-template-hash":"{hash}","tier":"{tier}","version":"v1.4.2"}},"#,
            r#""annotations":{{"prometheus.io/port":"9090","prometheus.io/scrape":"true","bench/generation":"{gen}"}},"#,
            r#""ownerReferences":[{{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"{app}-{hash}","uid":"{uid}","controller":true,"blockOwnerDeletion":true}}],"#,
            r#""managedFields":[{{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"{ts}","fieldsType":"FieldsV1","fieldsV1":{{"f:metadata":{{"f:annotations":{{".":{{}},"f:prometheus.io/port":{{}},"f:prometheus.io/scrape":{{}}}},"f:generateName":{{}},"f:labels":{{".":{{}},"f:app":{{}},"f:pod-template-hash":{{}},"f:tier":{{}},"f:version":{{}}}},"f:ownerReferences":{{".":{{}},"k:{{\"uid\":\"{uid}\"}}":{{}}}}}},"f:spec":{{"f:containers":{{"k:{{\"name\":\"main\"}}":{{".":{{}},"f:image":{{}},"f:imagePullPolicy":{{}},"f:name":{{}},"f:ports":{{}},"f:resources":{{}}}}}},"f:dnsPolicy":{{}},"f:restartPolicy":{{}},"f:schedulerName":{{}}}}}}}},"#,
            r#"{{"manager":"kubelet","operation":"Update","apiVersion":"v1","time":"{ts}","fieldsType":"FieldsV1","fieldsV1":{{"f:status":{{"f:conditions":{{}},"f:containerStatuses":{{}},"f:hostIP":{{}},"f:phase":{{}},"f:podIP":{{}},"f:startTime":{{}}}}}},"subresource":"status"}}]}},"#,
            r#""spec":{{"#,
            r#""containers":[{{"name":"main","image":"registry.example.com/{app}:v1.4.2","ports":[{{"name":"http","containerPort":8080,"protocol":"TCP"}}],"#,
            r#""resources":{{"limits":{{"memory":"256Mi"}},"requests":{{"cpu":"100m","memory":"128Mi"}}}},"#,
            r#""imagePullPolicy":"IfNotPresent"}}],"#,
            r#""restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","#,
            r#""nodeName":"{node}","schedulerName":"default-scheduler","#,
            r#""priority":0}},"#,
            r#""status":{{"phase":"Running","conditions":[{{"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"{ts}"}},"#,
            r#"{{"type":"PodScheduled","status":"True","lastProbeTime":null,"lastTransitionTime":"{ts}"}}],"#,
            r#""hostIP":"192.168.1.{host}","podIP":"{ip}","startTime":"{ts}","#,
            r#""containerStatuses":[{{"name":"main","state":{{"running":{{"startedAt":"{ts}"}}}},"lastState":{{}},"ready":true,"restartCount":0,"#,
            r#""image":"registry.example.com/{app}:v1.4.2","containerID":"containerd://{uid}","started":true}}],"qosClass":"Burstable"}}}}"#,
        ),
        app = app,
        hash = hash,
        i = i,
        ns = ns,
        uid = uid,
        rv = rv,
        ts = ts,
        tier = tier,
        gen = gen,
        node = node,
        ip = ip,
        host = i % 250 + 2,
    );
    Bytes::from(json)
}

/// Parses a pod as the reflector would.
pub fn pod(p: &PodSpec) -> Object {
    let kind = pods();
    match Object::parse(&kind, &typing(&kind), pod_json(p)) {
        Ok(o) => o,
        Err(e) => panic!("bench pod does not parse: {e}"),
    }
}

/// A synced cache of `n` pods (RVs 1..=n) spread over `nodes` nodes.
pub fn filled_cache(n: usize, nodes: usize, opts: CacheOptions) -> (Writer, Reader) {
    let (mut w, r) = cache::new(pods(), opts);
    let objects = (0..n).map(|i| pod(&PodSpec { i, rv: i as u64 + 1, nodes, generation: 0 })).collect();
    w.replace(objects, Rv(n as u64));
    (w, r)
}

/// Applies `count` MODIFIED events to pods of the cache (pod `j % n` at RV `next + j`) and
/// returns the next free RV.
pub fn churn(w: &mut Writer, n: usize, nodes: usize, next: u64, count: usize) -> u64 {
    let mut rv = next;
    for j in 0..count {
        let obj = pod(&PodSpec { i: j % n, rv, nodes, generation: rv });
        if let Err(e) = w.apply(EventType::Modified, obj) {
            panic!("churn apply failed: {e}");
        }
        rv += 1;
    }
    rv
}

/// A runtime to enter while polling watches (`Watch::next` arms timers).
pub fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    }
}

/// Takes every frame already available from `w` without waiting; returns how many. Call
/// inside a runtime context (`runtime().enter()`).
pub fn drain(w: &mut Watch) -> usize {
    let mut cx = Context::from_waker(Waker::noop());
    let mut n = 0;
    loop {
        let next = pin!(w.next());
        match next.poll(&mut cx) {
            Poll::Ready(Some(_)) => n += 1,
            _ => return n,
        }
    }
}

/// An `Arc` of a parsed pod.
pub fn arc_pod(p: &PodSpec) -> Arc<Object> {
    Arc::new(pod(p))
}
