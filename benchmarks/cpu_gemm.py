"""GEMM on the CPU target vs numpy (OpenBLAS) and torch (oneDNN), per ISA spec.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/cpu_gemm.py [--isas avx512,avx512-bf16] [--dtypes fp32,bf16,int8] [--layouts rrr,rcr]

Shapes: the public corpus's CPU shapes (1024^3 and 2048^3 where it is not
found), an odd one (257x1031x2049), skinny M (64 and 16 x 4096 x 4096) and a vector times
a matrix and a matrix times a vector (1 x 4096 x 4096, 4096 x 1 x 4096). Per ISA spec (`DISPATCHER_CPU_ISA`,
default: this machine's best with all its extensions) a child process with
a fresh build cache and no tuning database measures, per shape, layout
(`--layouts`: rrr, numpy's `a @ b`, by default; rcr is `x @ W.T`, a Linear's
forward, with W stored (N, K)) and dtype:

- ours: `dispatcher.gemm`'s default selection (regular variant), all threads;
- numpy.matmul (OpenBLAS) for fp32, restricted to the spec's base ISA where it
  is not this machine's best (`OPENBLAS_CORETYPE=Haswell` for avx2,
  `Nehalem`, SSE only, for generic), so a ratio compares code of one ISA;
- torch.matmul (oneDNN) for fp32 and bf16, `torch._int_mm` for int8 (int32
  out), as many threads as ours.

Each is timed twice: alone, each library in its own process (nothing else
loaded holds threads or caches; `--alone-rounds` rounds of one process per
library, the order rotated each round, and the median of the rounds: a
shared VM's speed drifts over minutes, and one round measured one library
minutes after the other), and alternating in one process
(`common.time_interleaved`: a burst of load on a shared machine lands on
every contender alike). A contender whose first call takes over
`SLOW_S` seconds (torch's bf16 and int8 on a CPU without their instructions
run a reference loop, about 1 GOP/s) is timed once more instead, so the
run stays bounded. Ratios are ours / baseline; bf16 and int8 also
ours / our fp32 at the same shape. `--best` adds the best of a few block
tiles around the defaults (verified; alternating mode only).

Writes benchmarks/results/<out>.json (CPU model, its ISA flags, the load
average before and after) and, where matplotlib imports, a plot.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import (RESULTS, environment, geomean, load_shapes, pyplot, rotated, time_call, time_interleaved,
                    write)
from dispatcher.api import Dispatcher
from dispatcher.build import BuildCache
from dispatcher.cli import run_once
from dispatcher.kinds import prepare_gemm
from dispatcher.targets import cpu_isa
from dispatcher.targets.cpu import cpu_count
from dispatcher.timing import TimingOptions
from dispatcher.verify import random_matrix

ODD = [(257, 1031, 2049)]
SKINNY = [(64, 4096, 4096), (16, 4096, 4096), (1, 4096, 4096), (4096, 1, 4096)]  # the last two: vectors
DTYPES = ("fp32", "bf16", "int8")
SLOW_S = 1.0
LIBRARIES = ("ours", "numpy", "torch")
# Block tiles --best scans besides the defaults: multiples of every ISA's micro-tile.
CONFIGS = [
    dict(tile_m=120, tile_n=512, tile_k=256),
    dict(tile_m=240, tile_n=512, tile_k=256),
    dict(tile_m=96, tile_n=256, tile_k=256),
    dict(tile_m=48, tile_n=512, tile_k=256),
    dict(tile_m=96, tile_n=128, tile_k=256),
    # short ones: more tiles than a 16-core machine's workers at 512^3 (the catalog's give at most 24)
    dict(tile_m=48, tile_n=128, tile_k=256),
    dict(tile_m=96, tile_n=64, tile_k=256),
]


# Where the public corpus is not at hand (a device run without shared/).
SQUARES = [(1024, 1024, 1024), (2048, 2048, 2048)]


def shapes(text: str | None) -> list:
    if text:
        return [tuple(int(x) for x in s.split("x")) for s in text.split(",")]
    try:
        corpus = [tuple(s) for s in load_shapes()["cpu"]["regular_fp32"]]
    except SystemExit as missing:
        print(f"{missing}: measuring {SQUARES} instead", file=sys.stderr)
        corpus = SQUARES
    return corpus + ODD + SKINNY


def openblas_coretype(spec: str) -> str | None:
    """The OpenBLAS core restricted to `spec`'s base ISA (None: its best)."""
    base = cpu_isa.get(spec).isa
    if base == cpu_isa.supported()[0]:
        return None
    return {"avx2": "Haswell", "generic": "Nehalem"}.get(base.name)


def baselines(dtype: str) -> tuple:
    """The libraries ours is compared with for `dtype` (torch where it imports)."""
    names = ("numpy", "torch") if dtype == "fp32" else ("torch",)
    try:
        import torch  # noqa: F401
    except ImportError:
        names = tuple(n for n in names if n != "torch")
    return names


class Problem:
    """One (shape, dtype): its inputs, and a zero-argument call per library."""

    def __init__(self, d: Dispatcher, m: int, n: int, k: int, dtype: str, layout: str = "rrr"):
        self.m, self.n, self.k, self.dtype, self.layout, self.d = m, n, k, dtype, layout, d
        rng = np.random.default_rng(0)
        self.a, self.b = random_matrix(m, k, dtype, layout[0], rng), random_matrix(k, n, dtype, layout[1], rng)
        # out too: the operands point at it, and every launch writes it
        self.problem, self.operands, self.out = prepare_gemm(self.a, self.b, variant="regular", target="cpu")
        self.default = d.select(self.problem)

    def ours(self, config=None):
        library = self.d.library(config or self.default)
        return lambda: self.d.launch(library, self.problem, self.operands)

    def numpy(self):
        a, b = self.a, self.b
        return lambda: a @ b

    def torch(self):
        import torch
        torch.set_num_threads(cpu_count())
        if self.dtype == "int8":
            a, b = torch.from_numpy(self.a), torch.from_numpy(self.b)
            return lambda: torch._int_mm(a, b)
        kind = torch.float32 if self.dtype == "fp32" else torch.bfloat16
        a = torch.from_numpy(self.a.astype(np.float32)).to(kind)
        b = torch.from_numpy(self.b.astype(np.float32)).to(kind)
        return lambda: torch.matmul(a, b)

    def call(self, library: str):
        return getattr(self, library)()

    def gops(self, seconds: float) -> float:
        return round(2.0 * self.m * self.n * self.k / seconds / 1e9, 2)


def best_config(p: Problem):
    """The fastest of the default and CONFIGS on a short verified timing."""
    scan = TimingOptions(warmup=1, repeat=3)
    scanned = [(run_once(p.d, variant="regular", m=p.m, n=p.n, k=p.k, dtype=p.dtype, layout=p.layout,
                         config=c, timing=scan, verify=True), c)
               for c in [p.default] + [p.d.config_for(p.problem, f) for f in CONFIGS]]
    assert all(r["verified"] for r, _ in scanned), scanned
    return max(scanned, key=lambda rc: rc[0]["gflops"])[1]


def once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(libraries: list, sizes: list, dtypes: list, layouts: list, repeat: int, best: bool) -> dict:
    """{"MxNxK dtype layout": {contender: GOP/s, "kernel": name}} for the
    libraries of this process: alone (one library) or alternating (several)."""
    timing = TimingOptions(warmup=2, repeat=repeat)
    rows = {}
    d = Dispatcher(cache=BuildCache(), tuning=None)  # the run's fresh cache; nothing tuned
    for (m, n, k), layout in itertools.product(sizes, layouts):
        for dtype in dtypes:
            p = Problem(d, m, n, k, dtype, layout)
            wanted = [lib for lib in libraries if lib == "ours" or lib in baselines(dtype)]
            if not wanted:
                continue
            calls = {lib: p.call(lib) for lib in wanted}
            row = {"kernel": p.default.name}
            if best and "ours" in wanted:
                config = best_config(p)
                calls["best"] = p.ours(config)
                row["best_kernel"] = config.name
            seconds = {name: first for name, fn in calls.items() if (first := once(fn)) > SLOW_S}
            fast = {name: fn for name, fn in calls.items() if name not in seconds}
            seconds.update({name: once(fn) for name, fn in calls.items() if name in seconds})
            if len(fast) == 1:
                (name, fn), = fast.items()
                seconds[name] = time_call(fn, timing)
            elif fast:
                seconds.update(time_interleaved(fast, timing))
            row.update({name: p.gops(t) for name, t in seconds.items()})
            rows[f"{m}x{n}x{k} {dtype} {layout}"] = row
            print(f"  {cpu_isa.active().name} {m}x{n}x{k} {dtype} {layout}: " +
                  ", ".join(f"{name} {row[name]:.0f}" for name in seconds) + " GOP/s", flush=True)
    return rows


def run_child(spec: str, libraries: list, args, dtypes: list | None = None) -> dict:
    """`measure` in a new process for ISA spec `spec` (OpenBLAS reads its
    core type at load, and a library alone must be alone in its process).
    A child that dies (a crash in one library: the Xeon's first run lost
    every row to one abort) is run again per dtype, so the others are
    measured; what still fails is in "failed" ({dtype: why})."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update({cpu_isa.ENV: spec, "DISPATCHER_CACHE_DIR": args.cache})
    if openblas_coretype(spec):
        env["OPENBLAS_CORETYPE"] = openblas_coretype(spec)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        command = [sys.executable, __file__, "--child", str(out), "--libraries", ",".join(libraries),
                   "--shapes", ",".join("x".join(map(str, s)) for s in args.sizes),
                   "--dtypes", ",".join(dtypes or args.dtype_list), "--layouts", args.layouts,
                   "--repeat", str(args.repeat)]
        done = subprocess.run(command + (["--best"] if args.best and "ours" in libraries else []), env=env)
        if done.returncode == 0:
            return {**json.loads(out.read_text()), "failed": {}}
    why = f"{','.join(libraries)} child exited with {done.returncode}"
    print(f"  {why} ({','.join(dtypes or args.dtype_list)})", file=sys.stderr, flush=True)
    if dtypes is not None and len(dtypes) == 1:
        return {"rows": {}, "environment": None, "failed": {dtypes[0]: why}}
    merged = {"rows": {}, "environment": None, "failed": {}}
    for dtype in dtypes or args.dtype_list:
        one = run_child(spec, libraries, args, [dtype])
        merged["rows"].update(one["rows"])
        merged["failed"].update(one["failed"])
        merged["environment"] = merged["environment"] or one["environment"]
    return merged


MODES = ("alone", "alternating")


def alone_rows(spec: str, args) -> tuple:
    """({library: rows}, {library: child}) of every library alone in its own
    process, `args.alone_rounds` rounds in rotated order; each row's GOP/s
    the median of its rounds (kernel names from the first)."""
    rounds = {lib: [] for lib in LIBRARIES}
    for r in range(args.alone_rounds):
        for lib in rotated(LIBRARIES, r):
            rounds[lib].append(run_child(spec, [lib], args))
    rows = {}
    for lib, children in rounds.items():
        rows[lib] = {}
        for key, row in children[0]["rows"].items():
            values = [c["rows"][key][lib] for c in children if lib in c["rows"].get(key, {})]
            rows[lib][key] = {**row, lib: round(float(np.median(values)), 2), f"{lib}_rounds": values}
    merged = {lib: {"environment": children[0]["environment"],
                    "failed": {d: why for c in children for d, why in c["failed"].items()}}
              for lib, children in rounds.items()}
    return rows, merged


def rows_for(spec: str, args) -> tuple:
    """(rows, environment, failed) of one spec: every library alone, then
    all alternating; failed: {"<libraries> <dtype>": why} of dead children."""
    alone, children = alone_rows(spec, args)
    together = run_child(spec, list(LIBRARIES), args)
    failed = {f"{name} {dtype}": why for name, child in [*children.items(), ("alternating", together)]
              for dtype, why in child["failed"].items()}
    keys = list(dict.fromkeys([*together["rows"], *(key for rows in alone.values() for key in rows)]))
    rows = []
    for key in keys:
        measured = together["rows"].get(key, {})
        shape, dtype, layout = key.split()
        m, n, k = map(int, shape.split("x"))
        kernel = measured or alone["ours"].get(key, {})
        row = {"dtype": dtype, "layout": layout, "M": m, "N": n, "K": k,
               **{f: v for f, v in kernel.items() if "kernel" in f},
               "alone": {lib: alone[lib][key][lib] for lib in LIBRARIES if lib in alone[lib].get(key, {})},
               "alone_rounds": {lib: alone[lib][key][f"{lib}_rounds"] for lib in LIBRARIES
                                if lib in alone[lib].get(key, {})},
               "alternating": {lib: v for lib, v in measured.items() if "kernel" not in lib}}
        fp32 = {"alternating": together["rows"].get(f"{shape} fp32 {layout}", {}).get("ours"),
                "alone": alone["ours"].get(f"{shape} fp32 {layout}", {}).get("ours")}
        for mode in MODES:
            if "ours" not in row[mode]:
                continue
            for base in baselines(dtype):
                if base in row[mode]:
                    row[f"{mode}_vs_{base}"] = round(row[mode]["ours"] / row[mode][base], 3)
            if dtype != "fp32" and fp32[mode]:
                row[f"{mode}_vs_our_fp32"] = round(row[mode]["ours"] / fp32[mode], 3)
        rows.append(row)
    environment = together["environment"] or next((c["environment"] for c in children.values()
                                                    if c["environment"]), None)
    return rows, environment, failed


def summarize(rows: list) -> dict:
    """Per dtype and baseline: geomean and minimum of ours / baseline, per mode."""
    out = {}
    for dtype in DTYPES:
        mine = [r for r in rows if r["dtype"] == dtype]
        for key in sorted({k for r in mine for k in r if "_vs_" in k}):
            values = [r[key] for r in mine if key in r]
            out[f"{dtype}_{key}_geomean"] = round(geomean(values), 3)
            out[f"{dtype}_{key}_min"] = min(values)
    return out


def plot(results: list, path: Path) -> None:
    plt = pyplot(path)
    if plt is None:
        return

    fig, axes = plt.subplots(len(results), 1, figsize=(11, 3.6 * len(results)), squeeze=False)
    for ax, res in zip(axes[:, 0], results):
        bars = [(f"{r['dtype']} {r['layout']} {r['M']}x{r['N']}x{r['K']}", base, r[f"alternating_vs_{base}"])
                for r in res["rows"] for base in ("numpy", "torch") if f"alternating_vs_{base}" in r]
        x = np.arange(len(bars))
        colors = {"numpy": "tab:blue", "torch": "tab:orange"}
        ax.bar(x, [v for _, _, v in bars], color=[colors[b] for _, b, _ in bars])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.95, color="g", ls="--", lw=0.8)
        ax.set_xticks(x, [f"{label} / {base}" for label, base, _ in bars], rotation=60, ha="right", fontsize=6)
        ax.set_ylabel("ours / baseline (GOP/s)")
        ax.set_title(f"ISA {res['isa']}, default selection, alternating in one process", fontsize=9)
    env = results[0]["environment"] or {"cpu": "?", "cpus": "?"}
    fig.suptitle(f"{env['cpu']}, {env['cpus']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isas", default=cpu_isa.active().name,
                    help="comma-separated ISA specs (default: $DISPATCHER_CPU_ISA, else this machine's best)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--shapes", help="MxNxK,... (default: the corpus's CPU shapes, odd and skinny ones)")
    ap.add_argument("--layouts", default="rrr",
                    help="A, B and C storage, comma-separated: rrr (numpy's a @ b), rcr (x @ W.T: a Linear's forward), ...")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--best", action="store_true", help="also the best of a few block tiles")
    ap.add_argument("--alone-rounds", type=int, default=3,
                    help="rounds of one process per library for the alone figures (median of them)")
    ap.add_argument("--out", default="cpu_gemm", help="name under benchmarks/results, or a path")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--libraries", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes, args.dtype_list = shapes(args.shapes), [t for t in args.dtypes.split(",") if t]
    if args.child:
        rows = measure(args.libraries.split(","), args.sizes, args.dtype_list, args.layouts.split(","),
                       args.repeat, args.best)
        Path(args.child).write_text(json.dumps({"rows": rows, "environment": environment()}))
        return
    specs = [cpu_isa.get(s).name for s in args.isas.split(",") if s]
    load_before = os.getloadavg()
    results = []
    for spec in specs:
        with tempfile.TemporaryDirectory(prefix="cpu_gemm_cache_") as args.cache:  # nothing pre-built
            rows, env, failed = rows_for(spec, args)
        results.append({"isa": spec, "environment": env, "summary": summarize(rows), "rows": rows,
                        **({"failed": failed} if failed else {})})
    payload = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
               "timing": {"warmup": 2, "repeat": args.repeat, "statistic": "median"},
               "load_average": {"before": load_before, "after": os.getloadavg()},
               "per_isa": results}
    path = write(args.out, payload)
    for res in results:
        print(res["isa"], json.dumps(res["summary"], indent=1))
        for what, why in res.get("failed", {}).items():
            print(f"{res['isa']} FAILED: {what}: {why}")
    try:
        plot(results, path.with_suffix(".png"))
        print(f"wrote {path} and {path.with_suffix('.png').name}")
    except ImportError:
        print(f"wrote {path} (no plot: matplotlib is not installed)")
    if any(res.get("failed") for res in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
