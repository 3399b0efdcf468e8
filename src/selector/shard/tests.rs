use super::*;

const UID: &str = "object.metadata.uid";

fn ok(s: &str) -> ShardSelector {
    ShardSelector::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e:?}"))
}

fn invalid(s: &str) -> String {
    match ShardSelector::parse(s) {
        Err(ShardError::Invalid(m)) => m,
        other => panic!("{s:?}: expected an apiserver error, got {other:?}"),
    }
}

fn range(start: u128, end: u128) -> ShardRange {
    ShardRange { start, end }
}

/// FNV-1a 64 reference vectors (Fowler/Noll/Vo test suite), and values of `HashField` inputs
/// from apimachinery's tests computed independently.
#[test]
fn hash_vectors() {
    for (input, want) in [
        ("", 0xcbf29ce484222325u64),
        ("a", 0xaf63dc4c8601ec8c),
        ("foobar", 0x85944171f73967e8),
        ("abc", 0xe71fa2190541574b),
        ("test-uid-123", 0xd0ba679834556c0b),
        ("test-uid-12345", 0xd4c53b72f9287c28),
        ("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 0x93754b7248a00eb9),
        ("default", 0xebada5168620c5fe),
    ] {
        assert_eq!(fnv1a64(input.as_bytes()), want, "{input:?}");
    }
}

/// Every accepted form of apiserver `sharding/parser_test.go` `TestParse`, with its ranges.
#[test]
fn valid_forms_of_the_sources() {
    let half = 0x8000000000000000u128;
    for (input, field, ranges) in [
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
            ShardField::Uid,
            vec![range(0, half)],
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')",
            ShardField::Uid,
            vec![range(0, FULL)],
        ),
        (
            "shardRange(object.metadata.namespace, '0x00000000000000aa', '0x00000000000000ff')",
            ShardField::Namespace,
            vec![range(0xaa, 0xff)],
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')",
            ShardField::Uid,
            vec![range(0, half), range(half, FULL)],
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x0000000000000005') || shardRange(object.metadata.uid, '0x0000000000000005', '0x000000000000000a') || shardRange(object.metadata.uid, '0x000000000000000a', '0x000000000000000f')",
            ShardField::Uid,
            vec![range(0, 5), range(5, 10), range(10, 15)],
        ),
        (
            "shardRange(object.metadata.uid,'0x0000000000000000','0x8000000000000000')",
            ShardField::Uid,
            vec![range(0, half)],
        ),
        (
            "  shardRange( object.metadata.uid ,  '0x0000000000000000' ,  '0x8000000000000000' )  ",
            ShardField::Uid,
            vec![range(0, half)],
        ),
        // CEL reads these the same: double quotes, newlines and tabs between tokens, spaces
        // around the dots of a path.
        (
            "shardRange(object . metadata . uid,\n\t\"0x0000000000000000\", \"0x8000000000000000\")",
            ShardField::Uid,
            vec![range(0, half)],
        ),
    ] {
        let s = ok(input);
        assert_eq!(s.field(), field, "{input}");
        assert_eq!(s.ranges(), ranges.as_slice(), "{input}");
    }
}

/// `TestParseRoundTrip`, and the normalisation `String()` applies to other spellings.
#[test]
fn canonical_text_round_trips() {
    for input in [
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
        "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')",
        "shardRange(object.metadata.namespace, '0x00000000000000aa', '0x00000000000000ff')",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')",
    ] {
        let s = ok(input);
        assert_eq!(s.to_string(), input);
        assert_eq!(ok(&s.to_string()), s);
    }
    assert_eq!(
        ok("  shardRange( object.metadata.uid ,\"0x0000000000000000\",'0x8000000000000000')||shardRange(object.metadata.uid,'0x8000000000000000','0x10000000000000000') ").to_string(),
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
    );
}

/// The error cases of `TestParse` that the apiserver reports with a text of `parser.go`
/// (after `invalid shard selector: `): the exact texts.
#[test]
fn invalid_forms_get_the_apiserver_texts() {
    for (input, want) in [
        (" ", "empty shard selector is not allowed; omit the parameter for unfiltered lists"),
        (
            "shardRange(object.metadata.uid, '0000000000000000', '0x8000000000000000')",
            "hexStart must have '0x' prefix, got \"0000000000000000\"",
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '8000000000000000')",
            "hexEnd must have '0x' prefix, got \"8000000000000000\"",
        ),
        ("shardRange(object.metadata.uid, '0x', '0x8000000000000000')", "hexStart: hex value is required after '0x'"),
        (
            "shardRange(object.metadata.name, '0x00', '0x80')",
            "unsupported field path \"object.metadata.name\"; supported: object.metadata.uid, object.metadata.namespace",
        ),
        (
            "shardRange(object.metadata.labels, '0x00', '0x80')",
            "unsupported field path \"object.metadata.labels\"; supported: object.metadata.uid, object.metadata.namespace",
        ),
        (
            "invalidFunc(object.metadata.uid, '0x00', '0x80')",
            "unsupported function \"invalidFunc\"; only shardRange() and || are allowed",
        ),
        (
            "shardRange(object.metadata.uid, '0x000000000000000000', '0x80')",
            "hexStart: hex value too long (18 chars, max 17): \"000000000000000000\"",
        ),
        ("shardRange(object.metadata.uid, '0x0g', '0x80')", "hexStart: invalid hex character \"g\" in \"0x0g\""),
        (
            "shardRange(object.metadata.uid, '0x0', '0x8') && shardRange(object.metadata.uid, '0x8', '0xf')",
            "unsupported function \"_&&_\"; only shardRange() and || are allowed",
        ),
        ("shardRange(object.metadata.uid, '0x0')", "shardRange() requires exactly 3 arguments, got 2"),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')",
            "all shard ranges must use the same field, got \"object.metadata.uid\" and \"object.metadata.namespace\"",
        ),
        (
            "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')",
            "hexStart must be a 0x-prefixed 16-digit hex value, got \"0x0\" (did you mean \"0x0000000000000000\"?)",
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0xff')",
            "hexEnd must be a 0x-prefixed 16-digit hex value, got \"0xff\" (did you mean \"0x00000000000000ff\"?)",
        ),
        (
            "shardRange(object.metadata.uid, '0x8000000000000000', '0x8000000000000000')",
            "shard range start 0x8000000000000000 must be less than end 0x8000000000000000",
        ),
        (
            "shardRange(object.metadata.uid, '0xffffffffffffffff', '0x0000000000000000')",
            "shard range start 0xffffffffffffffff must be less than end 0x0000000000000000",
        ),
        // More of the same checks, in parser.go's order.
        (
            "shardRange(object.metadata.uid, '0x1000000000000000f', '0x10000000000000000')",
            "hexStart: 17-digit hex value must be '0x10000000000000000' (2^64), got \"0x1000000000000000f\"",
        ),
        (
            "shardRange(object.metadata.uid, '0xABCDEF0000000000', '0x10000000000000000')",
            "hexStart: invalid hex character \"A\" in \"0xABCDEF0000000000\"",
        ),
        ("shardRange()", "shardRange() requires exactly 3 arguments, got 0"),
        ("shardRange(object.metadata.uid, '', '0x80')", "hexStart must have '0x' prefix, got \"\""),
        // The walk meets the bad function before the bad hex of the call after it, and the
        // first failing call of an `||` chain decides.
        (
            "has(object.metadata.uid) || shardRange(object.metadata.uid, 'zz', '0x80')",
            "unsupported function \"has\"; only shardRange() and || are allowed",
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.uid, '0x0', '0x8') && other()",
            "unsupported function \"_&&_\"; only shardRange() and || are allowed",
        ),
        // The field is checked before the bounds, the start before the end.
        (
            "shardRange(metadata.uid, 'x', 'y')",
            "unsupported field path \"metadata.uid\"; supported: object.metadata.uid, object.metadata.namespace",
        ),
        ("shardRange(object.metadata.uid, 'x', 'y')", "hexStart must have '0x' prefix, got \"x\""),
        ("shardRange(object.metadata.uid, \"it's\", 'y')", "hexStart must have '0x' prefix, got \"it's\""),
        ("shardRange(object.metadata.uid, '\"', 'y')", "hexStart must have '0x' prefix, got \"\\\"\""),
    ] {
        assert_eq!(invalid(input), want, "{input}");
    }
}

/// Forms CEL reads (or rejects with its own texts) that this port does not evaluate: they go
/// upstream. Among them the remaining error cases of `TestParse` (integer literals, a
/// comparison, a nested call).
#[test]
fn forms_only_cel_reads_go_upstream() {
    for input in [
        "shardRange(object.metadata.uid, 0, 8)",
        "object.metadata.uid > '0x0'",
        "shardRange(object.metadata.uid, hex(0), '0x8')",
        "shardRange(object.metadata.uid, hex('0'), '0x8')",
        "(shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000'))",
        "shardRange(object.metadata.uid, '0x000000000000000\\x30', '0x8000000000000000')",
        "shardRange(object.metadata.uid, r'0x0000000000000000', '0x8000000000000000')",
        "shardRange(object.metadata.uid, '''0x0000000000000000''', '0x8000000000000000')",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') // c",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000',)",
        "shardRange(object.metadata.uid, '0x0000000000000000' '0x8000000000000000')",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000'",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') ||",
        "|| shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') | x()",
        "!shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
        "x.shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
        "shardRange('object.metadata.uid', '0x0000000000000000', '0x8000000000000000')",
        "shardRange(object.metadata.uid, object.metadata.uid, '0x8000000000000000')",
        "shardRange(object.metadata.in, '0x0000000000000000', '0x8000000000000000')",
        "shardRange(namespace.x, '0x0000000000000000', '0x8000000000000000')",
        "in(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
        "shardRange",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')\u{a0}",
        "shardRange(object.metadata.uid, '0x0000000000000000', '\u{e9}')",
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x80\t00000000000000')",
        "shardRange(`object`.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
    ] {
        assert_eq!(ShardSelector::parse(input), Err(ShardError::Unsupported), "{input}");
    }
    let many = vec!["shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"; 300];
    assert_eq!(ShardSelector::parse(&many.join(" || ")), Err(ShardError::Unsupported));
}

/// `TestSelectorMatches`: start inclusive, end exclusive, over the hash of the field.
#[test]
fn matching_is_start_inclusive_end_exclusive() {
    let hash = u128::from(fnv1a64(b"test-uid-123"));
    let sel =
        |start: u128, end: u128| ShardSelector { field: ShardField::Uid, ranges: vec![range(start, end)] };
    assert!(sel(0, FULL).matches_value("test-uid-123"));
    assert!(sel(hash, hash + 1).matches_value("test-uid-123"));
    assert!(!sel(hash + 1, FULL).matches_value("test-uid-123"));
    assert!(!sel(0, hash).matches_value("test-uid-123"));
    assert!(sel(0, 1).matches_value("test-uid-123") == (hash < 1));
    // The empty string hashes to the offset basis (cluster-scoped objects by namespace).
    assert!(sel(0xcbf29ce484222325, 0xcbf29ce484222326).matches_value(""));
}

/// Four quarter shards partition the hash space: every value in exactly one.
#[test]
fn quarters_partition_the_space() {
    let q = 1u128 << 62;
    let shards: Vec<ShardSelector> = (0..4u128)
        .map(|i| ok(&format!("shardRange({UID}, '{}', '{}')", hex(i * q), hex((i + 1) * q))))
        .collect();
    let mut counts = [0usize; 4];
    for n in 0..4000 {
        let uid = format!("{n:08x}-0000-4000-8000-000000000000");
        let hits: Vec<usize> = (0..4).filter(|&i| shards[i].matches_value(&uid)).collect();
        assert_eq!(hits.len(), 1, "{uid}");
        counts[hits[0]] += 1;
    }
    assert!(counts.iter().all(|&c| c > 800), "uneven: {counts:?}");
}
