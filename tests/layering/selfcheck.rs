//! The graph builder and the rules on small sources.

use std::collections::BTreeSet;
use std::path::Path;

use crate::graph::{build_graph, Arrow, Graph, Tree};
use crate::rules::{
    components, cycle_violations, floor_violations, too_long, transport_engine_violations, MAX_FILE_LINES,
};
use crate::{HOST, TWIN};

fn graph_in(tree: &'static Tree, files: &[(&str, &str)]) -> Graph {
    let sources: Vec<(String, String)> = files.iter().map(|(p, s)| ((*p).to_owned(), (*s).to_owned())).collect();
    build_graph(tree, &sources)
}

fn graph_of(files: &[(&str, &str)]) -> Graph {
    graph_in(&HOST, files)
}

fn set<'a>(modules: &[&'a str]) -> BTreeSet<&'a str> {
    modules.iter().copied().collect()
}

#[test]
fn an_upward_arrow_is_reported() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod queue;\npub mod engine;\n"),
        ("queue/mod.rs", "//! Ground floor.\n\nuse crate::engine::TransferEngine;\n"),
        ("engine/mod.rs", "use crate::queue::Ring;\n"),
    ]);
    let violations = floor_violations(&graph);
    assert_eq!(violations.len(), 1, "{violations:?}");
    let v = &violations[0];
    assert!(v.starts_with("host/queue/mod.rs:3:"), "{v}");
    assert!(
        v.contains("`queue` (floor 0) imports `engine` (floor 4)") && v.contains("crate::engine::TransferEngine"),
        "{v}"
    );
}

#[test]
fn an_upward_arrow_in_the_twin_is_reported() {
    let graph = graph_in(
        &TWIN,
        &[
            ("lib.rs", "pub mod memory;\npub mod sdma;\npub mod acl;\npub mod control;\n"),
            ("memory.rs", "pub struct Translation;\nfn f() { crate::acl::aclrtMalloc(); }\n"),
            ("sdma.rs", "use crate::memory::Translation;\n"),
            ("acl.rs", "use crate::sdma;\npub fn aclrtMalloc() {}\n"),
            ("control.rs", "use crate::acl::aclrtMalloc;\n"),
        ],
    );
    let violations = floor_violations(&graph);
    assert_eq!(violations.len(), 1, "{violations:?}");
    let v = &violations[0];
    assert!(v.starts_with("shmem-bindings/cann-twin/src/memory.rs:2:"), "{v}");
    assert!(v.contains("`memory` (floor 0) imports `acl` (floor 3)") && v.contains("crate::acl::aclrtMalloc"), "{v}");
    let unknown = graph_in(&TWIN, &[("lib.rs", "mod gadget;\n"), ("gadget.rs", "")]);
    let violations = floor_violations(&unknown);
    assert!(violations.len() == 1 && violations[0].contains("(TWIN_FLOORS)"), "{violations:?}");
}

#[test]
fn an_unknown_top_level_module_asks_for_the_floor_table() {
    let graph = graph_of(&[("lib.rs", "pub mod queue;\npub mod gadget;\n"), ("queue.rs", ""), ("gadget/mod.rs", "")]);
    let violations = floor_violations(&graph);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].contains("`gadget`") && violations[0].contains("add it to the floor table"),
        "{violations:?}"
    );
}

#[test]
fn transport_to_engine_is_reported_also_through_a_root_reexport() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod engine;\npub mod transport;\npub use engine::TransferEngine;\n"),
        ("engine/mod.rs", "pub struct TransferEngine;\n"),
        ("transport/mod.rs", "pub mod tcp;\n"),
        ("transport/tcp.rs", "fn f(engine: &crate::TransferEngine) {}\nuse crate::engine;\n"),
    ]);
    let violations = transport_engine_violations(&graph);
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(violations.iter().all(|v| v.starts_with("host/transport/tcp.rs:")), "{violations:?}");
    assert!(
        violations[0].contains("crate::TransferEngine") && violations[1].contains("crate::engine"),
        "{violations:?}"
    );
    let upward = floor_violations(&graph);
    assert_eq!(upward.len(), 2, "transport is below engine too: {upward:?}");
}

#[test]
fn a_three_module_cycle_is_reported_and_a_two_module_one_is_not() {
    let three = graph_of(&[
        ("lib.rs", "pub mod config;\npub mod error;\npub mod evidence;\n"),
        ("config.rs", "use crate::error::EngineError;\n"),
        ("error.rs", "fn f() { crate::evidence::record(); }\n"),
        ("evidence.rs", "use crate::config::Config;\n"),
    ]);
    let violations = cycle_violations(&three);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].starts_with("import cycle of 3 files: host/config.rs, host/error.rs, host/evidence.rs"),
        "{violations:?}"
    );
    let two = graph_of(&[
        ("lib.rs", "pub mod config;\npub mod error;\n"),
        ("config.rs", "use crate::error::EngineError;\n"),
        ("error.rs", "use crate::config::Config;\n"),
    ]);
    assert!(cycle_violations(&two).is_empty(), "{:?}", cycle_violations(&two));
}

#[test]
fn test_code_comments_and_literals_are_ignored() {
    let source = r##"
//! Docs naming [`crate::engine::TransferEngine`].
// use crate::engine::A;
/* crate::engine::B /* nested */ crate::engine::C */
/// See `crate::engine::D`.
const OPEN: char = '{';
const TEXT: &str = "crate::engine::E } {";
const RAW: &str = r#"crate::engine::F " }"#;
fn lifetimes<'a>(x: &'a str) -> &'a str { x }

#[cfg(test)]
mod tests {
    use crate::engine::G;
    fn f() { let s = "}"; let c = '}'; crate::engine::h(); }
}

#[cfg(test)]
fn helper() { crate::engine::i() }

#[cfg(test)]
use crate::engine::J;

#[cfg(test)]
impl Thing { fn k() { crate::engine::k() } }

#[cfg(all(test, not(feature = "cann")))]
mod more_tests { use crate::engine::L; }

#[cfg(test)]
mod file_tests;

#[cfg(not(test))]
use crate::error::EngineError;

#[cfg(any(test, feature = "cann"))]
fn real() { crate::evidence::record() }

pub fn after() -> crate::transfer::Opcode { todo() }
"##;
    let graph = graph_of(&[
        ("lib.rs", "pub mod queue;\npub mod engine;\npub mod error;\npub mod evidence;\npub mod transfer;\n"),
        ("queue/mod.rs", source),
        ("queue/file_tests.rs", "use crate::engine::M;\n"),
        ("engine.rs", ""),
        ("error.rs", ""),
        ("evidence.rs", ""),
        ("transfer.rs", ""),
    ]);
    assert_eq!(graph.targets("queue"), set(&["error", "evidence", "transfer"]), "{:?}", graph.arrows);
    assert!(!graph.files.contains_key("queue::file_tests"), "a #[cfg(test)] mod's file is test-only");
    let after = graph.arrows.iter().find(|a| a.to == "transfer").expect("the arrow to transfer");
    assert_eq!(after.line, source.lines().position(|l| l.contains("fn after")).expect("fn after") + 1);
}

#[test]
fn use_groups_and_nested_groups_resolve_to_the_longest_module_prefix() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod transfer;\npub mod config;\npub mod error;\npub mod engine;\n"),
        ("transfer/mod.rs", "pub mod request;\npub mod completion;\npub mod segment;\npub mod task;\n"),
        ("transfer/request.rs", ""),
        ("transfer/completion.rs", ""),
        ("transfer/segment.rs", ""),
        ("transfer/task.rs", ""),
        ("config.rs", ""),
        ("error.rs", ""),
        (
            "engine/mod.rs",
            "use crate::transfer::{request::BatchId, completion,\n    \
             segment::{self, Segment}, task::{TaskSlot as Slot}};\n\
             // A comment in between.\n\
             use crate::{config::{self, EngineConfig}, error::{EngineError}};\n",
        ),
    ]);
    let expected =
        set(&["transfer::request", "transfer::completion", "transfer::segment", "transfer::task", "config", "error"]);
    assert_eq!(graph.targets("engine"), expected, "{:?}", graph.arrows);
    assert!(
        graph.arrows.iter().any(|a| a.path == "crate::transfer::segment::self" && a.line == 2),
        "{:?}",
        graph.arrows
    );
}

#[test]
fn crate_paths_in_expressions_and_through_imported_names_resolve() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod transfer;\npub mod evidence;\npub mod engine;\n"),
        ("transfer/mod.rs", "pub mod request;\n"),
        ("transfer/request.rs", ""),
        ("evidence.rs", ""),
        (
            "engine.rs",
            "use crate::transfer as t;\nfn f() {\n    let id = crate::transfer::request::BatchId::new();\n    \
             crate::evidence::record(&id);\n    t::request::x();\n}\n",
        ),
    ]);
    assert_eq!(graph.targets("engine"), set(&["transfer", "transfer::request", "evidence"]), "{:?}", graph.arrows);
    let through: Vec<&Arrow> = graph.arrows.iter().filter(|a| a.to == "transfer::request").collect();
    assert_eq!(through.len(), 2, "{through:?}");
}

#[test]
fn super_self_and_child_paths_resolve() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod transport;\n"),
        ("transport/mod.rs", "pub mod aiv;\npub mod tcp;\npub mod window;\nuse self::tcp::TcpTransport;\n"),
        ("transport/aiv.rs", "pub mod ring;\nfn f() { ring::push(); }\n"),
        ("transport/aiv/ring.rs", "use super::super::window::Window;\n"),
        ("transport/window.rs", ""),
        ("transport/tcp/mod.rs", "mod wire;\nuse self::wire::Frame;\nuse super::window;\npub use wire::Header;\n"),
        ("transport/tcp/wire.rs", "use super::*;\nfn g() { super::super::aiv::h(); }\n"),
    ]);
    assert_eq!(graph.targets("transport"), set(&["transport::tcp"]));
    assert_eq!(graph.targets("transport::aiv"), set(&["transport::aiv::ring"]));
    assert_eq!(graph.targets("transport::aiv::ring"), set(&["transport::window"]));
    assert_eq!(graph.targets("transport::tcp"), set(&["transport::tcp::wire", "transport::window"]));
    assert_eq!(graph.targets("transport::tcp::wire"), set(&["transport::tcp", "transport::aiv"]));
}

#[test]
fn inline_modules_shift_super_and_the_binary_reaches_the_library_by_name() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod queue;\npub mod engine;\n"),
        ("queue/mod.rs", "pub mod chunk;\npub mod ring;\n"),
        ("queue/ring.rs", ""),
        ("queue/chunk.rs", "pub mod kernel {\n    use super::Piece;\n    fn f() { super::super::ring::x() }\n}\n"),
        ("engine.rs", ""),
        ("bin/aiv.rs", "use aiv_transport::engine::TransferEngine;\nfn main() { aiv_transport::queue::ring::x(); }\n"),
    ]);
    assert_eq!(graph.targets("queue::chunk"), set(&["queue::ring"]), "{:?}", graph.arrows);
    assert_eq!(graph.targets("bin::aiv"), set(&["engine", "queue::ring"]), "{:?}", graph.arrows);
    assert!(floor_violations(&graph).is_empty(), "{:?}", floor_violations(&graph));
}

#[test]
fn the_graph_prints_one_line_per_module() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod error;\npub mod config;\nuse error::EngineError;\n"),
        ("error.rs", ""),
        ("config.rs", "use crate::error::EngineError;\nuse crate::EngineError as E;\n"),
    ]);
    assert_eq!(graph.render(), "crate -> error\nconfig -> error\nerror -> \n");
}

#[test]
fn a_reexport_is_an_arrow_only_where_the_file_writes_the_name() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod error;\npub mod metadata;\npub use error::EngineError;\n"),
        ("error.rs", "pub struct EngineError;\n"),
        (
            "metadata/mod.rs",
            "pub mod name;\npub mod service;\npub mod store;\n\
             pub use name::SegmentName;\npub(crate) use self::service::*;\npub use store::{KeyLayout, RpcMeta};\n\
             \n\
             pub fn rpc_of(name: &str) -> RpcMeta { todo!() }\n\
             fn label() -> String { format!(\"{SegmentName}-{{MetadataService}}\") }\n",
        ),
        ("metadata/name.rs", "pub struct SegmentName;\n"),
        ("metadata/service.rs", "pub struct MetadataService;\n"),
        ("metadata/store.rs", "pub struct KeyLayout;\npub struct RpcMeta;\n"),
    ]);
    assert_eq!(graph.targets(""), set(&[]), "the root only re-exports: {:?}", graph.arrows);
    assert_eq!(
        graph.targets("metadata"),
        set(&["metadata::store", "metadata::name"]),
        "a format string's capture writes the name, an escaped brace does not: {:?}",
        graph.arrows
    );
    let arrow = graph.arrows.iter().find(|a| a.to == "metadata::store").expect("the arrow to store");
    assert_eq!((arrow.line, arrow.path.as_str()), (8, "store::RpcMeta"), "where the code writes the name: {arrow:?}");
}

#[test]
fn a_path_through_reexports_resolves_to_the_module_defining_the_item() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod metadata;\npub mod engine;\npub use metadata::MetadataBackend;\n"),
        (
            "metadata/mod.rs",
            "pub mod backend;\npub mod facade;\npub mod store;\npub mod looped;\n\
             pub use self::facade::*;\npub(crate) use store::KeyLayout as Layout;\npub use std::fmt::Debug;\n\
             pub use looped::Knot;\npub struct Options;\n",
        ),
        ("metadata/facade.rs", "pub use super::backend::{MetadataBackend, RpcMeta};\n"),
        ("metadata/backend.rs", "pub trait MetadataBackend {}\npub struct RpcMeta;\n"),
        ("metadata/store.rs", "pub struct KeyLayout;\n"),
        ("metadata/looped.rs", "pub use super::Knot;\n"),
        (
            "engine.rs",
            "use crate::metadata::MetadataBackend;\n\
             fn f() {\n    crate::metadata::Layout::new();\n    crate::MetadataBackend::x();\n    \
             crate::metadata::RpcMeta::y();\n    crate::metadata::Debug::z();\n    crate::metadata::Options::w();\n    \
             crate::metadata::Unknown::v();\n    crate::metadata::Knot::u();\n}\n",
        ),
    ]);
    let to = |path: &str| graph.arrows.iter().find(|a| a.path == path).map(|a| a.to.as_str());
    assert_eq!(
        to("crate::metadata::MetadataBackend"),
        Some("metadata::backend"),
        "glob, then a group: {:?}",
        graph.arrows
    );
    assert_eq!(to("crate::metadata::Layout::new"), Some("metadata::store"), "a renamed re-export");
    assert_eq!(to("crate::MetadataBackend::x"), Some("metadata::backend"), "through the root's re-export");
    assert_eq!(to("crate::metadata::RpcMeta::y"), Some("metadata::backend"));
    assert_eq!(to("crate::metadata::Debug::z"), None, "another crate's item: no arrow");
    assert_eq!(to("crate::metadata::Options::w"), Some("metadata"), "defined in the facade itself");
    assert_eq!(to("crate::metadata::Unknown::v"), Some("metadata"), "unresolved: the longest module prefix");
    assert!(to("crate::metadata::Knot::u").is_some(), "a re-export loop ends");
    assert_eq!(graph.targets("metadata"), set(&[]), "the facade only re-exports: {:?}", graph.arrows);
}

#[test]
fn a_facade_reexporting_children_that_use_a_sibling_item_is_no_cycle() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod metadata;\n"),
        (
            "metadata/mod.rs",
            "mod p2p;\nmod service;\nmod backend;\npub use p2p::P2pBackend;\npub use service::MetadataService;\n\
             pub use self::backend::*;\n",
        ),
        ("metadata/p2p.rs", "use super::MetadataBackend;\npub struct P2pBackend;\n"),
        ("metadata/service.rs", "pub struct MetadataService(Box<dyn crate::metadata::MetadataBackend>);\n"),
        ("metadata/backend.rs", "pub trait MetadataBackend {}\n"),
    ]);
    assert_eq!(graph.targets("metadata"), set(&[]), "{:?}", graph.arrows);
    assert_eq!(graph.targets("metadata::p2p"), set(&["metadata::backend"]), "{:?}", graph.arrows);
    assert_eq!(graph.targets("metadata::service"), set(&["metadata::backend"]), "{:?}", graph.arrows);
    assert!(cycle_violations(&graph).is_empty(), "{:?}", cycle_violations(&graph));
}

#[test]
fn a_parent_defining_what_its_child_uses_and_calling_the_child_is_an_allowed_two_file_cycle() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod device;\n"),
        (
            "device/mod.rs",
            "pub mod twin;\npub use twin::TwinDevice;\npub struct DeviceError;\n\
             pub fn open() -> Result<TwinDevice, DeviceError> { twin::TwinDevice::open() }\n",
        ),
        ("device/twin.rs", "use super::DeviceError;\npub struct TwinDevice;\n"),
    ]);
    assert_eq!(graph.targets("device"), set(&["device::twin"]), "{:?}", graph.arrows);
    assert_eq!(graph.targets("device::twin"), set(&["device"]), "{:?}", graph.arrows);
    let edges = graph.edges();
    assert!(components(&edges).iter().any(|c| c == &["device", "device::twin"]), "a 2-file cycle: {edges:?}");
    assert!(cycle_violations(&graph).is_empty(), "{:?}", cycle_violations(&graph));
}

#[test]
fn a_definitional_loop_of_three_files_behind_a_facade_is_reported() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod metadata;\n"),
        ("metadata/mod.rs", "mod a;\nmod b;\nmod c;\npub use a::A;\npub use b::B;\npub use c::C;\n"),
        ("metadata/a.rs", "use super::B;\npub struct A(B);\n"),
        ("metadata/b.rs", "pub struct B(crate::metadata::C);\n"),
        ("metadata/c.rs", "pub struct C(Box<super::A>);\n"),
    ]);
    let violations = cycle_violations(&graph);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0]
            .starts_with("import cycle of 3 files: host/metadata/a.rs, host/metadata/b.rs, host/metadata/c.rs\n"),
        "{violations:?}"
    );
}

#[test]
fn a_file_over_the_limit_is_reported() {
    let root = Path::new("/r");
    let files = vec![(root.join("host/a.rs"), MAX_FILE_LINES), (root.join("host/b.rs"), MAX_FILE_LINES + 1)];
    assert_eq!(too_long(&files, root), [format!("host/b.rs: {} lines (split it by concern)", MAX_FILE_LINES + 1)]);
}
