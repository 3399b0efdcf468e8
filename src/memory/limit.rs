//! The value of `--cache-memory-limit`: a byte quantity as Kubernetes writes them (`512Mi`,
//! `2Gi`, `1.5G`, `1000000`), or a percentage of the container's memory limit (`60%`, read
//! from the cgroup: v2 `memory.max`, else v1 `memory.limit_in_bytes`). Empty or `0`: no limit.
//!
//! Called by `config` (the flag's parser, [`parse`]) and `app` ([`Limit::resolve`] at start).

use std::path::Path;

/// What the flag says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// No limit (the default).
    Off,
    Bytes(u64),
    /// This share (0–100] of the container's memory limit.
    Percent(f64),
}

/// Where a container's memory limit is read: cgroup v2, then v1.
const CGROUP_FILES: &[&str] = &["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"];

/// Parses the flag (see the module doc); errors name what is wrong, for clap's message.
pub fn parse(s: &str) -> Result<Limit, String> {
    let s = s.trim();
    if s.is_empty() || s == "0" {
        return Ok(Limit::Off);
    }
    if let Some(p) = s.strip_suffix('%') {
        return match p.trim().parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(Limit::Percent(p)),
            _ => Err(format!("invalid percentage {s:?}: expected more than 0% and at most 100%")),
        };
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let unit: u64 = match suffix {
        "" => 1,
        "k" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        other => {
            return Err(format!(
                "invalid quantity {s:?}: unknown suffix {other:?} (k, M, G, T, Ki, Mi, Gi, Ti, or %)"
            ))
        }
    };
    let n: f64 = number.parse().map_err(|_| format!("invalid quantity {s:?}: expected a number"))?;
    let bytes = n * unit as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("invalid quantity {s:?}: too large"));
    }
    Ok(if bytes < 1.0 { Limit::Off } else { Limit::Bytes(bytes as u64) })
}

impl Limit {
    /// The limit in bytes, a percentage taken of the container's memory limit; `Ok(None)`:
    /// no limit. A percentage without a container limit is an error (the caller logs it and
    /// runs without).
    pub fn resolve(self) -> Result<Option<u64>, String> {
        match self {
            Limit::Off => Ok(None),
            Limit::Bytes(b) => Ok(Some(b)),
            Limit::Percent(p) => {
                let limit = CGROUP_FILES.iter().find_map(|f| container_limit(Path::new(f)));
                match limit {
                    Some(l) => Ok(Some((l as f64 * p / 100.0) as u64)),
                    None => Err(format!("{p}% of the container's memory limit: the cgroup sets none")),
                }
            }
        }
    }
}

/// The memory limit a cgroup file states; `None` for none (`max`, v1's near-`i64::MAX`
/// "unlimited") or no such file.
fn container_limit(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let n: u64 = text.trim().parse().ok()?;
    // cgroup v1 writes "unlimited" as the largest page-aligned i64.
    (n < 1 << 60).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_as_kubernetes_writes_them() {
        assert_eq!(parse("512Mi"), Ok(Limit::Bytes(512 << 20)));
        assert_eq!(parse("2Gi"), Ok(Limit::Bytes(2 << 30)));
        assert_eq!(parse("1.5G"), Ok(Limit::Bytes(1_500_000_000)));
        assert_eq!(parse("1000000"), Ok(Limit::Bytes(1_000_000)));
        assert_eq!(parse("100k"), Ok(Limit::Bytes(100_000)));
        assert_eq!(parse("60%"), Ok(Limit::Percent(60.0)));
        assert_eq!(parse(""), Ok(Limit::Off));
        assert_eq!(parse("0"), Ok(Limit::Off));
        for bad in ["1Gb", "-1Gi", "Gi", "0%", "101%", "x%", "1e400", "99999999999Ti"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cgroup_limit_is_read_and_unlimited_is_none() {
        let dir = std::env::temp_dir().join(format!("kwc-cgroup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("memory.max");
        std::fs::write(&f, "1073741824\n").unwrap();
        assert_eq!(container_limit(&f), Some(1 << 30));
        std::fs::write(&f, "max\n").unwrap();
        assert_eq!(container_limit(&f), None);
        std::fs::write(&f, "9223372036854771712\n").unwrap();
        assert_eq!(container_limit(&f), None, "cgroup v1's unlimited");
        assert_eq!(container_limit(&dir.join("absent")), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(Limit::Bytes(5).resolve(), Ok(Some(5)));
        assert_eq!(Limit::Off.resolve(), Ok(None));
    }
}
