"""What this machine can do at most: the ceilings the CPU ratios live under.

    python benchmarks/cpu_ceiling.py

Builds a small probe with the CPU target's compiler and its kernel flags
(-O3 -march=native -fopenmp) and measures, on all threads:

- the FMA peak: independent vector FMAs on registers only, no memory;
- the read bandwidth: one pass of vector loads over a 256 MB array (far
  past the caches).

A GEMM kernel runs under the FMA peak; a ratio target that needs a rate
above it cannot be met by any kernel. Writes benchmarks/results/cpu_ceiling.json.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from common import environment, write
from dispatcher import targets
from dispatcher.targets import cpu_isa

PROBE = r"""
#include <omp.h>
#include <cstdio>
#include <cstdlib>
typedef float vec __attribute__((vector_size(VEC_BYTES)));
constexpr int kLanes = VEC_BYTES / 4, kChains = 12;  // enough chains to hide FMA latency

double fma_gflops(long iters) {
    double t0 = omp_get_wtime();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        vec acc[kChains], a, b;
        for (int i = 0; i < kChains; ++i) for (int j = 0; j < kLanes; ++j) acc[i][j] = i + j;
        for (int j = 0; j < kLanes; ++j) a[j] = 0.999f, b[j] = 1e-4f;
        for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
            for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * a + b;
            __asm__ volatile("" : "+v"(a));  // keep the loop from being folded
        }
        for (int i = 0; i < kChains; ++i) for (int j = 0; j < kLanes; ++j) sink += acc[i][j];
    }
    double seconds = omp_get_wtime() - t0;
    if (sink == 12345.f) std::puts("");
    return 2.0 * kLanes * kChains * iters * omp_get_max_threads() / seconds / 1e9;
}

double read_gbs(const float* x, size_t n) {
    double t0 = omp_get_wtime();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        vec s[4] = {};  // independent sums, so the loads are not serialized
        const size_t per = n / omp_get_num_threads(), begin = per * omp_get_thread_num();
        for (size_t i = begin; i < begin + per; i += 4 * kLanes)
            for (int u = 0; u < 4; ++u) s[u] += *reinterpret_cast<const vec*>(x + i + u * kLanes);
        for (int u = 0; u < 4; ++u) sink += s[u][0];
    }
    double seconds = omp_get_wtime() - t0;
    if (sink == -1) std::puts("");
    return n * sizeof(float) / seconds / 1e9;
}

int main() {
    size_t n = size_t(64) << 20;
    float* x = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) x[i] = 1.0f;  // first touch by the reading threads
    for (int r = 0; r < 5; ++r) std::printf("%d %.2f %.2f\n", omp_get_max_threads(), fma_gflops(100000000), read_gbs(x, n));
}
"""


def main():
    toolchain = targets.get("cpu").toolchain()
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "probe.cpp", Path(tmp) / "probe"
        src.write_text(PROBE)
        flags = [f for f in toolchain.flags if f != "-shared"]  # the kernels' flags, for a program
        subprocess.run([toolchain.compiler, *flags, f"-DVEC_BYTES={cpu_isa.active().isa.vector_bytes}", str(src), "-o", str(exe)],
                       check=True)
        lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    rows = [line.split() for line in lines if line.strip()]
    threads = int(rows[0][0])
    fma, read = sorted(float(r[1]) for r in rows), sorted(float(r[2]) for r in rows)
    result = {"threads": threads, "vector_bytes": cpu_isa.active().isa.vector_bytes, "isa": cpu_isa.active().name,
              "fma_peak_gflops_fp32": fma[len(fma) // 2], "read_bandwidth_gbs": read[len(read) // 2],
              "runs": {"fma_gflops": fma, "read_gbs": read}}
    print(result)
    print(f"wrote {write('cpu_ceiling', {'environment': environment(), **result})}")


if __name__ == "__main__":
    main()
