//! The standard `process_*` metrics (as every Prometheus client library exports them), read from
//! `/proc/self` at each scrape: CPU seconds, resident and virtual memory, open and maximum file
//! descriptors, start time. A few lines of parsing instead of the prometheus crate's `process`
//! feature (which pulls procfs). Linux only: elsewhere the values stay 0.
//!
//! Registered by `Metrics::new`, refreshed by `Metrics::observe_caches`.

use prometheus::{Counter, Gauge, Registry};

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on every Linux ABI).
const CLK_TCK: f64 = 100.0;

pub struct Process {
    cpu: Counter,
    rss: Gauge,
    vsize: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start: Gauge,
}

fn reg<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone())).unwrap_or_else(|e| panic!("process metric: {e}"));
    c
}

impl Process {
    pub fn register(r: &Registry) -> Process {
        let g = |name: &str, help: &str| {
            reg(r, Gauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}")))
        };
        let p = Process {
            cpu: reg(
                r,
                Counter::new("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.")
                    .unwrap_or_else(|e| panic!("metric process_cpu_seconds_total: {e}")),
            ),
            rss: g("process_resident_memory_bytes", "Resident memory size in bytes."),
            vsize: g("process_virtual_memory_bytes", "Virtual memory size in bytes."),
            open_fds: g("process_open_fds", "Number of open file descriptors."),
            max_fds: g("process_max_fds", "Maximum number of open file descriptors."),
            start: g("process_start_time_seconds", "Start time of the process since unix epoch in seconds."),
        };
        if let Some(t) = start_time() {
            p.start.set(t);
        }
        p.refresh();
        p
    }

    /// Reads `/proc/self` again.
    pub fn refresh(&self) {
        if let Some(s) = read("/proc/self/stat").as_deref().and_then(Stat::parse) {
            let now = self.cpu.get();
            if s.cpu_seconds > now {
                self.cpu.inc_by(s.cpu_seconds - now);
            }
            self.vsize.set(s.vsize as f64);
        }
        if let Some(rss) = read("/proc/self/status").as_deref().and_then(vm_rss) {
            self.rss.set(rss as f64);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as f64);
        }
        if let Some(max) = read("/proc/self/limits").as_deref().and_then(max_open_files) {
            self.max_fds.set(max);
        }
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The fields of `/proc/self/stat` used here.
#[derive(Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    /// Clock ticks after boot.
    start_ticks: u64,
    vsize: u64,
}

impl Stat {
    fn parse(stat: &str) -> Option<Stat> {
        // The command name may hold spaces and parentheses: fields start after the last ')'.
        let f: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
        // f[0] is field 3 (state): field n is f[n - 3].
        let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        Some(Stat {
            cpu_seconds: (num(14)? + num(15)?) as f64 / CLK_TCK,
            start_ticks: num(22)?,
            vsize: num(23)?,
        })
    }
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    match line.get("Max open files".len()..)?.split_whitespace().next()? {
        "unlimited" => Some(f64::INFINITY),
        n => n.parse().ok(),
    }
}

/// Boot time (`btime` of `/proc/stat`) plus the process's start in ticks.
fn start_time() -> Option<f64> {
    let btime: f64 = read("/proc/stat")?
        .lines()
        .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse().ok()))?;
    let s = Stat::parse(&read("/proc/self/stat")?)?;
    Some(btime + s.start_ticks as f64 / CLK_TCK)
}

/// `VmRSS` of `/proc/self/status`, in bytes.
fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    Some(line.split_whitespace().next()?.parse::<u64>().ok()? * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces_and_parentheses() {
        let line = "1234 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 8 0 4242 104857600 2560 18446744073709551615";
        let s = Stat::parse(line).expect("parsed");
        assert_eq!(s, Stat { cpu_seconds: 3.0, start_ticks: 4242, vsize: 104_857_600 });
        assert_eq!(Stat::parse("garbage"), None);
    }

    #[test]
    fn limits() {
        let l = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(l), Some(1024.0));
        assert_eq!(vm_rss("Name:\tx\nVmRSS:\t  2048 kB\n"), Some(2048 * 1024));
    }
}
