//! Checked copies of Host memory: a page that is not mapped makes the copy fail with an error, never a SIGSEGV.
//!
//! Registered memory belongs to the user, who can unmap it while it stays registered (or register a range that was
//! never mapped). A CPU copy (`memcpy`) into such a range kills the process; so every copy the Host code makes into
//! or out of a registered Host range goes through [`copy`], which lets the kernel do the copy and report `EFAULT`:
//!
//! * `process_vm_readv(2)` on this process's own pid, with the destination as the local iovec and the source as the
//!   remote one. Reading one's own address space needs no privilege (the kernel's ptrace access check passes a
//!   caller of the same thread group at once: `__ptrace_may_access` in `kernel/ptrace.c` of torvalds/linux), and the
//!   call reports a partial count, then `EFAULT`, at the first page that is not mapped (`process_vm_readv(2)`,
//!   "RETURN VALUE" and "ERRORS").
//! * When that call is not permitted (`EPERM`, `ENOSYS`: a seccomp profile, a kernel without it), a pipe: `write(2)`
//!   from the source into the pipe, `read(2)` from the pipe into the destination, 64 KiB at a time; both report
//!   `EFAULT` for a page that is not mapped. Each thread keeps one non-blocking pipe, dropped after a failed copy so
//!   the next copy never finds stale bytes in it. The first refusal of `process_vm_readv` switches the process to the
//!   pipe for good; `AIV_HOST_COPY=pipe` in the environment (read once) or [`force_pipe`] selects it from the start,
//!   which is how the tests cover it.
//!
//! [`copy_many`] makes many copies with one `process_vm_readv(2)` (up to [`MAX_COPY_ENTRIES`] ranges a call), which
//! is what small payloads cost: the system call, not the bytes. After a short count it copies the rest one by one, so
//! only an entry that touches an unmapped page fails; under the pipe it copies entry by entry.
//!
//! Overlapping ranges (a copy within one registered buffer) are copied as `memmove` would, through a bounce buffer
//! of at most [`BOUNCE_CHUNK`] bytes, chunk by chunk in the direction that never overwrites a byte before it is read.
//!
//! A raw copy stays only where both sides are provably this process's own live allocations (a socket's receive
//! buffer into a `Vec`, and the like), never where one side is a registered address.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};

/// The bytes one pipe round moves (the default pipe capacity, `pipe(7)`, "Pipe capacity").
const PIPE_CHUNK: usize = 64 * 1024;
/// The largest bounce buffer an overlapping copy uses.
pub const BOUNCE_CHUNK: usize = 1 << 20;

/// Which primitive copies: not decided yet, `process_vm_readv`, or the pipe.
const METHOD_UNKNOWN: u8 = 0;
const METHOD_VM: u8 = 1;
const METHOD_PIPE: u8 = 2;
static METHOD: AtomicU8 = AtomicU8::new(METHOD_UNKNOWN);

/// A checked copy that stopped: a page of one of the ranges is not mapped (or the kernel refused the copy).
#[derive(Debug, thiserror::Error)]
#[error("copy of {length} bytes from {src:#x} to {dst:#x} stopped after {done} bytes: {cause}")]
pub struct HostCopyError {
    /// Destination start.
    pub dst: u64,
    /// Source start.
    pub src: u64,
    /// Bytes asked for.
    pub length: usize,
    /// Bytes copied before the failure (the destination's first `done` bytes hold the source's).
    pub done: usize,
    /// What the kernel said (`EFAULT`: a page of the source or of the destination is not mapped).
    pub cause: io::Error,
}

impl HostCopyError {
    /// Whether the copy failed because a page was not mapped (`EFAULT`).
    pub fn is_unmapped(&self) -> bool {
        self.cause.raw_os_error() == Some(libc::EFAULT)
    }
}

/// Makes every later copy use the pipe (`true`), or lets it try `process_vm_readv` again (`false`). For tests of
/// the fallback; production code never calls it.
pub fn force_pipe(on: bool) {
    METHOD.store(if on { METHOD_PIPE } else { METHOD_VM }, Ordering::SeqCst);
}

/// Whether copies currently go through the pipe.
pub fn uses_pipe() -> bool {
    method() == METHOD_PIPE
}

fn method() -> u8 {
    let current = METHOD.load(Ordering::Relaxed);
    if current != METHOD_UNKNOWN {
        return current;
    }
    let chosen =
        if std::env::var("AIV_HOST_COPY").is_ok_and(|value| value == "pipe") { METHOD_PIPE } else { METHOD_VM };
    // Only the first decision sticks (a concurrent refusal of process_vm_readv may have stored PIPE meanwhile).
    let _ = METHOD.compare_exchange(METHOD_UNKNOWN, chosen, Ordering::SeqCst, Ordering::SeqCst);
    METHOD.load(Ordering::SeqCst)
}

/// Copies `length` bytes from `src` to `dst` (both addresses of this process), as `memmove` would; a page of either
/// range that is not mapped (or not readable/writable as needed) makes it return an error instead of crashing.
/// The first `done` bytes of the destination may have been written when it fails.
///
/// Not a licence to copy anywhere: a mapped range that belongs to something else is overwritten like any memory.
/// The callers copy only into ranges the bounds rule accepted (inside one registered buffer) or into their own
/// buffers.
pub fn copy(dst: u64, src: u64, length: usize) -> Result<(), HostCopyError> {
    if length == 0 || dst == src {
        return Ok(());
    }
    let overlaps = dst < src.saturating_add(length as u64) && src < dst.saturating_add(length as u64);
    if overlaps {
        return copy_overlapping(dst, src, length);
    }
    copy_disjoint(dst, src, length)
}

/// A copy whose ranges overlap: through a bounce buffer, chunk by chunk, forward when the destination is below the
/// source, backward when above, so that no source byte is overwritten before it is read.
fn copy_overlapping(dst: u64, src: u64, length: usize) -> Result<(), HostCopyError> {
    let chunk = length.min(BOUNCE_CHUNK);
    let mut bounce = vec![0u8; chunk];
    let bounce_addr = bounce.as_mut_ptr() as u64;
    let fail = |done: usize, error: HostCopyError| HostCopyError { dst, src, length, done, cause: error.cause };
    let mut offsets: Vec<usize> = (0..length).step_by(chunk).collect();
    if dst > src {
        offsets.reverse();
    }
    // Bytes known copied when going forward; going backward the copied part is at the end, so report 0.
    let mut done_forward = 0;
    for offset in offsets {
        let take = chunk.min(length - offset);
        let done = if dst > src { 0 } else { done_forward };
        copy_disjoint(bounce_addr, src + offset as u64, take).map_err(|error| fail(done, error))?;
        copy_disjoint(dst + offset as u64, bounce_addr, take).map_err(|error| fail(done, error))?;
        done_forward += take;
    }
    Ok(())
}

fn copy_disjoint(dst: u64, src: u64, length: usize) -> Result<(), HostCopyError> {
    if method() == METHOD_VM {
        match copy_vm(dst, src, length) {
            Err(error) if matches!(error.cause.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) && error.done == 0 => {
                // Not permitted here (seccomp, an old kernel): the pipe from now on.
                METHOD.store(METHOD_PIPE, Ordering::SeqCst);
                tracing::debug!(error = %error.cause, "process_vm_readv refused; Host copies go through a pipe");
            }
            other => return other,
        }
    }
    copy_pipe(dst, src, length)
}

/// The copy by `process_vm_readv(2)` on this process: retried after partial counts until done, or until the kernel
/// reports an error (or no progress).
pub fn copy_vm(dst: u64, src: u64, length: usize) -> Result<(), HostCopyError> {
    // SAFETY: getpid(2) has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut done = 0usize;
    while done < length {
        let local = libc::iovec { iov_base: (dst + done as u64) as *mut libc::c_void, iov_len: length - done };
        let remote = libc::iovec { iov_base: (src + done as u64) as *mut libc::c_void, iov_len: length - done };
        // SAFETY: the kernel copies between the two ranges of this process and checks every page itself (EFAULT for
        // one that is not mapped); no Rust reference to either range exists here. The iovecs are live locals.
        let got = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if got < 0 {
            let cause = io::Error::last_os_error();
            if cause.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(HostCopyError { dst, src, length, done, cause });
        }
        if got == 0 {
            return Err(HostCopyError { dst, src, length, done, cause: io::Error::from_raw_os_error(libc::EFAULT) });
        }
        done += got as usize;
    }
    Ok(())
}

/// One range of a [`copy_many`]: (destination, source, length), both addresses of this process.
pub type CopyEntry = (u64, u64, usize);

/// A primitive that copies one range (destination, source, length).
type CopyOne = fn(u64, u64, usize) -> Result<(), HostCopyError>;

/// Copies every entry (each as [`copy`] would), with one `process_vm_readv(2)` per [`MAX_COPY_ENTRIES`] entries
/// instead of one per entry, and returns each entry's outcome in order. An entry whose page is not mapped fails
/// alone: the others are copied all the same.
///
/// The kernel processes the iovecs in order and reports a short count at the first page it cannot copy
/// (`process_vm_readv(2)`, "DESCRIPTION" and "RETURN VALUE"), so after a short count the entries wholly inside the
/// count have landed, and the entry the count stops in and every later one are copied again one by one through
/// [`copy`], which names exactly the entries that fail. Overlapping entries, and every entry under the pipe
/// fallback, go through [`copy`] one by one.
pub fn copy_many(entries: &[CopyEntry]) -> Vec<Result<(), HostCopyError>> {
    copy_entries(entries, method() == METHOD_VM, copy)
}

/// [`copy_many`] with the primitive chosen by the caller: `vectored` tries one `process_vm_readv(2)` per group of
/// entries, and `one` copies a single entry (the fallback after a short count, and every entry when not vectored).
fn copy_entries(entries: &[CopyEntry], vectored: bool, one: CopyOne) -> Vec<Result<(), HostCopyError>> {
    let mut outcomes = Vec::with_capacity(entries.len());
    for group in entries.chunks(MAX_COPY_ENTRIES) {
        copy_group(group, vectored, one, &mut outcomes);
    }
    outcomes
}

/// The most entries one `process_vm_readv(2)` of [`copy_many`] carries (the kernel's limit on iovecs per side,
/// `IOV_MAX`, is 1024: `process_vm_readv(2)`, "ERRORS", `EINVAL`).
pub const MAX_COPY_ENTRIES: usize = 1024;

fn copy_group(group: &[CopyEntry], vectored: bool, one: CopyOne, outcomes: &mut Vec<Result<(), HostCopyError>>) {
    // Entries that need nothing special: empty, or ranges that do not overlap (an overlapping copy needs copy()).
    let simple = |&(dst, src, length): &CopyEntry| {
        length == 0 || !(dst < src.saturating_add(length as u64) && src < dst.saturating_add(length as u64))
    };
    if group.len() < 2 || !vectored || !group.iter().all(simple) {
        outcomes.extend(group.iter().map(|&(dst, src, length)| one(dst, src, length)));
        return;
    }
    let local: Vec<libc::iovec> = group
        .iter()
        .map(|&(dst, _, length)| libc::iovec { iov_base: dst as *mut libc::c_void, iov_len: length })
        .collect();
    let remote: Vec<libc::iovec> = group
        .iter()
        .map(|&(_, src, length)| libc::iovec { iov_base: src as *mut libc::c_void, iov_len: length })
        .collect();
    // SAFETY: getpid(2) has no preconditions.
    let pid = unsafe { libc::getpid() };
    let got = loop {
        // SAFETY: the kernel copies between ranges of this process and checks every page itself (EFAULT for one that
        // is not mapped); no Rust reference to any range exists here. Both iovec arrays are live, with `group.len()`
        // (at most MAX_COPY_ENTRIES) elements each.
        let got = unsafe {
            libc::process_vm_readv(pid, local.as_ptr(), local.len() as _, remote.as_ptr(), remote.len() as _, 0)
        };
        if got < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break got;
    };
    // Entries wholly inside the count landed; the rest (from the entry the count stopped in) are copied again one by
    // one, which also handles a refusal (EPERM, ENOSYS: the switch to the pipe) and names the entries that fail.
    let mut landed = got.max(0) as usize;
    let mut index = 0;
    while index < group.len() && group[index].2 <= landed {
        landed -= group[index].2;
        outcomes.push(Ok(()));
        index += 1;
    }
    outcomes.extend(group[index..].iter().map(|&(dst, src, length)| one(dst, src, length)));
}

thread_local! {
    /// This thread's pipe for [`copy_pipe`]: (read end, write end).
    static PIPE: RefCell<Option<(OwnedFd, OwnedFd)>> = const { RefCell::new(None) };
}

fn new_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the live array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two new descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The copy through this thread's pipe: `write(2)` from the source, `read(2)` into the destination, a chunk at a
/// time. The pipe is dropped after any failure (it may hold bytes of the failed chunk).
pub fn copy_pipe(dst: u64, src: u64, length: usize) -> Result<(), HostCopyError> {
    PIPE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let (read_end, write_end) = match slot.take() {
            Some(pipe) => pipe,
            None => new_pipe().map_err(|cause| HostCopyError { dst, src, length, done: 0, cause })?,
        };
        let result = pipe_rounds(read_end.as_raw_fd(), write_end.as_raw_fd(), dst, src, length);
        if result.is_ok() {
            *slot = Some((read_end, write_end));
        }
        result
    })
}

fn pipe_rounds(
    read_fd: libc::c_int,
    write_fd: libc::c_int,
    dst: u64,
    src: u64,
    length: usize,
) -> Result<(), HostCopyError> {
    let fail = |done: usize, cause: io::Error| HostCopyError { dst, src, length, done, cause };
    let mut done = 0usize;
    while done < length {
        let want = (length - done).min(PIPE_CHUNK);
        // SAFETY: write(2) reads at most `want` bytes of the source range, and reports EFAULT (or a short count) for a
        // page that is not mapped; no Rust reference to the range exists.
        let wrote = unsafe { libc::write(write_fd, (src + done as u64) as *const libc::c_void, want) };
        if wrote < 0 {
            let cause = io::Error::last_os_error();
            if cause.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(fail(done, cause));
        }
        if wrote == 0 {
            return Err(fail(done, io::Error::new(io::ErrorKind::WriteZero, "the pipe took no bytes")));
        }
        let mut moved = 0usize;
        while moved < wrote as usize {
            // SAFETY: read(2) writes at most the bytes the pipe holds into the destination range, and reports EFAULT
            // for a page that is not mapped.
            let got = unsafe {
                libc::read(read_fd, (dst + (done + moved) as u64) as *mut libc::c_void, wrote as usize - moved)
            };
            if got < 0 {
                let cause = io::Error::last_os_error();
                if cause.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(fail(done + moved, cause));
            }
            if got == 0 {
                return Err(fail(done + moved, io::Error::new(io::ErrorKind::UnexpectedEof, "the pipe closed")));
            }
            moved += got as usize;
        }
        done += moved;
    }
    Ok(())
}

/// Pages [`first_unmapped_chunk`] asks `mincore(2)` about per call (64 MiB of 4 KiB pages; a byte each).
const PROBE_PAGES: usize = 16 * 1024;

/// This process's page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no memory preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

/// Whether every page of `[addr, addr + length)` is mapped in this process: `Ok(())`, or the first chunk (start,
/// length) that holds a page that is not. Asks `mincore(2)`, which fails with `ENOMEM` for a range holding an unmapped
/// page (`mincore(2)`, "ERRORS"), a chunk of [`PROBE_PAGES`] pages at a time. A moment's answer: memory can be
/// unmapped right after, which is why the copies are checked too.
pub fn first_unmapped_chunk(addr: u64, length: u64) -> Result<(), (u64, u64)> {
    if length == 0 {
        return Ok(());
    }
    let page = page_size();
    let start = addr - addr % page;
    let Some(end) = addr.checked_add(length) else { return Err((addr, length)) };
    let chunk_bytes = PROBE_PAGES as u64 * page;
    let mut vector = vec![0u8; PROBE_PAGES];
    let mut at = start;
    while at < end {
        let take = (end - at).min(chunk_bytes);
        // SAFETY: mincore(2) only reads the page tables of the range and writes one byte per page (at most
        // PROBE_PAGES) into `vector`.
        let result = unsafe { libc::mincore(at as *mut libc::c_void, take as usize, vector.as_mut_ptr()) };
        if result != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EAGAIN) {
                continue;
            }
            return Err((at, take));
        }
        at += take;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapping of `pages` pages whose page `hole` is unmapped again.
    struct Holed {
        base: u64,
        pages: usize,
    }

    const PAGE: usize = 4096;

    impl Holed {
        /// `pages` pages whose page `hole` allows no access: copies through it fault. The hole is made inaccessible
        /// rather than unmapped, because another test thread could map an unmapped page again before the copy runs.
        fn new(pages: usize, hole: usize) -> Holed {
            Holed::with_hole(pages, hole, |page| {
                // SAFETY: one page inside the test's own mapping.
                unsafe { libc::mprotect(page, PAGE, libc::PROT_NONE) }
            })
        }

        /// `pages` pages whose page `hole` is unmapped, for the `mincore` probe (which sees mappings, not access).
        fn unmapped(pages: usize, hole: usize) -> Holed {
            Holed::with_hole(pages, hole, |page| {
                // SAFETY: one page inside the test's own mapping.
                unsafe { libc::munmap(page, PAGE) }
            })
        }

        fn with_hole(pages: usize, hole: usize, punch: impl FnOnce(*mut libc::c_void) -> i32) -> Holed {
            // SAFETY: a fresh anonymous mapping; the kernel picks the address.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    pages * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED, "mmap");
            // SAFETY: one page inside the mapping just made.
            assert_eq!(punch(unsafe { base.cast::<u8>().add(hole * PAGE).cast() }), 0, "punching the hole");
            Holed { base: base as u64, pages }
        }
    }

    impl Drop for Holed {
        fn drop(&mut self) {
            // SAFETY: our own mapping (the hole included: munmap of an unmapped page is a no-op).
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.pages * PAGE) };
        }
    }

    fn both(check: impl Fn(&dyn Fn(u64, u64, usize) -> Result<(), HostCopyError>)) {
        check(&copy_vm);
        check(&copy_pipe);
    }

    #[test]
    fn copies_like_memcpy_at_every_size() {
        both(|copy| {
            for length in [1usize, 16, 4095, 4096, 65_536, 65_537, 300_000] {
                let source: Vec<u8> = (0..length).map(|i| (i % 251) as u8).collect();
                let mut target = vec![0u8; length];
                copy(target.as_mut_ptr() as u64, source.as_ptr() as u64, length).expect("mapped");
                assert_eq!(target, source, "{length} bytes");
            }
        });
    }

    #[test]
    fn an_unmapped_page_on_either_side_is_an_error() {
        both(|copy| {
            let holed = Holed::new(3, 1);
            let hole = holed.base + PAGE as u64;
            let mine = vec![7u8; 3 * PAGE];
            for length in [16usize, 4096, 3 * PAGE] {
                // Source, then destination, entirely in the hole (or running into it from the mapped page before).
                for start in [hole, hole - 8] {
                    let length = length.min((holed.base + 3 * PAGE as u64 - start) as usize);
                    let read = copy(mine.as_ptr() as u64, start, length).expect_err("source unmapped");
                    assert!(read.is_unmapped(), "{read}");
                    let write = copy(start, mine.as_ptr() as u64, length).expect_err("destination unmapped");
                    assert!(write.is_unmapped(), "{write}");
                    assert!(write.done <= 8, "stopped at the hole: {write}");
                }
            }
            // The thread's pipe (if any) is clean after a failure: the next copy is exact.
            let source = vec![9u8; 100];
            let mut target = vec![0u8; 100];
            copy(target.as_mut_ptr() as u64, source.as_ptr() as u64, 100).expect("mapped");
            assert_eq!(target, source);
        });
    }

    /// Many entries with one whose destination (or source) is in the hole: exactly that entry fails, every other
    /// lands; through one vectored call with the per-entry fallback, and through the pipe entry by entry. More entries
    /// than one call takes, so the grouping is covered too.
    #[test]
    fn copy_many_fails_only_the_entry_that_touches_an_unmapped_page() {
        let primitives: [(bool, CopyOne); 2] = [(true, copy_vm), (false, copy_pipe)];
        for (vectored, one) in primitives {
            let holed = Holed::new(3, 1);
            let hole = holed.base + PAGE as u64;
            let count = MAX_COPY_ENTRIES + 300;
            let size = 100usize;
            for bad in [0usize, 7, MAX_COPY_ENTRIES - 1, MAX_COPY_ENTRIES, count - 1] {
                for bad_source in [false, true] {
                    let source: Vec<u8> = (0..count * size).map(|i| (i % 251) as u8).collect();
                    let mut target = vec![0u8; count * size];
                    let entries: Vec<CopyEntry> = (0..count)
                        .map(|i| {
                            let dst = target.as_mut_ptr() as u64 + (i * size) as u64;
                            let src = source.as_ptr() as u64 + (i * size) as u64;
                            match (i == bad, bad_source) {
                                (false, _) => (dst, src, size),
                                // Running from the mapped page before into the hole.
                                (true, false) => (hole - 8, src, size),
                                (true, true) => (dst, hole - 8, size),
                            }
                        })
                        .collect();
                    let outcomes = copy_entries(&entries, vectored, one);
                    assert_eq!(outcomes.len(), count);
                    for (i, outcome) in outcomes.iter().enumerate() {
                        let part = i * size..(i + 1) * size;
                        if i == bad {
                            let error = outcome.as_ref().expect_err("the entry in the hole fails");
                            assert!(error.is_unmapped(), "{error}");
                            assert_eq!(error.length, size);
                        } else {
                            assert!(outcome.is_ok(), "entry {i} (bad {bad}, vectored {vectored}): {outcome:?}");
                            assert!(target[part.clone()] == source[part], "entry {i} landed");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn copy_many_copies_every_entry_and_overlapping_ones_like_memmove() {
        let source: Vec<u8> = (0..10_000u32).map(|i| (i % 249) as u8).collect();
        let mut target = vec![0u8; 10_000];
        let sizes = [1usize, 0, 4096, 17, 3000, 2886];
        let mut entries = Vec::new();
        let mut at = 0usize;
        for size in sizes {
            entries.push((target.as_mut_ptr() as u64 + at as u64, source.as_ptr() as u64 + at as u64, size));
            at += size;
        }
        assert!(copy_many(&entries).iter().all(Result::is_ok));
        assert!(target == source);
        // An overlapping entry among others: copied as memmove would.
        let mut ours = source.clone();
        let mut expected = source.clone();
        expected.copy_within(0..100, 1);
        expected.copy_within(5000..5100, 6000);
        let base = ours.as_mut_ptr() as u64;
        let outcomes = copy_many(&[(base + 1, base, 100), (base + 6000, base + 5000, 100)]);
        assert!(outcomes.iter().all(Result::is_ok));
        assert!(ours == expected);
    }

    #[test]
    fn overlapping_ranges_copy_like_memmove() {
        let original: Vec<u8> = (0..3 * BOUNCE_CHUNK as u32).map(|i| (i % 253) as u8).collect();
        for (from, to, length) in
            [(0usize, 1usize, 100usize), (1, 0, 100), (0, 10, 2 * BOUNCE_CHUNK + 5), (10, 0, 2 * BOUNCE_CHUNK + 5)]
        {
            let mut ours = original.clone();
            let mut expected = original.clone();
            expected.copy_within(from..from + length, to);
            let base = ours.as_mut_ptr() as u64;
            copy(base + to as u64, base + from as u64, length).expect("mapped");
            assert!(ours == expected, "{from} -> {to}, {length} bytes");
        }
    }

    #[test]
    fn the_probe_finds_an_unmapped_page() {
        let holed = Holed::unmapped(3, 1);
        assert!(first_unmapped_chunk(holed.base, PAGE as u64).is_ok());
        assert!(first_unmapped_chunk(holed.base + 2 * PAGE as u64 + 5, 100).is_ok());
        assert!(first_unmapped_chunk(holed.base, 3 * PAGE as u64).is_err());
        assert!(first_unmapped_chunk(holed.base + PAGE as u64 + 100, 1).is_err());
        assert!(first_unmapped_chunk(0x1000, 4096).is_err(), "the page at 0x1000 is never mapped");
        let big = vec![0u8; 70 << 20];
        assert!(first_unmapped_chunk(big.as_ptr() as u64, big.len() as u64).is_ok());
    }

    /// The cost of a checked copy against a CPU copy, 16 B to 32 KiB (the sizes the tcp receive buffer copies): per
    /// size and primitive, the median of 15 rounds' mean time per copy, with the rounds' smallest and largest. A
    /// measurement, not a check: `cargo test --lib host_copy::tests::cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn cost() {
        let source = vec![3u8; 32 * 1024];
        let mut target = vec![0u8; 32 * 1024];
        let (dst, src) = (target.as_mut_ptr() as u64, source.as_ptr() as u64);
        type Copier = fn(u64, u64, usize) -> Result<(), HostCopyError>;
        let raw: Copier = |dst, src, length| {
            // SAFETY: both are this test's own buffers of 32 KiB.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, length) };
            Ok(())
        };
        let primitives: [(&str, Copier); 3] = [("memcpy", raw), ("process_vm_readv", copy_vm), ("pipe", copy_pipe)];
        for length in [16usize, 256, 4096, 32 * 1024] {
            for (name, copier) in primitives {
                let iterations = 2000;
                let mut rounds: Vec<f64> = (0..15)
                    .map(|_| {
                        let started = std::time::Instant::now();
                        for _ in 0..iterations {
                            copier(dst, src, length).expect("copy");
                            std::hint::black_box(&target);
                        }
                        started.elapsed().as_nanos() as f64 / iterations as f64
                    })
                    .collect();
                rounds.sort_by(f64::total_cmp);
                println!(
                    "{length:>6} B {name:>16}: median {:>8.0} ns (rounds {:.0}..{:.0})",
                    rounds[rounds.len() / 2],
                    rounds[0],
                    rounds[rounds.len() - 1]
                );
            }
        }
    }

    /// The cost of the registration probe over 1 GiB (mapped, untouched, and touched). A measurement, not a check:
    /// `cargo test --lib host_copy::tests::probe_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn probe_cost() {
        let length = 1usize << 30;
        // SAFETY: a fresh anonymous mapping, reserved without swap; unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap");
        let time = |what: &str| {
            let mut rounds: Vec<std::time::Duration> = (0..7)
                .map(|_| {
                    let started = std::time::Instant::now();
                    first_unmapped_chunk(base as u64, length as u64).expect("mapped");
                    started.elapsed()
                })
                .collect();
            rounds.sort();
            println!("probe of 1 GiB, {what}: median {:?} (rounds {:?}..{:?})", rounds[3], rounds[0], rounds[6]);
        };
        time("untouched");
        // SAFETY: inside the mapping just made.
        unsafe { std::ptr::write_bytes(base.cast::<u8>(), 1, 256 << 20) };
        time("first 256 MiB touched");
        // SAFETY: our own mapping.
        unsafe { libc::munmap(base, length) };
    }
}
