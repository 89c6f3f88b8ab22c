//! Source files: device-kernel markers and the device-qualifier macros a tree defines, which files are AI-CPU code,
//! and the scan of one file's lines by the name rules (with `dcci` near a poll).

use std::collections::{BTreeSet, HashMap};

use super::aicpu::AiCpuOps;
use super::names::{classify_name, device_marker, identifiers};
use super::schema::{Check, Evidence, EvidenceClass, Stance};
use super::verdict::Sink;
use super::DCCI_NEAR_LINES;

pub(super) struct SourceFile {
    /// The name shown in locations (relative to the root, or as given).
    pub(super) shown: String,
    pub(super) extension: String,
    pub(super) text: String,
}

/// Macros some file defines as a device qualifier (`#define AIV_DEVICE_FN __aicore__ static inline`): their uses are
/// device-kernel markers too. Name -> where it is defined.
pub(super) fn device_macros(files: &[SourceFile]) -> HashMap<String, String> {
    let mut macros = HashMap::new();
    for file in files {
        for (index, line) in file.text.lines().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix('#') else { continue };
            let Some(rest) = rest.trim_start().strip_prefix("define") else { continue };
            let ids = identifiers(rest);
            let Some(&(name, _)) = ids.first() else { continue };
            if device_marker(name).is_none() && ids[1..].iter().any(|&(id, _)| device_marker(id).is_some()) {
                macros.entry(name.to_owned()).or_insert_with(|| format!("{}:{}", file.shown, index + 1));
            }
        }
    }
    macros
}

fn is_comment_line(line: &str, extension: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("//") || t.starts_with("/*") || t.starts_with('*') || (extension == "py" && t.starts_with('#'))
}

/// The device-kernel markers of one line outside the name rules: `AscendC::`, `kernel_operator.h`, `__global__`
/// next to aicore.
fn line_markers(line: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    if line.contains("AscendC::") {
        found.push("`AscendC::` API");
    }
    if line.contains("#include") && line.contains("kernel_operator.h") {
        found.push("includes the AscendC `kernel_operator.h`");
    }
    if line.contains("__global__") && line.contains("aicore") {
        found.push("`__global__` kernel entry on the aicore");
    }
    found
}

/// Whether `id` (a slice of `line`) is the name of a function defined on this line: a type before it, `(` after it,
/// and no `;` ending the line (`uint32_t HixlBatchPut(HixlOneSideOpParam *param) {`).
fn defines(line: &str, id: &str) -> bool {
    let start = id.as_ptr() as usize - line.as_ptr() as usize;
    let before = line[..start].trim_end();
    let after = line[start + id.len()..].trim_start();
    let typed = before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '*' || c == '&');
    let keyword = ["return", "else", "case"].iter().any(|k| before.ends_with(k));
    typed && !keyword && after.starts_with('(') && !line.trim_end().ends_with(';')
}

/// Why a source file is AI-CPU code, if it is: it lies beside an AI-CPU op registration, or it defines an AI-CPU op.
fn ai_cpu_code_of(file: &SourceFile, ops: &AiCpuOps) -> Option<String> {
    let dir = file.shown.rsplit_once('/').map_or("", |(dir, _)| dir);
    if let Some(at) = ops.dirs.get(dir) {
        return Some(format!("beside the AI-CPU op registration at {at}"));
    }
    for line in file.text.lines() {
        if is_comment_line(line, &file.extension) {
            continue;
        }
        for (id, _) in identifiers(line) {
            if ops.op(id).is_some() && defines(line, id) {
                return Some(format!("defines the AI-CPU op `{id}`"));
            }
        }
    }
    None
}

pub(super) fn scan_source(file: &SourceFile, macros: &HashMap<String, String>, ops: &AiCpuOps, sink: &mut Sink) {
    let lines: Vec<&str> = file.text.lines().collect();
    // Device code: device-kernel markers outside comments.
    let device_code = lines.iter().any(|line| {
        !is_comment_line(line, &file.extension)
            && (!line_markers(line).is_empty()
                || identifiers(line).iter().any(|&(id, _)| device_marker(id).is_some() || macros.contains_key(id)))
    });
    // AI-CPU code: the sources of an AI-CPU kernel (device code wins: an AIV kernel is not an AI-CPU one).
    let ai_cpu_code = if device_code { None } else { ai_cpu_code_of(file, ops) };
    let mut polls = Vec::new();
    let mut dccis = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let in_comment = is_comment_line(line, &file.extension);
        let location = format!("{}:{}", file.shown, index + 1);
        let mut on_line = BTreeSet::new();
        let mut add = |sink: &mut Sink, class, check, what: String, stance| {
            if on_line.insert((class, what.clone())) {
                sink.push(Evidence {
                    class,
                    check,
                    for_or_against: stance,
                    what,
                    location: location.clone(),
                    in_comment,
                    in_device_code: device_code,
                    in_ai_cpu_code: ai_cpu_code.is_some(),
                });
            }
        };
        for marker in line_markers(line) {
            add(sink, EvidenceClass::DeviceKernel, Check::Kernel, marker.to_owned(), Stance::For);
        }
        let ids = identifiers(line);
        let lower = line.to_ascii_lowercase();
        if lower.contains("cqe") && (lower.contains("owner") || lower.contains("phase")) {
            let what = "polls a CQE's owner/phase bit".to_owned();
            let stance = if device_code { Stance::For } else { Stance::Neutral };
            add(sink, EvidenceClass::DeviceCompletion, Check::Completion, what, stance);
            polls.push(index);
        }
        for &(id, path) in &ids {
            if let Some(what) = device_marker(id) {
                add(sink, EvidenceClass::DeviceKernel, Check::Kernel, format!("{what}: `{id}`"), Stance::For);
            } else if let Some(defined) = macros.get(id) {
                let what = format!("`{id}`, a device qualifier (defined at {defined})");
                add(sink, EvidenceClass::DeviceKernel, Check::Kernel, what, Stance::For);
            } else if id == "dcci" {
                dccis.push(index);
            } else if let Some(op) = ops.op(id) {
                match &ai_cpu_code {
                    // An op's body: the file is the AI-CPU kernel's.
                    Some(_) if defines(line, id) => {
                        let what = format!("defines the AI-CPU op `{id}` in AI-CPU code: {}", op.describe());
                        add(sink, EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, what, op.stance());
                    }
                    // Its name elsewhere in its own kernel (a log message, a declaration): nothing more.
                    Some(_) => {}
                    None if in_comment => {
                        let what = format!("names the AI-CPU op `{id}` in a comment: a name only");
                        add(sink, EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, what, Stance::Mentions);
                    }
                    None => sink.pending_op(id, op, "its name in Host code".to_owned(), location.clone()),
                }
            } else if let Some((class, check, what)) = classify_name(id, if path.contains("::") { path } else { line })
            {
                let stance = match class {
                    EvidenceClass::HostSubmission => Stance::Against,
                    EvidenceClass::KernelLaunch => Stance::For,
                    _ if device_code => Stance::For,
                    // Descriptors written and doorbells rung by an AI-CPU kernel: against the AIV doing it.
                    EvidenceClass::Descriptor | EvidenceClass::Doorbell if ai_cpu_code.is_some() => Stance::Against,
                    _ => Stance::Neutral,
                };
                if class == EvidenceClass::DeviceCompletion {
                    polls.push(index);
                }
                let shown = if path.contains("::") { path } else { id };
                let what = match (&ai_cpu_code, stance) {
                    (Some(why), Stance::Against) if class != EvidenceClass::HostSubmission => {
                        format!("{what} in AI-CPU code (this file {why}): `{shown}`")
                    }
                    _ => format!("{what}: `{shown}`"),
                };
                add(sink, class, check, what, stance);
            }
        }
    }
    // `dcci` near a poll: the cache maintenance that makes the polled word's new value visible.
    for &index in &dccis {
        if let Some(&poll) = polls.iter().find(|&&p| p.abs_diff(index) <= DCCI_NEAR_LINES) {
            let in_comment = is_comment_line(lines[index], &file.extension);
            sink.push(Evidence {
                class: EvidenceClass::DeviceCompletion,
                check: Check::Completion,
                for_or_against: if device_code { Stance::For } else { Stance::Neutral },
                what: format!("`dcci` cache maintenance near the poll at line {}", poll + 1),
                location: format!("{}:{}", file.shown, index + 1),
                in_comment,
                in_device_code: device_code,
                in_ai_cpu_code: ai_cpu_code.is_some(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_is_told_from_a_call_and_a_declaration() {
        let check = |line: &str, name: &str| {
            let id = identifiers(line).into_iter().map(|(id, _)| id).find(|&id| id == name).expect("the name");
            defines(line, id)
        };
        assert!(check("uint32_t HixlBatchPut(HixlOneSideOpParam *param) {", "HixlBatchPut"));
        assert!(check("extern \"C\" unsigned *HixlBatchGet(", "HixlBatchGet"));
        assert!(!check("uint32_t HixlBatchPut(HixlOneSideOpParam *param);", "HixlBatchPut"));
        assert!(!check("    ret = HybmBatchRead(&readParam);", "HybmBatchRead"));
        assert!(!check("    return HybmBatchRead(param)", "HybmBatchRead"));
        assert!(!check("constexpr const char *kPut = \"HixlBatchPut\";", "HixlBatchPut"));
    }
}
