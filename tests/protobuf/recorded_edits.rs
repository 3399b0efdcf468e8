//! Integration (issue 35 §4): protobuf watch events made from the previous version's encoding
//! (`proto::splice`, `proto::window`, `proto::after`) against a real kube-apiserver 1.28.7's
//! own frames for the same events (`tests/recordings/v1.28.7-raw/protobuf-edits.json`, recorded
//! by `record_protobuf_edits.py`): leases renewed and changing holder, node heartbeats,
//! conditions flipping, images and taints added, pods' readiness, restarts (a container's state
//! changing shape), a probe time going from null to a time, annotations and labels added,
//! changed and removed, a pod deleted and one created. The JSON events go into a cache as the
//! reflector puts them, after the JSON LIST they started from and a protobuf LIST of it (a
//! kubelet's informer); a protobuf and a JSON watch of the cache must give the apiserver's
//! frames, byte for byte and in order.

use base64::Engine;
use bytes::Bytes;
use kube_watchcache::cache::{self, Filter, WatchRequest, WatchStart};
use kube_watchcache::metadata_only::Repr;
use kube_watchcache::proto::ENCODINGS;
use kube_watchcache::resource::{EventType, ResourceKind, Rv};
use serde_json::Value;
use std::time::Duration;

use crate::common::recorded::RawList;
use crate::protobuf::{diff, frames, recorded_options, Ev};

fn recording() -> Value {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/recordings/v1.28.7-raw/protobuf-edits.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn status_writers_edits_encoded_from_the_previous_version_equal_the_apiservers_frames() {
    let rec = recording();
    let mut total = [0u64; 4];
    for r in rec["resources"].as_array().unwrap() {
        let name = r["resource"].as_str().unwrap();
        let kind = ResourceKind::new(
            r["group"].as_str().unwrap(),
            r["version"].as_str().unwrap(),
            name,
            r["kind"].as_str().unwrap(),
            r["namespaced"].as_bool().unwrap(),
            true,
        );
        let (mut w, reader) = cache::new(kind, recorded_options());
        let list: RawList = serde_json::from_str(r["list"].as_str().unwrap()).unwrap();
        let start = Rv(r["start_resourceVersion"].as_str().unwrap().parse().unwrap());
        let items = list.items.unwrap_or_default();
        let objects = items.iter().map(|i| w.parse(Bytes::from(i.get().to_owned())).unwrap()).collect();
        w.replace(objects, start);
        // The informer's protobuf LIST: the listed versions get their encodings.
        let snap = reader.snapshot();
        assert!(reader.list(&snap, &Filter::default().with_repr(Repr::FullProto), None).is_some(), "{name}");

        let open = |repr: Repr| {
            reader
                .watch(WatchRequest {
                    filter: Filter::default().with_repr(repr),
                    start: WatchStart::After(start),
                    bookmarks: false,
                    deadline: tokio::time::Instant::now() + Duration::from_secs(300),
                })
                .unwrap()
        };
        let (mut proto, mut json) = (open(Repr::FullProto), open(Repr::Full));
        let proto_stream =
            base64::engine::general_purpose::STANDARD.decode(r["proto"].as_str().unwrap()).unwrap();
        let want = frames(&proto_stream);
        let lines: Vec<&str> = r["json"].as_str().unwrap().lines().collect();
        assert_eq!(lines.len(), want.len(), "{name}: the two streams carry the same events");
        for (i, line) in lines.iter().enumerate() {
            let ev: Ev = serde_json::from_str(line).unwrap();
            let t = EventType::parse(ev.t).unwrap();
            let obj = w.parse(Bytes::from(ev.object.get().to_owned())).unwrap();
            w.apply(t, obj).unwrap().finish().await;
            let got = proto.next().await.unwrap();
            assert_eq!(diff(&got, want[i]), None, "{name} {} protobuf frame {i}", ev.t);
            let got = json.next().await.unwrap();
            assert_eq!(String::from_utf8_lossy(&got), format!("{line}\n"), "{name} JSON frame {i}");
        }
        let counts = reader.proto_type().encodings();
        eprintln!(
            "{name}: {} events; encodings {:?}",
            lines.len(),
            ENCODINGS.iter().zip(counts).collect::<Vec<_>>()
        );
        // Every watched version after the list was made from its predecessor's encoding but
        // the created pod's (fresh, as it has none).
        let fresh_listed = items.len() as u64;
        let created = lines.iter().filter(|l| l.starts_with(r#"{"type":"ADDED""#)).count() as u64;
        assert_eq!(counts[0], fresh_listed + created, "{name}: {counts:?}");
        assert_eq!(counts[1..].iter().sum::<u64>(), lines.len() as u64 - created, "{name}: {counts:?}");
        total.iter_mut().zip(counts).for_each(|(t, c)| *t += c);
    }
    // The recording exercises both ways of reusing the previous encoding.
    let [_, _, walked, spliced] = total;
    assert!(spliced >= 40 && walked >= 10, "{total:?}");
}
