//! The audit's Mooncake paths: Mooncake's own Ascend Direct, the unmodified `mooncake-transfer-engine-npu` wheel, in
//! two processes of its own (target and initiator) per path, driven over line-oriented JSON, in the same rounds and
//! on the same workloads as the engine paths. Two paths, the same wheel and driver, told apart only by the library
//! directory first on their processes' `LD_LIBRARY_PATH` ([`Variant`]):
//!
//! - `mooncake-ascend`: the twin runtime's CANN libraries, whose `libllm_datadist.so` is the twin's HiXL model of
//!   `adxl::AdxlEngine` (tests/support/twin_cann_libs.sh);
//! - `mooncake-ascend+aiv`: `libllm_datadist.so` over aiv, this project's engine with protocol aiv as
//!   `adxl::AdxlEngine` (tests/support/mooncake_over_aiv.sh), with the twin's `libascendcl.so` and `libmetadef.so`.
//!
//! Owns the paths' names, their slots in each round's order ([`round_order_with`]), what the report says of them
//! (layout, caveats, cell statistics). The rest, by concern: [`discover`] (the wheel and the libraries), [`driver`]
//! (one driver process and its protocol), [`session`] (the two processes, the cells, the data check), [`faults`]
//! (the error-recovery rounds), [`counts`] (the verdict from the twin's counts). docs/audit.md, "The Mooncake
//! paths".

mod counts;
mod discover;
mod driver;
mod faults;
mod session;

pub use counts::{evidence_spec, tally_from_counts, TwinCounts};
pub use discover::{discover, discover_over_aiv, discover_variant, MooncakeSetup, INSTALL_HINT, OVER_AIV_HINT};
pub(crate) use session::Session;

use super::report::{self, MooncakeRecord, RoundResult, SkippedWorkload, Workload};
use crate::transfer::Protocol;

/// `mooncake-ascend`'s name in reports and in `--paths`.
pub const PATH: &str = "mooncake-ascend";

/// `mooncake-ascend+aiv`'s name in reports and in `--paths`.
pub const PATH_OVER_AIV: &str = "mooncake-ascend+aiv";

/// Requests of 1 MiB in the `killed_peer` fault round's batch.
const BIG_BATCH: u64 = 2048;

/// Which `libllm_datadist.so` a Mooncake path's processes load, and so which path it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// `mooncake-ascend`: the twin's HiXL model of `adxl::AdxlEngine`.
    TwinHixl,
    /// `mooncake-ascend+aiv`: this project's engine with protocol aiv as `adxl::AdxlEngine`.
    OverAiv,
}

impl Variant {
    /// Every variant, in the order their slots follow the engine paths in the first round.
    pub const ALL: [Variant; 2] = [Variant::TwinHixl, Variant::OverAiv];

    /// The path's name in reports and in `--paths`.
    pub fn path(self) -> &'static str {
        match self {
            Variant::TwinHixl => PATH,
            Variant::OverAiv => PATH_OVER_AIV,
        }
    }

    /// The variant `--paths` names with `name`, if it names one.
    pub fn from_path(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|variant| variant.path() == name)
    }

    /// The reason under "Not run" when nobody asked for the path (the library's default; `aiv audit` looks for it).
    pub fn not_configured(self) -> String {
        match self {
            Variant::TwinHixl => "Mooncake's own Ascend Direct (the mooncake-transfer-engine-npu wheel on the twin \
                 runtime) was not configured: the audit needs its virtualenv and the twin's CANN libraries"
                .into(),
            Variant::OverAiv => "Mooncake's own Ascend Direct over aiv (the mooncake-transfer-engine-npu wheel with \
                 libllm_datadist.so over aiv) was not configured: the audit needs its virtualenv and the directory of \
                 tests/support/mooncake_over_aiv.sh"
                .into(),
        }
    }

    /// What the report's layout sentence adds when the path runs.
    pub fn layout(self) -> String {
        let adxl = match self {
            Variant::TwinHixl => "the twin's HiXL model",
            Variant::OverAiv => "this project's engine with protocol aiv",
        };
        format!(
            "; {} runs Mooncake's own wheel in two processes of its own (Python, target and initiator, each its own \
             copy of the twin runtime, device 0; adxl::AdxlEngine {adxl}), between two device buffers of the same \
             size, with the same request lists sent to its initiator, in the same rounds",
            self.path()
        )
    }
}

/// One slot of a round's order: an engine path, or the Mooncake path at this index of the audit's Mooncake sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Engine(Protocol),
    Mooncake(usize),
}

/// The first round's order, the engine paths then `mooncake` Mooncake paths (in the order of their sessions),
/// rotated left by `round`.
pub fn round_order_with(paths: &[Protocol], mooncake: usize, round: usize) -> Vec<Slot> {
    let mut all: Vec<Slot> = paths.iter().map(|&p| Slot::Engine(p)).chain((0..mooncake).map(Slot::Mooncake)).collect();
    if !all.is_empty() {
        let by = round % all.len();
        all.rotate_left(by);
    }
    all
}

/// What the path's figures count, for the report.
fn caveats(variant: Variant) -> Vec<String> {
    let mut caveats = Vec::new();
    if variant == Variant::OverAiv {
        caveats.push(
            "The wheel's libllm_datadist.so is this project's engine with protocol aiv (host/capi/cxx/\
             adxl_over_aiv.cpp on libaiv_transport.so built with feature cann), driving the twin libascendcl.so its \
             process loaded; the wheel, its Python binding and its Ascend transport are unmodified."
                .into(),
        );
        caveats.push(
            "Between its own cells its processes are not idle: the aiv kernel stays resident on each process's twin \
             AIV cores, whose device-model threads poll and take CPU from the other paths' cells on a small machine."
                .into(),
        );
    }
    caveats.extend([
        "Separate processes: the wheel runs in two Python processes of its own (target and initiator), each with its \
         own copy of the twin runtime, on its device 0; the engine paths run in this process. Same twin device \
         memory model (aclrtMalloc memory reached only through the runtime's copies), same buffer size, same \
         request lists (built here and sent to the initiator), same rounds, interleaved."
            .to_owned(),
        "Host CPU per transfer (process) is the Host CPU of both Mooncake processes during the cell: \
         getrusage(RUSAGE_SELF) less the run time of their cann-twin-* threads (the device model), so the Python \
         loop and the interpreter are counted; (path) is the initiator process alone."
            .to_owned(),
        "Latency is per batch as the driver times it around batch_transfer_sync_read/write (Python's \
         perf_counter_ns), at most 200,000 batches a cell."
            .to_owned(),
        "The library directories tests/support/twin_cann_libs.sh and tests/support/mooncake_over_aiv.sh build hold \
         unoptimised builds (cargo's dev profile) of the twin's libascendcl.so and of libaiv_transport.so, while the \
         engine paths run the code of this binary as it was built."
            .to_owned(),
        "The verdict comes from the twin runtime's counts in those processes (cannTwinEvidence, twin-only), summed \
         over the cells: whole-process deltas, not per-transfer records. Twin runtime, unverified on hardware."
            .to_owned(),
    ]);
    caveats
}

/// The path's figures for one workload, by the same statistics as every engine path's
/// ([`report::WorkloadReport::new`], with the same round's memcpy reference for `vs_memcpy`).
pub(crate) fn cell_stats(
    workload: &report::WorkloadReport,
    variant: Variant,
    rounds: Vec<RoundResult>,
    latencies: &hdrhistogram::Histogram<u64>,
) -> report::CellStats {
    let one = report::WorkloadReport::new(
        workload.workload.clone(),
        // A placeholder protocol: only the statistics are taken, and the name is replaced below.
        &[Protocol::Aiv],
        vec![rounds],
        std::slice::from_ref(latencies),
        workload.memcpy_rounds.clone(),
    );
    let mut cell = one.paths.into_iter().next().expect("one path in, one cell out");
    cell.path = variant.path().into();
    cell
}

/// Files that the path does not run `workload`, with the reason.
pub(crate) fn skip_workload(record: &mut MooncakeRecord, workload: &Workload, reason: String) {
    record.skipped_workloads.push(SkippedWorkload { workload: workload.name(), reason });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::Opcode;
    use serde_json::json;

    #[test]
    fn the_mooncake_slots_rotate_with_the_engine_paths() {
        use Slot::{Engine as E, Mooncake as M};
        let (aiv, tcp) = (Protocol::Aiv, Protocol::Tcp);
        let paths = [aiv, tcp];
        assert_eq!(round_order_with(&paths, 0, 1), [E(tcp), E(aiv)]);
        assert_eq!(round_order_with(&paths, 1, 0), [E(aiv), E(tcp), M(0)]);
        assert_eq!(round_order_with(&paths, 1, 1), [E(tcp), M(0), E(aiv)]);
        assert_eq!(round_order_with(&paths, 1, 2), [M(0), E(aiv), E(tcp)]);
        assert_eq!(round_order_with(&paths, 1, 4), [E(tcp), M(0), E(aiv)]);
        // Both Mooncake paths: each takes a slot of its own in every round, and every slot moves.
        assert_eq!(round_order_with(&paths, 2, 0), [E(aiv), E(tcp), M(0), M(1)]);
        assert_eq!(round_order_with(&paths, 2, 3), [M(1), E(aiv), E(tcp), M(0)]);
        assert_eq!(round_order_with(&[], 2, 1), [M(1), M(0)]);
        assert!(round_order_with(&[], 0, 3).is_empty());
    }

    #[test]
    fn the_variants_are_named_as_in_paths() {
        assert_eq!(Variant::from_path("mooncake-ascend"), Some(Variant::TwinHixl));
        assert_eq!(Variant::from_path("mooncake-ascend+aiv"), Some(Variant::OverAiv));
        assert_eq!(Variant::from_path("aiv"), None);
        assert!(Variant::OverAiv.layout().starts_with("; mooncake-ascend+aiv runs"));
        assert!(caveats(Variant::OverAiv)[0].contains("adxl_over_aiv.cpp"));
        assert!(Variant::OverAiv.not_configured().contains("tests/support/mooncake_over_aiv.sh"));
    }

    #[test]
    fn bench_lists_follow_run_initiator_s_layout() {
        let lists = session::bench_lists(Opcode::Write, &Workload::bench(4096, 2, 2));
        assert_eq!(lists.len(), 2);
        assert_eq!(lists[1][0], json!([["write", 4096, 4096, 4096], ["write", 12288, 12288, 4096]]));
    }
}
