"""Fused GEMM + bias + activation on the CPU against numpy's unfused equivalent.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/epilogue_cpu.py

fp32, M = N = K in 512, 1024, 2048, a per-column bias, each activation the
epilogue offers (none = bias only). Ours: `dispatcher.matmul(a, b,
bias=bias, activation=act, out=out)`, one kernel (its default selection).
numpy's: `np.matmul(a, b, out=y)`, `y += bias`, then the activation in
numpy on preallocated buffers, with our definitions: relu = max(y, 0),
gelu = y * 0.5 * (1 + erf(y / sqrt 2)) (the exact erf; numpy has none, so
`scipy.special.erf`, a compiled ufunc), silu = y / (1 + exp(-y)). Both
plain GEMMs (our default kernel, `np.matmul`) are timed with them, so the
share of the activation is visible. Inputs are scaled so the
pre-activations are about N(0, 1), where the activations do real work.

Every contender of a size is timed in alternating rounds in one run
(common.time_interleaved), medians; the ratio is numpy's time over ours
(target >= 1.0 at every size). Each fused result is checked against a
float64 reference of the same definition first. Writes
benchmarks/results/epilogue_cpu.json (machine, ISA, versions, command, load
average before and after) and, where matplotlib is installed, a .png.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from importlib import metadata

import numpy as np

import dispatcher
from common import RESULTS, environment, pyplot, time_interleaved, warn_if_openblas_throttled, write
from dispatcher import dtypes
from dispatcher.targets import cpu_isa
from dispatcher.timing import TimingOptions
from dispatcher.verify import max_rel

ACTIVATIONS = ("none", "relu", "gelu", "silu")
SQRT1_2 = 1.0 / math.sqrt(2.0)


def numpy_activation(name: str, erf):
    """The activation in numpy, in place on y, with t a scratch buffer."""
    def relu(y, t):
        np.maximum(y, 0.0, out=y)

    def gelu(y, t):
        np.multiply(y, SQRT1_2, out=t)
        erf(t, out=t)
        t += 1.0
        t *= 0.5
        y *= t

    def silu(y, t):
        np.negative(y, out=t)
        np.exp(t, out=t)
        t += 1.0
        np.divide(y, t, out=y)

    return {"none": lambda y, t: None, "relu": relu, "gelu": gelu, "silu": silu}[name]


def reference(a, b, bias, name: str, erf) -> np.ndarray:
    y = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)
    numpy_activation(name, erf)(y, np.empty_like(y))
    return y


def measure(size: int, activations, timing: TimingOptions, erf, rng) -> list:
    m = n = k = size
    a = (rng.standard_normal((m, k)) / math.sqrt(k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    plain, theirs, scratch = (np.empty((m, n), np.float32) for _ in range(3))
    fused = {name: np.empty((m, n), np.float32) for name in activations}

    def unfused(name):
        act = numpy_activation(name, erf)

        def run():
            np.matmul(a, b, out=theirs)
            np.add(theirs, bias, out=theirs)
            act(theirs, scratch)
        return run

    contenders = {"dispatcher_matmul": lambda: dispatcher.matmul(a, b, out=plain),
                  "numpy_matmul": lambda: np.matmul(a, b, out=plain)}
    errors = {}
    with np.errstate(over="ignore"):
        for name in activations:
            call = (lambda name: lambda: dispatcher.matmul(a, b, bias=bias, activation=name,
                                                           out=fused[name]))(name)
            call()  # builds and selects once
            errors[name] = max_rel(fused[name], reference(a, b, bias, name, erf))
            limit = dtypes.relative_tolerance("fp32", k)
            if errors[name] > limit:
                raise SystemExit(f"{size}^3 {name}: max_rel {errors[name]:.3g} > {limit:.3g}")
            contenders[f"fused_{name}"] = call
            contenders[f"unfused_{name}"] = unfused(name)
        times = time_interleaved(contenders, timing)

    flops = 2.0 * m * n * k
    rows = []
    for name in activations:
        ours, numpys = times[f"fused_{name}"], times[f"unfused_{name}"]
        row = dict(m=m, n=n, k=k, activation=name, fused_s=ours, numpy_unfused_s=numpys,
                   speedup=numpys / ours, fused_gflops=flops / ours / 1e9,
                   dispatcher_matmul_s=times["dispatcher_matmul"], numpy_matmul_s=times["numpy_matmul"],
                   max_rel_vs_float64=errors[name])
        print(f"{size}^3 {name:>4}: {row['speedup']:.2f}x numpy unfused ({ours * 1e3:.2f} vs "
              f"{numpys * 1e3:.2f} ms; plain GEMMs: ours {times['dispatcher_matmul'] * 1e3:.2f}, numpy "
              f"{times['numpy_matmul'] * 1e3:.2f} ms)", flush=True)
        rows.append(row)
    return rows


def plot(payload: dict):
    plt = pyplot(RESULTS / "epilogue_cpu.png")
    if plt is None:
        return
    rows = payload["rows"]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6), 4))
    ax.bar(range(len(rows)), [r["speedup"] for r in rows])
    ax.axhline(payload["target"], color="red", lw=1)
    ax.set_xticks(range(len(rows)), [f"{r['m']}^3\n{r['activation']}" for r in rows], fontsize=7)
    ax.set_ylabel("numpy unfused time / fused time (median)")
    ax.set_title(f"GEMM + bias + activation, fp32, {payload['environment']['isa']} (red: target)")
    fig.tight_layout()
    fig.savefig(RESULTS / "epilogue_cpu.png", dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="512,1024,2048", help="M = N = K values, comma-separated")
    parser.add_argument("--activations", default=",".join(ACTIVATIONS))
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per contender")
    args = parser.parse_args()
    try:
        from scipy import __version__ as scipy_version
        from scipy.special import erf
    except ImportError:
        raise SystemExit("the numpy baseline of gelu needs scipy.special.erf: pip install scipy")
    warn_if_openblas_throttled()
    activations = [a for a in args.activations.split(",") if a]
    unknown = sorted(set(activations) - set(ACTIVATIONS))
    if unknown:
        raise SystemExit(f"unknown activation(s) {unknown}; choose from {', '.join(ACTIVATIONS)}")
    rng = np.random.default_rng(0)
    timing = TimingOptions(warmup=2, repeat=args.repeat)
    load_before = os.getloadavg()
    rows = [row for size in map(int, args.sizes.split(",")) for row in
            measure(size, activations, timing, erf, rng)]
    env = dict(environment(), isa=cpu_isa.active().name, scipy=scipy_version,
               gemm_dispatcher=metadata.version("gemm-dispatcher"),
               load_average_before=load_before, load_average_after=os.getloadavg())
    payload = dict(environment=env, rows=rows, target=1.0,
                   met=all(r["speedup"] >= 1.0 for r in rows if r["activation"] != "none"))
    print(f"wrote {write('epilogue_cpu', payload)}")
    plot(payload)


if __name__ == "__main__":
    main()
