//! Protobuf through the proxy in front of the sim (issue 17): a kubelet-like client
//! (`vnd.kubernetes.protobuf, application/json`) and the garbage collector's metadata client get
//! LIST, GET, 404 and WATCH in protobuf from the cache, nothing upstream. (Apart from
//! `tests/protobuf/protobuf.rs`: the proxy records the sim's version, a process-wide setting.)

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::pb::fields;
use http::Method;
use serde_json::json;

/// The envelope's TypeMeta kind and the raw message of a protobuf body.
fn unwrap_envelope(body: &[u8]) -> (String, Vec<u8>) {
    let unknown = body.strip_prefix(b"k8s\0").expect("the k8s\\0 magic");
    let f = fields(unknown).expect("an Unknown");
    let type_meta = fields(f.iter().find(|x| x.0 == 1).unwrap().2).unwrap();
    let kind = String::from_utf8(type_meta.iter().find(|x| x.0 == 2).unwrap().2.to_vec()).unwrap();
    (kind, f.iter().find(|x| x.0 == 2).unwrap().2.to_vec())
}

/// The next length-prefixed frame of a protobuf watch body (without its length), `buf` holding
/// what was read past the last one.
async fn next_frame(body: &mut hyper::body::Incoming, buf: &mut Vec<u8>) -> Vec<u8> {
    loop {
        if buf.len() >= 4 {
            let n = 4 + u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
            if buf.len() >= n {
                let frame = buf[4..n].to_vec();
                buf.drain(..n);
                return frame;
            }
        }
        let f = tokio::time::timeout(Duration::from_secs(10), http_body_util::BodyExt::frame(body))
            .await
            .expect("an event")
            .unwrap()
            .unwrap();
        buf.extend_from_slice(&f.into_data().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_and_the_garbage_collector_get_protobuf_from_the_cache() {
    const KUBELET: &str = "application/vnd.kubernetes.protobuf, application/json";
    const GC_LIST: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let env = common::start().await;
    env.ns("p");
    for i in 0..3 {
        env.create_cm("p", &format!("cm-{i}"), json!({"app": "a"}));
    }
    let rv = env.create_cm("p", "cm-3", json!({"app": "b"}));
    env.synced_to(rv).await;
    // What the proxy sent upstream (this test's own direct requests carry a marker).
    let upstream = || {
        env.sim.sim.request_count(|r| {
            r.path.starts_with("/api/v1/namespaces/p/configmaps") && !r.headers.contains_key("x-test-direct")
        })
    };
    let before = upstream();
    let send = |path: &str, accept: &'static str| {
        let url = env.proxy_url(path);
        let client = env.client.clone();
        async move { common::send(&client, Method::GET, &url, None, &[("accept", accept)]).await }
    };

    // LIST: a ConfigMapList in protobuf, four items, each the ConfigMap message.
    let list = send("/api/v1/namespaces/p/configmaps?resourceVersion=0", KUBELET).await;
    assert_eq!(list.status, 200);
    assert_eq!(list.headers["content-type"], "application/vnd.kubernetes.protobuf");
    let (kind, msg) = unwrap_envelope(&list.body);
    assert_eq!(kind, "ConfigMapList");
    let items: Vec<_> = fields(&msg).unwrap().into_iter().filter(|f| f.0 == 2).collect();
    assert_eq!(items.len(), 4);
    // The JSON list of the same objects, transcoded here, gives the same item bytes.
    let json_list = env.get("/api/v1/namespaces/p/configmaps?resourceVersion=0").await.json();
    let s = kube_watchcache::proto::schema::schema();
    let cm = s.kind("", "v1", "ConfigMap").unwrap();
    for (item, want) in json_list["items"].as_array().unwrap().iter().zip(&items) {
        let got = kube_watchcache::proto::transcode::object(
            s,
            cm,
            item.to_string().as_bytes(),
            kube_watchcache::proto::NEWEST,
        )
        .unwrap();
        assert_eq!(got, want.2, "item bytes");
    }

    // The sim speaks protobuf too (as the recorded apiserver): the same bytes, served directly.
    let direct = |path: &str, accept: &'static str| {
        let url = env.sim_url(path);
        let client = env.client.clone();
        async move {
            common::send(&client, Method::GET, &url, None, &[("accept", accept), ("x-test-direct", "1")])
                .await
        }
    };
    let sim_list = direct("/api/v1/namespaces/p/configmaps?resourceVersion=0", KUBELET).await;
    assert_eq!(sim_list.headers["content-type"], "application/vnd.kubernetes.protobuf");
    assert_eq!(sim_list.body, list.body, "the sim's protobuf LIST = the proxy's");

    // The garbage collector's metadata list.
    let meta = send("/api/v1/namespaces/p/configmaps?resourceVersion=0", GC_LIST).await;
    assert_eq!(meta.headers["content-type"], "application/vnd.kubernetes.protobuf");
    assert_eq!(unwrap_envelope(&meta.body).0, "PartialObjectMetadataList");
    let sim_meta = direct("/api/v1/namespaces/p/configmaps?resourceVersion=0", GC_LIST).await;
    assert_eq!(sim_meta.body, meta.body, "metadata-only protobuf LIST, sim = proxy");

    // GET, and a missing object's 404 as a protobuf Status.
    let get = send("/api/v1/namespaces/p/configmaps/cm-1?resourceVersion=0", KUBELET).await;
    assert_eq!(get.status, 200);
    assert_eq!(unwrap_envelope(&get.body).0, "ConfigMap");
    let missing = send("/api/v1/namespaces/p/configmaps/nope?resourceVersion=0", KUBELET).await;
    assert_eq!(missing.status, 404);
    assert_eq!(unwrap_envelope(&missing.body).0, "Status");
    let sim_get = direct("/api/v1/namespaces/p/configmaps/cm-1?resourceVersion=0", KUBELET).await;
    assert_eq!(sim_get.body, get.body, "GET, sim = proxy");
    let sim_missing = direct("/api/v1/namespaces/p/configmaps/nope?resourceVersion=0", KUBELET).await;
    assert_eq!(
        (sim_missing.status, &sim_missing.body),
        (missing.status, &missing.body),
        "404 Status, sim = proxy"
    );
    // A metadata-only protobuf reader's error is a JSON Status (errors are negotiated without
    // `as=`, as the apiserver's `ErrorNegotiated`), as the sim's.
    const GC_GET: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
    let meta_missing = send("/api/v1/namespaces/p/configmaps/nope?resourceVersion=0", GC_GET).await;
    assert_eq!(meta_missing.status, 404);
    assert_eq!(meta_missing.headers["content-type"], "application/json");
    let sim_meta_missing = direct("/api/v1/namespaces/p/configmaps/nope?resourceVersion=0", GC_GET).await;
    assert_eq!(
        (sim_meta_missing.status, &sim_meta_missing.body),
        (meta_missing.status, &meta_missing.body),
        "metadata-only 404 Status, sim = proxy"
    );
    assert_eq!(upstream(), before, "all of it from the cache (the direct requests are marked)");

    // WATCH: length-prefixed frames, a MODIFIED as the write happens.
    let url = env.proxy_url(&format!("/api/v1/namespaces/p/configmaps?watch=1&resourceVersion={rv}"));
    let resp = env
        .client
        .request(
            http::Request::get(&url)
                .header("accept", KUBELET)
                .body(http_body_util::Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/vnd.kubernetes.protobuf;stream=watch");
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    // Each new version is encoded from the previous version's encoding (the first from the one
    // made for the LIST above), reading only its JSON that changed: a value of the data changed
    // (a map's value and the resourceVersion: spliced, `proto::splice`), a member added (walked,
    // `proto::window`), a bool and the resourceVersion changed (spliced). Each is the upstream's
    // own bytes for it.
    let cm = |immutable: Option<bool>| {
        let mut o = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-2","namespace":"p","labels":{"app":"a"}},"data":{"k":"v2"}});
        if let Some(i) = immutable {
            o["immutable"] = json!(i);
        }
        o
    };
    for (step, immutable) in [None, Some(false), Some(true)].into_iter().enumerate() {
        env.sim.sim.update("configmaps", "p", cm(immutable)).expect("update");
        let frame = next_frame(&mut body, &mut buf).await;
        let event = fields(&frame).unwrap();
        assert_eq!(event[0].2, b"MODIFIED");
        let raw = fields(event[1].2).unwrap();
        assert_eq!(unwrap_envelope(raw[0].2).0, "ConfigMap");
        let sim_now = direct("/api/v1/namespaces/p/configmaps/cm-2", KUBELET).await;
        assert_eq!(raw[0].2, &sim_now.body[..], "MODIFIED object {step}: proxy = sim");
    }
    // And so the metrics count them: the one walked, the two spliced, none read whole (the
    // versions the LIST and GETs above encoded are fresh).
    let metrics = String::from_utf8(env.get("/watchcache/metrics").await.body.to_vec()).unwrap();
    let count = |how: &str| {
        let series = format!(r#"watchcache_protobuf_encodings_total{{how="{how}",resource="configmaps"}} "#);
        let line = metrics.lines().find_map(|l| l.strip_prefix(series.as_str()));
        line.unwrap_or_else(|| panic!("{series}")).parse::<u64>().unwrap()
    };
    assert_eq!((count("walked"), count("spliced"), count("from_previous")), (1, 2, 0));
    assert!(count("fresh") >= 3);
    assert_eq!(upstream(), before, "the watch too");
}
