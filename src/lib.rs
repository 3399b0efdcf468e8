//! kube-watchcache: an in-memory watch cache for the Kubernetes API, run as a reverse proxy
//! in front of kube-apiserver.
//!
//! # Layout
//!
//! Data flows one way, on two paths (docs/design.md §2):
//!
//! ```text
//!  serving:  request ─▶ server ─▶ classify ─▶ serve (cache::Reader) ─▶ response
//!                                    └──────▶ proxy (upstream) ──────▶ response
//!  filling:  upstream ─▶ reflector ─▶ cache::Writer ─▶ store + history ─▶ watchers
//! ```
//!
//! | module | owns |
//! | --- | --- |
//! | [`resource`] | plain types: `ResourceKind`, `ObjectKey`, `Rv`, `Object`, `Event` |
//! | [`metadata_only`] | the `PartialObjectMetadata` encodings (metadata-only reads) of cached bytes |
//! | [`managed_fields`] | objects without `metadata.managedFields` (`drop=metadata.managedFields`, KEP-5958) |
//! | [`proto`] | protobuf answers: the Kubernetes schema, JSON → protobuf transcoding, envelopes |
//! | [`error`] | the error enum and the one function that renders apiserver `Status` JSON |
//! | [`params`] | ListOptions query parsing, defaulting, validation, continue tokens |
//! | [`selector`] | label, field and shard (`shardSelector`) selectors: parsing (apiserver texts) and matching |
//! | [`cache`] | per-resource store, history ring, watcher fan-out; `Writer` / `Reader` |
//! | [`upstream`] | TLS client to the apiserver: config, discovery, list/watch, forwarding |
//! | [`reflector`] | the single writer: list → watch → relist, with backoff |
//! | [`caches`] | which resources are cached: discovery, retries, rediscovery, one cache + reflector each |
//! | [`server`] | listener, `classify` (pure), `serve` from cache, `proxy` upstream, health |
//! | [`memory`] | `--cache-memory-limit`: the caches measured, histories shortened, caches dropped and taken back |
//! | [`consistency`] | each cache compared with the upstream at the same RV; relisted if it differs |
//! | [`state`] | warm restarts: caches saved to and restored from `--state-dir` |
//! | [`metrics`] | Prometheus registry |
//! | [`config`] | `serve`'s flags → validated configuration |
//! | [`wanted`] | `--resources`: names, the wildcard `*`, exclusions |
//! | [`app`] | wiring: builds everything and drains it on shutdown |
//!
//! The binary (`crates/cli`), the simulated apiserver (`crates/sim`) and the load harness
//! (`crates/bench`) are crates of their own built on this one; nothing here uses them.
#![forbid(unsafe_code)]

pub mod app;
pub mod cache;
pub mod caches;
pub mod config;
pub mod consistency;
pub mod error;
pub mod go_duration;
pub mod managed_fields;
pub mod memory;
pub mod metadata_only;
pub mod metrics;
pub mod params;
pub mod proto;
pub mod reflector;
pub mod resource;
pub mod rlimit;
pub mod selector;
pub mod server;
pub mod shutdown;
pub mod state;
pub mod upstream;
pub mod wanted;
pub mod warn_gate;
