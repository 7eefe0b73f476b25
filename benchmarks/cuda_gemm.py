"""CUDA target on the GPU: every figure a ratio to torch in the same run.

    python benchmarks/cuda_gemm.py [--repeat 20] [--only regular,stream_k,grouped,overhead] [--out DIR]

bf16 inputs, rcr (B given as the transpose of an (N, K) matrix, as in a
linear layer). Times are CUDA events around each launch after warm-up,
medians of --repeat runs, L2 flushed before each. Shapes: the GPU corpus of
../shared/bench/shapes.json. Configs: the sweeps in benchmarks/cuda_sweeps.py
(build them first: benchmarks/build_cuda.py --set bench).

- regular: best config of the sweep / torch.matmul (cuBLAS), per shape, and geomean
- stream_k: best stream-K config / best data-parallel config of the same sweep
  (its data_parallel rows; then also regular kernels of its tiles; then the
  best regular config of any tile), and / torch.matmul
- grouped: best config / a loop of torch.matmul over the groups (and
  torch._grouped_mm where this torch has it); as a ceiling, one torch.matmul
  of the groups' A stacked over one shared B, the same FLOPs in one GEMM
- overhead: wall time per `dispatcher.gemm` call on 256^3 tensors vs torch.matmul's,
  and of the launch step alone
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_sweeps  # noqa: E402
import dispatcher  # noqa: E402
from common import environment, geomean, load_shapes  # noqa: E402
from dispatcher.api import Dispatcher, default_dispatcher  # noqa: E402
from dispatcher.problem import prepare_gemm, prepare_grouped  # noqa: E402
from dispatcher.targets import get as get_target  # noqa: E402
from dispatcher.timing import TimingOptions, measure_cuda, median  # noqa: E402
from dispatcher.verify import max_rel  # noqa: E402


def torch_stream():
    import cupy
    return cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)


def time_fn(fn, timing):
    return median(measure_cuda(lambda i: fn(), timing, stream=torch_stream()))


class Runner:
    """Times configs on prepared device operands, without Python-side re-preparation."""

    def __init__(self, timing):
        self.d = Dispatcher()
        self.timing = timing
        self.stream = torch.cuda.current_stream().cuda_stream

    def gemm_operands(self, m, n, k, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = (torch.rand(m, k, generator=g, device="cuda") - 0.5).to(torch.bfloat16)
        bt = (torch.rand(n, k, generator=g, device="cuda") - 0.5).to(torch.bfloat16)
        return a, bt.t()

    def time_gemm(self, config, a, b, verify_ref=None):
        session = get_target("cuda").session(a, b)
        problem, ops, result = prepare_gemm(*session.arrays, variant=config.variant, target="cuda",
                                            memory=session.memory, allocate=session.empty)
        lib = self.d.library(config)
        options = {"stream": self.stream}
        launch = lambda: self.d.launch(lib, problem, ops, options)
        try:
            launch()
        except dispatcher.UnsupportedProblem as e:
            return None, str(e)
        err = None
        if verify_ref is not None:
            torch.cuda.synchronize()
            err = max_rel(session.finish(result).float().cpu().numpy(), verify_ref)
        return time_fn(launch, self.timing), err


def bench_regular(r, shapes):
    rows = []
    for m, n, k in shapes:
        a, b = r.gemm_operands(m, n, k)
        ref = (a.double() @ b.double()).cpu().numpy() if m * n * k <= 2048**3 else None
        t_torch = time_fn(lambda: torch.matmul(a, b), r.timing)
        results = {}
        for c in cuda_sweeps.regular_sweep():
            t, err = r.time_gemm(c, a, b, ref)
            if t is not None:
                results[c.name] = (t, err)
        best = min(results, key=lambda n_: results[n_][0])
        t = results[best][0]
        rows.append({"M": m, "N": n, "K": k, "torch_ms": t_torch * 1e3, "best_ms": t * 1e3, "best": best,
                     "ratio_vs_torch": t_torch / t, "max_rel": results[best][1],
                     "all_ms": {k_: v[0] * 1e3 for k_, v in results.items()}})
        print(f"regular {m}x{n}x{k}: {t_torch / t:.3f}x torch ({best})", flush=True)
    return rows


def bench_stream_k(r, shapes):
    """Best stream-K config against three data-parallel baselines, strictest last:
    - the sweep's own data_parallel rows (same kernels, StreamKScheduler in
      data-parallel mode): what the decomposition alone buys;
    - those plus regular kernels of the same tiles (the persistent
      data-parallel scheduler, a few percent faster than the former);
    - the best regular kernel of any tile, small-tile ping-pong ones included."""
    sweep = cuda_sweeps.stream_k_sweep()
    rows = []
    for m, n, k in shapes:
        a, b = r.gemm_operands(m, n, k)
        ref = (a.double() @ b.double()).cpu().numpy()
        t_torch = time_fn(lambda: torch.matmul(a, b), r.timing)
        sk, dp, same_tiles, regular = {}, {}, {}, {}
        for c in sweep:
            t, err = r.time_gemm(c, a, b, ref)
            if t is not None:
                (dp if c.variant_params["decomposition"] == "data_parallel" else sk)[c.name] = (t, err)
        for c in cuda_sweeps.regular_sweep():
            t, err = r.time_gemm(c, a, b, ref)
            if t is None:
                continue
            regular[c.name] = (t, err)
            if any(cuda_sweeps.same_tiles(c, s) for s in sweep):
                same_tiles[c.name] = (t, err)
        same_tiles.update(dp)
        fastest = lambda d: min(d, key=lambda x: d[x][0])
        best_sk = fastest(sk)
        t_sk = sk[best_sk][0]
        row = {"M": m, "N": n, "K": k, "torch_ms": t_torch * 1e3,
               "stream_k_ms": t_sk * 1e3, "stream_k": best_sk, "max_rel": sk[best_sk][1],
               "ratio_vs_torch": t_torch / t_sk}
        for key, baseline in (("data_parallel", dp), ("same_tile_data_parallel", same_tiles),
                              ("best_regular_any_tile", regular)):
            best = fastest(baseline)
            row[key] = best
            row[key + "_ms"] = baseline[best][0] * 1e3
            row["ratio_vs_" + key] = baseline[best][0] / t_sk
        row["all_ms"] = {k_: v[0] * 1e3 for d in (sk, dp, regular) for k_, v in d.items()}
        rows.append(row)
        print(f"stream_k {m}x{n}x{k}: {row['ratio_vs_data_parallel']:.3f}x the sweep's best data-parallel, "
              f"{row['ratio_vs_same_tile_data_parallel']:.3f}x incl. regular kernels of its tiles, "
              f"{row['ratio_vs_best_regular_any_tile']:.3f}x best regular of any tile, "
              f"{row['ratio_vs_torch']:.3f}x torch", flush=True)
    return rows


def bench_grouped(r, cases):
    rows = []
    for case in cases:
        groups = case.get("groups") or [[m, case["n"], case["k"]] for m in case["m"]]
        g = torch.Generator(device="cuda").manual_seed(0)
        As = [(torch.rand(m, k, generator=g, device="cuda") - 0.5).to(torch.bfloat16) for m, n, k in groups]
        Bs = [(torch.rand(n, k, generator=g, device="cuda") - 0.5).to(torch.bfloat16).t() for m, n, k in groups]
        flops = sum(2.0 * m * n * k for m, n, k in groups)
        t_loop = time_fn(lambda: [torch.matmul(a, b) for a, b in zip(As, Bs)], r.timing)
        t_gmm = t_stacked = None
        if len({(n, k) for _, n, k in groups}) == 1:  # one N and K: the groups stack along M
            a_cat = torch.cat(As)
            # The ceiling: the same FLOPs as one cuBLAS GEMM of the groups'
            # A stacked over one shared B (fewer bytes, no per-group tails).
            # No grouped kernel is expected to beat it.
            t_stacked = time_fn(lambda: torch.matmul(a_cat, Bs[0]), r.timing)
            if hasattr(torch, "_grouped_mm"):
                try:
                    b_stack = torch.stack(Bs)
                    offs = torch.tensor(np.cumsum([m for m, _, _ in groups]), device="cuda", dtype=torch.int32)
                    torch._grouped_mm(a_cat, b_stack, offs=offs)
                    t_gmm = time_fn(lambda: torch._grouped_mm(a_cat, b_stack, offs=offs), r.timing)
                except Exception as e:  # not every torch build has it for these layouts
                    print(f"torch._grouped_mm unavailable: {e}", flush=True)
        session = get_target("cuda").session(*As, *Bs)
        problem, ops, results = prepare_grouped(session.arrays[:len(As)], session.arrays[len(As):],
                                                target="cuda", memory=session.memory,
                                                allocate=session.empty)
        timed = {}
        for c in cuda_sweeps.grouped_sweep():
            lib = r.d.library(c)
            launch = lambda: r.d.launch(lib, problem, ops, {"stream": r.stream})
            launch()
            torch.cuda.synchronize()
            err = max(max_rel(session.finish(o).float().cpu().numpy(), (a.double() @ b.double()).cpu().numpy())
                      for o, a, b in zip(results, As, Bs))
            timed[c.name] = (time_fn(launch, r.timing), err)
        best = min(timed, key=lambda x: timed[x][0])
        t = timed[best][0]
        row = {"case": case["name"], "groups": len(groups), "gflops": flops / t / 1e9, "best": best,
               "ms": t * 1e3, "torch_loop_ms": t_loop * 1e3, "ratio_vs_torch_loop": t_loop / t,
               "max_rel": timed[best][1], "all_ms": {k_: v[0] * 1e3 for k_, v in timed.items()}}
        if t_stacked is not None:
            row["torch_stacked_ms"] = t_stacked * 1e3
            row["torch_stacked_tflops"] = flops / t_stacked / 1e12
            row["torch_stacked_vs_torch_loop"] = t_loop / t_stacked
        if t_gmm is not None:
            row["torch_grouped_mm_ms"] = t_gmm * 1e3
            row["ratio_vs_torch_grouped_mm"] = t_gmm / t
        rows.append(row)
        if t_stacked is not None:
            print(f"grouped {case['name']} ceiling: one stacked torch.matmul is "
                  f"{row['torch_stacked_vs_torch_loop']:.3f}x the loop", flush=True)
        print(f"grouped {case['name']}: {row['ratio_vs_torch_loop']:.3f}x torch loop"
              + (f", {row['ratio_vs_torch_grouped_mm']:.3f}x torch._grouped_mm" if t_gmm else ""), flush=True)
    return rows


def bench_overhead(calls=2000):
    """Wall time per call, launch-bound (256^3), against torch.matmul's. Also
    the launch step alone on prepared operands, which splits the total into
    the launch path (pluggy hook, ctypes, CUTLASS) and the Python API around it."""
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    dispatcher.gemm(a, b, target="cuda")  # build/load/select outside the timing
    d = default_dispatcher()
    session = get_target("cuda").session(a, b)
    problem, ops, _ = prepare_gemm(*session.arrays, target="cuda", memory=session.memory,
                                   allocate=session.empty)
    lib = d.library(d.select(problem))
    options = {"stream": session.stream}
    out = {}
    for name, fn in (("torch.matmul", lambda: torch.matmul(a, b)),
                     ("dispatcher.gemm", lambda: dispatcher.gemm(a, b, target="cuda")),
                     ("launch_step", lambda: d.launch(lib, problem, ops, options))):
        per_call = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            per_call.append((time.perf_counter() - start) / calls)
        out[name + "_us"] = median(per_call) * 1e6
    out["ratio_to_torch"] = out["dispatcher.gemm_us"] / out["torch.matmul_us"]
    print(f"overhead: {out}", flush=True)
    return out


def plot(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    panels = (
        (axes[0], result.get("regular", []), "regular / torch.matmul", {"best config": "ratio_vs_torch"}),
        (axes[1], result.get("stream_k", []), "stream-K / data-parallel baselines",
         {"sweep's DP rows": "ratio_vs_data_parallel", "+ regular, same tiles": "ratio_vs_same_tile_data_parallel",
          "regular, any tile": "ratio_vs_best_regular_any_tile"}),
        (axes[2], result.get("grouped", []), "grouped / torch.matmul loop", {"best config": "ratio_vs_torch_loop"}),
    )
    for ax, rows, title, series in panels:
        names = [r.get("case") or f"{r['M']}x{r['N']}x{r['K']}" for r in rows]
        width = 0.8 / len(series)
        for i, (label, key) in enumerate(series.items()):
            ax.bar([x + i * width for x in range(len(rows))], [r[key] for r in rows], width, label=label)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], names)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
        if len(series) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--only", default="regular,stream_k,grouped,overhead")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    timing = TimingOptions(warmup=5, repeat=args.repeat, flush_l2=True)
    corpus = load_shapes()["gpu"]
    r = Runner(timing)
    parts = args.only.split(",")
    result = {"environment": {**environment(), "device": torch.cuda.get_device_name(),
                              "torch": torch.__version__, "cuda": torch.version.cuda,
                              "driver": os.popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader").read().strip(),
                              "nvcc": get_target("cuda").toolchain().identity},
              "timing": {"warmup": 5, "repeat": args.repeat, "statistic": "median", "timer": "CUDA events",
                         "l2_flush": True}}
    if "regular" in parts:
        result["regular"] = bench_regular(r, [tuple(s) for s in corpus["regular"]])
    if "stream_k" in parts:
        result["stream_k"] = bench_stream_k(r, [tuple(s) for s in corpus["stream_k"]])
    if "grouped" in parts:
        result["grouped"] = bench_grouped(r, corpus["grouped"])
    if "overhead" in parts:
        result["overhead_256"] = bench_overhead()
    summary = {}
    if result.get("regular"):
        reg = result["regular"]
        summary["regular_geomean_vs_torch"] = geomean(x["ratio_vs_torch"] for x in reg)
        summary["regular_vs_torch_4096"] = next((x["ratio_vs_torch"] for x in reg if x["M"] == x["N"] == x["K"] == 4096), None)
        summary["regular_vs_torch_8192"] = next((x["ratio_vs_torch"] for x in reg if x["M"] == x["N"] == x["K"] == 8192), None)
    if result.get("stream_k"):
        for key in ("data_parallel", "same_tile_data_parallel", "best_regular_any_tile"):
            summary[f"stream_k_geomean_vs_{key}"] = geomean(x["ratio_vs_" + key] for x in result["stream_k"])
    if result.get("grouped"):
        summary["grouped_vs_torch_loop"] = [x["ratio_vs_torch_loop"] for x in result["grouped"]]
        summary["grouped_ceiling_stacked_torch_vs_torch_loop"] = [
            x.get("torch_stacked_vs_torch_loop") for x in result["grouped"]]
    result["summary"] = summary
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_gemm.json").write_text(json.dumps(result, indent=1, default=str))
    plot(result, out / "cuda_gemm.png")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
