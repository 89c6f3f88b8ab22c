//! Servers in another process and peers that fail or misbehave: a server in a child process (a re-exec of this
//! binary), a killed server, a silent peer, and hostile bytes on a server's port.

use core::ffi::c_void;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;
use cann_twin::hixl::{HELLO_ANSWER_BYTES, HELLO_ENTRY_BYTES, MAGIC, VERSION};
use proptest::prelude::*;

use super::{hixl, malloc_on, mem, op, since, Client, Server, MIB, ROLE};
use crate::common::{api, download, pattern, upload};

/// The child's role: a server on 2 MiB of device memory holding `pattern(2 MiB, 42)`; prints `READY port addr`,
/// serves until stdin closes (or 60 s).
#[test]
fn child_server() {
    if std::env::var(ROLE).as_deref() != Ok("server") {
        return;
    }
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3);
    });
    let api = api();
    let size = 2 * MIB;
    let remote = malloc_on(api, 0, size);
    upload(api, remote, &pattern(size, 42));
    let server = Server::start(&[mem(remote, size)]);
    println!("READY {} {:x}", server.port, remote as usize);
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    drop(server);
}

struct Child {
    child: std::process::Child,
    port: u32,
    remote: *mut c_void,
}

impl Child {
    fn spawn() -> Child {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "peers::child_server", "--nocapture", "--test-threads", "1"])
            .env(ROLE, "server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        // Owned first, so a child that never gets ready is still killed and reaped.
        let mut owned = Child { child, port: 0, remote: core::ptr::null_mut() };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let line = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("READY line");
            if let Some(at) = line.find("READY ") {
                let words: Vec<&str> = line[at..].split_whitespace().collect();
                owned.port = words[1].parse().expect("port");
                owned.remote = usize::from_str_radix(words[2], 16).expect("address") as *mut c_void;
                return owned;
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_in_a_child_process() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let size = 2 * MIB;
    let child = Child::spawn();
    let local = malloc_on(api, 1, size);
    let client = Client::connect(child.port, &[mem(local, size)]).expect("connect");
    // Get the child's pattern, unaligned: the device path, its memory imported from the child.
    let before = client.evidence();
    assert_eq!(client.run(false, &[op(child.remote, 3, local, 5, size - 8)]), HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(since(&client.evidence(), &before).device_batches, 1);
    assert_eq!(download(api, (local as usize + 5) as *const c_void, size - 8), pattern(size, 42)[3..size - 5]);
    // Put new bytes, get them back into the other half.
    upload(api, local, &pattern(MIB, 77));
    assert_eq!(client.run(true, &[op(child.remote, 100, local, 0, MIB)]), HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(client.run(false, &[op(child.remote, 100, local, MIB, MIB)]), HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(download(api, (local as usize + MIB) as *const c_void, MIB), pattern(MIB, 77));
    // The child's address space is not this one's: a range outside its registration is refused here.
    assert_eq!(client.submit(false, &[op(child.remote, size, local, 0, 1)]), Err(HIXL_PARAM_INVALID));
}

#[test]
fn a_killed_server_fails_pending_transfers_in_bounded_time() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let size = 2 * MIB;
    let mut child = Child::spawn();
    let local = malloc_on(api, 1, size);
    let client = Client::connect(child.port, &[mem(local, size)]).expect("connect");
    // Far more than can move before the kill: 4000 gets of 2 MiB.
    let list = vec![op(child.remote, 0, local, 0, size); 4000];
    let before = client.evidence();
    let pending = client.submit(false, &list).expect("submit");
    let queued = client.submit(true, &list[..1]).expect("submit");
    assert_eq!(since(&client.evidence(), &before).device_batches, 2, "both on the AI CPU, the child's memory imported");
    std::thread::sleep(Duration::from_millis(50));
    child.child.kill().expect("kill");
    let _ = child.child.wait();
    let killed = Instant::now();
    assert_eq!(client.wait(pending, Duration::from_secs(3)), HIXL_COMPLETE_STATUS_FAILED);
    assert_eq!(client.wait(queued, Duration::from_secs(3)), HIXL_COMPLETE_STATUS_FAILED);
    assert!(killed.elapsed() < Duration::from_secs(3));
    // The connection is gone: later batches are refused at once; a new connect is tried (and fails: nobody there).
    assert_eq!(client.submit(true, &list[..1]), Err(HIXL_FAILED));
    // SAFETY: looked up, never dereferenced.
    assert_eq!(unsafe { hixl().HixlCSClientConnect(client.raw, 500) }, HIXL_FAILED);
}

/// A peer that accepts and then says nothing (`answer_hello`: after a valid hello with one region at `remote`).
fn silent_peer(answer_hello: bool, remote: usize) -> u32 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = u32::from(listener.local_addr().expect("address").port());
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else { return };
        if answer_hello {
            let mut hello = [0u8; 12];
            let _ = stream.read_exact(&mut hello);
            // Version 2: no registry (token 0), one registration without an export (token 0): the wire path.
            let mut reply = MAGIC.to_vec();
            reply.extend_from_slice(&HIXL_SUCCESS.to_le_bytes());
            reply.extend_from_slice(&1u32.to_le_bytes());
            reply.extend_from_slice(&0u64.to_le_bytes());
            reply.extend_from_slice(&(remote as u64).to_le_bytes());
            reply.extend_from_slice(&(MIB as u64).to_le_bytes());
            reply.extend_from_slice(&COMM_MEM_TYPE_DEVICE.0.to_le_bytes());
            reply.extend_from_slice(&0u32.to_le_bytes());
            reply.extend_from_slice(&[0u8; 24]);
            assert_eq!(reply.len(), HELLO_ANSWER_BYTES + HELLO_ENTRY_BYTES);
            let _ = stream.write_all(&reply);
        }
        std::thread::sleep(Duration::from_secs(5));
    });
    port
}

#[test]
fn a_silent_peer_times_out_within_the_bound() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let local = malloc_on(api, 1, MIB);
    let port = silent_peer(false, 0);
    let started = Instant::now();
    assert_eq!(Client::connect(port, &[]).err(), Some(HIXL_TIMEOUT), "no hello answer within the connect timeout");
    assert!(started.elapsed() < Duration::from_millis(2800));
    let remote = 0x1000_0000usize;
    let client = Client::connect(silent_peer(true, remote), &[mem(local, MIB)]).expect("connect");
    let list = [op(remote as *mut c_void, 0, local, 0, MIB)];
    let started = Instant::now();
    // SAFETY: live list; ranges checked by the twin.
    let code = unsafe { hixl().HixlCSClientBatchPutSync(client.raw, 1, list.as_ptr(), 300).expect("resolved") };
    assert_eq!(code, HIXL_TIMEOUT);
    assert!(started.elapsed() < Duration::from_millis(1500));
    // The stream is out of step: later batches are refused.
    assert_eq!(client.submit(false, &list), Err(HIXL_FAILED));
}

/// One shared server for the hostile-bytes cases, with its memory and a client's.
fn hostile_target() -> &'static (u32, usize, usize) {
    static TARGET: std::sync::OnceLock<(u32, usize, usize)> = std::sync::OnceLock::new();
    TARGET.get_or_init(|| {
        let api = api();
        let remote = malloc_on(api, 0, MIB);
        let local = malloc_on(api, 1, MIB);
        let server = Server::start(&[mem(remote, MIB)]);
        let port = server.port;
        std::mem::forget(server);
        (port, remote as usize, local as usize)
    })
}

fn hello_bytes() -> Vec<u8> {
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn hostile_bytes_leave_the_server_serving(
        prefix_hello in any::<bool>(),
        op_word in prop_oneof![Just(1u32), Just(2u32), any::<u32>()],
        remote_off in any::<u64>(),
        len in prop_oneof![Just(8u64), 1u64..4096, any::<u64>()],
        tail in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        if std::env::var_os(ROLE).is_some() {
            return Ok(());
        }
        let api = api();
        let &(port, remote, local) = hostile_target();
        let mut bytes = if prefix_hello { hello_bytes() } else { Vec::new() };
        bytes.extend_from_slice(&op_word.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&(remote as u64).wrapping_add(remote_off % (2 * MIB as u64)).to_le_bytes());
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&tail);
        let mut stream = TcpStream::connect(("127.0.0.1", port as u16)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        let _ = stream.write_all(&bytes);
        let mut sink = [0u8; 4096];
        let _ = stream.read(&mut sink);
        drop(stream);
        // Still serving a real client.
        let client = Client::connect(port, &[mem(local as *mut c_void, MIB)]).expect("connect after hostile bytes");
        let seed = tail.first().copied().unwrap_or(1);
        upload(api, local as *mut c_void, &pattern(4096, seed));
        prop_assert_eq!(client.run(true, &[op(remote as *mut c_void, 0, local as *mut c_void, 0, 4096)]), HIXL_COMPLETE_STATUS_COMPLETED);
        prop_assert_eq!(download(api, remote as *const c_void, 4096), pattern(4096, seed));
    }
}
