//! The byte layouts the engines read and write: the 64-byte SDMA SQE (`stars_sdma_sqe_t`) and the 64-byte channel
//! record (`stars_channel_info_t`), little-endian, with their decoders and encoders; a unit test pins every offset.

use super::{
    CHANNEL_RECORD_BYTES, SQE_BYTES, SQE_COPY_OPCODE_WORD, SQE_KERNEL_CREDIT_SDMA, SQE_LINK_TYPE_ONCHIP, SQE_TYPE_MASK,
    SQE_TYPE_SDMA,
};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdma::{CHANNEL_RECORDS_OFFSET, MAX_CHANNELS};
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
