"""Where a call's host time goes, on 256^3 bf16 CUDA tensors. First the
steps timed apart (a loop of calls, then one synchronize; median of 7 rounds):
torch's allocation of the result, a held plan's C++ launch called directly
and through the plan's Python `__call__`, `dispatcher.gemm`, `torch.matmul`.
Then a cProfile of the per-call path: `dispatcher.gemm`,
`dispatcher.gemm` with an out and a target, a held `dispatcher.plan`,
`dispatcher.torch.gemm`, a `dispatcher.torch.Linear` forward and its
forward+backward, `dispatcher.matmul` with a bias and GELU at 256^3 and
1024^3, 2000 calls each after a warm-up (see call_overhead.py for the
timings themselves). Last, which of the Linear's GEMMs run in C++ after
its forward+backward calls (one without a native launch goes through the
operator, in Python) and why not where one does not."""

import cProfile
import pstats

import torch

import dispatcher
import dispatcher.torch as dt
from call_overhead import per_call
from dispatcher.torch import eager, native

native.extension(wait=True)  # the C++ launches: built (or found) before the timing

a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
held = dispatcher.plan("regular", a=a, b=b)
out = torch.empty_like(a)
for _ in range(3):
    held(a, b)  # binds the kernel and makes its native launch

print("==== steps, us per call")
steps = {"torch.empty": lambda: torch.empty(256, 256, device="cuda", dtype=torch.bfloat16),
         "torch.matmul": lambda: torch.matmul(a, b)}
if held.native:
    steps["held plan's C++ launch, direct"] = lambda: held.native(a, b)
steps.update({"held plan": lambda: held(a, b), "dispatcher.gemm": lambda: dispatcher.gemm(a, b)})
for name, fn in steps.items():
    fn()
    print(f"{name}: {per_call(fn, 2000, 7, torch.cuda.synchronize):.2f}")

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

# Which of the Linear's calls run in C++ after those forward+backward steps:
# a backward GEMM without a native launch goes through the operator (Python).
print("==== dispatcher.torch.Linear native plans")
plans = linear.__dict__.get("_native")
print("planned (1 forward, 2 dX, 4 dW):", plans and plans.plans.planned(x, linear.weight, linear.bias))
dy = torch.empty((256, 256), device="cuda", dtype=torch.bfloat16)
for name, key in (("forward", eager.linear_key(x, linear.weight.t(), linear.bias, linear.variant, linear.autotune)),
                  ("dX", eager.gemm_key(dy, linear.weight, linear.variant, 1.0, None, linear.autotune)),
                  ("dW", eager.gemm_key(dy.t(), x, linear.variant, 1.0, None, linear.autotune))):
    held_plan = eager.held_plan(key)
    runner = held_plan and held_plan.order and held_plan.plan.runner(held_plan.order, held_plan.scalars)
    launch = runner and held_plan.plan.native_launch(held_plan.order, held_plan.scalars)
    print(f"{name}: held plan {held_plan}, order {held_plan and held_plan.order}, runner {runner is not None}, "
          f"native launch {bool(launch)}")
print("held plans of the eager calls:", *eager._HELD, sep="\n  ")
