"""Hooks of the `regular` variant.

Its libraries export a kernel registry table; launch looks the selected
kernel up by name in that table and calls it (the registry path the
stream-K and grouped variants bypass).
"""

from __future__ import annotations

from pathlib import Path

from dispatcher import dtypes, targets
from dispatcher.plugin_api import (BIAS, EPILOGUE_OPTIONS, WORKERS, Option, VariantRecord,
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
    dict(tile_m=64, tile_n=192, tile_k=256),
)


# The sm_90a catalog: the CTA tiles and clusters NVIDIA's model proposes
# most often for bf16/fp16 on an H200 (large cooperative tiles for
# throughput, 2x4 clusters for mid-size squares, ping-pong 64-row tiles for
# skinny M), plus swizzled large tiles, and the target's gemv kernel for M
# or N up to 4 (its own bandwidth estimate, `cuda.gemv_estimate_us`, ranks
# it: NVIDIA's model does not know it). Selection ranks it with that model.
# Split-K (`splits`) is not in it: the model ranked split-K first on 8 of 64
# measured shapes, where it ran 1.1-2.3x slower than the best catalog kernel,
# while leaving it out costs the best-of-catalog time 0.15% (geomean;
# benchmarks/results/cuda_gemm.json's catalog times). Sweeps and the tuning
# database can still choose it.
def _coop(m, n, cm, cn, **extra):
    return dict(tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn, schedule="cooperative", **extra)


def _pingpong(m, n, cm, cn):
    return dict(tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn, schedule="pingpong")


CUDA_CATALOG = (
    _coop(128, 256, 2, 1), _coop(256, 128, 1, 2), _coop(128, 128, 2, 1), _coop(128, 128, 1, 2),
    _coop(128, 128, 2, 4), _coop(256, 128, 2, 4), _coop(128, 256, 2, 1, swizzle=4),
    _coop(256, 128, 1, 2, swizzle=4), _pingpong(64, 128, 1, 4), _pingpong(64, 128, 2, 1),
    _pingpong(64, 256, 1, 2), _pingpong(64, 128, 2, 4),
    # M or N up to 4 (rcr): a block's warps stream a few rows of the big operand, splitting K
    dict(tile_m=4, tile_n=4, cluster_m=1, cluster_n=1, schedule="gemv"),
)

# K slices summed per output tile (split-K: the cuda template's dcuda::SplitK).
SPLITS = Option("splits", 1, "K slices per output tile (cuda split-K; 1: one block tile per work item)",
                low=1, high=16)


def name_suffix(opts: dict) -> str:
    return epilogue_suffix(opts) + (f"_splitk{opts['splits']}" if opts["splits"] > 1 else "")


def check(config):
    if config.variant_params["splits"] > 1:
        if config.target != "cuda":
            return "split-K is a cuda schedule; on the CPU the stream_k variant splits K"
        if config.target_params["schedule"] != "cooperative":
            return "split-K runs on CUTLASS's stream-K scheduler, with the cooperative schedule only"
    return None


def default_configs(target, dtype, layout):
    if target == "cuda":
        return targets.get(target).catalog(CUDA_CATALOG, dtype)
    return list(CPU_DEFAULTS) if target == "cpu" else []


RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="gemm",
    targets=("cpu", "cuda"),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    options=(*EPILOGUE_OPTIONS, SPLITS),
    launch_options=(WORKERS,),
    name_suffix=name_suffix,
    check=check,
    k_splits=lambda config: config.variant_params["splits"],
    packs_a_once=True,  # templates/cpu.cpp: dcpu::SharedPackedA
    target_schedules=("gemv",),  # templates/cuda.cu: the cuda target's kernel for M or N up to 4
    default_configs=default_configs,
    operands=(*gemm_operands(), BIAS),
    problem_options=epilogue_problem_options,
    description="data-parallel GEMM: one output block tile per work item (cuda: or split-K); fused bias "
                "and activation",
)

dispatcher_register_variants = registers(RECORD)
dispatcher_codegen = renders(VARIANT, HERE)
dispatcher_launch = launches_gemm(VARIANT, registry=True)
