//! Cross-process export of twin HBM: a Unix-domain socket per twin device that hands the memfd of an exported region
//! to an authenticated peer process (SCM_RIGHTS), and the client side that imports through it.
//!
//! Owns: the listening socket (abstract namespace, named in the device's advertisement as `export_endpoint`), its
//! accept thread, the per-device secret, the table of exports this device still offers. Must not touch the device's
//! windows or imports (the device maps what the client returns).
//!
//! Security model (twin): a request is served only if (1) the connecting process has this process's effective uid
//! (SO_PEERCRED; its pid is logged) and (2) it presents the device's secret: 256 bits from the kernel CSPRNG
//! (getrandom(2)), published in the segment descriptor's `aiv` object. The descriptor is therefore a capability:
//! whoever can read the metadata and connect as the same uid can import. A withdrawn export is refused to new
//! imports; mappings made before stay valid (the memfd keeps its pages alive). The memfd grants the whole exported
//! region; the uid check is the real boundary (a same-uid process could also ptrace this one).
//!
//! Wire: one request line of JSON (at most [`MAX_REQUEST_BYTES`]): `{"op":"import","export_id":N,"secret":"hex"}` or
//! `{"op":"ping","secret":"hex"}`; one reply line of JSON `{"ok":true,"device":..,"length":N}` (the memfd attached to
//! it for an import) or `{"ok":false,"error":".."}`. Every read and write on either side is bounded by a timeout.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Largest request line the server reads.
pub const MAX_REQUEST_BYTES: u64 = 1024;
/// Bound of every read and write on a connection (server and client).
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once; more are refused at once (a slow client cannot starve the others).
const MAX_CONNECTIONS: usize = 16;

/// One region a device offers: `length` bytes at `offset` of a memfd.
#[derive(Clone, Debug)]
pub struct Offer {
    /// The memfd (the device's whole heap).
    pub fd: Arc<OwnedFd>,
    /// Where the region starts in the memfd.
    pub offset: u64,
    /// Bytes.
    pub length: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    op: String,
    #[serde(default)]
    export_id: Option<u64>,
    #[serde(default)]
    secret: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The export service of one twin device.
#[derive(Debug)]
pub struct ExportService {
    endpoint: String,
    secret: String,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    identity: String,
    secret: String,
    offers: Mutex<HashMap<u64, Offer>>,
    stop: AtomicBool,
    connections: AtomicUsize,
}

/// Random bytes from the kernel CSPRNG, hex encoded.
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buffer = vec![0u8; bytes];
    let mut filled = 0;
    while filled < bytes {
        // SAFETY: writes at most `bytes - filled` bytes into the live buffer at offset `filled`.
        let n = unsafe { libc::getrandom(buffer.as_mut_ptr().add(filled).cast(), bytes - filled, 0) };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += n as usize;
    }
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

fn abstract_address(endpoint: &str) -> std::io::Result<SocketAddr> {
    let name = endpoint.strip_prefix('@').ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("export endpoint {endpoint:?} is not '@name'"))
    })?;
    SocketAddr::from_abstract_name(name.as_bytes())
}

/// (pid, uid) of the process at the other end of `stream` (SO_PEERCRED).
fn peer_credentials(stream: &UnixStream) -> std::io::Result<(i32, u32)> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `credentials`, a ucred of exactly that size.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(credentials).cast(),
            &mut length,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((credentials.pid, credentials.uid))
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

impl ExportService {
    /// Binds a fresh abstract socket for device `identity` and starts serving.
    pub fn start(identity: &str) -> std::io::Result<ExportService> {
        let secret = random_hex(32)?;
        let endpoint = format!("@aiv-twin-export-{identity}-{}", random_hex(8)?);
        let listener = UnixListener::bind_addr(&abstract_address(&endpoint)?)?;
        let shared = Arc::new(Shared {
            identity: identity.to_owned(),
            secret: secret.clone(),
            offers: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
        });
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name(super::EXPORT_THREAD_PREFIX.into())
            .spawn(move || serving.accept_loop(listener))?;
        tracing::debug!(identity, endpoint = %endpoint, "twin export service listening");
        Ok(ExportService { endpoint, secret, shared, thread: Mutex::new(Some(thread)) })
    }

    /// The socket name peers connect to (`@` + abstract name).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The secret peers must present.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Offers `offer` under `export_id` to authenticated peers.
    pub fn offer(&self, export_id: u64, offer: Offer) {
        self.shared.offers.lock().unwrap_or_else(|p| p.into_inner()).insert(export_id, offer);
    }

    /// Withdraws an export: new imports are refused; mappings peers already made stay valid.
    pub fn withdraw(&self, export_id: u64) -> bool {
        self.shared.offers.lock().unwrap_or_else(|p| p.into_inner()).remove(&export_id).is_some()
    }
}

impl Drop for ExportService {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own; the loop sees the stop flag and returns.
        if let Ok(address) = abstract_address(&self.endpoint) {
            let _ = UnixStream::connect_addr(&address);
        }
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn accept_loop(self: Arc<Self>, listener: UnixListener) {
        for stream in listener.incoming() {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let Ok(stream) = stream else {
                // E.g. out of descriptors: do not spin on an error that persists.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            if self.connections.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                self.connections.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(identity = %self.identity, "export service busy; connection refused");
                continue;
            }
            let shared = self.clone();
            let spawned =
                std::thread::Builder::new().name(format!("{}-conn", super::EXPORT_THREAD_PREFIX)).spawn(move || {
                    shared.serve(stream);
                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                });
            if spawned.is_err() {
                self.connections.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn serve(&self, stream: UnixStream) {
        if stream.set_read_timeout(Some(IO_TIMEOUT)).is_err() || stream.set_write_timeout(Some(IO_TIMEOUT)).is_err() {
            return;
        }
        let (reply, fd) = match self.answer(&stream) {
            Ok((reply, fd)) => (reply, fd),
            Err(error) => {
                tracing::warn!(identity = %self.identity, %error, "export request refused");
                (Reply { ok: false, device: None, offset: None, length: None, error: Some(error) }, None)
            }
        };
        if let Err(error) = send_reply(&stream, &reply, fd.as_deref()) {
            tracing::debug!(identity = %self.identity, %error, "export reply not delivered");
        }
    }

    fn answer(&self, stream: &UnixStream) -> Result<(Reply, Option<Arc<OwnedFd>>), String> {
        let (pid, uid) = peer_credentials(stream).map_err(|error| format!("SO_PEERCRED: {error}"))?;
        if uid != effective_uid() {
            return Err(format!("peer pid {pid} runs as uid {uid}, not this process's uid"));
        }
        let mut line = String::new();
        let mut reader = BufReader::new(stream.take(MAX_REQUEST_BYTES));
        reader.read_line(&mut line).map_err(|error| format!("reading the request: {error}"))?;
        if !line.ends_with('\n') {
            return Err(format!("request is not one line of at most {MAX_REQUEST_BYTES} bytes"));
        }
        let request: Request =
            serde_json::from_str(line.trim_end()).map_err(|error| format!("malformed request: {error}"))?;
        // Compare in full (no early exit) so the time taken does not reveal a matching prefix.
        let presented = request.secret.as_deref().unwrap_or("").as_bytes();
        let expected = self.secret.as_bytes();
        let matches = presented.len() == expected.len()
            && presented.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if !matches {
            return Err(format!("peer pid {pid}: wrong secret"));
        }
        let device = Some(self.identity.clone());
        match request.op.as_str() {
            "ping" => Ok((Reply { ok: true, device, offset: None, length: None, error: None }, None)),
            "import" => {
                let id = request.export_id.ok_or("import request without export_id")?;
                let offer = self
                    .offers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| format!("export {id} is not offered (never exported or withdrawn)"))?;
                tracing::info!(identity = %self.identity, peer_pid = pid, export_id = id, "export handed to peer");
                let reply =
                    Reply { ok: true, device, offset: Some(offer.offset), length: Some(offer.length), error: None };
                Ok((reply, Some(offer.fd)))
            }
            other => Err(format!("unknown op {other:?}")),
        }
    }
}

/// Sends one reply line, with `fd` attached (SCM_RIGHTS) when given.
fn send_reply(stream: &UnixStream, reply: &Reply, fd: Option<&OwnedFd>) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let Some(fd) = fd else {
        return (&*stream).write_all(&line);
    };
    let raw = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: line.as_mut_ptr().cast(), iov_len: line.len() };
    // SAFETY: msghdr is plain data; zero is a valid value of every field.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = space as _;
    // SAFETY: the control buffer holds `space` bytes, enough for one cmsghdr carrying one int, so CMSG_FIRSTHDR is
    // non-null and CMSG_DATA points inside the buffer; `line` and `control` outlive sendmsg.
    let sent = unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), raw);
        libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if (sent as usize) < line.len() {
        // The fd went with the first bytes; the rest of the line follows plainly.
        (&*stream).write_all(&line[sent as usize..])?;
    }
    Ok(())
}

/// What an import through the export service returns.
#[derive(Debug)]
pub struct Imported {
    /// The exporter's memfd, now also open in this process.
    pub fd: OwnedFd,
    /// Where the offered region starts in the memfd.
    pub offset: u64,
    /// Bytes the exporter offers.
    pub length: u64,
    /// The exporting device's identity.
    pub device: String,
}

fn connect(endpoint: &str) -> std::io::Result<UnixStream> {
    let stream = UnixStream::connect_addr(&abstract_address(endpoint)?)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let (pid, uid) = peer_credentials(&stream)?;
    if uid != effective_uid() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("export endpoint {endpoint} is served by pid {pid} as uid {uid}, not this process's uid"),
        ));
    }
    Ok(stream)
}

/// Receives one reply line and at most one attached descriptor.
fn receive_reply(stream: &UnixStream) -> std::io::Result<(Reply, Option<OwnedFd>)> {
    let mut received = Vec::new();
    let mut fd = None;
    let mut chunk = [0u8; 512];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    while !received.ends_with(b"\n") {
        if received.len() as u64 > 4 * MAX_REQUEST_BYTES {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "reply line too long"));
        }
        let mut control = vec![0u64; space.div_ceil(8)];
        let mut iov = libc::iovec { iov_base: chunk.as_mut_ptr().cast(), iov_len: chunk.len() };
        // SAFETY: msghdr is plain data; zero is a valid value of every field.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        // SAFETY: the buffers named by `message` are live and sized as declared; MSG_CMSG_CLOEXEC marks any received
        // descriptor close-on-exec. The socket's read timeout bounds the wait.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: walks the control messages recvmsg wrote into `control` (bounded by msg_controllen); a SCM_RIGHTS
        // message carries ints, each a descriptor now open in this process that nothing else owns.
        unsafe {
            let mut header = libc::CMSG_FIRSTHDR(&message);
            while !header.is_null() {
                if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(header).cast::<libc::c_int>();
                    let count =
                        ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                    for i in 0..count {
                        let owned = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                        // Keep the first; any other descriptor is closed when `owned` drops.
                        if fd.is_none() {
                            fd = Some(owned);
                        }
                    }
                }
                header = libc::CMSG_NXTHDR(&message, header);
            }
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "export service closed the connection"));
        }
        received.extend_from_slice(&chunk[..n as usize]);
    }
    let reply: Reply = serde_json::from_slice(&received).map_err(std::io::Error::other)?;
    Ok((reply, fd))
}

fn exchange(endpoint: &str, request: &Request) -> std::io::Result<(Reply, Option<OwnedFd>)> {
    let stream = connect(endpoint)?;
    let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    (&stream).write_all(&line)?;
    let (reply, fd) = receive_reply(&stream)?;
    if !reply.ok {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("export service refused: {}", reply.error.as_deref().unwrap_or("no reason given")),
        ));
    }
    Ok((reply, fd))
}

/// Imports `export_id` from the service at `endpoint`, presenting `secret`.
pub fn import(endpoint: &str, secret: &str, export_id: u64) -> std::io::Result<Imported> {
    let request = Request { op: "import".into(), export_id: Some(export_id), secret: Some(secret.to_owned()) };
    let (reply, fd) = exchange(endpoint, &request)?;
    let invalid = |reason: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, reason.to_owned());
    let fd = fd.ok_or_else(|| invalid("the import reply carried no descriptor"))?;
    let length = reply.length.ok_or_else(|| invalid("the import reply has no length"))?;
    let offset = reply.offset.ok_or_else(|| invalid("the import reply has no offset"))?;
    // SAFETY: fstat writes into a stat buffer we own, for a descriptor we own.
    let size = unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut stat) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        stat.st_size as u64
    };
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(invalid(&format!(
            "the received memfd holds {size} bytes, less than the {length} offered at {offset}"
        )));
    }
    Ok(Imported { fd, offset, length, device: reply.device.unwrap_or_default() })
}

/// Asks the service at `endpoint` whether it still serves the device `device`: `Ok` if it answered with that
/// identity, else why not.
pub fn ping(endpoint: &str, secret: &str, device: &str) -> std::io::Result<()> {
    let request = Request { op: "ping".into(), export_id: None, secret: Some(secret.to_owned()) };
    let (reply, _) = exchange(endpoint, &request)?;
    if reply.device.as_deref() != Some(device) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("endpoint {endpoint} now serves {:?}, not {device:?}", reply.device),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::twin::memory::MemfdRegion;

    fn raw_exchange(endpoint: &str, bytes: &[u8]) -> String {
        let mut stream = connect(endpoint).expect("connect");
        let _ = stream.write_all(bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply
    }

    #[test]
    fn imports_need_the_secret_and_withdrawn_exports_are_refused() {
        let region = MemfdRegion::create(0, "export-service-test", 1 << 16).expect("memfd");
        // SAFETY: the first 8 bytes of a live 64 KiB mapping.
        unsafe { (region.base() as *mut u64).write(0xC0FFEE) };
        let service = ExportService::start("unit-test-device").expect("service");
        assert!(service.endpoint().starts_with('@') && service.secret().len() == 64);
        service.offer(7, Offer { fd: region.fd(), offset: 0, length: region.len() });

        let wrong = import(service.endpoint(), &"0".repeat(64), 7).expect_err("wrong secret");
        assert!(wrong.to_string().contains("wrong secret"), "{wrong}");
        let unknown = import(service.endpoint(), service.secret(), 8).expect_err("unknown export");
        assert!(unknown.to_string().contains("not offered"), "{unknown}");

        let imported = import(service.endpoint(), service.secret(), 7).expect("import");
        assert_eq!((imported.offset, imported.length, imported.device.as_str()), (0, 1 << 16, "unit-test-device"));
        let mapping = MemfdRegion::map(0, Arc::new(imported.fd), imported.length).expect("map");
        // SAFETY: the first 8 bytes of a live mapping of the same memfd.
        assert_eq!(unsafe { (mapping.base() as *const u64).read() }, 0xC0FFEE);

        // Malformed and hostile requests get an error line and the server keeps serving.
        for bytes in [&b"not json\n"[..], b"{\"op\":\"import\"}\n", &[b'x'; 4096][..], b"", b"{\"op\":\"ping\""] {
            let reply = raw_exchange(service.endpoint(), bytes);
            assert!(reply.contains("\"ok\":false"), "{reply:?}");
        }
        ping(service.endpoint(), service.secret(), "unit-test-device").expect("still serving");
        assert!(ping(service.endpoint(), service.secret(), "another-device").is_err());

        assert!(service.withdraw(7));
        let revoked = import(service.endpoint(), service.secret(), 7).expect_err("withdrawn");
        assert!(revoked.to_string().contains("withdrawn"), "{revoked}");
        // The mapping made before the withdrawal stays valid.
        // SAFETY: as above.
        assert_eq!(unsafe { (mapping.base() as *const u64).read() }, 0xC0FFEE);

        let endpoint = service.endpoint().to_owned();
        drop(service);
        let gone = ping(&endpoint, "x", "unit-test-device").expect_err("service stopped");
        assert_eq!(gone.kind(), std::io::ErrorKind::ConnectionRefused, "{gone}");
    }
}
