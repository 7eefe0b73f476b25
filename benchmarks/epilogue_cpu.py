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

Each library is timed twice: alone (ours and numpy each in processes of
their own, so neither's worker threads share the cores with the other's;
--rounds rounds of one process per side, in alternating order, medians)
and alternating (every contender in one process, as user code mixes
them). Within a process the contenders of a size are timed in alternating
rounds (common.time_interleaved), medians; the ratio is numpy's time over
ours, alone and alternating (target >= 1.0 at every size, alone). Each
fused result is checked against a float64 reference of the same
definition first. Writes
benchmarks/results/epilogue_cpu.json (machine, ISA, versions, command, load
average before and after) and, where matplotlib is installed, a .png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

import dispatcher
from common import environment, pyplot, time_interleaved, warn_if_openblas_throttled, write
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


SIDES = ("ours", "numpy")


def measure(size: int, activations, timing: TimingOptions, erf, rng, sides=SIDES) -> dict:
    """{contender: median seconds} at size^3 of `sides`' contenders: ours
    (dispatcher_matmul, fused_<act>), numpy's (numpy_matmul, unfused_<act>);
    with ours, each fused result's max_rel_<act> against float64."""
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

    contenders = {}
    if "ours" in sides:
        contenders["dispatcher_matmul"] = lambda: dispatcher.matmul(a, b, out=plain)
    if "numpy" in sides:
        contenders["numpy_matmul"] = lambda: np.matmul(a, b, out=plain)
    errors = {}
    with np.errstate(over="ignore"):
        for name in activations:
            if "ours" in sides:
                call = (lambda name: lambda: dispatcher.matmul(a, b, bias=bias, activation=name,
                                                               out=fused[name]))(name)
                call()  # builds and selects once
                error = errors[f"max_rel_{name}"] = max_rel(fused[name], reference(a, b, bias, name, erf))
                limit = dtypes.relative_tolerance("fp32", k)
                if error > limit:
                    raise SystemExit(f"{size}^3 {name}: max_rel {error:.3g} > {limit:.3g}")
                contenders[f"fused_{name}"] = call
            if "numpy" in sides:
                contenders[f"unfused_{name}"] = unfused(name)
        return {**time_interleaved(contenders, timing), **errors}


def alone(size: int, args) -> dict:
    """`measure` of each side in child processes of its own (this script
    with --side): `args.rounds` rounds, the sides' order alternating from
    round to round, each contender's median over the rounds. (One child per
    side, one after the other, let a slow minute of a shared machine land on
    one side only.)"""
    rounds = []
    for r in range(args.rounds):
        times = {}
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            done = subprocess.run([sys.executable, __file__, "--side", side, "--sizes", str(size),
                                   "--activations", args.activations, "--repeat", str(args.repeat)],
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode:
                raise SystemExit(f"the {side} child failed:\n{done.stderr}")
            times.update(json.loads(done.stdout.strip().splitlines()[-1]))
        rounds.append(times)
    return {key: float(np.median([times[key] for times in rounds])) for key in rounds[0]}


def rows_of(size: int, activations, together: dict, apart: dict) -> list:
    """One row per activation: alone and alternating times and ratios, and
    the fused result's error against float64."""
    m = n = k = size
    flops = 2.0 * m * n * k
    rows = []
    for name in activations:
        row = dict(m=m, n=n, k=k, activation=name)
        for mode, times in (("alone", apart), ("alternating", together)):
            ours, numpys = times[f"fused_{name}"], times[f"unfused_{name}"]
            row[mode] = dict(fused_s=ours, numpy_unfused_s=numpys, speedup=numpys / ours,
                             fused_gflops=flops / ours / 1e9, dispatcher_matmul_s=times["dispatcher_matmul"],
                             numpy_matmul_s=times["numpy_matmul"])
        row["speedup"] = row["alone"]["speedup"]
        row["max_rel_vs_float64"] = together[f"max_rel_{name}"]
        print(f"{size}^3 {name:>4}: {row['alone']['speedup']:.2f}x numpy unfused alone, "
              f"{row['alternating']['speedup']:.2f}x alternating (alone: {row['alone']['fused_s'] * 1e3:.2f} vs "
              f"{row['alone']['numpy_unfused_s'] * 1e3:.2f} ms; plain GEMMs alone: ours "
              f"{apart['dispatcher_matmul'] * 1e3:.2f}, numpy {apart['numpy_matmul'] * 1e3:.2f} ms)", flush=True)
        rows.append(row)
    return rows


def plot(payload: dict, path: Path):
    plt = pyplot(path)
    if plt is None:
        return
    rows = payload["rows"]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6), 4))
    width = 0.4
    for offset, mode in ((-width / 2, "alone"), (width / 2, "alternating")):
        ax.bar([i + offset for i in range(len(rows))], [r[mode]["speedup"] for r in rows], width, label=mode)
    ax.axhline(payload["target"], color="red", lw=1)
    ax.legend()
    ax.set_xticks(range(len(rows)), [f"{r['m']}^3\n{r['activation']}" for r in rows], fontsize=7)
    ax.set_ylabel("numpy unfused time / fused time (median)")
    ax.set_title(f"GEMM + bias + activation, fp32\n{payload['environment']['isa']} (red: target)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="512,1024,2048", help="M = N = K values, comma-separated")
    parser.add_argument("--activations", default=",".join(ACTIVATIONS))
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per contender")
    parser.add_argument("--rounds", type=int, default=3, help="child processes per side, alternating (alone)")
    parser.add_argument("--out", default="epilogue_cpu", help="name under benchmarks/results, or a path")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child of `alone`
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
    timing = TimingOptions(warmup=2, repeat=args.repeat)
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.side:  # a child: its side's times as one JSON line
        print(json.dumps({key: value for size in sizes for key, value in
                          measure(size, activations, timing, erf, np.random.default_rng(0), (args.side,)).items()}))
        return
    load_before = os.getloadavg()
    rows = []
    for size in sizes:
        together = measure(size, activations, timing, erf, np.random.default_rng(0))
        rows += rows_of(size, activations, together, alone(size, args))
    env = dict(environment(), isa=cpu_isa.active().name, scipy=scipy_version,
               gemm_dispatcher=metadata.version("gemm-dispatcher"),
               load_average_before=load_before, load_average_after=os.getloadavg())
    payload = dict(environment=env, rows=rows, target=1.0,
                   met=all(r["alone"]["speedup"] >= 1.0 for r in rows if r["activation"] != "none"))
    path = write(args.out, payload)
    print(f"wrote {path}")
    plot(payload, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
