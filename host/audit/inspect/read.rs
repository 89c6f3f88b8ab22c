//! Reading inputs within the limits: bounded reads, what counts as a text file, a path's extension, and a file that
//! could not be inspected recorded as a [`Problem`] of the report.

use std::io::Read;
use std::path::Path;

use super::schema::{InspectReport, Problem};
use super::MAX_SOURCE_BYTES;

pub(super) fn problem(report: &mut InspectReport, path: impl Into<String>, what: impl Into<String>) {
    report.problems.push(Problem { path: path.into(), problem: what.into() });
}

pub(super) fn extension_of(path: &Path) -> String {
    path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase()
}

pub(super) fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

pub(super) fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    std::fs::File::open(path)?.take(limit).read_to_end(&mut data)?;
    Ok(data)
}

/// A text file's content: `None` when it is larger than [`MAX_SOURCE_BYTES`] or holds a NUL byte.
pub(super) fn read_source(path: &Path, len: u64) -> std::io::Result<Option<String>> {
    if len > MAX_SOURCE_BYTES {
        return Ok(None);
    }
    let data = read_bounded(path, MAX_SOURCE_BYTES + 1)?;
    Ok(text_of(data))
}

pub(super) fn text_of(data: Vec<u8>) -> Option<String> {
    if data.len() as u64 > MAX_SOURCE_BYTES || data.contains(&0) {
        return None;
    }
    Some(String::from_utf8_lossy(&data).into_owned())
}
