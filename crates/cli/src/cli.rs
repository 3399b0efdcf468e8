//! The command line: `kube-watchcache <serve|probe|sim|demo|bench>` with its global flags, parsed
//! into the subcommands' argument structs (the core's `config` for `serve`; `sim`, `demo` and
//! `bench` own theirs and exist with the `tools` feature). Called by `main`; sits above every
//! crate it names, none of which uses it.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use kube_watchcache::config::{explicit_flags, ServeArgs};

/// kube-watchcache: an in-memory watch cache for the Kubernetes API, run as a reverse proxy in
/// front of kube-apiserver.
#[derive(Debug, Parser)]
#[command(name = "kube-watchcache", version, about, long_about = None)]
pub struct Cli {
    /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or a tracing directive such as
    /// `kube_watchcache=debug`). RUST_LOG wins when set.
    #[arg(long, global = true, default_value = "info", env = "WATCHCACHE_LOG_LEVEL")]
    pub log_level: String,
    /// Log format: `text` (human, coloured only when stderr is a terminal) or `json` (one
    /// object per line: timestamp, level, fields, target).
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"], env = "WATCHCACHE_LOGGING_FORMAT")]
    pub logging_format: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy: cache the configured resources of the upstream apiserver and serve
    /// GET/LIST/WATCH from memory; forward everything else.
    Serve(Box<ServeArgs>),
    /// GET a health path of a proxy on this host over plain HTTP (exit 0 on 200): an exec
    /// probe for a sidecar that listens on its pod's loopback.
    Probe(crate::probe::ProbeArgs),
    #[cfg(feature = "tools")]
    /// Run a simulated kube-apiserver (in-memory objects, real resourceVersion semantics) for
    /// demos, tests and load tests.
    Sim(kube_watchcache_sim::SimArgs),
    #[cfg(feature = "tools")]
    /// Start a simulated apiserver with sample objects and the proxy in front of it, and print
    /// commands to try. Runs until Ctrl-C.
    Demo(crate::demo::DemoArgs),
    #[cfg(feature = "tools")]
    /// Load-test the proxy against the direct upstream in one run (watchers, lists, gets and
    /// upstream writes); prints a table and writes JSON and SVG reports.
    Bench(Box<kube_watchcache_bench::BenchArgs>),
}

impl Cli {
    /// Parses `argv` (program name first) and records which flags were given explicitly.
    pub fn try_parse_args<I, T>(argv: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Cli::command().try_get_matches_from(argv)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        if let (Command::Serve(args), Some(m)) = (&mut cli.command, matches.subcommand_matches("serve")) {
            args.explicit = explicit_flags(m);
        }
        Ok(cli)
    }

    /// The process's command line; a usage error prints clap's message and exits 2.
    pub fn parse_args() -> Cli {
        Cli::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_flags_parse_the_same_alone_and_on_the_command_line() {
        let flags = ["--resources", "pods", "--insecure-listen", "127.0.0.1:8001", "--history-window", "10s"];
        let cli = Cli::try_parse_args(["kube-watchcache", "serve"].iter().chain(flags.iter())).unwrap();
        let Command::Serve(a) = cli.command else { panic!("serve") };
        let b = ServeArgs::from_flags(&flags).unwrap();
        assert_eq!(a.effective().to_string(), b.effective().to_string());
        assert!(a.explicit.history_window && b.explicit.history_window);
    }
}
