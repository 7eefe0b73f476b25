"""Hooks of the `swiglu` variant: out = silu(alpha x @ w1) * (alpha x @ w3) + beta c,
the gated MLP of a transformer block (SwiGLU) as one kernel: both products
of a tile are accumulated side by side and combined in the epilogue.

Its problem kind names its operands as users call them: `x` (M, K) in the
role of a, `w1` (K, N) in the role of b, and `w3` (K, N), an extra operand
with a K dim, handed to the kernel as `args->extra[0]` (either layout; the
kernel reads it as a second B). Such a kind is never run transposed: a
column-major `out` is computed through a row-major temporary by the core.

    dispatcher.run("swiglu", x=x, w1=w1, w3=w3)"""

from pathlib import Path

import numpy as np

from dispatcher.plugin_api import (WORKERS, Operand, VariantRecord, gemm_operands, launches_gemm, registers,
                                   renders)


def reference(ops, params):
    h1, h3 = (params["alpha"] * (ops["x"] @ ops[w]) for w in ("w1", "w3"))
    return h1 / (1.0 + np.exp(-h1)) * h3


RECORD = VariantRecord(
    name="swiglu",
    problem_kind="swiglu",
    targets=("cpu",),
    dtypes=("fp32", "bf16"),
    layouts=("rcr", "rrr", "crr", "ccr"),  # x and w1; w3 any layout, out any layout
    name_suffix=lambda opts: "_swiglu",
    default_configs=lambda target, dtype, layout: [dict(tile_m=48, tile_n=64, tile_k=256)],
    # x in the role of a, w1 of b (plus the optional c that beta scales, and out).
    operands=(*gemm_operands(a="x", b="w1"), Operand("w3", ("k", "n"), doc="up projection")),
    launch_options=(WORKERS,),
    reference=reference,
    description="fused SwiGLU: silu(x @ w1) * (x @ w3) (an example plugin)",
)

dispatcher_register_variants = registers(RECORD)
dispatcher_codegen = renders("swiglu", Path(__file__).parent)
dispatcher_launch = launches_gemm("swiglu")
