//! The house (issue 19): no import circles between the crate's modules. Reads `src/`, takes
//! every `crate::a[::b]` and `super::x` path outside comments and `#[cfg(test)]` code as an
//! edge, and looks for cycles among the top-level modules, and among the files of each
//! package (`server`, `upstream`, `sim`, `cache`, `bench`, `selector`, ...). Before:
//! `app` ↔ `bench` ↔ `config`, `server::conn` ↔ `server::listener`, `upstream::auth` ↔
//! `upstream::config`, the sim's `http` ↔ its handlers.

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

/// Module paths named after `prefix` in `code` (identifiers joined by `::`).
fn paths_after<'a>(code: &'a str, prefix: &'a str) -> impl Iterator<Item = Vec<String>> + 'a {
    code.match_indices(prefix).filter_map(move |(i, _)| {
        if i > 0 && code.as_bytes()[i - 1].is_ascii_alphanumeric() {
            return None;
        }
        let rest = &code[i + prefix.len()..];
        let mut segs = Vec::new();
        for seg in rest.split("::") {
            // A module path segment: a lowercase identifier; a type, a brace list or anything
            // else ends the path (a function name is kept: it has no edges of its own).
            let id: String = seg
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if id.is_empty() {
                break;
            }
            let whole = id.len() == seg.len();
            segs.push(id);
            if !whole {
                break;
            }
        }
        (!segs.is_empty()).then_some(segs)
    })
}

fn graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut g = Graph::new();
    for p in all {
        let m = module_of(&root, &p);
        if m.is_empty() || m == ["lib"] || m == ["main"] {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or("")
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
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
    let g = graph();
    assert!(g.len() > 50, "the sources were read: {} modules", g.len());
    let top = cycles(&g, |m| Some(m[..1].to_vec()));
    assert!(top.is_empty(), "top-level import circles: {top:?}");
    let packages: BTreeSet<String> = g.keys().filter(|m| m.len() > 1).map(|m| m[0].clone()).collect();
    for p in packages {
        let within = cycles(&g, |m| (m.len() > 1 && m[0] == p).then(|| m[..2].to_vec()));
        assert!(within.is_empty(), "import circles in {p}: {within:?}");
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
    assert_eq!(paths_after("use crate::server::{auth, conn};", "crate::").collect::<Vec<_>>(), [v("server")]);
    assert_eq!(
        paths_after("x = crate::config::ServeArgs::local(", "crate::").collect::<Vec<_>>(),
        [v("config")]
    );
}
