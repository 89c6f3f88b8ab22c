//! ELF files: the file's machine (a device object for the NPU, an AI-CPU kernel .so), its symbols by the name rules
//! (C++ names demangled), its sections' names, the ELF images embedded in them, and the strings of read-only data.

use std::collections::BTreeSet;

use object::{Object, ObjectSection, ObjectSymbol};

use super::aicpu::AiCpuOps;
use super::names::{classify_name, identifiers, launch_api_in};
use super::schema::{Check, Evidence, EvidenceClass, Stance};
use super::verdict::Sink;
use super::{AICPU_ELF_MACHINE, MAX_EMBEDDED, NPU_ELF_MACHINE};

/// The name to match for a symbol: demangled when it is a C++ name.
fn demangle(name: &str) -> String {
    if name.starts_with("_Z") {
        if let Ok(symbol) = cpp_demangle::Symbol::new(name.as_bytes()) {
            if let Ok(text) = symbol.demangle() {
                return text;
            }
        }
    }
    name.to_owned()
}

/// A symbol that is never evidence: a C++ guard variable, vtable, VTT, typeinfo or typeinfo name, or a thread-local
/// wrapper. Their names repeat a class's or variable's name (`guard variable for ock::mf::env::ASCEND_HOME_PATH`),
/// and none of them is a device object.
fn is_cxx_runtime_symbol(raw: &str, demangled: &str) -> bool {
    ["_ZGV", "_ZTV", "_ZTT", "_ZTI", "_ZTS", "_ZTC", "_ZTH", "_ZTW"].iter().any(|prefix| raw.starts_with(prefix))
        || ["guard variable for ", "vtable for ", "VTT for ", "typeinfo for ", "typeinfo name for ", "{vtable("]
            .iter()
            .any(|prefix| demangled.starts_with(prefix))
}

/// The function's or variable's own name in a (demangled) symbol: the last identifier before the parameter list.
fn own_name(demangled: &str) -> &str {
    let head = demangled.split('(').next().unwrap_or(demangled);
    identifiers(head).last().map(|&(id, _)| id).unwrap_or(head)
}

/// The name rules applied to one (possibly demangled) symbol name of a device object: each identifier of it.
fn classify_symbol(demangled: &str) -> Option<(EvidenceClass, Check, &'static str)> {
    let ids = identifiers(demangled);
    let head = demangled.split('(').next().unwrap_or(demangled);
    classify_name(own_name(demangled), head).or_else(|| {
        // Device objects' symbols: any part of the name (a kernel's local structures, e.g. `CopySqe::fill`).
        ids.iter().find_map(|&(id, _)| {
            classify_name(id, head).filter(|(c, _, _)| !matches!(c, EvidenceClass::HostSubmission))
        })
    })
}

/// The symbol rule for a Host ELF: the function's own name, with its qualifier for ADXL's methods.
fn classify_name_of_symbol(demangled: &str) -> Option<(EvidenceClass, Check, &'static str)> {
    let head = demangled.split('(').next().unwrap_or(demangled);
    classify_name(own_name(demangled), head)
}

pub(super) fn inspect_elf(data: &[u8], file_name: Option<&str>, ops: &AiCpuOps, sink: &mut Sink) -> Result<(), String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    if file.format() != object::BinaryFormat::Elf {
        return Err("not an ELF file".to_owned());
    }
    let own_machine = elf_machine(data);
    let own_shown = own_machine.map_or_else(|| "unknown".to_owned(), |m| format!("{m:#06x}"));
    // The file itself a device object: an ELF for the NPU's machine (a kernel object given or shipped as a file).
    let npu = own_machine == Some(NPU_ELF_MACHINE);
    if npu {
        sink.push_once(
            Evidence::new(
                EvidenceClass::DeviceKernel,
                Check::Kernel,
                Stance::For,
                format!(
                    "this file is an ELF for machine {NPU_ELF_MACHINE:#06x} (EM_HIIPU, the NPU's AI Core): a device \
                     object, so its symbols and strings are device code"
                ),
                format!("ELF header (e_machine {NPU_ELF_MACHINE:#06x})"),
            )
            .device(),
        );
    }
    // An AI-CPU kernel .so: the kernelSo an op registration names, or the file that holds an AI-CPU op's body.
    let mut ai_cpu = false;
    if !npu {
        if let Some(registration) = file_name.and_then(|name| ops.kernel_so(name)) {
            ai_cpu = true;
            let what = format!(
                "this file is `{}`, the kernelSo of the AI-CPU op `{}` registered at {}: an AI-CPU kernel .so, so \
                 its descriptor and doorbell names are AI-CPU code",
                registration.kernel_so, registration.op, registration.at
            );
            let location = format!("file name {}", registration.kernel_so);
            sink.push_once(
                Evidence::new(EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, Stance::Neutral, what, location)
                    .ai_cpu(),
            );
        }
        for (table, symbols) in [(".dynsym", file.dynamic_symbols()), (".symtab", file.symbols())] {
            for symbol in symbols {
                let Ok(raw) = symbol.name() else { continue };
                let text = symbol.kind() == object::SymbolKind::Text;
                if symbol.is_undefined() || !text || raw.is_empty() || !ops.named_in(raw) {
                    continue;
                }
                let name = demangle(raw);
                let own = own_name(&name);
                let Some(op) = ops.op(own) else { continue };
                ai_cpu = true;
                let what = format!(
                    "defines the AI-CPU op `{own}` (a function symbol): this file holds the op's body, an AI-CPU \
                     kernel .so; {}",
                    op.describe()
                );
                let location = format!("symbol {raw} ({table})");
                sink.push_once(
                    Evidence::new(EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, op.stance(), what, location)
                        .ai_cpu(),
                );
            }
        }
    }
    // Symbols: imports (undefined) and definitions, from .dynsym and .symtab.
    // A name in both tables is reported once, from .dynsym.
    let mut named = BTreeSet::new();
    for (table, symbols) in [(".dynsym", file.dynamic_symbols()), (".symtab", file.symbols())] {
        for symbol in symbols {
            let Ok(raw) = symbol.name() else { continue };
            if raw.is_empty() || (!named.insert((raw, symbol.is_undefined())) && table == ".symtab") {
                continue;
            }
            let name = demangle(raw);
            if is_cxx_runtime_symbol(raw, &name) {
                continue;
            }
            let undefined = symbol.is_undefined();
            let location = format!("symbol {raw} ({table}{})", if undefined { ", undefined" } else { "" });
            let base = name.split('(').next().unwrap_or(&name).to_owned();
            if npu {
                if let Some((class, check, what)) = classify_symbol(&name) {
                    let stance = if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                    let what = format!("{what}: symbol `{base}` of this device object");
                    sink.push_once(Evidence::new(class, check, stance, what, location).device());
                }
                continue;
            }
            let own = own_name(&name);
            if let Some(op) = ops.op(own) {
                if undefined || symbol.kind() != object::SymbolKind::Text {
                    let verb = if undefined { "imports" } else { "defines" };
                    sink.pending_op(own, op, format!("{verb} a symbol of that name"), location);
                }
                continue;
            }
            let data_variable = !undefined && symbol.kind() == object::SymbolKind::Data;
            if data_variable {
                if let Some(api) = launch_api_in(own) {
                    let what = format!(
                        "a variable named after the launch API `{api}*`: `{base}` (by its name a function pointer \
                         filled at run time; a variable is neither a launch nor a device object)"
                    );
                    let item =
                        Evidence::new(EvidenceClass::KernelLaunch, Check::Kernel, Stance::Mentions, what, location);
                    sink.push_once(item);
                    continue;
                }
            }
            let classified = classify_name_of_symbol(&name).filter(|(class, _, _)| {
                !(data_variable && matches!(class, EvidenceClass::HostSubmission | EvidenceClass::KernelLaunch))
            });
            if let Some((class, check, what)) = classified {
                let stance = match class {
                    EvidenceClass::HostSubmission => Stance::Against,
                    EvidenceClass::KernelLaunch => Stance::For,
                    EvidenceClass::Descriptor | EvidenceClass::Doorbell if ai_cpu => Stance::Against,
                    _ => Stance::Neutral, // a descriptor or doorbell name in Host code does not count
                };
                let verb = if undefined { "imports" } else { "defines" };
                let what = if ai_cpu && stance == Stance::Against && class != EvidenceClass::HostSubmission {
                    format!("{what} in an AI-CPU kernel .so: {verb} `{base}`")
                } else {
                    format!("{what}: {verb} `{base}`")
                };
                let mut item = Evidence::new(class, check, stance, what, location);
                item.in_ai_cpu_code = ai_cpu;
                sink.push_once(item);
            } else if data_variable && mentions_device(&name) {
                let what = format!(
                    "a data variable whose name mentions ascend, aicore or kernel: `{base}` (a name, not a device \
                     object: no device ELF header is there)"
                );
                sink.push_once(Evidence::new(
                    EvidenceClass::DeviceKernel,
                    Check::Kernel,
                    Stance::Mentions,
                    what,
                    location,
                ));
            }
        }
    }
    // Sections: embedded ELF images (a device object is one for the NPU's machine), names of sections, and the
    // names a binary looks up at run time (strings of its read-only data).
    let mut embedded = 0usize;
    for section in file.sections() {
        let name = section.name().unwrap_or("").to_owned();
        let Ok(bytes) = section.data() else { continue };
        if mentions_device(&name) && !bytes.starts_with(b"\x7fELF") {
            let what = format!(
                "a section whose name mentions ascend, aicore or kernel: `{name}` (a name only: its bytes start with \
                 no ELF header, so it is not counted as a device object)"
            );
            let location = format!("section {name}");
            sink.push_once(Evidence::new(EvidenceClass::DeviceKernel, Check::Kernel, Stance::Mentions, what, location));
        }
        if section.kind() == object::SectionKind::Text {
            continue;
        }
        let read_only =
            matches!(section.kind(), object::SectionKind::ReadOnlyData | object::SectionKind::ReadOnlyString);
        if npu && (read_only || section.kind() == object::SectionKind::Data) {
            scan_device_blob(bytes, &format!("section {name}"), sink);
        }
        let mut at = 0;
        while embedded < MAX_EMBEDDED {
            let Some(found) = find(&bytes[at..], b"\x7fELF") else { break };
            let offset = at + found;
            at = offset + 4;
            let image = &bytes[offset..];
            let Some(machine) = elf_machine(image) else { continue };
            embedded += 1;
            if Some(machine) == own_machine {
                continue;
            }
            let location = format!("section {name} at offset {offset:#x}");
            if machine != NPU_ELF_MACHINE {
                let aarch64 = if machine == AICPU_ELF_MACHINE {
                    " (AArch64: the machine the Ascend runtime loads as AI-CPU kernels, and a Host library's too)"
                } else {
                    ""
                };
                let what = format!(
                    "embedded ELF for machine {machine:#06x}{aarch64} at offset {offset:#x} in {name}, not this \
                     file's machine {own_shown}: an image for another processor, not the NPU's \
                     {NPU_ELF_MACHINE:#06x}, so not counted as a device object"
                );
                sink.push_once(Evidence::new(
                    EvidenceClass::DeviceKernel,
                    Check::Kernel,
                    Stance::Mentions,
                    what,
                    location,
                ));
                continue;
            }
            let what = format!(
                "embedded ELF for machine {NPU_ELF_MACHINE:#06x} (EM_HIIPU, the NPU's AI Core) at offset {offset:#x} \
                 in {name}: a device object, so its symbols and strings are device code"
            );
            sink.push_once(
                Evidence::new(EvidenceClass::DeviceKernel, Check::Kernel, Stance::For, what, location.clone()).device(),
            );
            if let Ok(inner) = object::File::parse(image) {
                for symbol in inner.symbols().chain(inner.dynamic_symbols()) {
                    let Ok(raw) = symbol.name() else { continue };
                    let demangled = demangle(raw);
                    if let Some((class, check, what)) = classify_symbol(&demangled) {
                        let stance = if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                        let what = format!("{what}: symbol `{demangled}` of the embedded device object");
                        let location = format!("{location}, symbol {raw}");
                        sink.push_once(Evidence::new(class, check, stance, what, location).device());
                    }
                }
            }
            scan_device_blob(image, &location, sink);
        }
        if !npu && read_only {
            for (offset, text) in strings(bytes) {
                let location = format!("section {name} at offset {offset:#x}");
                if text.contains("op_impl/aicpu") {
                    let what = format!(
                        "a path into the runtime's AI-CPU op directory: `{text}` (it loads an AI-CPU kernel's \
                         registration; nothing here shows what that kernel does)"
                    );
                    let item = Evidence::new(
                        EvidenceClass::AiCpuKernel,
                        Check::AiCpuSubmission,
                        Stance::Neutral,
                        what,
                        location.clone(),
                    );
                    sink.push_once(if ai_cpu { item.ai_cpu() } else { item });
                }
                for (id, path) in identifiers(text) {
                    if let Some(op) = ops.op(id) {
                        if !ai_cpu {
                            sink.pending_op(id, op, format!("its name as a string in {name}"), location.clone());
                        }
                        continue;
                    }
                    let Some((class, check, what)) = classify_name(id, path) else { continue };
                    let item = match class {
                        EvidenceClass::HostSubmission | EvidenceClass::KernelLaunch => {
                            let stance =
                                if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                            let what = format!("{what}: string `{id}` (a name looked up at run time, or a message)");
                            Evidence::new(class, check, stance, what, location.clone())
                        }
                        EvidenceClass::Descriptor | EvidenceClass::Doorbell if ai_cpu => {
                            let what = format!("{what} in an AI-CPU kernel .so: string `{id}`");
                            Evidence::new(class, check, Stance::Against, what, location.clone()).ai_cpu()
                        }
                        _ => continue,
                    };
                    sink.push_once(item);
                }
            }
        }
    }
    Ok(())
}

/// Strings of a device object, by the name rules: all of them count as device code.
fn scan_device_blob(bytes: &[u8], location: &str, sink: &mut Sink) {
    for (offset, text) in strings(bytes) {
        for (id, path) in identifiers(text) {
            if let Some((class, check, what)) = classify_name(id, path) {
                let stance = if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                let what = format!("{what}: `{id}` in a device object");
                let location = format!("{location}, string at offset {offset:#x}");
                sink.push_once(Evidence::new(class, check, stance, what, location).device());
            }
        }
    }
}

fn mentions_device(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ["ascend", "aicore", "kernel"].iter().any(|word| lower.contains(word))
}

/// The e_machine of an ELF header at the start of `data`, read by `object`.
fn elf_machine(data: &[u8]) -> Option<u16> {
    use object::read::elf::FileHeader;
    match object::FileKind::parse(data).ok()? {
        object::FileKind::Elf32 => {
            let header = object::elf::FileHeader32::<object::Endianness>::parse(data).ok()?;
            Some(header.e_machine(header.endian().ok()?).0)
        }
        object::FileKind::Elf64 => {
            let header = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
            Some(header.e_machine(header.endian().ok()?).0)
        }
        _ => None,
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// Printable ASCII runs of at least 4 bytes, with their offsets.
fn strings(bytes: &[u8]) -> impl Iterator<Item = (usize, &str)> {
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < bytes.len() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_graphic() || bytes[i] == b' ') {
                i += 1;
            }
            if i - start >= 4 {
                // Printable ASCII is valid UTF-8.
                let text = std::str::from_utf8(&bytes[start..i]).unwrap_or("");
                i += 1;
                return Some((start, text));
            }
            i += 1;
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cxx_runtime_symbols_and_names_are_told_apart() {
        for raw in ["_ZGVN3ock2mf3env16ASCEND_HOME_PATHE", "_ZTVN8mooncake21AscendDirectTransportE", "_ZTSN1a1bE"] {
            assert!(is_cxx_runtime_symbol(raw, &demangle(raw)), "{raw}");
        }
        assert!(!is_cxx_runtime_symbol("_ZN3ock2mf3env16ASCEND_HOME_PATHE", "ock::mf::env::ASCEND_HOME_PATH"));
        assert_eq!(launch_api_in("pAclrtLaunchKernelWithConfig"), Some("aclrtLaunchKernel"));
        assert_eq!(launch_api_in("gAscendAclLibName"), None);
        assert_eq!(own_name("ock::mf::DlAclApi::pAclrtBinaryGetFunction"), "pAclrtBinaryGetFunction");
    }
}
