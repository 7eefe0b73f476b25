"""cProfile of 2000 `dispatcher.gemm` calls on 256^3 bf16 CUDA tensors: where
the per-call time of the Python API goes (see the overhead part of cuda_gemm.py)."""

import cProfile
import pstats

import torch

import dispatcher

a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
dispatcher.gemm(a, b, target="cuda")  # build, load and select outside the profile
torch.cuda.synchronize()
profile = cProfile.Profile()
profile.runcall(lambda: [dispatcher.gemm(a, b, target="cuda") for _ in range(2000)])
pstats.Stats(profile).sort_stats("tottime").print_stats(22)
pstats.Stats(profile).sort_stats("cumtime").print_stats(30)
