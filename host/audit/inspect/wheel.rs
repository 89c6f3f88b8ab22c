//! Wheels (zip archives): their AI-CPU op registrations first, then each ELF member as a component and the sources
//! together as one, within [`MAX_WHEEL_BYTES`](super::MAX_WHEEL_BYTES) read in all.

use std::io::Read;
use std::path::Path;

use super::aicpu::{parse_registrations, registration_evidence, AiCpuOps, Registration};
use super::elf::inspect_elf;
use super::read::{extension_of, problem, read_up_to, text_of};
use super::schema::{ComponentKind, InspectReport};
use super::source::{device_macros, scan_source, SourceFile};
use super::verdict::Sink;
use super::{MAX_BINARY_BYTES, MAX_SOURCE_BYTES, MAX_WHEEL_BYTES, REGISTRATION_EXTENSIONS, SOURCE_EXTENSIONS};

pub(super) fn inspect_wheel(path: &Path, given: &AiCpuOps, report: &mut InspectReport) {
    let shown = path.display().to_string();
    let wheel = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| shown.clone());
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) => return problem(report, shown, format!("unreadable: {e}")),
    };
    let mut archive = match zip::ZipArchive::new(std::io::BufReader::new(file)) {
        Ok(archive) => archive,
        Err(e) => return problem(report, shown, format!("not a readable zip archive (wheel): {e}")),
    };
    let mut read = 0u64;
    // First the AI-CPU op registrations: the ELF members and sources are read knowing them.
    let mut ops = given.clone();
    let mut registrations: Vec<(String, Vec<Registration>)> = Vec::new();
    for index in 0..archive.len() {
        let Ok(mut entry) = archive.by_index(index) else { continue };
        let inner = entry.name().to_owned();
        let extension = extension_of(Path::new(&inner));
        if entry.is_dir() || !REGISTRATION_EXTENSIONS.contains(&extension.as_str()) || entry.size() > MAX_SOURCE_BYTES {
            continue;
        }
        let mut data = Vec::new();
        if let Err(e) = (&mut entry).take(MAX_SOURCE_BYTES + 1).read_to_end(&mut data) {
            problem(report, format!("{wheel}!{inner}"), format!("unreadable zip entry: {e}"));
            continue;
        }
        read += data.len() as u64;
        if let Some(text) = text_of(data) {
            let found = parse_registrations(&inner, &extension, &text);
            if !found.is_empty() {
                ops.add(&inner, found.clone());
                registrations.push((inner, found));
            }
        }
    }
    let mut sources = Vec::new();
    for index in 0..archive.len() {
        if read >= MAX_WHEEL_BYTES {
            let left = archive.len() - index;
            problem(report, shown.clone(), format!("{left} members not read: over {MAX_WHEEL_BYTES} bytes read"));
            break;
        }
        let mut entry = match archive.by_index(index) {
            Ok(entry) => entry,
            Err(e) => {
                problem(report, format!("{wheel}!#{index}"), format!("unreadable zip entry: {e}"));
                continue;
            }
        };
        if entry.is_dir() {
            continue;
        }
        let inner = entry.name().to_owned();
        let member = format!("{wheel}!{inner}");
        let extension = extension_of(Path::new(&inner));
        if REGISTRATION_EXTENSIONS.contains(&extension.as_str()) {
            continue;
        }
        let mut data = Vec::new();
        if SOURCE_EXTENSIONS.contains(&extension.as_str()) {
            if entry.size() > MAX_SOURCE_BYTES {
                continue;
            }
            if let Err(e) = (&mut entry).take(MAX_SOURCE_BYTES + 1).read_to_end(&mut data) {
                problem(report, member, format!("unreadable zip entry: {e}"));
                continue;
            }
            read += data.len() as u64;
            if let Some(text) = text_of(data) {
                sources.push(SourceFile { shown: inner, extension, text });
            }
            continue;
        }
        let mut head = [0u8; 4];
        match read_up_to(&mut entry, &mut head) {
            Ok(4) if head == *b"\x7fELF" => {}
            Ok(_) => continue,
            Err(e) => {
                problem(report, member, format!("unreadable zip entry: {e}"));
                continue;
            }
        }
        data.extend_from_slice(&head);
        if let Err(e) = (&mut entry).take(MAX_BINARY_BYTES - 4).read_to_end(&mut data) {
            problem(report, member, format!("unreadable zip entry: {e}"));
            continue;
        }
        read += data.len() as u64;
        let mut sink = Sink::default();
        let file_name = inner.rsplit('/').next();
        match inspect_elf(&data, file_name, &ops, &mut sink) {
            Ok(()) => report.components.push(sink.finish(member, ComponentKind::WheelElf, &shown, 0)),
            Err(e) => problem(report, member, format!("malformed ELF: {e}")),
        }
    }
    if !sources.is_empty() || !registrations.is_empty() {
        let macros = device_macros(&sources);
        let mut sink = Sink::default();
        for (_, found) in &registrations {
            for registration in found {
                sink.push(registration_evidence(registration, &ops));
            }
        }
        for file in &sources {
            scan_source(file, &macros, &ops, &mut sink);
        }
        report.components.push(sink.finish(
            format!("{wheel}!sources"),
            ComponentKind::WheelSources,
            &shown,
            sources.len() + registrations.len(),
        ));
    }
}
