//! The device's SDMA engines, STARS-like: per device, channels that each own an SQ ring of 64-byte SQEs in device
//! memory, a 64-byte channel record in the SDMA workspace, and a doorbell register page at a device address.
//!
//! The hardware ABI here is the twin's own reading of public sources (docs/hardware.md section 4, from
//! `hicann/shmem` `src/device/gm2gm/engine/shmemi_device_sdma.h` and `shmem_device_sdma.hpp`); the layouts are
//! defined in this module and pinned by a unit test, independently of the root crate's `kernel_abi`.
//!
//! Two groups of channels per device: SHMEM's (`create`, 48, records in SHMEM's SDMA workspace) and the AI CPU's
//! (`aicpu_channels`, one per AI-CPU thread, numbered from [`AICPU_CHANNEL_BASE`], records in a block of their own,
//! made with the device's first AI-CPU task and destroyed with its last reset). The engines are the same.
//!
//! One engine thread per channel. It sleeps until a doorbell (an accepted [`register_write`] of the tail) or a
//! control request, then executes the SQEs from its head up to the tail, strictly in order, each one read through
//! the device address space's translation (never a raw device address):
//!
//! 1. validate: type 11 (SDMA), opcode 0 (copy), the other control fields of a copy (`link_type` SHMEM's 255 or
//!    HiXL's on-chip 0), length in `1..=1 MiB`, source translatable for reading and
//!    destination for writing (inside one allocation, mapping or registered window each);
//! 2. copy through the device view; an 8-byte copy between 8-byte aligned addresses (SHMEM's completion flags) is
//!    one atomic load and one atomic store with release ordering, so a reader that acquires the flag sees every
//!    earlier copy of the channel;
//! 3. publish the new `sq_head` in the channel record (an atomic store, release, through the view).
//!
//! A bad SQE stops the channel: it records a [`ChannelException`] (channel, sq id, head, tail, [`Syndrome`], the raw
//! SQE) and executes nothing more until [`crate::control::reset_channel`]. The engine copies under the space's
//! read lock only, never under the runtime mutex.
//!
//! The doorbell register page: the doorbell is the u32 at offset 0x8 (`ACLSHMEM_STARS_SQ_TAIL_OFFSET`). Only a
//! 4-byte write at exactly that offset is accepted; any other width or offset writes nothing and raises a channel
//! exception with [`Syndrome::REGISTER_ACCESS`] naming the offset and width (strictness the twin chooses: what the
//! NPU does with such a write is not publicly documented). The page lies inside the device address space, which is
//! `PROT_NONE` for the Host and never translated, so neither a Host store nor a copy can ring it.
//!
//! Files: this one holds the ABI constants and what a stopped channel reports; module `layout` the SQE and channel
//! record layouts, `engine` one channel and its engine thread, `devices` each device's channels, the registries and
//! the register writes, `provenance` who wrote, rang and read what.

mod devices;
mod engine;
mod layout;

use std::time::Duration;

pub(crate) use devices::{
    aicpu_channels, aicpu_register_write, all_channels, create, destroy, destroy_aicpu, find_channel,
    on_other_register_write, register_write_through, write_device, RegisterCache,
};
pub use devices::{aiv_twin_register_write, register_write};
pub(crate) use engine::{inject_destination_faults, take_injected_destination_fault, Channel};
pub use layout::{ChannelRecord, SdmaSqe};

/// Bytes of one SQE.
pub const SQE_BYTES: usize = 64;
const _: () =
    assert!(SQE_BYTES as u64 == crate::provenance::SLOT_BYTES, "the provenance records shadow SQ slots of this size");
/// SQE type of an SDMA copy (`ACLSHMEM_SQE_TYPE_SDMA`), bits 0-5 of the first u16.
pub const SQE_TYPE_SDMA: u16 = 11;
/// The type bits of the first u16.
pub const SQE_TYPE_MASK: u16 = 0x3f;
/// The copy opcode (bits 7:0 of the u32 at offset 16).
pub const SQE_OPCODE_COPY: u32 = 0;
/// The whole opcode word of a copy as SHMEM's `aclshmemi_fill_sdma_sqe` writes it: opcode 0, `sssv`, `dssv`, `sns`
/// and `dns` set (bits 9-12), QoS 6 (bits 16:13), every other bit (`ie2`, `sro`, `dro`, `partid`, `mpam`) clear.
pub const SQE_COPY_OPCODE_WORD: u32 = SQE_OPCODE_COPY | 0xf << 9 | 6 << 13;
/// `kernel_credit` of an SDMA SQE (`ACLSHMEM_STARS_DEFAULT_KERNEL_CREDIT`).
pub const SQE_KERNEL_CREDIT_SDMA: u8 = 240;
/// `link_type` of a copy as SHMEM writes it (no link).
pub const SQE_LINK_TYPE_NONE: u8 = 255;
/// `link_type` of an on-chip copy (`LINK_ONCHIP`, "same-device / LocalCopy SDMA"), as HiXL's AI-CPU SQEs set it
/// (`hicann/hixl` `src/hixl/fabric_mem/fabric_mem_a3_rtsq.h`).
pub const SQE_LINK_TYPE_ONCHIP: u8 = 0;
/// Largest length of one SQE (SHMEM cuts puts at `1024 * 1024`).
pub const SQE_MAX_LENGTH: u32 = 1 << 20;
/// Offset of the doorbell (SQ tail) register in the register page (`ACLSHMEM_STARS_SQ_TAIL_OFFSET`, A2/A3).
pub const DOORBELL_OFFSET: u64 = 0x8;
/// Width of the doorbell register, bytes.
pub const DOORBELL_WIDTH: usize = 4;
/// Bytes of one channel record (`stars_channel_info_t`).
pub const CHANNEL_RECORD_BYTES: usize = 64;
/// Bytes of the SDMA workspace SHMEM allocates (`device_sdma_transport_manager.cpp`: 16 KiB).
pub const WORKSPACE_BYTES: usize = 16 << 10;
/// Offset of the first channel record in the workspace (after the 64-byte flag info).
pub const CHANNEL_RECORDS_OFFSET: usize = 64;
/// Channels SHMEM sets up: one per AIV block, `ACLSHMEM_MAX_AIV_PER_NPU` = 48 (`hicann/shmem`
/// `include/host_device/shmem_common_types.h`; used by `device_sdma_transport_manager.cpp`).
pub const MAX_CHANNELS: u32 = 48;
/// SQEs per ring. The vendor's depth is filled in by an AICPU operator whose source is not public: a guess (the
/// project's default `aiv.sq_depth`).
pub const SQ_DEPTH: u32 = 2048;
/// The value the twin writes to the workspace's `flag` word once the records are filled (a guess: non-zero means
/// "filled", which is all the backend checks).
pub const WORKSPACE_FLAG_FILLED: u32 = 1;
/// The index of the AI CPU's first SDMA channel on a device: its channel `n` is `AICPU_CHANNEL_BASE + n`, apart from
/// SHMEM's `0..MAX_CHANNELS` (the twin's numbering).
pub const AICPU_CHANNEL_BASE: u32 = 64;
/// The AI CPU's SDMA channels per device, one per AI-CPU thread (`aicpu::POOL_THREADS`): a *guess* (the public
/// sources used here give no AI-CPU core count for a device; the vendor's HiXL runs a client's batches on one AI-CPU
/// thread, so a few suffice for the twin's clients).
pub const AICPU_CHANNELS: u32 = 4;
/// Bytes per AI-CPU channel in its records block: the channel record, then its completion word.
pub const AICPU_SLOT_BYTES: usize = 128;
/// Offset of an AI-CPU channel's completion word (8 bytes, the destination of its flag SQEs) from its record.
pub const AICPU_COMPLETION_OFFSET: u64 = 64;
/// Offset of an AI-CPU channel's flag source word (8 bytes, the source of its flag SQEs) from its record.
pub const AICPU_FLAG_SOURCE_OFFSET: u64 = 72;
/// How long an idle engine polls its doorbell before it sleeps (device-side CPU of the twin, never the Host's).
pub const ENGINE_POLL_WINDOW: Duration = Duration::from_micros(50);
/// How long [`crate::control::reset_channel`] waits for the engine.
pub const RESET_WAIT: Duration = Duration::from_secs(2);

/// Why a channel stopped. The values are the twin's own (no public source gives STARS syndromes); 0x10-0x15 are the
/// values the root crate's `SdmaSyndrome` uses for the same faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Syndrome(pub u32);

impl Syndrome {
    /// The SQE type is not SDMA (11).
    pub const BAD_TYPE: Syndrome = Syndrome(0x10);
    /// The opcode is not a copy (0).
    pub const BAD_OPCODE: Syndrome = Syndrome(0x11);
    /// Length 0 or above 1 MiB.
    pub const BAD_LENGTH: Syndrome = Syndrome(0x12);
    /// The source range does not translate for reading (unmapped, past its object, or no access).
    pub const SRC_FAULT: Syndrome = Syndrome(0x13);
    /// The destination range does not translate for writing.
    pub const DST_FAULT: Syndrome = Syndrome(0x14);
    /// The doorbell carried a tail outside the ring (`>= sq_depth`).
    pub const BAD_TAIL: Syndrome = Syndrome(0x15);
    /// A register write of the wrong width or at the wrong offset ([`ChannelException::register`] says which).
    pub const REGISTER_ACCESS: Syndrome = Syndrome(0x16);
    /// The SQ slot or the channel record no longer translates (the workspace or ring was freed under the engine).
    pub const QUEUE_FAULT: Syndrome = Syndrome(0x17);
    /// A copy SQE whose other control fields are not those of a copy as SHMEM or HiXL writes it: the opcode word
    /// ([`SQE_COPY_OPCODE_WORD`]), `kernel_credit` ([`SQE_KERNEL_CREDIT_SDMA`]), `ptr_mode` (0) or `link_type`
    /// ([`SQE_LINK_TYPE_NONE`], SHMEM's, or [`SQE_LINK_TYPE_ONCHIP`], HiXL's). What STARS does with other values is
    /// not public; the twin refuses them.
    pub const BAD_FIELDS: Syndrome = Syndrome(0x18);
}

/// A refused register access: where in the page and how wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterAccess {
    /// Offset of the write in the register page.
    pub offset: u64,
    /// Bytes written.
    pub width: usize,
}

/// What a stopped channel reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelException {
    pub device: i32,
    pub channel: u32,
    pub sq_id: u32,
    /// The head when the channel stopped: the slot of the bad SQE.
    pub head: u32,
    /// The doorbell's tail when the channel stopped.
    pub tail: u32,
    pub syndrome: Syndrome,
    /// The raw SQE at `head` (zero for faults that are not about an SQE).
    pub sqe: [u8; SQE_BYTES],
    /// For [`Syndrome::REGISTER_ACCESS`]: the refused write.
    pub register: Option<RegisterAccess>,
}

/// Why [`register_write`] did not ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterFault {
    /// No register page holds this device address (nothing was written, no exception raised).
    NotARegister { va: u64 },
    /// A write of the wrong width or at the wrong offset: refused, nothing written, and the channel raised a
    /// [`Syndrome::REGISTER_ACCESS`] exception.
    Refused { device: i32, channel: u32, offset: u64, width: usize },
    /// A write to a twin NIC QP's register page that is not an accepted doorbell (wrong width, offset, tag or
    /// command): refused, nothing written, and the QP recorded an exception and moved to the error state
    /// ([`crate::nic`]).
    QpRefused { device: i32, qpn: u32, offset: u64, width: usize },
}

impl std::fmt::Display for RegisterFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegisterFault::NotARegister { va } => write!(f, "{va:#x} is not in a device register page"),
            RegisterFault::Refused { device, channel, offset, width } => write!(
                f,
                "device {device} channel {channel}: a {width}-byte register write at offset {offset:#x} was refused \
                 (the doorbell is {DOORBELL_WIDTH} bytes at {DOORBELL_OFFSET:#x})"
            ),
            RegisterFault::QpRefused { device, qpn, offset, width } => write!(
                f,
                "device {device} NIC QP {qpn:#x}: a {width}-byte register write at offset {offset:#x} was refused"
            ),
        }
    }
}

impl std::error::Error for RegisterFault {}
