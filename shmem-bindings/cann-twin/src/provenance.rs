//! Provenance records of the SDMA channels: who wrote each SQE an engine consumes, who rang each doorbell, and who
//! first read each completion flag an engine landed. The doers: an emulated core (by block), the Host, the AI CPU
//! (threads marked as its own, [`mark_aicpu_thread`]), or nobody one can name. Every record is made where the act
//! happens:
//!
//! - a write into a registered SQ marks the slots it covers in the channel's shadow array of writer ids, from the
//!   code that performs the write (an emulated core's DMA completion and cache-line write-back, through the
//!   `gm_written` op of `kernels/cpu/aiv_cpu_core.h`; every write of a Host or AI-CPU thread translated by the device
//!   address space for writing, from [`crate::memory`]); turning the records on (from off) and a channel's reset
//!   forget the writers, since writes made meanwhile were not marked;
//! - the engine reads the slot's writer when it reads the SQE, and tallies it when the SQE has executed;
//! - an accepted doorbell write tallies its origin (the ringing core's block, the Host's test-only path, the AI CPU's
//!   register path) and joins the doorbell's set of ringers, which the engine takes with the tail ([`RingerTake`]);
//! - the engine's 8-byte flag copy publishes the flag (address and value) before it stores it; the first read that
//!   covers the word and returns that value claims it (a core's line fill or GM -> UB DMA through the `gm_read`
//!   op, or a runtime copy to Host memory by a Host or AI-CPU thread).
//!
//! The hot path: a write or read checks one atomic counter (nothing watched or nothing pending: done), then the
//! calling thread's cached copy of the watch list (refreshed only when `WATCH_GENERATION` (module `watch`) moved), a range test
//! per watched SQ, and for a hit one relaxed store per covered slot. No lock is taken there; the engine takes none
//! either per SQE for these records (blocks numbered 64 or more are tallied under a mutex of their own, which the
//! engine takes only for SQEs such a block wrote).
//!
//! Files: `writer` the writer ids and the calling thread's; `records` the types the records name and report;
//! `channel` a channel's own records ([`ChannelProvenance`]: slot writers, tallies, the consumption log); `qp` a twin
//! NIC QP's; `watch` the process-wide switch, the watch list and the hooks of the memory model.

mod channel;
pub(crate) mod qp;
mod records;
#[cfg(test)]
mod tests;
mod watch;
mod writer;

pub use channel::LOG_CAPACITY;
pub(crate) use channel::{ChannelProvenance, SLOT_BYTES};
pub(crate) use writer::{
    acting_as, block_writer, mark_aicpu_thread, mark_device_thread, thread_writer, WRITER_AICPU, WRITER_BLOCK0,
    WRITER_HOST, WRITER_OTHER, WRITER_UNKNOWN,
};

pub(crate) use records::RingerTake;
pub use records::{Doer, FlagReader, LoggedSqe, Provenance, Ringers};
pub(crate) use watch::{
    core_read, read, recording, recording_epoch, set_recording, thread_wrote, unwatch_channels, watch_channels, wrote,
    RECORDING_BYTE,
};
