"""Batched GEMM and the fused epilogue, each against its baseline in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/batched.py          # cpu
    python benchmarks/batched.py --cuda                                                # H200

CPU: `dispatcher.matmul` (the `batched` variant, its default selection) vs
`numpy.matmul` on the same fp32 3-D arrays, into preallocated outputs,
timed in alternating rounds (common.time_interleaved). Target >= 1.5x.

--cuda: on the GPU, with torch CUDA tensors on one stream, CUDA-event
medians: batched bf16 vs `torch.bmm` (target >= 0.95x), and 2-D bf16 GEMM
+ bias + GELU fused (`regular` with the epilogue) vs `torch.matmul`
followed by the bias add and `torch.nn.functional.gelu` (target >= 1.1x).
Each kernel is checked against its baseline's result before it is timed.

Writes benchmarks/results/batched_{cpu,cuda}.json and a .png plot of the ratios.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import dispatcher
from common import (RESULTS, environment, geomean, pyplot, time_interleaved, warn_if_openblas_throttled,
                    write)
from dispatcher.timing import TimingOptions
from dispatcher.verify import max_rel, random_matrix

# (batch, M, N, K): attention-like and small-matrix batches, where a loop of
# BLAS calls pays per matrix, and a few larger ones.
CPU_SHAPES = [(512, 64, 64, 64), (256, 128, 128, 64), (128, 128, 128, 128), (64, 256, 256, 64),
              (32, 256, 256, 256), (8, 512, 512, 512)]
CUDA_BATCHED = [(64, 1024, 1024, 1024), (128, 512, 512, 512), (512, 256, 256, 128),
                (16, 2048, 2048, 2048), (256, 128, 128, 64)]
CUDA_FUSED = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 8192, 2048), (16384, 4096, 1024)]


def stack(batch, rows, cols, dtype, rng):
    return np.stack([random_matrix(rows, cols, dtype, "r", rng) for _ in range(batch)])


def cpu(args) -> dict:
    warn_if_openblas_throttled()
    rng = np.random.default_rng(0)
    timing = TimingOptions(warmup=2, repeat=args.repeat)
    rows = []
    for batch, m, n, k in CPU_SHAPES:
        a, b = stack(batch, m, k, "fp32", rng), stack(batch, k, n, "fp32", rng)
        ours, theirs = np.empty((batch, m, n), np.float32), np.empty((batch, m, n), np.float32)
        dispatcher.matmul(a, b, out=ours)  # builds and selects once
        np.matmul(a, b, out=theirs)
        error = max_rel(ours, theirs.astype(np.float64))
        t = time_interleaved({"dispatcher": lambda: dispatcher.matmul(a, b, out=ours),
                              "numpy": lambda: np.matmul(a, b, out=theirs)}, timing)
        flops = 2.0 * batch * m * n * k
        row = dict(batch=batch, m=m, n=n, k=k, dispatcher_s=t["dispatcher"], numpy_s=t["numpy"],
                   speedup=t["numpy"] / t["dispatcher"], dispatcher_gflops=flops / t["dispatcher"] / 1e9,
                   numpy_gflops=flops / t["numpy"] / 1e9, max_rel_vs_numpy=error)
        print(f"{batch}x{m}x{n}x{k}: {row['speedup']:.2f}x numpy "
              f"({row['dispatcher_gflops']:.1f} vs {row['numpy_gflops']:.1f} GFLOP/s)", flush=True)
        rows.append(row)
    return dict(environment=dict(environment(), load_average=os.getloadavg()), rows=rows,
                geomean_speedup=geomean(r["speedup"] for r in rows), target=1.5)


def cuda(args) -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = torch.device("cuda")

    def timed(fn, repeat=args.repeat * 5):
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeat):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return float(np.median(times))

    rows = []
    for batch, m, n, k in CUDA_BATCHED:
        a = torch.randn(batch, m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(batch, k, n, device=dev, dtype=torch.bfloat16)
        ours = torch.empty(batch, m, n, device=dev, dtype=torch.bfloat16)
        dispatcher.matmul(a, b, out=ours, target="cuda")
        ref = torch.bmm(a, b)
        error = max_rel(ours.float().cpu().numpy(), ref.double().cpu().numpy())
        t_ours = timed(lambda: dispatcher.matmul(a, b, out=ours, target="cuda"))
        t_ref = timed(lambda: torch.bmm(a, b))
        rows.append(dict(case="batched_bf16", batch=batch, m=m, n=n, k=k, dispatcher_s=t_ours,
                         torch_s=t_ref, speedup=t_ref / t_ours, max_rel_vs_torch=error, target=0.95))
        print(f"bmm {batch}x{m}x{n}x{k}: {t_ref / t_ours:.2f}x torch.bmm (err {error:.1e})", flush=True)
    for m, n, k in CUDA_FUSED:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
        ours = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        unfused = lambda: F.gelu(torch.matmul(a, b) + bias)
        dispatcher.matmul(a, b, out=ours, bias=bias, activation="gelu", target="cuda")
        error = max_rel(ours.float().cpu().numpy(), unfused().double().cpu().numpy())
        t_ours = timed(lambda: dispatcher.matmul(a, b, out=ours, bias=bias, activation="gelu", target="cuda"))
        t_ref = timed(unfused)
        rows.append(dict(case="gemm_bias_gelu_bf16", batch=1, m=m, n=n, k=k, dispatcher_s=t_ours,
                         torch_s=t_ref, speedup=t_ref / t_ours, max_rel_vs_torch=error, target=1.1))
        print(f"gemm+bias+gelu {m}x{n}x{k}: {t_ref / t_ours:.2f}x unfused torch (err {error:.1e})", flush=True)
    return dict(environment=dict(environment(), gpu=torch.cuda.get_device_name(), torch=torch.__version__),
                rows=rows)


def plot(name: str, payload: dict):
    plt = pyplot(RESULTS / f"{name}.png")
    if plt is None:
        return
    rows = payload["rows"]
    labels = [f"{r.get('case', 'fp32')}\n{r['batch']}x{r['m']}x{r['n']}x{r['k']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.3), 4))
    ax.bar(range(len(rows)), [r["speedup"] for r in rows])
    for i, r in enumerate(rows):
        ax.hlines(r.get("target", payload.get("target", 1.0)), i - 0.4, i + 0.4, colors="red")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("speedup over baseline (median)")
    ax.set_title(f"{name}: dispatcher vs {'numpy.matmul' if name.endswith('cpu') else 'torch'} (red: target)")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="the H200 part (torch, CUTLASS kernels)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per contender")
    args = parser.parse_args()
    name = "batched_cuda" if args.cuda else "batched_cpu"
    payload = cuda(args) if args.cuda else cpu(args)
    print(f"wrote {write(name, payload)}")
    plot(name, payload)


if __name__ == "__main__":
    main()
