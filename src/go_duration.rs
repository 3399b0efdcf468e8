//! Go's `time.ParseDuration`, exact: the texts it accepts, the nanoseconds it makes of them
//! (integer arithmetic, a fraction's digits past 2⁶³ ignored) and its error texts, with the
//! `time` package's own quoting (bytes that are not printable ASCII as `\xNN`).
//!
//! Used by `server::phase::admit` (the query's timeout parameter, as the apiserver's
//! `WithRequestDeadline` reads it) and `proto::transcode` (`metav1.Duration`'s JSON).

const MAX: u64 = 1 << 63;

/// Nanoseconds, or Go's error text (`time: invalid duration "x"`, `time: missing unit in
/// duration "5"`, `time: unknown unit "x" in duration "5x"`).
pub fn parse(orig: &[u8]) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", quote(orig));
    let mut s = orig;
    let mut neg = false;
    if let Some(&c) = s.first() {
        if c == b'-' || c == b'+' {
            neg = c == b'-';
            s = &s[1..];
        }
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut d: u64 = 0;
    while let Some(&first) = s.first() {
        if !(first == b'.' || first.is_ascii_digit()) {
            return Err(invalid());
        }
        let before = s.len();
        let (v, rest) = leading_int(s).ok_or_else(invalid)?;
        s = rest;
        let pre = before != s.len();
        let (mut f, mut scale, mut post) = (0u64, 1f64, false);
        if s.first() == Some(&b'.') {
            s = &s[1..];
            let before = s.len();
            (f, scale, s) = leading_fraction(s);
            post = before != s.len();
        }
        if !pre && !post {
            return Err(invalid());
        }
        let i = s.iter().position(|&c| c == b'.' || c.is_ascii_digit()).unwrap_or(s.len());
        if i == 0 {
            return Err(format!("time: missing unit in duration {}", quote(orig)));
        }
        let (u, rest) = s.split_at(i);
        s = rest;
        let unit: u64 = match u {
            b"ns" => 1,
            b"us" | b"\xc2\xb5s" | b"\xce\xbcs" => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => return Err(format!("time: unknown unit {} in duration {}", quote(u), quote(orig))),
        };
        if v > MAX / unit {
            return Err(invalid());
        }
        let mut v = v * unit;
        if f > 0 {
            // Go: float64, then truncated to uint64.
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > MAX {
                return Err(invalid());
            }
        }
        d = d.wrapping_add(v);
        if d > MAX {
            return Err(invalid());
        }
    }
    if neg {
        return Ok((d as i64).wrapping_neg());
    }
    if d > MAX - 1 {
        return Err(invalid());
    }
    Ok(d as i64)
}

/// `[0-9]*`; `None` past 2⁶³ (Go's `errLeadingInt`).
fn leading_int(s: &[u8]) -> Option<(u64, &[u8])> {
    let mut x: u64 = 0;
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        if x > MAX / 10 {
            return None;
        }
        x = x * 10 + u64::from(c - b'0');
        if x > MAX {
            return None;
        }
        i += 1;
    }
    Some((x, &s[i..]))
}

/// `[0-9]*` after a `.`: the digits that fit, and their scale (the rest read and ignored).
fn leading_fraction(s: &[u8]) -> (u64, f64, &[u8]) {
    let (mut x, mut scale, mut overflow) = (0u64, 1f64, false);
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        i += 1;
        if overflow {
            continue;
        }
        if x > (MAX - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + u64::from(c - b'0');
        if y > MAX {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[i..])
}

/// The `time` package's `quote`: in double quotes, `"` and `\` escaped, every byte of a rune
/// that is not printable ASCII as `\xNN` (a byte that is not UTF-8 alone, as Go's range over
/// a string reads it).
fn quote(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if (b' '..0x80).contains(&c) {
            if c == b'"' || c == b'\\' {
                out.push('\\');
            }
            out.push(char::from(c));
            i += 1;
            continue;
        }
        let width = if c < 0x80 { 1 } else { utf8_width(&s[i..]) };
        for b in &s[i..i + width] {
            out.push_str(&format!("\\x{b:02x}"));
        }
        i += width;
    }
    out.push('"');
    out
}

/// The length of the UTF-8 sequence `s` starts with, 1 when it is not one.
fn utf8_width(s: &[u8]) -> usize {
    (2..=4.min(s.len())).find(|&n| std::str::from_utf8(&s[..n]).is_ok()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<i64, String> {
        parse(s.as_bytes())
    }

    /// Go 1.24 `time.ParseDuration`'s own test table (the valid rows) and error texts.
    #[test]
    fn as_go_parses_durations() {
        for (s, want) in [
            ("0", 0),
            ("5s", 5_000_000_000),
            ("30s", 30_000_000_000),
            ("1478s", 1_478_000_000_000),
            ("-5s", -5_000_000_000),
            ("+5s", 5_000_000_000),
            ("-0", 0),
            ("+0", 0),
            ("5.0s", 5_000_000_000),
            ("5.6s", 5_600_000_000),
            ("5.s", 5_000_000_000),
            (".5s", 500_000_000),
            ("1.0s", 1_000_000_000),
            ("1.00s", 1_000_000_000),
            ("1.004s", 1_004_000_000),
            ("1.0040s", 1_004_000_000),
            ("100.00100s", 100_001_000_000),
            ("10ns", 10),
            ("11us", 11_000),
            ("12µs", 12_000),
            ("12μs", 12_000),
            ("13ms", 13_000_000),
            ("14s", 14_000_000_000),
            ("15m", 900_000_000_000),
            ("16h", 57_600_000_000_000),
            ("3h30m", 12_600_000_000_000),
            ("10.5s4m", 250_500_000_000),
            ("-2m3.4s", -123_400_000_000),
            ("1h2m3s4ms5us6ns", 3_723_004_005_006),
            ("39h9m14.425s", 140_954_425_000_000),
            ("52763797000ns", 52_763_797_000),
            ("0.3333333333333333333h", 1_200_000_000_000),
            ("9007199254740993ns", 9_007_199_254_740_993),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036854775.807us", i64::MAX),
            ("9223372036s854ms775us807ns", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("-9223372036854775.808us", i64::MIN),
            ("-9223372036s854ms775us808ns", i64::MIN),
            ("-2562047h47m16.854775808s", i64::MIN),
            ("0.100000000000000000000h", 360_000_000_000),
            ("0.830103483285477580700h", 2_988_372_539_827),
        ] {
            assert_eq!(p(s), Ok(want), "{s}");
        }
        for (s, err) in [
            ("", r#"time: invalid duration """#),
            ("3", r#"time: missing unit in duration "3""#),
            ("-", r#"time: invalid duration "-""#),
            ("s", r#"time: invalid duration "s""#),
            (".", r#"time: invalid duration ".""#),
            ("-.", r#"time: invalid duration "-.""#),
            (".s", r#"time: invalid duration ".s""#),
            ("+.s", r#"time: invalid duration "+.s""#),
            ("1d", r#"time: unknown unit "d" in duration "1d""#),
            ("abc", r#"time: invalid duration "abc""#),
            ("\u{ffff}", r#"time: invalid duration "\xef\xbf\xbf""#),
            ("9223372036854775808ns", r#"time: invalid duration "9223372036854775808ns""#),
            ("9223372036854775.808us", r#"time: invalid duration "9223372036854775.808us""#),
            ("-9223372036854775809ns", r#"time: invalid duration "-9223372036854775809ns""#),
            ("2562047h47m16.854775808s", r#"time: invalid duration "2562047h47m16.854775808s""#),
            ("1\"x", r#"time: unknown unit "\"x" in duration "1\"x""#),
        ] {
            assert_eq!(p(s), Err(err.to_string()), "{s:?}");
        }
        assert_eq!(parse(b"\x85\x85"), Err(r#"time: invalid duration "\x85\x85""#.into()));
        // A byte that is not UTF-8 (a query's `%FF`) is escaped alone.
        assert_eq!(parse(b"1\xff"), Err(r#"time: unknown unit "\xff" in duration "1\xff""#.into()));
    }
}
