//! The hostile-input tier: every network parser and service of this engine against inputs chosen to break it, and
//! every client against peers that misbehave on purpose. Loopback only; every test bounded in time (the whole tier
//! runs in well under two minutes on two cores: `cargo test --test hostile`).
//!
//! | module | surface | what it throws |
//! |---|---|---|
//! | `tcp_data` | the tcp data port (Mooncake's TCP wire) | random byte streams and random frames (any opcode, version, address, size, payload length), truncation, stalls, a flood of idle connections while a client is served, 100 slow WRITE dribblers and 100 slow READ readers beside an engine initiator, requests moving a byte at a time against the whole-request deadline, thousands of rejected requests against the log |
//! | `handshake` | the P2P handshake port | random frames and bytes, hostile protocols (HTTP, TLS), silence, a reconnecting flood, Connection frames naming a NIC that is not the claimed peer's (one at a time and 200 at once: no connection out, bounded threads); and the client against random replies |
//! | `http_store` | the HTTP metadata server | random requests (methods, targets, headers, lengths, bodies), store bounds, withheld bodies against the buffered-bytes budget (memory measured in an `aiv metadata-server` child), idle connections past the connection cap and past the descriptor limit, dribbled requests against the request deadline, a reply never read; and the client against random answers |
//! | `export` | the twin runtime's export service (`cann_twin::vmm_share`, an abstract Unix socket) | structured requests: the magic or not, every op (VMM, IPC and range imports, unknown ones), any handle, key or token, lengths around 16; only the live export gets a memfd (raw bytes, forged handles, idle and over-limit connections: the runtime's own `vmm_share` test) |
//! | `clients` | our clients | dribbling peers (handshake, HTTP, etcd, tcp) against the one deadline per operation; a dead tcp peer against backoff and log limits; a tcp data server that cuts connections mid-request or rejects; a peer without a data port against the log |
//! | `engine` | a whole engine | fuzz on its RPC and tcp data ports at once, then a real transfer; the bench initiator across a target restarted on its RPC port |
//! | `memory` | registered memory | ranges unmapped after registration (tcp server and client, the local path; in a child process, with either copy primitive), the null page, large registration batches |
//!
//! Memory: every fuzz test keeps unregistered neighbours around the memory it registers and checks, after the last
//! case, that they are untouched, and that the service still serves a legitimate request. The fuzz tests use
//! proptest with a fixed number of cases; a failing case is shrunk and saved under `tests/hostile/` (commit it).

#[path = "../common/aiv.rs"]
mod aiv;
#[path = "../common/flood.rs"]
mod flood;
#[path = "../common/http.rs"]
mod http_support;
#[path = "../common/tcp_wire.rs"]
mod tcp_wire;

mod clients;
mod engine;
mod export;
mod handshake;
mod http_store;
mod memory;
mod tcp_data;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence};

/// The proptest configuration of every fuzz test here: `cases` cases; a failing case is shrunk and its seed saved
/// beside the test's file.
pub fn fuzz_config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    }
}

/// A fake server on loopback answering the n-th connection with `answers[n]` (nothing once they run out) after
/// reading what the client sent (bounded), then closing; stops on drop. Plays a handshake peer or an HTTP server.
#[derive(Debug)]
pub struct FakeServer {
    pub address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeServer {
    pub fn start(answers: Vec<Vec<u8>>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let address = listener.local_addr().expect("address");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let answer = answers.lock().expect("answers").next().unwrap_or_default();
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
                let mut request = [0u8; 8192];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(&answer);
            }
        });
        FakeServer { address, stop, thread: Some(thread) }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Everything `tracing` prints in this test binary, for counting lines (installed once, as the global subscriber:
/// the lines come from the client's own threads).
pub fn captured_log() -> Arc<std::sync::Mutex<Vec<u8>>> {
    static LOG: std::sync::OnceLock<Arc<std::sync::Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || SharedWriter(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber of this binary");
        log
    })
    .clone()
}

struct SharedWriter(Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for SharedWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
