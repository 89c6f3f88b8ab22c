//! Where SHMEM keeps its SDMA workspace address: the parts of its internal state struct
//! `aclshmem_device_host_state_t` the cann backend reads, and where copies of that struct live.
//!
//! SHMEM has no host call returning the workspace address. It stores the address in field `sdma_workspace_addr` of
//! one state struct per process: the host copy is the global `g_state` of `libshmem.so` (defined at file scope in
//! SHMEM's `src/host/init/shmem_init.cpp`, no namespace, default visibility), and after initialisation SHMEM copies
//! the struct to a fixed device address where its kernels find it ([`DEVICE_STATE_ADDR`]).
//!
//! Source of the facts: the public SHMEM sources (`include/host_device/shmem_common_types.h` for the struct,
//! `src/host/init/shmem_init.cpp` for `g_state` and its version word, `src/device/shmemi_device_meta.h` and
//! `src/host/entity/mem_entity_def.h` for the device address). The struct is not in any installed header, so the
//! offsets below are this crate's arithmetic over the declared field types on LP64 (checked in the unit test against
//! a C definition compiled there). The struct carries its own layout: its first word is `(1 << 16) + sizeof`, so a
//! reader checks [`check_version`] before trusting any other offset.
//!
//! *Unverified on hardware*: that the installed `libshmem.so` exports `g_state`, and that `aclrtMemcpy` reads the
//! device copy at [`DEVICE_STATE_ADDR`] from the host, are inferred from the source, never observed.

/// The C name of SHMEM's host copy of the state.
pub const HOST_STATE_SYMBOL: &str = "g_state";

/// The high half of the version word: the layout generation this module mirrors.
pub const LAYOUT_GENERATION: i32 = 1;
/// `sizeof(aclshmem_device_host_state_t)` with `ACLSHMEM_MAX_PES = 16384` and `ACLSHMEM_MAX_TEAMS = 2048`.
pub const STATE_SIZE: usize = 32_992;
/// The version word SHMEM writes: `(1 << 16) + sizeof(aclshmem_device_host_state_t)`.
pub const EXPECTED_VERSION: i32 = (LAYOUT_GENERATION << 16) + STATE_SIZE as i32;

/// Offset of `int version`.
pub const VERSION_OFFSET: usize = 0;
/// Offset of `int mype` (this process's PE).
pub const MYPE_OFFSET: usize = 4;
/// Offset of `int npes`.
pub const NPES_OFFSET: usize = 8;
/// Bytes of the header a reader fetches first: `version`, `mype`, `npes` and the padding before `heap_base`.
pub const HEADER_BYTES: usize = 16;
/// Offset of `uint64_t sdma_workspace_addr` (after the four UB configs and `qp_info`; 24 bytes before the end).
pub const SDMA_WORKSPACE_ADDR_OFFSET: usize = 32_968;

/// SHMEM's device address-space end (`0x100000000000 + 0x80000000000`), as its device meta header states it.
pub const DEVICE_VA_END: u64 = 0x1800_0000_0000;
/// The end of SHMEM's device meta area: 1 GiB below [`DEVICE_VA_END`].
pub const DEVICE_META_END: u64 = DEVICE_VA_END - (1 << 30);
/// Entities (state slots) in the meta area.
pub const DEVICE_ENTITIES: u64 = 511;
/// Bytes of one entity's user context (where a state copy goes; the state must fit).
pub const DEVICE_CONTEXT_BYTES: u64 = 64 << 10;
/// Bytes of the meta records before the contexts: 128 per entity plus 128 global.
pub const DEVICE_META_BYTES: u64 = 128 * DEVICE_ENTITIES + 128;
/// Start of the meta area: 32 MiB (contexts plus meta records) below [`DEVICE_META_END`].
pub const DEVICE_META_ADDR: u64 = DEVICE_META_END - (DEVICE_CONTEXT_BYTES * DEVICE_ENTITIES + DEVICE_META_BYTES);
/// The device copy of the state of entity 0, where SHMEM's kernels read it (`0x17ffbe010000`). A SHMEM built with
/// `MULTI_INSTANCE` gives instance `n` the context of entity `2n` instead; only instance 0 is looked for here.
pub const DEVICE_STATE_ADDR: u64 = DEVICE_META_ADDR + DEVICE_META_BYTES;

const _: () = {
    assert!(EXPECTED_VERSION == 0x1_80e0);
    assert!(DEVICE_META_BYTES == 64 << 10);
    assert!(DEVICE_META_ADDR == 0x17ff_be00_0000);
    assert!(DEVICE_STATE_ADDR == 0x17ff_be01_0000);
    assert!(STATE_SIZE as u64 <= DEVICE_CONTEXT_BYTES);
    assert!(SDMA_WORKSPACE_ADDR_OFFSET + 8 <= STATE_SIZE);
};

/// The first three words of a state copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateHeader {
    /// `version`: `(generation << 16) + sizeof` of the writer's layout.
    pub version: i32,
    /// `mype`.
    pub mype: i32,
    /// `npes`.
    pub npes: i32,
}

impl StateHeader {
    /// Decodes the first [`HEADER_BYTES`] of a state copy (native byte order, as SHMEM wrote them).
    pub fn from_bytes(bytes: &[u8; HEADER_BYTES]) -> StateHeader {
        let word = |at: usize| i32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        StateHeader { version: word(VERSION_OFFSET), mype: word(MYPE_OFFSET), npes: word(NPES_OFFSET) }
    }
}

/// Accepts a version word only if it names the layout mirrored here; otherwise says what it names.
pub fn check_version(version: i32) -> Result<(), String> {
    if version == EXPECTED_VERSION {
        Ok(())
    } else {
        Err(format!(
            "version {version:#x} is not layout {LAYOUT_GENERATION}/{STATE_SIZE} (it names layout {}/{})",
            version >> 16,
            version & 0xffff
        ))
    }
}

/// What a state copy says, once its version was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSnapshot {
    /// The header words.
    pub header: StateHeader,
    /// `sdma_workspace_addr` (0 until SHMEM set up its SDMA transport).
    pub sdma_workspace_addr: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct as the public header declares it, with each member's C type (array lengths from
    /// `ACLSHMEM_MAX_PES`/`ACLSHMEM_MAX_TEAMS`); compiled with `cc -fsyntax-only` against the Rust constants.
    const C_LAYOUT: &str = r#"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
typedef struct { int64_t ub; uint32_t ub_size; uint32_t sync_id; } ub_config;
typedef struct {
    int version; int mype; int npes;
    void *heap_base; void *host_heap_base;
    void **p2p_device_heap_base; void **rdma_device_heap_base; void **sdma_device_heap_base;
    void **p2p_host_heap_base; void **rdma_host_heap_base; void **sdma_host_heap_base;
    uint8_t topo_list[16384];
    size_t heap_size;
    void *team_pools[2048];
    uint64_t sync_pool; uint64_t sync_counter; uint64_t core_sync_pool; uint64_t core_sync_counter;
    bool is_initialized; bool is_created;
    ub_config mte_config; ub_config sdma_config; ub_config rdma_config; ub_config udma_config;
    uint64_t qp_info;
    uint64_t sdma_workspace_addr;
    void *profs;
    uint64_t signal_addr;
} state;
"#;

    #[test]
    fn the_offsets_match_a_c_definition_of_the_struct() {
        let checks = [
            format!("sizeof(state) == {STATE_SIZE}"),
            format!("offsetof(state, version) == {VERSION_OFFSET}"),
            format!("offsetof(state, mype) == {MYPE_OFFSET}"),
            format!("offsetof(state, npes) == {NPES_OFFSET}"),
            format!("offsetof(state, heap_base) == {HEADER_BYTES}"),
            format!("offsetof(state, sdma_workspace_addr) == {SDMA_WORKSPACE_ADDR_OFFSET}"),
            "offsetof(state, sdma_workspace_addr) == sizeof(state) - 24".to_string(),
        ];
        let mut source = C_LAYOUT.to_string();
        for check in &checks {
            source.push_str(&format!("_Static_assert({check}, \"{check}\");\n"));
        }
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("state_layout.c");
        std::fs::write(&file, &source).expect("write the C source");
        let compiler = std::env::var("CC").ok().filter(|value| !value.is_empty()).unwrap_or_else(|| "cc".into());
        let output = std::process::Command::new(&compiler)
            .args(["-std=c11", "-fsyntax-only"])
            .arg(&file)
            .output()
            .unwrap_or_else(|error| panic!("cannot run {compiler}: {error}"));
        assert!(
            output.status.success(),
            "{compiler} rejected the layout:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    #[test]
    fn the_device_address_follows_from_the_meta_layout() {
        // 511 contexts of 64 KiB plus 64 KiB of meta records are exactly 32 MiB.
        assert_eq!(DEVICE_CONTEXT_BYTES * DEVICE_ENTITIES + DEVICE_META_BYTES, 32 << 20);
        assert_eq!(DEVICE_META_END, 0x17ff_c000_0000);
        assert_eq!(DEVICE_STATE_ADDR, 0x17ff_be01_0000);
    }

    #[test]
    fn only_the_mirrored_layout_is_accepted() {
        assert_eq!(check_version((1 << 16) + 32_992), Ok(()));
        assert_eq!(
            check_version((1 << 16) + 32_984).expect_err("another size"),
            "version 0x180d8 is not layout 1/32992 (it names layout 1/32984)"
        );
        assert!(check_version((2 << 16) + 32_992).is_err(), "another generation");
        assert_eq!(
            check_version(0).expect_err("never written"),
            "version 0x0 is not layout 1/32992 (it names layout 0/0)"
        );
        let mut bytes = [0u8; HEADER_BYTES];
        bytes[0..4].copy_from_slice(&EXPECTED_VERSION.to_ne_bytes());
        bytes[4..8].copy_from_slice(&3i32.to_ne_bytes());
        bytes[8..12].copy_from_slice(&8i32.to_ne_bytes());
        assert_eq!(StateHeader::from_bytes(&bytes), StateHeader { version: EXPECTED_VERSION, mype: 3, npes: 8 });
    }
}
