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

pub(crate) mod provenance;

use crossbeam_utils::CachePadded;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

use crate::memory::{page, Segment, Space};
use crate::runtime::{perform_copy, space, with_space_mut};

/// Bytes of one SQE.
pub const SQE_BYTES: usize = 64;
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
/// The AI CPU's SDMA channels per device: one per AI-CPU thread (`aicpu::POOL_THREADS`).
pub const AICPU_CHANNELS: u32 = crate::aicpu::POOL_THREADS;
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

/// An SDMA SQE, `stars_sdma_sqe_t` (A2/A3 layout), as the twin reads it: little-endian, 64 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct SdmaSqe {
    /// Type in bits 0-5.
    pub type_word: u16,
    pub block_dim: u16,
    pub rt_stream_id: u16,
    pub task_id: u16,
    pub reserved0: u32,
    pub reserved1: u16,
    pub kernel_credit: u8,
    /// Bit 0: ptr_mode.
    pub ptr_mode: u8,
    /// `opcode[7:0] ie2[8] sssv[9] dssv[10] sns[11] dns[12] qos[16:13] sro[17] dro[18] partid[26:19] mpam[27]`.
    pub opcode_word: u32,
    pub src_stream_id: u16,
    pub src_sub_stream_id: u16,
    pub dst_stream_id: u16,
    pub dst_sub_stream_id: u16,
    /// Bytes.
    pub length: u32,
    pub src_addr_low: u32,
    pub src_addr_high: u32,
    pub dst_addr_low: u32,
    pub dst_addr_high: u32,
    pub link_type: u8,
    pub reserved2: [u8; 3],
    pub reserved3: [u32; 3],
}

struct Le<'a>(&'a [u8]);

impl Le<'_> {
    fn u16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.0[at], self.0[at + 1]])
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }
}

impl SdmaSqe {
    /// A copy of `length` bytes from `src` to `dst` as HiXL's AI-CPU kernels fill one (`hicann/hixl`
    /// `src/hixl/fabric_mem/fabric_mem_stars_sdma.cc` with the layout of `fabric_mem_a3_rtsq.h`): the SQE zeroed,
    /// then type 11, the stream and task ids, `kernel_credit` 240, `sssv`, `dssv`, `sns` and `dns` set, QoS 6, the
    /// opcode left 0 (a copy), and `link_type` 0 (on-chip).
    pub fn onchip_copy(src: u64, dst: u64, length: u32, rt_stream_id: u16, task_id: u16) -> SdmaSqe {
        SdmaSqe {
            type_word: SQE_TYPE_SDMA,
            rt_stream_id,
            task_id,
            kernel_credit: SQE_KERNEL_CREDIT_SDMA,
            opcode_word: SQE_COPY_OPCODE_WORD,
            length,
            src_addr_low: src as u32,
            src_addr_high: (src >> 32) as u32,
            dst_addr_low: dst as u32,
            dst_addr_high: (dst >> 32) as u32,
            link_type: SQE_LINK_TYPE_ONCHIP,
            ..SdmaSqe::default()
        }
    }

    /// The 64 little-endian bytes of the SQE.
    pub fn to_bytes(&self) -> [u8; SQE_BYTES] {
        let mut out = [0u8; SQE_BYTES];
        let mut put = |at: usize, bytes: &[u8]| out[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &self.type_word.to_le_bytes());
        put(2, &self.block_dim.to_le_bytes());
        put(4, &self.rt_stream_id.to_le_bytes());
        put(6, &self.task_id.to_le_bytes());
        put(8, &self.reserved0.to_le_bytes());
        put(12, &self.reserved1.to_le_bytes());
        put(14, &[self.kernel_credit, self.ptr_mode]);
        put(16, &self.opcode_word.to_le_bytes());
        put(20, &self.src_stream_id.to_le_bytes());
        put(22, &self.src_sub_stream_id.to_le_bytes());
        put(24, &self.dst_stream_id.to_le_bytes());
        put(26, &self.dst_sub_stream_id.to_le_bytes());
        put(28, &self.length.to_le_bytes());
        put(32, &self.src_addr_low.to_le_bytes());
        put(36, &self.src_addr_high.to_le_bytes());
        put(40, &self.dst_addr_low.to_le_bytes());
        put(44, &self.dst_addr_high.to_le_bytes());
        put(48, &[self.link_type]);
        put(49, &self.reserved2);
        for (i, word) in self.reserved3.iter().enumerate() {
            put(52 + 4 * i, &word.to_le_bytes());
        }
        out
    }

    /// Decodes 64 little-endian bytes.
    pub fn from_bytes(raw: &[u8; SQE_BYTES]) -> SdmaSqe {
        let le = Le(raw);
        SdmaSqe {
            type_word: le.u16(0),
            block_dim: le.u16(2),
            rt_stream_id: le.u16(4),
            task_id: le.u16(6),
            reserved0: le.u32(8),
            reserved1: le.u16(12),
            kernel_credit: raw[14],
            ptr_mode: raw[15],
            opcode_word: le.u32(16),
            src_stream_id: le.u16(20),
            src_sub_stream_id: le.u16(22),
            dst_stream_id: le.u16(24),
            dst_sub_stream_id: le.u16(26),
            length: le.u32(28),
            src_addr_low: le.u32(32),
            src_addr_high: le.u32(36),
            dst_addr_low: le.u32(40),
            dst_addr_high: le.u32(44),
            link_type: raw[48],
            reserved2: [raw[49], raw[50], raw[51]],
            reserved3: [le.u32(52), le.u32(56), le.u32(60)],
        }
    }
    /// The SQE type (bits 0-5 of the first u16).
    pub fn sqe_type(&self) -> u16 {
        self.type_word & SQE_TYPE_MASK
    }
    /// The opcode (bits 7:0 of the word at offset 16).
    pub fn opcode(&self) -> u32 {
        self.opcode_word & 0xff
    }
    /// Source device address.
    pub fn src(&self) -> u64 {
        (u64::from(self.src_addr_high) << 32) | u64::from(self.src_addr_low)
    }
    /// Destination device address.
    pub fn dst(&self) -> u64 {
        (u64::from(self.dst_addr_high) << 32) | u64::from(self.dst_addr_low)
    }
}

/// A channel record, `stars_channel_info_t`, 64 bytes, little-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ChannelRecord {
    /// Published by the engine after each SQE (atomic, release).
    pub sq_head: u32,
    /// The kernel's software copy of the tail (never read by the engine).
    pub sq_tail: u32,
    /// Device address of the ring of `sq_depth` SQEs.
    pub sq_base: u64,
    /// Device address of the doorbell register page.
    pub sq_reg_base: u64,
    pub sq_depth: u32,
    pub sq_id: u32,
    pub cq_id: u32,
    pub logic_cq_id: u32,
    /// Not used by the device path (0).
    pub cqe_addr: u64,
    pub report_cqe_num: u32,
    pub stream_id: u32,
    pub dev_id: u32,
    pub reserved: [u8; 4],
}

impl ChannelRecord {
    /// The 64 little-endian bytes of the record.
    pub fn to_bytes(&self) -> [u8; CHANNEL_RECORD_BYTES] {
        let mut out = [0u8; CHANNEL_RECORD_BYTES];
        let mut put = |at: usize, bytes: &[u8]| out[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &self.sq_head.to_le_bytes());
        put(4, &self.sq_tail.to_le_bytes());
        put(8, &self.sq_base.to_le_bytes());
        put(16, &self.sq_reg_base.to_le_bytes());
        put(24, &self.sq_depth.to_le_bytes());
        put(28, &self.sq_id.to_le_bytes());
        put(32, &self.cq_id.to_le_bytes());
        put(36, &self.logic_cq_id.to_le_bytes());
        put(40, &self.cqe_addr.to_le_bytes());
        put(48, &self.report_cqe_num.to_le_bytes());
        put(52, &self.stream_id.to_le_bytes());
        put(56, &self.dev_id.to_le_bytes());
        put(60, &self.reserved);
        out
    }

    /// Decodes 64 little-endian bytes.
    pub fn from_bytes(raw: &[u8; CHANNEL_RECORD_BYTES]) -> ChannelRecord {
        let le = Le(raw);
        let u64_at = |at: usize| (u64::from(le.u32(at + 4)) << 32) | u64::from(le.u32(at));
        ChannelRecord {
            sq_head: le.u32(0),
            sq_tail: le.u32(4),
            sq_base: u64_at(8),
            sq_reg_base: u64_at(16),
            sq_depth: le.u32(24),
            sq_id: le.u32(28),
            cq_id: le.u32(32),
            logic_cq_id: le.u32(36),
            cqe_addr: u64_at(40),
            report_cqe_num: le.u32(48),
            stream_id: le.u32(52),
            dev_id: le.u32(56),
            reserved: [raw[60], raw[61], raw[62], raw[63]],
        }
    }
}

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

#[derive(Debug, Default)]
struct State {
    stalled: bool,
    exception: Option<ChannelException>,
    reset_requested: u64,
    reset_done: u64,
    shutdown: bool,
}

/// One channel of one device.
#[derive(Debug)]
pub(crate) struct Channel {
    pub device: i32,
    pub index: u32,
    pub sq_id: u32,
    /// Device address of the channel record.
    pub record: u64,
    pub sq_base: u64,
    pub depth: u32,
    pub reg_base: u64,
    state: Mutex<State>,
    /// The engine sleeps on it.
    wake: Condvar,
    /// Reset waiters sleep on it.
    reset: Condvar,
    /// Set (under `state`) by every request the engine must see between two SQEs.
    interrupt: AtomicBool,
    /// Set when the channel is shut down: a waiter on its progress (the AI CPU) stops waiting.
    closed: AtomicBool,
    /// What the engine writes per SQE, on its own cache line (the ringing core's thread must not lose its line to
    /// them).
    pub progress: CachePadded<Progress>,
    /// What a doorbell writes, on its own cache line.
    pub doorbell: CachePadded<Doorbell>,
    /// The progress signal for the napping core of the block that drives this channel (a landed flag, a stopped
    /// run).
    activity: Arc<crate::kernel::Activity>,
    /// Who wrote each SQ slot, rang each doorbell and read each landed flag ([`provenance`]).
    pub provenance: Arc<provenance::ChannelProvenance>,
    /// The engine's busy time ([`crate::occupancy`]): the device's counters for this channel index.
    busy: Arc<crate::occupancy::ChannelBusy>,
}

/// The engine's side of a [`Channel`].
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// The engine's head (a copy of what it publishes in the record), for exceptions raised outside the engine.
    pub head: AtomicU32,
    pub executed: AtomicU64,
}

/// The doorbell register of a [`Channel`].
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    /// Accepted doorbell writes. A doorbell joins the set of ringers and stores the tail, then counts itself with one
    /// SeqCst read-modify-write, which publishes both: whoever reads the new count reads that tail (or a later one).
    pub count: AtomicU64,
    /// The register's value (the tail the engine runs to). A doorbell stores it and counts itself without the state
    /// lock; it takes the lock to notify only when the engine sleeps.
    pub tail: AtomicU32,
    /// The engine waits on `wake` (set by it under the state lock before it sleeps, then the count checked again):
    /// with the doorbell's count before its look at this, one of the two sees the other (all four SeqCst).
    pub engine_asleep: AtomicBool,
    /// Test-only ([`crate::control::divert_core_doorbells`]): while set, a core's accepted doorbell write does not
    /// reach the register; its tail is parked in `diverted` for the test to forward.
    pub divert: AtomicBool,
    /// `(diverted writes << 32) | last diverted tail`.
    pub diverted: AtomicU64,
    /// Who rang since the engine last took the tail (a [`provenance::Ringers`] set of `WRITER_*` bits, joined by
    /// each ring while the records are on before it stores the tail with release): an engine that reads a tail
    /// finds its ringer in the set it swaps out after ([`provenance::RingerTake`]).
    pub ringers: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Copies device segments into a Host buffer.
fn read_segments(segments: &[Segment], out: &mut [u8]) {
    let host = [Segment { ptr: out.as_mut_ptr(), len: out.len() }];
    // SAFETY: `segments` were translated under the space's read lock, which the caller still holds; `out` is a
    // live buffer of the same total length.
    unsafe { perform_copy(&host, segments) };
}

/// Whether this CPU has `clwb` (`std::arch::is_x86_feature_detected!` does not know it): CPUID leaf 7, if the CPU
/// has that leaf, EBX bit 24.
#[cfg(target_arch = "x86_64")]
static HAS_CLWB: LazyLock<bool> = LazyLock::new(|| {
    core::arch::x86_64::__cpuid(0).eax >= 7 && core::arch::x86_64::__cpuid_count(7, 0).ebx & (1 << 24) != 0
});

/// Speed only: `clwb` on the cache lines of `[ptr, ptr + len)`, which this engine thread has just read. On the AMD
/// EPYC VM the twin is measured on, the next writer of those lines (the emulated core landing the next lap of SQEs)
/// then takes them faster: a toy ring of 2 KiB landings behind a reading thread cost the writer 230-420 cycles per
/// landing instead of about 820 (the bench's post cost: docs/RESULTS.md). No effect on memory contents; nothing on a
/// CPU without `clwb` (what it does with a clean line is the CPU's choice).
fn hand_back(ptr: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if *HAS_CLWB {
            let mut line = ptr as usize & !63;
            while line < ptr as usize + len {
                // SAFETY: `line` is within a line of memory this thread just read (translated, mapped); clwb changes
                // no memory contents.
                unsafe { core::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags)) };
                line += 64;
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, len);
}

/// An aligned u32 or u64 cell in device memory, or `None` when the range is not one aligned segment.
fn single_aligned(segments: &[Segment], align: usize) -> Option<*mut u8> {
    match segments {
        [one] if one.ptr as usize % align == 0 => Some(one.ptr),
        _ => None,
    }
}

impl Channel {
    /// Sets the state under the lock and makes the engine look at it.
    fn request(&self, change: impl FnOnce(&mut State)) -> u64 {
        let mut state = lock(&self.state);
        change(&mut state);
        self.interrupt.store(true, Ordering::Release);
        self.wake.notify_all();
        state.reset_requested
    }

    /// An accepted doorbell write by `origin` (a `provenance::WRITER_*` id).
    pub(crate) fn ring(&self, tail: u32, origin: u32) {
        if provenance::recording() {
            self.provenance.rung(origin);
            // Before the tail: an engine that reads this tail (acquire) takes a set holding this ringer.
            self.doorbell.ringers.fetch_or(provenance::Ringers::bit(origin), Ordering::Relaxed);
        }
        // Off, one read-modify-write per ring (the count); on, one more on this line (the set) and the tally's. The
        // tail's store needs release only (the count publishes it; the engine's read of it acquires the set's OR), and
        // a SeqCst store would be a second fenced write of the line the polling engine keeps reading.
        self.doorbell.tail.store(tail, Ordering::Release);
        self.doorbell.count.fetch_add(1, Ordering::SeqCst);
        if self.doorbell.engine_asleep.load(Ordering::SeqCst) {
            // The engine holds the lock from its look at the count until it waits: taking it here means it waits.
            let _state = lock(&self.state);
            self.wake.notify_all();
        }
    }

    /// Records the first exception of this stop.
    fn raise(&self, exception: ChannelException) {
        let mut state = lock(&self.state);
        if state.exception.is_none() {
            state.exception = Some(exception);
        }
    }

    pub(crate) fn exception(&self) -> Option<ChannelException> {
        lock(&self.state).exception.clone()
    }

    pub(crate) fn set_stalled(&self, stalled: bool) {
        self.request(|state| state.stalled = stalled);
    }

    pub(crate) fn shut_down(&self) {
        self.closed.store(true, Ordering::Release);
        self.request(|state| state.shutdown = true);
    }

    /// Whether the channel was shut down (its engine executes nothing more).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The progress signal of the channel (bumped when a flag lands and when a run stops).
    pub(crate) fn activity(&self) -> &crate::kernel::Activity {
        &self.activity
    }

    /// Drops the pending SQEs (head := tail) and clears the exception; waits at most [`RESET_WAIT`].
    pub(crate) fn reset(&self) -> Result<(), Duration> {
        let wanted = self.request(|state| state.reset_requested += 1);
        let deadline = Instant::now() + RESET_WAIT;
        let mut state = lock(&self.state);
        while state.reset_done < wanted {
            let now = Instant::now();
            if now >= deadline {
                return Err(RESET_WAIT);
            }
            state = self.reset.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        Ok(())
    }

    fn exception_at(&self, head: u32, tail: u32, syndrome: Syndrome, sqe: [u8; SQE_BYTES]) -> ChannelException {
        ChannelException {
            device: self.device,
            channel: self.index,
            sq_id: self.sq_id,
            head,
            tail,
            syndrome,
            sqe,
            register: None,
        }
    }

    /// Stores `head` into the record's `sq_head` (atomic, release), through the device view.
    fn publish_head(&self, space: &Space, head: u32) -> Result<(), Syndrome> {
        let segments = space.translate(self.record as usize, 4, true).map_err(|_| Syndrome::QUEUE_FAULT)?;
        let cell = single_aligned(&segments, 4).ok_or(Syndrome::QUEUE_FAULT)?;
        // SAFETY: a 4-byte aligned word of the channel record, translated under the read lock the caller holds
        // (the memory stays mapped until it is released); other users read it as plain or atomic bytes.
        unsafe { AtomicU32::from_ptr(cell.cast()) }.store(head, Ordering::Release);
        Ok(())
    }

    /// Executes the SQE at `head`, exposed by the doorbell `ringers` rang (the engine took it at doorbell count
    /// `doorbell`); on a fault returns the syndrome and the raw SQE.
    fn execute(
        &self,
        head: u32,
        ringers: provenance::Ringers,
        doorbell: u64,
    ) -> Result<(), (Syndrome, [u8; SQE_BYTES])> {
        let guard = space();
        let Some(space) = guard.as_ref() else { return Err((Syndrome::QUEUE_FAULT, [0; SQE_BYTES])) };
        let slot = self.sq_base + u64::from(head) * SQE_BYTES as u64;
        let mut raw = [0u8; SQE_BYTES];
        let segments = space.translate(slot as usize, SQE_BYTES, false).map_err(|_| (Syndrome::QUEUE_FAULT, raw))?;
        read_segments(&segments, &mut raw);
        for segment in segments.iter() {
            hand_back(segment.ptr, segment.len);
        }
        // Who wrote these bytes, read with them (the writer marked its slot before it rang).
        let recording = provenance::recording();
        let writer = if recording { self.provenance.writer_of(head) } else { provenance::WRITER_UNKNOWN };
        let sqe = SdmaSqe::from_bytes(&raw);
        if sqe.sqe_type() != SQE_TYPE_SDMA {
            return Err((Syndrome::BAD_TYPE, raw));
        }
        if sqe.opcode() != SQE_OPCODE_COPY {
            return Err((Syndrome::BAD_OPCODE, raw));
        }
        if sqe.opcode_word != SQE_COPY_OPCODE_WORD
            || sqe.kernel_credit != SQE_KERNEL_CREDIT_SDMA
            || sqe.ptr_mode != 0
            || !matches!(sqe.link_type, SQE_LINK_TYPE_NONE | SQE_LINK_TYPE_ONCHIP)
        {
            return Err((Syndrome::BAD_FIELDS, raw));
        }
        if sqe.length == 0 || sqe.length > SQE_MAX_LENGTH {
            return Err((Syndrome::BAD_LENGTH, raw));
        }
        let length = sqe.length as usize;
        let (src, dst) = (sqe.src() as usize, sqe.dst() as usize);
        let from = space.translate(src, length, false).map_err(|_| (Syndrome::SRC_FAULT, raw))?;
        if take_injected_destination_fault(self.device) {
            return Err((Syndrome::DST_FAULT, raw));
        }
        let to = space.translate(dst, length, true).map_err(|_| (Syndrome::DST_FAULT, raw))?;
        match (length, single_aligned(&from, 8), single_aligned(&to, 8)) {
            (8, Some(from), Some(to)) => {
                // SAFETY: two 8-byte aligned words of device memory, translated under the read lock held here.
                // The flag words are accessed atomically by their users; Acquire/Release orders this flag after
                // every earlier copy of this in-order channel for a reader that acquires it.
                let value = unsafe { AtomicU64::from_ptr(from.cast()) }.load(Ordering::Acquire);
                // Recorded before the store: a reader that returns the value finds the record, and whoever sees
                // the flag (the kernel, then the Host draining the completions it covers) finds this SQE tallied.
                if recording {
                    let landing = self.provenance.flag_landing(dst as u64, value);
                    self.provenance.consumed(writer, ringers, doorbell, Some(landing));
                }
                // Counted before the store too: whoever sees the flag finds this SQE among the executed ones.
                self.progress.executed.fetch_add(1, Ordering::Relaxed);
                // SAFETY: as above.
                unsafe { AtomicU64::from_ptr(to.cast()) }.store(value, Ordering::Release);
                self.activity.progressed();
            }
            _ => {
                // SAFETY: both sides were translated under the read lock held here, for `length` bytes each.
                unsafe { perform_copy(&to, &from) };
                if recording {
                    self.provenance.consumed(writer, ringers, doorbell, None);
                }
                self.progress.executed.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Waits up to [`ENGINE_POLL_WINDOW`] for a doorbell or a request after the last one the engine saw, spinning
    /// then yielding: a hardware engine reacts to its doorbell at once, and a kernel that rings again within the
    /// window (the next doorbell batch) must not pay a thread wake-up per ring.
    fn poll_briefly(&self, rung: u64) {
        let started = Instant::now();
        let mut spins = 0u32;
        while self.doorbell.count.load(Ordering::Acquire) == rung
            && !self.interrupt.load(Ordering::Acquire)
            && started.elapsed() < ENGINE_POLL_WINDOW
        {
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The engine thread's body.
    fn run(self: Arc<Self>) {
        provenance::mark_device_thread();
        let mut head = 0u32;
        // Doorbells counted when the engine last took the tail: a later one is new work.
        let mut seen = 0u64;
        // Who rang the doorbells the engine took.
        let mut ringers = provenance::RingerTake::default();
        loop {
            self.poll_briefly(seen);
            // The tail, and who rang it.
            let (tail, rung_by) = {
                let mut state = lock(&self.state);
                loop {
                    self.interrupt.store(false, Ordering::Relaxed);
                    if state.shutdown {
                        return;
                    }
                    if state.reset_requested != state.reset_done {
                        let tail = self.doorbell.tail.load(Ordering::SeqCst) % self.depth;
                        self.doorbell.tail.store(tail, Ordering::SeqCst);
                        head = tail;
                        // The rings of the dropped SQEs are forgotten with them.
                        self.doorbell.ringers.store(0, Ordering::Relaxed);
                        ringers.forget();
                        self.progress.head.store(head, Ordering::Relaxed);
                        // A record that no longer translates (the workspace was freed) makes the next SQE fault.
                        let _ = space().as_ref().map(|space| self.publish_head(space, head));
                        state.exception = None;
                        state.reset_done = state.reset_requested;
                        self.reset.notify_all();
                        continue;
                    }
                    // A doorbell stores its tail before it counts itself: every ring counted in `seen` is covered by
                    // the tail read after it.
                    let rung = self.doorbell.count.load(Ordering::SeqCst);
                    let tail = self.doorbell.tail.load(Ordering::SeqCst);
                    if !state.stalled && state.exception.is_none() && tail != head {
                        // Who rang since the last take, swapped out after the tail was read.
                        let rung_by = ringers.take(&self.doorbell.ringers, provenance::recording_epoch());
                        seen = rung;
                        break (tail, rung_by);
                    }
                    self.doorbell.engine_asleep.store(true, Ordering::SeqCst);
                    if self.doorbell.count.load(Ordering::SeqCst) != rung {
                        // Rung between the look above and going to sleep.
                        self.doorbell.engine_asleep.store(false, Ordering::SeqCst);
                        continue;
                    }
                    state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
                    self.doorbell.engine_asleep.store(false, Ordering::SeqCst);
                }
            };
            if tail >= self.depth {
                self.raise(self.exception_at(head, tail, Syndrome::BAD_TAIL, [0; SQE_BYTES]));
                continue;
            }
            // The record's sq_head is published when the run stops (caught up with the tail, interrupted, or at a bad
            // SQE, before its exception is raised), not per SQE: the kernel stores its software tail into the same
            // record line at every doorbell, and a store per SQE from here would take that line from the ringing
            // core each time. Nobody reads the record's head during a run (the kernel at channel load, the Host at
            // an exception).
            // Busy from here to the end of the run: one clock reading at each end, none per SQE.
            self.busy.run_started();
            // The trace's engine track: one relaxed load per run when off.
            let traced_start = crate::occupancy::engine_runs_recorded(self.device).then(crate::occupancy::monotonic_ns);
            let mut executed = 0u64;
            let mut fault = None;
            while head != tail && !self.interrupt.load(Ordering::Acquire) {
                match self.execute(head, rung_by, seen) {
                    Ok(()) => {
                        head = (head + 1) % self.depth;
                        self.progress.head.store(head, Ordering::Relaxed);
                        executed += 1;
                    }
                    Err(failed) => {
                        fault = Some(failed);
                        break;
                    }
                }
            }
            // Before the head is published: whoever sees the head sees the run's counters final.
            self.busy.run_ended(executed);
            if let Some(start_ns) = traced_start {
                crate::occupancy::push_engine_run(crate::occupancy::EngineRun {
                    device: self.device,
                    channel: self.index,
                    start_ns,
                    end_ns: crate::occupancy::monotonic_ns(),
                    sqes: executed,
                });
            }
            let published = space().as_ref().map(|space| self.publish_head(space, head));
            self.activity.progressed();
            if let Some((syndrome, raw)) = fault {
                self.raise(self.exception_at(head, tail, syndrome, raw));
            } else if let Some(Err(syndrome)) = published {
                // The record no longer translates (its workspace was freed): as a fault of the SQE at the head.
                self.raise(self.exception_at(head, tail, syndrome, [0; SQE_BYTES]));
            }
        }
    }
}

/// The SDMA engines of one device.
#[derive(Debug)]
pub(crate) struct Engines {
    pub channels: Vec<Arc<Channel>>,
    threads: Vec<JoinHandle<()>>,
    /// Device allocations to free: the workspace and the rings.
    allocations: Vec<usize>,
    register_pages: Vec<usize>,
}

/// Injected destination faults still to raise, by device ([`crate::control::fail_next_destinations`]).
static INJECTED_DESTINATION_FAULTS: LazyLock<Mutex<HashMap<i32, u32>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// Whether any device has injected faults pending (the engines' fast path skips the map otherwise).
static ANY_INJECTED: AtomicBool = AtomicBool::new(false);

/// Makes the next `count` SQEs any engine of `device` executes (and stream copies its copy engines run) fail as if
/// their destination did not translate.
pub(crate) fn inject_destination_faults(device: i32, count: u32) {
    let mut faults = lock(&INJECTED_DESTINATION_FAULTS);
    faults.insert(device, count);
    ANY_INJECTED.store(faults.values().any(|&left| left > 0), Ordering::Release);
}

/// Consumes one injected destination fault of `device`, if one is pending.
pub(crate) fn take_injected_destination_fault(device: i32) -> bool {
    if !ANY_INJECTED.load(Ordering::Acquire) {
        return false;
    }
    let mut faults = lock(&INJECTED_DESTINATION_FAULTS);
    let taken = match faults.get_mut(&device) {
        Some(left) if *left > 0 => {
            *left -= 1;
            true
        }
        _ => false,
    };
    ANY_INJECTED.store(faults.values().any(|&left| left > 0), Ordering::Release);
    taken
}

/// Engines by device.
static ENGINES: LazyLock<Mutex<HashMap<i32, Engines>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// The AI CPU's channels by device ([`aicpu_channels`]).
static AICPU_ENGINES: LazyLock<Mutex<HashMap<i32, Engines>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// Register pages by device address: the channel whose doorbell each holds.
static REGISTERS: LazyLock<RwLock<HashMap<u64, Arc<Channel>>>> = LazyLock::new(|| RwLock::new(HashMap::new()));
/// Bumped, under [`REGISTERS`]' write lock, by every change of it: a [`RegisterCache`] filled before is stale.
static REGISTERS_GENERATION: AtomicU64 = AtomicU64::new(0);

/// The register page an emulated core rang last, so that its doorbells (one page, thousands of times) skip the
/// registry: valid while [`REGISTERS_GENERATION`] has not moved.
#[derive(Debug, Default)]
pub(crate) struct RegisterCache(std::cell::RefCell<Option<(u64, Arc<Channel>, u64)>>);

/// The channel `(device, channel)`, if that device has engines: one of SHMEM's (index below [`MAX_CHANNELS`]) or
/// one of the AI CPU's (index [`AICPU_CHANNEL_BASE`] and up).
pub(crate) fn channel(device: i32, channel: u32) -> Option<Arc<Channel>> {
    let of = |map: &Mutex<HashMap<i32, Engines>>| {
        lock(map)
            .get(&device)
            .and_then(|engines| engines.channels.iter().find(|candidate| candidate.index == channel).cloned())
    };
    if channel >= AICPU_CHANNEL_BASE {
        of(&AICPU_ENGINES)
    } else {
        lock(&ENGINES).get(&device).and_then(|engines| engines.channels.get(channel as usize).cloned())
    }
}

/// Every live channel of every device, SHMEM's and the AI CPU's (for the twin-only evidence counts,
/// [`crate::evidence`]).
pub(crate) fn all_channels() -> Vec<Arc<Channel>> {
    let mut all: Vec<Arc<Channel>> =
        lock(&ENGINES).values().flat_map(|engines| engines.channels.iter().cloned()).collect();
    all.extend(lock(&AICPU_ENGINES).values().flat_map(|engines| engines.channels.iter().cloned()));
    all
}

/// Writes `bytes` at `address` through the device view (the space read-locked).
pub(crate) fn write_device(address: u64, bytes: &[u8]) -> Result<(), aclError> {
    let guard = space();
    let space = guard.as_ref().ok_or(ACL_ERROR_RT_INTERNAL_ERROR)?;
    let to = space.translate(address as usize, bytes.len(), true)?;
    let from = [Segment { ptr: bytes.as_ptr().cast_mut(), len: bytes.len() }];
    // SAFETY: `to` was translated under the read lock held here; `from` is a live buffer only read.
    unsafe { perform_copy(&to, &from) };
    Ok(())
}

/// Where a group's channel records live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Records {
    /// SHMEM's SDMA workspace: the flag info, then one record per channel from [`CHANNEL_RECORDS_OFFSET`].
    Workspace,
    /// The AI CPU's block: per channel [`AICPU_SLOT_BYTES`], the record first, then its completion word and flag
    /// source ([`AICPU_COMPLETION_OFFSET`], [`AICPU_FLAG_SOURCE_OFFSET`]).
    AiCpu,
}

impl Records {
    fn block_bytes(self, count: u32) -> usize {
        match self {
            Records::Workspace => WORKSPACE_BYTES,
            Records::AiCpu => (count as usize * AICPU_SLOT_BYTES).max(page()),
        }
    }

    fn offset(self, n: u32) -> usize {
        match self {
            Records::Workspace => CHANNEL_RECORDS_OFFSET + n as usize * CHANNEL_RECORD_BYTES,
            Records::AiCpu => n as usize * AICPU_SLOT_BYTES,
        }
    }
}

/// Makes `count` channels of `depth` SQEs on `device`, numbered from `first`, with their records block, rings,
/// register pages and one engine thread each, registered for doorbells and watched by the provenance records.
fn build(device: i32, first: u32, count: u32, depth: u32, records: Records) -> Result<Engines, aclError> {
    let block_bytes = records.block_bytes(count);
    if records == Records::Workspace && CHANNEL_RECORDS_OFFSET + count as usize * CHANNEL_RECORD_BYTES > block_bytes {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let ring_bytes = depth as usize * SQE_BYTES;
    let mut allocations = Vec::new();
    let mut register_pages = Vec::new();
    let made = with_space_mut(|space| {
        allocations.push(space.malloc(block_bytes, device)?);
        for _ in 0..count {
            allocations.push(space.malloc(ring_bytes, device)?);
            register_pages.push(space.take_register_page()?);
        }
        Ok(())
    });
    let undo = |allocations: &[usize], register_pages: &[usize]| {
        let _ = with_space_mut(|space| {
            allocations.iter().for_each(|&address| {
                let _ = space.free(address);
            });
            register_pages.iter().for_each(|&address| space.give_register_page(address));
            Ok(())
        });
    };
    if let Err(code) = made {
        undo(&allocations, &register_pages);
        return Err(code);
    }
    let base = allocations[0] as u64;
    let mut image = vec![0u8; block_bytes];
    if records == Records::Workspace {
        image[0..4].copy_from_slice(&WORKSPACE_FLAG_FILLED.to_le_bytes());
        image[4..8].copy_from_slice(&count.to_le_bytes());
    }
    let mut channels = Vec::new();
    for n in 0..count {
        let index = first + n;
        let record_at = records.offset(n);
        let record = ChannelRecord {
            sq_base: allocations[1 + n as usize] as u64,
            sq_reg_base: register_pages[n as usize] as u64,
            sq_depth: depth,
            sq_id: index,
            cq_id: index,
            logic_cq_id: index,
            stream_id: index,
            dev_id: device as u32,
            ..ChannelRecord::default()
        };
        image[record_at..record_at + CHANNEL_RECORD_BYTES].copy_from_slice(&record.to_bytes());
        channels.push(Arc::new(Channel {
            device,
            index,
            sq_id: index,
            record: base + record_at as u64,
            sq_base: record.sq_base,
            depth,
            reg_base: record.sq_reg_base,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            reset: Condvar::new(),
            interrupt: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            progress: CachePadded::new(Progress::default()),
            doorbell: CachePadded::new(Doorbell::default()),
            activity: crate::kernel::Activity::of(device, index),
            provenance: Arc::new(provenance::ChannelProvenance::new(device, record.sq_base, depth)),
            busy: crate::occupancy::channel_counters(device, index),
        }));
    }
    let zero_ring = vec![0u8; ring_bytes];
    let written = write_device(base, &image)
        .and_then(|()| allocations[1..].iter().try_for_each(|&ring| write_device(ring as u64, &zero_ring)));
    if let Err(code) = written {
        undo(&allocations, &register_pages);
        return Err(code);
    }
    let mut threads = Vec::new();
    for channel in &channels {
        let engine = Arc::clone(channel);
        let spawned =
            std::thread::Builder::new().name(format!("cann-twin-sdma-d{device}c{}", channel.index)).spawn(move || {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.run()));
            });
        match spawned {
            Ok(handle) => threads.push(handle),
            Err(_) => {
                channels.iter().for_each(|channel| channel.shut_down());
                threads.into_iter().for_each(|handle: JoinHandle<()>| drop(handle.join()));
                undo(&allocations, &register_pages);
                return Err(ACL_ERROR_RT_NO_STREAM_RESOURCE);
            }
        }
    }
    {
        let mut registers = REGISTERS.write().unwrap_or_else(|p| p.into_inner());
        for channel in &channels {
            registers.insert(channel.reg_base, Arc::clone(channel));
        }
        REGISTERS_GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    provenance::watch(&channels.iter().map(|channel| Arc::clone(&channel.provenance)).collect::<Vec<_>>());
    Ok(Engines { channels, threads, allocations, register_pages })
}

/// Creates the SDMA workspace and `count` channels of `depth` SQEs on `device`, with one engine thread each;
/// returns the workspace's device address.
pub(crate) fn create(device: i32, count: u32, depth: u32) -> Result<u64, aclError> {
    let mut engines = lock(&ENGINES);
    if engines.contains_key(&device) {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let made = build(device, 0, count, depth, Records::Workspace)?;
    let workspace = made.allocations[0] as u64;
    engines.insert(device, made);
    Ok(workspace)
}

/// The AI CPU's channels on `device` ([`AICPU_CHANNELS`] of [`SQ_DEPTH`] SQEs, numbered from
/// [`AICPU_CHANNEL_BASE`]), created on first use: an RTSQ per AI-CPU thread, separate from SHMEM's channels and with
/// no record in SHMEM's workspace. Each channel's record lies in a block of its own, followed by the channel's
/// completion word and flag source. Destroyed with the device's last `aclrtResetDevice` ([`destroy_aicpu`]).
pub(crate) fn aicpu_channels(device: i32) -> Result<Vec<Arc<Channel>>, aclError> {
    let mut engines = lock(&AICPU_ENGINES);
    if let Some(made) = engines.get(&device) {
        return Ok(made.channels.clone());
    }
    let made = build(device, AICPU_CHANNEL_BASE, AICPU_CHANNELS, SQ_DEPTH, Records::AiCpu)?;
    let channels = made.channels.clone();
    engines.insert(device, made);
    Ok(channels)
}

/// Stops and joins the engines of a group, then frees its records block, rings and register pages. Memory already
/// freed is skipped.
fn tear_down(engines: Engines) {
    // Its SDMA channels only: the device's NIC QPs keep their watches until they are destroyed.
    let channels: Vec<_> = engines.channels.iter().map(|channel| Arc::clone(&channel.provenance)).collect();
    provenance::unwatch(&channels);
    {
        let mut registers = REGISTERS.write().unwrap_or_else(|p| p.into_inner());
        for channel in &engines.channels {
            registers.remove(&channel.reg_base);
        }
        REGISTERS_GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    engines.channels.iter().for_each(|channel| channel.shut_down());
    for handle in engines.threads {
        let _ = handle.join();
    }
    let _ = with_space_mut(|space| {
        engines.allocations.iter().for_each(|&address| {
            let _ = space.free(address);
        });
        engines.register_pages.iter().for_each(|&address| space.give_register_page(address));
        Ok(())
    });
}

/// Stops and joins `device`'s engines, then frees its workspace, rings and register pages. Memory the device's
/// last `aclrtResetDevice` already freed is skipped.
pub(crate) fn destroy(device: i32) {
    let Some(engines) = lock(&ENGINES).remove(&device) else { return };
    tear_down(engines);
}

/// Stops and joins the AI CPU's channels of `device` and frees their memory (the device's last `aclrtResetDevice`,
/// before the device's memory goes, or `aclFinalize`); the next AI-CPU task on the device makes new ones.
pub(crate) fn destroy_aicpu(device: i32) {
    let Some(engines) = lock(&AICPU_ENGINES).remove(&device) else { return };
    tear_down(engines);
}

/// A write of `bytes` by the device (an AIV core's `copy_ubuf_to_gm` whose destination is a register page) to
/// device address `device_va`. The doorbell accepts exactly a 4-byte little-endian write at offset 0x8 of its page:
/// it sets the SQ tail and wakes the engine. Any other width or offset writes nothing, raises a
/// [`Syndrome::REGISTER_ACCESS`] exception on the page's channel (which stops it until reset) and returns
/// [`RegisterFault::Refused`]; an address in no register page returns [`RegisterFault::NotARegister`].
///
/// The twin cannot tell who calls this (a CPU AscendC layer of its own): the doorbell's origin is recorded as
/// unknown ([`crate::control::Provenance::doorbells_unknown`]).
pub fn register_write(device_va: u64, bytes: &[u8]) -> Result<(), RegisterFault> {
    register_write_through(&RegisterCache::default(), device_va, bytes, provenance::WRITER_OTHER)
}

/// [`register_write`] by the AI CPU: the path of an AI-CPU kernel's doorbell (an SDMA channel's tail, a twin NIC QP's
/// SQ doorbell), recorded with the AI CPU as its origin ([`crate::control::Provenance::doorbells_by_aicpu`]).
pub(crate) fn aicpu_register_write(device_va: u64, bytes: &[u8]) -> Result<(), RegisterFault> {
    register_write_through(&RegisterCache::default(), device_va, bytes, provenance::WRITER_AICPU)
}

/// [`register_write`] through a core's [`RegisterCache`], by `origin` (a `provenance::WRITER_*` id: the ringing
/// core's block, or the AI CPU).
pub(crate) fn register_write_through(
    cache: &RegisterCache,
    device_va: u64,
    bytes: &[u8],
    origin: u32,
) -> Result<(), RegisterFault> {
    let page = page() as u64;
    let base = device_va - device_va % page;
    // Read before the registry: a change after this read moves the generation, so what is cached under it is
    // looked up again next time.
    let generation = REGISTERS_GENERATION.load(Ordering::Acquire);
    let hit = matches!(&*cache.0.borrow(), Some((cached, _, cached_generation)) if *cached == base && *cached_generation == generation);
    if !hit {
        let found = REGISTERS.read().unwrap_or_else(|p| p.into_inner()).get(&base).cloned();
        let Some(channel) = found else {
            // Not an SDMA page: perhaps a twin NIC QP's doorbell page (never cached here).
            return crate::nic::register_write(device_va, bytes, origin)
                .unwrap_or(Err(RegisterFault::NotARegister { va: device_va }));
        };
        *cache.0.borrow_mut() = Some((base, channel, generation));
    }
    let cached = cache.0.borrow();
    let Some((_, channel, _)) = &*cached else { return Err(RegisterFault::NotARegister { va: device_va }) };
    let offset = device_va - base;
    if offset != DOORBELL_OFFSET || bytes.len() != DOORBELL_WIDTH {
        let width = bytes.len();
        let tail = channel.doorbell.tail.load(Ordering::SeqCst);
        let head = channel.progress.head.load(Ordering::Relaxed);
        let mut exception = channel.exception_at(head, tail, Syndrome::REGISTER_ACCESS, [0; SQE_BYTES]);
        exception.register = Some(RegisterAccess { offset, width });
        channel.raise(exception);
        return Err(RegisterFault::Refused { device: channel.device, channel: channel.index, offset, width });
    }
    let tail = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if origin >= provenance::WRITER_BLOCK0 && channel.doorbell.divert.load(Ordering::Acquire) {
        // The test-only mis-wiring: the core's write is parked, not rung.
        let count = (channel.doorbell.diverted.load(Ordering::Acquire) >> 32) + 1;
        channel.doorbell.diverted.store((count << 32) | u64::from(tail), Ordering::Release);
        return Ok(());
    }
    channel.ring(tail, origin);
    Ok(())
}

/// [`register_write`] for C (the CPU AscendC layer's `copy_ubuf_to_gm` to a register page): 0 when accepted, -1
/// when `va` is in no register page, -2 when refused (the channel raised a register-access exception), -3 when
/// `src` is null with `len > 0`.
///
/// # Safety
///
/// `src` is null or valid for reading `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn aiv_twin_register_write(va: u64, src: *const u8, len: u32) -> i32 {
    if src.is_null() && len > 0 {
        return -3;
    }
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: non-null and valid for `len` bytes (the caller's contract).
        unsafe { std::slice::from_raw_parts(src, len as usize) }
    };
    match std::panic::catch_unwind(|| register_write(va, bytes)) {
        Ok(Ok(())) => 0,
        Ok(Err(RegisterFault::NotARegister { .. })) => -1,
        Ok(Err(RegisterFault::Refused { .. } | RegisterFault::QpRefused { .. })) => -2,
        Err(_) => -3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn the_sqe_and_record_layouts_are_the_documented_ones() {
        assert_eq!(size_of::<SdmaSqe>(), 64);
        assert_eq!(offset_of!(SdmaSqe, block_dim), 2);
        assert_eq!(offset_of!(SdmaSqe, rt_stream_id), 4);
        assert_eq!(offset_of!(SdmaSqe, task_id), 6);
        assert_eq!(offset_of!(SdmaSqe, kernel_credit), 14);
        assert_eq!(offset_of!(SdmaSqe, ptr_mode), 15);
        assert_eq!(offset_of!(SdmaSqe, opcode_word), 16);
        assert_eq!(offset_of!(SdmaSqe, src_stream_id), 20);
        assert_eq!(offset_of!(SdmaSqe, dst_stream_id), 24);
        assert_eq!(offset_of!(SdmaSqe, length), 28);
        assert_eq!(offset_of!(SdmaSqe, src_addr_low), 32);
        assert_eq!(offset_of!(SdmaSqe, src_addr_high), 36);
        assert_eq!(offset_of!(SdmaSqe, dst_addr_low), 40);
        assert_eq!(offset_of!(SdmaSqe, dst_addr_high), 44);
        assert_eq!(offset_of!(SdmaSqe, link_type), 48);
        assert_eq!(offset_of!(SdmaSqe, reserved3), 52);

        assert_eq!(size_of::<ChannelRecord>(), CHANNEL_RECORD_BYTES);
        assert_eq!(offset_of!(ChannelRecord, sq_tail), 4);
        assert_eq!(offset_of!(ChannelRecord, sq_base), 8);
        assert_eq!(offset_of!(ChannelRecord, sq_reg_base), 16);
        assert_eq!(offset_of!(ChannelRecord, sq_depth), 24);
        assert_eq!(offset_of!(ChannelRecord, sq_id), 28);
        assert_eq!(offset_of!(ChannelRecord, cq_id), 32);
        assert_eq!(offset_of!(ChannelRecord, logic_cq_id), 36);
        assert_eq!(offset_of!(ChannelRecord, cqe_addr), 40);
        assert_eq!(offset_of!(ChannelRecord, report_cqe_num), 48);
        assert_eq!(offset_of!(ChannelRecord, stream_id), 52);
        assert_eq!(offset_of!(ChannelRecord, dev_id), 56);
        assert_eq!(offset_of!(ChannelRecord, reserved), 60);
        assert_eq!(CHANNEL_RECORDS_OFFSET + MAX_CHANNELS as usize * CHANNEL_RECORD_BYTES, 3136);
    }

    #[test]
    fn encodings_round_trip_at_the_documented_offsets() {
        let record = ChannelRecord {
            sq_head: 1,
            sq_tail: 2,
            sq_base: 0x1122_3344_5566_7788,
            sq_reg_base: 0x99aa_bbcc_ddee_ff00,
            sq_depth: 2048,
            sq_id: 5,
            cq_id: 6,
            logic_cq_id: 7,
            cqe_addr: 8,
            report_cqe_num: 9,
            stream_id: 10,
            dev_id: 11,
            reserved: [1, 2, 3, 4],
        };
        let bytes = record.to_bytes();
        assert_eq!(&bytes[8..16], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&bytes[24..28], &2048u32.to_le_bytes());
        assert_eq!(ChannelRecord::from_bytes(&bytes), record);

        let mut raw = [0u8; SQE_BYTES];
        raw[0..2].copy_from_slice(&(SQE_TYPE_SDMA | 0x40).to_le_bytes());
        raw[16..20].copy_from_slice(&(0x600u32 << 4 | 0x3).to_le_bytes());
        raw[28..32].copy_from_slice(&4096u32.to_le_bytes());
        raw[32..40].copy_from_slice(&0x0000_0012_3456_7000u64.to_le_bytes());
        raw[40..48].copy_from_slice(&0x0000_00ab_cdef_0000u64.to_le_bytes());
        let sqe = SdmaSqe::from_bytes(&raw);
        assert_eq!(sqe.sqe_type(), SQE_TYPE_SDMA, "bits 6-15 are not the type");
        assert_eq!(sqe.opcode(), 3);
        assert_eq!(sqe.length, 4096);
        assert_eq!(sqe.src(), 0x12_3456_7000);
        assert_eq!(sqe.dst(), 0xab_cdef_0000);
    }
}
