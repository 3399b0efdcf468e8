//! The `kube-watchcache` binary: parses the command line, sets up logging and runs a
//! subcommand (`serve`, `probe`; `sim`, `demo`, `bench` with the default `tools` feature). A
//! configuration error prints one line and exits 2. The proxy itself is the `kube-watchcache`
//! library; the simulated apiserver and the harness are the `kube-watchcache-sim` and
//! `kube-watchcache-bench` crates, linked only with `tools`.

#![forbid(unsafe_code)]

mod cli;
#[cfg(feature = "tools")]
mod demo;
mod probe;

use std::io::IsTerminal;

use cli::{Cli, Command};
use kube_watchcache::app;

fn main() {
    let cli = Cli::parse_args();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log_level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if cli.logging_format == "json" {
        // One JSON object per line; the event's fields at the top level, next to `timestamp`,
        // `level` and `target`, as log pipelines expect.
        logs.json().flatten_event(true).with_current_span(false).init();
    } else {
        // Colours only for a person at a terminal, never in a file or a log collector.
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }

    if let Command::Probe(args) = &cli.command {
        std::process::exit(match probe::run(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("kube-watchcache probe: {e}");
                1
            }
        });
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-watchcache: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => match args.validate() {
                Ok(args) => app::serve(args).await,
                Err(e) => Err(e),
            },
            Command::Probe(_) => Ok(()),
            #[cfg(feature = "tools")]
            Command::Sim(args) => kube_watchcache_sim::run(args).await,
            #[cfg(feature = "tools")]
            Command::Demo(args) => demo::run(args).await,
            #[cfg(feature = "tools")]
            Command::Bench(args) => kube_watchcache_bench::run(*args).await,
        }
    });
    // Blocking work left (a state file read or written on a hung mount, past its bound) does
    // not hold the exit: dropping the runtime would wait for it.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    if let Err(e) = result {
        eprintln!("kube-watchcache: {e}");
        std::process::exit(2);
    }
}
