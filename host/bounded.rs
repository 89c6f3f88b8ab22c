//! Running a program to its end within a bound on its wall time, the one way this crate does it (the doctor's
//! diagnostic programs, the audit's `ip` calls and cross-host initiators). The program runs in a process group of its
//! own, which is killed when the bound passes, so a hung program (or a child it started) never holds the caller; it
//! gets SIGKILL from the kernel should the caller's process die first ([`die_with_parent`]). Its stdout and stderr are
//! drained while it runs, each kept as the caller asks ([`Keep`]).

use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the pipe readers may still take once the program has ended: a grandchild that left the process group
/// may keep a pipe open, so the readers get a grace, not a join.
const READER_GRACE: Duration = Duration::from_millis(200);

/// What is kept of one output stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Everything.
    All,
    /// The first bytes, at most this many.
    Head(usize),
    /// The last bytes, at most this many.
    Tail(usize),
}

impl Keep {
    fn add(self, kept: &mut Vec<u8>, bytes: &[u8]) {
        match self {
            Keep::All => kept.extend_from_slice(bytes),
            Keep::Head(most) => kept.extend_from_slice(&bytes[..bytes.len().min(most.saturating_sub(kept.len()))]),
            Keep::Tail(most) => {
                kept.extend_from_slice(bytes);
                let over = kept.len().saturating_sub(most);
                kept.drain(..over);
            }
        }
    }
}

/// What a program printed, as [`Keep`] kept it (invalid UTF-8 replaced).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The first `count` lines, stdout's then stderr's, trimmed and without empty lines.
    pub fn first_lines(&self, count: usize) -> Vec<String> {
        [&self.stdout, &self.stderr]
            .into_iter()
            .flat_map(|text| text.lines())
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .take(count)
            .map(str::to_owned)
            .collect()
    }
}

/// How one bounded run ended.
#[derive(Debug)]
pub enum Outcome {
    /// The program exited within the bound.
    Exited { status: ExitStatus, output: Output },
    /// The bound passed; the process group was killed. What it printed before.
    TimedOut { output: Output },
    /// It could not be started.
    NotStarted(std::io::Error),
}

/// Makes the program started by `command` die with this process: SIGKILL from the kernel when the thread that spawns
/// it ends (`PR_SET_PDEATHSIG`; the spawning thread must outlive the program's use).
pub fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// Runs `command` with no input in a process group of its own, dying with this process, waits at most `bound` and
/// keeps its stdout and stderr as `stdout` and `stderr` say. Past the bound the whole group is killed.
pub fn run(mut command: Command, bound: Duration, stdout: Keep, stderr: Keep) -> Outcome {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    die_with_parent(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return Outcome::NotStarted(error),
    };
    let (sender, receiver) = mpsc::channel();
    for (index, stream, keep) in [
        (0, child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>), stdout),
        (1, child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>), stderr),
    ] {
        let Some(mut reader) = stream else { continue };
        let sender = sender.clone();
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buffer = [0u8; 4096];
            while let Ok(read) = reader.read(&mut buffer) {
                if read == 0 {
                    break;
                }
                keep.add(&mut kept, &buffer[..read]);
            }
            let _ = sender.send((index, kept));
        });
    }
    drop(sender);
    let deadline = Instant::now() + bound;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    if status.is_none() {
        // The whole group: a shell script's children too. The group id is the child's pid (process_group(0)).
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: a signal to the process group this function created; no memory is involved.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = child.wait();
    }
    let mut streams: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let grace = Instant::now() + READER_GRACE;
    for _ in 0..2 {
        match receiver.recv_timeout(grace.saturating_duration_since(Instant::now())) {
            Ok((index, bytes)) => streams[index] = bytes,
            Err(_) => break,
        }
    }
    let [stdout, stderr] = streams.map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
    let output = Output { stdout, stderr };
    match status {
        Some(status) => Outcome::Exited { status, output },
        None => Outcome::TimedOut { output },
    }
}

/// [`run`] for a caller that only needs the program's end: its exit status and output, or an error naming the
/// program that says why there are none (it could not be started, or it was killed at the bound, with the stderr it
/// kept).
pub fn run_to_end(
    command: Command,
    bound: Duration,
    stdout: Keep,
    stderr: Keep,
) -> std::result::Result<(ExitStatus, Output), String> {
    let program = command.get_program().to_string_lossy().into_owned();
    match run(command, bound, stdout, stderr) {
        Outcome::Exited { status, output } => Ok((status, output)),
        Outcome::TimedOut { output } => {
            Err(format!("{program} did not finish within {} s (killed): {}", bound.as_secs_f64(), output.stderr.trim()))
        }
        Outcome::NotStarted(error) => Err(format!("cannot start {program}: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sh -c script`.
    fn shell(script: &str) -> Command {
        let mut command = Command::new("/bin/sh");
        command.args(["-c", script]);
        command
    }

    const HEAD: Keep = Keep::Head(16 << 10);

    #[test]
    fn a_hung_program_and_its_children_are_killed_at_the_bound() {
        let started = Instant::now();
        let outcome = run(shell("echo first; sleep 30; echo never"), Duration::from_millis(300), HEAD, HEAD);
        let Outcome::TimedOut { output } = outcome else { panic!("not timed out: {outcome:?}") };
        assert_eq!(output.first_lines(4), ["first"]);
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }

    #[test]
    fn an_exited_program_keeps_its_first_lines() {
        let outcome = run(shell("echo a; echo; echo b; echo c >&2; exit 3"), Duration::from_secs(10), HEAD, HEAD);
        let Outcome::Exited { status, output } = outcome else { panic!("not exited: {outcome:?}") };
        assert_eq!((status.code(), output.first_lines(2)), (Some(3), vec!["a".to_owned(), "b".to_owned()]));
        let missing = run(Command::new("/nonexistent/tool"), Duration::from_secs(1), HEAD, HEAD);
        assert!(matches!(missing, Outcome::NotStarted(_)), "{missing:?}");
    }

    #[test]
    fn each_stream_is_kept_as_asked() {
        let script = "printf 0123456789; printf abcdefghij >&2";
        let outcome = run(shell(script), Duration::from_secs(10), Keep::Head(4), Keep::Tail(3));
        let Outcome::Exited { output, .. } = outcome else { panic!("not exited: {outcome:?}") };
        assert_eq!((output.stdout.as_str(), output.stderr.as_str()), ("0123", "hij"));
        let (status, output) = run_to_end(shell(script), Duration::from_secs(10), Keep::All, Keep::All).expect("ran");
        assert!(status.success());
        assert_eq!((output.stdout.as_str(), output.stderr.as_str()), ("0123456789", "abcdefghij"));
    }

    #[test]
    fn run_to_end_names_the_program_and_why_it_has_no_end() {
        let timed_out = run_to_end(shell("echo why >&2; sleep 30"), Duration::from_millis(300), Keep::All, Keep::All);
        assert_eq!(timed_out.expect_err("timed out"), "/bin/sh did not finish within 0.3 s (killed): why");
        let missing = run_to_end(Command::new("/nonexistent/tool"), Duration::from_secs(1), Keep::All, Keep::All);
        assert!(missing.expect_err("not started").starts_with("cannot start /nonexistent/tool: "));
    }
}
