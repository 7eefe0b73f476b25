"""Regular GEMM on the CPU target vs numpy (OpenBLAS, same thread count).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/cpu_gemm.py

fp32: our best of a few configs vs `numpy.matmul` at each corpus shape.
fp16 / bf16: vs numpy's fp16 matmul and ml_dtypes' bf16 `np.dot`, and vs our
own fp32 speed at the same shape. Writes benchmarks/results/cpu_gemm.json.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np
from tqdm import tqdm

from common import environment, geomean, load_shapes, time_call, warn_if_openblas_throttled, write
from dispatcher.api import Dispatcher
from dispatcher.cli import run_once
from dispatcher.timing import TimingOptions

# The configs "our best" is chosen from (the regular plugin's defaults and
# neighbours); the tile engine sweeps many more.
CONFIGS = [
    dict(tile_m=120, tile_n=512, tile_k=256),
    dict(tile_m=240, tile_n=512, tile_k=256),
    dict(tile_m=180, tile_n=512, tile_k=256),
    dict(tile_m=96, tile_n=128, tile_k=256),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", default="cpu_gemm")
    args = ap.parse_args()
    warn_if_openblas_throttled()
    timing = TimingOptions(warmup=3, repeat=args.repeat)
    d = Dispatcher()
    rows = []
    shapes = load_shapes()["cpu"]["regular_fp32"]
    jobs = [(dtype, shape) for shape in shapes for dtype in ("fp32", "fp16", "bf16")]
    ours_fp32 = {}
    for dtype, (m, n, k) in tqdm(jobs, desc="cpu_gemm", unit="shape"):
        rng = np.random.default_rng(0)
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        best = max((run_once(d, variant="regular", m=m, n=n, k=k, dtype=dtype, layout="rrr",
                             config=cfg, timing=timing, verify=True) for cfg in CONFIGS),
                   key=lambda r: r["gflops"])
        assert best["verified"], best
        flops = 2.0 * m * n * k
        if dtype == "fp32":
            baseline, base_name = time_call(lambda: a @ b, timing), "numpy.matmul fp32 (OpenBLAS)"
            ours_fp32[(m, n, k)] = best["gflops"]
        elif dtype == "fp16":
            a16, b16 = a.astype(np.float16), b.astype(np.float16)
            baseline, base_name = time_call(lambda: a16 @ b16, TimingOptions(1, 3)), "numpy.matmul fp16"
        else:
            abf, bbf = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
            baseline, base_name = time_call(lambda: np.dot(abf, bbf), TimingOptions(1, 3)), "ml_dtypes bf16 np.dot"
        row = {"dtype": dtype, "M": m, "N": n, "K": k, "kernel": best["kernel"],
               "ours_gflops": round(best["gflops"], 2), "baseline": base_name,
               "baseline_gflops": round(flops / baseline / 1e9, 3),
               "ratio_vs_baseline": round(best["gflops"] / (flops / baseline / 1e9), 3),
               "max_rel": best["max_rel"]}
        if dtype != "fp32":
            row["ratio_vs_our_fp32"] = round(best["gflops"] / ours_fp32[(m, n, k)], 3)
        rows.append(row)
        tqdm.write(f"{dtype:5} {m}x{n}x{k}: {row['ours_gflops']:7.1f} GFLOP/s, "
                   f"{row['ratio_vs_baseline']:.3f}x {base_name}"
                   + (f", {row['ratio_vs_our_fp32']:.2f}x our fp32" if dtype != "fp32" else ""))
    summary = {
        "fp32_geomean_vs_numpy": round(geomean(r["ratio_vs_baseline"] for r in rows if r["dtype"] == "fp32"), 3),
        "fp16_geomean_vs_our_fp32": round(geomean(r["ratio_vs_our_fp32"] for r in rows if r["dtype"] == "fp16"), 3),
        "bf16_geomean_vs_our_fp32": round(geomean(r["ratio_vs_our_fp32"] for r in rows if r["dtype"] == "bf16"), 3),
    }
    path = write(args.out, {"environment": environment(), "timing": {"warmup": 3, "repeat": args.repeat,
                                                                    "statistic": "median"},
                            "summary": summary, "rows": rows})
    print(summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
