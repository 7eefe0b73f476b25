"""A drop-in for CK's legacy `gemm_streamk_benchmark.py` command line.

It runs the gemm-dispatcher tile engine on a migrated sweep config and
writes the legacy outputs (the CSV, `best_kernels.txt`, the JSON report),
after a deprecation notice that names the new commands.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .. import dtypes
from ..timing import TimingOptions
from ..tile_engine import engine, results
from . import configs

NOTICE = ("DEPRECATED: gemm_streamk_benchmark.py is replaced by gemm-dispatcher. Run\n"
          "  gemm-dispatcher migrate LEGACY.json -o sweep.json --target {target}\n"
          "  gemm-dispatcher sweep sweep.json --variant stream_k --problems problems.json --verify\n"
          "(this drop-in does both and writes the legacy outputs).")

# The bridge stream-K default config (CK tile_engine/ops/gemm/gemm_streamk/configs/default_config.json).
DEFAULT_CONFIG = {
    "tile_config": {"tile_m": {"values": [128]}, "tile_n": {"values": [128]}, "tile_k": {"values": [32, 64]},
                    "warp_m": {"values": [2]}, "warp_n": {"values": [2]}, "warp_k": {"values": [1]},
                    "warp_tile_m": {"values": [32]}, "warp_tile_n": {"values": [32]}, "warp_tile_k": {"values": [16]}},
    "trait_config": {"pipeline": {"values": ["compv3", "compv4"]}, "scheduler": {"values": ["intrawave"]},
                     "epilogue": {"values": ["cshuffle"]}, "pad_m": {"values": [True]},
                     "pad_n": {"values": [True]}, "pad_k": {"values": [True]}, "persistent": {"values": [False]},
                     "reduction_strategy": {"values": ["atomic", "linear"]}},
}
LEGACY_CSV = ["rocm_version", "device_name", "split_k", "m", "n", "k", "stride_a", "stride_b", "stride_c",
              "dtype_a", "dtype_b", "dtype_acc", "dtype_c", "layout_a", "layout_b", "layout_c",
              "structured_sparsity", "dp_persistent", "reduction_strategy", "name", "latency(ms)",
              "tflops(TFlops)", "bandwidth(GB/s)", "metric"]
LEGACY_STRATEGY = {"atomic": "Atomic", "linear": "Reduction", "tree": "TreeReduction"}


def parser():
    p = argparse.ArgumentParser(prog="gemm-dispatcher legacy-streamk-benchmark",
                                description="Drop-in for CK's gemm_streamk_benchmark.py")
    p.add_argument("build_dir", nargs="?", help="ignored: kernels are built by gemm-dispatcher")
    p.add_argument("--config", help="legacy TE config JSON (default: CK's bridge stream-K default)")
    p.add_argument("--target", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--layout", default="rcr")
    p.add_argument("--problem-sizes", nargs="+", default=["1024,1024,1024"], help="M,N,K ...")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--no-flush-cache", action="store_true")
    p.add_argument("--rotating-count", type=int, default=1000)
    p.add_argument("--verify", action="store_true")
    p.add_argument("--csv", default="gemm_benchmark_results.csv")
    p.add_argument("--best", default="best_kernels.txt")
    p.add_argument("--json")
    p.add_argument("--out", help="where the new-format results go (default: a new streamk_sweep_<time> folder)")
    p.add_argument("--verbose", action="store_true")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    args.out = args.out or time.strftime("streamk_sweep_%Y%m%d_%H%M%S")
    print(NOTICE.format(target=args.target), file=sys.stderr)
    problems = [tuple(int(v) for v in s.split(",")) for s in args.problem_sizes]
    migration = configs.migrate(args.config or DEFAULT_CONFIG, target=args.target, variant="stream_k",
                                dtype=args.dtype, layout=args.layout)
    if args.verbose:
        print(migration.report(), file=sys.stderr)
    summary = engine.run(engine.SweepOptions(
        config=migration.sweep, variant="stream_k", target=args.target, dtype=args.dtype,
        layout=args.layout, problems=[list(p) for p in problems], verify=args.verify, out=args.out,
        timing=TimingOptions(warmup=args.warmup, repeat=args.repeat, flush_l2=not args.no_flush_cache,
                             rotating=max(1, args.rotating_count)),
        progress=args.verbose))
    rows = [r for r in results.read(args.out) if r["status"] == "ok"]
    write_outputs(rows, problems, args)
    print(f"{len(rows)} measurement(s); best kernels in {args.best}; CSV {args.csv}"
          + (f"; JSON {args.json}" if args.json else ""))
    return 0 if summary["built"] else 1


def _bandwidth(row, args) -> float:
    m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
    size_in = dtypes.get(args.dtype).itemsize
    size_out = dtypes.output_for(args.dtype).itemsize
    return (size_in * (m * k + n * k) + size_out * m * n) / 1e6 / float(row["latency_ms"])


def _legacy_row(row, args, version):
    reduction = row["kernel"].split("_streamk_")[1].split("_")[0]
    lay = args.layout
    return {"rocm_version": f"gemm-dispatcher {version}", "device_name": row["device"], "split_k": 1,
            "m": row["M"], "n": row["N"], "k": row["K"],
            "stride_a": row["K"] if lay[0] == "r" else row["M"], "stride_b": row["N"] if lay[1] == "r" else row["K"],
            "stride_c": row["N"], "dtype_a": args.dtype, "dtype_b": args.dtype,
            "dtype_acc": dtypes.get(args.dtype).acc, "dtype_c": dtypes.output_for(args.dtype).token,
            "layout_a": "RowMajor" if lay[0] == "r" else "ColumnMajor",
            "layout_b": "RowMajor" if lay[1] == "r" else "ColumnMajor", "layout_c": "RowMajor",
            "structured_sparsity": False, "dp_persistent": "PersistentKernel",
            "reduction_strategy": LEGACY_STRATEGY.get(reduction, reduction), "name": row["kernel"],
            "latency(ms)": float(row["latency_ms"]), "tflops(TFlops)": float(row["tflops"]),
            "bandwidth(GB/s)": _bandwidth(row, args), "metric": "latency"}


def write_outputs(rows, problems, args):
    import csv
    from ..plugins import _version
    version = _version("gemm-dispatcher")
    legacy = [_legacy_row(r, args, version) for r in rows]
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=LEGACY_CSV)
        w.writeheader()
        w.writerows(legacy)
    best = {}
    for r in legacy:
        key = (int(r["m"]), int(r["n"]), int(r["k"]))
        if key not in best or r["latency(ms)"] < best[key]["latency(ms)"]:
            best[key] = r
    with open(args.best, "w") as f:
        for m, n, k in problems:
            r = best.get((m, n, k))
            if r:
                f.write(f"m{m}_n{n}_k{k}: {r['name']} ({r['tflops(TFlops)']:.4f} TFLOPS, "
                        f"{r['bandwidth(GB/s)']:.2f} GB/s, {r['latency(ms)']:.4f} ms)\n")
    if args.json:
        tflops = [r["tflops(TFlops)"] for r in legacy] or [0.0]
        report = {
            "benchmark_metadata": {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "tool": f"gemm-dispatcher {version}",
                                   "total_kernels": len({r["name"] for r in legacy}), "total_problems": len(problems),
                                   "warmup": args.warmup, "repeat": args.repeat, "verify": args.verify},
            "performance_summary": {"tflops": {"max": max(tflops), "min": min(tflops),
                                               "mean": sum(tflops) / len(tflops)}},
            "kernel_results": legacy,
            "best_kernels_by_problem": {f"m{m}_n{n}_k{k}": r for (m, n, k), r in best.items()},
        }
        Path(args.json).write_text(json.dumps(report, indent=1))
