//! AI-CPU ops: the ones public source shows (which submit copies from the AI CPU, which do not), the ones an input
//! registers with `opKernelLib=AICPUKernel` (`.ini` and `.json`), and the evidence of a registration.

use std::collections::BTreeMap;

use super::schema::{Check, Evidence, EvidenceClass, Stance};

/// AI-CPU ops whose public source shows them submitting the copies from the AI CPU: the op's name, and what its
/// body does, with the source.
const AICPU_COPY_OPS: &[(&str, &str)] = &[
    (
        "HixlBatchPut",
        "HiXL's AI-CPU batch write: its body hands the list to HCOMM's batch transfer on the AI-CPU thread \
         (hicann/hixl src/ops/hixl_kernel/hixl_batch_transfer.cc)",
    ),
    (
        "HixlBatchGet",
        "HiXL's AI-CPU batch read: its body hands the list to HCOMM's batch transfer on the AI-CPU thread \
         (hicann/hixl src/ops/hixl_kernel/hixl_batch_transfer.cc)",
    ),
    (
        "HixlFabricMemBatchRead",
        "HiXL FabricMem's AI-CPU batch read: its body builds STARS SDMA SQEs on the AI CPU and publishes them to the \
         RTSQ (hicann/hixl src/ops/hixl_kernel/fabric_mem_aicpu_kernel.cc, fabric_mem_stars_sdma.cc)",
    ),
    (
        "HixlFabricMemBatchWrite",
        "HiXL FabricMem's AI-CPU batch write: its body builds STARS SDMA SQEs on the AI CPU and publishes them to the \
         RTSQ (hicann/hixl src/ops/hixl_kernel/fabric_mem_aicpu_kernel.cc, fabric_mem_stars_sdma.cc)",
    ),
    (
        "HybmBatchRead",
        "MemFabric's AI-CPU batch read: its body hands the list to HCOMM's batch transfer on the AI-CPU thread \
         (memfabric_hybrid src/hybm/ops/hybm_kernel/hybm_batch_transfer.cc, in the public copy \
         NoCoder0/memfabric_hybrid)",
    ),
    (
        "HybmBatchWrite",
        "MemFabric's AI-CPU batch write: its body hands the list to HCOMM's batch transfer on the AI-CPU thread \
         (memfabric_hybrid src/hybm/ops/hybm_kernel/hybm_batch_transfer.cc, in the public copy \
         NoCoder0/memfabric_hybrid)",
    ),
];

/// AI-CPU ops known from public source that submit no copy themselves.
const AICPU_OTHER_OPS: &[(&str, &str)] = &[(
    "HixlSyncTransferContext",
    "HiXL's AI-CPU transfer-context op: it sets up the AI-CPU side's transfer context, no copy \
     (hicann/hixl src/ops/hixl_kernel/hixl_sync_transfer_context.cc)",
)];

/// One op registered with `opKernelLib=AICPUKernel` (a `.ini` section or a `.json` entry).
#[derive(Clone, Debug)]
pub(super) struct Registration {
    pub(super) op: String,
    pub(super) function: String,
    pub(super) kernel_so: String,
    /// `file:line` of the op's entry.
    pub(super) at: String,
}

/// The AI-CPU op registrations in reach of a component: the ones of its input (wheel or tree), and the ones given
/// as paths.
#[derive(Clone, Debug, Default)]
pub(super) struct AiCpuOps {
    registered: Vec<Registration>,
    /// Directories (as shown) holding a registration: the sources beside it are the AI-CPU kernel's.
    pub(super) dirs: BTreeMap<String, String>,
}

/// What an AI-CPU op name is.
#[derive(Clone, Copy)]
pub(super) enum AiCpuOp<'a> {
    /// One [`AICPU_COPY_OPS`] names: its body submits copies.
    Copy(&'static str),
    /// One [`AICPU_OTHER_OPS`] names.
    Other(&'static str),
    /// One an input registers, which public source does not show.
    Registered(&'a Registration),
}

impl AiCpuOps {
    pub(super) fn add(&mut self, shown: &str, registrations: Vec<Registration>) {
        if let Some(first) = registrations.first() {
            let dir = shown.rsplit_once('/').map_or("", |(dir, _)| dir).to_owned();
            self.dirs.entry(dir).or_insert_with(|| first.at.clone());
        }
        self.registered.extend(registrations);
    }

    /// The op this name (a function name, exactly) is, if any.
    pub(super) fn op(&self, name: &str) -> Option<AiCpuOp<'_>> {
        if let Some(&(_, what)) = AICPU_COPY_OPS.iter().find(|(op, _)| *op == name) {
            return Some(AiCpuOp::Copy(what));
        }
        if let Some(&(_, what)) = AICPU_OTHER_OPS.iter().find(|(op, _)| *op == name) {
            return Some(AiCpuOp::Other(what));
        }
        self.registered.iter().find(|r| r.function == name || r.op == name).map(AiCpuOp::Registered)
    }

    /// Whether `text` holds any op's name (a cheap look before demangling a symbol).
    pub(super) fn named_in(&self, text: &str) -> bool {
        AICPU_COPY_OPS.iter().chain(AICPU_OTHER_OPS).any(|(op, _)| text.contains(op))
            || self.registered.iter().any(|r| text.contains(&r.function) || text.contains(&r.op))
    }

    /// The registration whose `kernelSo` is this file name.
    pub(super) fn kernel_so(&self, file_name: &str) -> Option<&Registration> {
        self.registered.iter().find(|r| r.kernel_so == file_name)
    }
}

impl AiCpuOp<'_> {
    fn submits(self) -> bool {
        matches!(self, AiCpuOp::Copy(_))
    }

    pub(super) fn stance(self) -> Stance {
        if self.submits() {
            Stance::Against
        } else {
            Stance::Neutral
        }
    }

    /// What the op is, for evidence text.
    pub(super) fn describe(self) -> String {
        match self {
            AiCpuOp::Copy(what) => format!("{what}; so the AI CPU submits these copies"),
            AiCpuOp::Other(what) => format!("{what}; an AI-CPU kernel that submits no copy"),
            AiCpuOp::Registered(r) => format!(
                "registered as an AI-CPU op at {} (`{}` in `{}`); nothing here shows whether it submits copies",
                r.at, r.function, r.kernel_so
            ),
        }
    }
}

/// The `opKernelLib=AICPUKernel` entries of a `.ini` (`[Op]` sections of `opInfo.*` keys, as HiXL's
/// `libcann_hixl_kernel.ini`) or `.json` (`{"Op": {"opInfo": {...}}}`, as the runtime's AI-CPU op config) file.
pub(super) fn parse_registrations(shown: &str, extension: &str, text: &str) -> Vec<Registration> {
    if !text.contains("AICPUKernel") {
        return Vec::new();
    }
    let mut out = Vec::new();
    if extension == "ini" {
        let mut section: Option<(String, usize, BTreeMap<String, String>)> = None;
        let finish = |section: Option<(String, usize, BTreeMap<String, String>)>, out: &mut Vec<Registration>| {
            if let Some((op, line, keys)) = section {
                if keys.get("opInfo.opKernelLib").map(String::as_str) == Some("AICPUKernel") {
                    out.push(Registration {
                        function: keys.get("opInfo.functionName").cloned().unwrap_or_else(|| op.clone()),
                        kernel_so: keys.get("opInfo.kernelSo").cloned().unwrap_or_default(),
                        op,
                        at: format!("{shown}:{line}"),
                    });
                }
            }
        };
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if let Some(name) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
                finish(section.take(), &mut out);
                section = Some((name.trim().to_owned(), index + 1, BTreeMap::new()));
            } else if let (Some((key, value)), Some((_, _, keys))) = (line.split_once('='), section.as_mut()) {
                keys.insert(key.trim().to_owned(), value.trim().to_owned());
            }
        }
        finish(section, &mut out);
    } else if let Ok(serde_json::Value::Object(ops)) = serde_json::from_str::<serde_json::Value>(text) {
        for (op, entry) in &ops {
            let info = &entry["opInfo"];
            if info["opKernelLib"].as_str() != Some("AICPUKernel") {
                continue;
            }
            let quoted = format!("\"{op}\"");
            let line = text.lines().position(|l| l.contains(&quoted)).map_or(1, |i| i + 1);
            out.push(Registration {
                op: op.clone(),
                function: info["functionName"].as_str().unwrap_or(op).to_owned(),
                kernel_so: info["kernelSo"].as_str().unwrap_or_default().to_owned(),
                at: format!("{shown}:{line}"),
            });
        }
    }
    out
}

/// The evidence of one registration entry.
pub(super) fn registration_evidence(registration: &Registration, ops: &AiCpuOps) -> Evidence {
    let op = ops.op(&registration.function).unwrap_or(AiCpuOp::Registered(registration));
    let what = match op {
        AiCpuOp::Registered(_) => format!(
            "AI-CPU op `{}` registered with opKernelLib=AICPUKernel (function `{}` in `{}`): an AI-CPU kernel; \
             nothing here shows whether it submits copies",
            registration.op, registration.function, registration.kernel_so
        ),
        known => format!(
            "AI-CPU op `{}` registered with opKernelLib=AICPUKernel (function `{}` in `{}`): {}",
            registration.op,
            registration.function,
            registration.kernel_so,
            known.describe()
        ),
    };
    Evidence::new(EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, op.stance(), what, registration.at.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_are_read_from_ini_and_json() {
        let ini = "[HixlBatchPut]\nopInfo.opKernelLib=AICPUKernel\nopInfo.kernelSo=libcann_hixl_kernel.so\n\
                   opInfo.functionName=HixlBatchPut\n\n[NotAicpu]\nopInfo.opKernelLib=TBEKernel\n";
        let found = parse_registrations("ops/k.ini", "ini", ini);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].op.as_str(), found[0].function.as_str()), ("HixlBatchPut", "HixlBatchPut"));
        assert_eq!((found[0].kernel_so.as_str(), found[0].at.as_str()), ("libcann_hixl_kernel.so", "ops/k.ini:1"));
        let json = "{\n  \"Other\": {\"opInfo\": {\"opKernelLib\": \"TBEKernel\"}},\n  \"HybmBatchRead\": {\n    \
                    \"opInfo\": {\"functionName\": \"HybmBatchRead\", \"kernelSo\": \"libk.so\", \
                    \"opKernelLib\": \"AICPUKernel\"}\n  }\n}\n";
        let found = parse_registrations("k.json", "json", json);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].op.as_str(), found[0].at.as_str()), ("HybmBatchRead", "k.json:3"));
        assert!(parse_registrations("x.json", "json", "{\"a\": 1}").is_empty());
        assert!(parse_registrations("x.json", "json", "not json AICPUKernel").is_empty());
    }
}
