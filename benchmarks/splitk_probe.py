"""Kernel families on few-tile problems (skinny M, 64 x 4096^2, 1024^3, few
tiles of a long K), against torch.matmul (cuBLAS), and fused bias + GELU
against torch's addmm + gelu, per tile and schedule: the probe behind the
regular catalog's small tiles and tree split-K (issue 23) and its fused
epilogue kernels (issue 22).

    OUT=dir python benchmarks/splitk_probe.py     # on the GPU machine; FUSED=0 or SPLIT=0 leaves a part out
    # FUSED_LAYOUT=rrr: the fused part with B row-major (call_overhead.py's fused rows)

Which split-K reduction streams a few-tile problem at cuBLAS speed?
CUTLASS's stream-K fix-up adds the K slices' partials in turn (linear) or
under a lock (atomic); the tree reduction writes them to the workspace and
sums them in a kernel of its own (native/cuda/split_k_tree.hpp), on any
schedule. Each kernel alone (a CUDA graph replayed, L2 flushed), torch the
same way, every result checked against torch's first. Writes
splitk_probe.json and splitk_probe.png under $OUT."""
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, pyplot  # noqa: E402
from cuda_gemm import launch_time, operands, timed  # noqa: E402
import dispatcher  # noqa: E402
from dispatcher.api import Dispatcher  # noqa: E402
from dispatcher.config import KernelConfig  # noqa: E402
from dispatcher.kinds import prepare_gemm  # noqa: E402
from dispatcher.targets import get as get_target  # noqa: E402
from dispatcher.timing import TimingOptions  # noqa: E402

SHAPES = [(8, 2048, 8192), (16, 2048, 8192), (32, 4096, 4096), (64, 4096, 4096), (64, 2048, 8192),
          (16, 8192, 2048), (128, 4096, 4096), (1024, 1024, 1024), (256, 1024, 32768), (1536, 3072, 2048),
          (2048, 2048, 16384), (1408, 3328, 8192)]


def cfg(variant, m, n, sched, cm=1, cn=1, **v):
    return KernelConfig.create(variant=variant, target="cuda", dtype="bf16", layout="rcr", tile_m=m, tile_n=n,
                               tile_k=64, schedule=sched, cluster_m=cm, cluster_n=cn, **v)


CONFIGS = [cfg("regular", 64, 128, "pingpong", 2, 1), cfg("regular", 64, 128, "pingpong", 1, 4),
           cfg("regular", 64, 64, "pingpong", 1, 1), cfg("regular", 128, 128, "cooperative", 1, 2, splits=4),
           cfg("regular", 64, 64, "pingpong", 1, 2), cfg("regular", 64, 64, "pingpong", 2, 1),
           cfg("regular", 128, 64, "pingpong", 1, 1), cfg("regular", 128, 64, "cooperative", 1, 1),
           cfg("regular", 64, 64, "pingpong", 2, 2)]
for s in (2, 4, 8, 16):
    for n in (64, 128):
        CONFIGS.append(cfg("stream_k", 64, n, "pingpong", 1, 1, reduction="tree", decomposition="split_k", splits=s))
    CONFIGS.append(cfg("stream_k", 64, 128, "pingpong", 2, 1, reduction="tree", decomposition="split_k", splits=s))
    CONFIGS.append(cfg("stream_k", 64, 64, "pingpong", 1, 2, reduction="tree", decomposition="split_k", splits=s))
for s in (2, 4, 8):
    for n, cn in ((128, 2), (64, 1)):
        CONFIGS.append(cfg("stream_k", 128, n, "cooperative", 1, cn, reduction="atomic", decomposition="split_k",
                           splits=s))
for n, cn in ((128, 2), (64, 1), (256, 1)):
    CONFIGS.append(cfg("stream_k", 128, n, "cooperative", 1 if n != 256 else 2, cn if n != 256 else 1,
                       reduction="atomic", decomposition="stream_k"))
CONFIGS.append(cfg("stream_k", 128, 256, "cooperative", 2, 1, reduction="atomic", decomposition="hybrid"))


def main():
    d = Dispatcher(tuning=None)
    budget = float(os.environ.get("PROBE_SECONDS", "300"))
    split, fused_part = (os.environ.get(part, "1") == "1" for part in ("SPLIT", "FUSED"))
    start = time.time()
    with ThreadPoolExecutor(16) as pool:  # the fused part's kernels built here too, in parallel
        built = list(pool.map(lambda c: (c, _try(lambda: d.library(c))),
                              (CONFIGS if split else []) + (FUSED_CONFIGS if fused_part else [])))
    print(f"built {sum(1 for _, l in built if not isinstance(l, Exception))} of {len(built)} "
          f"in {time.time() - start:.0f}s", flush=True)
    for c, lib in built:
        if isinstance(lib, Exception):
            print(f"  FAILED {c.name}: {str(lib)[:300]}")
    timing = TimingOptions(warmup=5, repeat=15, flush_l2=True)
    rows = []
    for m, n, k in SHAPES if split else ():
        if time.time() - start > budget:
            print("out of time"); break
        a, b = operands(m, n, k)
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a, b).float()
        t_torch = timed(lambda: torch.matmul(a, b, out=out), timing) * 1e6
        session = get_target("cuda").session(a, b, out)
        prepared = {v: prepare_gemm(*session.arrays[:2], out=session.arrays[2], target="cuda", variant=v,
                                    memory=session.memory, allocate=session.empty)[:2]
                    for v in ("regular", "stream_k")}
        times = {}
        for c, lib in built:
            if isinstance(lib, Exception):
                continue
            out.fill_(float("nan"))
            problem, ops = prepared[c.variant]
            try:
                d.launch(lib, problem, ops, {"stream": torch.cuda.current_stream().cuda_stream})
                torch.cuda.synchronize()
            except dispatcher.DispatcherError as e:
                times[c.name] = f"refused: {str(e)[-300:]}"
                continue
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 2e-2:
                times[c.name] = f"WRONG max_rel {err}"
                continue
            t, how = launch_time(lambda s: d.launch(lib, problem, ops, {"stream": s}), timing)
            times[c.name] = round(t * 1e6, 2)
        dispatcher.gemm(a, b)  # the default selection, made before it is timed
        t_default = timed(lambda: dispatcher.gemm(a, b, out=out), timing) * 1e6
        ranked = sorted((v, k) for k, v in times.items() if isinstance(v, float))
        print(f"{m}x{n}x{k}: torch {t_torch:.1f} us, default call {t_default:.1f} us; best "
              + ", ".join(f"{name.split('rcr_')[1]} {t:.1f} ({t_torch / t:.2f}x)" for t, name in ranked[:5]),
              flush=True)
        bad = {k: v for k, v in times.items() if not isinstance(v, float)}
        if bad:
            print("   ", bad)
        rows.append(dict(M=m, N=n, K=k, torch_us=t_torch, default_call_us=t_default, kernels_us=times))
    fused_rows = fused(timing) if fused_part else []
    out_dir = os.environ.get("OUT", ".")
    result = dict(command="OUT=dir python benchmarks/splitk_probe.py", environment=environment(),
                  gpu=torch.cuda.get_device_name(), rows=rows, fused=fused_rows)
    with open(f"{out_dir}/splitk_probe.json", "w") as f:
        json.dump(result, f, indent=1)
    plot(result, f"{out_dir}/splitk_probe.png")


FAMILIES = {"data-parallel": lambda name: "split" not in name and "stream" not in name,
            "split-K linear (CUTLASS fix-up)": lambda name: "_splitk" in name and "tree" not in name,
            "split-K / stream-K atomic": lambda name: "atomic" in name,
            "split-K tree": lambda name: "tree" in name}


def plot(result, path):
    """Per shape, each family's best kernel over torch.matmul's time."""
    plt = pyplot(path)
    if plt is None or not result["rows"]:
        return
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(FAMILIES)
    for i, (family, member) in enumerate(FAMILIES.items()):
        ratios = []
        for r in rows:
            times = [t for name, t in r["kernels_us"].items() if isinstance(t, float) and member(name)]
            ratios.append(r["torch_us"] / min(times) if times else 0.0)
        ax.bar([x + i * width for x in range(len(rows))], ratios, width, label=family)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels([f"{r['M']}x{r['N']}x{r['K']}" for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("cuBLAS time / best kernel time")
    ax.set_title(f"best of the probe's kernels in each family vs torch.matmul, kernel alone ({result['gpu']})",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


FUSED_TILES = [dict(m=128, n=256, sched="cooperative", cm=2, cn=1), dict(m=256, n=128, sched="cooperative", cm=1, cn=2),
               dict(m=128, n=128, sched="cooperative", cm=1, cn=2), dict(m=128, n=128, sched="pingpong", cm=1, cn=2),
               dict(m=128, n=128, sched="pingpong", cm=2, cn=1), dict(m=64, n=256, sched="pingpong", cm=1, cn=2),
               dict(m=64, n=128, sched="pingpong", cm=2, cn=1), dict(m=128, n=192, sched="pingpong", cm=1, cn=1)]


FUSED_CONFIGS = [cfg("regular", t["m"], t["n"], t["sched"], t["cm"], t["cn"], **epi).replace(
                 layout=os.environ.get("FUSED_LAYOUT", "rcr"))
                 for t in FUSED_TILES for epi in (dict(bias="col", activation="gelu"), {})]


def fused(timing):
    """Fused bias + GELU (dispatcher.matmul) against torch's addmm + gelu, per
    tile and schedule, each a CUDA graph replayed (kernel time), and the plain
    GEMM of the same kernels: what the epilogue costs each schedule."""
    d = Dispatcher(tuning=None)
    rows = []
    layout = os.environ.get("FUSED_LAYOUT", "rcr")  # rrr: B row-major, as call_overhead.py's fused rows
    for m, n, k in ((4096, 4096, 4096), (2048, 8192, 2048), (8192, 2048, 4096), (1024, 1024, 1024)):
        a, b = operands(m, n, k)
        if layout == "rrr":
            b = b.contiguous()
        bias = (torch.rand(n, device="cuda") - 0.5).to(torch.bfloat16)
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.functional.gelu(torch.addmm(bias.float(), a.float(), b.float()))
        t_torch = launch_time(lambda s: torch.nn.functional.gelu(torch.addmm(bias, a, b)), timing)[0] * 1e6
        t_plain_torch = launch_time(lambda s: torch.matmul(a, b, out=out), timing)[0] * 1e6
        times = {}
        for c in FUSED_CONFIGS:
            epi = c.variant_params["activation"] != "none"
            try:
                d.library(c)
                call = (lambda c: lambda s: dispatcher.matmul(a, b, bias=bias, activation="gelu", out=out,
                                                              config=c, dispatcher=d))(c) if epi else \
                    (lambda c: lambda s: dispatcher.gemm(a, b, out=out, config=c, dispatcher=d))(c)
                out.fill_(float("nan"))
                call(0)
                torch.cuda.synchronize()
                if epi:
                    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    if not err < 2e-2:
                        times[c.name] = f"WRONG {err}"
                        continue
                times[c.name] = round(launch_time(call, timing)[0] * 1e6, 2)
            except Exception as e:  # noqa: BLE001 - reported per config
                times[c.name] = f"failed: {str(e)[:200]}"
        ranked = sorted((v, k) for k, v in times.items() if isinstance(v, float) and "gelu" in k)
        print(f"fused {m}x{n}x{k}: torch addmm+gelu {t_torch:.1f} us (matmul {t_plain_torch:.1f}); "
              + ", ".join(f"{name.split(layout + '_')[1]} {t:.1f}" for t, name in ranked[:4]), flush=True)
        print("   plain:", {k.split(layout + '_')[1]: v for k, v in times.items() if "gelu" not in k})
        rows.append(dict(M=m, N=n, K=k, layout=layout, torch_addmm_gelu_us=t_torch, torch_matmul_us=t_plain_torch, kernels_us=times))
    return rows


def _try(f):
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - reported per config
        return e


if __name__ == "__main__":
    main()
