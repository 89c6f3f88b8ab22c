//! The workload's parameters ([`BenchParams`]) and the parsers of the flags that set them, each with its range.

use std::str::FromStr;
use std::time::Duration;

use crate::error::{EngineError, Result};
use crate::transfer::{Opcode, Protocol};

/// Units `--report_unit` accepts, with their size in bytes (b suffix = bits).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReportUnit {
    pub(super) name: &'static str,
    pub(super) bytes: f64,
}

impl ReportUnit {
    const ALL: [ReportUnit; 9] = [
        ReportUnit { name: "GB", bytes: 1e9 },
        ReportUnit { name: "GiB", bytes: 1_073_741_824.0 },
        ReportUnit { name: "Gb", bytes: 1e9 / 8.0 },
        ReportUnit { name: "MB", bytes: 1e6 },
        ReportUnit { name: "MiB", bytes: 1_048_576.0 },
        ReportUnit { name: "Mb", bytes: 1e6 / 8.0 },
        ReportUnit { name: "KB", bytes: 1e3 },
        ReportUnit { name: "KiB", bytes: 1024.0 },
        ReportUnit { name: "Kb", bytes: 1e3 / 8.0 },
    ];

    /// The unit's name as printed.
    pub fn name(self) -> &'static str {
        self.name
    }
}

impl FromStr for ReportUnit {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        ReportUnit::ALL
            .into_iter()
            .find(|unit| unit.name == text)
            .ok_or_else(|| format!("unknown report unit {text:?} (one of GB GiB Gb MB MiB Mb KB KiB Kb)"))
    }
}

/// Longest `--duration`: one year (a target started without `--duration` serves until signalled instead).
pub const MAX_DURATION_SECS: f64 = 31_536_000.0;
/// Most `--threads`.
pub const MAX_THREADS: usize = 1024;
/// Most `--batch_size`.
pub const MAX_BATCH_SIZE: usize = 1 << 16;
/// Most `--report_precision` digits (an f64 carries about 16 significant digits).
pub const MAX_REPORT_PRECISION: usize = 16;

fn out_of_range(flag: &str, text: &str, accepted: &str) -> String {
    format!("{flag} {text:?}: expected {accepted}")
}

/// Shortest `--duration`: one microsecond (anything shorter would round to no run at all).
pub const MIN_DURATION_SECS: f64 = 1e-6;

/// `--duration`: seconds, from [`MIN_DURATION_SECS`] to [`MAX_DURATION_SECS`].
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let accepted = format!("a number of seconds from {MIN_DURATION_SECS:.6} to {MAX_DURATION_SECS}");
    match text.trim().parse::<f64>() {
        Ok(seconds) if (MIN_DURATION_SECS..=MAX_DURATION_SECS).contains(&seconds) => {
            Ok(Duration::from_secs_f64(seconds))
        }
        _ => Err(out_of_range("--duration", text, &accepted)),
    }
}

fn parse_count(flag: &str, text: &str, min: usize, max: usize) -> std::result::Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(out_of_range(flag, text, &format!("an integer from {min} to {max}"))),
    }
}

/// `--threads`: 1 to [`MAX_THREADS`].
pub fn parse_threads(text: &str) -> std::result::Result<usize, String> {
    parse_count("--threads", text, 1, MAX_THREADS)
}

/// `--batch_size`: 1 to [`MAX_BATCH_SIZE`].
pub fn parse_batch_size(text: &str) -> std::result::Result<usize, String> {
    parse_count("--batch_size", text, 1, MAX_BATCH_SIZE)
}

/// `--report_precision`: 0 to [`MAX_REPORT_PRECISION`].
pub fn parse_report_precision(text: &str) -> std::result::Result<usize, String> {
    parse_count("--report_precision", text, 0, MAX_REPORT_PRECISION)
}

/// Bytes of physical memory on this machine, if the system says.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf reads a system constant and has no preconditions.
    let (pages, page_size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let (pages, page_size) = (u64::try_from(pages).ok()?, u64::try_from(page_size).ok()?);
    pages.checked_mul(page_size)
}

/// `--buffer_size` (and `--block_size`, with their own flag name): a size with an optional suffix, at least 1 byte
/// and at most half this machine's physical memory (a run holds two buffers of this size).
pub fn parse_buffer_size(flag: &str, text: &str) -> std::result::Result<u64, String> {
    let max = physical_memory().map_or(1 << 40, |bytes| bytes / 2);
    let accepted = format!("a size from 1 byte to {max} bytes (half this machine's memory), e.g. 64kb or 1gb");
    match crate::config::parse_size(text) {
        Ok(bytes) if (1..=max).contains(&bytes) => Ok(bytes),
        Ok(_) => Err(out_of_range(flag, text, &accepted)),
        Err(reason) => Err(format!("{} ({reason})", out_of_range(flag, text, &accepted))),
    }
}

/// The workload's parameters, named as `transfer_engine_bench` names them.
#[derive(Clone, Debug)]
pub struct BenchParams {
    /// READ or WRITE.
    pub operation: Opcode,
    /// Protocol of every request.
    pub protocol: Protocol,
    /// Bytes of each side's buffer.
    pub buffer_size: u64,
    /// Requests per batch.
    pub batch_size: usize,
    /// Bytes per request.
    pub block_size: u64,
    /// How long to run.
    pub duration: Duration,
    /// Initiator threads.
    pub threads: usize,
    /// Unit of the throughput figure.
    pub report_unit: ReportUnit,
    /// Digits after the decimal point.
    pub report_precision: usize,
}

impl BenchParams {
    /// Checks that the workload fits the buffers.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| EngineError::InvalidArgument { operation: "bench", reason };
        if self.batch_size == 0 || self.threads == 0 || self.block_size == 0 {
            return Err(invalid("batch_size, threads and block_size must be positive".into()));
        }
        let needed = (self.batch_size as u64)
            .checked_mul(self.threads as u64)
            .and_then(|n| n.checked_mul(self.block_size))
            .ok_or_else(|| invalid("batch_size x threads x block_size overflows".into()))?;
        if needed > self.buffer_size {
            return Err(invalid(format!(
                "batch_size x threads x block_size = {needed} bytes does not fit buffer_size {}",
                self.buffer_size
            )));
        }
        Ok(())
    }
}
