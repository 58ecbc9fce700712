#!/usr/bin/env bash
# The one-command GPU check: on a machine with an NVIDIA GPU, python3 with a CUDA build of PyTorch, nvcc,
# CMake, ninja and a C++ compiler, builds trainkit against that wheel's LibTorch with the dependencies that
# scripts/gpu/pack.sh carried along, runs every CUDA-tagged test and the GPU benchmarks, and writes one
# results file. Run from anywhere; it works in the repository it belongs to.
# Usage: scripts/gpu/run.sh [options] [RESULTS_DIR]
#   RESULTS_DIR        where gpu_results.md and logs/ go (default: $OUT when set, else gpu-results/)
#   --deps DIR         the folder pack.sh filled (default: gpu-deps/)
#   --build-dir DIR    the build folder (default: build-gpu/)
#   --budget SECONDS   time for the whole script; every step is cut to what is left (default 480)
#   --epochs N         epochs of each main-job run (default 3)
#   --time-scale N     multiply every step's limit by N (a rehearsal on a slower machine; default 1)
#   --build-only       stop after the build and the link check
#   --targets "T ..."  build only these of trainkit_tests, trainkit_cli, bench_optim, amp, data_loading (default:
#                      all five; the steps whose programs are missing fail)
#   --no-build         reuse the build folder as it is
# Environment: TRAINKIT_PYTHON (python3), TRAINKIT_CXX (g++ when present: its OpenMP needs no extra
#   package; else c++, clang++), TRAINKIT_JOBS (nproc), CUDAToolkit_ROOT (found from nvcc when unset).
# Every step runs under `timeout`, a failed step is recorded and the script goes on; the results file is
# written step by step, so a run cut short still leaves what it measured. Without a CUDA device the build
# and the CUDA-tagged tests (which then report Skipped) still run, and each GPU step is recorded as skipped.
# Beyond a command's exit status, a step fails when: a [cuda] case reports Skipped on a machine with a GPU;
# the host-transfer count exceeds its bounds (0 device-to-host copies on a step without a metric row, 1 on
# one); a main-job run has no summary.json, a non-finite loss or accuracy, or a test accuracy below the CPU
# run's minus a margin (scripts/gpu/main_job_floor.txt); the NCCL DDP run's test loss differs from the Gloo
# run's (same config, seeds and ranks, on the CPU) by more than ddp_loss_tolerance (below).
# Exit status: 0 when every step that ran passed, 1 when one failed, 2 on a usage error.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
deps="$root/gpu-deps"
build="$root/build-gpu"
budget=480
epochs=3
time_scale=1
mode=all
results=""
targets="trainkit_tests trainkit_cli bench_optim amp data_loading"
# The NCCL DDP run's test loss may differ from the Gloo run's by this much (absolute). The Gloo run is on
# the CPU (trainkit sends CUDA tensors only to NCCL), so its dropout masks come from the CPU generator and
# its kernels round differently: the two runs are as different as runs with two seeds, whose test losses
# (~0.24 after 3 epochs) differ by a few thousandths (the main job on the CPU, seed 0 vs 1: 0.2444 vs
# 0.2420). 0.02 is several times that, and far below what a broken collective costs (a diverged or untrained
# run is above 0.4).
ddp_loss_tolerance=0.02

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
while (($#)); do
  case "$1" in
    --deps) deps=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --time-scale) time_scale=$2; shift 2 ;;
    --build-only) mode="build-only"; shift ;;
    --targets) targets=$2; shift 2 ;;
    --no-build) mode="no-build"; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) results=$1; shift ;;
  esac
done
if [ -z "$results" ]; then results="${OUT:-$root/gpu-results}"; fi
for n in "$budget" "$epochs" "$time_scale"; do
  if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then echo "run.sh: '$n' is not a positive integer" >&2; exit 2; fi
done
deps=$(cd "$deps" 2>/dev/null && pwd) || { echo "run.sh: no folder '$deps': run scripts/gpu/pack.sh first" >&2; exit 2; }
mkdir -p "$results/logs" || exit 2
results=$(cd "$results" && pwd)
build=$(mkdir -p "$build" && cd "$build" && pwd)
report="$results/gpu_results.md"
logs="$results/logs"
py="${TRAINKIT_PYTHON:-python3}"
start=$(date +%s)
failed=0
summary=()

elapsed() { echo $(($(date +%s) - start)); }
remaining() { echo $((budget - $(elapsed))); }
say() { echo "run.sh [$(elapsed) s] $*"; }
md() { printf '%s\n' "$@" >> "$report"; }
# Appends the last N lines of a log to the results as a text block.
md_log() {
  md '```text'
  grep -v '^[[:space:]]*$' "$1" | tail -n "$2" | cut -c1-300 >> "$report"
  md '```'
}
record() {  # name status seconds detail
  summary+=("| $1 | $2 | $3 | $4 |")
  case "$2" in failed*|"timed out"*) failed=1 ;; esac
}

# run_step NAME LIMIT CMD...: runs CMD with its output in logs/NAME.log under `timeout`, cut to the time
# left (15 s stay for the summary); a CMD that is a function of this script bounds its own commands. Sets
# step_rc (124: timed out, 125: not run for lack of time).
run_step() {
  local name=$1 limit=$(($2 * time_scale))
  shift 2
  local left=$(($(remaining) - 15))
  ((limit > left)) && limit=$left
  local log="$logs/$name.log"
  if ((limit < 10)); then
    say "$name: skipped, the budget is spent"
    md "" "## $name" "" "Not run: the budget of $budget s was spent."
    record "$name" "skipped (budget spent)" 0 ""
    step_rc=125
    return 0
  fi
  say "$name (at most $limit s): $*"
  step_limit=$limit  # for a CMD that is a function of this script
  local t0
  t0=$(date +%s)
  if declare -F "$1" > /dev/null; then
    "$@" > "$log" 2>&1  # a function of this script: it times each command it runs
  else
    timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  fi
  step_rc=$?
  local took=$(($(date +%s) - t0))
  local status=passed
  if ((step_rc == 124 || step_rc == 137)); then
    status="timed out after $limit s"
  elif ((step_rc != 0)); then
    status="failed (exit $step_rc)"
  fi
  say "$name: $status in $took s"
  md "" "## $name" "" "\`$*\`: **$status** in $took s (log: \`logs/$name.log\`)." ""
  record "$name" "$status" "$took" "logs/$name.log"
  return 0
}
skip_step() {  # name reason
  say "$1: skipped: $2"
  md "" "## $1" "" "Skipped: $2."
  record "$1" "skipped" 0 "$2"
}

cd "$root" || exit 2
: > "$report"
md "# trainkit GPU check" ""
commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || true)
if [ -z "$commit" ] && [ -f "$deps/MANIFEST.txt" ]; then
  commit="$(awk '$1 == "commit:" {print $2}' "$deps/MANIFEST.txt") (from the pack's manifest; no git here)"
fi
md "- started: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit ${commit:-unknown}, budget $budget s" \
   "- machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) memory, $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown OS}")"

# ---- 1. The machine: GPUs, PyTorch, toolchain ----------------------------------------------------------
gpus=0
if command -v nvidia-smi > /dev/null; then
  gpu_list=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1)
  md "- nvidia-smi: $(echo "$gpu_list" | paste -sd ';' -)"
else
  md "- nvidia-smi: not found"
fi
torch_info=$("$py" -c "import torch, torch.utils
print(torch.__version__, torch.version.cuda, torch.cuda.device_count() if torch.cuda.is_available() else 0)
print(torch.utils.cmake_prefix_path)" 2> "$logs/python_torch.log")
if [ $? -ne 0 ]; then
  md "- PyTorch: \`$py\` cannot import torch: $(tail -1 "$logs/python_torch.log")"
  echo "run.sh: $py cannot import torch (TRAINKIT_PYTHON names another Python): $(tail -1 "$logs/python_torch.log")" >&2
  exit 2
fi
read -r torch_version torch_cuda gpus <<< "$(echo "$torch_info" | head -1)"
torch_prefix=$(echo "$torch_info" | tail -1)
md "- PyTorch $torch_version (CUDA $torch_cuda) from \`$py\`: $gpus CUDA device(s) visible"

# The compiler: GCC first (its OpenMP runtime and omp.h come with it; clang's need libomp's package).
cxx="${TRAINKIT_CXX:-}"
if [ -z "$cxx" ]; then
  for c in g++ c++ clang++; do
    if command -v "$c" > /dev/null; then cxx=$c; break; fi
  done
fi
# nvcc: LibTorch's CMake files need the CUDA toolkit (nvcc, cuda.h, libcudart) even though trainkit has no
# CUDA sources.
nvcc=""
for c in "${CUDACXX:-}" "${CUDAToolkit_ROOT:+$CUDAToolkit_ROOT/bin/nvcc}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" \
         "$(command -v nvcc)" /usr/local/cuda/bin/nvcc $(ls -d /usr/local/cuda-*/bin/nvcc 2>/dev/null | sort -rV); do
  if [ -n "$c" ] && [ -x "$c" ]; then nvcc=$c; break; fi
done
cuda_root=""
if [ -n "$nvcc" ]; then cuda_root=$(cd "$(dirname "$nvcc")/.." && pwd); fi
md "- C++ compiler: ${cxx:-none found} ($("${cxx:-false}" --version 2>/dev/null | head -1)); nvcc: ${nvcc:-none found}" \
   "  ($("${nvcc:-false}" --version 2>/dev/null | tail -1)); $(cmake --version 2>/dev/null | head -1 || echo "no cmake"); ninja $(ninja --version 2>/dev/null || echo "not found")"
if ((gpus == 0)); then
  md "" "**No CUDA device was found** (torch.cuda sees none): the build and the CUDA-tagged tests run (the tests" \
     "report Skipped); every GPU benchmark below is skipped."
fi
missing=()
[ -n "$cxx" ] || missing+=("a C++ compiler (g++)")
[ -n "$nvcc" ] || missing+=("nvcc (the CUDA toolkit; or set CUDAToolkit_ROOT)")
command -v cmake > /dev/null || missing+=("cmake")
command -v ninja > /dev/null || missing+=("ninja")
[ -f "$deps/deps.tar.gz" ] || missing+=("$deps/deps.tar.gz (run scripts/gpu/pack.sh on the development machine)")
if ((${#missing[@]})) && [ "$mode" != no-build ]; then
  md "" "Cannot build: missing ${missing[*]}."
  echo "run.sh: cannot build: missing ${missing[*]}" >&2
  exit 1
fi

# ---- 2. Build -----------------------------------------------------------------------------------------
bin="$build"
if [ "$mode" != no-build ]; then
  # The carried usr/ tree, unpacked into the build folder (again when the archive is newer), so that the
  # folder that travels stays as pack.sh left it.
  carried="$build/carried/usr"
  if [ ! -d "$carried" ] || [ "$deps/deps.tar.gz" -nt "$carried" ]; then
    rm -rf "$build/carried" && mkdir -p "$build/carried" && tar -xzf "$deps/deps.tar.gz" -C "$build/carried" &&
      touch "$carried"
  fi
  arch_lib=$(ls -d "$carried"/lib/*-linux-gnu 2>/dev/null | head -1)
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
  # LibTorch's CMake files probe the GPU's architecture for nvcc flags; trainkit compiles no CUDA code, so
  # naming it (or a common one without a GPU) only saves the probe.
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-${arch:-9.0}}"
  # The carried packages are found through CMAKE_PREFIX_PATH (headers, libraries) and their <Name>_DIR
  # hints; --disable-new-dtags writes the carried library folder as DT_RPATH, which (unlike RUNPATH) also
  # serves the libraries' own dependencies (libcurl's closure), so the programs run without LD_LIBRARY_PATH.
  # libstdc++ is named first among the programs' libraries: LibTorch 2.11's libtorch.so exports copies of
  # std::filesystem functions (remove_all among them) that crash when called from a program; loaded before
  # libtorch.so, libstdc++ provides them instead.
  run_step configure 240 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda_root" \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$carried" \
    -Dfmt_DIR="$arch_lib/cmake/fmt" -Dspdlog_DIR="$arch_lib/cmake/spdlog" \
    -DCatch2_DIR="$carried/lib/cmake/Catch2" -DCLI11_DIR="$carried/share/cmake/CLI11" \
    -Dnlohmann_json_DIR="$carried/share/cmake/nlohmann_json" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state" \
    -DTRAINKIT_INSTALL=OFF
  if ((step_rc == 0)); then
    md_log "$logs/configure.log" 6
    # Only what the steps below run: the tests' binary (with the CLI and dist_worker it depends on), the
    # optimizer benchmark and the two apps. -k 0: a target that fails does not stop the others.
    run_step build 420 cmake --build "$build" -j "${TRAINKIT_JOBS:-$(nproc)}" \
      --target $targets -- -k 0
    if ((step_rc != 0)); then
      md "Errors:" '```text'
      grep -E "error|Error|FAILED" "$logs/build.log" | head -40 | cut -c1-300 >> "$report"
      md '```'
    fi
  else
    md_log "$logs/configure.log" 30
  fi
fi
declare -A exe=(
  [trainkit_tests]="$bin/tests/trainkit_tests" [trainkit]="$bin/apps/trainkit" [bench_optim]="$bin/bench/bench_optim"
  [amp]="$bin/apps/amp" [data_loading]="$bin/apps/data_loading")
have() { [ -x "${exe[$1]}" ]; }

# Every carried library must resolve, to the carried folder; anything "not found" fails here, not later.
link_check() {
  local rc=0 name
  for name in "${!exe[@]}"; do
    # trainkit_cli builds the program `trainkit`
    [[ " ${targets/trainkit_cli/trainkit} " == *" $name "* ]] || continue
    have "$name" || { echo "$name: not built"; rc=1; continue; }
    echo "== $name"
    timeout 30 ldd "${exe[$name]}" | grep -v -E "^\s*(linux-vdso|/lib64/ld-linux)" | awk '{print "  " $1, $2, $3}'
    if ldd "${exe[$name]}" | grep -q "not found"; then rc=1; fi
  done
  return $rc
}
run_step link_check 60 link_check
((step_rc == 0)) || md_log "$logs/link_check.log" 60
if ldd "${exe[trainkit]}" > /dev/null 2>&1; then
  resolved=$(ldd "${exe[trainkit]}" | awk '$3 ~ /^\// {print $3}')
  md "Libraries of \`trainkit\`: $(grep -c "^$build/carried/" <<< "$resolved") from the carried folder, $(grep -c "site-packages" <<< "$resolved") from the wheel, $(grep -v -c -e "^$build/carried/" -e "site-packages" <<< "$resolved") from the system (\`logs/link_check.log\`)."
fi
if [ "$mode" = build-only ]; then
  md "" "Stopped after the build (--build-only)."
fi

# ---- 3. The CUDA-tagged tests, one process each (a crash does not take the others with it) ------------
data="$deps/fashion-mnist"
# Where tests that train on Fashion-MNIST find it (default: Debian's folder, which this machine lacks).
export TRAINKIT_FASHION_MNIST_DIR="$data"
# The [cuda] cases but the host-transfer counter, which has a step of its own (section 4). With a GPU, a case
# that reports Skipped fails the step: it proves nothing there. A skip is told by its "trainkit-skip:" warning,
# as ctest tells it (SKIP_REGULAR_EXPRESSION), not by the exit status: a skipped case asserts nothing, which
# tests/main.cpp's NoAssertions turns into exit 1.
cuda_tests() {
  local names rc=0 name spec out
  names=$(timeout 60 "${exe[trainkit_tests]}" --list-test-names-only "[cuda]~[host_transfers]" | grep -v '^$')
  if [ -z "$names" ]; then
    echo "trainkit_tests --list-test-names-only \"[cuda]~[host_transfers]\" listed no test case"
    return 1
  fi
  echo "$(echo "$names" | wc -l) CUDA-tagged test cases"
  while IFS= read -r name; do
    spec=$(printf '%s' "$name" | sed 's/\([],[]\)/\\\1/g')
    out=$(timeout --kill-after=5 120 "${exe[trainkit_tests]}" "$spec" --warn NoTests 2>&1)
    local case_rc=$?
    if grep -q "trainkit-skip:" <<< "$out" && ((gpus > 0)); then
      echo "FAILED  | $name | skipped on a machine with $gpus GPU(s): $(grep -o "trainkit-skip:.*" <<< "$out" | head -1)"
      rc=1
    elif grep -q "trainkit-skip:" <<< "$out"; then
      echo "SKIPPED | $name | $(grep -o "trainkit-skip:.*" <<< "$out" | head -1)"
    elif ((case_rc == 0)); then
      echo "PASSED  | $name | $(grep -E "^All tests passed" <<< "$out" | head -1)"
    else
      echo "FAILED  | $name | exit $case_rc"
      echo "$out" | tail -40 | sed 's/^/    /'
      rc=1
    fi
  done <<< "$names"
  return $rc
}
if [ "$mode" != build-only ]; then
  if have trainkit_tests; then
    run_step cuda_tests 240 cuda_tests
    md_log "$logs/cuda_tests.log" 120
  else
    skip_step cuda_tests "trainkit_tests was not built"
    failed=1
  fi
fi

# ---- 4. GPU steps: host transfers, the main job, DDP, then the benchmarks ---------------------------
gpu_step() {  # name program: whether a GPU step can run; records why not
  if [ "$mode" = build-only ]; then return 1; fi
  if ((gpus == 0)); then skip_step "$1" "no CUDA device"; return 1; fi
  if ! have "$2"; then skip_step "$1" "$2 was not built"; failed=1; return 1; fi
  return 0
}

# Host transfers per training step (tests/app/test_host_transfers_cuda.cpp): `trainkit train`'s stack on the
# GPU under Kineto/CUPTI, the device-to-host copies and the host's waits per optimizer step. The case fails
# on a copy in a steady-state step without a metric row or on more than one in a step with one; skipped
# here (a GPU is present) it fails too.
host_transfers() {
  local out rc
  out=$(timeout --kill-after=5 "$step_limit" "${exe[trainkit_tests]}" "[host_transfers]" --warn NoTests 2>&1)
  rc=$?
  echo "$out"
  if grep -q "trainkit-skip:" <<< "$out"; then
    echo "run.sh: the host-transfer case skipped on a machine with $gpus GPU(s)"
    return 1
  fi
  if ((rc == 0)) && ! grep -q "^host-transfers:" <<< "$out"; then
    echo "run.sh: the host-transfer case printed no count"
    return 1
  fi
  return "$rc"
}
transfer_summary() {  # log: one line from the case's per-step lines
  "$py" - "$1" <<'EOF'
import re, sys
rows = []
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"host-transfers: step +(\d+)(?: \((warm-up|metric row)\))?: (\d+) device-to-host copies, "
                 r"(\d+) host waits", line)
    if m:
        rows.append((int(m.group(1)), m.group(2) or "", int(m.group(3)), int(m.group(4))))
def stat(rs, i):
    return f"max {max(r[i] for r in rs)}, mean {sum(r[i] for r in rs) / len(rs):.2f}" if rs else "none"
plain = [r for r in rows if r[1] == ""]
logging = [r for r in rows if r[1] == "metric row"]
print(f"**Host transfers per steady-state step on the GPU** (the warm-up step left out): "
      f"{len(plain)} steps without a metric row: device-to-host copies {stat(plain, 2)}, host waits {stat(plain, 3)}; "
      f"{len(logging)} steps with one: copies {stat(logging, 2)}, waits {stat(logging, 3)} "
      f"(bounds: 0 and 1 copies; waits are reported, not bounded).")
EOF
}
if gpu_step host_transfers trainkit_tests; then
  run_step host_transfers 180 host_transfers
  if grep -qs "^host-transfers:" "$logs/host_transfers.log"; then
    md "$(transfer_summary "$logs/host_transfers.log" 2>&1)" "" '```text'
    grep "^host-transfers:" "$logs/host_transfers.log" | cut -c1-300 >> "$report"
    md '```'
  fi
  ((step_rc == 0 || step_rc == 125)) || md_log "$logs/host_transfers.log" 40
fi

# The checks of correctness come before the benchmarks, so that a tight --budget cuts measurements, not them.
# The main job (configs/fashion_mnist.toml) on the GPU, a few epochs; then with uint8 batches normalized on
# the device (DeviceSource).
summarize_run() {  # run_dir: accuracy and epoch times from summary.json
  "$py" - "$1/summary.json" <<'EOF'
import json, statistics, sys
s = json.load(open(sys.argv[1]))
epochs = s.get("epoch_step_times", [])
per = [e.get("total_s", 0.0) for e in epochs]
val = [e.get("validation_s", 0.0) for e in epochs]
steady = statistics.median(per[1:]) if len(per) > 1 else (per[0] if per else float("nan"))
print(f"test accuracy {s.get('test_accuracy')}, test loss {s.get('test_loss')}, {s.get('epochs')} epochs, "
      f"{s.get('steps')} steps, wall {s.get('wall_seconds', 0):.1f} s, "
      f"{s.get('train_samples_per_second', 0):.0f} train samples/s")
print("seconds of training steps per epoch: " + ", ".join(f"{t:.2f}" for t in per)
      + f" (median after the first: {steady:.2f}); validation per epoch: " + ", ".join(f"{t:.2f}" for t in val))
EOF
}
# check_run DIR CPU_ACCURACY MARGIN [REFERENCE_DIR TOLERANCE]: whether DIR/summary.json holds a finished
# run with a finite test loss and accuracy; with CPU_ACCURACY (empty: no floor), whether the accuracy reaches
# CPU_ACCURACY - MARGIN; with a reference, whether the test loss is within TOLERANCE of REFERENCE_DIR's.
# Prints "check:" lines; exit 1 on the first check that fails.
check_run() {
  "$py" - "$@" <<'EOF'
import json, math, os, sys
def load(d):
    try:
        with open(d + "/summary.json") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"check: FAILED: {d}/summary.json cannot be read: {e}")
def finite(s, key, d):
    v = s.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        sys.exit(f"check: FAILED: {d}/summary.json: {key} is {v!r}, not a finite number")
    return float(v)
def run(d):
    s = load(d)
    if s.get("finished") is not True:
        sys.exit(f"check: FAILED: {d}/summary.json: finished is {s.get('finished')!r}")
    return finite(s, "test_accuracy", d), finite(s, "test_loss", d)
args = sys.argv[1:]
accuracy, loss = run(args[0])
print(f"check: summary.json: finished, test accuracy {accuracy:.4f} and test loss {loss:.4f} finite")
if args[1]:
    cpu, margin = float(args[1]), float(args[2])
    floor = cpu - margin
    verdict = "reaches the floor" if accuracy >= floor else "FAILED: below the floor"
    print(f"check: {verdict}: test accuracy {accuracy:.4f} vs {floor:.4f} = the CPU run's {cpu:.4f} - {margin:.4f} "
          f"(scripts/gpu/main_job_floor.txt)")
    if accuracy < floor:
        sys.exit(1)
if len(args) > 3:
    if not os.path.exists(args[3] + "/summary.json"):
        sys.exit(f"check: FAILED: no reference run to compare with: {args[3]}/summary.json is missing")
    ref_accuracy, ref_loss = run(args[3])
    tolerance = float(args[4])
    ok = abs(loss - ref_loss) <= tolerance
    print(f"check: {'the same' if ok else 'FAILED: not the same'} test loss as {os.path.basename(args[3])}: "
          f"{loss:.4f} vs {ref_loss:.4f}, |difference| {abs(loss - ref_loss):.4f} (tolerance {tolerance}); "
          f"test accuracy {accuracy:.4f} vs {ref_accuracy:.4f}")
    if not ok:
        sys.exit(1)
EOF
}
record_run() {  # name dir: the run's numbers and checks into the results; the end of its log when it failed
  ((step_rc == 125)) && return 0  # not run for lack of time: run_step said so
  if [ -f "$2/summary.json" ]; then md "$(summarize_run "$2" 2>&1)"; fi
  if grep -q "^check:" "$logs/$1.log"; then md "" "$(grep "^check:" "$logs/$1.log" | sed 's/$/  /')"; fi
  ((step_rc == 0)) || md_log "$logs/$1.log" 25
}
# The floor: the CPU run's test accuracy for the same config and epochs, minus a margin (both written, with
# the command that measured them, in scripts/gpu/main_job_floor.txt).
floor_file="$root/scripts/gpu/main_job_floor.txt"
floor_value() {  # key: its value in the floor file ("key = value" lines)
  awk -F '=' -v key="$1" '{ k = $1; gsub(/ /, "", k) } k == key { v = $2; gsub(/ /, "", v); print v }' \
    "$floor_file" 2>/dev/null
}
floor_epochs=$(floor_value epochs)
floor_accuracy=$(floor_value cpu_test_accuracy)
floor_margin=$(floor_value margin)
run_floor=""
main_job_run() {  # dir extra --set arguments...: the run on the GPU, then its summary's checks
  local dir=$1
  shift
  timeout --kill-after=10 "$step_limit" "${exe[trainkit]}" train --config "$root/configs/fashion_mnist.toml" \
    --out "$dir" --set "train.device=\"cuda\"" --set "train.epochs=$epochs" --set "data.dir=\"$data\"" "$@" ||
    return $?
  check_run "$dir" "$run_floor" "$floor_margin"
}
main_job() {  # name extra --set arguments...
  local name=$1
  shift
  local dir="$results/runs/$name"
  rm -rf "$dir"
  run_step "$name" 150 main_job_run "$dir" "$@"
  record_run "$name" "$dir"
}
if gpu_step main_job trainkit; then
  run_floor=$floor_accuracy
  if [ -z "$floor_epochs" ] || [ -z "$floor_accuracy" ] || [ -z "$floor_margin" ]; then
    md "" "**$floor_file lacks epochs, cpu_test_accuracy or margin**: the main job's accuracy cannot be checked."
    record main_job_floor "failed (no floor)" 0 "$floor_file"
    run_floor=""
  elif [ "$floor_epochs" != "$epochs" ]; then
    md "" "**No accuracy floor**: the CPU reference is for $floor_epochs epochs, this run has $epochs (--epochs)."
    record main_job_floor "not checked" 0 "the CPU reference is for $floor_epochs epochs, not $epochs"
    run_floor=""
  fi
  main_job main_job
  main_job main_job_normalize_on_device --set "data.normalize_on_device=true"
fi

# DDP: one rank per GPU under trainkit's launcher; the global batch grows with the ranks (train.batch_size is
# per rank). First the same job over Gloo on the CPU, the reference (trainkit sends CUDA tensors only to
# NCCL: a Gloo run on the GPUs does not exist), its ranks sharing the cores; then over NCCL on the GPUs,
# which must end with the same test loss to ddp_loss_tolerance.
ddp_run() {  # dir device backend [reference_dir]: the launch, then its summary's checks
  local dir=$1 device=$2 backend=$3 reference=${4:-}
  local threads=$(($(nproc) / gpus))
  ((threads >= 1)) || threads=1
  timeout --kill-after=10 "$step_limit" "${exe[trainkit]}" launch --nproc "$gpus" --master-port 0 -- \
    "${exe[trainkit]}" train --config "$root/configs/fashion_mnist.toml" --out "$dir" \
    --set "train.device=\"$device\"" --set "train.epochs=$epochs" --set "data.dir=\"$data\"" \
    --set "distributed.backend=\"$backend\"" --set "train.threads=$threads" || return $?
  if [ -n "$reference" ]; then
    check_run "$dir" "" "" "$reference" "$ddp_loss_tolerance"
  else
    check_run "$dir" "" ""
  fi
}
if [ "$mode" != build-only ]; then
  if ((gpus >= 2)); then
    if have trainkit; then
      gloo_dir="$results/runs/ddp_gloo"
      nccl_dir="$results/runs/ddp_nccl"
      rm -rf "$gloo_dir" "$nccl_dir"
      run_step ddp_gloo 180 ddp_run "$gloo_dir" cpu gloo
      record_run ddp_gloo "$gloo_dir"
      run_step ddp_nccl 180 ddp_run "$nccl_dir" cuda nccl "$gloo_dir"
      record_run ddp_nccl "$nccl_dir"
    else
      skip_step ddp_nccl "trainkit was not built"
      failed=1
    fi
  else
    skip_step ddp_nccl "DDP over NCCL needs 2 or more GPUs; this machine has $gpus"
  fi
fi

if gpu_step bench_optim bench_optim; then
  # Adam/AdamW/SGD (foreach and ATen-fused), LAMB and LARS (foreach), torch::optim and at::_fused_adam_.
  run_step bench_optim 150 "${exe[bench_optim]}" --device cuda --rounds 20 --cases 10M/16 1M/256 64M/16
  md_log "$logs/bench_optim.log" 60
fi

if gpu_step amp amp; then
  run_step amp 150 "${exe[amp]}" --device cuda --dtypes bfloat16 float16 --steps 1000 --data-dir "$data"
  md_log "$logs/amp.log" 30
fi

if gpu_step data_loading data_loading; then
  # A short worker sweep (CPU decoding) first; the CUDA tables are pinned vs pageable copies, host vs device
  # normalization and tensors created on the device.
  run_step data_loading 120 "${exe[data_loading]}" --data-dir "$data" --limit 512 --decode-repeats 5 \
    --workers 0 4 16 --rounds 5
  md_log "$logs/data_loading.log" 40
fi

# ---- Summary ------------------------------------------------------------------------------------------
md "" "## Summary" "" "| step | status | seconds | log or reason |" "|---|---|---|---|" "${summary[@]}" "" \
   "Total: $(elapsed) s (budget $budget s)."
say "results: $report; total $(elapsed) s"
exit $failed
