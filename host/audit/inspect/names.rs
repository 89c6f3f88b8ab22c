//! Names: the rules every scan applies to identifiers (Host copy calls, kernel launch APIs, completion polls,
//! descriptors, doorbells, the SHMEM device API), the device-kernel markers, and a line's identifiers.

use super::schema::{Check, EvidenceClass};

/// What a name (an identifier in source, a symbol, a string in a binary) says, if anything. `qualified` is the text
/// around it (the line, or the demangled symbol) for rules that need a qualifier.
pub(super) fn classify_name(name: &str, qualified: &str) -> Option<(EvidenceClass, Check, &'static str)> {
    use EvidenceClass as C;
    // Host submission.
    if name.starts_with("aclrtMemcpy") {
        return Some((C::HostSubmission, Check::HostSubmission, "Host copy call (ACL runtime memcpy)"));
    }
    if name.starts_with("HixlCSClientBatchPut") || name.starts_with("HixlCSClientBatchGet") {
        return Some((C::HostSubmission, Check::HostSubmission, "HiXL client batch transfer call (a Host API)"));
    }
    if matches!(name, "HcclBatchPut" | "HcclBatchGet" | "HcclPut" | "HcclGet") || name.starts_with("hcclMemcpy") {
        return Some((C::HostSubmission, Check::HostSubmission, "HCCL memory-transport call"));
    }
    if matches!(name, "TransferSync" | "TransferAsync")
        && (qualified.contains("AdxlEngine") || qualified.contains("adxl::"))
    {
        return Some((C::HostSubmission, Check::HostSubmission, "ADXL engine transfer call (a Host API)"));
    }
    // Kernel launch (Host side of check 1).
    if is_launch_api(name) {
        return Some((C::KernelLaunch, Check::Kernel, "kernel launch / device binary load API"));
    }
    // Completion (check 4), before the descriptor rule: `poll_cq` names a CQ.
    if name == "wait_flag" || name.contains("WaitFlag") || name == "poll_cq" || name.contains("PollCq") {
        return Some((C::DeviceCompletion, Check::Completion, "polls a completion flag or CQ"));
    }
    // Descriptors (check 2).
    if ["Sqe", "SQE", "Wqe", "WQE", "Cqe", "CQE"].iter().any(|part| name.contains(part))
        || name.split('_').any(|part| matches!(part, "sqe" | "sqes" | "wqe" | "wqes" | "cqe" | "cqes"))
    {
        return Some((C::Descriptor, Check::Descriptors, "SQE/WQE/CQE descriptor structure"));
    }
    // Doorbell (check 3).
    if name.to_ascii_lowercase().contains("doorbell") || name == "sq_tail" || name == "db_reg" {
        return Some((C::Doorbell, Check::Doorbell, "doorbell write (doorbell / SQ tail register)"));
    }
    // The SHMEM device API (checks 2-3: the library's device code writes descriptors and rings doorbells).
    if name.starts_with("aclshmem") || name.starts_with("shmem_") {
        return Some((C::ShmemDeviceApi, Check::Descriptors, "SHMEM device API call"));
    }
    None
}

/// The launch and device-binary APIs, by the start of their names.
const LAUNCH_APIS: &[&str] = &["aclrtLaunchKernel", "aclrtBinaryLoad", "aclrtBinaryGetFunction", "rtKernelLaunch"];

fn is_launch_api(name: &str) -> bool {
    LAUNCH_APIS.iter().any(|api| name.starts_with(api))
}

/// The launch API a variable's name is made of (`pAclrtLaunchKernelWithConfig`, `g_rtKernelLaunch`), if any.
pub(super) fn launch_api_in(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    LAUNCH_APIS.iter().copied().find(|api| lower.contains(&api.to_ascii_lowercase()))
}

/// Device-kernel markers of AscendC/CCE device code, as identifiers.
pub(super) fn device_marker(name: &str) -> Option<&'static str> {
    match name {
        "__aicore__" => Some("`__aicore__` function qualifier"),
        "__gm__" => Some("`__gm__` global-memory qualifier"),
        "GetBlockIdx" => Some("`GetBlockIdx` (AIV block index)"),
        _ if name.starts_with("KERNEL_TYPE_") => Some("AscendC kernel-type marker"),
        _ if name.starts_with("__DAV_") => Some("CCE target marker (`__DAV_*`)"),
        _ => None,
    }
}

/// The identifiers of a line, `::`-qualified paths kept whole as well.
pub(super) fn identifiers(line: &str) -> Vec<(&str, &str)> {
    // (identifier, the path it ends, e.g. `adxl::AdxlEngine::TransferSync`)
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut path_start: Option<usize> = None;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let begin = path_start.unwrap_or(start);
            out.push((&line[start..i], &line[begin..i]));
            if bytes.get(i) == Some(&b':') && bytes.get(i + 1) == Some(&b':') {
                path_start = Some(begin);
                i += 2;
            } else {
                path_start = None;
            }
        } else if c.is_ascii_digit() {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            path_start = None;
        } else {
            path_start = None;
            i += 1;
        }
    }
    out
}
