//! Serving from the cache and forwarding, end to end against the simulated apiserver: every read path, gzip, live clusters, lifecycle, the wildcard, metrics, health, real clients, the sim's pods, sharded reads, the load harness.
//!
//! One test binary for the theme (one link step instead of one per file); each file is a
//! module and reads as before. `cargo test --test serving <module>::` runs one file.

#[path = "../common/mod.rs"]
mod common;

mod bench;
mod delivery_lag;
mod gzip;
mod health;
mod lifecycle;
mod live_cluster;
mod managed_fields;
mod metrics;
mod passthrough;
mod pod_updates;
mod pretty;
mod real_clients;
mod serving;
mod sharding;
mod wildcard;
