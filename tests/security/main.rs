//! Security end to end: TLS, authentication, authorization, impersonation and identities, limits and fairness, idle connections, `--auth=none`'s loopback guard, node identities, exec credentials, the fuzz seeds.
//!
//! One test binary for the theme (one link step instead of one per file); each file is a
//! module and reads as before. `cargo test --test security <module>::` runs one file.

#[path = "../common/mod.rs"]
mod common;

mod constrained;
mod exec_credentials;
mod fairness;
mod identity;
mod idle;
mod limits;
mod loopback;
mod node_fleet;
mod security;
mod security_fuzz_seeds;
mod token_flood;
mod unusual_paths;
mod upstream_streams;
