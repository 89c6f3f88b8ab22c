//! The shared layouts, checked byte for byte: compiles `kernels/probe/layout_probe.cpp` with the host C++ compiler
//! (`$CXX`, else `c++`), runs it, and compares every size, field offset and constant it prints with the Rust mirror in
//! `aiv_transport::kernel_abi::layout`. Both directions: nothing may be missing on either side.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn c_and_rust_layouts_agree_field_by_field() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let probe = dir.path().join("layout_probe");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let output = Command::new(&compiler)
        .arg("-std=c++17")
        .arg("-Wall")
        .arg("-Werror")
        .arg(format!("-I{}", root.join("kernels/include").display()))
        .arg(root.join("kernels/probe/layout_probe.cpp"))
        .arg("-o")
        .arg(&probe)
        .output()
        .unwrap_or_else(|error| panic!("cannot run the C++ compiler {compiler:?}: {error}"));
    assert!(output.status.success(), "probe does not compile: {}", String::from_utf8_lossy(&output.stderr));
    let output = Command::new(&probe).output().expect("probe runs");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("utf-8");
    let from_c: BTreeMap<String, u64> = text
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').unwrap_or_else(|| panic!("malformed probe line {line:?}"));
            (name.to_owned(), value.parse().unwrap_or_else(|_| panic!("malformed value in {line:?}")))
        })
        .collect();
    let from_rust: BTreeMap<String, u64> = aiv_transport::kernel_abi::layout_facts().into_iter().collect();
    let mut mismatches = Vec::new();
    for (name, value) in &from_c {
        match from_rust.get(name) {
            Some(rust) if rust == value => {}
            Some(rust) => mismatches.push(format!("{name}: C {value}, Rust {rust}")),
            None => mismatches.push(format!("{name}: printed by the C probe, unknown to Rust")),
        }
    }
    for name in from_rust.keys().filter(|name| !from_c.contains_key(*name)) {
        mismatches.push(format!("{name}: known to Rust, not printed by the C probe"));
    }
    assert!(mismatches.is_empty(), "layout mismatches:\n{}", mismatches.join("\n"));
    // The hardware layouts are exactly as docs/hardware.md section 4 says (independent of both mirrors).
    for (name, expected) in [
        ("size.AivSdmaSqe", 64),
        ("offset.AivSdmaSqe.kernel_credit", 14),
        ("offset.AivSdmaSqe.opcode_word", 16),
        ("offset.AivSdmaSqe.length", 28),
        ("offset.AivSdmaSqe.src_addr_low", 32),
        ("offset.AivSdmaSqe.dst_addr_high", 44),
        ("offset.AivSdmaSqe.link_type", 48),
        ("size.AivChannelRecord", 64),
        ("offset.AivChannelRecord.sq_reg_base", 16),
        ("offset.AivChannelRecord.cqe_addr", 40),
        ("offset.AivChannelRecord.dev_id", 56),
        ("offset.AivRingHeader.tail", 64),
        // docs/rdma.md: the RoCE WQE, SGE and CQE.
        ("size.AivRoceWqe", 32),
        ("offset.AivRoceWqe.byte16", 12),
        ("offset.AivRoceWqe.rkey", 20),
        ("offset.AivRoceWqe.va", 24),
        ("size.AivRoceSge", 16),
        ("offset.AivRoceSge.addr", 8),
        ("size.AivRoceCqe", 32),
        ("offset.AivRoceCqe.byte16", 12),
        ("offset.AivRoceCqe.byte_cnt", 16),
        ("const.AIV_ROCE_STATUS_REMOTE_ACCESS_ERR", 0x13),
        ("const.AIV_ROCE_STATUS_TRANSPORT_RETRY_EXC_ERR", 0x15),
        ("size.AivQpRecord", 128),
        ("offset.AivQpRecord.sq_pi", 64),
    ] {
        assert_eq!(from_c.get(name), Some(&expected), "{name}");
    }
    assert!(from_c.len() > 100, "the probe printed only {} facts", from_c.len());
}
