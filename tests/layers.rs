//! The direction of the layers, checked on the source: which file imports which, read from
//! its `use` declarations and its `crate::`/`super::` paths (tests left out), and no file
//! imports one that imports it back, however far round. A parent module naming its own
//! children (`routes::healthz` in `http/mod.rs`) is how Rust declares them, not an import.
//!
//! `cargo test --test layers -- --nocapture` prints the graph's figures.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each layer, and the layers it must not import.
const RULES: &[(&str, &[&str])] = &[
    // The pure core: plain data and functions, what every workflow shares.
    (
        "domain",
        &[
            "workflows",
            "http",
            "config",
            "adapters",
            "ports",
            "store",
            "queue",
            "worker",
            "app",
            "cli",
            "metrics",
        ],
    ),
    // The traits the workflows act through: over domain's data only.
    (
        "ports",
        &[
            "workflows",
            "http",
            "config",
            "adapters",
            "store",
            "queue",
            "worker",
            "app",
            "cli",
        ],
    ),
    // Leaves every layer may use.
    (
        "setting",
        &[
            "workflows",
            "http",
            "config",
            "adapters",
            "ports",
            "store",
            "queue",
            "worker",
            "app",
            "cli",
        ],
    ),
    // The queue and the store keep their own settings and know no workflow.
    (
        "queue",
        &[
            "workflows",
            "http",
            "config",
            "adapters",
            "store",
            "worker",
            "app",
            "cli",
        ],
    ),
    (
        "store",
        &[
            "workflows",
            "http",
            "config",
            "adapters",
            "worker",
            "app",
            "cli",
        ],
    ),
    // Workflows act through ports and keep their own settings: no adapter, no HTTP, no
    // configuration (which assembles the workflows' sections), no wiring.
    (
        "workflows",
        &["http", "config", "adapters", "worker", "app", "cli"],
    ),
    // Adapters implement ports; they know no workflow and nothing above them.
    ("adapters", &["workflows", "http", "worker", "app", "cli"]),
    ("worker", &["http", "app", "cli", "adapters"]),
];

struct Source {
    files: BTreeMap<String, String>,
}

impl Source {
    fn read() -> Self {
        // `ROLLGATE_SRC` reads another tree, e.g. a worktree of an older commit, to
        // compare its figures with these.
        let root = std::env::var_os("ROLLGATE_SRC")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
        let mut files = BTreeMap::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src is readable") {
                let path: PathBuf = entry.expect("an entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let rel = path
                        .strip_prefix(&root)
                        .expect("under src")
                        .to_string_lossy()
                        .replace('\\', "/");
                    let text = std::fs::read_to_string(&path).expect("a source file");
                    files.insert(rel, text);
                }
            }
        }
        Self { files }
    }

    /// The module path of file `rel`: `domain/mod.rs` is `domain`, `lib.rs` the root.
    fn module_of(rel: &str) -> Vec<String> {
        let mut parts: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_owned)
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        parts
    }

    /// The file that defines the longest prefix of `path` that is a module.
    fn resolve(&self, path: &[String]) -> Option<String> {
        let modules: BTreeMap<Vec<String>, &String> =
            self.files.keys().map(|f| (Self::module_of(f), f)).collect();
        (1..=path.len())
            .rev()
            .find_map(|n| modules.get(&path[..n]).map(|f| (*f).clone()))
    }

    /// Which files each file imports.
    fn graph(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph = BTreeMap::new();
        for (rel, text) in &self.files {
            let here = Self::module_of(rel);
            let mut to = BTreeSet::new();
            for path in paths(&code_of(text)) {
                let absolute = match path.first().map(String::as_str) {
                    Some("crate") => path[1..].to_vec(),
                    Some("super") => {
                        let mut base = here.clone();
                        let mut rest = &path[..];
                        while rest.first().map(String::as_str) == Some("super") {
                            base.pop();
                            rest = &rest[1..];
                        }
                        base.extend(rest.iter().cloned());
                        base
                    }
                    Some("self") => here.iter().chain(&path[1..]).cloned().collect(),
                    _ => continue,
                };
                if let Some(file) = self.resolve(&absolute)
                    && file != *rel
                {
                    to.insert(file);
                }
            }
            graph.insert(rel.clone(), to);
        }
        graph
    }
}

/// `text` without comments and without its `#[cfg(test)]` modules (which run from the end
/// of the file's code).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| {
                let next = next.trim_start();
                ["mod ", "pub mod ", "pub(crate) mod "]
                    .iter()
                    .any(|m| next.starts_with(m))
            })
        {
            // The test module and everything after it at its depth.
            let mut depth = 0i32;
            let mut opened = false;
            for line in lines.by_ref() {
                depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
                opened |= line.contains('{');
                if opened && depth <= 0 {
                    break;
                }
            }
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every path `code` names from `crate`, `super` or `self`: in `use` trees (expanded) and
/// written out in the code.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` declarations, which may span lines.
    let mut rest = code;
    while let Some(at) = find_use(rest) {
        let after = &rest[at..];
        let Some(end) = after.find(';') else { break };
        let words: Vec<&str> = after[..end]
            .trim_start_matches("use")
            .split_whitespace()
            .collect();
        // `a as b` keeps its name as `a@b`; every other space goes.
        let tree = words.join(" ").replace(" as ", "@").replace(' ', "");
        expand(&[], &tree, &mut out);
        rest = &after[end..];
    }
    // Paths written out: `crate::a::b`, `super::a`.
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(root) {
            let start = from + found;
            from = start + root.len();
            let before = code[..start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: Vec<String> = code[start..]
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or_default()
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            out.push(path);
        }
    }
    out
}

/// Where the next `use` declaration starts in `code` (after `pub` or `pub(crate)`).
fn find_use(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = code[from..].find("use ") {
        let at = from + found;
        let line_start = code[..at].rfind('\n').map_or(0, |i| i + 1);
        let lead = code[line_start..at].trim();
        if lead.is_empty() || lead == "pub" || lead.starts_with("pub(") {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// The paths of use tree `tree` under `prefix`: `a::{b, c::{d, e}}` gives `a::b`,
/// `a::c::d`, `a::c::e`.
fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    if let Some(inner) = tree.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        let mut depth = 0;
        let mut item = String::new();
        for c in inner.chars() {
            match c {
                ',' if depth == 0 => {
                    expand(prefix, &item, out);
                    item.clear();
                    continue;
                }
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            item.push(c);
        }
        if !item.is_empty() {
            expand(prefix, &item, out);
        }
        return;
    }
    if let Some(brace) = tree.find("::{") {
        let mut next = prefix.to_vec();
        next.extend(tree[..brace].split("::").map(str::to_owned));
        expand(&next, &tree[brace + 2..], out);
        return;
    }
    let head = tree.split('@').next().unwrap_or(tree);
    let mut path = prefix.to_vec();
    path.extend(
        head.split("::")
            .filter(|s| !s.is_empty() && *s != "*")
            .map(str::to_owned),
    );
    if !path.is_empty() {
        out.push(path);
    }
}

/// The groups of files that import each other, however far round (Tarjan's strongly
/// connected components of more than one file).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

fn layer(file: &str) -> &str {
    file.split('/')
        .next()
        .unwrap_or(file)
        .trim_end_matches(".rs")
}

/// Every import that breaks a rule, as (from, to).
fn breaches(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (from, tos) in graph {
        let Some((_, banned)) = RULES.iter().find(|(l, _)| *l == layer(from)) else {
            continue;
        };
        for to in tos {
            if banned.contains(&layer(to)) {
                out.push((from.clone(), to.clone()));
            }
        }
    }
    out
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let graph = Source::read().graph();
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    let found = cycles(&graph);
    println!(
        "{} files, {edges} imports between them, {} cycles",
        graph.len(),
        found.len()
    );
    assert!(
        found.is_empty(),
        "files that import each other, however far round: {found:#?}"
    );
}

#[test]
fn imports_run_from_the_higher_layers_down() {
    let graph = Source::read().graph();
    let found = breaches(&graph);
    println!("{} imports from a lower layer up", found.len());
    for (from, to) in &found {
        println!("  {from} -> {to}");
    }
    assert!(
        found.is_empty(),
        "imports from a lower layer up (the rules are at the top of tests/layers.rs): {found:#?}"
    );
}

#[test]
fn the_domain_and_the_ports_name_no_workflow() {
    let graph = Source::read().graph();
    let climbing: Vec<_> = graph
        .iter()
        .filter(|(from, _)| layer(from) == "domain" || *from == "ports.rs")
        .flat_map(|(from, tos)| tos.iter().map(move |to| (from, to)))
        .filter(|(_, to)| layer(to) != "domain")
        .collect();
    assert!(climbing.is_empty(), "{climbing:#?}");
}

/// Each workflow's names that live outside its folder (its scope), beside the folder
/// itself: its step kinds and its run kind are its own, registered through its door.
const WORKFLOWS: &[(&str, &[&str])] = &[
    ("node_reboot", &["\"reboots:write\""]),
    ("etcd_roll", &["\"etcd-rolls:write\""]),
    ("fleet", &[]),
];

/// The most files outside each workflow's folder that may name it: what it takes today.
/// A change that needs more makes adding a workflow dearer; one that needs fewer lowers
/// the number here.
const MOST_OUTSIDE: &[(&str, usize)] = &[("node_reboot", 3), ("etcd_roll", 3), ("fleet", 2)];

/// The files outside `workflow`'s folder whose code (comments and tests left out) imports
/// the folder or names one of `names`.
fn outside(source: &Source, workflow: &str, names: &[&str]) -> BTreeSet<String> {
    let folder = format!("workflows/{workflow}/");
    let graph = source.graph();
    source
        .files
        .iter()
        .filter(|(rel, _)| !rel.starts_with(&folder))
        .filter(|(rel, text)| {
            let code = code_of(text);
            graph[*rel].iter().any(|to| to.starts_with(&folder))
                || names.iter().any(|name| {
                    code.match_indices(name).any(|(at, _)| {
                        let before = code[..at].chars().next_back();
                        let after = code[at + name.len()..].chars().next();
                        let word =
                            |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                        !word(before) && !word(after)
                    })
                })
        })
        .map(|(rel, _)| rel.clone())
        .collect()
}

#[test]
fn a_workflow_reaches_few_files_outside_its_folder() {
    let source = Source::read();
    let mut over = Vec::new();
    for (workflow, names) in WORKFLOWS {
        let found = outside(&source, workflow, names);
        println!(
            "{workflow}: {} files outside its folder: {found:?}",
            found.len()
        );
        let most = MOST_OUTSIDE
            .iter()
            .find(|(w, _)| w == workflow)
            .map_or(0, |(_, n)| *n);
        if found.len() > most {
            over.push((workflow, most, found));
        }
    }
    assert!(
        over.is_empty(),
        "named by more files outside the folder than allowed (workflow, most, files): {over:#?}"
    );
}

/// The reader itself: a `use` tree, a path written out, a test module left out, a cycle.
#[test]
fn the_reader_finds_what_a_person_would() {
    let code = code_of(
        "use crate::a::{b, c::{d, e as f}};\n\
         pub(crate) use super::g;\n\
         // use crate::commented;\n\
         fn x() { crate::h::i(); let s = \"x\"; }\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::only_in_tests;\n}\n\
         #[cfg(test)]\n\
         pub(crate) mod shared_tests {\n    use crate::only_in_tests;\n}\n",
    );
    let found: BTreeSet<String> = paths(&code).iter().map(|p| p.join("::")).collect();
    let want: BTreeSet<String> = [
        "crate::a::b",
        "crate::a::c::d",
        "crate::a::c::e",
        "super::g",
    ]
    .into_iter()
    .chain(["crate::h::i"])
    .map(str::to_owned)
    .collect();
    assert!(want.is_subset(&found), "{found:?}");
    assert!(
        !found
            .iter()
            .any(|p| p.contains("commented") || p.contains("only_in_tests"))
    );

    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a.rs", vec!["b.rs"]),
        ("b.rs", vec!["c.rs"]),
        ("c.rs", vec!["a.rs"]),
        ("d.rs", vec!["a.rs"]),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_owned(), t.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(cycles(&graph), vec![vec!["a.rs", "b.rs", "c.rs"]]);
}
