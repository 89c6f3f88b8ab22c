//! Hostile clients shared by the flood tests (included with `#[path]`, not a test target of its own): idle TCP
//! connections from chosen loopback source addresses that reconnect as the server closes them, and a forked process
//! (optionally running as `nobody`) that floods an abstract Unix socket.
#![allow(dead_code)]

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Raises this process's soft descriptor limit to its hard limit; returns the soft limit now in force.
pub fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write one live rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
    let soft = limit.rlim_cur as u64;
    soft
}

/// The `n`-th loopback source address: 127.0.0.1, 127.0.0.2, ... (all of 127/8 reaches `lo` on Linux).
pub fn loopback_source(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n + 1)
}

/// A TCP connection to `target` from `source` (bound before connecting).
pub fn connect_from(source: Ipv4Addr, target: SocketAddr) -> io::Result<TcpStream> {
    connect_from_with_receive_buffer(source, target, None)
}

/// [`connect_from`], with the socket's receive buffer set to `receive_buffer` bytes before connecting (the window
/// the peer may fill is then that small).
pub fn connect_from_with_receive_buffer(
    source: Ipv4Addr,
    target: SocketAddr,
    receive_buffer: Option<libc::c_int>,
) -> io::Result<TcpStream> {
    let SocketAddr::V4(target) = target else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "IPv4 targets only"));
    };
    let address = |address: SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: address.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*address.ip()).to_be() },
        sin_zero: [0; 8],
    };
    let local = address(SocketAddrV4::new(source, 0));
    let remote = address(target);
    let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket(2) has no memory preconditions; the result is checked and then owned by the TcpStream.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    if let Some(bytes) = receive_buffer {
        // SAFETY: a live int option value of the right size, on a live socket.
        let set = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: bind/connect read one live sockaddr_in of `length` bytes.
    unsafe {
        if libc::bind(fd, std::ptr::addr_of!(local).cast(), length) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::connect(fd, std::ptr::addr_of!(remote).cast(), length) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(stream)
}

/// Whether the server closed `stream` (EOF or an error pending), checked without blocking.
fn closed_by_server(fd: i32) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) with MSG_PEEK writes at most one byte into `byte`.
    let got = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    got == 0 || (got < 0 && io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock)
}

/// Idle connections that never send a byte, `per_source` from each source address, each replaced as soon as the
/// server closes it. Stops (closing everything) on drop.
pub struct TcpFlood {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Connections open now.
    pub open: Arc<AtomicUsize>,
    /// Connections the server closed (evicted, refused or expired) and the flood replaced.
    pub closed_by_server: Arc<AtomicU64>,
}

impl TcpFlood {
    pub fn start(target: SocketAddr, sources: &[Ipv4Addr], per_source: usize) -> TcpFlood {
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicU64::new(0));
        let threads = sources
            .iter()
            .map(|&source| {
                let (stop, open, closed) = (stop.clone(), open.clone(), closed.clone());
                std::thread::spawn(move || {
                    let mut held: Vec<TcpStream> = Vec::with_capacity(per_source);
                    while !stop.load(Ordering::Relaxed) {
                        while held.len() < per_source && !stop.load(Ordering::Relaxed) {
                            match connect_from(source, target) {
                                Ok(stream) => {
                                    held.push(stream);
                                    open.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(_) => {
                                    std::thread::sleep(Duration::from_millis(5));
                                    break;
                                }
                            }
                        }
                        let before = held.len();
                        held.retain(|stream| !closed_by_server(stream.as_raw_fd()));
                        let gone = before - held.len();
                        open.fetch_sub(gone, Ordering::Relaxed);
                        closed.fetch_add(gone as u64, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    open.fetch_sub(held.len(), Ordering::Relaxed);
                })
            })
            .collect();
        TcpFlood { stop, threads, open, closed_by_server: closed }
    }

    /// Waits (bounded) until the flood has held `count` connections open at once, or has had that many closed.
    pub fn wait_for(&self, count: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.open.load(Ordering::Relaxed) < count
            && (self.closed_by_server.load(Ordering::Relaxed) as usize) < count
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TcpFlood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What each connection of a [`SlowRequests`] flood asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slowly {
    /// A v2 WRITE whose payload then comes one byte per interval.
    Write,
    /// A v2 READ whose reply is then read a few bytes per interval, through a tiny receive buffer.
    Read,
}

/// Connections that each send one request header for `size` bytes at `addr` on a tcp data server and then move it
/// on as slowly as they dare (see [`Slowly`]), so that the server's no-progress timeout never fires. One thread
/// drives them all; stops (closing everything) on drop.
pub struct SlowRequests {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Connections open now.
    pub open: Arc<AtomicUsize>,
    /// Connections the server closed.
    pub closed_by_server: Arc<AtomicU64>,
}

impl SlowRequests {
    pub fn start(
        target: SocketAddr,
        sources: &[Ipv4Addr],
        count: usize,
        kind: Slowly,
        (addr, size): (u64, u64),
        interval: Duration,
    ) -> SlowRequests {
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicU64::new(0));
        let sources = sources.to_vec();
        let (stopping, opened, gone) = (stop.clone(), open.clone(), closed.clone());
        let thread = std::thread::spawn(move || {
            // The Mooncake v2 header: size, address (little-endian), opcode with bit 0x80, seven bytes of padding.
            let opcode = match kind {
                Slowly::Write => 0x81u8,
                Slowly::Read => 0x80u8,
            };
            let mut header = Vec::with_capacity(24);
            header.extend_from_slice(&size.to_le_bytes());
            header.extend_from_slice(&addr.to_le_bytes());
            header.push(opcode);
            header.extend_from_slice(&[0u8; 7]);
            let receive_buffer = (kind == Slowly::Read).then_some(2048);
            let mut held: Vec<TcpStream> = Vec::with_capacity(count);
            for index in 0..count {
                let source = sources[index % sources.len()];
                let Ok(mut stream) = connect_from_with_receive_buffer(source, target, receive_buffer) else { continue };
                if io::Write::write_all(&mut stream, &header).is_ok() && stream.set_nonblocking(true).is_ok() {
                    held.push(stream);
                    opened.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut sink = [0u8; 16];
            while !stopping.load(Ordering::Relaxed) {
                let before = held.len();
                held.retain_mut(|stream| match kind {
                    Slowly::Write => io::Write::write(stream, &[0x5A]).is_ok_and(|n| n == 1),
                    Slowly::Read => match io::Read::read(stream, &mut sink) {
                        Ok(0) => false,
                        Ok(_) => true,
                        Err(error) => error.kind() == io::ErrorKind::WouldBlock,
                    },
                });
                let lost = before - held.len();
                opened.fetch_sub(lost, Ordering::Relaxed);
                gone.fetch_add(lost as u64, Ordering::Relaxed);
                let until = Instant::now() + interval;
                while Instant::now() < until && !stopping.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            opened.fetch_sub(held.len(), Ordering::Relaxed);
        });
        SlowRequests { stop, thread: Some(thread), open, closed_by_server: closed }
    }
}

impl Drop for SlowRequests {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A forked process flooding an abstract Unix socket; reaped on drop (killed first if still running).
pub struct SocketFlood {
    pid: libc::pid_t,
    /// Read end of the pipe the child reports its connection count on.
    report: i32,
}

/// Connections a [`SocketFlood`] child holds at most.
pub const SOCKET_FLOOD_MAX_HOLD: usize = 512;

impl SocketFlood {
    /// Forks a child that, for `duration`, keeps up to `hold` connections to the abstract socket `endpoint` (`@name`)
    /// open, reconnecting each one the server closes, as fast as it can; with `as_nobody` the child first drops to
    /// uid and gid 65534 (the tests run as root). The child makes raw system calls only (no allocation, no locks):
    /// it is forked from a multi-threaded process.
    pub fn start(endpoint: &str, hold: usize, duration: Duration, as_nobody: bool) -> SocketFlood {
        let hold = hold.min(SOCKET_FLOOD_MAX_HOLD);
        let name = endpoint.strip_prefix('@').expect("abstract endpoint").as_bytes();
        // SAFETY: sockaddr_un is plain data; zero is a valid value of every field.
        let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        assert!(name.len() < address.sun_path.len(), "endpoint too long");
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (slot, byte) in address.sun_path[1..].iter_mut().zip(name) {
            *slot = *byte as libc::c_char;
        }
        let length = (std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len()) as libc::socklen_t;
        let mut pipe = [0i32; 2];
        // SAFETY: pipe2 writes two descriptors into the live array.
        assert_eq!(unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe");
        let nanos = duration.as_nanos() as i64;
        // SAFETY: fork(2); the child below only makes async-signal-safe system calls on memory prepared before the
        // fork (the address, the stack array) and ends with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: the child; see above.
            unsafe { flood_child(&address, length, hold, nanos, as_nobody, pipe[1]) }
        }
        // SAFETY: the parent closes its copy of the write end, which it owns.
        unsafe { libc::close(pipe[1]) };
        SocketFlood { pid, report: pipe[0] }
    }

    /// Waits for the child to finish; returns how many connections it made (`None` if it could not run, e.g.
    /// could not drop to `nobody`).
    pub fn finish(mut self) -> Option<u64> {
        self.wait()
    }

    fn wait(&mut self) -> Option<u64> {
        if self.pid <= 0 {
            return None;
        }
        let mut count = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64 from the pipe we own (blocks until the child writes or
        // exits).
        let got = unsafe { libc::read(self.report, std::ptr::addr_of_mut!(count).cast(), 8) };
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
        self.pid = 0;
        (got == 8 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0).then_some(count)
    }
}

impl Drop for SocketFlood {
    fn drop(&mut self) {
        if self.pid > 0 {
            // SAFETY: signals and reaps our own child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.wait();
        }
        // SAFETY: closes the read end we own.
        unsafe { libc::close(self.report) };
    }
}

fn monotonic_ns() -> i64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one live timespec (async-signal-safe).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec * 1_000_000_000 + now.tv_nsec
}

/// The flooding child. Never returns.
///
/// # Safety
/// Only in a freshly forked child: it makes raw system calls on the given memory and exits with `_exit`.
unsafe fn flood_child(
    address: &libc::sockaddr_un,
    length: libc::socklen_t,
    hold: usize,
    duration_ns: i64,
    as_nobody: bool,
    report: i32,
) -> ! {
    // SAFETY: raw system calls on live stack memory and the caller's address, in the only thread of this process.
    unsafe {
        // Let go of every descriptor inherited from the test process but the report pipe: a copy held here would keep
        // the other end of another test's connection open (a server's close would not reach its client) for as long
        // as this child runs.
        let keep = report as libc::c_uint;
        for (first, last) in [(3, keep.saturating_sub(1)), (keep + 1, libc::c_uint::MAX)] {
            if first <= last && libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) != 0 {
                // Kernels before 5.9: close them one by one, up to a bound.
                for fd in first..last.min(65_536) {
                    libc::close(fd as libc::c_int);
                }
            }
        }
        if as_nobody {
            // Raw system calls: glibc's wrappers would try to synchronise threads this child does not have.
            let nobody = 65534 as libc::c_long;
            if libc::syscall(libc::SYS_setgroups, 0 as libc::c_long, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, nobody) != 0
                || libc::syscall(libc::SYS_setuid, nobody) != 0
                || libc::getuid() != 65534
            {
                libc::_exit(2);
            }
        }
        let mut fds = [-1i32; SOCKET_FLOOD_MAX_HOLD];
        let mut connections = 0u64;
        let end = monotonic_ns() + duration_ns;
        while monotonic_ns() < end {
            for slot in fds.iter_mut().take(hold) {
                if *slot >= 0 {
                    let mut byte = 0u8;
                    let got = libc::recv(*slot, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT);
                    // Nothing to read and no EOF: the server still holds it. (Bytes are a reply: it is closing.)
                    let errno = *libc::__errno_location();
                    let still_open = got < 0 && (errno == libc::EAGAIN || errno == libc::EWOULDBLOCK);
                    if still_open {
                        continue;
                    }
                    libc::close(*slot);
                    *slot = -1;
                }
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
                if fd < 0 {
                    continue;
                }
                if libc::connect(fd, (address as *const libc::sockaddr_un).cast(), length) == 0 {
                    *slot = fd;
                    connections += 1;
                } else {
                    libc::close(fd);
                }
            }
            let pause = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
        libc::write(report, std::ptr::addr_of!(connections).cast(), 8);
        libc::_exit(0)
    }
}
