//! The house (issue 19). No import circles between a crate's modules: reads each crate's
//! `src/` (the core's, and `crates/{sim,bench,cli}/src`), takes every `crate::a[::b]` and
//! `super::x` path outside comments and `#[cfg(test)]` code as an edge, and looks for cycles
//! among the top-level modules, and among the files of each package (`server`, `upstream`,
//! `cache`, `selector`, ...). Before: `app` ↔ `bench` ↔ `config`, `server::conn` ↔
//! `server::listener`, `upstream::auth` ↔ `upstream::config`, the sim's `http` ↔ its handlers.
//!
//! No upward arrows between crates: the core (this package) depends on neither the sim nor the
//! harness, the binary links them only with its `tools` feature, and the sim uses from the core
//! only what the recordings check (`SIM_USES`, each entry with the recording that checks it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/server/auth/mod.rs` → ["server", "auth"].
fn module_of(root: &Path, p: &Path) -> Vec<String> {
    let rel = p.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// Module paths named after `prefix` in `code` (identifiers joined by `::`; a brace group
/// gives one path per item: `x::{a::b, c}` is `x::a::b` and `x::c`).
fn paths_after<'a>(code: &'a str, prefix: &'a str) -> impl Iterator<Item = Vec<String>> + 'a {
    code.match_indices(prefix).flat_map(move |(i, _)| {
        if i > 0 && code.as_bytes()[i - 1].is_ascii_alphanumeric() {
            return Vec::new();
        }
        paths_in(&code[i + prefix.len()..]).into_iter().filter(|p| !p.is_empty()).collect()
    })
}

/// The module paths at the start of `rest` (see [`paths_after`]).
fn paths_in(rest: &str) -> Vec<Vec<String>> {
    let rest = rest.trim_start();
    if let Some(inner) = rest.strip_prefix('{') {
        let (mut depth, mut start, mut items) = (0, 0, Vec::new());
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    items.push(&inner[start..i]);
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return items.into_iter().flat_map(paths_in).collect();
    }
    let mut segs = Vec::new();
    let mut cur = rest;
    loop {
        // A module path segment: a lowercase identifier; a type or anything else ends the path
        // (a function name is kept: it has no edges of its own); `self` adds nothing.
        let id: String =
            cur.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit()).collect();
        if id.is_empty() || id == "self" {
            break;
        }
        cur = &cur[id.len()..];
        segs.push(id);
        match cur.strip_prefix("::") {
            Some(next) if next.trim_start().starts_with('{') => {
                return paths_in(next).into_iter().map(|p| [segs.clone(), p].concat()).collect();
            }
            Some(next) => cur = next,
            None => break,
        }
    }
    vec![segs]
}

/// The workspace's root (this package's directory).
fn ws(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Code outside comments and test code: a `#[cfg(test)] mod x;` line is left out, and a
/// `#[cfg(test)]` item with a body ends the file's code (test modules come last).
fn code_of(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines().filter(|l| !l.trim_start().starts_with("//")).peekable();
    while let Some(l) = lines.next() {
        if l.trim() == "#[cfg(test)]" {
            match lines.peek() {
                Some(next) if next.trim_end().ends_with(';') => {
                    lines.next();
                    continue;
                }
                _ => break,
            }
        }
        out.push(l);
    }
    out.join("\n")
}

/// The module graph of the crate whose sources are in `src` (relative to the workspace).
fn graph(src: &str) -> Graph {
    let root = ws(src);
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut g = Graph::new();
    for p in all {
        let m = module_of(&root, &p);
        if m.is_empty() || m == ["lib"] || m == ["main"] {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&p).unwrap());
        let mut to = BTreeSet::new();
        for path in paths_after(&code, "crate::") {
            to.insert(path);
        }
        let parent = &m[..m.len() - 1];
        for path in paths_after(&code, "super::") {
            let mut full = parent.to_vec();
            full.extend(path);
            to.insert(full);
        }
        g.insert(m, to);
    }
    g
}

/// Cycles of the graph collapsed by `level` (a node is dropped when `level` gives `None`).
fn cycles(g: &Graph, level: impl Fn(&[String]) -> Option<Vec<String>>) -> Vec<Vec<Vec<String>>> {
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (a, ts) in g {
        let Some(a) = level(a) else { continue };
        for t in ts {
            if let Some(b) = level(t) {
                if b != a {
                    edges.entry(a.clone()).or_default().insert(b);
                }
            }
        }
    }
    // Tarjan's strongly connected components.
    struct T<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<Vec<String>, usize>,
        low: BTreeMap<Vec<String>, usize>,
        stack: Vec<Vec<String>>,
        on: BTreeSet<Vec<String>>,
        next: usize,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit(t: &mut T<'_>, v: &Vec<String>) {
        t.index.insert(v.clone(), t.next);
        t.low.insert(v.clone(), t.next);
        t.next += 1;
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        let succ: Vec<Vec<String>> = t.edges.get(v).map(|s| s.iter().cloned().collect()).unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let nodes: Vec<Vec<String>> = edges.keys().cloned().collect();
    for v in nodes {
        if !t.index.contains_key(&v) {
            visit(&mut t, &v);
        }
    }
    t.out
}

#[test]
fn no_import_circles_between_modules() {
    for (src, at_least) in
        [("src", 50), ("crates/sim/src", 15), ("crates/bench/src", 15), ("crates/cli/src", 2)]
    {
        let g = graph(src);
        assert!(g.len() >= at_least, "the sources of {src} were read: {} modules", g.len());
        let top = cycles(&g, |m| Some(m[..1].to_vec()));
        assert!(top.is_empty(), "top-level import circles in {src}: {top:?}");
        let packages: BTreeSet<String> = g.keys().filter(|m| m.len() > 1).map(|m| m[0].clone()).collect();
        for p in packages {
            let within = cycles(&g, |m| (m.len() > 1 && m[0] == p).then(|| m[..2].to_vec()));
            assert!(within.is_empty(), "import circles in {src}/{p}: {within:?}");
        }
    }
}

/// A `[section]` of a Cargo.toml: its lines up to the next section.
fn section<'a>(toml: &'a str, name: &str) -> Vec<&'a str> {
    let head = format!("[{name}]");
    toml.lines()
        .skip_while(|l| l.trim() != head)
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect()
}

#[test]
fn the_serving_path_links_neither_the_sim_nor_the_harness() {
    let read = |p: &str| std::fs::read_to_string(ws(p)).unwrap();
    let root = read("Cargo.toml");
    let deps = section(&root, "dependencies");
    assert!(deps.len() > 20, "{deps:?}");
    assert!(
        deps.iter().all(|l| !l.contains("kube-watchcache")),
        "the core depends on a crate built on it: {deps:?}"
    );
    // The tests and benches may use them (development-only edges).
    assert!(section(&root, "dev-dependencies").iter().any(|l| l.starts_with("kube-watchcache-sim")));
    // The core's code names neither.
    let mut files_ = Vec::new();
    files(&ws("src"), &mut files_);
    for p in files_ {
        let code = code_of(&std::fs::read_to_string(&p).unwrap());
        assert!(
            !code.contains("kube_watchcache_sim") && !code.contains("kube_watchcache_bench"),
            "{}",
            p.display()
        );
    }
    // The binary links them only with `tools`, its default, which the image build turns off.
    let cli = read("crates/cli/Cargo.toml");
    for dep in ["kube-watchcache-sim", "kube-watchcache-bench"] {
        let line = section(&cli, "dependencies").into_iter().find(|l| l.starts_with(dep)).expect(dep);
        assert!(line.contains("optional = true"), "{line}");
        let tools = section(&cli, "features").into_iter().find(|l| l.starts_with("tools")).expect("tools");
        assert!(tools.contains(&format!("dep:{dep}")), "{tools}");
    }
    let docker = read("Dockerfile");
    let builds: Vec<&str> = docker.lines().filter(|l| l.contains("cargo build")).collect();
    assert!(!builds.is_empty() && builds.iter().all(|l| l.contains("--no-default-features")), "{builds:?}");
    // Its dependency layer stubs every target the manifests name, or the manifests do not load:
    // the root's benches,
    let stubs = docker.lines().find(|l| l.contains("for b in ")).expect("the benches' stub loop");
    for bench in root.split("[[bench]]").skip(1) {
        let name = bench.lines().find_map(|l| l.strip_prefix("name = ")).expect("name").trim_matches('"');
        assert!(
            stubs.split_whitespace().any(|w| w.trim_end_matches(';') == name),
            "bench {name} has no stub in the Dockerfile"
        );
    }
    // A patched dependency (vendor/h2) is in the build context and copied before the dependency
    // layer builds, or the manifests do not load there either.
    let first_build = docker.find("cargo build").expect("a build");
    for patch in section(&root, "patch.crates-io") {
        let path = patch.split("path = \"").nth(1).and_then(|p| p.split('"').next()).expect(patch);
        let top = path.split('/').next().expect(path);
        let copied = docker.find(&format!("COPY {top} ")).unwrap_or_else(|| panic!("{top} not copied"));
        assert!(copied < first_build, "{top} is copied after the dependency layer's build");
        let ignore = read(".dockerignore");
        assert!(ignore.lines().any(|l| l == format!("!{top}/")), "{top} is not in the build context");
    }
    // And every member's manifest, with a stub for each of its targets.
    let members =
        section(&root, "workspace").into_iter().find(|l| l.starts_with("members")).expect("members");
    for member in members.split('"').filter(|m| m.starts_with("crates/")) {
        let manifest = read(&format!("{member}/Cargo.toml"));
        assert!(docker.contains(&format!("COPY {member}/Cargo.toml")), "{member}'s manifest is not copied");
        let mut targets: Vec<String> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("path = "))
            .map(|p| p.trim_matches('"').to_owned())
            .collect();
        if ws(member).join("src/lib.rs").is_file() {
            targets.push("src/lib.rs".into());
        }
        assert!(!targets.is_empty(), "{member} has a target");
        for t in targets {
            assert!(docker.contains(&format!("{member}/{t}")), "{member}/{t} has no stub in the Dockerfile");
        }
    }
    // The sim does not depend on the harness.
    assert!(section(&read("crates/sim/Cargo.toml"), "dependencies")
        .iter()
        .all(|l| !l.starts_with("kube-watchcache-bench")));
}

/// What the simulated apiserver takes from the proxy's core, and what checks it. The sim is the
/// test double the proxy is checked against, so a bug in code they share would pass unseen,
/// unless the sim's answers are compared with the real apiserver's: every entry is checked by
/// recordings the sim itself is replayed against (`tests/conformance.rs` runs every scenario
/// against the sim directly, then through the proxy), or is not apiserver semantics at all.
const SIM_USES: &[(&str, &str)] = &[
    // Plain types and the object bytes as received; the JSON watch frame.
    ("resource", "recordings/v1.28.7/watch-rv-0.json"),
    // Status JSON: codes, reasons, messages, causes.
    ("error", "recordings/v1.28.7/list-multiple-validation-errors.json"),
    // ListOptions parsing, resourceVersion(Match) rules, continue tokens, booleans.
    ("params", "recordings/v1.28.7/list-continue-invalid-tokens.json"),
    // Selector grammar and its 400 texts (also how the sim's reviews read a request's selectors).
    ("selector", "recordings/v1.28.7/label-selector-malformed.json"),
    // PartialObjectMetadata(List): byte-equal to the recorded apiserver's.
    ("metadata_only", "recordings/v1.28.7-raw/metadata-only.json"),
    // Protobuf: byte-equal to the recorded apiserver's (tests/protobuf/protobuf.rs).
    ("proto", "recordings/v1.28.7-raw/protobuf.json"),
    // goautoneg's clauses and the error encoding: the 78 recorded negotiations replayed.
    ("server::classify::autoneg", "recordings/v1.28.7-raw/protobuf.json"),
    // JSON indented for `curl` and `?pretty=true`: byte-equal to the recorded apiserver's.
    ("server::indent", "recordings/v1.28.7-raw/pretty.json"),
    // Not semantics: the rustls crypto provider of the HTTPS listener.
    ("server::tls::server_provider", ""),
    // Not semantics: `kube-watchcache sim`'s signal wait, stdout line and open-files limit.
    ("app::wait_for_signal", ""),
    ("app::say", ""),
    ("app::raise_open_files", ""),
    // Not semantics: the listening socket's accept queue (net.core.somaxconn, as Go's).
    ("server::listener::bind", ""),
];

#[test]
fn the_sim_uses_only_core_code_the_recordings_check() {
    let mut files_ = Vec::new();
    files(&ws("crates/sim/src"), &mut files_);
    let mut used = BTreeSet::new();
    for p in &files_ {
        let code = code_of(&std::fs::read_to_string(p).unwrap());
        for path in paths_after(&code, "kube_watchcache::") {
            let allowed = SIM_USES.iter().any(|(m, _)| {
                let m: Vec<&str> = m.split("::").collect();
                path.len() >= m.len() && path.iter().zip(&m).all(|(a, b)| a == b)
            });
            assert!(
                allowed,
                "{}: the sim uses kube_watchcache::{} (add it to SIM_USES with what checks it)",
                p.display(),
                path.join("::")
            );
            used.insert(path[0].clone());
        }
    }
    assert!(used.len() >= 6, "the sim's sources were read: {used:?}");
    for (m, recording) in SIM_USES {
        assert!(recording.is_empty() || ws("tests").join(recording).is_file(), "{m}: {recording} is missing");
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let v = |s: &str| s.split('/').map(str::to_owned).collect::<Vec<_>>();
    let mut g = Graph::new();
    g.insert(v("a"), [v("b/x")].into());
    g.insert(v("b/x"), [v("c")].into());
    g.insert(v("c"), [v("a")].into());
    g.insert(v("d"), [v("a")].into());
    let top = cycles(&g, |m| Some(m[..1].to_vec()));
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].len(), 3);
    assert_eq!(
        paths_after("use crate::server::{auth, conn::X, Y};", "crate::").collect::<Vec<_>>(),
        [v("server/auth"), v("server/conn"), v("server")]
    );
    assert_eq!(
        paths_after("use kube_watchcache::{app::{self, start}, cache::Reader};", "kube_watchcache::")
            .collect::<Vec<_>>(),
        [v("app"), v("app/start"), v("cache")]
    );
    let code = code_of("use a;\n#[cfg(test)]\nmod tests;\nuse b;\n#[cfg(test)]\nmod t {\nuse c;\n}");
    assert_eq!(code, "use a;\nuse b;");
    assert_eq!(
        paths_after("x = crate::config::ServeArgs::local(", "crate::").collect::<Vec<_>>(),
        [v("config")]
    );
}

/// The callers a file's `//!` header names: the backticked items after "Called by", "called
/// by", "Used by" or "used by", up to the end of that sentence.
fn named_callers(header: &str) -> Vec<String> {
    let text = header.replace('\n', " ");
    let mut out = Vec::new();
    for marker in ["Called by", "called by", "Used by", "used by"] {
        let mut rest = text.as_str();
        while let Some(i) = rest.find(marker) {
            rest = &rest[i + marker.len()..];
            let end = rest.find(". ").unwrap_or(rest.len());
            let sentence = &rest[..end];
            for (k, part) in sentence.split('`').enumerate() {
                if k % 2 == 1
                    && part.chars().all(|c| c.is_alphanumeric() || c == '_' || c == ':')
                    && !part.is_empty()
                {
                    out.push(part.to_owned());
                }
            }
        }
    }
    out
}

/// Issue 32 §3: a file's header names real callers. Each caller a `//!` header names
/// (`phase::dispatch`, `state::Server::handle`, `Auth::authorize`, `app`) must resolve to code
/// of the workspace — a module (with the files under it), a module and a function it defines, or
/// a type and a method of it — and that code must mention the module the header describes: a
/// header that still names a caller from before a refactor (ten said `server::handle` after the
/// phases moved out) fails. Types (`RequestInfo`, `cache::Reader`) and the file's own items
/// are not callers and are skipped.
#[test]
fn headers_name_real_callers() {
    // (crate, module path, text) of every source file of the workspace.
    let mut sources: Vec<(String, Vec<String>, String)> = Vec::new();
    for (krate, dir) in
        [("core", "src"), ("sim", "crates/sim/src"), ("bench", "crates/bench/src"), ("cli", "crates/cli/src")]
    {
        let root = ws(dir);
        let mut all = Vec::new();
        files(&root, &mut all);
        for p in all {
            let mut m = module_of(&root, &p);
            m.insert(0, krate.to_owned());
            sources.push((krate.to_owned(), m, std::fs::read_to_string(&p).unwrap()));
        }
    }
    let ends_with = |m: &[String], s: &[&str]| {
        m.len() >= s.len() && m[m.len() - s.len()..].iter().zip(s).all(|(a, b)| a == b)
    };
    // A module path `s` names the files of that module and under it.
    let under = |m: &[String], s: &[&str]| (0..m.len()).any(|k| ends_with(&m[..=k], s));
    let mentions = |t: &str, me: &str| {
        t.match_indices(me).any(|(i, _)| {
            let before = t[..i].chars().last().is_none_or(|c| !c.is_alphanumeric() && c != '_');
            let after = t[i + me.len()..].chars().next().is_none_or(|c| !c.is_alphanumeric() && c != '_');
            before && after
        })
    };
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (krate, module, text) in &sources {
        if krate != "core" {
            continue;
        }
        let Some(me) = module.last().filter(|_| module.len() > 1) else { continue };
        let header: String = text
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .map(|l| l.trim_start_matches("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        // What the file defines for others (`pub fn saved`, `pub struct Warm`): a caller may
        // reach it through a re-export or a method instead of naming the module.
        let items: Vec<String> = text
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                ["pub fn ", "pub async fn ", "pub struct ", "pub enum ", "pub(crate) fn "]
                    .iter()
                    .find_map(|p| l.strip_prefix(p))
                    .map(|r| {
                        r.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or("").to_owned()
                    })
            })
            .filter(|n| n.len() >= 4)
            .collect();
        for caller in named_callers(&header) {
            let segs: Vec<&str> = caller.split("::").collect();
            let last = segs[segs.len() - 1];
            if last.starts_with(char::is_uppercase) {
                continue; // a type, not a caller
            }
            let fn_def = format!("fn {last}");
            if segs.len() == 1 && text.contains(&fn_def) {
                continue; // the file's own function
            }
            // `Type::method` or `module::Type::method`.
            let typed = segs.len() >= 2 && segs[segs.len() - 2].starts_with(char::is_uppercase);
            let candidates: Vec<&(String, Vec<String>, String)> = sources
                .iter()
                .filter(|(_, m, t)| {
                    if typed {
                        let ty = segs[segs.len() - 2];
                        let modules = &segs[..segs.len() - 2];
                        (modules.is_empty() || under(m, modules))
                            && (t.contains(&format!("struct {ty}"))
                                || t.contains(&format!("enum {ty}"))
                                || t.contains(&format!("impl {ty}")))
                            && t.contains(&fn_def)
                    } else {
                        under(m, &segs)
                            || (segs.len() > 1
                                && ends_with(m, &segs[..segs.len() - 1])
                                && t.contains(&fn_def))
                    }
                })
                .collect();
            if candidates.iter().all(|(_, m, _)| m == module) && !candidates.is_empty() {
                continue; // the file's own item
            }
            checked += 1;
            if candidates.is_empty() {
                wrong.push(format!(
                    "{}: names `{caller}`, which is nothing in the workspace",
                    module.join("::")
                ));
            } else if !candidates
                .iter()
                .any(|(_, m, t)| m != module && (mentions(t, me) || items.iter().any(|i| mentions(t, i))))
            {
                wrong.push(format!("{}: names `{caller}`, which never mentions `{me}`", module.join("::")));
            }
        }
    }
    assert!(checked > 20, "the headers were read ({checked} callers)");
    assert!(wrong.is_empty(), "stale callers in headers:\n{}", wrong.join("\n"));
}
