//! The process's limit on open files: raised at startup from the soft to the hard limit, as Go
//! programs such as kube-apiserver do (each watch over HTTP/1.1 is a socket; a 1024 soft limit
//! would cap the proxy near 1 000 watchers).
//!
//! Called by `app::raise_open_files` (the serve subcommand, and the sim crate's `kube-watchcache sim`) and by
//! the harness (`kube-watchcache-bench`'s `procstat`); [`nofile`] by `app` to bound client
//! connections below the limit.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raises the soft limit on open files to the hard one; returns (soft, hard) afterwards
/// (`u64::MAX` for unlimited). A failure to raise leaves the old limit (logged).
pub fn raise_nofile() -> (u64, u64) {
    let cur = getrlimit(Resource::Nofile);
    // An unlimited hard limit cannot be the soft one for open files: Linux caps both at
    // `fs.nr_open`.
    let target = cur.maximum.or_else(nr_open);
    if target.is_some() && cur.current < target {
        let want = Rlimit { current: target, maximum: cur.maximum };
        if let Err(e) = setrlimit(Resource::Nofile, want) {
            tracing::warn!(error = %e, soft = ?cur.current, "could not raise the open-files limit");
        }
    }
    let now = getrlimit(Resource::Nofile);
    (now.current.unwrap_or(u64::MAX), now.maximum.unwrap_or(u64::MAX))
}

/// The soft limit on open files now (`u64::MAX` for unlimited).
pub fn nofile() -> u64 {
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

fn nr_open() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/nr_open").ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_reaches_the_hard_one() {
        let (soft, hard) = super::raise_nofile();
        if hard != u64::MAX {
            assert_eq!(soft, hard);
        } else if let Some(n) = super::nr_open() {
            assert_eq!(soft, n);
        }
        assert!(soft >= 1024);
    }
}
