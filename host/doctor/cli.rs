//! What `aiv doctor` prints and its exit code: the readiness checklist and the backend report (`aiv doctor`, exit
//! 0), the checklist alone (`--npu`, exit 0 when no item is missing, else 2), or the checklist as JSON (`--json`).

use super::inputs::Inputs;
use super::readiness::Readiness;

/// What the command line asked for (`aiv doctor`'s flags).
#[derive(Clone, Copy, Debug, Default, clap::Args)]
pub struct DoctorOptions {
    /// Print only the readiness checklist; exit 0 when no item is missing, 2 when any is
    #[arg(long)]
    pub npu: bool,
    /// Write the checklist as JSON on stdout ({"items":[{"item","status","found","looked_for","fix"}...],"ready"})
    #[arg(long)]
    pub json: bool,
}

/// Runs the doctor and prints its output on stdout; returns the exit code, or an error for a bad setting.
pub fn run(options: DoctorOptions) -> Result<u8, String> {
    let inputs = Inputs::from_process_env()?;
    let report = super::diagnose();
    let readiness = Readiness::check(&inputs, &report);
    if options.json {
        let text = serde_json::to_string_pretty(&readiness.to_json()).map_err(|error| error.to_string())?;
        println!("{text}");
    } else {
        print!("{}", readiness.render());
        if !options.npu {
            print!("{}", report.render());
        }
    }
    Ok(if options.npu { readiness.exit_code() } else { 0 })
}

/// `aiv doctor --help`'s closing text: the variables the doctor reads.
pub const AFTER_HELP: &str = "\
Reads: /etc/ascend_install.info (Driver_Install_Path_Param, default /usr/local/Ascend) for the driver's version.info; \
/dev/davinci<N>, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc; npu-smi on PATH or in /usr/local/bin, \
/usr/local/sbin; AIV_CANN_HOME, ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and PATH for the toolkit and compiler; the \
libraries by the loaders' rules (AIV_ASCENDCL_LIB, AIV_SHMEM_LIB, AIV_HIXL_LIB, AIV_LLM_DATADIST_LIB, \
SHMEM_HOME_PATH); /etc/hccn.conf; RLIMIT_MEMLOCK.
AIV_DOCTOR_COMMAND_TIMEOUT_MS (100 to 120000, default 5000) bounds each program run (npu-smi info, the compiler's \
--version); it is killed after that.
AIV_DOCTOR_SYSROOT=DIR (a test and debug knob) reads the fixed system paths below DIR: a fake tree there proves \
only the doctor's logic, not that a machine is ready.";
