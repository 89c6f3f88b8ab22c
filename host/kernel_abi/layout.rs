//! The Rust mirror of `kernels/include/aiv/layouts.h`, field for field.
//!
//! The SDMA SQE and the channel record follow docs/hardware.md section 4 exactly. Descriptor types use explicit
//! little-endian field types (they are written by one agent and decoded by another); ring headers and the control block
//! hold words accessed atomically by the Host and the kernel, so they are declared as native atomics (the flag area
//! as native integers) and the crate refuses to build for a big-endian target. Values written by the kernel are decoded totally ([`DcqStatus`],
//! [`Syndrome`] are newtypes, never enums). [`layout_facts`] lists every size, offset and constant below;
//! `tests/layout_probe.rs` renders it as the `static_assert`s of `kernels/include/aiv/layout_asserts.h`, which
//! `layouts.h` includes, so a C header that differs does not compile.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64};

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

#[cfg(target_endian = "big")]
compile_error!("the device layouts are little-endian and ring words are accessed natively");

/// One cache line: ring heads and tails never share one.
pub const CACHE_LINE: u64 = 64;
/// Bytes of one SQE.
pub const SQE_BYTES: u64 = 64;
/// SQE type of an SDMA copy (docs/hardware.md section 4).
pub const SQE_TYPE_SDMA: u16 = 11;
/// Bits of the type field in the first SQE word.
pub const SQE_TYPE_MASK: u16 = 0x3F;
/// `kernel_credit` written for SDMA SQEs.
pub const SQE_KERNEL_CREDIT_SDMA: u8 = 240;
/// `link_type` written for a copy.
pub const SQE_LINK_TYPE_NONE: u8 = 255;
/// At most this many bytes per SQE.
pub const SDMA_MAX_SQE_BYTES: u32 = 1 << 20;
/// The doorbell register's offset from `sq_reg_base` on A2/A3 (0x0 on Ascend 950).
pub const SDMA_DOORBELL_OFFSET: u64 = 0x8;
/// Copy opcode (bits 7:0 of the word at offset 16).
pub const SQE_OPCODE_COPY: u32 = 0;
/// `sssv` bit.
pub const SQE_BIT_SSSV: u32 = 1 << 9;
/// `dssv` bit.
pub const SQE_BIT_DSSV: u32 = 1 << 10;
/// `sns` bit.
pub const SQE_BIT_SNS: u32 = 1 << 11;
/// `dns` bit.
pub const SQE_BIT_DNS: u32 = 1 << 12;
/// Shift of the qos field.
pub const SQE_QOS_SHIFT: u32 = 13;
/// qos written for a copy.
pub const SQE_QOS_COPY: u32 = 6;
/// Bytes of a ring header; entries follow it.
pub const RING_HEADER_BYTES: u64 = 128;
/// Request opcode READ (remote -> local).
pub const REQUEST_OPCODE_READ: u32 = 0;
/// Request opcode WRITE (local -> remote).
pub const REQUEST_OPCODE_WRITE: u32 = 1;
/// Launch mode: one launch per submitted batch.
pub const LAUNCH_PER_BATCH: u32 = 0;
/// Launch mode: resident kernel polling its request ring.
pub const LAUNCH_PERSISTENT: u32 = 1;
/// Requests a block takes per completion flag.
pub const GROUP_MAX_TRANSFERS: u32 = 64;
/// Version stamped into [`KernelArgs`]; the kernel refuses other versions.
pub const LAYOUT_VERSION: u32 = 2;

/// The SDMA SQE (docs/hardware.md section 4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SdmaSqe {
    /// Type in bits 0-5.
    pub type_word: U16,
    pub block_dim: U16,
    pub rt_stream_id: U16,
    /// `sq_tail - sq_head` when written.
    pub task_id: U16,
    pub reserved0: U32,
    pub reserved1: U16,
    pub kernel_credit: u8,
    /// Bit 0.
    pub ptr_mode: u8,
    /// `opcode[7:0] ie2[8] sssv[9] dssv[10] sns[11] dns[12] qos[16:13] sro[17] dro[18] partid[26:19] mpam[27]`.
    pub opcode_word: U32,
    pub src_stream_id: U16,
    pub src_sub_stream_id: U16,
    pub dst_stream_id: U16,
    pub dst_sub_stream_id: U16,
    /// Bytes, at most 1 MiB.
    pub length: U32,
    pub src_addr_low: U32,
    pub src_addr_high: U32,
    pub dst_addr_low: U32,
    pub dst_addr_high: U32,
    pub link_type: u8,
    pub reserved2: [u8; 3],
    pub reserved3: [U32; 3],
}

impl SdmaSqe {
    /// The SQE type (bits 0-5 of the first word).
    pub fn sqe_type(&self) -> u16 {
        self.type_word.get() & SQE_TYPE_MASK
    }
    /// The copy opcode (bits 7:0 of the word at offset 16).
    pub fn opcode(&self) -> u32 {
        self.opcode_word.get() & 0xFF
    }
    /// Source address.
    pub fn src(&self) -> u64 {
        u64::from(self.src_addr_high.get()) << 32 | u64::from(self.src_addr_low.get())
    }
    /// Destination address.
    pub fn dst(&self) -> u64 {
        u64::from(self.dst_addr_high.get()) << 32 | u64::from(self.dst_addr_low.get())
    }
    /// A copy SQE as the kernel writes it (used by tests and tools; the kernel builds its own).
    pub fn copy(src: u64, dst: u64, length: u32, stream_id: u16, task_id: u16) -> SdmaSqe {
        SdmaSqe {
            type_word: U16::new(SQE_TYPE_SDMA),
            rt_stream_id: U16::new(stream_id),
            task_id: U16::new(task_id),
            kernel_credit: SQE_KERNEL_CREDIT_SDMA,
            opcode_word: U32::new(
                SQE_OPCODE_COPY
                    | SQE_BIT_SSSV
                    | SQE_BIT_DSSV
                    | SQE_BIT_SNS
                    | SQE_BIT_DNS
                    | SQE_QOS_COPY << SQE_QOS_SHIFT,
            ),
            length: U32::new(length),
            src_addr_low: U32::new(src as u32),
            src_addr_high: U32::new((src >> 32) as u32),
            dst_addr_low: U32::new(dst as u32),
            dst_addr_high: U32::new((dst >> 32) as u32),
            link_type: SQE_LINK_TYPE_NONE,
            ..SdmaSqe::default()
        }
    }
}

/// One SDMA channel record of SHMEM's SDMA workspace (docs/hardware.md section 4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ChannelRecord {
    pub sq_head: U32,
    /// Software copy of the tail kept by the kernel.
    pub sq_tail: U32,
    /// Ring of 64-byte SQEs.
    pub sq_base: U64,
    /// Doorbell register base.
    pub sq_reg_base: U64,
    pub sq_depth: U32,
    pub sq_id: U32,
    pub cq_id: U32,
    pub logic_cq_id: U32,
    /// Unused by the device path.
    pub cqe_addr: U64,
    pub report_cqe_num: U32,
    pub stream_id: U32,
    pub dev_id: U32,
    pub reserved: [u8; 4],
}

/// Header of a single-producer single-consumer ring: consumer `head` and producer `tail` on separate cache lines.
/// Both are free-running indices, shared with the kernel and accessed only atomically (through the views in
/// [`crate::kernel_abi::ring`]).
#[derive(Debug, FromBytes, KnownLayout)]
#[repr(C, align(64))]
pub struct RingHeader {
    pub head: AtomicU32,
    pub pad0: [u8; 60],
    pub tail: AtomicU32,
    pub pad1: [u8; 60],
}

/// One transfer request, Host -> kernel; addresses already in the executing device's view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RequestEntry {
    pub transfer_id: U64,
    pub src_addr: U64,
    pub dst_addr: U64,
    pub length: U64,
    /// [`REQUEST_OPCODE_READ`] or [`REQUEST_OPCODE_WRITE`].
    pub opcode: U32,
    /// Route [7:0] ([`REQUEST_ROUTE_SDMA`], [`REQUEST_ROUTE_RDMA`]) and, for RDMA, the QP index
    /// (<< [`REQUEST_QP_SHIFT`]) in the block's QP table; 0: SDMA.
    pub flags: U32,
    /// RDMA only: the key of the registration the local side lies in (0: the QP record's).
    pub lkey: U32,
    /// RDMA only: the key of the target's registration the remote side lies in (0: the QP record's).
    pub rkey: U32,
    pub reserved: [U64; 2],
}

/// Mask of the route in a request's `flags`.
pub const REQUEST_ROUTE_MASK: u32 = 0xFF;
/// Route: SDMA SQEs on the block's channel (same host).
pub const REQUEST_ROUTE_SDMA: u32 = 0;
/// Route: RoCE WQEs on a QP of the block's QP table (another host).
pub const REQUEST_ROUTE_RDMA: u32 = 1;
/// Shift of the QP index in a request's `flags`.
pub const REQUEST_QP_SHIFT: u32 = 16;
/// QP records per block at most.
pub const QP_TABLE_SLOTS: u32 = 16;
/// The largest message of one WQE.
pub const RDMA_MAX_WQE_BYTES: u32 = 16 << 20;

/// One completion, kernel -> Host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DcqEntry {
    pub transfer_id: U64,
    pub bytes: U64,
    /// Raw [`DcqStatus`].
    pub status: U32,
    /// Raw [`Syndrome`].
    pub syndrome: U32,
    /// SQEs written for this transfer, its share of the flag SQE included.
    pub sqes: U32,
    /// Doorbells that covered its SQEs.
    pub doorbells: U32,
}

/// Per-block control words; Host-written and kernel-written words on separate cache lines. Shared with the kernel
/// and accessed only atomically.
#[derive(Debug, FromBytes, KnownLayout)]
#[repr(C, align(64))]
pub struct ControlBlock {
    /// Host -> kernel: leave the persistent loop.
    pub stop: AtomicU32,
    /// Host -> kernel: a change aborts the current completion wait.
    pub abort_epoch: AtomicU32,
    /// Host -> kernel: set to `halt_count` once the channel has been reset.
    pub resume_count: AtomicU32,
    pub pad0: [u8; 52],
    /// Kernel -> Host: incremented when a group fails and the block halts.
    pub halt_count: AtomicU32,
    /// Kernel -> Host: 1 while a launch of this block runs.
    pub running: AtomicU32,
    /// Kernel -> Host: groups completed.
    pub groups: AtomicU64,
    /// Kernel -> Host: the trace ring address the launch last read from its arguments (stored at launch and whenever
    /// it reads a changed one): the Host's acknowledgement that a trace switch was seen.
    pub trace_ring_seen: AtomicU64,
    pub pad1: [u8; 40],
}

/// Source slots of the flag area: flag `seq` copies `source[seq % FLAG_SOURCE_SLOTS]` (see layouts.h for why).
pub const FLAG_SOURCE_SLOTS: u32 = 4;

/// The per-block flag area in device memory: flag SQE `seq` copies `source[seq % FLAG_SOURCE_SLOTS]` to `receive`.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct FlagArea {
    pub source: [u64; FLAG_SOURCE_SLOTS as usize],
    pub pad0: [u8; 32],
    pub receive: u64,
    pub pad1: [u8; 56],
}

/// Arguments of one block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockArgs {
    pub request_ring: U64,
    pub dcq: U64,
    pub channel_record: U64,
    pub flag_area: U64,
    pub control: U64,
    /// Opaque to the kernel: a platform layer's handle (0: the NPU platform layer, on either runtime, takes none).
    pub platform_context: U64,
    /// Completion wait budget in platform cycles.
    pub wait_budget: U64,
    pub request_depth: U32,
    pub dcq_depth: U32,
    pub doorbell_batch: U32,
    pub max_sqe_bytes: U32,
    pub launch_mode: U32,
    pub group_limit: U32,
    /// The block's trace ring ([`TraceHeader`] + [`TraceEntry`]`[trace_depth]`), or 0: no trace. A persistent launch
    /// re-reads it (and `trace_depth`) when idle, so the Host may set or clear it while the kernel runs.
    pub trace_ring: U64,
    /// Entries of the trace ring: a power of two >= 2 when `trace_ring` is set.
    pub trace_depth: U32,
    /// Entries of `qp_table` (at most [`QP_TABLE_SLOTS`]); 0: no RDMA route.
    pub qp_count: U32,
    /// The block's QP records (`QpRecord[qp_count]`, crate::kernel_abi::roce), Host memory registered for the device.
    pub qp_table: U64,
    /// The largest message of one WQE (at most [`RDMA_MAX_WQE_BYTES`]).
    pub max_wqe_bytes: U32,
    pub reserved1: U32,
    pub reserved: [U64; 2],
}

/// Stages of a trace entry (`AIV_TRACE_STAGE_*`): a group taken from the request ring (count: requests).
pub const TRACE_STAGE_REQUEST_SEEN: u32 = 1;
/// The group's data SQEs written (count: SQEs), before its flag SQE.
pub const TRACE_STAGE_SQES_POSTED: u32 = 2;
/// A doorbell rung (count: the SQ tail written, aux: the SQEs it covers).
pub const TRACE_STAGE_DOORBELL: u32 = 3;
/// The group's completion flag seen, or its wait ended (aux: 0 seen, 1 budget exhausted, 2 aborted).
pub const TRACE_STAGE_COMPLETION_OBSERVED: u32 = 4;
/// The group's DCQ entries published (count: entries, aux: 1 when the group failed).
pub const TRACE_STAGE_DCQ_PUBLISHED: u32 = 5;

/// Header of a block's trace ring: the Host's `head` and the kernel's `tail` and `dropped` on separate cache lines,
/// accessed only atomically (through [`crate::kernel_abi::TraceRing`]).
#[derive(Debug, FromBytes, KnownLayout)]
#[repr(C, align(64))]
pub struct TraceHeader {
    pub head: AtomicU32,
    pub pad0: [u8; 60],
    pub tail: AtomicU32,
    /// Entries the kernel dropped because the ring was full.
    pub dropped: AtomicU32,
    pub pad1: [u8; 56],
}

/// One trace entry, kernel -> Host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct TraceEntry {
    /// The block's system counter at the stage.
    pub cycles: U64,
    /// The group's first transfer id.
    pub transfer_id: U64,
    /// `TRACE_STAGE_*`; 0 is never written.
    pub stage: U32,
    pub count: U32,
    pub aux: U32,
    pub reserved: U32,
}

/// Bytes of a trace ring of `depth` entries: the header, then the entries.
pub const fn trace_ring_bytes(depth: u32) -> usize {
    size_of::<TraceHeader>() + depth as usize * size_of::<TraceEntry>()
}

/// Bytes of one channel record in SHMEM's SDMA workspace.
pub const CHANNEL_RECORD_BYTES: usize = size_of::<ChannelRecord>();
/// Bytes of one request-ring entry.
pub const REQUEST_ENTRY_BYTES: usize = size_of::<RequestEntry>();
/// Bytes of one DCQ entry.
pub const DCQ_ENTRY_BYTES: usize = size_of::<DcqEntry>();
/// Where the `BlockArgs` array starts in the kernel-argument mapping (after [`KernelArgs`], on its own cache line).
pub const KERNEL_ARGS_BLOCKS_OFFSET: usize = CACHE_LINE as usize;

/// Bytes of a request ring of `depth` entries: the header, then the entries.
pub const fn request_ring_bytes(depth: u32) -> usize {
    RING_HEADER_BYTES as usize + depth as usize * REQUEST_ENTRY_BYTES
}

/// Bytes of a DCQ of `depth` entries: the header, then the entries.
pub const fn dcq_bytes(depth: u32) -> usize {
    RING_HEADER_BYTES as usize + depth as usize * DCQ_ENTRY_BYTES
}

/// Bytes of the kernel-argument mapping for `blocks` blocks: [`KernelArgs`], then `BlockArgs[blocks]` from
/// [`KERNEL_ARGS_BLOCKS_OFFSET`].
pub const fn kernel_args_bytes(blocks: usize) -> usize {
    KERNEL_ARGS_BLOCKS_OFFSET + blocks * size_of::<BlockArgs>()
}

/// The kernel's single argument.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct KernelArgs {
    /// Address of `BlockArgs[block_count]`.
    pub blocks: U64,
    pub block_count: U32,
    pub layout_version: U32,
}

/// Status word of a DCQ entry, as the kernel wrote it; decoded totally.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct DcqStatus(pub u32);

impl DcqStatus {
    pub const COMPLETED: DcqStatus = DcqStatus(1);
    pub const FAILED: DcqStatus = DcqStatus(2);
    pub const TIMEOUT: DcqStatus = DcqStatus(3);
    pub const ABORTED: DcqStatus = DcqStatus(4);

    /// Whether the kernel writes this value.
    pub fn is_known(self) -> bool {
        matches!(self, DcqStatus::COMPLETED | DcqStatus::FAILED | DcqStatus::TIMEOUT | DcqStatus::ABORTED)
    }

    /// A readable name; unknown values are named as such.
    pub fn name(self) -> String {
        match self {
            DcqStatus::COMPLETED => "COMPLETED".into(),
            DcqStatus::FAILED => "FAILED".into(),
            DcqStatus::TIMEOUT => "TIMEOUT".into(),
            DcqStatus::ABORTED => "ABORTED".into(),
            DcqStatus(other) => format!("unknown status {other}"),
        }
    }
}

/// Why a transfer did not complete, as the kernel wrote it; decoded totally.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Syndrome(pub u32);

impl Syndrome {
    pub const NONE: Syndrome = Syndrome(0);
    pub const BAD_REQUEST: Syndrome = Syndrome(1);
    pub const WAIT_BUDGET: Syndrome = Syndrome(2);
    pub const ABORTED: Syndrome = Syndrome(3);
    /// RDMA route: the QP index is outside the block's table, or its record is not set up.
    pub const RDMA_BAD_QP: Syndrome = Syndrome(4);
    /// RDMA route: the QP was already in error; the transfer was not posted.
    pub const RDMA_QP_ERROR: Syndrome = Syndrome(5);
    /// RDMA route: an error CQE covered the transfer: `RDMA_CQE | sub-status << 8 | status`.
    pub const RDMA_CQE: Syndrome = Syndrome(0x10000);

    /// The CQE status and sub-status of an [`Syndrome::RDMA_CQE`] syndrome.
    pub fn rdma_cqe(self) -> Option<(super::roce::CqeStatus, u32)> {
        (self.0 & 0xFFFF_0000 == Syndrome::RDMA_CQE.0)
            .then_some((super::roce::CqeStatus(self.0 & 0xFF), (self.0 >> 8) & 0xFF))
    }

    /// A readable description; unknown values are named as such.
    pub fn describe(self) -> String {
        if let Some((status, sub_status)) = self.rdma_cqe() {
            return format!("RDMA error CQE: {} (sub-status 0x{sub_status:02x})", status.describe());
        }
        match self {
            Syndrome::NONE => "none".into(),
            Syndrome::BAD_REQUEST => {
                "bad request (zero length, unknown opcode, address overflow, or a route this kernel does not drive)"
                    .into()
            }
            Syndrome::WAIT_BUDGET => "completion not seen within the kernel wait budget".into(),
            Syndrome::ABORTED => "the Host raised the abort flag".into(),
            Syndrome::RDMA_BAD_QP => "RDMA: no usable QP record at the request's QP index".into(),
            Syndrome::RDMA_QP_ERROR => "RDMA: the QP was already in error (not posted)".into(),
            Syndrome(other) => format!("unknown syndrome {other}"),
        }
    }
}

const _: () = {
    // The kernel cuts transfers into pieces with shifts (no divider on the AIV scalar unit).
    assert!(SDMA_MAX_SQE_BYTES.is_power_of_two() && RDMA_MAX_WQE_BYTES.is_power_of_two());
    assert!(size_of::<SdmaSqe>() == 64);
    assert!(size_of::<ChannelRecord>() == 64);
    assert!(size_of::<RingHeader>() == RING_HEADER_BYTES as usize);
    assert!(size_of::<RequestEntry>() == 64);
    assert!(size_of::<DcqEntry>() == 32);
    assert!(size_of::<ControlBlock>() == 128);
    assert!(size_of::<FlagArea>() == 128);
    assert!(size_of::<BlockArgs>() == 128);
    assert!(size_of::<KernelArgs>() == 16);
    assert!(size_of::<TraceHeader>() == RING_HEADER_BYTES as usize);
    assert!(size_of::<TraceEntry>() == 32);
    assert!(size_of::<KernelArgs>() <= KERNEL_ARGS_BLOCKS_OFFSET);
};

macro_rules! facts {
    ($out:ident; size $t:ident as $c:literal) => {
        $out.push((concat!("size.", $c).to_owned(), size_of::<$t>() as u64));
    };
    ($out:ident; offsets $t:ident as $c:literal { $($f:ident),* $(,)? }) => {
        $( $out.push((concat!("offset.", $c, ".", stringify!($f)).to_owned(), offset_of!($t, $f) as u64)); )*
    };
}
pub(crate) use facts;

/// Every size, field offset and constant of the shared layouts, named after the C side (`size.<C type>`,
/// `offset.<C type>.<field>`, `const.<C macro>`): the source of the generated asserts of `layout_asserts.h` and
/// `roce_asserts.h` (`tests/layout_probe.rs`).
pub fn layout_facts() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    facts!(out; size SdmaSqe as "AivSdmaSqe");
    facts!(out; offsets SdmaSqe as "AivSdmaSqe" { type_word, block_dim, rt_stream_id, task_id, reserved0, reserved1,
        kernel_credit, ptr_mode, opcode_word, src_stream_id, src_sub_stream_id, dst_stream_id, dst_sub_stream_id,
        length, src_addr_low, src_addr_high, dst_addr_low, dst_addr_high, link_type, reserved2, reserved3 });
    facts!(out; size ChannelRecord as "AivChannelRecord");
    facts!(out; offsets ChannelRecord as "AivChannelRecord" { sq_head, sq_tail, sq_base, sq_reg_base, sq_depth, sq_id,
        cq_id, logic_cq_id, cqe_addr, report_cqe_num, stream_id, dev_id, reserved });
    facts!(out; size RingHeader as "AivRingHeader");
    facts!(out; offsets RingHeader as "AivRingHeader" { head, tail });
    facts!(out; size RequestEntry as "AivRequestEntry");
    facts!(out; offsets RequestEntry as "AivRequestEntry" { transfer_id, src_addr, dst_addr, length, opcode, flags,
        lkey, rkey, reserved });
    facts!(out; size DcqEntry as "AivDcqEntry");
    facts!(out; offsets DcqEntry as "AivDcqEntry" { transfer_id, bytes, status, syndrome, sqes, doorbells });
    facts!(out; size ControlBlock as "AivControlBlock");
    facts!(out; offsets ControlBlock as "AivControlBlock" { stop, abort_epoch, resume_count, halt_count, running,
        groups, trace_ring_seen });
    facts!(out; size FlagArea as "AivFlagArea");
    facts!(out; offsets FlagArea as "AivFlagArea" { source, receive });
    facts!(out; size BlockArgs as "AivBlockArgs");
    facts!(out; offsets BlockArgs as "AivBlockArgs" { request_ring, dcq, channel_record, flag_area, control,
        platform_context, wait_budget, request_depth, dcq_depth, doorbell_batch, max_sqe_bytes, launch_mode,
        group_limit, trace_ring, trace_depth, qp_count, qp_table, max_wqe_bytes, reserved1, reserved });
    facts!(out; size TraceHeader as "AivTraceHeader");
    facts!(out; offsets TraceHeader as "AivTraceHeader" { head, tail, dropped });
    facts!(out; size TraceEntry as "AivTraceEntry");
    facts!(out; offsets TraceEntry as "AivTraceEntry" { cycles, transfer_id, stage, count, aux, reserved });
    facts!(out; size KernelArgs as "AivKernelArgs");
    facts!(out; offsets KernelArgs as "AivKernelArgs" { blocks, block_count, layout_version });
    let constants: [(&str, u64); 45] = [
        ("AIV_CACHE_LINE", CACHE_LINE),
        ("AIV_SQE_BYTES", SQE_BYTES),
        ("AIV_SQE_TYPE_SDMA", SQE_TYPE_SDMA.into()),
        ("AIV_SQE_TYPE_MASK", SQE_TYPE_MASK.into()),
        ("AIV_SQE_KERNEL_CREDIT_SDMA", SQE_KERNEL_CREDIT_SDMA.into()),
        ("AIV_SQE_LINK_TYPE_NONE", SQE_LINK_TYPE_NONE.into()),
        ("AIV_SDMA_MAX_SQE_BYTES", SDMA_MAX_SQE_BYTES.into()),
        ("AIV_SDMA_DOORBELL_OFFSET", SDMA_DOORBELL_OFFSET),
        ("AIV_SQE_OPCODE_COPY", SQE_OPCODE_COPY.into()),
        ("AIV_SQE_BIT_SSSV", SQE_BIT_SSSV.into()),
        ("AIV_SQE_BIT_DSSV", SQE_BIT_DSSV.into()),
        ("AIV_SQE_BIT_SNS", SQE_BIT_SNS.into()),
        ("AIV_SQE_BIT_DNS", SQE_BIT_DNS.into()),
        ("AIV_SQE_QOS_SHIFT", SQE_QOS_SHIFT.into()),
        ("AIV_SQE_QOS_COPY", SQE_QOS_COPY.into()),
        ("AIV_RING_HEADER_BYTES", RING_HEADER_BYTES),
        ("AIV_REQUEST_OPCODE_READ", REQUEST_OPCODE_READ.into()),
        ("AIV_REQUEST_OPCODE_WRITE", REQUEST_OPCODE_WRITE.into()),
        ("AIV_DCQ_STATUS_COMPLETED", DcqStatus::COMPLETED.0.into()),
        ("AIV_DCQ_STATUS_FAILED", DcqStatus::FAILED.0.into()),
        ("AIV_DCQ_STATUS_TIMEOUT", DcqStatus::TIMEOUT.0.into()),
        ("AIV_DCQ_STATUS_ABORTED", DcqStatus::ABORTED.0.into()),
        ("AIV_SYNDROME_NONE", Syndrome::NONE.0.into()),
        ("AIV_SYNDROME_BAD_REQUEST", Syndrome::BAD_REQUEST.0.into()),
        ("AIV_SYNDROME_WAIT_BUDGET", Syndrome::WAIT_BUDGET.0.into()),
        ("AIV_SYNDROME_ABORTED", Syndrome::ABORTED.0.into()),
        ("AIV_SYNDROME_RDMA_BAD_QP", Syndrome::RDMA_BAD_QP.0.into()),
        ("AIV_SYNDROME_RDMA_QP_ERROR", Syndrome::RDMA_QP_ERROR.0.into()),
        ("AIV_SYNDROME_RDMA_CQE", Syndrome::RDMA_CQE.0.into()),
        ("AIV_REQUEST_ROUTE_MASK", REQUEST_ROUTE_MASK.into()),
        ("AIV_REQUEST_ROUTE_SDMA", REQUEST_ROUTE_SDMA.into()),
        ("AIV_REQUEST_ROUTE_RDMA", REQUEST_ROUTE_RDMA.into()),
        ("AIV_REQUEST_QP_SHIFT", REQUEST_QP_SHIFT.into()),
        ("AIV_QP_TABLE_SLOTS", QP_TABLE_SLOTS.into()),
        ("AIV_RDMA_MAX_WQE_BYTES", RDMA_MAX_WQE_BYTES.into()),
        ("AIV_LAUNCH_PER_BATCH", LAUNCH_PER_BATCH.into()),
        ("AIV_LAUNCH_PERSISTENT", LAUNCH_PERSISTENT.into()),
        ("AIV_GROUP_MAX_TRANSFERS", GROUP_MAX_TRANSFERS.into()),
        ("AIV_LAYOUT_VERSION", LAYOUT_VERSION.into()),
        ("AIV_FLAG_SOURCE_SLOTS", FLAG_SOURCE_SLOTS.into()),
        ("AIV_TRACE_STAGE_REQUEST_SEEN", TRACE_STAGE_REQUEST_SEEN.into()),
        ("AIV_TRACE_STAGE_SQES_POSTED", TRACE_STAGE_SQES_POSTED.into()),
        ("AIV_TRACE_STAGE_DOORBELL", TRACE_STAGE_DOORBELL.into()),
        ("AIV_TRACE_STAGE_COMPLETION_OBSERVED", TRACE_STAGE_COMPLETION_OBSERVED.into()),
        ("AIV_TRACE_STAGE_DCQ_PUBLISHED", TRACE_STAGE_DCQ_PUBLISHED.into()),
    ];
    out.extend(constants.iter().map(|&(name, value)| (format!("const.{name}"), value)));
    out.extend(super::roce::roce_facts());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_sqe_encodes_hardware_fields() {
        let sqe = SdmaSqe::copy(0x1234_5678_9abc, 0xdead_0000_beef, 4096, 7, 3);
        let bytes = sqe.as_bytes();
        assert_eq!(u16::from_le_bytes([bytes[0], bytes[1]]) & 0x3F, 11);
        assert_eq!(bytes[14], 240);
        assert_eq!(bytes[48], 255);
        let word16 = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
        assert_eq!(word16 & 0xFF, 0, "opcode copy");
        assert_eq!(word16 >> 9 & 0xF, 0xF, "sssv dssv sns dns");
        assert_eq!(word16 >> 13 & 0xF, 6, "qos");
        assert_eq!(u32::from_le_bytes([bytes[28], bytes[29], bytes[30], bytes[31]]), 4096);
        assert_eq!((sqe.src(), sqe.dst()), (0x1234_5678_9abc, 0xdead_0000_beef));
        assert_eq!(sqe.sqe_type(), SQE_TYPE_SDMA);
    }

    #[test]
    fn unknown_status_and_syndrome_values_decode() {
        assert_eq!(DcqStatus(0).name(), "unknown status 0");
        assert_eq!(DcqStatus(4).name(), "ABORTED");
        assert!(Syndrome(99).describe().contains("99"));
    }
}
