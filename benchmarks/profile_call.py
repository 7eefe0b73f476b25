"""Where a call's host time goes, on 256^3 bf16 CUDA tensors. First the
steps timed apart (a loop of calls, then one synchronize; median of 7 rounds):
torch's allocation of the result, a held plan's C++ launch called directly
and through the plan's Python `__call__`, `dispatcher.gemm`, `torch.matmul`.
Then a cProfile of the per-call path: `dispatcher.gemm`,
`dispatcher.gemm` with an out and a target, a held `dispatcher.plan`,
`dispatcher.torch.gemm`, a `dispatcher.torch.Linear` forward and its
forward+backward, `dispatcher.matmul` with a bias and GELU at 256^3 and
1024^3, 2000 calls each after a warm-up (see call_overhead.py for the
timings themselves)."""

import cProfile
import pstats
import statistics
import time

import torch

import dispatcher
import dispatcher.torch as dt
from dispatcher.torch import native

native.extension(wait=True)  # the C++ launches: built (or found) before the timing

a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
held = dispatcher.plan("regular", a=a, b=b)
out = torch.empty_like(a)
for _ in range(3):
    held(a, b)  # binds the kernel and makes its native launch


def per_call(fn, calls=2000, rounds=7):
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


print("==== steps, us per call")
steps = {"torch.empty": lambda: torch.empty(256, 256, device="cuda", dtype=torch.bfloat16),
         "torch.matmul": lambda: torch.matmul(a, b)}
if held.native:
    steps["held plan's C++ launch, direct"] = lambda: held.native(a, b)
steps.update({"held plan": lambda: held(a, b), "dispatcher.gemm": lambda: dispatcher.gemm(a, b)})
for name, fn in steps.items():
    fn()
    print(f"{name}: {per_call(fn):.2f}")

linear = dt.Linear(256, 256, device="cuda", dtype=torch.bfloat16)
x = a.clone().requires_grad_(True)
epilogue_operands = [(n, torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
                      torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
                      torch.randn(n, device="cuda", dtype=torch.bfloat16)) for n in (256, 1024)]
for name, fn in (("dispatcher.gemm", lambda: dispatcher.gemm(a, b)),
                 ("dispatcher.gemm out target", lambda: dispatcher.gemm(a, b, out=out, target="cuda")),
                 ("held plan", lambda: held(a, b)),
                 ("dispatcher.torch.gemm", lambda: dt.gemm(a, b)), ("dispatcher.torch.Linear", lambda: linear(a)),
                 ("dispatcher.torch.Linear forward+backward", lambda: linear(x).sum().backward()),
                 *((f"dispatcher.matmul bias+gelu {n}^3", lambda p=p, q=q, bias=bias: dispatcher.matmul(
                     p, q, bias=bias, activation="gelu")) for n, p, q, bias in epilogue_operands)):
    fn()  # build, load and select outside the profile
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.runcall(lambda: [fn() for _ in range(2000)])
    torch.cuda.synchronize()
    print(f"==== {name}")
    pstats.Stats(profile).sort_stats("tottime").print_stats(16)
    pstats.Stats(profile).sort_stats("cumtime").print_stats(12)
