//! Mooncake's gflags spellings (`-flag=value`) rewritten into what the parser takes, and transfer_engine_bench's
//! flags that mean nothing here dropped with a notice.

/// transfer_engine_bench's flags that mean nothing here (`mooncake-transfer-engine/example/transfer_engine_bench.cpp`:
/// RDMA NIC selection, topology discovery, the TENT backend, GPU memory), and the glog flags it links in. Accepted
/// and ignored, with a notice, so that scripts written for it run unchanged. `true` marks a boolean flag (gflags
/// takes its value only as `--flag=value`, or `--noflag`).
const MOONCAKE_ONLY_FLAGS: [(&str, bool); 19] = [
    ("nic_priority_matrix", false),
    ("auto_discovery", true),
    ("backend", false),
    ("use_vram", true),
    ("init_mem", true),
    ("gpu_id", false),
    ("logtostderr", true),
    ("alsologtostderr", true),
    ("colorlogtostderr", true),
    ("stderrthreshold", false),
    ("minloglevel", false),
    ("log_dir", false),
    ("log_prefix", true),
    ("logbuflevel", false),
    ("logbufsecs", false),
    ("max_log_size", false),
    ("stop_logging_if_full_disk", true),
    ("v", false),
    ("vmodule", false),
];

/// Rewrites gflags spellings into what the parser takes: `-flag` and `-flag=value` become `--flag` and
/// `--flag=value` (single-letter `-h`, `-V` stay short), and [`MOONCAKE_ONLY_FLAGS`] are dropped (with their value
/// when it is the next argument), each with a notice. Arguments after `--` are left alone.
pub(crate) fn gflags_argv(argv: Vec<std::ffi::OsString>) -> (Vec<std::ffi::OsString>, Vec<String>) {
    let mut out = Vec::with_capacity(argv.len());
    let mut notices = Vec::new();
    let mut args = argv.into_iter();
    if let Some(program) = args.next() {
        out.push(program);
    }
    // Whether the previous argument was a `--flag` (no `=`) that takes the next argument as its value.
    let mut value_next = false;
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            value_next = false;
            out.push(arg);
            continue;
        };
        if value_next || text == "--" || !text.starts_with('-') {
            value_next = false;
            if text == "--" {
                out.push(arg);
                out.extend(args);
                break;
            }
            out.push(arg);
            continue;
        }
        let long = match text.strip_prefix("--") {
            Some(rest) => rest.to_owned(),
            None => {
                let rest = &text[1..];
                let name_len = rest.find('=').unwrap_or(rest.len());
                let mooncake_short = MOONCAKE_ONLY_FLAGS.iter().any(|(flag, _)| *flag == &rest[..name_len]);
                if (name_len < 2 && !mooncake_short) || !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
                    out.push(arg);
                    continue;
                }
                rest.to_owned()
            }
        };
        let (name, inline_value) = match long.split_once('=') {
            Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
            None => (long.clone(), None),
        };
        let mooncake_only = MOONCAKE_ONLY_FLAGS
            .iter()
            .find(|(flag, boolean)| *flag == name || (*boolean && name.strip_prefix("no") == Some(flag)));
        if let Some((_, boolean)) = mooncake_only {
            let mut spelled = format!("--{name}");
            if let Some(value) = &inline_value {
                spelled.push_str(&format!("={value}"));
            } else if !boolean {
                if let Some(value) = args.next() {
                    spelled.push_str(&format!(" {}", value.to_string_lossy()));
                }
            }
            notices.push(format!("notice: {spelled}: a transfer_engine_bench flag with no effect here; ignored"));
            continue;
        }
        value_next = inline_value.is_none() && !matches!(name.as_str(), "help" | "version");
        out.push(format!("--{long}").into());
    }
    (out, notices)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(args: &[&str]) -> (Vec<String>, Vec<String>) {
        let argv = std::iter::once("aiv").chain(args.iter().copied()).map(Into::into).collect();
        let (out, notices) = gflags_argv(argv);
        (out.into_iter().skip(1).map(|a| a.into_string().expect("utf-8")).collect(), notices)
    }

    #[test]
    fn gflags_spellings_are_rewritten_and_mooncake_only_flags_dropped_with_a_notice() {
        let (out, notices) = rewrite(&["bench", "-duration=1", "-threads", "2", "--batch_size=4", "--block_size", "8"]);
        assert_eq!(out, ["bench", "--duration=1", "--threads", "2", "--batch_size=4", "--block_size", "8"]);
        assert!(notices.is_empty());
        let (out, notices) = rewrite(&[
            "bench",
            "--logtostderr",
            "--nic_priority_matrix",
            "m.json",
            "-gpu_id=-1",
            "-nouse_vram",
            "-v",
            "2",
            "--segment_id",
            "-odd-name",
            "-h",
        ]);
        assert_eq!(out, ["bench", "--segment_id", "-odd-name", "-h"]);
        assert_eq!(notices.len(), 5, "{notices:?}");
        assert!(notices[1].contains("--nic_priority_matrix m.json") && notices[1].contains("no effect"), "{notices:?}");
        let (out, _) = rewrite(&["bench", "--", "-duration=1"]);
        assert_eq!(out, ["bench", "--", "-duration=1"], "nothing after -- is rewritten");
    }
}
