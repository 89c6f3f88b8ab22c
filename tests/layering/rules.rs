//! The rules. Each returns its violations, one line each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::graph::{Arrow, Graph, Tree};

pub(crate) fn floor_of(tree: &Tree, module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    tree.floors.iter().position(|floor| floor.contains(&top))
}

/// Rule 1: every module is in the floor table, and no arrow goes up a floor.
pub(crate) fn floor_violations(graph: &Graph) -> Vec<String> {
    let mut violations = Vec::new();
    let mut unknown = BTreeSet::new();
    let tree = graph.tree;
    for (module, file) in &graph.files {
        if !module.is_empty() && floor_of(tree, module).is_none() {
            let top = module.split("::").next().unwrap_or(module);
            if unknown.insert(top) {
                violations.push(format!(
                    "{file}: top-level module `{top}` has no floor: add it to the floor table ({})",
                    tree.floors_name
                ));
            }
        }
    }
    for arrow in &graph.arrows {
        let (Some(from), Some(to)) = (floor_of(tree, &arrow.from), floor_of(tree, &arrow.to)) else { continue };
        if to > from {
            violations.push(format!(
                "{}:{}: `{}` (floor {from}) imports `{}` (floor {to}), upward: `{}`",
                graph.file(&arrow.from),
                arrow.line,
                arrow.from,
                arrow.to,
                arrow.path
            ));
        }
    }
    violations
}

pub(crate) fn top_level(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

/// Rule 2: nothing under `transport` imports `engine`.
pub(crate) fn transport_engine_violations(graph: &Graph) -> Vec<String> {
    graph
        .arrows
        .iter()
        .filter(|a| top_level(&a.from) == "transport" && top_level(&a.to) == "engine")
        .map(|a| {
            format!(
                "{}:{}: transport must not import engine: `{}` -> `{}` via `{}`",
                graph.file(&a.from),
                a.line,
                a.from,
                a.to,
                a.path
            )
        })
        .collect()
}

/// The strongly connected components of the graph (Tarjan), each sorted.
pub(crate) fn components<'a>(edges: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a, 'e> {
        edges: &'e BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(state: &mut State<'a, '_>, node: &'a str) {
        let index = state.index.len();
        state.index.insert(node, index);
        state.low.insert(node, index);
        state.stack.push(node);
        state.on_stack.insert(node);
        let next: Vec<&'a str> = state.edges.get(node).map(|to| to.iter().copied().collect()).unwrap_or_default();
        for to in next {
            if !state.index.contains_key(to) {
                visit(state, to);
                let low = state.low[node].min(state.low[to]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(to) {
                let low = state.low[node].min(state.index[to]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member);
                if member == node {
                    break;
                }
            }
            component.sort_unstable();
            state.out.push(component);
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &node in edges.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.out
}

/// Rule 3: no import cycle through more than two files.
pub(crate) fn cycle_violations(graph: &Graph) -> Vec<String> {
    let edges = graph.edges();
    components(&edges)
        .into_iter()
        .filter(|component| component.len() > 2)
        .map(|component| {
            let files: Vec<&str> = component.iter().map(|m| graph.file(m)).collect();
            // Each arrow inside the component once, at the first place it is written.
            let mut inside: BTreeMap<(&str, &str), (&Arrow, usize)> = BTreeMap::new();
            for arrow in &graph.arrows {
                if component.contains(&arrow.from.as_str()) && component.contains(&arrow.to.as_str()) {
                    let entry = inside.entry((&arrow.from, &arrow.to)).or_insert((arrow, 0));
                    entry.1 += 1;
                    if arrow.line < entry.0.line {
                        entry.0 = arrow;
                    }
                }
            }
            let inside: Vec<String> = inside
                .into_values()
                .map(|(a, count)| {
                    let more = if count > 1 { format!(" (+{} more)", count - 1) } else { String::new() };
                    format!("    {}:{}: `{}` -> `{}` via `{}`{more}", graph.file(&a.from), a.line, a.from, a.to, a.path)
                })
                .collect();
            format!("import cycle of {} files: {}\n{}", files.len(), files.join(", "), inside.join("\n"))
        })
        .collect()
}

// ---- 4. no Rust source file under host/ or shmem-bindings/ over MAX_FILE_LINES lines ----------------------------

/// The longest a Rust source file under `host/` or `shmem-bindings/` may be: past it, a file holds more than one
/// concern and is split by concern.
pub(crate) const MAX_FILE_LINES: usize = 1000;

/// Every `.rs` file below `dir` (build output and hidden directories skipped), with its line count.
pub(crate) fn rust_file_lengths(dir: &Path, out: &mut Vec<(PathBuf, usize)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_file_lengths(&path, out);
            }
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            out.push((path, text.lines().count()));
        }
    }
}

pub(crate) fn too_long(files: &[(PathBuf, usize)], root: &Path) -> Vec<String> {
    files
        .iter()
        .filter(|(_, lines)| *lines > MAX_FILE_LINES)
        .map(|(path, lines)| {
            format!("{}: {lines} lines (split it by concern)", path.strip_prefix(root).unwrap_or(path).display())
        })
        .collect()
}
