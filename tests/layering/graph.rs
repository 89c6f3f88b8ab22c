//! The graph builder: one crate's module files, resolved into arrows between modules.

use std::collections::{BTreeMap, BTreeSet};

use crate::scan::{scan, Scan};

/// A crate whose module tree the rules read.
#[derive(Debug)]
pub(crate) struct Tree {
    /// The directory of its module tree (`lib.rs` and the rest), relative to the repository: files are named so.
    pub(crate) dir: &'static str,
    /// The crate's name, as its binaries (`bin/*.rs`) spell the root of the library.
    pub(crate) name: &'static str,
    /// The floors, from the bottom (index = floor): the top-level modules of each. A module may import from its own
    /// floor and from the floors below.
    pub(crate) floors: &'static [&'static [&'static str]],
    /// The name of the floor table in this test, for the message asking to add a module to it.
    pub(crate) floors_name: &'static str,
    /// Directories directly under `dir` that are crates of their own, outside the module tree.
    pub(crate) other_crates: &'static [&'static str],
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Arrow {
    pub(crate) from: String,
    pub(crate) to: String,
    /// The line (of the file of `from`) of the first place this path is written.
    pub(crate) line: usize,
    /// The path as written.
    pub(crate) path: String,
}

#[derive(Debug)]
pub(crate) struct Graph {
    /// The crate the graph is of.
    pub(crate) tree: &'static Tree,
    /// Module name (`""` is the crate root) -> its file, `<tree dir>/...`.
    pub(crate) files: BTreeMap<String, String>,
    /// Every arrow, once per (from, to, path as written).
    pub(crate) arrows: Vec<Arrow>,
}

pub(crate) fn display(module: &str) -> &str {
    if module.is_empty() {
        "crate"
    } else {
        module
    }
}

impl Graph {
    pub(crate) fn edges(&self) -> BTreeMap<&str, BTreeSet<&str>> {
        let mut edges: BTreeMap<&str, BTreeSet<&str>> =
            self.files.keys().map(|m| (m.as_str(), BTreeSet::new())).collect();
        for arrow in &self.arrows {
            edges.entry(&arrow.from).or_default().insert(&arrow.to);
        }
        edges
    }

    /// The modules `from` imports.
    pub(crate) fn targets(&self, from: &str) -> BTreeSet<&str> {
        self.arrows.iter().filter(|a| a.from == from).map(|a| a.to.as_str()).collect()
    }

    pub(crate) fn file(&self, module: &str) -> &str {
        self.files.get(module).map_or("?", String::as_str)
    }

    /// One `a::b -> c, d` line per module.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        for (from, to) in self.edges() {
            let to: Vec<&str> = to.into_iter().map(display).collect();
            out.push_str(&format!("{} -> {}\n", display(from), to.join(", ")));
        }
        out
    }
}

/// The module of a file, from its path relative to the tree's directory (`a/b.rs`, `a/b/mod.rs`, `lib.rs`, `bin/x.rs`).
pub(crate) fn module_of(relative: &str) -> Option<Vec<String>> {
    let stem = relative.strip_suffix(".rs")?;
    if stem == "lib" {
        return Some(Vec::new());
    }
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if parts.len() > 1 && parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

struct Resolver<'a> {
    /// The non-test module files.
    modules: &'a BTreeSet<Vec<String>>,
    /// Every module, absolute: the files' and the inline ones, with the names each defines and its `use` items bind.
    namespaces: BTreeMap<Vec<String>, Namespace>,
}

/// What a `use` leaf binds a name to.
#[derive(Clone, Debug)]
enum Binding {
    /// An absolute path in this crate.
    Crate(Vec<String>),
    /// Something outside the crate (`std`, a dependency): no arrow.
    External,
}

/// One module's names (a file's module or an inline one), for following a path through it.
#[derive(Debug, Default)]
struct Namespace {
    /// The names the module defines (its items).
    defines: BTreeSet<String>,
    /// The names its `use` items bring in (re-exports and private imports alike: the compiler checks visibility).
    binds: BTreeMap<String, Binding>,
    /// The modules its glob `use` items bring in everything of.
    globs: Vec<Vec<String>>,
}

/// How many `use` bindings a path may go through before the resolver gives up (a loop of re-exports).
const MAX_HOPS: usize = 16;

/// One file, for resolving its paths.
struct FileContext {
    /// The name by which a binary reaches the library's root.
    library: &'static str,
    /// What `crate` means here (the binary is its own crate, `bin`).
    crate_base: Vec<String>,
    /// Inline modules, absolute.
    inline: BTreeSet<Vec<String>>,
    /// Names the file's `use` items bring in -> absolute paths.
    names: BTreeMap<String, Vec<String>>,
}

impl Resolver<'_> {
    /// The absolute path `segments` (written in `scope`, absolute) names, and whether it went through an imported name.
    fn absolute(
        &self,
        file: &FileContext,
        scope: &[String],
        segments: &[String],
        with_names: bool,
    ) -> Option<(Vec<String>, bool)> {
        let (first, rest) = segments.split_first()?;
        let (mut base, rest, through_name) = match first.as_str() {
            "crate" | "$crate" => (file.crate_base.clone(), rest, false),
            name if name == file.library => (Vec::new(), rest, false),
            "self" => (scope.to_vec(), rest, false),
            "super" => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let mut base = scope.to_vec();
                for _ in 0..supers {
                    base.pop()?;
                }
                (base, &segments[supers..], false)
            }
            _ => {
                let mut child = scope.to_vec();
                child.push(first.clone());
                if self.modules.contains(&child) || file.inline.contains(&child) {
                    (scope.to_vec(), segments, false)
                } else if let Some(path) = file.names.get(first).filter(|_| with_names) {
                    (path.clone(), rest, true)
                } else {
                    return None;
                }
            }
        };
        base.extend(rest.iter().cloned());
        Some((base, through_name))
    }

    /// The longest prefix of `path` that is a module file.
    fn file_module(&self, path: &[String]) -> Vec<String> {
        (0..=path.len()).rev().map(|k| path[..k].to_vec()).find(|p| self.modules.contains(p)).unwrap_or_default()
    }

    /// The module file that defines what `path` names: the longest module prefix of `path` (file or inline), then,
    /// while the next name is not defined there but brought in by a `use` (a re-export, a glob), on to where that
    /// `use` takes it from. A name that cannot be followed stays with the longest module prefix; `None` when the path
    /// leaves the crate.
    fn defining_module(&self, path: &[String]) -> Option<Vec<String>> {
        let mut path = path.to_vec();
        for _ in 0..MAX_HOPS {
            let k = (0..=path.len()).rev().find(|&k| self.namespaces.contains_key(&path[..k])).unwrap_or(0);
            let (scope, rest) = path.split_at(k);
            let here = self.file_module(scope);
            let (Some(name), Some(namespace)) = (rest.first(), self.namespaces.get(scope)) else { return Some(here) };
            if namespace.defines.contains(name) {
                return Some(here);
            }
            let next = match namespace.binds.get(name) {
                Some(Binding::External) => return None,
                Some(Binding::Crate(to)) => to.iter().chain(&rest[1..]).cloned().collect(),
                None => match namespace.globs.iter().find(|glob| self.exports(glob, name, 0)) {
                    Some(glob) => glob.iter().chain(rest).cloned().collect(),
                    None => return Some(here),
                },
            };
            path = next;
        }
        Some(self.file_module(&path))
    }

    /// Whether the module `scope` has a name `name` (defined, brought in, or a child module).
    fn exports(&self, scope: &[String], name: &str, hops: usize) -> bool {
        let Some(namespace) = self.namespaces.get(scope) else { return false };
        let child: Vec<String> = scope.iter().cloned().chain([name.to_owned()]).collect();
        namespace.defines.contains(name)
            || namespace.binds.contains_key(name)
            || self.namespaces.contains_key(&child)
            || (hops < MAX_HOPS && namespace.globs.iter().any(|glob| self.exports(glob, name, hops + 1)))
    }

    /// Every name the module `scope` has, when it is known: for telling whether a glob re-export is used.
    fn names_of(&self, scope: &[String]) -> Option<BTreeSet<String>> {
        let namespace = self.namespaces.get(scope)?;
        let mut names: BTreeSet<String> = namespace.defines.iter().chain(namespace.binds.keys()).cloned().collect();
        for glob in &namespace.globs {
            if glob.as_slice() != scope {
                names.extend(self.namespaces.get(glob).map(|g| g.defines.clone()).unwrap_or_default());
            }
        }
        Some(names)
    }

    /// The module file a path resolves to (see [`Resolver::defining_module`]); the root (no arrow) when it leaves
    /// the crate.
    fn module(&self, path: &[String]) -> Vec<String> {
        self.defining_module(path).unwrap_or_default()
    }
}

/// Builds the graph of `tree` from `(path relative to the tree's directory, source)` pairs.
pub(crate) fn build_graph(tree: &'static Tree, sources: &[(String, String)]) -> Graph {
    let scans: Vec<(Vec<String>, &str, Scan)> = sources
        .iter()
        .filter_map(|(relative, source)| Some((module_of(relative)?, relative.as_str(), scan(source))))
        .collect();
    let mut test_only: Vec<Vec<String>> = Vec::new();
    for (module, _, scan) in &scans {
        if scan.test_only_file {
            test_only.push(module.clone());
        }
        for declared in &scan.test_modules {
            test_only.push(module.iter().chain(declared).cloned().collect());
        }
    }
    let is_test = |module: &[String]| test_only.iter().any(|t| module.starts_with(t));
    let scans: Vec<_> = scans.into_iter().filter(|(module, _, _)| !is_test(module)).collect();
    let modules: BTreeSet<Vec<String>> = scans.iter().map(|(module, _, _)| module.clone()).collect();
    let mut resolver = Resolver { modules: &modules, namespaces: BTreeMap::new() };

    // The names each file's `use` items bring in (those not themselves through an imported name).
    let mut contexts = Vec::new();
    for (module, _, scan) in &scans {
        let mut file = FileContext {
            library: tree.name,
            crate_base: if module.first().is_some_and(|m| m == "bin") { vec!["bin".to_owned()] } else { Vec::new() },
            inline: scan.inline_modules.iter().map(|inner| module.iter().chain(inner).cloned().collect()).collect(),
            names: BTreeMap::new(),
        };
        let mut names = BTreeMap::new();
        for reference in &scan.refs {
            let Some(name) = &reference.binds else { continue };
            let scope: Vec<String> = module.iter().chain(&reference.scope).cloned().collect();
            if let Some((path, _)) = resolver.absolute(&file, &scope, &reference.segments, false) {
                names.insert(name.clone(), path);
            }
        }
        file.names = names;
        contexts.push(file);
    }

    // Each module's names: what it defines, what its `use` items bind (with the file's names known now) and glob.
    for (module, _, scan) in &scans {
        resolver.namespaces.entry(module.clone()).or_default();
        for (inner, defines) in &scan.defines {
            let scope: Vec<String> = module.iter().chain(inner).cloned().collect();
            resolver.namespaces.entry(scope).or_default().defines.extend(defines.iter().cloned());
        }
        for inner in &scan.inline_modules {
            resolver.namespaces.entry(module.iter().chain(inner).cloned().collect()).or_default();
        }
    }
    for ((module, _, scan), file) in scans.iter().zip(&contexts) {
        for reference in scan.refs.iter().filter(|r| r.glob || r.binds.is_some()) {
            let scope: Vec<String> = module.iter().chain(&reference.scope).cloned().collect();
            let path = resolver.absolute(file, &scope, &reference.segments, true).map(|(path, _)| path);
            if reference.glob {
                if let Some(path) = path.filter(|p| resolver.namespaces.contains_key(p)) {
                    resolver.namespaces.entry(scope).or_default().globs.push(path);
                }
                continue;
            }
            let binding = match path {
                Some(path) => Binding::Crate(path),
                None => {
                    // Not through `crate`, `self`, `super`, a module or an imported name: an item of this module
                    // (`use Kind::Variant`) or another crate.
                    let local = reference.segments.first().is_some_and(|first| {
                        resolver.namespaces.get(&scope).is_some_and(|n| n.defines.contains(first))
                    });
                    if local {
                        Binding::Crate(scope.iter().chain(&reference.segments).cloned().collect())
                    } else {
                        Binding::External
                    }
                }
            };
            let name = reference.binds.clone().expect("a binding use leaf");
            resolver.namespaces.entry(scope).or_default().binds.insert(name, binding);
        }
    }

    let mut arrows: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for ((module, _, scan), file) in scans.iter().zip(&contexts) {
        for reference in &scan.refs {
            let scope: Vec<String> = module.iter().chain(&reference.scope).cloned().collect();
            let Some((path, through_name)) = resolver.absolute(file, &scope, &reference.segments, true) else {
                continue;
            };
            let mut line = reference.line;
            if reference.reexport {
                // A re-export is a name alias, not code: it is an arrow only when this file's code writes the name.
                let written = if reference.glob {
                    resolver
                        .names_of(&path)
                        .map(|names| names.iter().filter_map(|n| scan.written.get(n)).min().copied())
                } else {
                    Some(reference.binds.as_ref().and_then(|name| scan.written.get(name)).copied())
                };
                match written {
                    Some(Some(first)) => line = first,
                    Some(None) => continue,
                    None => {} // a glob of a module the test cannot read: an arrow, as any `use`
                }
            }
            let target = resolver.module(&path);
            if through_name {
                // `Name::x` where `use a::b::Name`: the `use` already made the arrow to `a::b`; only a deeper module
                // reached through the name is news.
                let name_path = &file.names[&reference.segments[0]];
                if resolver.module(name_path) == target {
                    continue;
                }
            }
            if target.is_empty() || &target == module {
                continue;
            }
            let first =
                arrows.entry((module.join("::"), target.join("::"), reference.text.clone())).or_insert(usize::MAX);
            *first = (*first).min(line);
        }
    }
    Graph {
        tree,
        files: scans
            .iter()
            .map(|(module, relative, _)| (module.join("::"), format!("{}/{relative}", tree.dir)))
            .collect(),
        arrows: arrows.into_iter().map(|((from, to, path), line)| Arrow { from, to, line, path }).collect(),
    }
}
