//! CPU seconds and resident memory of the proxy process, read from `/proc`, and the open-file
//! limit the watchers need.
//!
//! Called by the phase runner (samples before/after and every 200 ms for the peak) and by
//! `bench::run` (fd limit). Linux only; elsewhere every function returns `None`.

use std::path::PathBuf;

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on every Linux ABI).
const CLK_TCK: f64 = 100.0;

/// `/proc/self` or `/proc/<pid>`.
fn dir(pid: Option<u32>) -> PathBuf {
    match pid {
        Some(p) => PathBuf::from(format!("/proc/{p}")),
        None => PathBuf::from("/proc/self"),
    }
}

/// User + system CPU seconds the process has used so far.
pub fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let stat = std::fs::read_to_string(dir(pid).join("stat")).ok()?;
    parse_cpu(&stat)
}

fn parse_cpu(stat: &str) -> Option<f64> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / CLK_TCK)
}

/// Current resident set size in bytes (`VmRSS`).
pub fn rss_bytes(pid: Option<u32>) -> Option<u64> {
    status_kb(&std::fs::read_to_string(dir(pid).join("status")).ok()?, "VmRSS:")
}

fn status_kb(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line[field.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// The soft and hard limits on open files of this process.
pub fn fd_limits() -> Option<(u64, u64)> {
    parse_limits(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

fn parse_limits(limits: &str) -> Option<(u64, u64)> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut f = line["Max open files".len()..].split_whitespace();
    let num = |s: Option<&str>| match s? {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    };
    Some((num(f.next())?, num(f.next())?))
}

/// Makes sure at least `needed` files can be open: raises the soft limit up to the hard one
/// (`kube_watchcache::rlimit`). Returns the soft limit in force afterwards.
pub fn raise_fd_limit(needed: u64) -> Option<u64> {
    let (soft, hard) = fd_limits()?;
    if soft >= needed || hard <= soft {
        return Some(soft);
    }
    kube_watchcache::rlimit::raise_nofile();
    fd_limits().map(|(s, _)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_tricky_command_name() {
        let stat = "1234 (tokio (runtime) x) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 1000 200 18446744073709551615";
        assert_eq!(parse_cpu(stat), Some(3.0));
        assert_eq!(parse_cpu("garbage"), None);
    }

    #[test]
    fn status_and_limits() {
        assert_eq!(
            status_kb("Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n", "VmRSS:"),
            Some(1024 * 1024)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1024                 524288               files     \n";
        assert_eq!(parse_limits(limits), Some((1024, 524288)));
        assert_eq!(parse_limits("Max open files  unlimited unlimited files"), Some((u64::MAX, u64::MAX)));
    }

    #[test]
    fn this_process_is_measurable() {
        assert!(cpu_seconds(None).is_some());
        assert!(rss_bytes(None).unwrap_or(0) > 0);
        let (soft, hard) = fd_limits().unwrap();
        assert!(soft <= hard);
        assert_eq!(raise_fd_limit(1), Some(soft));
    }
}
