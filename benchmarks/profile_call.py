"""cProfile of the per-call path on 256^3 bf16 CUDA tensors: `dispatcher.gemm`,
`dispatcher.gemm` with an out and a target, a held `dispatcher.plan`,
`dispatcher.torch.gemm`, a `dispatcher.torch.Linear` forward and its
forward+backward, 2000 calls each after a warm-up (see call_overhead.py for the
timings themselves)."""

import cProfile
import pstats

import torch

import dispatcher
import dispatcher.torch as dt

a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
held = dispatcher.plan("regular", a=a, b=b)
out = torch.empty_like(a)
linear = dt.Linear(256, 256, device="cuda", dtype=torch.bfloat16)
x = a.clone().requires_grad_(True)
for name, fn in (("dispatcher.gemm", lambda: dispatcher.gemm(a, b)),
                 ("dispatcher.gemm out target", lambda: dispatcher.gemm(a, b, out=out, target="cuda")),
                 ("held plan", lambda: held(a, b)),
                 ("dispatcher.torch.gemm", lambda: dt.gemm(a, b)), ("dispatcher.torch.Linear", lambda: linear(a)),
                 ("dispatcher.torch.Linear forward+backward", lambda: linear(x).sum().backward())):
    fn()  # build, load and select outside the profile
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.runcall(lambda: [fn() for _ in range(2000)])
    torch.cuda.synchronize()
    print(f"==== {name}")
    pstats.Stats(profile).sort_stats("tottime").print_stats(16)
    pstats.Stats(profile).sort_stats("cumtime").print_stats(12)
