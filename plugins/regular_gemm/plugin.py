"""Hooks of the `regular` variant.

Its libraries export a kernel registry table; launch looks the selected
kernel up by name in that table and calls it (the registry path the
stream-K and grouped variants bypass).
"""

from __future__ import annotations

from pathlib import Path

from dispatcher import dtypes, targets
from dispatcher.plugin_api import (BIAS, EPILOGUE_OPTIONS, WORKERS, VariantRecord,
                                   epilogue_problem_options, epilogue_suffix, gemm_operands,
                                   launches_gemm, registers, renders)

VARIANT = "regular"
HERE = Path(__file__).parent

# Block tiles the selection heuristic chooses from when the tuning database
# has no answer: large ones for throughput on few cores, shorter and
# narrower ones so that many cores and small problems get balanced waves
# (measured on a 2-core and a 16-core machine: benchmarks/cpu_gemm.py).
# The micro-tile is the target's (its ISA's default); these tiles are
# multiples of every ISA's.
CPU_DEFAULTS = (
    dict(tile_m=120, tile_n=512, tile_k=256),
    dict(tile_m=96, tile_n=256, tile_k=256),
    dict(tile_m=48, tile_n=512, tile_k=256),
    dict(tile_m=96, tile_n=128, tile_k=256),
)


# CUTLASS SM90 tiles: the large cooperative tile for throughput, a smaller
# one for problems with few tiles (tile_k spans 128 bytes of A).
CUDA_DEFAULTS = (
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, schedule="cooperative"),
    dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, schedule="cooperative"),
)


def default_configs(target, dtype, layout):
    if target == "cuda":
        return [dict(d, tile_k=targets.get(target).default_tile_k(dtype)) for d in CUDA_DEFAULTS]
    return list(CPU_DEFAULTS) if target == "cpu" else []


RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="gemm",
    targets=("cpu", "cuda"),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    options=EPILOGUE_OPTIONS,
    launch_options=(WORKERS,),
    name_suffix=epilogue_suffix,
    default_configs=default_configs,
    operands=(*gemm_operands(), BIAS),
    problem_options=epilogue_problem_options,
    description="data-parallel GEMM: one output block tile per work item; fused bias and activation",
)

dispatcher_register_variants = registers(RECORD)
dispatcher_codegen = renders(VARIANT, HERE)
dispatcher_launch = launches_gemm(VARIANT, registry=True)
