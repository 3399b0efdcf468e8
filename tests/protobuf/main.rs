//! Protobuf and metadata-only answers against what a real kube-apiserver sent.
//!
//! One test binary for the theme (one link step instead of one per file); each file is a
//! module and reads as before. `cargo test --test protobuf <module>::` runs one file.

#[path = "../common/mod.rs"]
mod common;

mod after;
mod managed_fields;
mod metadata_only;
mod protobuf;
mod protobuf_serving;
mod recorded_edits;
mod window_walk;
