// The platform layer: everything target-specific the portable transfer kernel needs.
//
// There is one implementation, included before aiv/transfer_kernel.h, for the NPU and the CPU twin alike:
//   platform/npu.h   Ascend AIV (AscendC): GM scalar access through GlobalTensor with dcci cache maintenance, pipe
//                    flags, the doorbell as one 4-byte UB->GM DataCopyPad of the tail to sq_reg_base + 0x8
//                    (docs/hardware.md sections 2-4 and 9), the system cycle counter. The host compiler also builds it
//                    against kernels/cpu/, the strict CPU model of that AscendC subset (docs/ascendc-cpu.md): that
//                    build is what the twin's emulated cores run.
//
// It defines:
//   AIV_GM             pointer qualifier for global (device) memory
//   AIV_UB             pointer qualifier for the core's unified buffer (the state area)
//   AIV_UB_STATE_BYTES bytes of the state area
//   AIV_DEVICE_FN      qualifier of every kernel-side function
//   namespace aiv_platform {
//     uint32_t load_u32(const AIV_GM uint32_t*)            acquire load of a word another agent writes
//     uint64_t load_u64(const AIV_GM uint64_t*)
//     uint32_t load_u32_cached(const AIV_GM uint32_t*)     load with no invalidate: the cached copy if the line is
//                                                          held (the cache probe only, aiv/cache_probe.h)
//     void store_u32(AIV_GM uint32_t*, uint32_t)           release store of a word another agent reads
//     void store_u64(AIV_GM uint64_t*, uint64_t)
//     void read_bytes(void* dst, const AIV_GM void*, n)    bulk read of entries another agent published
//     void write_bytes(AIV_GM void*, const void* src, n)   bulk write made visible by a later store_u32 (both exact
//                                                          for every n and every alignment)
//     void flush_for_device(AIV_GM void*, n)               make scalar writes visible to DMA engines and the Host
//     void stage_sqe(slot, const AivSdmaSqe&, whole)       build an SQE in slot < AIV_SQE_STAGE_SLOTS of the stage
//                                                          (whole false: only the words of task_id, length and the
//                                                          addresses; the slot holds the rest already)
//     void land_sqes(AIV_GM void* dst, count)              copy stage slots [0, count) to the SQ at dst; on return
//                                                          they are in HBM and the stage may be rebuilt
//     void ring_doorbell(context, sq_reg_base, tail,       the doorbell write (docs/hardware.md section 4), and the
//                        AIV_GM uint32_t* record_tail)     tail into the channel record
//     void post_wqe(AIV_GM void* slot, const AivRoceWqe&,   one RoCE SQ slot (WQE + SGE) in HBM on return
//                   const AivRoceSge&)
//     void ring_doorbell_64(reg, uint64_t word)            one 8-byte register write (RoCE SQ and CQ doorbells)
//   AIV_SQE_STAGE_SLOTS                                    SQEs the stage holds
//     AIV_UB uint8_t* state_area()                         the block's state area in UB (scalar access only)
//     uint64_t cycles()                                    a monotonic counter in the unit of wait_budget
//     uint32_t wait_token(context, kind)                   read before checking a condition ...
//     void idle(context, kind, token, spins)               ... and passed here when it did not hold
//   }
#ifndef AIV_PLATFORM_H
#define AIV_PLATFORM_H

// What an idle wait is waiting for.
#define AIV_WAIT_REQUEST 0u     // new request-ring entries, or the Host's resume / stop
#define AIV_WAIT_COMPLETION 1u  // the completion flag written by this block's SDMA channel
#define AIV_WAIT_DCQ_SPACE 2u   // the Host draining the device completion queue

#endif
