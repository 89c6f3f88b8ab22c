//! What an audit runs: the workload matrices, the options and their checks, and the order of the paths in each round.

use std::time::Duration;

use super::{alloc, cross_host, mooncake, report, Workload};
use crate::error::{EngineError, Result};
use crate::transfer::{Opcode, Protocol};

/// The KV cache of the matrices: 8 layers (a slice of a Llama-style model, to keep the buffers at 32 MiB a side),
/// 16 tokens per block, 8 KV heads of dimension 128 in fp16 (32 KiB blocks), 64 blocks in the cache, a request of
/// 8 blocks (128 tokens): 128 transfers of 32 KiB (4 MiB) per batch.
pub const DEFAULT_KV: report::KvCache = report::KvCache {
    layers: 8,
    tokens_per_block: 16,
    kv_heads: 8,
    head_dim: 128,
    dtype_bytes: 2,
    cache_blocks: 64,
    request_blocks: 8,
    seed: 1,
};

/// The default matrix (`--quick`): small-transfer latency, and bandwidth at 64 KiB and 1 MiB.
pub fn quick_workloads() -> Vec<Workload> {
    vec![
        Workload::bench(4 << 10, 1, 1),
        Workload::bench(64 << 10, 32, 1),
        Workload::bench(1 << 20, 8, 1),
        Workload::kv_request(DEFAULT_KV),
    ]
}

/// The complete matrix (`--full`): block sizes 4 KiB to 16 MiB (batches of up to 8 MiB, at most 32 requests), and
/// small transfers batched and from two threads.
pub fn full_workloads() -> Vec<Workload> {
    let mut workloads = vec![
        Workload::bench(4 << 10, 1, 1),
        Workload::bench(4 << 10, 16, 2),
        Workload::kv_request(DEFAULT_KV),
        Workload::kv_layerwise(DEFAULT_KV, 500),
        Workload::store(64, 4 << 10, 64 << 10, 2),
    ];
    for shift in [12u32, 14, 16, 18, 20, 22, 24] {
        let block_size = 1u64 << shift;
        let batch_size = ((8u64 << 20) / block_size).clamp(1, 32) as usize;
        workloads.push(Workload::bench(block_size, batch_size, 1));
    }
    workloads
}

/// What to run.
#[derive(Clone, Debug)]
pub struct AuditOptions {
    /// The paths, in the order of the first round.
    pub paths: Vec<Protocol>,
    pub workloads: Vec<Workload>,
    /// Rounds per workload: each visits every path once.
    pub rounds: usize,
    /// How long one path runs one workload in one round.
    pub cell: Duration,
    /// How long the memcpy reference runs per workload and round.
    pub reference: Duration,
    pub operation: Opcode,
    /// The command line, recorded in the report so that a reviewer can rerun it.
    pub command: Vec<String>,
    /// The text of the mooncake.json the configuration was read from, if one was (recorded too).
    pub config_file: Option<String>,
    /// Whether the error-recovery rounds run after the workloads.
    pub faults: bool,
    /// The environment variables the configuration read (recorded for a rerun).
    pub config_env: std::collections::BTreeMap<String, String>,
    /// The report this run repeats (`aiv audit --rerun`), if it does.
    pub rerun_of: Option<report::RerunOf>,
    /// The `aiv` binary the `killed_peer` round runs as a target in another process (`None`: that round is not
    /// injected, and says why).
    pub peer_program: Option<std::path::PathBuf>,
    /// Whether allocation success is measured after the workloads (and the faults).
    pub allocation: bool,
    /// The heap to request per memory kind (`None`: `aiv.hbm_size`).
    pub alloc_request: Option<u64>,
    /// Mooncake's own Ascend Direct (`mooncake-ascend`), run besides `paths` when set: its wheel and the twin's
    /// libraries ([`mooncake::discover`]). It takes a slot in every round's order, after the engine paths in the
    /// first round.
    pub mooncake: Option<mooncake::MooncakeSetup>,
    /// Why `mooncake-ascend` is not run, when `mooncake` is `None` (recorded under "Not run").
    pub mooncake_skipped: Option<String>,
    /// Mooncake's own Ascend Direct over aiv (`mooncake-ascend+aiv`), run besides `paths` when set: the same wheel
    /// with the directory of tests/support/mooncake_over_aiv.sh ([`mooncake::discover_over_aiv`]). Its slot follows
    /// `mooncake-ascend`'s in the first round.
    pub mooncake_over_aiv: Option<mooncake::MooncakeSetup>,
    /// Why `mooncake-ascend+aiv` is not run, when `mooncake_over_aiv` is `None` (recorded under "Not run").
    pub mooncake_over_aiv_skipped: Option<String>,
    /// `--trace`: after each workload's measured rounds, one traced cell per path, written as a Chrome trace file.
    pub trace: bool,
    /// `--cross-host`: after everything else, aiv against tcp between two network namespaces (`None`: not run).
    pub cross_host: Option<cross_host::CrossHostOptions>,
    /// A test hook (`AIV_AUDIT_INJECT_WARNING` of `aiv audit`): a fault's name; each round of that fault logs one
    /// warning it does not declare, which must print and be recorded as unexpected (docs/audit.md, "Warnings").
    pub inject_warning: Option<String>,
}

impl AuditOptions {
    /// `--quick`: every path, the quick matrix, 5 rounds of 1 s cells; the CLI then fits the cells to
    /// [`QUICK_CELL_BUDGET`] ([`AuditOptions::fit_quick_budget`]).
    pub fn quick() -> AuditOptions {
        AuditOptions {
            paths: vec![Protocol::Aiv, Protocol::Adxl, Protocol::AdxlFabric, Protocol::Ubshmem, Protocol::Tcp],
            workloads: quick_workloads(),
            rounds: 5,
            cell: Duration::from_secs(1),
            reference: Duration::from_millis(200),
            operation: Opcode::Read,
            command: Vec::new(),
            config_file: None,
            faults: true,
            config_env: std::collections::BTreeMap::new(),
            rerun_of: None,
            peer_program: None,
            allocation: true,
            alloc_request: None,
            mooncake: None,
            mooncake_skipped: None,
            mooncake_over_aiv: None,
            mooncake_over_aiv_skipped: None,
            trace: false,
            cross_host: None,
            inject_warning: None,
        }
    }

    /// `--quick`'s time budget: the cells share [`QUICK_CELL_BUDGET`] (1 s each at most, 0.5 s at least), so that
    /// a quick audit takes about 90 s on two cores with or without `mooncake-ascend`. For options left as
    /// [`AuditOptions::quick`] made them but for the paths.
    pub fn fit_quick_budget(&mut self) {
        let slots = self.paths.len() + self.mooncake_setups().len();
        let cells = (slots * self.workloads.len() * self.rounds).max(1) as u32;
        self.cell = (QUICK_CELL_BUDGET / cells).clamp(Duration::from_millis(500), Duration::from_secs(1));
    }

    /// The Mooncake paths to run, in the order of their slots: `mooncake-ascend`, then `mooncake-ascend+aiv`.
    pub fn mooncake_setups(&self) -> Vec<&mooncake::MooncakeSetup> {
        [self.mooncake.as_ref(), self.mooncake_over_aiv.as_ref()].into_iter().flatten().collect()
    }

    /// Why the Mooncake path `variant` is not run (`None`: it is).
    pub fn mooncake_skip_reason(&self, variant: mooncake::Variant) -> Option<String> {
        let (setup, skipped) = match variant {
            mooncake::Variant::TwinHixl => (&self.mooncake, &self.mooncake_skipped),
            mooncake::Variant::OverAiv => (&self.mooncake_over_aiv, &self.mooncake_over_aiv_skipped),
        };
        match setup {
            Some(_) => None,
            None => Some(skipped.clone().unwrap_or_else(|| variant.not_configured())),
        }
    }

    /// `--full`: every path, the full matrix, 7 rounds of 1 s cells.
    pub fn full() -> AuditOptions {
        AuditOptions { workloads: full_workloads(), rounds: 7, ..AuditOptions::quick() }
    }

    /// Checks the options; the error names what is wrong.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| EngineError::InvalidArgument { operation: "audit", reason };
        if self.paths.is_empty() && self.mooncake_setups().is_empty() {
            return Err(invalid("no path to audit (--paths is empty)".into()));
        }
        for (setup, variant) in
            [(&self.mooncake, mooncake::Variant::TwinHixl), (&self.mooncake_over_aiv, mooncake::Variant::OverAiv)]
        {
            if let Some(setup) = setup.as_ref().filter(|setup| setup.variant != variant) {
                return Err(invalid(format!(
                    "the {} setup was given where {} belongs",
                    setup.variant.path(),
                    variant.path()
                )));
            }
        }
        for (i, path) in self.paths.iter().enumerate() {
            if self.paths[..i].contains(path) {
                return Err(invalid(format!("path {} is listed twice", path.as_str())));
            }
        }
        if self.workloads.is_empty() {
            return Err(invalid("no workload to run".into()));
        }
        if let Some(fault) = self.inject_warning.as_deref().filter(|f| !super::faults::FAULTS.contains(f)) {
            return Err(invalid(format!(
                "AIV_AUDIT_INJECT_WARNING {fault:?} names no error-recovery round: one of {}",
                super::faults::FAULTS.join(", ")
            )));
        }
        if let Some(request) = self.alloc_request {
            if !(alloc::MIN_CHUNK..=64 << 30).contains(&request) {
                return Err(invalid(format!("--alloc-request {request} is outside 1 MiB to 64 GiB")));
            }
        }
        if self.rounds == 0 || self.rounds > 1000 {
            return Err(invalid(format!("--rounds {} is outside 1 to 1000", self.rounds)));
        }
        if self.cell < Duration::from_millis(10) || self.cell > Duration::from_secs(600) {
            return Err(invalid(format!("--cell-seconds {:?} is outside 0.01 to 600 s", self.cell)));
        }
        for workload in &self.workloads {
            match &workload.shape {
                Some(report::Shape::KvLayerwise { compute_us, .. }) if *compute_us > 100_000 => {
                    return Err(invalid(format!("workload {}: compute above 100 ms per layer", workload.name())));
                }
                Some(report::Shape::KvRequest(kv)) | Some(report::Shape::KvLayerwise { cache: kv, .. }) => {
                    let dims =
                        [kv.layers, kv.tokens_per_block, kv.kv_heads, kv.head_dim, kv.dtype_bytes, kv.cache_blocks];
                    if dims.contains(&0) || kv.request_blocks == 0 || kv.request_blocks > kv.cache_blocks {
                        return Err(invalid(format!(
                            "workload {}: every KV dimension must be positive and a request at most the cache",
                            workload.name()
                        )));
                    }
                }
                Some(report::Shape::Store { objects, min_bytes, max_bytes, .. })
                    if *objects == 0 || *min_bytes == 0 || min_bytes > max_bytes =>
                {
                    return Err(invalid(format!(
                        "workload {}: objects and sizes must be positive, the smallest at most the largest",
                        workload.name()
                    )));
                }
                _ => {}
            }
            if workload.block_size == 0 || workload.batch_size == 0 || workload.threads == 0 {
                return Err(invalid(format!("workload {}: sizes and counts must be positive", workload.name())));
            }
            if workload.span() > MAX_SPAN {
                return Err(invalid(format!(
                    "workload {}: block x batch x threads = {} bytes is above the audit's {} per buffer",
                    workload.name(),
                    workload.span(),
                    report::size_name(MAX_SPAN)
                )));
            }
        }
        Ok(())
    }

    /// The buffer each side registers: the largest span, at least 1 MiB.
    pub(crate) fn buffer_size(&self) -> u64 {
        self.workloads.iter().map(Workload::span).max().unwrap_or(0).max(1 << 20)
    }
}

/// The measuring time `--quick` shares among its cells ([`AuditOptions::fit_quick_budget`]).
pub const QUICK_CELL_BUDGET: Duration = Duration::from_secs(75);

/// The largest buffer a workload may span (each side, device and Host).
pub const MAX_SPAN: u64 = 128 << 20;

/// The order of the paths in round `round`: the first round's order rotated by `round`.
pub fn round_order(paths: &[Protocol], round: usize) -> Vec<Protocol> {
    let mut order = paths.to_vec();
    if !order.is_empty() {
        let by = round % order.len();
        order.rotate_left(by);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_budget_shares_75_seconds_among_the_cells() {
        let mut options = AuditOptions::quick();
        options.fit_quick_budget();
        // 5 paths x 4 workloads x 5 rounds = 100 cells.
        assert_eq!(options.cell, Duration::from_millis(750));
        options.paths.truncate(1);
        options.fit_quick_budget();
        assert_eq!(options.cell, Duration::from_secs(1), "at most 1 s a cell");
        options.paths = vec![Protocol::Aiv; 12];
        options.fit_quick_budget();
        assert_eq!(options.cell, Duration::from_millis(500), "at least 0.5 s a cell");
    }
}
