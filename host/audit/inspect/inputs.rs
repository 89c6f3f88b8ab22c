//! The entry point: [`inspect`] reads the AI-CPU op registrations given as paths, then inspects each path by its
//! kind (a directory, an ELF file, a wheel, a source file, a registration).

use std::path::{Path, PathBuf};

use super::aicpu::{parse_registrations, registration_evidence, AiCpuOps};
use super::elf::inspect_elf;
use super::read::{extension_of, problem, read_bounded, read_source, read_up_to};
use super::schema::{ComponentKind, InspectReport};
use super::source::{device_macros, scan_source, SourceFile};
use super::tree::inspect_tree;
use super::verdict::Sink;
use super::wheel::inspect_wheel;
use super::{CAVEAT, INSPECT_SCHEMA, MAX_BINARY_BYTES, REGISTRATION_EXTENSIONS, SOURCE_EXTENSIONS};

/// Inspects every path: wheels, ELF files, source trees, single source files and AI-CPU op registrations. A path
/// that does not exist, and a file that cannot be read or parsed, is a [`Problem`] of the report, never a panic.
pub fn inspect(paths: &[PathBuf]) -> InspectReport {
    let mut report = InspectReport {
        schema: INSPECT_SCHEMA.to_owned(),
        inputs: paths.iter().map(|p| p.display().to_string()).collect(),
        components: Vec::new(),
        problems: Vec::new(),
        caveat: CAVEAT.to_owned(),
    };
    // Registrations given as paths are in reach of every component: a kernel .so given beside its .ini is known.
    let mut given = AiCpuOps::default();
    for path in paths {
        let extension = extension_of(path);
        if REGISTRATION_EXTENSIONS.contains(&extension.as_str()) && path.is_file() {
            let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            if let Ok(Some(text)) = read_source(path, len) {
                let shown = path.display().to_string();
                let registrations = parse_registrations(&shown, &extension, &text);
                given.add(&shown, registrations);
            }
        }
    }
    for path in paths {
        inspect_path(path, &given, &mut report);
    }
    report
}

fn inspect_path(path: &Path, given: &AiCpuOps, report: &mut InspectReport) {
    let shown = path.display().to_string();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return problem(report, shown, "does not exist"),
        Err(e) => return problem(report, shown, format!("unreadable: {e}")),
    };
    if meta.is_dir() {
        return inspect_tree(path, given, report);
    }
    let mut head = [0u8; 4];
    let got = match std::fs::File::open(path).and_then(|mut f| read_up_to(&mut f, &mut head)) {
        Ok(got) => got,
        Err(e) => return problem(report, shown, format!("unreadable: {e}")),
    };
    let extension = extension_of(path);
    if got == 4 && head == *b"\x7fELF" {
        match read_bounded(path, MAX_BINARY_BYTES) {
            Ok(data) => {
                let mut sink = Sink::default();
                let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                match inspect_elf(&data, file_name.as_deref(), given, &mut sink) {
                    Ok(()) => report.components.push(sink.finish(shown.clone(), ComponentKind::Elf, &shown, 0)),
                    Err(e) => problem(report, shown, format!("malformed ELF: {e}")),
                }
            }
            Err(e) => problem(report, shown, format!("unreadable: {e}")),
        }
    } else if extension == "whl" || extension == "zip" || (got == 4 && head == *b"PK\x03\x04") {
        inspect_wheel(path, given, report);
    } else if SOURCE_EXTENSIONS.contains(&extension.as_str()) {
        let mut files = Vec::new();
        match read_source(path, meta.len()) {
            Ok(Some(text)) => files.push(SourceFile { shown: shown.clone(), extension, text }),
            Ok(None) => return problem(report, shown, "not a text file, or larger than 4 MiB"),
            Err(e) => return problem(report, shown, format!("unreadable: {e}")),
        }
        let macros = device_macros(&files);
        let mut sink = Sink::default();
        for file in &files {
            scan_source(file, &macros, given, &mut sink);
        }
        report.components.push(sink.finish(shown.clone(), ComponentKind::SourceTree, &shown, 1));
    } else if REGISTRATION_EXTENSIONS.contains(&extension.as_str()) {
        let text = match read_source(path, meta.len()) {
            Ok(Some(text)) => text,
            Ok(None) => return problem(report, shown, "not a text file, or larger than 4 MiB"),
            Err(e) => return problem(report, shown, format!("unreadable: {e}")),
        };
        let registrations = parse_registrations(&shown, &extension, &text);
        if registrations.is_empty() {
            return problem(report, shown, "not an AI-CPU op registration (no entry with opKernelLib=AICPUKernel)");
        }
        let mut sink = Sink::default();
        for registration in &registrations {
            sink.push(registration_evidence(registration, given));
        }
        report.components.push(sink.finish(shown.clone(), ComponentKind::SourceTree, &shown, 1));
    } else {
        problem(
            report,
            shown,
            "not a wheel, an ELF file, a directory, a source file or an AI-CPU op registration (by name or content)",
        );
    }
}
