"""Stream-K and grouped GEMM on the CPU target, each against its baselines in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/cpu_variants.py

Stream-K vs regular on the corpus's `stream_k_fp32` shapes: the best config
of each variant over one shared sweep of tiles (so regular may also split a
few-tile problem with small tiles), and regular restricted to its default
candidates (what `dispatcher.gemm` selects without tuning).

Grouped (the corpus's `grouped_fp32` case) vs a Python loop of
`numpy.matmul` and a loop of our own regular `dispatcher.gemm` calls.

Best configs are picked over the sweeps; the ratios come from re-timing the
winners and baselines in alternating rounds (common.time_interleaved), so a
burst of load on this shared machine cannot land on one side only.
Writes benchmarks/results/cpu_variants.json.
"""

from __future__ import annotations

import argparse

import numpy as np
from tqdm import tqdm

import dispatcher
from common import (environment, geomean, load_shapes, time_call, time_interleaved,
                    warn_if_openblas_throttled, write)
from dispatcher.api import Dispatcher
from dispatcher.cli import run_once
from dispatcher.kinds import prepare_gemm
from dispatcher.timing import TimingOptions
from regular_gemm.plugin import CPU_DEFAULTS as REGULAR_DEFAULTS

TILES = [  # the shared sweep: (tile_m, tile_n, tile_k, micro_m, micro_n)
    (32, 64, 256, 8, 32), (48, 64, 256, 12, 32), (48, 96, 256, 12, 32), (64, 64, 256, 8, 32),
    (96, 96, 256, 12, 32), (96, 96, 128, 12, 32), (96, 128, 256, 12, 32), (120, 512, 256, 12, 32),
]


def sweep(variant, tiles):
    configs = []
    for tm, tn, tk, mm, mn in tiles:
        base = dict(tile_m=tm, tile_n=tn, tile_k=tk, micro_m=mm, micro_n=mn)
        if variant == "stream_k":
            configs += [dict(base, reduction=r) for r in ("atomic", "linear")]
        else:
            configs.append(base)
    return configs


def best(d, variant, configs, shape, timing):
    """(verified row, config) of the fastest config."""
    m, n, k = shape
    rows = [run_once(d, variant=variant, m=m, n=n, k=k, layout="rrr", config=c, timing=timing,
                     verify=True, strict=True) for c in configs]
    assert all(r["verified"] for r in rows), [r for r in rows if not r["verified"]]
    i = max(range(len(rows)), key=lambda j: rows[j]["gflops"])
    return rows[i], configs[i]


def launcher(d, variant, config, a, b):
    """A callable that launches `config` on prepared operands (no Python-side preparation)."""
    problem, operands, out = prepare_gemm(a, b, variant=variant)
    problem, chosen = d.run_or_fall_back(problem, operands, config, strict=True)
    library = d.library(chosen)
    return lambda: out is not None and d.launch(library, problem, operands)  # holds out: the launches write it


def bench_stream_k(d, shapes, timing):
    """Each variant's best config is picked over the sweep, then the winners
    are re-timed in alternation for the ratios."""
    rows = []
    rng = np.random.default_rng(0)
    for shape in tqdm(shapes, desc="stream_k", unit="shape"):
        m, n, k = shape
        (_, sk), (_, reg), (_, reg_default) = (
            best(d, "stream_k", sweep("stream_k", TILES), shape, timing),
            best(d, "regular", sweep("regular", TILES), shape, timing),
            best(d, "regular", list(REGULAR_DEFAULTS), shape, timing))
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        t = time_interleaved({"stream_k": launcher(d, "stream_k", sk, a, b),
                              "regular_best": launcher(d, "regular", reg, a, b),
                              "regular_default": launcher(d, "regular", reg_default, a, b)}, timing)
        gflops = {name: 2.0 * m * n * k / seconds / 1e9 for name, seconds in t.items()}
        row = {"M": m, "N": n, "K": k,
               "stream_k_gflops": round(gflops["stream_k"], 1), "stream_k_config": sk,
               "regular_best_gflops": round(gflops["regular_best"], 1), "regular_best_config": reg,
               "regular_default_gflops": round(gflops["regular_default"], 1),
               "ratio_vs_regular_best": round(t["regular_best"] / t["stream_k"], 3),
               "ratio_vs_regular_default": round(t["regular_default"] / t["stream_k"], 3)}
        rows.append(row)
        tqdm.write(f"stream_k {shape}: {row['stream_k_gflops']} GFLOP/s, "
                   f"{row['ratio_vs_regular_best']}x best regular, "
                   f"{row['ratio_vs_regular_default']}x default regular")
    return rows


def bench_grouped(d, case, timing, seed):
    rng = np.random.default_rng(seed)
    lo, hi = case["m_range"]
    ms = rng.integers(lo, hi + 1, size=case["groups"])
    n, k = case["n"], case["k"]
    As = [rng.uniform(-1, 1, (int(m), k)).astype(np.float32) for m in ms]
    Bs = [rng.uniform(-1, 1, (k, n)).astype(np.float32) for _ in ms]
    flops = float(sum(2.0 * m * n * k for m in ms))  # a Python float: the JSON and the printout stay plain
    candidates = [dict(tile_m=tm, tile_n=tn, tile_k=256)
                  for tm, tn in ((48, 512), (120, 512), (96, 128), (48, 128), (96, 256), (48, 256))]
    sweep_seconds = []
    for cfg in candidates:
        dispatcher.grouped_gemm(As, Bs, config=cfg, dispatcher=d)  # build outside the timing
        sweep_seconds.append(time_call(lambda: dispatcher.grouped_gemm(As, Bs, config=cfg, dispatcher=d), timing))
    best_cfg = candidates[int(np.argmin(sweep_seconds))]
    outs = dispatcher.grouped_gemm(As, Bs, config=best_cfg, dispatcher=d)
    max_rel = max(dispatcher.verify.max_rel(o, a.astype(np.float64) @ b) for o, a, b in zip(outs, As, Bs))
    for a, b in zip(As, Bs):
        dispatcher.gemm(a, b, dispatcher=d)  # build the regular kernels outside the timing
    t = time_interleaved({
        "grouped": lambda: dispatcher.grouped_gemm(As, Bs, config=best_cfg, dispatcher=d),
        "numpy_loop": lambda: [a @ b for a, b in zip(As, Bs)],
        "our_loop": lambda: [dispatcher.gemm(a, b, dispatcher=d) for a, b in zip(As, Bs)]}, timing)
    grouped_s, numpy_loop, ours_loop = t["grouped"], t["numpy_loop"], t["our_loop"]
    results = {"groups": int(case["groups"]), "m": [int(m) for m in ms], "n": n, "k": k,
               "grouped_best_config": best_cfg, "grouped_gflops": round(flops / grouped_s / 1e9, 1),
               "numpy_loop_gflops": round(flops / numpy_loop / 1e9, 1),
               "our_regular_loop_gflops": round(flops / ours_loop / 1e9, 1),
               "ratio_vs_numpy_loop": round(numpy_loop / grouped_s, 3),
               "ratio_vs_our_regular_loop": round(ours_loop / grouped_s, 3),
               "max_rel": max_rel}
    print(f"grouped {case['groups']} groups: {results['grouped_gflops']} GFLOP/s, "
          f"{results['ratio_vs_numpy_loop']}x numpy loop, {results['ratio_vs_our_regular_loop']}x our loop")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--out", default="cpu_variants")
    args = ap.parse_args()
    warn_if_openblas_throttled()
    timing = TimingOptions(warmup=2, repeat=args.repeat)
    corpus = load_shapes()["cpu"]
    d = Dispatcher()
    sk_rows = bench_stream_k(d, [tuple(s) for s in corpus["stream_k_fp32"]], timing)
    grouped = [bench_grouped(d, dict(corpus["grouped_fp32"], groups=g), timing, corpus["grouped_fp32"]["seed"])
               for g in (16, corpus["grouped_fp32"]["groups"], 64)]
    long_k = [r for r in sk_rows if r["M"] * r["N"] < 128 * 128]
    summary = {
        "stream_k_long_k_geomean_vs_regular_best": round(geomean(r["ratio_vs_regular_best"] for r in long_k), 3),
        "stream_k_long_k_geomean_vs_regular_default": round(geomean(r["ratio_vs_regular_default"] for r in long_k), 3),
        "stream_k_square_vs_regular_best": [r["ratio_vs_regular_best"] for r in sk_rows if r not in long_k],
        "grouped_vs_numpy_loop": [g["ratio_vs_numpy_loop"] for g in grouped],
        "grouped_vs_our_regular_loop": [g["ratio_vs_our_regular_loop"] for g in grouped],
        # The ceiling the ratios live under: the fastest any kernel ran in
        # this run (the square shape, compute-bound on both cores).
        "fastest_gflops_this_run": max(max(r["stream_k_gflops"], r["regular_best_gflops"]) for r in sk_rows),
        "grouped_gflops_needed_for_1_5x_our_loop": [round(1.5 * g["our_regular_loop_gflops"], 1) for g in grouped],
        "stream_k_gflops_needed_for_1_6x_regular_best": [round(1.6 * r["regular_best_gflops"], 1) for r in long_k],
    }
    path = write(args.out, {"environment": environment(),
                            "timing": {"warmup": 2, "repeat": args.repeat, "statistic": "median"},
                            "summary": summary, "stream_k": sk_rows, "grouped": grouped})
    print(summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
