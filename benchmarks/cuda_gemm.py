"""The cuda target on an H200: what a user gets, as ratios to torch in the same run.

    python benchmarks/cuda_gemm.py [--repeat 20] [--only regular,stream_k,fp8,grouped,overhead,random,mlp] [--out DIR]

Build the catalogs first (`gemm-dispatcher prebuild --target cuda --dtype bf16`, and
`--variant regular --dtype fp8_e4m3` for the fp8 part), or every first call compiles.

Per shape, three columns, each a time over torch's (`torch.matmul`;
`torch._scaled_mm` for fp8; `torch._grouped_mm`, a loop of `torch.matmul`
and one stacked `torch.matmul` of the same FLOPs for grouped), CUDA events
around each call, L2 flushed before each, medians of --repeat runs after
warm-up; torch, default and autotune are timed in alternating rounds once
autotune has run (`timed_rounds`):
  default   the public call as a user makes it, host work included
            (`dispatcher.gemm(a, b)`, `dispatcher.grouped_mm(a, b, offsets)`),
            with the shipped tuning times and no autotune (what
            `gemm-dispatcher explain` prints)
  autotune  a fresh tuning database and autotune=True: the first call builds
            and times the top ranked kernels (its cost is reported), later
            calls use the winner
  best      every catalog kernel timed alone on the same operands (its launch
            captured in a CUDA graph and replayed: the kernel without the host
            work): the best of the catalog (a bound on what selection could reach)
bf16 rcr (B is the transpose of an (N, K) matrix, as in a linear layer).
Shapes: the `gpu` section of ../shared/bench/shapes.json ($GEMM_SHAPES); the
`random` part (not in the default --only) draws 50 held-out shapes
(`random_shapes`) and reports torch, default and best of catalog; the `mlp`
part (not in the default --only either) does the same for the GEMMs of
torch_mlp.py's grid in their layouts (rcr forward, rrr dX, crr dW), which
says per GEMM whether the selection or the kernels limit a cell. Each row
keeps every catalog kernel's time (`catalog_us`) and the regret (default /
best of catalog), summarized over the corpus and the random shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import attrs
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dispatcher  # noqa: E402
from common import environment, geomean, load_shapes, pyplot, time_interleaved  # noqa: E402
from dispatcher.api import Dispatcher  # noqa: E402
from dispatcher.kinds import prepare_gemm  # noqa: E402
from dispatcher.problem import prepare_grouped_mm  # noqa: E402
from dispatcher.targets import get as get_target  # noqa: E402
from dispatcher.timing import TimingOptions, measure_cuda, median  # noqa: E402
from dispatcher.tuning import TuningDatabase  # noqa: E402
from dispatcher.verify import max_rel  # noqa: E402


def timed(fn, timing) -> float:
    return median(measure_cuda(lambda i: fn(), timing, stream=torch.cuda.current_stream().cuda_stream))


def timed_rounds(fns: dict, timing) -> dict:
    """{name: median seconds} of several callables timed in alternating
    rounds (`common.time_interleaved`, CUDA events, no idle between): a
    GPU's clocks follow its temperature and power through a run, so each
    contender's samples come from all of it. Timed one after the other,
    autotune's pick at 8192^3 ran 17% slower than the default column with
    the same kernel, measured right after autotune's trials had heated the
    GPU (H100, cuda_gemm_regular_skinny_h100_7baa014.json)."""
    stream = torch.cuda.current_stream().cuda_stream
    return time_interleaved(fns, attrs.evolve(timing, warmup=min(timing.warmup, 2)), settle=0.0,
                            timer=lambda fn, options: measure_cuda(fn, options, stream=stream))


def operands(m, n, k, dtype=torch.bfloat16, seed=0, layout="rcr"):
    """a (m x k) and b (k x n) stored as `layout` says (r: row-major, c:
    column-major, a transposed view): rcr is a linear layer's forward
    (x @ W^T), rrr its dX (dY @ W), crr its dW (dY^T @ X)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    new = lambda rows, cols, order: (  # noqa: E731
        (torch.rand(rows, cols, generator=g, device="cuda") - 0.5).to(dtype) if order == "r"
        else (torch.rand(cols, rows, generator=g, device="cuda") - 0.5).to(dtype).t())
    return new(m, k, layout[0]), new(k, n, layout[1])


def fresh(tuning_dir=None) -> Dispatcher:
    """A Dispatcher as a fresh install has it: nothing selected yet, an empty
    tuning database of its own (in `tuning_dir`, for autotune's winners) and
    the winners shipped with the package."""
    return Dispatcher(tuning=TuningDatabase(Path(tuning_dir or tempfile.mkdtemp()) / "tuning.sqlite"))


def launch_time(launch, timing) -> tuple:
    """(seconds, how) of one kernel launch with the host's part left out:
    `launch(stream)` captured once in a CUDA graph and the graph replayed
    (timed directly, a small kernel's time would be Python's dispatch in
    `Dispatcher.launch`): how is "graph"; or the launch itself where it
    cannot be captured: "launch", host work included."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            launch(torch.cuda.current_stream().cuda_stream)
    except (RuntimeError, dispatcher.DispatcherError):
        torch.cuda.synchronize()
        return timed(lambda: launch(torch.cuda.current_stream().cuda_stream), timing), "launch"
    return timed(graph.replay, timing), "graph"


def best_of_catalog(d, problem, ops, timing, default=None) -> tuple:
    """(seconds, kernel, {kernel: microseconds}, default microseconds) of the
    fastest catalog kernel on prepared operands, every catalog kernel's time
    (the data selection's regret and a calibration of its model are computed
    from), each the kernel alone (`launch_time`), and the time of `default`
    (the default selection's config) timed the same way: from the catalog's,
    or timed apart where the catalog lacks it (a tuned split-K kernel)."""
    best, times, methods = (float("inf"), None), {}, {}
    catalog = list(d.candidates(problem))
    names = {c.name for c in catalog}
    extra = [default] if default is not None and default.name not in names else []
    for config in catalog + extra:
        library = d.library(config)
        launch = (lambda library: lambda stream: d.launch(library, problem, ops, {"stream": stream}))(library)
        try:
            launch(torch.cuda.current_stream().cuda_stream)
        except dispatcher.UnsupportedProblem:
            continue
        t, methods[config.name] = launch_time(launch, timing)
        times[config.name] = t * 1e6
        if config.name in names:
            best = min(best, (t, config.name))
    launched = [name for name, how in methods.items() if how == "launch"]
    if launched:  # not comparable with the graph-timed ones: said, not hidden
        print(f"  timed with host work (no CUDA graph): {', '.join(launched)}", flush=True)
    default_us = times.get(default.name) if default is not None else None
    return (*best, {name: t for name, t in times.items() if name in names}, default_us)


def regret(default_us, t_best: float) -> float:
    """Selection's regret: the default kernel's time over the best catalog
    kernel's, both timed the same way (`best_of_catalog`: the launch alone),
    so that a call's host work, which the default column includes and which
    outlasts a small kernel, does not count as a wrong choice."""
    return default_us / (t_best * 1e6) if default_us else float("nan")


def three_columns(call, plain, baselines: dict, problem_of, timing, tmp, **kw) -> dict:
    """default / autotune / best-of-catalog times and their ratios to
    `baselines["torch"]` (each baseline's time as `<name>_us`): default is
    `plain()`, the public call as a user makes it (the default dispatcher,
    no out, target, or dispatcher argument: its shortest path); its kernel
    is what `call(d, False)` on a fresh Dispatcher selects (the same ranking
    and shipped winners); autotune is `call(tuned, True)`. The baselines,
    default and autotune are timed together, in rounds (`timed_rounds`),
    after autotune has run."""
    d = fresh()
    call(d, False)  # first call: selection (and any build)
    plain()
    chosen_config = next(iter(d._ready.values()))[0] if d._ready else None
    chosen = chosen_config and chosen_config.name
    tuned = fresh(tempfile.mkdtemp(dir=tmp))
    started = time.perf_counter()
    call(tuned, True)
    torch.cuda.synchronize()
    autotune_cost = time.perf_counter() - started
    times = timed_rounds({**baselines, "default": plain, "autotune": lambda: call(tuned, True)}, timing)
    baseline_s, t_default, t_autotune = times["torch"], times["default"], times["autotune"]
    problem, ops = problem_of()
    t_best, best_name, catalog_us, default_kernel_us = best_of_catalog(d, problem, ops, timing,
                                                                       chosen_config)
    return dict(**{f"{name}_us": t * 1e6 for name, t in times.items() if name in baselines},
                default_us=t_default * 1e6, autotune_us=t_autotune * 1e6,
                best_us=t_best * 1e6, default_kernel=chosen, best_kernel=best_name, catalog_us=catalog_us,
                default_kernel_us=default_kernel_us, regret=regret(default_kernel_us, t_best),
                autotune_winner=tuned.autotune_log[0]["winner"] if tuned.autotune_log else None,
                autotune_cost_s=autotune_cost,
                default_vs_torch=baseline_s / t_default, autotune_vs_torch=baseline_s / t_autotune,
                best_vs_torch=baseline_s / t_best, **kw)


def bench_gemm(shapes, variant, timing, tmp, dtype=torch.bfloat16, out_dtype=None):
    rows = []
    for m, n, k in shapes:
        a, b = operands(m, n, k, dtype)
        if dtype == torch.bfloat16:
            out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
            baseline = lambda: torch.matmul(a, b, out=out)
        else:  # fp8: torch._scaled_mm with unit scales, bf16 out
            one = torch.ones((), device="cuda")
            out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
            baseline = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        reference = baseline().float()

        def call(d, autotune):
            return dispatcher.gemm(a, b, out=out, variant=variant, target="cuda", out_dtype=out_dtype,
                                   autotune=autotune, dispatcher=d)

        def problem_of():
            session = get_target("cuda").session(a, b)
            problem, ops, _ = prepare_gemm(*session.arrays, variant=variant, target="cuda", out_dtype=out_dtype,
                                           memory=session.memory, allocate=session.empty)
            return problem, ops  # misaligned operands: the kernels stage them in their workspace

        plain = lambda: dispatcher.gemm(a, b, variant=variant, out_dtype=out_dtype)
        row = three_columns(call, plain, {"torch": baseline}, problem_of, timing, tmp, M=m, N=n, K=k)
        call(fresh(), False)
        torch.cuda.synchronize()
        row["max_rel_vs_torch"] = max_rel(out.float().cpu().numpy(), reference.double().cpu().numpy())
        rows.append(row)
        print(f"{variant} {m}x{n}x{k}: default {row['default_vs_torch']:.3f} autotune {row['autotune_vs_torch']:.3f} "
              f"best {row['best_vs_torch']:.3f} ({row['default_kernel']})", flush=True)
    return rows


# Held-out shapes for selection's regret (issue 23): M, N and K drawn
# log-uniformly in [64, 16384] with this seed, so every run draws the same.
RANDOM_SEED = 20261204
RANDOM_COUNT = 50
# A second draw, for a rule of selection that the first one's times helped
# choose (`--seed 20261207`: fitted_times' reach and kept kernels).
HELD_OUT_SEED = 20261207
# A third draw, held out from the work term of fitted_times (added after the second's run).
WORK_TERM_SEED = 20261208


def random_shapes(count: int = RANDOM_COUNT, seed: int = RANDOM_SEED) -> list:
    rng = np.random.default_rng(seed)
    return [tuple(int(round(x)) for x in np.exp(rng.uniform(np.log(64), np.log(16384), 3)))
            for _ in range(count)]


def mlp_gemms() -> list:
    """(M, N, K, layout) of the GEMMs of torch_mlp.py's grid, each once: per
    cell (d, hidden 2.75 d, tokens) each layer's forward (rcr), dX (rrr)
    and dW (crr)."""
    from torch_mlp import GRID_D, GRID_TOKENS, gemm_problems, grid_hidden
    return list(dict.fromkeys((p.m, p.n, p.k, p.layout) for d in GRID_D for tokens in GRID_TOKENS
                              for p in gemm_problems(d, grid_hidden(d), tokens, "cuda").values()))


def bench_catalog(cases, label: str, timing, rows=None, after_each=lambda: None) -> list:
    """Per case (M, N, K, layout): torch, the default kernel and every
    catalog kernel (no autotune column: regret is default / best of
    catalog), bf16; each row appended to `rows` (a new list by default),
    then `after_each()` (main's save: a run stopped by its time limit keeps
    the rows it measured)."""
    rows = [] if rows is None else rows
    for m, n, k, layout in cases:
        a, b = operands(m, n, k, layout=layout)
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        t_torch = timed(lambda: torch.matmul(a, b, out=out), timing)
        d = fresh()
        dispatcher.gemm(a, b, out=out, target="cuda", dispatcher=d)  # selects what the plain call runs
        dispatcher.gemm(a, b)
        t_default = timed(lambda: dispatcher.gemm(a, b), timing)
        chosen_config = next(iter(d._ready.values()))[0]
        chosen = chosen_config.name
        session = get_target("cuda").session(a, b)
        problem, ops, _ = prepare_gemm(*session.arrays, variant="regular", target="cuda",
                                       memory=session.memory, allocate=session.empty)
        t_best, best_name, catalog_us, default_kernel_us = best_of_catalog(d, problem, ops, timing, chosen_config)
        rows.append(dict(M=m, N=n, K=k, layout=layout, torch_us=t_torch * 1e6, default_us=t_default * 1e6,
                         best_us=t_best * 1e6, default_kernel=chosen, best_kernel=best_name, catalog_us=catalog_us,
                         default_kernel_us=default_kernel_us, regret=regret(default_kernel_us, t_best),
                         default_vs_torch=t_torch / t_default,
                         best_vs_torch=t_torch / t_best))
        print(f"{label} {m}x{n}x{k} {layout}: default {rows[-1]['default_vs_torch']:.3f} "
              f"best {rows[-1]['best_vs_torch']:.3f} regret {rows[-1]['regret']:.3f} ({chosen} / {best_name})",
              flush=True)
        after_each()
    return rows


def bench_random(timing, seed: int = RANDOM_SEED, **kw) -> list:
    """`bench_catalog` of the random shapes (`random_shapes` of `seed`), rcr."""
    return bench_catalog([(m, n, k, "rcr") for m, n, k in random_shapes(seed=seed)], "random", timing, **kw)


def moe_case(case):
    """(name, per-group rows, N, K) of a `grouped` corpus entry."""
    if "groups" in case:
        ms = [g[0] for g in case["groups"]]
        return case["name"], ms, case["groups"][0][1], case["groups"][0][2]
    return case["name"], list(case["m"]), case["n"], case["k"]


def bench_grouped(cases, timing, tmp):
    rows = []
    for case in cases:
        name, ms, n, k = moe_case(case)
        offsets = torch.tensor(np.cumsum(ms), dtype=torch.int32, device="cuda")
        total = int(sum(ms))
        g = torch.Generator(device="cuda").manual_seed(1)
        a = (torch.rand(total, k, generator=g, device="cuda") - 0.5).to(torch.bfloat16)
        b = (torch.rand(len(ms), n, k, generator=g, device="cuda") - 0.5).to(torch.bfloat16).transpose(1, 2)
        starts = [0, *np.cumsum(ms)[:-1].tolist()]
        loop = lambda: [torch.matmul(a[s:s + m], b[i]) for i, (s, m) in enumerate(zip(starts, ms))]
        grouped_mm = lambda: torch._grouped_mm(a, b, offs=offsets)
        stacked = lambda: torch.matmul(a, b[0])
        ref = grouped_mm().float()

        def call(d, autotune):
            return dispatcher.grouped_mm(a, b, offsets, target="cuda", autotune=autotune, dispatcher=d)

        def problem_of():
            session = get_target("cuda").session(a, b, offsets)
            problem, ops, _ = prepare_grouped_mm(*session.arrays, target="cuda", memory=session.memory,
                                                 allocate=session.empty)
            return problem, ops

        plain = lambda: dispatcher.grouped_mm(a, b, offsets)
        row = three_columns(call, plain, {"torch": grouped_mm, "torch_loop": loop, "torch_stacked": stacked},
                            problem_of, timing, tmp, case=name, groups=len(ms), N=n, K=k)
        row.update(default_vs_loop=row["torch_loop_us"] / row["default_us"],
                   autotune_vs_loop=row["torch_loop_us"] / row["autotune_us"],
                   stacked_vs_grouped_mm=row["torch_us"] / row["torch_stacked_us"])
        out = call(fresh(), False)
        torch.cuda.synchronize()
        row["max_rel_vs_torch"] = max_rel(out.float().cpu().numpy(), ref.double().cpu().numpy())
        rows.append(row)
        print(f"grouped {name}: default {row['default_vs_torch']:.3f}x _grouped_mm, {row['default_vs_loop']:.3f}x loop; "
              f"autotune {row['autotune_vs_torch']:.3f}x", flush=True)
    return rows


def per_call(fns: dict, calls: int = 300, rounds: int = 7) -> dict:
    """Host wall time per call of each fn (launches queued back to back)."""
    out = {}
    for name, fn in fns.items():
        for _ in range(20):
            fn()
        samples = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) / calls)
        out[name + "_us"] = median(samples) * 1e6
    return out


def bench_overhead(grouped_case):
    a, b = operands(256, 256, 256)
    out = torch.empty((256, 256), device="cuda", dtype=torch.bfloat16)
    d = fresh()
    result = per_call({"dispatcher.gemm": lambda: dispatcher.gemm(a, b, out=out, target="cuda", dispatcher=d),
                       "torch.matmul": lambda: torch.matmul(a, b, out=out)})
    result["gemm_vs_torch"] = result["dispatcher.gemm_us"] / result["torch.matmul_us"]
    name, ms, n, k = moe_case(grouped_case)
    offsets = torch.tensor(np.cumsum(ms), dtype=torch.int32, device="cuda")
    x = (torch.rand(int(sum(ms)), k, device="cuda") - 0.5).to(torch.bfloat16)
    w = (torch.rand(len(ms), n, k, device="cuda") - 0.5).to(torch.bfloat16).transpose(1, 2)
    grouped = per_call({"dispatcher.grouped_mm": lambda: dispatcher.grouped_mm(x, w, offsets, target="cuda",
                                                                               dispatcher=d),
                        "torch._grouped_mm": lambda: torch._grouped_mm(x, w, offs=offsets)})
    result.update({f"{name}_{key}": v for key, v in grouped.items()})
    result[f"{name}_grouped_mm_vs_torch"] = grouped["dispatcher.grouped_mm_us"] / grouped["torch._grouped_mm_us"]
    print(f"per call: {result}", flush=True)
    return result


def plot(result, path):
    plt = pyplot(path)
    if plt is None:
        return
    parts = [p for p in ("regular", "unaligned", "skinny", "stream_k", "fp8", "grouped", "random", "mlp")
             if result.get(p)]
    if not parts:
        return
    fig, axes = plt.subplots(1, len(parts), figsize=(4.2 * len(parts) + 6 * len({"random", "mlp"} & set(parts)), 4.5),
                             squeeze=False)
    for ax, part in zip(axes[0], parts):
        rows = result[part]
        names = [r.get("case") or f"{r['M']}x{r['N']}x{r['K']}{' ' + r['layout'] if 'layout' in r else ''}"
                 for r in rows]
        columns = [(label, key) for label, key in (("default", "default_vs_torch"), ("autotune", "autotune_vs_torch"),
                                                   ("best of catalog", "best_vs_torch")) if key in rows[0]]
        for i, (label, key) in enumerate(columns):  # random rows have no autotune column
            ax.bar([x + i * 0.27 for x in range(len(rows))], [r[key] for r in rows], 0.27, label=label)
        ax.set_xticks([x + 0.27 for x in range(len(rows))], names, fontsize=7)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_title(f"{part} / {'torch._grouped_mm' if part == 'grouped' else 'torch._scaled_mm' if part == 'fp8' else 'torch.matmul'}",
                     fontsize=9)
        ax.tick_params(axis="x", rotation=40)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summarize(result) -> dict:
    summary = {}
    for part in ("regular", "unaligned", "skinny", "stream_k", "fp8", "grouped"):
        rows = result.get(part)
        if rows:
            for column in ("default", "autotune", "best"):
                values = [r[f"{column}_vs_torch"] for r in rows]
                summary[f"{part}_{column}_geomean"] = geomean(values)
                summary[f"{part}_{column}_min"] = min(values)
    for part in ("random", "mlp"):
        for column in ("default", "best") if result.get(part) else ():
            values = [r[f"{column}_vs_torch"] for r in result[part]]
            summary[f"{part}_{column}_geomean"], summary[f"{part}_{column}_min"] = geomean(values), min(values)
    if result.get("mlp"):  # that part's own: its shapes are not rcr, and one is a tuned problem in some layouts
        summary["mlp_regret_geomean"] = geomean(r["regret"] for r in result["mlp"] if r["regret"] == r["regret"])
    held_out = [r for p in ("regular", "unaligned", "skinny", "random") for r in result.get(p, [])
                if r.get("regret", float("nan")) == r.get("regret")]
    if held_out:  # default kernel time / best catalog kernel time, over the gpu corpus and the random shapes
        summary["regret_geomean"] = geomean(r["regret"] for r in held_out)
        summary["regret_max"] = max(r["regret"] for r in held_out)
    gpu = [r for p in ("regular", "unaligned", "skinny") for r in result.get(p, [])]
    if gpu:
        for column in ("default", "autotune", "best"):
            values = [r[f"{column}_vs_torch"] for r in gpu]
            summary[f"corpus_{column}_geomean"], summary[f"corpus_{column}_min"] = geomean(values), min(values)
    if result.get("grouped"):
        summary["grouped_default_vs_loop_geomean"] = geomean(r["default_vs_loop"] for r in result["grouped"])
        summary["grouped_autotune_vs_loop_geomean"] = geomean(r["autotune_vs_loop"] for r in result["grouped"])
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--only", default="overhead,regular,unaligned,skinny,stream_k,grouped,fp8")
    ap.add_argument("--seed", type=int, default=RANDOM_SEED,
                    help=f"the random part's shapes (another seed, e.g. {HELD_OUT_SEED}: a fresh held-out draw)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    timing = TimingOptions(warmup=5, repeat=args.repeat, flush_l2=True)
    from dispatcher.torch import native
    native.extension(wait=True)  # the plain calls' C++ launches: built (or found) before any timing
    # The plain calls (the default column) select as a fresh install does:
    # the shipped winners, nothing that earlier runs on this machine recorded.
    dispatcher.api.default_dispatcher().tuning = TuningDatabase(Path(tempfile.mkdtemp()) / "tuning.sqlite")
    corpus = load_shapes()["gpu"]
    parts = args.only.split(",")
    tmp = tempfile.mkdtemp()
    result = {"command": " ".join(sys.argv),
              "environment": {**environment(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "cuda": torch.version.cuda,
                              "driver": os.popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader").read().strip(),
                              "nvcc": get_target("cuda").toolchain().identity},
              "timing": {"warmup": 5, "repeat": args.repeat, "statistic": "median", "timer": "CUDA events",
                         "l2_flush": True}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():  # after every part (and every row of random and mlp): a run stopped early keeps what it measured
        result["summary"] = summarize(result)
        (out / "cuda_gemm.json").write_text(json.dumps(result, indent=1, default=str))

    for part in parts:
        if part in ("regular", "unaligned", "skinny", "stream_k"):
            variant = "stream_k" if part == "stream_k" else "regular"
            result[part] = bench_gemm([tuple(s) for s in corpus[part]], variant, timing, tmp)
        elif part == "fp8":
            large = [tuple(s) for s in corpus["regular"] if min(s) >= 4096 and s[0] == s[1] == s[2]]
            result["fp8"] = bench_gemm(large, "regular", timing, tmp, torch.float8_e4m3fn, "bf16")
        elif part == "grouped":
            result["grouped"] = bench_grouped(corpus["grouped"], timing, tmp)
        elif part == "random":
            bench_random(timing, args.seed, rows=result.setdefault("random", []), after_each=save)
        elif part == "mlp":
            bench_catalog(mlp_gemms(), "mlp", timing, rows=result.setdefault("mlp", []), after_each=save)
        elif part == "overhead":
            decode = next(c for c in corpus["grouped"] if "decode" in c["name"])
            result["per_call"] = bench_overhead(decode)
        else:
            raise SystemExit(f"unknown part {part!r}")
        save()
    plot(result, out / "cuda_gemm.png")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
