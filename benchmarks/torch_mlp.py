"""A transformer MLP block with dispatcher.torch.Linear vs torch.nn.Linear, in one run.

    python benchmarks/torch_mlp.py [--repeat 30] [--out DIR]        # H200: 4096 -> 14336 -> 4096, bf16, 8192 tokens
    python benchmarks/torch_mlp.py --grid [--modes ...] --out DIR  # H200: d 1024/2048/4096 x tokens 1024/4096/8192
    python benchmarks/torch_mlp.py --smoke --out /tmp/torch_mlp    # CPU, tiny sizes: checks the script runs

--grid runs every cell of d in {1024, 2048, 4096} (hidden 2.75 d, rounded
to 64) and tokens in {1024, 4096, 8192}, and reports per cell and mode the
host time (what issuing one step costs the CPU: perf_counter around the
step, before any synchronize) beside the GPU time (CUDA events), so each
cell says which of the two limits it: a step whose host time exceeds its
GPU time leaves the GPU idle. Modes add "graphed" (the step captured in a
CUDA graph and replayed: no host work but the replay) to eager and
compiled; --modes picks some.

The block is Linear(d, h) -> GELU(tanh) -> Linear(h, d), no bias (as in
Llama-style blocks), bf16. Four modes: forward (under no_grad) and
forward + backward, each eager and under torch.compile(fullgraph=True)
(inductor). Both models hold the same weights; each mode times them in
alternating rounds, CUDA events around each step, medians of --repeat
steps after warm-up. The figure is the ratio nn.Linear time / dispatcher
time (above 1: the dispatcher is faster). Writes torch_mlp.json (machine,
GPU, versions, command, per-mode times, ratios, TFLOP/s, the outputs'
agreement) and torch_mlp.png (--grid: torch_mlp_grid.json and .png, a heat map
per mode; needs matplotlib, else `--plot JSON` draws
it later where matplotlib is).

Kernels: the selection for each of the six GEMMs (per layer: rcr forward,
rrr dX, crr dW; the JSON names each kernel), the tuning database's entry
first; --autotune tunes each on its first (warm-up) call. Build them ahead
with `gemm-dispatcher prebuild --target cuda --dtype bf16 --variant regular
--layout rcr rrr crr` (or let the first calls build them where nvcc is).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import dispatcher.torch as dt
from common import pyplot
from dispatcher.api import default_dispatcher
from dispatcher.problem import GemmProblem
from dispatcher.verify import max_rel

MODES = ("forward eager", "forward compiled", "fwd+bwd eager", "fwd+bwd compiled")
GRID_MODES = ("forward eager", "forward graphed", "forward compiled", "fwd+bwd eager", "fwd+bwd graphed",
              "fwd+bwd compiled")
GRID_D, GRID_TOKENS = (1024, 2048, 4096), (1024, 4096, 8192)


def mlp(d: int, h: int, device, dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d, h, bias=False), torch.nn.GELU(approximate="tanh"),
                               torch.nn.Linear(h, d, bias=False)).to(device=device, dtype=dtype)


class Clock:
    """Milliseconds of one call: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3


def step(model, x, grad, backward: bool):
    """One forward (under no_grad) or forward + backward of `model`."""
    if not backward:
        with torch.no_grad():
            return model(x)
    for p in model.parameters():
        p.grad = None
    y = model(x)
    y.backward(grad)
    return y


def time_modes(models: dict, x, grad, clock, repeat: int, warmup: int, rounds: int = 4) -> dict:
    """{mode: {contender: median ms}}: contenders alternate in `rounds`
    blocks of repeat/rounds steps, each block after `warmup` steps, so a
    slow spell of the machine falls on both alike."""
    out = {}
    for mode in MODES:
        backward = mode.startswith("fwd+bwd")
        fns = {name: (lambda m=m[mode.endswith("compiled")]: step(m, x, grad, backward))
               for name, m in models.items()}
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                for _ in range(warmup):
                    fn()
                times[name] += [clock(fn) for _ in range(max(1, -(-repeat // rounds)))]
        out[mode] = {name: statistics.median(t) for name, t in times.items()}
        print(f"{mode:17s} " + "  ".join(f"{n} {t:8.3f} ms" for n, t in out[mode].items())
              + f"  ratio {out[mode]['nn.Linear'] / out[mode]['dispatcher']:.3f}", flush=True)
    return out


def graphed(model, x, grad, backward: bool):
    """One step of `model` captured in a CUDA graph (after warm-up steps on a
    side stream, as torch's docs do): a function that replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step(model, x, grad, backward)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for p in model.parameters():
        p.grad = None
    with torch.cuda.graph(graph):
        if backward:
            model(x).backward(grad)
        else:
            with torch.no_grad():
                model(x)
    return graph.replay


def host_and_gpu_ms(fn, repeat: int, warmup: int) -> tuple:
    """(median host ms, median GPU ms) of fn: host time is perf_counter
    around the call alone, GPU time CUDA events around it, each step
    synchronized after both are read."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    host, gpu = [], []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
    return statistics.median(host), statistics.median(gpu)


def grid(args) -> dict:
    """Every cell of the grid (module docstring): per mode each contender's
    host and GPU ms, the ratio nn.Linear / dispatcher of GPU ms, and which
    of host or GPU bounds the dispatcher's step."""
    device, dtype, cells = torch.device("cuda"), torch.bfloat16, []
    for d in GRID_D:
        h = grid_hidden(d)
        for tokens in GRID_TOKENS:
            base = mlp(d, h, device, dtype)
            models = {"nn.Linear": base, "dispatcher": dt.swap_linears(copy.deepcopy(base), autotune=args.autotune)}
            gen = torch.Generator(device=device).manual_seed(1)
            x = torch.randn(tokens, d, generator=gen, device=device, dtype=dtype)
            grad = torch.randn(tokens, d, generator=gen, device=device, dtype=dtype)
            cell = {"d": d, "h": h, "tokens": tokens, "modes": {}}
            for mode in args.modes.split(","):
                backward, kind = mode.startswith("fwd+bwd"), mode.split()[-1]
                row = {}
                for name, model in models.items():
                    if kind == "graphed":
                        fn = graphed(model, x, grad, backward)
                    else:
                        run = torch.compile(model, fullgraph=True) if kind == "compiled" else model
                        fn = lambda run=run: step(run, x, grad, backward)  # noqa: E731
                    host, gpu = host_and_gpu_ms(fn, args.repeat, args.warmup)
                    row[name] = {"host_ms": host, "gpu_ms": gpu}
                row["ratio"] = row["nn.Linear"]["gpu_ms"] / row["dispatcher"]["gpu_ms"]
                mine = row["dispatcher"]
                row["dispatcher_limited_by"] = "host" if mine["host_ms"] > 0.9 * mine["gpu_ms"] else "kernels"
                cell["modes"][mode] = row
                print(f"d {d:5d} tokens {tokens:5d} {mode:17s} ratio {row['ratio']:.3f}  dispatcher host "
                      f"{mine['host_ms']:.3f} / gpu {mine['gpu_ms']:.3f} ms ({row['dispatcher_limited_by']})",
                      flush=True)
            cells.append(cell)
            del models, base
            torch.cuda.empty_cache()
    return {"environment": versions(device), "cells": cells, "autotune": args.autotune,
            "timing": {"repeat": args.repeat, "warmup": args.warmup, "statistic": "median",
                       "ratio": "nn.Linear GPU ms / dispatcher GPU ms (above 1: the dispatcher is faster)"}}


def agreement(models: dict, x, grad) -> dict:
    """max|a-b|/max|b| of the two eager models' outputs and first-layer weight gradients."""
    ref_model, model = models["nn.Linear"][0], models["dispatcher"][0]
    y_ref, y = step(ref_model, x, grad, True), step(model, x, grad, True)
    as_numpy = lambda t: t.detach().double().cpu().numpy()  # noqa: E731
    return {"output": max_rel(as_numpy(y), as_numpy(y_ref)),
            "weight_grad": max_rel(as_numpy(model[0].weight.grad), as_numpy(ref_model[0].weight.grad))}


def grid_hidden(d: int) -> int:
    """The grid's hidden width for model width d: 2.75 d, a multiple of 64."""
    return round(2.75 * d / 64) * 64


def gemm_problems(d: int, h: int, tokens: int, target: str) -> dict:
    """{GEMM: problem} of the six GEMMs one step runs: each layer's forward
    (rcr), dX (rrr) and dW (crr)."""
    gemms = {}
    for layer, (n_in, n_out) in (("up", (d, h)), ("down", (h, d))):
        for role, (m, n, k, layout) in (("forward", (tokens, n_out, n_in, "rcr")),
                                        ("dX", (tokens, n_in, n_out, "rrr")),
                                        ("dW", (n_out, n_in, tokens, "crr"))):
            gemms[f"{layer} {role} {m}x{n}x{k} {layout}"] = GemmProblem(m, n, k, "bf16", "bf16", layout, "regular",
                                                                         target)
    return gemms


def selected_kernels(d: int, h: int, tokens: int, target: str) -> dict:
    """{GEMM: kernel} of the six GEMMs one step runs (as selected, or tuned)."""
    return {name: default_dispatcher().select(problem).name
            for name, problem in gemm_problems(d, h, tokens, target).items()}


def versions(device) -> dict:
    import numpy
    info = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy.__version__,
            "machine": platform.machine(), "node": platform.node(),
            "command": " ".join(["python3", *sys.argv]), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    from dispatcher.torch import native
    info["native_linear"] = native.failure() or ("on" if native.extension() is not None else "loading")
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    capability=".".join(map(str, torch.cuda.get_device_capability(device))))
    try:
        import cupy
        info["cupy"] = cupy.__version__
    except ImportError:
        pass
    return info


def plot(result: dict, path: Path):
    plt = pyplot(path, f"; draw it elsewhere with --plot {path.with_suffix('.json')}")
    if plt is None:
        return
    ratios = [result["modes"][m]["ratio"] for m in MODES]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(MODES, ratios, color=["tab:green" if r >= 1 else "tab:red" for r in ratios])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.95, color="k", lw=0.6, ls="--", label="0.95x floor")
    for i, r in enumerate(ratios):
        ax.text(i, r, f"{r:.3f}", ha="center", va="bottom", fontsize=8)
    s = result["shape"]
    ax.set_title(f"MLP {s['d']}->{s['h']}->{s['d']}, {s['tokens']} tokens, {s['dtype']}, "
                 f"{result['environment'].get('gpu', 'cpu')}", fontsize=9)
    ax.set_ylabel("nn.Linear time / dispatcher.torch.Linear time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_grid(result: dict, path: Path):
    """One heat map per mode: d by tokens, each cell's ratio and what limits
    the dispatcher's step there (host or kernels)."""
    plt = pyplot(path, f"; draw it elsewhere with --plot {path.with_suffix('.json')}")
    if plt is None:
        return
    cells = result["cells"]
    modes = list(cells[0]["modes"])
    ds, tokens = sorted({c["d"] for c in cells}), sorted({c["tokens"] for c in cells})
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 3.8), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        ratios = np.full((len(ds), len(tokens)), np.nan)
        for c in cells:
            row = c["modes"][mode]
            i, j = ds.index(c["d"]), tokens.index(c["tokens"])
            ratios[i, j] = row["ratio"]
            ax.text(j, i, f"{row['ratio']:.2f}\n{row['dispatcher_limited_by']}", ha="center", va="center", fontsize=8)
        ax.imshow(ratios, cmap="RdYlGn", vmin=0.5, vmax=1.5)
        ax.set_xticks(range(len(tokens)), [str(t) for t in tokens])
        ax.set_yticks(range(len(ds)), [str(d) for d in ds])
        ax.set_xlabel("tokens")
        ax.set_ylabel("d (hidden 2.75 d)")
        ax.set_title(mode, fontsize=9)
    fig.suptitle(f"MLP block, bf16, {result['environment'].get('gpu', 'cpu')}: nn.Linear GPU time / "
                 "dispatcher.torch.Linear GPU time", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--h", type=int, default=14336)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=30, help="timed steps per contender and mode (>= 20)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--autotune", action="store_true",
                    help="dispatcher.torch.Linear(autotune=True): time the top ranked kernels of each GEMM "
                         "on its first call (a warm-up) and keep the fastest")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, few steps, aot_eager compile")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--plot", metavar="JSON", help="only draw the PNG of an earlier run's JSON")
    ap.add_argument("--grid", action="store_true", help="every cell of d x tokens (module docstring)")
    ap.add_argument("--modes", default=",".join(GRID_MODES), help="--grid's modes, comma-separated")
    args = ap.parse_args()
    from dispatcher.torch import native
    native.extension(wait=True)  # Linear's native calls (docs/pytorch.md): built or found before any timing
    if args.grid:
        if not torch.cuda.is_available():
            sys.exit("--grid needs a CUDA GPU")
        unknown = set(args.modes.split(",")) - set(GRID_MODES)
        if unknown:
            ap.error(f"unknown mode(s) {', '.join(sorted(unknown))}; modes: {', '.join(GRID_MODES)}")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = grid(args)
        (out / "torch_mlp_grid.json").write_text(json.dumps(result, indent=1))
        plot_grid(result, out / "torch_mlp_grid.png")
        return
    if args.plot:
        path = Path(args.plot)
        result = json.loads(path.read_text())
        (plot_grid if "cells" in result else plot)(result, path.with_suffix(".png"))
        return
    if args.smoke:
        device, backend = torch.device("cpu"), "aot_eager"
        args.d, args.h, args.tokens, args.repeat, args.warmup = 64, 224, 128, 4, 1
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA GPU: run on the H200, or --smoke on a CPU")
        device, backend = torch.device("cuda"), "inductor"
    dtype = torch.bfloat16
    base = mlp(args.d, args.h, device, dtype)
    ours = dt.swap_linears(copy.deepcopy(base), autotune=args.autotune)
    models = {name: (m, torch.compile(m, fullgraph=True, backend=backend))
              for name, m in (("nn.Linear", base), ("dispatcher", ours))}
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(args.tokens, args.d, generator=gen, device=device, dtype=dtype)
    grad = torch.randn(args.tokens, args.d, generator=gen, device=device, dtype=dtype)
    times = time_modes(models, x, grad, Clock(device), args.repeat, args.warmup)
    forward_flops = 2.0 * args.tokens * args.d * args.h * 2
    result = {
        "environment": versions(device),
        "shape": {"d": args.d, "h": args.h, "tokens": args.tokens, "dtype": "bf16", "bias": False,
                  "activation": "gelu_tanh"},
        "timing": {"repeat": args.repeat, "warmup": args.warmup, "statistic": "median",
                   "clock": "cuda events" if device.type == "cuda" else "perf_counter",
                   "compile": f"torch.compile(fullgraph=True, backend={backend!r})",
                   "autotune": args.autotune},
        "kernels": selected_kernels(args.d, args.h, args.tokens, device.type),
        "agreement_max_rel": agreement(models, x, grad),
        "modes": {},
    }
    for mode, t in times.items():
        flops = forward_flops * (3 if mode.startswith("fwd+bwd") else 1)
        result["modes"][mode] = {"nn_linear_ms": t["nn.Linear"], "dispatcher_ms": t["dispatcher"],
                                 "ratio": t["nn.Linear"] / t["dispatcher"],
                                 "nn_linear_tflops": flops / t["nn.Linear"] / 1e9,
                                 "dispatcher_tflops": flops / t["dispatcher"] / 1e9}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "torch_mlp.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "torch_mlp.png")
    print(json.dumps({"agreement_max_rel": result["agreement_max_rel"],
                      "ratios": {m: round(v["ratio"], 4) for m, v in result["modes"].items()}}, indent=1))


if __name__ == "__main__":
    main()
