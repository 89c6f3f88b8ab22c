//! Hosts in network namespaces for the multi-host tests (included with `#[path]`, not a test target of its own).
//!
//! [`Hosts::create`] builds, for one test, a "switch" namespace holding a Linux bridge (`br0`) and one namespace per
//! host, each joined to the bridge by a veth pair: `p<i>` in the switch (a bridge port), `eth0` in host `i`, with the
//! address `10.231.<k>.<i + 2>/24` (`k` distinct per set of hosts in this process) and loopback up in every
//! namespace. Names carry the test process's pid and a counter (`aivmh-<pid>-<n>-sw`, `aivmh-<pid>-<n>-h<i>`), so
//! parallel tests and reruns never collide; the subnets need not be unique across sets (each bridge is private),
//! but distinct ones keep logs unambiguous. [`Hosts::link_down`] sets a host's switch port down (the cable pulled:
//! `eth0` in the host loses carrier), [`Hosts::link_up`] puts it back.
//!
//! Processes run in a host through `ip netns exec`, which execs the program itself (no intermediate process), so a
//! [`NsChild`]'s pid is the program's and signals reach it. Every child gets `PR_SET_PDEATHSIG` = SIGKILL, so it dies
//! with the test thread that started it even when the test process is killed; dropping an [`NsChild`] kills and
//! reaps it (bounded), and dropping [`Hosts`] kills whatever still runs in its namespaces and deletes them, also when
//! the test panics. Every `ip` call is bounded (10 s) and its failure is reported with its stderr.
//!
//! When namespaces cannot be created (no `ip`, no permission) [`Hosts::create`] skips the test through
//! `tests/common/skip.rs` (a `SKIPPED: <test>: <reason>` line) and returns `None`, so the test passes, except under
//! `CI=true`, where it panics with the reason: CI runs these tests.
#![allow(dead_code)]

#[path = "skip.rs"]
mod skip;
pub use skip::skip;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bound of one `ip` invocation.
const IP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound of reaping a killed child.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `command` to its end within `within`, killing it past that; its stdout, or an error naming the command
/// with its exit status and stderr.
pub fn run_bounded(mut command: Command, within: Duration) -> Result<String, String> {
    let shown = format!("{command:?}");
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|error| format!("{shown}: cannot run: {error}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < within => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown}: did not finish within {within:?}"));
            }
            Err(error) => return Err(format!("{shown}: wait: {error}")),
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    if status.success() {
        Ok(stdout)
    } else {
        Err(format!("{shown}: {status}: {}", stderr.trim()))
    }
}

/// One `ip` invocation, bounded; its stdout or an error with its stderr.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let mut command = Command::new("ip");
    command.args(args);
    run_bounded(command, IP_TIMEOUT)
}

/// Deletes the namespaces of earlier runs whose test process is gone (a run killed before its drops ran; its
/// children died with it through `PR_SET_PDEATHSIG`). Only `aivmh-<pid>-...` names whose pid is not alive and that
/// are older than ten minutes.
fn sweep_dead_runs() {
    let Ok(list) = ip(&["netns", "list"]) else { return };
    for name in list.lines().filter_map(|line| line.split_whitespace().next()) {
        let Some(pid) = name.strip_prefix("aivmh-").and_then(|rest| rest.split('-').next()) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        // Older than any run (a process of another pid namespace sharing /run/netns is not visible in /proc).
        let age = std::fs::metadata(format!("/run/netns/{name}"))
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok());
        let stale = age.is_some_and(|age| age > Duration::from_secs(600));
        if stale && pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            match ip(&["netns", "delete", name]) {
                Ok(_) => eprintln!("netns: deleted {name}, left by an earlier run"),
                Err(reason) => eprintln!("netns: {reason}"),
            }
        }
    }
}

/// One emulated host: its namespace, its address on the test's /24, and its port on the switch.
#[derive(Clone, Debug)]
pub struct Host {
    pub namespace: String,
    pub addr: String,
    switch_port: String,
}

/// A set of hosts on one bridge; deleted (with everything running in it) on drop.
#[derive(Debug)]
pub struct Hosts {
    switch: String,
    hosts: Vec<Host>,
    subnet: String,
}

static NEXT_SET: AtomicU32 = AtomicU32::new(0);

impl Hosts {
    /// `count` hosts for the running test, or `None` (after [`skip`]) when namespaces, veth pairs or a bridge cannot
    /// be created here (whatever was created is deleted first). Panics under `CI=true` instead of skipping.
    pub fn create(count: usize) -> Option<Hosts> {
        assert!((1..=200).contains(&count), "1 to 200 hosts");
        let pid = std::process::id();
        let set = NEXT_SET.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("aivmh-{pid}-{set}");
        let k = (pid.wrapping_mul(7).wrapping_add(set)) % 250 + 1;
        let subnet = format!("10.231.{k}");
        let switch = format!("{prefix}-sw");
        if set == 0 {
            sweep_dead_runs();
        }
        if let Err(reason) = ip(&["netns", "add", &switch]) {
            skip(&format!("network namespaces cannot be created here ({reason})"));
            return None;
        }
        let mut hosts = Hosts { switch, hosts: Vec::new(), subnet };
        if let Err(reason) = hosts.build(&prefix, count) {
            // Namespaces, but no bridge or veth here (a container without those modules, say): deleted again.
            drop(hosts);
            skip(&format!("{count} hosts cannot be built from namespaces here ({reason})"));
            return None;
        }
        Some(hosts)
    }

    fn build(&mut self, prefix: &str, count: usize) -> Result<(), String> {
        let sw = self.switch.clone();
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..count {
            let namespace = format!("{prefix}-h{i}");
            ip(&["netns", "add", &namespace])?;
            let host = Host {
                namespace: namespace.clone(),
                addr: format!("{}.{}", self.subnet, i + 2),
                switch_port: format!("p{i}"),
            };
            // Pushed before configuring, so that drop deletes it whatever fails next.
            self.hosts.push(host.clone());
            ip(&[
                "-n",
                &sw,
                "link",
                "add",
                &host.switch_port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &namespace,
            ])?;
            ip(&["-n", &sw, "link", "set", &host.switch_port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &host.switch_port, "up"])?;
            ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
            ip(&["-n", &namespace, "addr", "add", &format!("{}/24", host.addr), "dev", "eth0"])?;
            ip(&["-n", &namespace, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// Host `i`.
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> &str {
        &self.hosts[i].addr
    }

    /// The namespaces of this set (the switch's first).
    pub fn namespaces(&self) -> Vec<String> {
        std::iter::once(self.switch.clone()).chain(self.hosts.iter().map(|h| h.namespace.clone())).collect()
    }

    /// A command that runs `program` with `args` in host `i` (`ip netns exec`); the caller adds env and spawns it
    /// with [`Hosts::spawn`] or [`run_bounded`].
    pub fn command(&self, i: usize, program: &str, args: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.hosts[i].namespace, program]).args(args);
        command
    }

    /// Spawns `command` (from [`Hosts::command`]) with piped stdin and stdout; its stdout lines are read by a thread
    /// into the returned child, its stderr lines echoed with `label` (captured by the test harness).
    pub fn spawn(&self, label: &str, mut command: Command) -> NsChild {
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe; the closure touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let shown = format!("{command:?}");
        let mut child = command.spawn().unwrap_or_else(|error| panic!("{label}: cannot run {shown}: {error}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let stdin = child.stdin.take();
        let (send, lines) = mpsc::channel();
        let echo = label.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                eprintln!("[{echo} stdout] {line}");
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let echo = label.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("[{echo}] {line}");
            }
        });
        NsChild { label: label.to_owned(), child, stdin, lines, exited: None }
    }

    /// Sets host `i`'s switch port down: the host is cut off, its processes keep running.
    pub fn link_down(&self, i: usize) {
        ip(&["-n", &self.switch, "link", "set", &self.hosts[i].switch_port, "down"]).expect("switch port down");
    }

    /// Sets host `i`'s switch port up again.
    pub fn link_up(&self, i: usize) {
        ip(&["-n", &self.switch, "link", "set", &self.hosts[i].switch_port, "up"]).expect("switch port up");
    }

    /// Waits (bounded by `within`) until something listens on `addr:port` as seen from host `from`.
    pub fn wait_listening(&self, from: usize, addr: &str, port: u16, within: Duration) -> Result<(), String> {
        let started = Instant::now();
        let probe = format!("exec 3<>/dev/tcp/{addr}/{port}");
        loop {
            let command = self.command(from, "bash", &["-c", &probe]);
            let outcome = run_bounded(command, Duration::from_secs(3));
            if outcome.is_ok() {
                return Ok(());
            }
            if started.elapsed() > within {
                return Err(format!("nothing listened on {addr}:{port} within {within:?}: {outcome:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for namespace in self.namespaces() {
            // Anything still running in it (children are normally reaped by their NsChild first).
            if let Ok(pids) = ip(&["netns", "pids", &namespace]) {
                for pid in pids.split_whitespace().filter_map(|p| p.parse::<libc::pid_t>().ok()) {
                    // SAFETY: a process in a namespace this test created, hence started by this test.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        // The host namespaces first: deleting one destroys its end of the veth pair and so the pair.
        for host in &self.hosts {
            if let Err(reason) = ip(&["netns", "delete", &host.namespace]) {
                eprintln!("netns: {reason}");
            }
        }
        if let Err(reason) = ip(&["netns", "delete", &self.switch]) {
            eprintln!("netns: {reason}");
        }
    }
}

/// A process in a host; killed and reaped (bounded) on drop.
#[derive(Debug)]
pub struct NsChild {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    exited: Option<ExitStatus>,
}

impl NsChild {
    /// The process id (the program's own: `ip netns exec` execs it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: signals our own child, not yet reaped (reaping happens only in `kill` and drop).
        let result = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(result, 0, "{}: signal {signal}: {}", self.label, std::io::Error::last_os_error());
    }

    /// SIGSTOP, then waits (bounded) until every thread of the process shows as stopped in /proc.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.child.id());
        let started = Instant::now();
        loop {
            let stopped = std::fs::read_dir(&tasks).map(|entries| {
                entries.filter_map(Result::ok).all(|task| {
                    let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                    // The state follows the command's closing parenthesis.
                    stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                })
            });
            if stopped.unwrap_or(false) {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "{}: not stopped within 5 s of SIGSTOP", self.label);
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILL and reap, bounded.
    pub fn kill(&mut self) {
        if self.exited.is_some() {
            return;
        }
        let _ = self.child.kill();
        let started = Instant::now();
        while started.elapsed() < REAP_TIMEOUT {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exited = Some(status);
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("{}: not reaped within {REAP_TIMEOUT:?} of SIGKILL", self.label);
    }

    /// Writes one line to the process's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap_or_else(|| panic!("{}: stdin closed", self.label));
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("{}: {line}: {e}", self.label));
    }

    /// Closes the process's stdin (roles end when it closes).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next stdout line that starts with `prefix`, within `within`; other lines are skipped. An error names the
    /// deadline or the process's exit.
    pub fn expect_line(&mut self, prefix: &str, within: Duration) -> Result<String, String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("{}: no line starting {prefix:?} within {within:?}", self.label))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.wait_exit(Duration::from_secs(2));
                    return Err(format!("{}: exited ({status:?}) before a line starting {prefix:?}", self.label));
                }
            }
        }
    }

    /// Waits (bounded) for the process to exit on its own.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while self.exited.is_none() && started.elapsed() < within {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exited = Some(status);
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.exited
    }
}

impl Drop for NsChild {
    fn drop(&mut self) {
        self.stdin = None;
        // A role ends by itself once its stdin closes; give it a moment to withdraw its metadata, then kill.
        if self.wait_exit(Duration::from_millis(500)).is_none() {
            self.kill();
        }
    }
}
