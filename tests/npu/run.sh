#!/usr/bin/env bash
# The first run on an Ascend machine: pre-check, build with the vendor toolkit, aiv doctor, the hardware tests, a
# short audit on the cann backend; everything written to one report directory. `bash tests/npu/run.sh --help`.
# Nothing here has run on an NPU yet: every step is unverified on hardware.
set -uo pipefail

usage() {
    cat <<'EOF'
Usage: bash tests/npu/run.sh [--out DIR] [--check-only] [--help]

The first run of aiv-transport on an Ascend NPU machine (Atlas A2/A3: 910B or 910_93). Unverified on hardware:
no run of this script on an NPU has been recorded yet.

1. Pre-check, in seconds and before building anything. That this can be an Ascend machine:
     - the driver's device nodes /dev/davinci<N> (at least one) and /dev/davinci_manager;
     - npu-smi on PATH, and `npu-smi info` answering within AIV_NPU_SMI_TIMEOUT seconds (default 15);
     - a CANN toolkit root in ASCEND_HOME_PATH, else ASCEND_TOOLKIT_HOME (then exported as ASCEND_HOME_PATH for
       the build); with neither: source <toolkit root>/set_env.sh first;
     - cargo and rustc on PATH, and coreutils' timeout.
   Two device nodes or more: every step runs. One: the tests that need two NPUs (their names end in two_npus) and
   the audit (two engines, on aiv.device_id and the next device) are skipped, said so on screen and in SUMMARY.txt,
   and the rest runs. Anything missing: each item is printed with its fix, no report directory is made, and the
   exit status is 2.
2. Build (log: build.log): AIV_REQUIRE_NPU_KERNEL=1 cargo build --release --features cann, and the hardware test
   binaries (cargo test --release --features cann --test npu_hardware --test npu_assumptions
   --test npu_doctor_assumptions --test npu_build_assumptions --test npu_cache_assumptions --no-run).
3. Doctor (doctor.json or doctor.txt): target/release/aiv doctor --npu --json when this build has that flag, else
   plain `aiv doctor` (the file says which). Its exit status 2 (a required item missing) marks the step failed.
4. Hardware tests (tests.log; assumptions.txt holds their CONFIRMED:/REFUTED:/INCONCLUSIVE: lines):
     AIV_NPU_TESTS=1 RUST_LOG=aiv_transport=info cargo test --release --features cann --test npu_hardware \
         --test npu_assumptions --test npu_doctor_assumptions --test npu_build_assumptions \
         --test npu_cache_assumptions -- --ignored --nocapture --test-threads=1
   (one device: --skip two_npus added).
5. Audit (audit/: report.json, report.md, trace-*.json; audit.log): aiv audit --quick --trace with
   "device_backend": "cann" over every path the audit knows (aiv and the baselines; the ones that run only on the
   twin runtime end in the report's "Not run" with their reason). About 2 minutes.
6. Versions (versions.txt): npu-smi info, the toolkit's version files, bisheng -v, rustc -V, cargo -V,
   git rev-parse HEAD, uname -a.

The report goes to ./npu-report-<UTC time, e.g. 20261207T153000Z>/ (or --out DIR), with SUMMARY.txt: each step,
ok / failed / skipped, its exit code and duration. Send back the whole directory (e.g. as a tar.gz); the script
prints its path at the end.

Every step is bounded in time (seconds; override with the variable): build AIV_NPU_BUILD_TIMEOUT (3600), doctor
AIV_NPU_DOCTOR_TIMEOUT (120), tests AIV_NPU_TEST_TIMEOUT (2400), audit AIV_NPU_AUDIT_TIMEOUT (900), each version
probe 30. A failing step does not stop the later steps that do not depend on it (doctor, tests and audit need the
build). Nothing is installed: the build uses the toolchain and toolkit found; the tests and the audit start no
service (they talk over loopback only).

Options:
  --out DIR      write the report into DIR (made if missing) instead of ./npu-report-<UTC time>/
  --check-only   run the pre-check, make the report directory with SUMMARY.txt, print the build command that
                 would run next and stop there (exit 0): for checking the machine, and for the suite's test
  --help         this text

Variables: AIV_NPU_DEVICE_A, AIV_NPU_DEVICE_B (the tests' device ids, default 0 and 1), AIV_NPU_ROOT (a directory
standing in for / when looking for device nodes and toolkits; for the suite's test only).

Exit status: 0 every step that ran passed; 1 a step failed (SUMMARY.txt says which); 2 the pre-check failed (not
an Ascend machine, or a prerequisite missing; nothing built, no report directory); 64 a usage error.
EOF
}

out=""
check_only=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --help | -h)
            usage
            exit 0
            ;;
        --check-only) check_only=1 ;;
        --out)
            if [[ $# -lt 2 || -z "$2" ]]; then
                echo "run.sh: --out needs a directory" >&2
                exit 64
            fi
            out="$2"
            shift
            ;;
        --out=*) out="${1#--out=}" ;;
        *)
            echo "run.sh: unknown argument '$1' (see --help)" >&2
            exit 64
            ;;
    esac
    shift
done

# Positive whole seconds from a variable, else its default; a bad value is a usage error naming the range.
seconds() {
    local name="$1" default="$2" value
    value="${!name:-$default}"
    if ! [[ "$value" =~ ^[0-9]+$ ]] || ((value < 1 || value > 86400)); then
        echo "run.sh: $name='$value': expected whole seconds from 1 to 86400" >&2
        exit 64
    fi
    echo "$value"
}
smi_timeout="$(seconds AIV_NPU_SMI_TIMEOUT 15)" || exit 64
build_timeout="$(seconds AIV_NPU_BUILD_TIMEOUT 3600)" || exit 64
doctor_timeout="$(seconds AIV_NPU_DOCTOR_TIMEOUT 120)" || exit 64
test_timeout="$(seconds AIV_NPU_TEST_TIMEOUT 2400)" || exit 64
audit_timeout="$(seconds AIV_NPU_AUDIT_TIMEOUT 900)" || exit 64

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
root="${AIV_NPU_ROOT:-}"

# ---- 1. pre-check ----------------------------------------------------------------------------------------------
missing=()
miss() { missing+=("$1"); }

echo "== pre-check: can this be an Ascend machine?"
devices=()
for node in "$root"/dev/davinci[0-9]*; do
    [[ -e "$node" && "${node##*/davinci}" =~ ^[0-9]+$ ]] && devices+=("${node##*/}")
done
if [[ ${#devices[@]} -eq 0 ]]; then
    miss "device nodes $root/dev/davinci<N>: none found. Fix: install and load the Ascend NPU driver for this board (in a container: pass the host's /dev/davinci<N> and /dev/davinci_manager in)"
else
    echo "   found ${#devices[@]} device node(s): ${devices[*]}"
fi
if [[ -e "$root/dev/davinci_manager" ]]; then
    echo "   found $root/dev/davinci_manager"
else
    miss "$root/dev/davinci_manager: not found. Fix: the Ascend driver is not installed or not loaded (in a container: pass the host's /dev/davinci_manager in)"
fi

smi_info=""
if ! command -v timeout >/dev/null 2>&1; then
    miss "timeout: not on PATH. Fix: install coreutils"
elif ! command -v npu-smi >/dev/null 2>&1; then
    miss "npu-smi: not on PATH. Fix: install the Ascend driver's tools, or add the directory holding npu-smi to PATH"
else
    smi_info="$(timeout --kill-after=2 "$smi_timeout" npu-smi info 2>&1)"
    rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        miss "npu-smi info: did not answer within $smi_timeout s. Fix: check the driver (dmesg, npu-smi info by hand); AIV_NPU_SMI_TIMEOUT waits longer"
    elif [[ $rc -ne 0 ]]; then
        miss "npu-smi info: exit status $rc: $(head -n 3 <<<"$smi_info" | tr '\n' ' '). Fix: check the driver and that this user may use the NPUs"
    else
        echo "   npu-smi info answered"
    fi
fi

if [[ -n "${ASCEND_HOME_PATH:-}" ]]; then
    toolkit="$ASCEND_HOME_PATH"
    toolkit_from=ASCEND_HOME_PATH
elif [[ -n "${ASCEND_TOOLKIT_HOME:-}" ]]; then
    toolkit="$ASCEND_TOOLKIT_HOME"
    toolkit_from=ASCEND_TOOLKIT_HOME
else
    toolkit=""
    toolkit_from=""
fi
if [[ -z "$toolkit" ]]; then
    hint="source <CANN toolkit root>/set_env.sh"
    for candidate in "$root"/usr/local/Ascend/*/set_env.sh "$root"/usr/local/Ascend/*/latest/set_env.sh; do
        if [[ -f "$candidate" ]]; then
            hint="source $candidate"
            break
        fi
    done
    miss "CANN toolkit root: neither ASCEND_HOME_PATH nor ASCEND_TOOLKIT_HOME is set. Fix: $hint, then run this again"
elif [[ ! -d "$toolkit" ]]; then
    miss "CANN toolkit root: $toolkit_from=$toolkit is not a directory. Fix: source the set_env.sh of an installed toolkit"
else
    echo "   CANN toolkit root $toolkit (from $toolkit_from)"
    if [[ "$toolkit_from" == ASCEND_TOOLKIT_HOME ]]; then
        export ASCEND_HOME_PATH="$toolkit"
        echo "   ASCEND_HOME_PATH was not set: exported as $toolkit for the build and the tests"
    fi
fi

for tool in cargo rustc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        miss "$tool: not on PATH. Fix: install a Rust toolchain (rustup), then run this again"
    fi
done

if [[ ${#missing[@]} -gt 0 ]]; then
    echo
    echo "NOT AN ASCEND MACHINE, or a prerequisite is missing (${#missing[@]} item(s)); nothing was built or written:"
    for item in "${missing[@]}"; do
        echo "  - $item"
    done
    exit 2
fi >&2

two_devices=1
if [[ ${#devices[@]} -lt 2 ]]; then
    two_devices=0
    echo "   ONE DEVICE: the tests needing two NPUs (names ending in two_npus) and the audit will be skipped"
fi
echo "   pre-check passed"

# ---- the report directory -----------------------------------------------------------------------------------
if [[ -z "$out" ]]; then
    out="npu-report-$(date -u +%Y%m%dT%H%M%SZ)"
fi
mkdir -p "$out" || {
    echo "run.sh: cannot make the report directory $out" >&2
    exit 1
}
out="$(cd "$out" && pwd)"
summary="$out/SUMMARY.txt"
{
    echo "aiv-transport first run on an Ascend machine (tests/npu/run.sh); unverified on hardware until this report"
    echo "says otherwise"
    echo "started $(date -u +%Y-%m-%dT%H:%M:%SZ), device nodes: ${devices[*]}, toolkit: $toolkit ($toolkit_from)"
    echo
    printf '%-12s %-8s %-5s %s\n' step status exit seconds
    printf '%-12s %-8s %-5s %s\n' precheck ok 0 0
} >"$summary"
failed=0

record() { # step status exit seconds [note]
    printf '%-12s %-8s %-5s %s%s\n' "$1" "$2" "$3" "$4" "${5:+  ($5)}" >>"$summary"
    echo "   $1: $2${5:+ ($5)}"
    [[ "$2" == failed ]] && failed=1
    return 0
}

# run_step NAME LOG SECONDS COMMAND...: runs COMMAND in the repository, bounded, output appended to LOG.
run_step() {
    local name="$1" log="$2" limit="$3" start rc status note=""
    shift 3
    echo "== $name: $*"
    start=$SECONDS
    if [[ "$log" != *.json ]]; then
        {
            echo "\$ $*"
            echo "(timeout $limit s, started $(date -u +%H:%M:%SZ))"
        } >>"$log"
    fi
    (cd "$repo" && timeout --kill-after=30 "$limit" "$@") >>"$log" 2>&1
    rc=$?
    status=ok
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        status=failed
        note="timed out after $limit s"
    elif [[ $rc -ne 0 ]]; then
        status=failed
    fi
    record "$name" "$status" "$rc" "$((SECONDS - start))" "$note"
    return "$rc"
}

build_cmd=(env AIV_REQUIRE_NPU_KERNEL=1 cargo build --release --features cann)
if [[ $check_only -eq 1 ]]; then
    record build skipped - 0 "--check-only"
    echo "--check-only: stopping before the build step, which would run: ${build_cmd[*]}"
    echo "report directory: $out"
    exit 0
fi

# ---- 2. build ---------------------------------------------------------------------------------------------------
built=0
if run_step build "$out/build.log" "$build_timeout" "${build_cmd[@]}" &&
    run_step build-tests "$out/build.log" "$build_timeout" env AIV_REQUIRE_NPU_KERNEL=1 \
        cargo test --release --features cann --test npu_hardware --test npu_assumptions --test npu_doctor_assumptions \
        --test npu_build_assumptions --test npu_cache_assumptions --no-run; then
    built=1
fi
aiv="$repo/target/release/aiv"
if [[ -n "${CARGO_TARGET_DIR:-}" ]]; then
    aiv="$CARGO_TARGET_DIR/release/aiv"
fi

# ---- 3. doctor ----------------------------------------------------------------------------------------------
if [[ $built -eq 0 ]]; then
    record doctor skipped - 0 "the build failed"
elif "$aiv" doctor --help 2>/dev/null | grep -q -- '--npu'; then
    # Exit status 2: a required item is missing (the JSON's items say which).
    run_step doctor "$out/doctor.json" "$doctor_timeout" "$aiv" doctor --npu --json
else
    echo "aiv doctor has no --npu flag in this build: plain aiv doctor" >"$out/doctor.txt"
    run_step doctor "$out/doctor.txt" "$doctor_timeout" "$aiv" doctor
fi

# ---- 4. hardware tests --------------------------------------------------------------------------------------
test_args=(-- --ignored --nocapture --test-threads=1)
if [[ $two_devices -eq 0 ]]; then
    test_args+=(--skip two_npus)
fi
if [[ $built -eq 0 ]]; then
    record tests skipped - 0 "the build failed"
else
    run_step tests "$out/tests.log" "$test_timeout" env AIV_NPU_TESTS=1 RUST_LOG=aiv_transport=info \
        cargo test --release --features cann --test npu_hardware --test npu_assumptions \
        --test npu_doctor_assumptions --test npu_build_assumptions --test npu_cache_assumptions "${test_args[@]}"
    grep -E 'CONFIRMED:|REFUTED:|INCONCLUSIVE:|SKIPPED:' "$out/tests.log" >"$out/assumptions.txt"
    echo "   $(grep -c 'CONFIRMED:' "$out/assumptions.txt") CONFIRMED, $(grep -c 'REFUTED:' "$out/assumptions.txt") REFUTED (assumptions.txt)"
fi

# ---- 5. audit -----------------------------------------------------------------------------------------------
if [[ $built -eq 0 ]]; then
    record audit skipped - 0 "the build failed"
elif [[ $two_devices -eq 0 ]]; then
    record audit skipped - 0 "one device: the audit's engines need two"
else
    cat >"$out/audit-mooncake.json" <<EOF
{
  "local_hostname": "127.0.0.1",
  "metadata_server": "P2PHANDSHAKE",
  "protocol": "aiv",
  "aiv": { "device_backend": "cann", "device_id": ${AIV_NPU_DEVICE_A:-0} }
}
EOF
    run_step audit "$out/audit.log" "$audit_timeout" "$aiv" --config "$out/audit-mooncake.json" \
        audit --quick --trace --out "$out/audit"
fi

# ---- 6. versions --------------------------------------------------------------------------------------------
versions="$out/versions.txt"
version_probe() {
    {
        echo "\$ $*"
        (cd "$repo" && timeout --kill-after=2 30 "$@") 2>&1 || echo "(exit status $?)"
        echo
    } >>"$versions"
}
start=$SECONDS
version_probe npu-smi info
for file in "$toolkit"/version.cfg "$toolkit"/version.info "$toolkit"/*install.info "$toolkit"/../version.cfg; do
    [[ -f "$file" ]] && version_probe cat "$file"
done
bisheng="$(command -v bisheng || true)"
for candidate in "$toolkit/compiler/ccec_compiler/bin/bisheng" "$toolkit/tools/ccec_compiler/bin/bisheng"; do
    [[ -z "$bisheng" && -x "$candidate" ]] && bisheng="$candidate"
done
[[ -n "$bisheng" ]] && version_probe "$bisheng" -v
version_probe rustc -V
version_probe cargo -V
version_probe git rev-parse HEAD
version_probe git status --short
version_probe uname -a
record versions ok 0 "$((SECONDS - start))"

{
    echo
    echo "finished $(date -u +%Y-%m-%dT%H:%M:%SZ): $([[ $failed -eq 0 ]] && echo 'every step that ran passed' || echo 'a step failed')"
} >>"$summary"
echo
cat "$summary"
echo
echo "Report: $out"
echo "Send back the whole directory, e.g.: tar czf $(basename "$out").tar.gz -C $(dirname "$out") $(basename "$out")"
exit "$failed"
