//! Reliability that fits beside other tests: relists, the reflector against a scripted upstream, `--goaway-chance`, warm restarts, the self-check.
//!
//! One test binary for the theme (one link step instead of one per file); each file is a
//! module and reads as before. `cargo test --test reliability <module>::` runs one file.

#[path = "../common/mod.rs"]
mod common;

mod consistency;
mod goaway;
mod memory_limit;
mod reflector;
mod relist;
mod warm_restart;
