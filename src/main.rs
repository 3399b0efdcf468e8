//! The `kube-watchcache` binary: parses the command line and runs a subcommand.
fn main() {}
