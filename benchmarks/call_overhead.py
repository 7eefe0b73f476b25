"""What a user's call costs, end to end, against the baseline library's call.

Every figure is a median over `--repeat` rounds; each round times a loop of
`--calls` back-to-back calls, then one synchronize (GPU), divided by the
call count: the host work per call where the kernel is small, the kernel
where it is not. Baselines are measured in the same run. On the GPU each
row also reports the host time per call (the loop before its synchronize)
and the GPU time per call (the calls captured in a CUDA graph and
replayed), so it says which of the two limits the call.

Parts (`--only`):
  cpu_call     fp32 16^3 on numpy arrays: numpy (OpenBLAS), dispatcher.gemm,
               dispatcher.matmul, a held dispatcher.plan, dispatcher.gemm into
               an out (plain calls and calls into an out in C once built,
               dispatcher/numpy_calls.py; run it with
               DISPATCHER_NO_NATIVE_CALLS=1 for the Python way), and one
               call of the general way (an out and an explicit target: its
               plan's runner in Python)
  cpu_torch    (torch) fp32 CPU tensors, 16 x 64 @ 64 x 64: torch.matmul
               against dispatcher.torch.gemm, nn.Linear against
               dispatcher.torch.Linear, forward (no grad) and forward+backward:
               the torch ops' host work, on a machine without a GPU
  cpu_coexist  fp32 1024^3 and 2048^3: numpy and dispatcher.gemm each alone
               and alternating call by call, as user code mixes them, in
               rounds in one process per setting (numpy imported first; the
               short spin set before numpy; OpenBLAS's own spin); ratio
               alternating / alone per library
  gpu_call     (a CUDA GPU and torch): bf16 256^3 torch.matmul against
               dispatcher.gemm, a held plan, dispatcher.gemm into an out
               (with and without an explicit target) and dispatcher.torch.gemm;
               dispatcher.torch.Linear against nn.Linear, forward and
               forward+backward; batched dispatcher.matmul against torch.bmm;
               GEMM + bias + GELU (fused) against torch.addmm + gelu; an
               unaligned GEMM against torch.matmul

    python benchmarks/call_overhead.py --only cpu_call,cpu_torch,cpu_coexist
    python3 benchmarks/call_overhead.py --only gpu_call --out $OUT/call_overhead
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, environment, pyplot  # noqa: E402

import dispatcher  # noqa: E402


def per_call(fn, calls: int, repeat: int, sync=lambda: None) -> float:
    """Median over `repeat` rounds of (a loop of `calls` calls, then sync) / calls, in us."""
    return per_call_and_host(fn, calls, repeat, sync)[0]


def per_call_and_host(fn, calls: int, repeat: int, sync=lambda: None) -> tuple:
    """(per call, host per call) in us, medians over `repeat` rounds: the
    loop of `calls` calls then sync, and the loop alone (what issuing the
    calls costs the CPU while the GPU queue takes them)."""
    fn()
    sync()
    rounds, host = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        sync()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        host.append((issued - start) / calls * 1e6)
    return float(np.median(rounds)), float(np.median(host))


def gpu_per_call(fn, calls: int, repeat: int):
    """GPU time per call in us: `calls` calls captured in one CUDA graph,
    replayed between CUDA events (no host work), median of `repeat`
    replays; None where the call cannot be captured."""
    import torch
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm on the capture stream (selection, workspaces)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception:  # noqa: BLE001 - a call that cannot be captured reports no GPU time
        torch.cuda.synchronize()
        return None
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3 / calls)
    return float(np.median(times))


def cpu_call(args) -> dict:
    from dispatcher import numpy_calls
    numpy_calls.extension(wait=True)  # plain calls in C: built (or found) before the timing
    rng = np.random.default_rng(0)
    a, b = rng.random((16, 16), np.float32), rng.random((16, 16), np.float32)
    held = dispatcher.plan("regular", a=a, b=b)
    out = np.empty((16, 16), np.float32)
    experts = rng.random((4, 16, 16), np.float32)
    offsets = np.array([4, 8, 12, 16], np.int32)
    fns = {"numpy": lambda: a @ b, "dispatcher.gemm": lambda: dispatcher.gemm(a, b),
           "dispatcher.matmul": lambda: dispatcher.matmul(a, b), "held plan": lambda: held(a, b),
           "dispatcher.gemm into out": lambda: dispatcher.gemm(a, b, out=out),
           "dispatcher.gemm out target": lambda: dispatcher.gemm(a, b, out=out, target="cpu"),
           "dispatcher.grouped_mm (4 experts)": lambda: dispatcher.grouped_mm(a, experts, offsets)}
    us = {name: per_call(fn, args.calls, args.repeat) for name, fn in fns.items()}
    native = numpy_calls.failure() or "on"
    print("cpu 16^3 fp32, us per call: " + ", ".join(f"{k} {v:.1f}" for k, v in us.items())
          + f"; plain calls in C: {native}")
    return {"shape": [16, 16, 16], "native_numpy_calls": native, "us_per_call": us,
            "ratio_to_numpy": {k: v / us["numpy"] for k, v in us.items()}}


def cpu_torch(args) -> dict:
    import torch
    import dispatcher.torch as dt
    from dispatcher.torch import native
    native.extension(wait=True)  # Linear's native calls: built (or found) before the timing
    torch.manual_seed(0)
    x = torch.randn(16, 64)
    reference = torch.nn.Linear(64, 64)
    ours = dt.Linear.from_linear(reference)
    w = reference.weight.detach()
    leaf = x.clone().requires_grad_()

    def no_grad(fn):
        def call():
            with torch.no_grad():
                fn()
        return call
    pairs = {"gemm": (lambda: torch.matmul(x, w.t()), lambda: dt.gemm(x, w.t())),
             "Linear forward": (no_grad(lambda: reference(x)), no_grad(lambda: ours(x))),
             "Linear forward+backward": (lambda: reference(leaf).sum().backward(),
                                         lambda: ours(leaf).sum().backward())}
    rows = {}
    for name, (baseline, fn) in pairs.items():
        # rounds alternate the two, so a slow phase of the host falls on both
        times = [(per_call(baseline, args.calls, 1), per_call(fn, args.calls, 1)) for _ in range(args.repeat)]
        base, mine = (float(np.median([t[i] for t in times])) for i in (0, 1))
        rows[name] = {"torch_us": base, "ours_us": mine, "ratio": mine / base}
    print("cpu torch fp32 16x64x64, us per call (torch / ours): " +
          ", ".join(f"{k} {v['torch_us']:.1f} / {v['ours_us']:.1f}" for k, v in rows.items()) +
          f"; Linear's native calls: {native.failure() or 'on'}")
    return {"shape": [16, 64, 64], "rows": rows, "native_linear": native.failure() or "on"}


def _one_process(n: int, calls: int, repeat: int) -> dict:
    """Seconds per call of numpy and dispatcher.gemm at n^3 in this process:
    each alone, then alternating call by call, in rounds (alone numpy,
    alone dispatcher, alternating), each block after a quiet 0.25 s so it
    starts with the other library's threads asleep. Medians over the
    rounds: the host's slow and fast phases fall on all three alike."""
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), np.float32), rng.random((n, n), np.float32)
    fns = {"numpy": lambda: a @ b, "dispatcher": lambda: dispatcher.gemm(a, b)}
    for fn in fns.values():
        fn()
    alone, alternating = {k: [] for k in fns}, {k: [] for k in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            time.sleep(0.25)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            alone[name].append((time.perf_counter() - start) / calls)
        time.sleep(0.25)
        for _ in range(calls):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                alternating[name].append(time.perf_counter() - start)
    return {"alone": {k: float(np.median(v)) for k, v in alone.items()},
            "alternating": {k: float(np.median(v)) for k, v in alternating.items()}}


# OpenBLAS's workers spin (sched_yield) for 2^OPENBLAS_THREAD_TIMEOUT cycles
# after a call (2^28 by default, about 0.1 s), on the cores our next kernel
# wants; the variable, read when OpenBLAS loads, shortens that (4..30). This
# script imports numpy first, as much user code does: its first row is what
# `import dispatcher` then does by itself (it sets OpenBLAS's spin to 2^4
# cycles: dispatcher.blas_threads), the second the variable set before
# numpy loads, the third OpenBLAS's own spin (a user's value is kept).
OPENBLAS_SETTINGS = {"numpy imported first": {}, "OPENBLAS_THREAD_TIMEOUT=4": {"OPENBLAS_THREAD_TIMEOUT": "4"},
                     "OpenBLAS's spin (OPENBLAS_THREAD_TIMEOUT=28)": {"OPENBLAS_THREAD_TIMEOUT": "28"}}


def cpu_coexist(args) -> dict:
    rows = []
    for setting, variables in OPENBLAS_SETTINGS.items():
        for n in (1024, 2048):
            rows.append(_coexisting(n, setting, {**os.environ, **variables}, args.repeat))
    return {"rows": rows, "environment_threads": {k: os.environ.get(k) for k in
                                                  ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}}


def _coexisting(n: int, setting: str, environment: dict, repeat: int) -> dict:
    """numpy and dispatcher.gemm at n^3 in one process started with
    `environment`: each alone and alternating call by call (`_one_process`)."""
    calls = 5 if n == 1024 else 2
    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import call_overhead as c; print(json.dumps(c._one_process({n}, {calls}, {repeat})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=environment)
    if done.returncode:
        raise SystemExit(done.stderr)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    flops = 2.0 * n ** 3
    row = {"n": n, "openblas": setting,
           "alone_gflops": {k: flops / v / 1e9 for k, v in found["alone"].items()},
           "alternating_gflops": {k: flops / v / 1e9 for k, v in found["alternating"].items()}}
    row["alternating_over_alone"] = {k: row["alternating_gflops"][k] / row["alone_gflops"][k]
                                     for k in ("numpy", "dispatcher")}
    row["dispatcher_over_numpy_alone"] = row["alone_gflops"]["dispatcher"] / row["alone_gflops"]["numpy"]
    print(f"cpu fp32 {n}^3 ({setting}): alone numpy {row['alone_gflops']['numpy']:.0f} / dispatcher "
          f"{row['alone_gflops']['dispatcher']:.0f} GFLOP/s; alternating keeps "
          f"{row['alternating_over_alone']['numpy']:.2f} / {row['alternating_over_alone']['dispatcher']:.2f}")
    return row


def gpu_call(args) -> dict:
    import torch
    import torch.nn.functional as F

    import dispatcher.torch as dt
    from dispatcher.torch import native

    native.extension(wait=True)  # Linear's native calls: built (or found) before the timing
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    out = {"native_linear": native.failure() or "on"}

    def compare(name, ours: dict, theirs, calls=args.calls, capture=True):
        """Per call (the figure), and beside it host time per call and GPU
        time per call (CUDA-graphed, where `capture`): the larger of the
        two is what limits a loop of back-to-back calls."""
        row = {}
        for label, fn in (("baseline", theirs), *ours.items()):
            row[label + "_us"], row[label + "_host_us"] = per_call_and_host(fn, calls, args.repeat, sync)
            row[label + "_gpu_us"] = gpu_per_call(fn, min(calls, 50), args.repeat) if capture else None
        base = row["baseline_us"]
        for label in ours:
            row[label + "_ratio"] = row[label + "_us"] / base
        out[name] = row

        def detail(label):
            gpu = row[label + "_gpu_us"]
            return f"host {row[label + '_host_us']:.1f}" + (f", gpu {gpu:.1f}" if gpu is not None else "")
        print(f"{name}: baseline {base:.1f} us ({detail('baseline')}); " +
              ", ".join(f"{k} {row[k + '_us']:.1f} us ({row[k + '_ratio']:.2f}x; {detail(k)})" for k in ours))

    a = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    b = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    held = dispatcher.plan("regular", a=a, b=b)
    into = torch.empty_like(a)
    compare("gemm 256^3 bf16", {"dispatcher.gemm": lambda: dispatcher.gemm(a, b), "held plan": lambda: held(a, b),
                                 "dispatcher.gemm into out": lambda: dispatcher.gemm(a, b, out=into),
                                 "dispatcher.gemm out target": lambda: dispatcher.gemm(a, b, out=into, target="cuda"),
                                 "dispatcher.torch.gemm": lambda: dt.gemm(a, b)}, lambda: torch.matmul(a, b))
    x = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    ref = torch.nn.Linear(256, 256, device=dev, dtype=torch.bfloat16)
    ours = dt.Linear.from_linear(ref)
    compare("Linear forward 256", {"dispatcher.torch.Linear": lambda: ours(x)}, lambda: ref(x))
    xg = x.clone().requires_grad_(True)
    compare("Linear forward+backward 256", {"dispatcher.torch.Linear": lambda: ours(xg).sum().backward()},
            lambda: ref(xg).sum().backward(), calls=max(args.calls // 4, 10), capture=False)
    for bsz, m, n, k in ((48, 384, 640, 128), (16, 1024, 1024, 512), (4, 2048, 3072, 1024)):
        p = torch.randn(bsz, m, k, device=dev, dtype=torch.bfloat16)
        q = torch.randn(bsz, k, n, device=dev, dtype=torch.bfloat16)
        compare(f"batched {bsz}x{m}x{n}x{k}", {"dispatcher.matmul": lambda: dispatcher.matmul(p, q)},
                lambda: torch.bmm(p, q), calls=max(args.calls // 4, 10))
    for m, n, k in ((256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096)):
        p = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        q = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
        compare(f"bias+gelu {m}x{n}x{k}",
                {"fused dispatcher.matmul": lambda: dispatcher.matmul(p, q, bias=bias, activation="gelu")},
                lambda: F.gelu(torch.addmm(bias, p, q)), calls=max(args.calls // 4, 10))
    m, n, k = 511, 2049, 3071
    p = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    q = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    compare("unaligned 511x2049x3071", {"dispatcher.gemm": lambda: dispatcher.gemm(p, q)},
            lambda: torch.matmul(p, q), calls=max(args.calls // 4, 10))
    out["torch"] = torch.__version__
    out["gpu"] = torch.cuda.get_device_name()
    return out


PARTS = {"cpu_call": cpu_call, "cpu_torch": cpu_torch, "cpu_coexist": cpu_coexist, "gpu_call": gpu_call}


def plot(results: dict, path: Path):
    plt = pyplot(path)
    if plt is None:
        return
    bars = []
    if "cpu_call" in results:
        bars += [(f"cpu 16^3 {k}", v) for k, v in results["cpu_call"]["ratio_to_numpy"].items() if k != "numpy"]
    bars += [(f"cpu torch {k}", v["ratio"]) for k, v in results.get("cpu_torch", {}).get("rows", {}).items()]
    for row in results.get("cpu_coexist", {}).get("rows", []):
        bars += [(f"cpu {row['n']}^3 {k} alternating/alone ({row.get('openblas', 'OpenBLAS default')})", v)
                 for k, v in row["alternating_over_alone"].items()]
    for name, row in results.get("gpu_call", {}).items():
        if isinstance(row, dict):
            bars += [(f"{name} {k[:-6]}", v) for k, v in row.items() if k.endswith("_ratio")]
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(bars) + 1))
    ax.barh([b[0] for b in bars], [b[1] for b in bars])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("time per call / baseline's (cpu_coexist: speed alternating / alone)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="cpu_call,cpu_coexist", help="parts: " + ",".join(PARTS))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS / "call_overhead"))
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; parts: {', '.join(PARTS)}")
    results = {"environment": environment()}
    with open("/proc/loadavg") as f:
        results["environment"]["loadavg_before"] = f.read().split()[:3]
    for part in args.only.split(","):
        results[part] = PARTS[part](args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plot(results, out.with_suffix(".png"))
    print("wrote", out.with_suffix(".json"))


if __name__ == "__main__":
    main()
