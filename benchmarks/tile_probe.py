"""Candidate kernels outside a catalog, timed on the shapes they are meant
for, against torch's kernel for the same problem: the probe that decides
what a catalog gains (issue 23: the stream_k variant on few-tile long-K
shapes, fp8 tiles against torch._scaled_mm; issue 22: batched tiles against
torch.bmm).

    OUT=dir PROBE=stream_k,fp8,batched python benchmarks/tile_probe.py   # on the GPU machine

Each set names its shapes, its candidates (the variant's catalog and the
new ones), the public call that runs a candidate and torch's call. Every
candidate's result is checked against torch's (max_rel < 2e-2) before it
is timed; both are timed alone (a CUDA graph replayed, L2 flushed, median
of 15). Writes tile_probe.json and tile_probe.png under $OUT.
"""
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, pyplot  # noqa: E402
from cuda_gemm import launch_time, operands  # noqa: E402
import dispatcher  # noqa: E402
from dispatcher.api import Dispatcher  # noqa: E402
from dispatcher.config import KernelConfig  # noqa: E402
from dispatcher.problem import GemmProblem  # noqa: E402
from dispatcher.timing import TimingOptions  # noqa: E402


def cfg(variant, m, n, sched, cm=1, cn=1, dtype="bf16", tile_k=64, **v):
    return KernelConfig.create(variant=variant, target="cuda", dtype=dtype, dtype_c="bf16", layout="rcr",
                               tile_m=m, tile_n=n,
                               tile_k=tile_k, schedule=sched, cluster_m=cm, cluster_n=cn, **v)


def tree(m, n, sched, cm, cn, splits):
    return cfg("stream_k", m, n, sched, cm, cn, reduction="tree", decomposition="split_k", splits=splits)


def catalog(variant, dtype):
    """The variant's catalog for `dtype` rcr, bf16 out, on cuda, as configs."""
    problem = GemmProblem(1024, 1024, 1024, dtype, "bf16", "rcr", variant, "cuda")
    return Dispatcher(tuning=None).candidates(problem)


class StreamK:
    """Few-tile, long-K shapes on the stream_k variant: tree split-K with
    the large tiles that read each operand fewer times than 64-wide ones."""
    shapes = [(256, 1024, 32768), (2048, 2048, 16384), (1408, 3328, 8192), (1536, 3072, 2048), (512, 512, 65536)]
    new = [tree(128, 128, "cooperative", 1, 2, s) for s in (4, 8, 16)] + \
          [tree(128, 256, "cooperative", 2, 1, s) for s in (4, 8, 16)] + \
          [tree(256, 128, "cooperative", 1, 2, s) for s in (4, 8, 16)] + \
          [tree(128, 128, "pingpong", 1, 2, s) for s in (4, 8)] + \
          [tree(64, 256, "pingpong", 1, 2, s) for s in (4, 8)] + \
          [tree(64, 128, "pingpong", 1, 1, 4), tree(64, 128, "pingpong", 1, 2, 4), tree(64, 128, "pingpong", 1, 4, 4)]
    variant, dtype = "stream_k", "bf16"

    @staticmethod
    def problem(m, n, k):
        a, b = operands(m, n, k)
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        return (lambda: torch.matmul(a, b, out=out),
                lambda c, d: dispatcher.gemm(a, b, out=out, variant="stream_k", config=c, dispatcher=d), out)


class Fp8:
    """fp8 e4m3 in, bf16 out, against torch._scaled_mm (unit scales, no
    fast accumulation on either side): tiles whose two accumulators per
    warp group may still fit the registers (64x192), and a longer K step."""
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (5120, 5120, 5120), (2048, 2048, 16384), (6144, 6144, 6144)]
    new = [cfg("regular", 128, 192, "cooperative", cm, cn, dtype="fp8_e4m3", tile_k=128) for cm, cn in ((1, 2), (2, 1))] + \
          [cfg("regular", 64, 192, "pingpong", cm, cn, dtype="fp8_e4m3", tile_k=128) for cm, cn in ((1, 2), (2, 1))] + \
          [cfg("regular", 128, 128, "cooperative", cm, cn, dtype="fp8_e4m3", tile_k=256) for cm, cn in ((1, 2), (2, 1))] + \
          [cfg("regular", 128, 128, "cooperative", 2, 1, dtype="fp8_e4m3", tile_k=128, swizzle=s) for s in (2, 4)] + \
          [cfg("regular", 128, 128, "cooperative", 1, 2, dtype="fp8_e4m3", tile_k=128, swizzle=4)] + \
          [cfg("regular", 128, 128, "pingpong", 1, 2, dtype="fp8_e4m3", tile_k=128)]
    variant, dtype = "regular", "fp8_e4m3"

    @staticmethod
    def problem(m, n, k):
        a, b = operands(m, n, k, torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        return (lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                lambda c, d: dispatcher.gemm(a, b, out=out, out_dtype="bf16", config=c, dispatcher=d), out)


class Batched:
    """call_overhead.py's batched rows (torch.bmm): the batched variant's two
    tiles against the regular catalog's data-parallel ones."""
    shapes = [(4, 2048, 3072, 1024), (16, 1024, 1024, 512), (48, 384, 640, 128), (8, 4096, 4096, 512)]
    new = [cfg("batched", m, n, s, cm, cn, **x) for m, n, s, cm, cn, x in (
        (256, 128, "cooperative", 1, 2, {}), (128, 128, "cooperative", 2, 1, {}), (128, 128, "cooperative", 1, 2, {}),
        (128, 256, "cooperative", 2, 1, dict(swizzle=4)), (128, 256, "cooperative", 1, 1, {}),
        (64, 128, "pingpong", 1, 4, {}), (64, 128, "pingpong", 2, 1, {}), (64, 256, "pingpong", 1, 2, {}),
        (128, 128, "pingpong", 1, 2, {}), (128, 256, "cooperative", 2, 1, dict(raster="along_m")),
        (128, 256, "cooperative", 2, 1, dict(raster="along_n")))]
    variant, dtype = "batched", "bf16"

    @staticmethod
    def problem(bsz, m, n, k):
        p = (torch.rand(bsz, m, k, device="cuda") - 0.5).to(torch.bfloat16)
        q = (torch.rand(bsz, n, k, device="cuda") - 0.5).to(torch.bfloat16).transpose(1, 2)
        out = torch.empty((bsz, m, n), device="cuda", dtype=torch.bfloat16)
        return (lambda: torch.bmm(p, q, out=out),
                lambda c, d: dispatcher.matmul(p, q, out=out, config=c, dispatcher=d), out)


SETS = {"stream_k": StreamK, "fp8": Fp8, "batched": Batched}


def probe(kind, d, timing, deadline):
    configs = catalog(kind.variant, kind.dtype) + [c for c in kind.new]
    configs = list({c.name: c for c in configs}.values())
    start = time.time()
    with ThreadPoolExecutor(16) as pool:
        built = list(pool.map(lambda c: (c, _try(lambda: d.library(c))), configs))
    print(f"{kind.__name__}: built {sum(1 for _, lib in built if not isinstance(lib, Exception))} of "
          f"{len(built)} in {time.time() - start:.0f}s", flush=True)
    for c, lib in built:
        if isinstance(lib, Exception):
            print(f"  FAILED {c.name}: {str(lib)[:300]}")
    rows = []
    for shape in kind.shapes:
        if time.time() > deadline:
            print("out of time")
            break
        baseline, call, out = kind.problem(*shape)
        ref = baseline().float()
        t_torch = launch_time(lambda s: baseline(), timing)[0] * 1e6
        times = {}
        for c, lib in built:
            if isinstance(lib, Exception):
                continue
            try:
                out.fill_(float("nan"))
                call(c, d)
                torch.cuda.synchronize()
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                if not err < 2e-2:
                    times[c.name] = f"WRONG max_rel {err}"
                    continue
                times[c.name] = round(launch_time(lambda s: call(c, d), timing)[0] * 1e6, 2)
            except Exception as e:  # noqa: BLE001 - reported per config
                times[c.name] = f"refused: {str(e)[-200:]}"
        ranked = sorted((v, k) for k, v in times.items() if isinstance(v, float))
        shown = "x".join(map(str, shape))
        print(f"{shown}: torch {t_torch:.1f} us; best " + ", ".join(
            f"{name.split('rcr_')[1]} {t:.1f} ({t_torch / t:.2f}x)" for t, name in ranked[:6]), flush=True)
        rows.append(dict(shape=list(shape), torch_us=t_torch, kernels_us=times,
                         new=[c.name for c in kind.new]))
    return rows


def plot(result, path):
    """Per set and shape: the catalog's best and the best new candidate over torch's time."""
    plt = pyplot(path)
    if plt is None:
        return
    bars = []
    for part, rows in result["sets"].items():
        for r in rows:
            timed = {k: v for k, v in r["kernels_us"].items() if isinstance(v, float)}
            old = [v for k, v in timed.items() if k not in r["new"]]
            new = [v for k, v in timed.items() if k in r["new"]]
            label = f"{part} {'x'.join(map(str, r['shape']))}"
            bars.append((label, r["torch_us"] / min(old) if old else 0, r["torch_us"] / min(new) if new else 0))
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(max(8, len(bars) * 0.7), 4.5))
    xs = range(len(bars))
    ax.bar([x - 0.2 for x in xs], [b[1] for b in bars], 0.4, label="catalog's best")
    ax.bar([x + 0.2 for x in xs], [b[2] for b in bars], 0.4, label="best new candidate")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b[0] for b in bars], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("torch time / kernel time")
    ax.set_title(f"candidate kernels alone vs torch ({result['gpu']})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _try(f):
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - reported per config
        return e


def main():
    d = Dispatcher(tuning=None)
    timing = TimingOptions(warmup=5, repeat=15, flush_l2=True)
    deadline = time.time() + float(os.environ.get("PROBE_SECONDS", "400"))
    parts = os.environ.get("PROBE", ",".join(SETS)).split(",")
    result = dict(command=f"PROBE={','.join(parts)} OUT=dir python benchmarks/tile_probe.py",
                  environment=environment(), gpu=torch.cuda.get_device_name(), sets={})
    out_dir = os.environ.get("OUT", ".")
    for part in parts:
        result["sets"][part] = probe(SETS[part], d, timing, deadline)
        with open(f"{out_dir}/tile_probe.json", "w") as f:
            json.dump(result, f, indent=1)
    plot(result, f"{out_dir}/tile_probe.png")


if __name__ == "__main__":
    main()
