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
same shape (numpy's fp16 and ml_dtypes' bf16 are not BLAS, so no bar). All
contenders of one shape are re-timed in alternating rounds. Writes
benchmarks/results/cpu_gemm.json and a plot.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import RESULTS, environment, geomean, load_shapes, pyplot, time_interleaved, write
from dispatcher.api import Dispatcher
from dispatcher.build import BuildCache
from dispatcher.cli import run_once
from dispatcher.kinds import prepare_gemm
from dispatcher.targets import cpu_isa
from dispatcher.timing import TimingOptions
from dispatcher.verify import random_matrix

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


def measure_isa(repeat: int) -> dict:
    """Rows for the ISA of $DISPATCHER_CPU_ISA, in this process."""
    with tempfile.TemporaryDirectory(prefix="cpu_gemm_cache_") as fresh:  # nothing pre-tuned
        return _measure(Dispatcher(cache=BuildCache(fresh), tuning=None), repeat)


def launcher(d: Dispatcher, config, m: int, n: int, k: int, dtype: str):
    """A zero-argument call of `config`'s kernel on an (m, n, k) problem."""
    rng = np.random.default_rng(0)
    a, b = random_matrix(m, k, dtype, "r", rng), random_matrix(k, n, dtype, "r", rng)
    problem, operands, _ = prepare_gemm(a, b, variant="regular", target="cpu")
    library = d.library(config)
    return lambda: d.launch(library, problem, operands)


def _measure(d: Dispatcher, repeat: int) -> dict:
    """Per shape: each dtype's default config and its best of CONFIGS (found
    with a short verified timing each), then the default, the best and
    numpy re-timed in alternating rounds (`time_interleaved`), so a burst of
    load on a shared machine lands on every contender of a ratio alike."""
    scan = TimingOptions(warmup=1, repeat=3)
    rows = []
    shapes = [tuple(s) for s in load_shapes()["cpu"]["regular_fp32"]]
    for m, n, k in tqdm(shapes, desc=cpu_isa.active().name, unit="shape"):
        contenders, picked = {}, {}
        for dtype in DTYPES:
            problem = prepare_gemm(random_matrix(m, k, dtype, "r", np.random.default_rng(0)),
                                   random_matrix(k, n, dtype, "r", np.random.default_rng(1)),
                                   variant="regular", target="cpu")[0]
            default = d.select(problem)
            scanned = [(run_once(d, variant="regular", m=m, n=n, k=k, dtype=dtype, layout="rrr",
                                 config=c, timing=scan, verify=True), c)
                       for c in [default] + [d.config_for(problem, f) for f in CONFIGS]]
            assert all(r["verified"] for r, _ in scanned), scanned
            best = max(scanned, key=lambda rc: rc[0]["gflops"])[1]
            picked[dtype] = (default, best)
            for config in {default, best}:  # each kernel timed once
                contenders[config.name] = launcher(d, config, m, n, k, dtype)
        rng = np.random.default_rng(0)
        a, b = rng.uniform(-1, 1, (m, k)).astype(np.float32), rng.uniform(-1, 1, (k, n)).astype(np.float32)
        contenders["numpy"] = lambda: a @ b
        seconds = time_interleaved(contenders, TimingOptions(warmup=2, repeat=repeat))
        gflops = {name: 2.0 * m * n * k / t / 1e9 for name, t in seconds.items()}
        for dtype in DTYPES:
            default, best = picked[dtype]
            if gflops[default.name] >= gflops[best.name]:
                best = default  # the re-timing has the last word: the default is one of the configs
            ours = {"default": gflops[default.name], "best": gflops[best.name]}
            row = {"dtype": dtype, "M": m, "N": n, "K": k,
                   "default_kernel": default.name, "default_gflops": round(ours["default"], 2),
                   "best_kernel": best.name, "best_gflops": round(ours["best"], 2)}
            if dtype == "fp32":  # first of DTYPES: the bar of the others
                ours_fp32 = ours
                row.update(baseline="numpy.matmul fp32 (OpenBLAS)", baseline_gflops=round(gflops["numpy"], 2),
                           **{f"{key}_vs_numpy": round(v / gflops["numpy"], 3) for key, v in ours.items()})
            else:
                row.update({f"{key}_vs_our_fp32": round(v / ours_fp32[key], 3) for key, v in ours.items()})
            rows.append(row)
        tqdm.write(f"{m}x{n}x{k}: " + ", ".join(f"{name} {v:.0f}" for name, v in gflops.items()) + " GFLOP/s")
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
    plt = pyplot(path)
    if plt is None:
        return
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
