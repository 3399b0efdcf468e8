//! Where a sharded LIST echoes `metadata.shardInfo` (the 1.36 apiserver's rules, module doc)
//! and what it selects.

use std::sync::Arc;

use bytes::Bytes;

use crate::cache::{new, CacheOptions, Filter, Page};
use crate::metadata_only::Repr;
use crate::resource::{ResourceKind, Rv};
use crate::selector::ShardSelector;

const HALF: &str = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";

fn list(kind: ResourceKind, repr: Repr, page: Option<Page>) -> serde_json::Value {
    serde_json::from_str(&raw_list(kind, repr, page)).unwrap()
}

fn raw_list(kind: ResourceKind, repr: Repr, page: Option<Page>) -> String {
    let (mut w, r) = new(kind.clone(), CacheOptions::default());
    let (api_version, kind_name) = (kind.api_version(), kind.kind.clone());
    let objects = (0..20)
        .map(|i| {
            let json = format!(
                r#"{{"apiVersion":"{api_version}","kind":"{kind_name}","metadata":{{"name":"o{i:02}","namespace":"ns","uid":"{i:02}-uid","resourceVersion":"{}"}}}}"#,
                i + 1
            );
            w.parse(Bytes::from(json)).unwrap()
        })
        .collect();
    w.replace(objects, Rv(30));
    let shard = Arc::new(ShardSelector::parse(HALF).unwrap());
    let filter = Filter::default().with_shard(Some(shard)).with_repr(repr);
    String::from_utf8(r.list(&r.snapshot(), &filter, page).unwrap().to_vec()).unwrap()
}

fn in_half(uid: &str) -> bool {
    crate::selector::fnv1a64(uid.as_bytes()) < 1 << 63
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn want() -> Vec<String> {
    (0..20).filter(|i| in_half(&format!("{i:02}-uid"))).map(|i| format!("o{i:02}")).collect()
}

#[test]
fn built_in_lists_echo_the_canonical_selector_and_select_the_shard() {
    let cms = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let v = list(cms.clone(), Repr::Full, None);
    assert_eq!(v["metadata"], serde_json::json!({"resourceVersion": "30", "shardInfo": {"selector": HALF}}));
    assert_eq!(names(&v), want());
    assert!(!want().is_empty() && want().len() < 20, "both halves hold objects");
    // A page: continue before shardInfo (Go's member order), no remainingItemCount.
    let raw = raw_list(cms, Repr::Full, Some(Page { limit: 2, start: None, token_rv: 30 }));
    let at = |k: &str| raw.find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("{k} in {raw}"));
    assert!(at("resourceVersion") < at("continue") && at("continue") < at("shardInfo"), "{raw}");
    assert!(!raw.contains("remainingItemCount"));
    assert_eq!(names(&serde_json::from_str(&raw).unwrap()), want()[..2]);
}

#[test]
fn metadata_only_and_custom_resource_lists_are_filtered_without_shard_info() {
    let cms = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let v = list(cms, Repr::Metadata, None);
    assert_eq!(v["kind"], "PartialObjectMetadataList");
    assert!(v["metadata"].get("shardInfo").is_none());
    assert_eq!(names(&v), want());
    let widgets = ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false);
    let v = list(widgets, Repr::Full, None);
    assert_eq!(v["kind"], "WidgetList");
    assert!(v["metadata"].get("shardInfo").is_none(), "{}", v["metadata"]);
    assert_eq!(names(&v), want());
}
