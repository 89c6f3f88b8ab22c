//! The layering of `host/` and of the twin runtime (`shmem-bindings/cann-twin/src/`): which module may import which,
//! read from the source text. Each crate's tree is a [`graph::Tree`]: its directory, its name and its floor table
//! ([`FLOORS`] for `host/`, [`TWIN_FLOORS`] for the twin).
//!
//! Every `.rs` file under `host/` is a node (`host/a/b.rs` and `host/a/b/mod.rs` are module `a::b`, `host/lib.rs` is
//! the crate root, `host/bin/x.rs` is `bin::x`, the binary). There is an arrow A -> B for every path in A's non-test
//! code that names something B defines: `crate::...` paths (in `use` items, brace groups included, and anywhere in
//! code), `super::` and `self::` paths, paths through a child module (`child::X`) or through a name a `use` brought
//! in, and `aiv_transport::...` paths of the binary.
//!
//! Where a path lands: at the longest prefix that is a module (a file or an inline `mod x { ... }`); if the next name
//! is defined there (a struct, enum, union, trait, type alias, fn, const, static or module), the path names that
//! module's file. If instead a `use` item of that module brings the name in (a `pub use` / `pub(crate) use`
//! re-export, or a private `use` a child reaches through `super::`), the path is followed on to where that `use`
//! takes it from, and again there, through chains of re-exports and through glob `use`s (`pub use self::child::*`)
//! whose module the test has read, to the module that DEFINES the item. A name that cannot be followed stays with the
//! longest module prefix's file; a name a `use` takes from another crate (`std`, a dependency) makes no arrow.
//!
//! A re-export is a name alias, not code: a `pub use` / `pub(...) use` line itself is no arrow. It is an arrow (at
//! the first line that writes the name) only when the same file's code writes the name it binds (or, for a glob, one
//! of the names of the module it takes everything from). A private `use` is an arrow, as the import of code. Arrows
//! to the root and to the module itself are dropped; `mod x;` is containment, not an arrow. Test-only code is
//! skipped: an item under `#[cfg(test)]` (or a `cfg` that implies `test`), and files declared by `#[cfg(test)] mod x;`.
//!
//! The rules (1 to 3 on both trees, 2 on `host/` only):
//! 1. floors ([`FLOORS`], [`TWIN_FLOORS`], from the bottom): a module imports only from its own floor or the floors below; the floor
//!    of a module is the floor of its top-level name, and a top-level name missing from the table fails;
//! 2. nothing under `transport` imports `engine`;
//! 3. no import cycle of more than two files (strongly connected components over files).
//! 4. no Rust source file under `host/` or `shmem-bindings/` (the twin runtime and the bindings included) over
//!    [`MAX_FILE_LINES`] lines.
//!
//! To see the whole graph, one `a::b -> c, d` line per module:
//!
//! ```text
//! AIV_PRINT_IMPORT_GRAPH=1 cargo test --test layering -- --nocapture import_graph
//! ```
//!
//! The files: `scan.rs` (the lexer and the scanner of one file), `graph.rs` (the graph builder), `rules.rs` (the
//! rules), `selfcheck.rs` (the builder and the rules on small sources).

mod graph;
mod rules;
mod scan;
mod selfcheck;

use std::path::Path;
use std::sync::OnceLock;

use graph::{build_graph, Graph, Tree};
use rules::{
    cycle_violations, floor_violations, rust_file_lengths, too_long, transport_engine_violations, MAX_FILE_LINES,
};

/// The floors, from the bottom (index = floor): the top-level modules of each. A module may import from its own floor
/// and from the floors below. `bin` stands for the binary, `host/bin/*`.
const FLOORS: &[&[&str]] = &[
    &["queue", "kernel_abi"],
    &["transfer", "evidence", "cpu_time", "config", "error", "log_limit", "trace", "bounded"],
    &["metadata", "device"],
    &["transport", "occupancy"],
    &["engine"],
    &["bench", "doctor", "audit", "bin"],
];

/// The twin runtime's floors, from the bottom: the same rule as [`FLOORS`], for `shmem-bindings/cann-twin/src/`.
const TWIN_FLOORS: &[&[&str]] = &[
    &["memory", "space", "provenance", "occupancy", "activity"],
    &["sdma", "nic"],
    &["kernel", "aicpu", "stream", "runtime", "evidence", "prof"],
    &["acl", "acl_compat", "adxl_options", "entry", "hixl", "shmem", "vmm_share"],
    &["control"],
];

/// `host/`, the library's module tree and its binary. `host/python` is the Python binding and `host/capi` the C
/// library, crates of their own which reach the library only through its public API, like any other user.
const HOST: Tree = Tree {
    dir: "host",
    name: "aiv_transport",
    floors: FLOORS,
    floors_name: "FLOORS",
    other_crates: &["capi", "python"],
};

/// The twin runtime's module tree.
const TWIN: Tree = Tree {
    dir: "shmem-bindings/cann-twin/src",
    name: "cann_twin",
    floors: TWIN_FLOORS,
    floors_name: "TWIN_FLOORS",
    other_crates: &[],
};

// ---------------------------------------------------------------------------------------------------------------
// The rules on this repository's trees.

/// Every `.rs` file under `dir`, as (path relative to `root` with `/`, source), without the tree's other crates.
fn read_sources(tree: &Tree, root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let other_crate =
            dir == root && path.file_name().is_some_and(|name| tree.other_crates.iter().any(|c| name == *c));
        if other_crate {
            continue;
        }
        if path.is_dir() {
            read_sources(tree, root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("under the tree's directory");
            let relative: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            out.push((relative.join("/"), source));
        }
    }
}

fn graph_of_tree(tree: &'static Tree) -> Graph {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(tree.dir);
    let mut sources = Vec::new();
    read_sources(tree, &dir, &dir, &mut sources);
    build_graph(tree, &sources)
}

fn tree_graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(|| graph_of_tree(&HOST))
}

fn twin_graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(|| graph_of_tree(&TWIN))
}

fn assert_none(what: &str, violations: &[String]) {
    assert!(violations.is_empty(), "{} {what}:\n{}", violations.len(), violations.join("\n"));
}

#[test]
fn floors_hold() {
    assert_none("floor violations (rule 1)", &floor_violations(tree_graph()));
}

#[test]
fn transport_does_not_import_engine() {
    assert_none("transport -> engine arrows (rule 2)", &transport_engine_violations(tree_graph()));
}

#[test]
fn no_import_cycle_of_more_than_two_files() {
    assert_none("import cycles (rule 3)", &cycle_violations(tree_graph()));
}

#[test]
fn twin_floors_hold() {
    assert_none("floor violations in the twin runtime (rule 1)", &floor_violations(twin_graph()));
}

#[test]
fn twin_has_no_import_cycle_of_more_than_two_files() {
    assert_none("import cycles in the twin runtime (rule 3)", &cycle_violations(twin_graph()));
}

/// Prints both graphs with `AIV_PRINT_IMPORT_GRAPH=1` (and `--nocapture`); checks the scan found each crate either way.
#[test]
fn import_graph() {
    for graph in [tree_graph(), twin_graph()] {
        let dir = graph.tree.dir;
        assert!(graph.files.contains_key(""), "{dir}/lib.rs was not read");
        assert!(
            graph.files.len() > 10 && graph.arrows.len() > 10,
            "the scan of {dir}/ found almost nothing:\n{}",
            graph.render()
        );
        if std::env::var("AIV_PRINT_IMPORT_GRAPH").is_ok_and(|v| v == "1") {
            print!("{dir}:\n{}", graph.render());
        }
    }
}

#[test]
fn no_rust_file_under_host_or_shmem_bindings_is_over_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["host", "shmem-bindings"] {
        rust_file_lengths(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "the walk found only {} Rust files", files.len());
    assert_none(&format!("Rust files over {MAX_FILE_LINES} lines"), &too_long(&files, root));
}
