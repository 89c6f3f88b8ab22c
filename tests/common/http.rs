//! A raw HTTP/1.1 client for tests that check exact status codes and bodies of the metadata server, and the
//! metadata server run as an `aiv metadata-server` child process (its memory and descriptors measured apart from the
//! test's own).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One raw HTTP/1.1 request to `address` (closing the connection after it); returns (status, body).
pub fn raw_http(address: SocketAddr, method: &str, target: &str, body: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

/// One raw HTTP/1.1 request with every wait bounded (connect, write, read); `Err` names what did not happen in
/// time. For requests sent while a server is under a flood, where a blocking connect could wait for minutes.
pub fn bounded_http(
    address: SocketAddr,
    method: &str,
    target: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect_timeout(&address, timeout).map_err(|error| format!("connect: {error}"))?;
    stream.set_read_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body))
        .map_err(|error| format!("send: {error}"))?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).map_err(|error| format!("read the response: {error}"))?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {:?}", &response[..response.len().min(80)]))?;
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    Ok((status, body))
}

/// An `aiv metadata-server` child process on a free loopback port; killed (it is ours) on drop. Its stderr is
/// collected, so tests can count its log lines.
pub struct ChildServer {
    pub child: std::process::Child,
    pub address: SocketAddr,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ChildServer {
    /// Starts `aiv metadata-server --port 0 <args>`, with its descriptor limit lowered to `fd_limit` if given (in
    /// the child only), and waits (bounded) for the line naming its address.
    pub fn start(aiv: &str, args: &[&str], fd_limit: Option<u64>) -> ChildServer {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new(aiv);
        command
            .args(["metadata-server", "--port", "0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(limit) = fd_limit {
            let limit = libc::rlimit { rlim_cur: limit as libc::rlim_t, rlim_max: limit as libc::rlim_t };
            // SAFETY: between fork and exec the closure only calls setrlimit(2), which is async-signal-safe, on a
            // live rlimit it copied in.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().expect("aiv metadata-server starts");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = sender.send(line);
            }
            for _ in lines {}
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut pipe = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        });
        let line = match receiver.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("aiv metadata-server printed no address: {}", stderr.lock().expect("stderr"));
            }
        };
        let address = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|address| address.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        ChildServer { child, address, stderr }
    }

    /// A field of the child's /proc status in KiB (`VmRSS`, `VmHWM`).
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("child status");
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in the child's status"))
    }

    /// Descriptors the child holds open.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map_or(0, |entries| entries.count())
    }

    /// What the child wrote to stderr so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
