"""Hooks of the `residual` variant: out = alpha * a @ b + gamma * residual,
the residual add of a transformer block fused into the GEMM's epilogue.

Its problem kind is declared, not coded: operands a, b and out with numpy
matmul batch dims, one extra operand `residual` (a matrix the size of out,
broadcast like numpy), one scalar parameter `gamma`. The core checks the
call and hands the kernel the residual as `args->extra[0]` and gamma as
`args->params[0]`:

    dispatcher.run("residual", a=a, b=b, residual=r, gamma=0.5)
"""

from pathlib import Path

import numpy as np

from dispatcher.plugin_api import (WORKERS, Operand, Param, VariantRecord, gemm_operands, launches_gemm,
                                   registers, renders)

VARIANT = "residual"

RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="residual",
    targets=("cpu",),
    dtypes=("fp32", "fp16", "bf16"),
    layouts=("rcr", "rrr", "crr", "ccr"),
    name_suffix=lambda opts: "_residual",
    default_configs=lambda target, dtype, layout: [dict(tile_m=48, tile_n=64, tile_k=256)],
    operands=(*gemm_operands(batched=True),
              Operand("residual", ("m", "n"), batched=True, dtype="out",
                      doc="added after the product, scaled by gamma (the size of out)")),
    params=(Param("gamma", 1.0, "scale of the residual"),),
    launch_options=(WORKERS,),  # options={"workers": n}: the template's thread_count reads it
    # What `gemm-dispatcher run --variant residual --verify` checks against (float64 operands).
    reference=lambda ops, params: (params["alpha"] * np.matmul(ops["a"], ops["b"])
                                   + params["gamma"] * ops["residual"]),
    description="GEMM + scaled residual add (an example plugin)",
)

dispatcher_register_variants = registers(RECORD)
dispatcher_codegen = renders(VARIANT, Path(__file__).parent)
dispatcher_launch = launches_gemm(VARIANT)
