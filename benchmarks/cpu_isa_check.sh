#!/usr/bin/env bash
# The CPU ISA extensions on a machine that has them (issue 25): the GPU host's
# Xeon has AMX-BF16, AMX-INT8, AVX512-FP16, AVX512-BF16, AVX512-VNNI and AVX-VNNI,
# which the 2-core development machine lacks. One command from the repository root:
#
#   OUT=/some/dir bash benchmarks/cpu_isa_check.sh            # tests, then the benchmark (OUT: a new temporary folder if unset)
#   OUT=/some/dir bash benchmarks/cpu_isa_check.sh tests      # or one part: tests | bench
#
# tests: tests/test_cpu_dot_kernels.py and test_cpu_isa.py (every micro-kernel
#   this machine runs, each with its own ISA spec, in every variant; those it
#   cannot run skip with the reason) and the parity tests (-m parity: every
#   variant x dtype x layout, the whole product: the fast suite runs a Latin square of it) under the default ISA spec and under every other
#   DISPATCHER_CPU_ISA setting of this machine (`cpu_isa.parity_settings()`:
#   each extension off, each other base ISA), all at once, one pytest per test
#   file and setting, sharing one build cache (a kernel a setting does not
#   change is built once). Logs: $OUT/isa_tests/*.log; a summary line per run.
# bench: benchmarks/cpu_gemm.py, fp32/bf16/int8 of the default spec against
#   numpy (OpenBLAS) and torch (oneDNN; torch._int_mm), each library alone in
#   its process and alternating in one: $OUT/cpu_gemm.json (and .png where
#   matplotlib imports). BENCH_ARGS adds arguments (e.g. "--isas
#   avx512,avx512-bf16-vnni-amxbf16-amxint8" to measure extensions off too,
#   "--shapes 1024x1024x1024,64x4096x4096" for other shapes; GEMM_SHAPES is
#   the path of a shape corpus, not a list).
#
# Runs from the source tree as it is (no install needed): the variants'
# entry points are declared to Python from a dist-info written under $OUT.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$(mktemp -d)}
echo "results, logs and the build cache in $OUT"
# Time limits of the parts (seconds; each pytest job, the benchmark): both
# together expected to take about 7 minutes on a 16-core machine; raise them
# on a smaller one, or run the parts as two commands.
TESTS_TIMEOUT=${TESTS_TIMEOUT:-290} BENCH_TIMEOUT=${BENCH_TIMEOUT:-400}
mkdir -p "$OUT/isa_tests"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT:$ROOT/plugins${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "from dispatcher.plugins import get_manager; assert 'regular' in get_manager().variants()" 2>/dev/null; then
  SITE=$OUT/isa_tests/site/gemm_dispatcher_check-0.0.0.dist-info
  mkdir -p "$SITE"
  printf 'Metadata-Version: 2.1\nName: gemm-dispatcher-check\nVersion: 0.0.0\n' > "$SITE/METADATA"
  python3 - "$SITE/entry_points.txt" <<'EOF'
import sys, tomllib
eps = tomllib.load(open("pyproject.toml", "rb"))["project"]["entry-points"]["dispatcher.plugins"]
open(sys.argv[1], "w").write("[dispatcher.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
EOF
  export PYTHONPATH="$PYTHONPATH:$(dirname "$SITE")"
fi
python3 - <<'EOF' | tee "$OUT/isa_tests/machine.txt"
import os
from dispatcher.targets import cpu_isa
print("cpu:", next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"))
print("cores:", len(os.sched_getaffinity(0)), "load average:", os.getloadavg())
print("kernel:", " ".join(os.uname()[2:4]))  # gVisor reports 4.4.0; a Firecracker VM its own
print("default ISA spec:", cpu_isa.active().name, "| runs:", ", ".join(cpu_isa.runnable_specs()))
print("parity settings:", " ".join(cpu_isa.parity_settings()) or "(none)")
EOF

tests() {
  # Many pytest processes at once, sharing one build cache: few OpenMP
  # threads each, sleeping when idle.
  export DISPATCHER_TEST_CACHE_DIR=$OUT/isa_tests/cache OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive
  local files settings setting file name code note pids=() names=() status=0
  files=$(grep -lE "mark.parity|parity_grid\(" tests/test_*.py)
  settings="default $(python3 -c 'from dispatcher.targets import cpu_isa; print(*cpu_isa.parity_settings())')"
  # -m "not gpu": the micro-kernel tests are marked `kernels`, which the
  # default addopts deselect (without it none of them ran: "51 deselected");
  # four xdist workers where pytest-xdist is installed (many builds).
  # -o addopts=: not pyproject's "-n auto" (these runs pick their own
  # workers, and -n is unknown where pytest-xdist is not installed).
  python3 -c "import xdist" 2>/dev/null && xdist="-n 4" || xdist=""
  env -u DISPATCHER_CPU_ISA timeout $TESTS_TIMEOUT python3 -m pytest -q -rs -p no:cacheprovider -o addopts= -m "not gpu" \
    $xdist tests/test_cpu_dot_kernels.py tests/test_cpu_isa.py > "$OUT/isa_tests/micro_kernels.log" 2>&1 &
  pids+=($!) names+=(micro_kernels)
  for setting in $settings; do
    for file in $files; do
      name=$setting.$(basename "$file" .py)
      if [ "$setting" = default ]; then env -u DISPATCHER_CPU_ISA timeout $TESTS_TIMEOUT python3 -m pytest -q \
          -m "parity and not gpu" -p no:cacheprovider -o addopts= "$file" > "$OUT/isa_tests/$name.log" 2>&1 &
      else DISPATCHER_CPU_ISA=$setting timeout $TESTS_TIMEOUT python3 -m pytest -q -m "parity and not gpu" \
          -p no:cacheprovider -o addopts= "$file" > "$OUT/isa_tests/$name.log" 2>&1 &
      fi
      pids+=($!) names+=("$name")
    done
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    code=$?
    [ $code = 0 ] || status=1
    [ $code = 124 ] && note="TIMED OUT after $TESTS_TIMEOUT s; last line: " || note=""
    echo "${names[$i]}: $note$(tail -1 "$OUT/isa_tests/${names[$i]}.log")"
  done
  grep -h SKIPPED "$OUT/isa_tests/micro_kernels.log" | sort | uniq -c | head -20
  return $status
}

bench() {
  timeout $BENCH_TIMEOUT python3 benchmarks/cpu_gemm.py --out "$OUT/cpu_gemm" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/cpu_gemm.log" | tail -40
}

status=0
for step in ${@:-tests bench}; do
  case $step in
    tests) tests || status=1 ;;
    bench) bench || status=1 ;;
    *) echo "unknown step $step (tests, bench)"; exit 2 ;;
  esac
done
exit $status
