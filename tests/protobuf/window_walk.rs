//! Seeded property tests of `proto::window::object_edit` and `proto::splice::object_splice` (a new
//! version encoded from the previous one's encoding, reading only where the JSON differs): for pairs of texts made by mutating
//! bytes, by editing generated objects of a schema with every cardinality, a field newer than
//! the upstream and embedded `kind`/`apiVersion` members, and by editing every object of the
//! 1.28.7 recording (elements deleted, swapped, moved, nulled, doubled; scalars changed), the walk
//! either gives up or gives the fresh encoding, byte for byte and in what it shares, and never
//! panics. Written as an adversarial review of the module; it found that a trailing comma was
//! accepted. `SEED` and `ITERS` (environment) change the runs; the defaults keep the file to a
//! few seconds.

use bytes::Bytes;
use kube_watchcache::proto::schema::{schema, Schema};
use kube_watchcache::proto::splice::object_splice;
use kube_watchcache::proto::transcode::object_shared;
use kube_watchcache::proto::window::object_edit;
use kube_watchcache::proto::NEWEST;

fn tiny() -> Schema {
    Schema::parse(
        "g core v1 t\n\
         m t.Meta\nf 1 name string one\nf 2 rv string one\nf 3 labels map<string,string> map\nf 4 gen int64 opt\n\
         m t.Spec\nf 1 node string one\nf 2 inner t.Meta opt\nf 3 note string one\nf 4 list string rep\nf 5 items t.Meta rep\n\
         m t.Obj\nf 1 metadata t.Meta one\nf 2 spec t.Spec one\nf 3 status t.Meta opt\n",
    )
    .unwrap()
}

/// Some(true): walked and equal; Some(false): gave up; panics on mismatch. `Err` string on a
/// mismatch instead of panicking when `soft`.
fn check(s: &Schema, msg: usize, prefix: usize, old: &str, new: &str, minor: u32) -> Result<bool, String> {
    let (old_f, new_f) = (Bytes::from(old.to_owned()), Bytes::from(new.to_owned()));
    if old.len() < prefix
        || new.len() < prefix
        || !new.is_char_boundary(prefix)
        || !old.is_char_boundary(prefix)
        || old[..prefix] != new[..prefix]
    {
        return Ok(false);
    }
    let (old_b, new_b) = (old_f.slice(prefix..), new_f.slice(prefix..));
    let Ok(prior) = object_shared(s, msg, &old_f, &old_b, prefix, minor) else { return Ok(false) };
    let fresh = object_shared(s, msg, &new_f, &new_b, prefix, minor);
    // Each encoder's bytes, and a rope's own bytes (a splice's pieces are copied into the frame).
    let walk = catch("walk", old, new, || {
        object_edit(s, msg, &new_b, &old_b, minor, &prior).map(|r| (r.to_vec(), Some(r.own_bytes(&new_b))))
    })?;
    let splice = catch("splice", old, new, || {
        object_splice(s, msg, &new_b, &old_b, minor, &prior).map(|e| (e.to_vec(), None))
    })?;
    let walked = walk.is_some();
    for (name, (bytes, own)) in
        [("walk", walk), ("splice", splice)].into_iter().filter_map(|(n, e)| Some((n, e?)))
    {
        let fresh = fresh
            .as_ref()
            .map_err(|e| format!("{name}: encoded what fresh refuses ({e})\nold {old}\nnew {new}"))?;
        if bytes != fresh.to_vec() {
            return Err(format!(
                "{name}: BYTES differ\nold {old}\nnew {new}\nedit  {bytes:?}\nfresh {:?}",
                fresh.to_vec()
            ));
        }
        if let Some(own) = own.filter(|&o| o != fresh.own_bytes(&new_b)) {
            return Err(format!(
                "{name}: OWN differ {own} vs {}\nold {old}\nnew {new}",
                fresh.own_bytes(&new_b)
            ));
        }
    }
    Ok(walked)
}

/// `f()`, a panic in it reported as a mismatch of `name`.
fn catch<T>(name: &str, old: &str, new: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|_| format!("{name} PANIC\nold {old}\nnew {new}"))
}

#[test]
fn trailing_comma() {
    let s = tiny();
    let m = s.message("t.Obj").unwrap();
    let old = r#"{"metadata":{"name":"a","rv":"1"},"spec":{"node":"n"}}"#;
    let new = r#"{"metadata":{"name":"a",},"spec":{"node":"n"}}"#;
    let mut bad = Vec::new();
    for (old, new) in [
        (old, new),
        // minimal: a member present in old and absent in new, new keeps the comma
        (r#"{"metadata":{"name":"a"}}"#, r#"{"metadata":{"name":"a",}}"#),
        // same at the top level (members(), via object() line 115 and by_name)
        (r#"{"metadata":{"name":"a"},"spec":{}}"#, r#"{"metadata":{"name":"a"},}"#),
        // inside a list element
        (r#"{"spec":{"items":[{"name":"a","rv":"1"}]}}"#, r#"{"spec":{"items":[{"name":"a",}]}}"#),
    ] {
        // Before the fix, the walk encoded these (what a fresh encoding refuses).
        if let Err(e) = check(&s, m, 1, old, new, 99) {
            bad.push(e);
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n---\n"));
}

/// Fails the test with the shortest failures found, if any.
fn report(mut fails: Vec<String>, walked: usize, total: usize) {
    fails.sort_by_key(|f| f.len());
    for f in fails.iter().take(8) {
        println!("----\n{f}");
    }
    println!("walked {walked} of {total}, fails {}", fails.len());
    assert!(fails.is_empty());
}

/// The recording's objects whose kind the schema has, with their typed prefix as the
/// apiserver writes it (kind, then apiVersion) and their compact JSON.
fn typed_recorded() -> Vec<(usize, String, String)> {
    super::after::recorded()
        .into_iter()
        .filter_map(|r| {
            let pre = format!(r#"{{"kind":{},"apiVersion":{},"#, r.obj["kind"], r.obj["apiVersion"]);
            r.base.starts_with(&pre).then_some((r.msg, pre, r.base))
        })
        .collect()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const PIECES: &[&str] = &[
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    " ",
    "\\",
    "1",
    "null",
    "\"name\":",
    "\"rv\":",
    "\"gen\":",
    "\"labels\":",
    "\"kind\":",
    "\"apiVersion\":",
    "\"x\"",
    "\"note\":",
    "\"inner\":",
    "\"items\":",
    "\"list\":",
    "\"status\":",
    "{}",
    "[]",
    "\"\\u0041\"",
    "é",
    "\"\\\"\"",
    ",\"rv\":\"7\"",
    ",\"gen\":2",
    "\"name\":\"z\",",
    "{\"name\":\"q\"}",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "\n",
    "0",
    "-1",
    "true",
];

fn mutate(r: &mut Rng, t: &str) -> String {
    let mut t = t.to_owned();
    for _ in 0..1 + r.below(3) {
        let bytes = t.as_bytes();
        let mut at = r.below(bytes.len() + 1);
        while !t.is_char_boundary(at) {
            at -= 1;
        }
        match r.below(4) {
            0 => {
                let p = PIECES[r.below(PIECES.len())];
                t.insert_str(at, p);
            }
            1 => {
                let mut end = (at + 1 + r.below(12)).min(t.len());
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                t.replace_range(at..end, "");
            }
            2 => {
                let mut end = (at + 1 + r.below(6)).min(t.len());
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                let p = PIECES[r.below(PIECES.len())];
                t.replace_range(at..end, p);
            }
            _ => {
                // duplicate a substring elsewhere
                let mut end = (at + r.below(30)).min(t.len());
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                let sub = t[at..end].to_owned();
                let mut to = r.below(t.len() + 1);
                while !t.is_char_boundary(to) {
                    to -= 1;
                }
                t.insert_str(to, &sub);
            }
        }
    }
    t
}

fn fuzz_with(s: &Schema, m: usize, prefix: usize, bases: &[String], iters: usize, seed: u64, minor: u32) {
    let mut r = Rng(seed);
    let mut fails: Vec<String> = Vec::new();
    let (mut walked, mut total) = (0, 0);
    for _ in 0..iters {
        let base = &bases[r.below(bases.len())];
        let a = if r.below(3) == 0 { mutate(&mut r, base) } else { base.clone() };
        let b = mutate(&mut r, &a);
        for (o, n) in [(&a, &b), (&b, &a)] {
            total += 1;
            match check(s, m, prefix, o, n, minor) {
                Ok(true) => walked += 1,
                Ok(false) => {}
                Err(e) => {
                    if fails.len() < 5000 {
                        fails.push(e)
                    }
                }
            }
        }
    }
    report(fails, walked, total);
}

#[test]
fn fuzz_tiny() {
    let s = tiny();
    let m = s.message("t.Obj").unwrap();
    let long = "x".repeat(70);
    let bases = vec![
        format!(
            r#"{{"metadata":{{"name":"a","rv":"10","labels":{{"k":"{long}"}},"gen":3}},"spec":{{"node":"n","inner":{{"name":"{long}","rv":"1"}},"note":"{long}","list":["a","b"],"items":[{{"name":"i1","rv":"1"}},{{"name":"{long}","gen":2}},{{"name":"i3"}}]}},"status":{{"name":"s","gen":1}}}}"#
        ),
        r#"{"metadata":{"name":"a","rv":"1"},"spec":{"node":"n","items":[{"name":"a"},{"name":"a"}]},"status":{"rv":"1","name":"a"}}"#.to_owned(),
        r#"{"metadata":{"name":"a","rv":"1","kind":"x"},"spec":{"inner":{"name":"a","rv":"1"},"items":[{"rv":"1","name":"a"},{"rv":"1","name":"a"}]},"status":{"rv":"1","name":"a"}}"#.to_owned(),
        r#"{ "metadata" : { "name" : "a" , "rv" : "1" } , "spec" : { "node" : "n" , "items" : [ { "name" : "a" } , { "name" : "a" } ] } }"#.to_owned(),
    ];
    let seed = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x1234_5678_9abc_def1);
    let iters = std::env::var("ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    fuzz_with(&s, m, 1, &bases, iters, seed, 99);
}

#[test]
fn fuzz_pod() {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/recordings/v1.28.7-raw/protobuf.json");
    let rec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let mut bases = Vec::new();
    let mut msg = None;
    let mut prefix = 0;
    for entry in rec["gets"].as_array().unwrap() {
        let Some(body) = entry["json"]["body"].as_str().filter(|_| entry["json"]["status"] == 200) else {
            continue;
        };
        let obj: serde_json::Value = serde_json::from_str(body).unwrap();
        if obj["kind"] != "Pod" || obj["apiVersion"] != "v1" {
            continue;
        }
        msg = schema().kind("", "v1", "Pod");
        let pre = format!(r#"{{"kind":{},"apiVersion":{},"#, obj["kind"], obj["apiVersion"]);
        prefix = pre.len();
        bases.push(body.trim_end().to_owned());
    }
    println!("{} pods", bases.len());
    let seed = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x2234_5678_9abc_def1);
    let iters = std::env::var("ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(2_000);
    fuzz_with(schema(), msg.unwrap(), prefix, &bases, iters, seed, NEWEST);
}

// ---------- structural fuzz: valid JSON pairs ----------

#[derive(Clone, Debug)]
enum J {
    O(Vec<(String, J)>),
    A(Vec<J>),
    L(String),
}

fn rich() -> Schema {
    Schema::parse(
        "g core v1 t\n\
         m t.Meta\nf 1 name string one\nf 2 rv string one\nf 3 labels map<string,string> map\nf 4 gen int64 opt\nf 5 newer string one since=50\nf 6 flag bool one\nf 7 tags string rep\nf 9 late t.Meta opt since=50\n\
         m t.Ref\nf 1 kind string one\nf 2 name string one\n\
         m t.Spec\nf 1 node string one\nf 2 inner t.Meta opt\nf 3 note string one\nf 4 list string rep\nf 5 items t.Meta rep\nf 6 one t.Meta one\nf 7 refs t.Ref rep\nf 8 count int32 one\n\
         m t.Obj\nf 1 metadata t.Meta one\nf 2 spec t.Spec one\nf 3 status t.Meta opt\nf 4 extra t.Spec opt since=50\n",
    )
    .unwrap()
}

fn fields_of(m: &str) -> &'static [(&'static str, &'static str)] {
    match m {
        "Meta" => &[
            ("name", "s"),
            ("rv", "s"),
            ("labels", "map"),
            ("gen", "i"),
            ("newer", "s"),
            ("flag", "b"),
            ("tags", "rs"),
            ("late", "Meta"),
        ],
        "Ref" => &[("kind", "s"), ("name", "s")],
        "Spec" => &[
            ("node", "s"),
            ("inner", "Meta"),
            ("note", "s"),
            ("list", "rs"),
            ("items", "*Meta"),
            ("one", "Meta"),
            ("refs", "*Ref"),
            ("count", "i"),
        ],
        "Obj" => &[("metadata", "Meta"), ("spec", "Spec"), ("status", "Meta"), ("extra", "Spec")],
        _ => unreachable!(),
    }
}

fn gen_str(r: &mut Rng) -> String {
    let opts = [
        "\"a\"",
        "\"b\"",
        "\"\"",
        "\"\\u0061\"",
        "\"é\"",
        "\"\\\"\"",
        "\"a,b}\"",
        "\"{\\\"k\\\":1}\"",
        "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"",
        "\"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\"",
        "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\\n\"",
        "null",
    ];
    opts[r.below(opts.len())].to_owned()
}

fn gen_val(r: &mut Rng, ty: &str, depth: usize) -> J {
    match ty {
        "s" => J::L(gen_str(r)),
        "i" => J::L(["0", "1", "7", "300", "-1", "null"][r.below(6)].to_owned()),
        "b" => J::L(["true", "false", "null"][r.below(3)].to_owned()),
        "rs" => match r.below(5) {
            0 => J::L("null".into()),
            1 => J::A(vec![]),
            _ => J::A((0..1 + r.below(3)).map(|_| J::L(gen_str(r))).collect()),
        },
        "map" => match r.below(5) {
            0 => J::L("null".into()),
            _ => J::O(
                (0..r.below(3))
                    .map(|_| (["k", "j", "a", "k"][r.below(4)].to_owned(), J::L(gen_str(r))))
                    .collect(),
            ),
        },
        t if t.starts_with('*') => {
            match r.below(6) {
                0 => J::L("null".into()),
                1 => J::A(vec![]),
                _ => J::A(
                    (0..1 + r.below(3))
                        .map(|_| {
                            if r.below(8) == 0 {
                                J::L("null".into())
                            } else {
                                gen_obj(r, &t[1..], depth + 1)
                            }
                        })
                        .collect(),
                ),
            }
        }
        m => {
            if depth > 2 || r.below(6) == 0 {
                J::L("null".into())
            } else {
                gen_obj(r, m, depth + 1)
            }
        }
    }
}

fn gen_obj(r: &mut Rng, m: &str, depth: usize) -> J {
    let fs = fields_of(m);
    let mut members = Vec::new();
    for &(k, t) in fs {
        if r.below(3) != 0 {
            members.push((k.to_owned(), gen_val(r, t, depth)));
        }
    }
    if m != "Ref" && r.below(10) == 0 {
        members.push((["kind", "apiVersion"][r.below(2)].to_owned(), J::L(gen_str(r))));
    }
    // shuffle a little
    if members.len() > 1 && r.below(3) == 0 {
        let (a, b) = (r.below(members.len()), r.below(members.len()));
        members.swap(a, b);
    }
    J::O(members)
}

fn type_at(m: &str, key: &str) -> Option<&'static str> {
    fields_of(m).iter().find(|f| f.0 == key).map(|f| f.1)
}

/// One random edit somewhere in the tree (object of message `m`).
fn edit(r: &mut Rng, j: &mut J, m: &str, depth: usize) {
    let J::O(members) = j else { return };
    // descend?
    if !members.is_empty() && r.below(3) != 0 {
        let i = r.below(members.len());
        let key = members[i].0.clone();
        if let Some(t) = type_at(m, &key) {
            match (&mut members[i].1, t) {
                (J::O(_), t) if !matches!(t, "map" | "s" | "i" | "b" | "rs") => {
                    return edit(r, &mut members[i].1, t, depth + 1)
                }
                (J::A(els), t) if t.starts_with('*') && !els.is_empty() => {
                    let k = r.below(els.len());
                    match r.below(4) {
                        0 => {
                            els.remove(k);
                        }
                        1 => els.insert(k, gen_obj(r, &t[1..], depth + 1)),
                        2 => els[k] = J::L("null".into()),
                        _ => {
                            if let J::O(_) = els[k] {
                                return edit(r, &mut els[k], &t[1..], depth + 1);
                            }
                        }
                    }
                    return;
                }
                _ => {}
            }
        }
    }
    let fs = fields_of(m);
    match r.below(6) {
        0 if !members.is_empty() => {
            let i = r.below(members.len());
            members.remove(i);
        }
        1 => {
            let (k, t) = fs[r.below(fs.len())];
            let at = r.below(members.len() + 1);
            members.insert(at, (k.to_owned(), gen_val(r, t, depth)));
        }
        2 if members.len() > 1 => {
            let (a, b) = (r.below(members.len()), r.below(members.len()));
            members.swap(a, b);
        }
        3 if !members.is_empty() => {
            let i = r.below(members.len());
            members[i].1 = J::L("null".into());
        }
        _ if !members.is_empty() => {
            let i = r.below(members.len());
            let t = type_at(m, &members[i].0).unwrap_or("s");
            members[i].1 = gen_val(r, t, depth);
        }
        _ => {}
    }
}

fn ser(j: &J, sp: &str, out: &mut String) {
    match j {
        J::L(s) => out.push_str(s),
        J::A(v) => {
            out.push('[');
            out.push_str(sp);
            for (i, e) in v.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    out.push_str(sp);
                }
                ser(e, sp, out);
                out.push_str(sp);
            }
            out.push(']');
        }
        J::O(v) => {
            out.push('{');
            out.push_str(sp);
            for (i, (k, e)) in v.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    out.push_str(sp);
                }
                out.push('"');
                out.push_str(k);
                out.push('"');
                out.push_str(sp);
                out.push(':');
                out.push_str(sp);
                ser(e, sp, out);
                out.push_str(sp);
            }
            out.push('}');
        }
    }
}

#[test]
fn fuzz_structural() {
    let s = rich();
    let m = s.message("t.Obj").unwrap();
    let seed = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x3234_5678_9abc_def1);
    let iters = std::env::var("ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let mut r = Rng(seed);
    let mut fails: Vec<String> = Vec::new();
    let (mut walked, mut total) = (0, 0);
    for _ in 0..iters {
        let a = gen_obj(&mut r, "Obj", 0);
        let mut b = a.clone();
        for _ in 0..1 + r.below(3) {
            edit(&mut r, &mut b, "Obj", 0);
        }
        let sp_a = ["", "", "", " ", "\n"][r.below(5)];
        let sp_b = if r.below(4) == 0 { ["", " ", "\n"][r.below(3)] } else { sp_a };
        let (mut ta, mut tb) = (String::new(), String::new());
        ser(&a, sp_a, &mut ta);
        ser(&b, sp_b, &mut tb);
        let minor = [99, 40][r.below(2)];
        for (o, n) in [(&ta, &tb), (&tb, &ta)] {
            total += 1;
            match check(&s, m, 1, o, n, minor) {
                Ok(true) => walked += 1,
                Ok(false) => {}
                Err(e) => fails.push(format!("minor {minor}: {e}")),
            }
        }
    }
    report(fails, walked, total);
}

fn parse_j(b: &[u8], i: &mut usize) -> J {
    let skip = |i: &mut usize| {
        while *i < b.len() && matches!(b[*i], b' ' | b'\n' | b'\t' | b'\r') {
            *i += 1
        }
    };
    skip(i);
    match b[*i] {
        b'{' => {
            *i += 1;
            let mut v = Vec::new();
            loop {
                skip(i);
                if b[*i] == b'}' {
                    *i += 1;
                    return J::O(v);
                }
                let s = *i;
                *i = end_str(b, *i);
                let k = std::str::from_utf8(&b[s + 1..*i - 1]).unwrap().to_owned();
                skip(i);
                *i += 1; // :
                let val = parse_j(b, i);
                v.push((k, val));
                skip(i);
                if b[*i] == b',' {
                    *i += 1;
                }
            }
        }
        b'[' => {
            *i += 1;
            let mut v = Vec::new();
            loop {
                skip(i);
                if b[*i] == b']' {
                    *i += 1;
                    return J::A(v);
                }
                v.push(parse_j(b, i));
                skip(i);
                if b[*i] == b',' {
                    *i += 1;
                }
            }
        }
        b'"' => {
            let s = *i;
            *i = end_str(b, *i);
            J::L(std::str::from_utf8(&b[s..*i]).unwrap().to_owned())
        }
        _ => {
            let s = *i;
            while *i < b.len() && !matches!(b[*i], b',' | b'}' | b']' | b' ' | b'\n') {
                *i += 1
            }
            J::L(std::str::from_utf8(&b[s..*i]).unwrap().to_owned())
        }
    }
}

fn end_str(b: &[u8], mut i: usize) -> usize {
    i += 1;
    loop {
        match b[i] {
            b'"' => return i + 1,
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

fn count(j: &J) -> usize {
    match j {
        J::L(_) => 1,
        J::A(v) => 1 + v.iter().map(count).sum::<usize>(),
        J::O(v) => 1 + v.iter().map(|x| count(&x.1)).sum::<usize>(),
    }
}

/// The `k`-th node in preorder.
fn nth(j: &mut J, k: &mut usize) -> Option<*mut J> {
    if *k == 0 {
        return Some(j as *mut J);
    }
    *k -= 1;
    match j {
        J::L(_) => None,
        J::A(v) => v.iter_mut().find_map(|e| nth(e, k)),
        J::O(v) => v.iter_mut().find_map(|e| nth(&mut e.1, k)),
    }
}

fn generic_edit(r: &mut Rng, root: &mut J) {
    let n = count(root);
    let mut k = 1 + r.below(n.max(2) - 1);
    let Some(p) = nth(root, &mut k) else { return };
    let node = unsafe { &mut *p };
    match node {
        J::L(s) => {
            let opts = [
                s[..].to_string(),
                "null".to_owned(),
                "\"x\"".to_owned(),
                "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""
                    .to_owned(),
                match s.strip_prefix('"') {
                    Some(rest) => format!("\"z{rest}"),
                    None => s.clone(),
                },
                if s.starts_with('"') { format!("{}\\u0041\"", &s[..s.len() - 1]) } else { "3".into() },
                "0".into(),
                "true".into(),
            ];
            *s = opts[r.below(opts.len())].clone();
        }
        J::A(v) => match r.below(4) {
            0 if !v.is_empty() => {
                let i = r.below(v.len());
                v.remove(i);
            }
            1 if !v.is_empty() => {
                let i = r.below(v.len());
                let c = v[i].clone();
                v.insert(r.below(v.len() + 1), c);
            }
            2 if !v.is_empty() => {
                let i = r.below(v.len());
                v[i] = J::L("null".into());
            }
            _ => {
                if v.len() > 1 {
                    let (a, b) = (r.below(v.len()), r.below(v.len()));
                    v.swap(a, b)
                }
            }
        },
        J::O(v) => match r.below(5) {
            0 if !v.is_empty() => {
                let i = r.below(v.len());
                v.remove(i);
            }
            1 if v.len() > 1 => {
                let (a, b) = (r.below(v.len()), r.below(v.len()));
                v.swap(a, b)
            }
            2 if !v.is_empty() => {
                let i = r.below(v.len());
                let m = v.remove(i);
                v.push(m);
            }
            3 => v.push((["kind", "apiVersion"][r.below(2)].into(), J::L("\"q\"".into()))),
            _ if !v.is_empty() => {
                let i = r.below(v.len());
                v[i].1 = J::L("null".into());
            }
            _ => {}
        },
    }
}

#[test]
fn fuzz_recording_structural() {
    let mut bases = Vec::new();
    for (msg, pre, body) in typed_recorded() {
        let j = parse_j(body.as_bytes(), &mut 0);
        bases.push((msg, pre, j));
    }
    println!("{} bases", bases.len());
    let seed = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x4234_5678_9abc_def1);
    let iters = std::env::var("ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(2_000);
    let mut r = Rng(seed);
    let mut fails = Vec::new();
    let (mut walked, mut total) = (0, 0);
    for _ in 0..iters {
        let (msg, pre, base) = &bases[r.below(bases.len())];
        let mut a = base.clone();
        if r.below(2) == 0 {
            generic_edit(&mut r, &mut a);
        }
        let mut b = a.clone();
        for _ in 0..1 + r.below(3) {
            generic_edit(&mut r, &mut b);
        }
        let (mut ta, mut tb) = (String::new(), String::new());
        let sp = if r.below(5) == 0 { " " } else { "" };
        ser(&a, "", &mut ta);
        ser(&b, sp, &mut tb);
        // keep the typed prefix as is
        let fix = |t: String| -> String {
            let J::O(v) = parse_j(t.as_bytes(), &mut 0) else { unreachable!() };
            let rest: Vec<_> = v.into_iter().filter(|(k, _)| k != "kind" && k != "apiVersion").collect();
            let mut s = String::new();
            ser(&J::O(rest), "", &mut s);
            let _ = s;
            t
        };
        let (ta, tb) = (fix(ta), fix(tb));
        if !ta.starts_with(pre.as_str()) || !tb.starts_with(pre.as_str()) {
            continue;
        }
        for (o, n) in [(&ta, &tb), (&tb, &ta)] {
            total += 1;
            match check(schema(), *msg, pre.len(), o, n, NEWEST) {
                Ok(true) => walked += 1,
                Ok(false) => {}
                Err(e) => fails.push(e),
            }
        }
    }
    report(fails, walked, total);
}

#[test]
fn fuzz_recording_bytes() {
    let seed = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5234_5678_9abc_def1u64);
    let iters = std::env::var("ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    for (k, (msg, pre, body)) in typed_recorded().into_iter().enumerate() {
        fuzz_with(schema(), msg, pre.len(), &[body], iters, seed ^ (k as u64 * 7919), NEWEST);
    }
}
