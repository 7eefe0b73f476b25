"""GPU time of each kernel one `dispatcher.gemm` call launches (staging copies
and the GEMM apart), beside `torch.matmul`'s, from torch.profiler: where an
unaligned or skinny call's GPU time goes.

    python3 benchmarks/kernel_times.py [--shapes 2047x1x4096r,511x2049x3071r]

Each shape is MxNxK and B's storage (r: row-major (K, N); c: the transpose of
a row-major (N, K), as a Linear's weight); bf16 on the current CUDA device.
Prints, per library, each kernel's mean time over 5 calls after warm-up.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import dispatcher

SHAPES = "2047x1x4096r,511x2049x3071r,1x4096x4096c,999x1023x777c"


def operands(spec: str):
    m, n, k = (int(x) for x in spec[:-1].split("x"))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if spec[-1] == "r":
        return a, torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    return a, torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()


def kernel_times(fn, calls: int = 5) -> list:
    """[(kernel name, mean us per launch, launches)] of `calls` calls of fn."""
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [(e.key, e.device_time_total / e.count, e.count) for e in p.key_averages()
            if e.device_time_total > 0 and e.count]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    args = parser.parse_args()
    for spec in args.shapes.split(","):
        a, b = operands(spec)
        for _ in range(3):  # selection, loading, params
            dispatcher.gemm(a, b)
            torch.matmul(a, b)
        torch.cuda.synchronize()
        for name, fn in (("dispatcher.gemm", lambda: dispatcher.gemm(a, b)), ("torch.matmul", lambda: torch.matmul(a, b))):
            rows = kernel_times(fn)
            print(f"{spec} {name}: " + "; ".join(f"{k[:70]} {t:.1f} us x{c}" for k, t, c in rows), flush=True)


if __name__ == "__main__":
    main()
