//! What a person at the terminal sees of an audit: the progress on stderr (a bar on a terminal, one line per
//! finished cell otherwise) and the log lines, which are written above the bar so that neither is cut by the other.
//!
//! Owns: [`AuditProgress`], the process's log subscriber ([`install_subscriber`]: the printing layer, filtered by
//! `RUST_LOG` (default `warn`) and by [`super::warnings::NotExpected`], and the [`super::warnings::Recorder`]) and its
//! writer. It must not decide which warnings are expected ([`super::warnings`] does).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use super::warnings::{NotExpected, Recorder};

/// The bar being drawn, if any: log lines suspend it while they are written.
static BAR: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

fn drawn_bar() -> Option<indicatif::ProgressBar> {
    BAR.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}

/// Installs the process's log subscriber: log lines on stderr (`RUST_LOG`, default `warn`), less the warnings an
/// audit's round expects, which the recorder keeps for the report instead. Call once, first thing.
pub fn install_subscriber() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    let printing = tracing_subscriber::fmt::layer().with_writer(LogWriter).with_filter(filter.and(NotExpected));
    let recording = Recorder.with_filter(LevelFilter::WARN);
    let _ = tracing_subscriber::registry().with(recording).with(printing).try_init();
}

/// Writes log lines to stderr, above the progress bar when one is drawn.
#[derive(Clone, Copy, Debug)]
struct LogWriter;

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine(Vec::new())
    }
}

/// One log line, written whole when dropped.
struct LogLine(Vec<u8>);

impl Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let write = || {
            let _ = std::io::stderr().lock().write_all(&self.0);
        };
        match drawn_bar() {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

/// Progress of an audit on stderr: a bar on a terminal, a line per finished cell otherwise.
#[derive(Debug)]
pub struct AuditProgress {
    bar: Option<indicatif::ProgressBar>,
}

impl AuditProgress {
    /// A bar when stderr is a terminal, lines otherwise.
    pub fn new() -> AuditProgress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            let style = indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        *BAR.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = bar.clone();
        AuditProgress { bar }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        BAR.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Default for AuditProgress {
    fn default() -> Self {
        AuditProgress::new()
    }
}

impl Drop for AuditProgress {
    fn drop(&mut self) {
        self.finish();
    }
}

impl super::Progress for AuditProgress {
    fn cell(&self, done: usize, total: usize, what: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
                bar.set_message(what.to_owned());
            }
            None => eprintln!("audit: {done}/{total} {what}"),
        }
    }
}
