//! Admission of connections served as tokio tasks: a cap on the connections held at once, and eviction of the one
//! that costs a newcomer least to lose when the cap (or the process's descriptor limit) is reached.
//!
//! Owns: [`Admission`], the table of held connections, and [`Slot`], the phase each connection's task reports (fresh,
//! idle between requests, reading a request body, answering). It must not read or write a connection itself.
//!
//! Eviction, as the tcp data server and the handshake server do it: only a connection that is not answering is a
//! candidate, and never one whose next bytes have already arrived (checked by peeking at its socket without reading);
//! among the rest, one that never completed a request goes first, then one idle between requests, then one stalled
//! inside a request body, each oldest first. A legitimate client sends its request as it connects and keeps it
//! moving, so it is not the one evicted; a flood of idle or stalled connections evicts itself. An evicted connection's
//! task is aborted (its socket closes and whatever it holds is dropped as the task ends); with no candidate the new
//! connection is refused.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::AbortHandle;

/// Candidates an eviction considers before giving up (each one skipped has input waiting).
const VICTIM_TRIES: usize = 8;

/// Accepted, no request yet.
pub const FRESH: u8 = 0;
/// Between requests (keep-alive).
pub const IDLE: u8 = 1;
/// Reading a request body.
pub const BODY: u8 = 2;
/// Answering a request: never evicted.
pub const ANSWERING: u8 = 3;
/// Evicted: its task is being aborted.
pub const EVICTED: u8 = 4;

/// What a connection's task reports about itself: its phase and since when it has been waiting (accepted, or its
/// last reply). Phase changes out of an evictable phase race an eviction by one compare-and-swap, so a request is
/// either answered or its connection evicted, never both.
#[derive(Debug)]
pub struct Slot {
    phase: AtomicU8,
    /// Nanoseconds from the admission's epoch to the moment this connection started waiting for its next request.
    waiting_since: AtomicU64,
    epoch: Instant,
}

impl Slot {
    fn new(epoch: Instant) -> Self {
        let slot = Slot { phase: AtomicU8::new(FRESH), waiting_since: AtomicU64::new(0), epoch };
        slot.waiting_since.store(slot.nanos_now(), Ordering::Release);
        slot
    }

    fn nanos_now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The phase now.
    pub fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    /// Moves from `from` to `to`; false if the connection is not in `from` (evicted meanwhile).
    pub fn advance(&self, from: u8, to: u8) -> bool {
        self.phase.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// A request has arrived: moves from fresh or idle to `to`; false if the connection was evicted.
    pub fn begin(&self, to: u8) -> bool {
        self.advance(FRESH, to) || self.advance(IDLE, to)
    }

    /// The request is answered: the connection waits for its next one from now on.
    pub fn rest(&self) {
        self.waiting_since.store(self.nanos_now(), Ordering::Release);
        let _ = self.advance(ANSWERING, IDLE) || self.advance(BODY, IDLE);
    }

    /// When the request being read must be complete: `timeout` after the connection started waiting for it.
    pub fn deadline(&self, timeout: Duration) -> Instant {
        self.epoch + Duration::from_nanos(self.waiting_since.load(Ordering::Acquire)) + timeout
    }

    fn waiting_since(&self) -> u64 {
        self.waiting_since.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
struct Entry {
    slot: Arc<Slot>,
    abort: Option<AbortHandle>,
    /// The connection's descriptor, to look (without reading) whether input has arrived. The entry leaves the table
    /// before the socket closes ([`AdmittedStream`] drops its guard first), so it never names another socket; no
    /// duplicate is kept, so a connection costs one descriptor.
    fd: RawFd,
}

/// The connections held, by id, and what admission has done.
#[derive(Debug)]
pub struct Admission {
    max_connections: usize,
    table: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
    epoch: Instant,
    evicted: AtomicU64,
    refused: AtomicU64,
}

impl Admission {
    /// At most `max_connections` (at least 1) held at once.
    pub fn new(max_connections: usize) -> Self {
        Admission {
            max_connections: max_connections.max(1),
            table: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            epoch: Instant::now(),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.lock().len()
    }

    /// Connections evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// New connections refused so far (at the cap with no candidate to evict).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Admits `stream`, evicting one connection if the cap requires: the stream wrapped so that it leaves the table
    /// as it closes, its id and its slot; or the stream back if refused (counted; the caller drops it).
    pub fn admit(self: &Arc<Self>, stream: TcpStream) -> Result<(AdmittedStream, u64, Arc<Slot>), TcpStream> {
        let (id, slot, evicted) = {
            let mut table = self.lock();
            let mut evicted = None;
            if table.len() >= self.max_connections {
                evicted = victim(&table, &[FRESH, IDLE, BODY]).and_then(|id| table.remove(&id));
                if evicted.is_none() {
                    drop(table);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return Err(stream);
                }
            }
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            let slot = Arc::new(Slot::new(self.epoch));
            table.insert(id, Entry { slot: slot.clone(), abort: None, fd: stream.as_raw_fd() });
            (id, slot, evicted)
        };
        if let Some(entry) = evicted {
            self.finish_eviction(entry);
        }
        let admitted = Admitted { admission: self.clone(), id };
        Ok((AdmittedStream { _admitted: admitted, stream }, id, slot))
    }

    /// Evicts one connection in one of `phases` (in that order of preference), to give back what it holds (a
    /// descriptor, buffered bytes); false if there was none to evict.
    pub fn evict_one(&self, phases: &[u8]) -> bool {
        let evicted = {
            let mut table = self.lock();
            victim(&table, phases).and_then(|id| table.remove(&id))
        };
        match evicted {
            Some(entry) => {
                self.finish_eviction(entry);
                true
            }
            None => false,
        }
    }

    fn finish_eviction(&self, entry: Entry) {
        self.evicted.fetch_add(1, Ordering::Relaxed);
        if let Some(abort) = entry.abort {
            abort.abort();
        }
    }

    /// Registers the task serving connection `id`, so an eviction can abort it; aborts it at once if the
    /// connection was evicted before this.
    pub fn started(&self, id: u64, abort: AbortHandle) {
        match self.lock().get_mut(&id) {
            Some(entry) => entry.abort = Some(abort),
            None => abort.abort(),
        }
    }

    /// Forgets connection `id` (its stream is closing).
    fn finished(&self, id: u64) {
        self.lock().remove(&id);
    }
}

/// The connection to evict: in the first of `phases` that has one, the one waiting longest, skipping any whose
/// input has arrived; marked evicted before it is returned.
fn victim(table: &HashMap<u64, Entry>, phases: &[u8]) -> Option<u64> {
    let mut skipped: Vec<u64> = Vec::new();
    for _ in 0..VICTIM_TRIES {
        let (id, entry) = table
            .iter()
            .filter_map(|(id, entry)| {
                let rank = phases.iter().position(|phase| *phase == entry.slot.phase())?;
                (!skipped.contains(id)).then_some((rank, entry.slot.waiting_since(), *id, entry))
            })
            .min_by_key(|(rank, since, id, _)| (*rank, *since, *id))
            .map(|(_, _, id, entry)| (id, entry))?;
        let phase = entry.slot.phase();
        if !has_pending_input(entry.fd) && entry.slot.advance(phase, EVICTED) {
            return Some(id);
        }
        skipped.push(id);
    }
    None
}

/// Whether bytes are waiting to be read on `fd` (checked without blocking or consuming them).
fn has_pending_input(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) with MSG_PEEK writes at most one byte into `byte`.
    unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) > 0 }
}

/// Removes its connection from the admission table when dropped.
#[derive(Debug)]
struct Admitted {
    admission: Arc<Admission>,
    id: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.finished(self.id);
    }
}

/// An admitted connection's stream: reads and writes go to the socket; when dropped (its task ended or was
/// aborted) the connection leaves the admission table before its socket closes.
#[derive(Debug)]
pub struct AdmittedStream {
    // Field order is drop order: the table entry goes before the socket.
    _admitted: Admitted,
    stream: TcpStream,
}

impl AsyncRead for AdmittedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for AdmittedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A client's end of a connection, and what admitting the server's end gave.
    type Held = (std::net::TcpStream, Result<(AdmittedStream, u64, Arc<Slot>), &'static str>);

    /// A loopback connection: the client's end (std) and the server's end (tokio, registered on `runtime`).
    fn connection(runtime: &tokio::runtime::Runtime) -> (std::net::TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = std::net::TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("non-blocking");
        let _entered = runtime.enter();
        (client, TcpStream::from_std(server).expect("tokio stream"))
    }

    #[test]
    fn the_cap_evicts_fresh_then_idle_then_body_oldest_first_never_one_answering_or_with_input() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let admission = Arc::new(Admission::new(4));
        let admit = || -> Held {
            let (client, server) = connection(&runtime);
            std::thread::sleep(Duration::from_millis(2));
            let admitted = admission.admit(server).map_err(|_| "refused");
            (client, admitted)
        };
        let mut held: Vec<_> = (0..4).map(|_| admit()).collect();
        let slot = |held: &[Held], n: usize| held[n].1.as_ref().expect("admitted").2.clone();
        // Four fresh connections a, b, c, d; a fifth evicts the oldest, a.
        held.push(admit());
        assert_eq!((admission.evicted(), slot(&held, 0).phase()), (1, EVICTED));
        // b answers, c reads a body, d is idle; e (fresh) has its request waiting: f evicts d.
        assert!(slot(&held, 1).begin(ANSWERING));
        assert!(slot(&held, 2).begin(ANSWERING) && slot(&held, 2).advance(ANSWERING, BODY));
        assert!(slot(&held, 3).begin(ANSWERING));
        slot(&held, 3).rest();
        let send = |held: &mut [Held], n: usize| {
            held[n].0.write_all(b"G").expect("send");
            std::thread::sleep(Duration::from_millis(10));
        };
        send(&mut held, 4);
        held.push(admit());
        assert_eq!((admission.evicted(), slot(&held, 3).phase(), slot(&held, 4).phase()), (2, EVICTED, FRESH));
        // With f's request waiting too, g evicts c, stalled in its body.
        send(&mut held, 5);
        held.push(admit());
        assert_eq!((admission.evicted(), slot(&held, 2).phase()), (3, EVICTED));
        // With g's waiting as well, only b is left, and it is answering: h is refused.
        send(&mut held, 6);
        let (_client, refused) = admit();
        assert!(refused.is_err());
        assert_eq!((admission.evicted(), admission.refused(), admission.held()), (3, 1, 4));
        assert_eq!(slot(&held, 1).phase(), ANSWERING);
        // A stream dropped (g's) leaves the table; an evicted one dropped (c's) changes nothing.
        held.truncate(6);
        drop(held.remove(2));
        assert_eq!(admission.held(), 3);
    }
}
