"""Regular GEMM on the CPU target vs numpy (OpenBLAS), per ISA the machine runs.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/cpu_gemm.py [--isas avx512,avx2]

Each ISA is measured in its own process with `DISPATCHER_CPU_ISA` set and a
fresh build cache, against OpenBLAS restricted to the same instruction set
where it is not this machine's best (`OPENBLAS_CORETYPE=Haswell` for AVX2 on
an AVX-512 machine, `Nehalem`, SSE only, for the generic ISA), so every
ratio compares code of one ISA. Per shape and dtype:

- default: what a user gets with no sweep: selection from the plugin's
  defaults (no tuning database);
- best: the best of a few block tiles around the defaults (the tile engine
  sweeps many more).

fp32 is compared with `numpy.matmul`; fp16 and bf16 with our own fp32 at the
same shape (numpy's fp16 and ml_dtypes' bf16 are not BLAS, so they are
recorded but are no bar). Writes benchmarks/results/cpu_gemm.json and a plot.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import RESULTS, environment, geomean, load_shapes, time_call, write
from dispatcher.api import Dispatcher
from dispatcher.build import BuildCache
from dispatcher.cli import run_once
from dispatcher.targets import cpu_isa
from dispatcher.timing import TimingOptions

# Block tiles "best" is chosen from, besides the defaults: multiples of every
# ISA's micro-tile.
CONFIGS = [
    dict(tile_m=120, tile_n=512, tile_k=256),
    dict(tile_m=240, tile_n=512, tile_k=256),
    dict(tile_m=96, tile_n=256, tile_k=256),
    dict(tile_m=48, tile_n=512, tile_k=256),
    dict(tile_m=96, tile_n=128, tile_k=256),
]
DTYPES = ("fp32", "fp16", "bf16")


def openblas_coretype(isa: str) -> str | None:
    """The OpenBLAS core restricted to `isa`'s instructions (None: its best)."""
    if isa == cpu_isa.supported()[0].name:
        return None
    return {"avx2": "Haswell", "generic": "Nehalem"}.get(isa)


def settled(fn, *args, **kwargs):
    """fn(...) after an idle pause: OpenBLAS's and OpenMP's threads spin for a
    while after a call, and a contender timed inside that window shares the
    cores with them (measured: 3-4x slower on 16 cores)."""
    time.sleep(0.5)
    return fn(*args, **kwargs)


def measure_isa(repeat: int) -> dict:
    """Rows for the ISA of $DISPATCHER_CPU_ISA, in this process."""
    with tempfile.TemporaryDirectory(prefix="cpu_gemm_cache_") as fresh:  # nothing pre-tuned
        return _measure(Dispatcher(cache=BuildCache(fresh), tuning=None), repeat)


def _measure(d: Dispatcher, repeat: int) -> dict:
    timing = TimingOptions(warmup=3, repeat=repeat)
    rows, ours_fp32 = [], {}
    shapes = [tuple(s) for s in load_shapes()["cpu"]["regular_fp32"]]
    for dtype, (m, n, k) in tqdm([(t, s) for s in shapes for t in DTYPES], desc=cpu_isa.active().name,
                                 unit="case"):
        run = dict(variant="regular", m=m, n=n, k=k, dtype=dtype, layout="rrr", timing=timing, verify=True)
        default = settled(run_once, d, **run)
        best = max([default] + [settled(run_once, d, config=c, **run) for c in CONFIGS],
                   key=lambda r: r["gflops"])
        assert default["verified"] and best["verified"], (default, best)
        row = {"dtype": dtype, "M": m, "N": n, "K": k,
               "default_kernel": default["kernel"], "default_gflops": round(default["gflops"], 2),
               "best_kernel": best["kernel"], "best_gflops": round(best["gflops"], 2),
               "max_rel": max(default["max_rel"], best["max_rel"])}
        if dtype == "fp32":
            rng = np.random.default_rng(0)
            a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
            numpy_gflops = 2.0 * m * n * k / settled(time_call, lambda: a @ b, timing) / 1e9
            row.update(baseline="numpy.matmul fp32 (OpenBLAS)", baseline_gflops=round(numpy_gflops, 2),
                       default_vs_numpy=round(default["gflops"] / numpy_gflops, 3),
                       best_vs_numpy=round(best["gflops"] / numpy_gflops, 3))
            ours_fp32[(m, n, k)] = (default["gflops"], best["gflops"])
        else:
            fp32_default, fp32_best = ours_fp32[(m, n, k)]
            row.update(default_vs_our_fp32=round(default["gflops"] / fp32_default, 3),
                       best_vs_our_fp32=round(best["gflops"] / fp32_best, 3))
        rows.append(row)
        tqdm.write(f"{dtype:5} {m}x{n}x{k}: default {row['default_gflops']:7.1f}, best "
                   f"{row['best_gflops']:7.1f} GFLOP/s"
                   + (f" ({row['default_vs_numpy']:.3f}x / {row['best_vs_numpy']:.3f}x numpy)"
                      if dtype == "fp32" else
                      f" ({row['default_vs_our_fp32']:.2f}x / {row['best_vs_our_fp32']:.2f}x our fp32)"))
    fp32 = [r for r in rows if r["dtype"] == "fp32"]
    summary = {
        "fp32_default_vs_numpy_geomean": round(geomean(r["default_vs_numpy"] for r in fp32), 3),
        "fp32_best_vs_numpy_geomean": round(geomean(r["best_vs_numpy"] for r in fp32), 3),
        **{f"fp32_{key}_vs_numpy_at_{s}": r[f"{key}_vs_numpy"]
           for r in fp32 for s in (1024, 2048) if (r["M"], r["N"], r["K"]) == (s, s, s)
           for key in ("default", "best")},
        **{f"{t}_{key}_vs_our_fp32_geomean": round(geomean(r[f"{key}_vs_our_fp32"] for r in rows
                                                           if r["dtype"] == t), 3)
           for t in ("fp16", "bf16") for key in ("default", "best")},
    }
    return {"isa": cpu_isa.active().name, "environment": environment(), "summary": summary, "rows": rows}


def run_child(isa: str, repeat: int) -> dict:
    """measure_isa in a new process: OpenBLAS reads its core type at load."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env[cpu_isa.ENV] = isa
    if openblas_coretype(isa):
        env["OPENBLAS_CORETYPE"] = openblas_coretype(isa)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run([sys.executable, __file__, "--child", str(out), "--repeat", str(repeat)],
                       env=env, check=True)
        return json.loads(out.read_text())


def plot(results: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results):
        fp32 = [r for r in res["rows"] if r["dtype"] == "fp32"]
        x = np.arange(len(fp32))
        ax.bar(x - 0.2, [r["default_vs_numpy"] for r in fp32], 0.4, label="default (no sweep)")
        ax.bar(x + 0.2, [r["best_vs_numpy"] for r in fp32], 0.4, label="best of configs")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.95, color="g", ls="--", lw=0.8)
        ax.axhline(0.9, color="r", ls=":", lw=0.8)
        ax.set_xticks(x, [f"{r['M']}x{r['N']}x{r['K']}" for r in fp32], rotation=20, fontsize=8)
        core = res["environment"].get("OPENBLAS_CORETYPE") or "native"
        ax.set_title(f"fp32, ISA {res['isa']} vs OpenBLAS ({core})", fontsize=9)
        ax.set_ylabel("GFLOP/s ratio vs numpy")
        ax.legend(fontsize=7)
    fig.suptitle(results[0]["environment"]["cpu"] + ", " + results[0]["environment"]["cpus"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isas", default=",".join(i.name for i in cpu_isa.supported()),
                    help="comma-separated ISAs to measure (default: every one this machine runs)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", default="cpu_gemm")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        Path(args.child).write_text(json.dumps(measure_isa(args.repeat)))
        return
    isas = [s for s in args.isas.split(",") if s]
    for isa in isas:
        cpu_isa.get(isa)
    results = [run_child(isa, args.repeat) for isa in isas]
    payload = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
               "timing": {"warmup": 3, "repeat": args.repeat, "statistic": "median"},
               "native_isa": cpu_isa.supported()[0].name,
               "per_isa": results}
    path = write(args.out, payload)
    plot(results, RESULTS / f"{args.out}.png")
    for res in results:
        print(res["isa"], res["summary"])
    print(f"wrote {path} and {args.out}.png")


if __name__ == "__main__":
    main()
