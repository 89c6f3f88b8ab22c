//! Running a diagnostic program (`npu-smi info`, `bisheng --version`) with a bound on its wall time: the program runs
//! in a process group of its own, which is killed when the bound passes, so a hung tool (or a child it started) never
//! holds the doctor. Only the first lines of its output are kept.

use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Output bytes kept per stream.
const KEEP_BYTES: usize = 16 << 10;

/// How one bounded run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The program exited within the bound: its exit code (`None` when a signal ended it) and its first lines
    /// (stdout, then stderr), trimmed and without empty lines.
    Exited { code: Option<i32>, lines: Vec<String> },
    /// The bound passed; the process group was killed. The lines it printed before.
    TimedOut { lines: Vec<String> },
    /// It could not be started.
    NotStarted(String),
}

/// Runs `program args` with no input, waits at most `bound`, and keeps the first `keep_lines` lines.
pub fn run(program: &Path, args: &[&str], bound: Duration, keep_lines: usize) -> Outcome {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return Outcome::NotStarted(error.to_string()),
    };
    let (sender, receiver) = mpsc::channel();
    for stream in [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .enumerate()
    {
        let (index, Some(mut reader)) = stream else { continue };
        let sender = sender.clone();
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buffer = [0u8; 4096];
            while let Ok(read) = reader.read(&mut buffer) {
                if read == 0 {
                    break;
                }
                let room = KEEP_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..read.min(room)]);
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
    // A grandchild that left the group may keep a pipe open: the readers get a short grace, not a join.
    let mut streams: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let grace = Instant::now() + Duration::from_millis(200);
    for _ in 0..2 {
        match receiver.recv_timeout(grace.saturating_duration_since(Instant::now())) {
            Ok((index, bytes)) => streams[index] = bytes,
            Err(_) => break,
        }
    }
    let lines: Vec<String> = streams
        .iter()
        .flat_map(|bytes| String::from_utf8_lossy(bytes).lines().map(str::trim).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| !line.is_empty())
        .take(keep_lines)
        .collect();
    match status {
        Some(status) => Outcome::Exited { code: status.code(), lines },
        None => Outcome::TimedOut { lines },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_program_and_its_children_are_killed_at_the_bound() {
        let started = Instant::now();
        let outcome =
            run(Path::new("/bin/sh"), &["-c", "echo first; sleep 30; echo never"], Duration::from_millis(300), 4);
        assert_eq!(outcome, Outcome::TimedOut { lines: vec!["first".into()] });
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }

    #[test]
    fn an_exited_program_keeps_its_first_lines() {
        let outcome =
            run(Path::new("/bin/sh"), &["-c", "echo a; echo; echo b; echo c >&2; exit 3"], Duration::from_secs(10), 2);
        assert_eq!(outcome, Outcome::Exited { code: Some(3), lines: vec!["a".into(), "b".into()] });
        assert!(matches!(run(Path::new("/nonexistent/tool"), &[], Duration::from_secs(1), 1), Outcome::NotStarted(_)));
    }
}
