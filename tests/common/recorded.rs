//! Reading the raw recordings (`tests/recordings/v1.28.7-raw/`) in tests: a recorded list's
//! parts as the apiserver wrote them, and the group/version of a recorded path. Shared by
//! `tests/protobuf/metadata_only.rs` and `tests/protobuf/protobuf.rs`.

use serde::Deserialize;
use serde_json::value::RawValue;

/// A recorded list body: its `metadata` and items, unparsed.
#[derive(Deserialize)]
pub struct RawList<'a> {
    #[serde(borrow)]
    pub metadata: &'a RawValue,
    #[serde(borrow)]
    pub items: Option<Vec<&'a RawValue>>,
}

/// (group, version) of an API path (`/api/v1/…` or `/apis/<group>/<version>/…`).
pub fn group_version(path: &str) -> (String, String) {
    let parts: Vec<&str> = path.split('/').collect();
    match parts[1] {
        "api" => (String::new(), parts[2].to_owned()),
        _ => (parts[2].to_owned(), parts[3].to_owned()),
    }
}
