//! Who acts: the writer ids the records name (the Host, the AI CPU, a core's block, nobody one can name) and the
//! calling thread's own id, as its writes through the device address space are attributed.

/// Writer id of a slot nobody wrote since the channel was created (the twin's zeroing of the ring).
pub(crate) const WRITER_UNKNOWN: u32 = 0;
/// Writer id of a Host-side write (a runtime copy, memset or any other Host path into device memory) by a Host
/// thread.
pub(crate) const WRITER_HOST: u32 = 1;
/// Writer id of a slot written last by a device-side agent that is not a core (an SDMA engine's copy), or partly
/// by one writer and partly by another: not attributable.
pub(crate) const WRITER_OTHER: u32 = 2;
/// Writer id of the AI CPU (the NPU's control CPU, running AI-CPU kernels): a write through the device address space
/// by a thread marked as the AI CPU's ([`mark_aicpu_thread`]), or a doorbell it rang. Never a core, never the Host.
pub(crate) const WRITER_AICPU: u32 = 3;
/// Writer id of block `k` is `WRITER_BLOCK0 + k`.
pub(crate) const WRITER_BLOCK0: u32 = 4;
/// The bits of a [`Ringers`] set that mean nobody one can name (the ids [`WRITER_UNKNOWN`] and [`WRITER_OTHER`]).
pub(super) const UNATTRIBUTED_BITS: u64 = 1 << WRITER_UNKNOWN | 1 << WRITER_OTHER;
/// The writer id of block `block`.
pub(crate) fn block_writer(block: u32) -> u32 {
    WRITER_BLOCK0.saturating_add(block)
}

thread_local! {
    /// The writer id of a write this thread makes through the device address space: the Host unless the thread is
    /// a device-side agent (an SDMA engine marks itself [`WRITER_OTHER`]) or the AI CPU's ([`WRITER_AICPU`]).
    static THREAD_WRITER: std::cell::Cell<u32> = const { std::cell::Cell::new(WRITER_HOST) };
}

/// Marks the calling thread as a device-side agent that is not a core (an SDMA engine thread).
pub(crate) fn mark_device_thread() {
    THREAD_WRITER.with(|writer| writer.set(WRITER_OTHER));
}

/// Marks the calling thread as the AI CPU's: its writes through the device address space are the AI CPU's
/// ([`WRITER_AICPU`]), and so are the flags and CQEs its runtime copies read first.
pub(crate) fn mark_aicpu_thread() {
    THREAD_WRITER.with(|writer| writer.set(WRITER_AICPU));
}

/// The writer id of the calling thread's writes through the device address space.
pub(crate) fn thread_writer() -> u32 {
    THREAD_WRITER.with(|writer| writer.get())
}

/// Runs `work` with the calling thread acting as `writer` (a stream's worker running a copy a thread of that kind
/// submitted), then restores the thread's own writer id.
pub(crate) fn acting_as<R>(writer: u32, work: impl FnOnce() -> R) -> R {
    /// Restores the thread's writer id, also when `work` unwinds.
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            THREAD_WRITER.with(|writer| writer.set(self.0));
        }
    }
    let _restore = Restore(THREAD_WRITER.with(|own| own.replace(writer)));
    work()
}
