//! The `sharded` scenario's shards (KEP-5866 `shardSelector`, kube-state-metrics-like): N equal
//! ranges of the 64-bit FNV-1a hash of `metadata.uid`, the selector text of each, and which
//! shard each bench pod is in (read from a LIST of the target, since uids are the server's).
//!
//! Called by `phase` (the object → shard map that decides what each sharded watcher must
//! receive) and `watchers` (the `shardSelector` of a sharded watch).

use http::Method;

use super::env::{send, HttpClient, Target};

/// `[start, end)` of shard `i` of `n` (the end of the last is 2^64).
fn bounds(i: usize, n: usize) -> (u128, u128) {
    let at = |k: usize| ((1u128 << 64) * k as u128) / n as u128;
    (at(i), at(i + 1))
}

fn hex(v: u128) -> String {
    if v == 1 << 64 {
        "0x10000000000000000".into()
    } else {
        format!("0x{v:016x}")
    }
}

/// The `shardSelector` of shard `i` of `n`, URL-encoded.
pub fn query(i: usize, n: usize) -> String {
    let (start, end) = bounds(i, n);
    let sel = format!("shardRange(object.metadata.uid, '{}', '{}')", hex(start), hex(end));
    form_urlencoded::byte_serialize(sel.as_bytes()).collect()
}

/// The shard of `n` that a uid is in.
pub fn of_uid(uid: &str, n: usize) -> usize {
    let h = uid.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
    ((u128::from(h) * n as u128) >> 64) as usize
}

/// Shard of every bench pod, by object index (`bench-pod-<i>`), from a Most Recent LIST of
/// the target.
pub async fn of_objects(
    target: &Target,
    client: &HttpClient,
    objects: usize,
    n: usize,
) -> Result<Vec<usize>, String> {
    let req = target
        // Most Recent (no resourceVersion): a cache listed at RV 0 may not hold the pods seeded
        // just before (a review).
        .request(Method::GET, "/api/v1/pods", None)
        .ok_or("cannot build the LIST of pods")?;
    let body = send(client, req).await?;
    let list: serde_json::Value = serde_json::from_slice(&body).map_err(|e| format!("pod LIST: {e}"))?;
    let mut out = vec![usize::MAX; objects];
    for item in list["items"].as_array().into_iter().flatten() {
        let name = item["metadata"]["name"].as_str().unwrap_or("");
        let index = name.strip_prefix("bench-pod-").and_then(|i| i.parse::<usize>().ok());
        if let (Some(i), Some(uid)) = (index, item["metadata"]["uid"].as_str()) {
            if i < objects {
                out[i] = of_uid(uid, n);
            }
        }
    }
    // A pod the target does not list would have its changes expected by no watcher: a target
    // missing it would pass (review). Its absence is the finding.
    if let Some(i) = out.iter().position(|s| *s == usize::MAX) {
        return Err(format!(
            "bench-pod-{i} is not in the target's LIST of pods ({} of {objects} missing): the run cannot say which watchers should get its changes",
            out.iter().filter(|s| **s == usize::MAX).count()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarters_match_the_kep_example_and_partition_the_hash_space() {
        let q = |i| {
            form_urlencoded::parse(format!("s={}", query(i, 4)).as_bytes()).next().unwrap().1.into_owned()
        };
        assert_eq!(q(0), "shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000')");
        assert_eq!(q(3), "shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')");
        // The shard of a uid is the one whose range holds its hash (proxy's hash as reference).
        for uid in ["", "a", "test-uid-123", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"] {
            let h = u128::from(kube_watchcache::selector::fnv1a64(uid.as_bytes()));
            let (s, e) = bounds(of_uid(uid, 4), 4);
            assert!(s <= h && h < e, "{uid}");
        }
        assert_eq!(bounds(2, 3).1, 1 << 64);
    }
}
