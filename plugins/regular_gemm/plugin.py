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
# database can still choose it. The two large tiles come in the hybrid
# decomposition too: on mid-size squares their last wave leaves most SMs
# idle (5120^3: 6.06 waves), where the stream-K variant's 128x256 hybrid ran
# 0.96x cuBLAS against the data-parallel catalog's best 0.88x (H100). The
# model does not tell the two apart; on its tie the name puts data-parallel
# first, and the tuning database picks hybrid where it measured faster.
def _coop(m, n, cm, cn, **extra):
    return dict(tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn, schedule="cooperative", **extra)


def _pingpong(m, n, cm, cn):
    return dict(tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn, schedule="pingpong")


CUDA_CATALOG = (
    _coop(128, 256, 2, 1), _coop(256, 128, 1, 2), _coop(128, 128, 2, 1), _coop(128, 128, 1, 2),
    _coop(128, 128, 2, 4), _coop(256, 128, 2, 4), _coop(128, 256, 2, 1, swizzle=4),
    _coop(256, 128, 1, 2, swizzle=4), _pingpong(64, 128, 1, 4), _pingpong(64, 128, 2, 1),
    _pingpong(64, 256, 1, 2), _pingpong(64, 128, 2, 4),
    _coop(128, 256, 2, 1, decomposition="hybrid"), _coop(256, 128, 1, 2, decomposition="hybrid"),
    # M or N up to 4 (rcr): a block's warps stream a few rows of the big operand, splitting K
    dict(tile_m=4, tile_n=4, cluster_m=1, cluster_n=1, schedule="gemv"),
)

# How output tiles become work (the cuda template's dcuda::Decomposition):
# K slices summed per output tile (split-K), or the hybrid decomposition:
# CUTLASS's heuristic, which keeps a problem data-parallel where its last
# wave of tiles is at least half full (or a tile has 8 K tiles or fewer) and
# otherwise shares the last full and the partial wave out stream-K (every
# tile, with two waves or fewer). Both run on CUTLASS's stream-K scheduler
# with a fixed-order fix-up; the `stream_k` variant offers its other modes
# and reductions.
SPLITS = Option("splits", 1, "K slices per output tile (cuda split-K; 1: no split)", low=1, high=16)
DECOMPOSITION = Option("decomposition", "data_parallel",
                       "data_parallel (persistent, a whole tile per work item) or hybrid (cuda: CUTLASS's "
                       "heuristic, the last waves stream-K where the last one is less than half full)",
                       choices=("data_parallel", "hybrid"))


def name_suffix(opts: dict) -> str:
    split = f"_splitk{opts['splits']}" if opts["splits"] > 1 else ""
    return epilogue_suffix(opts) + split + ("_hybrid" if opts["decomposition"] == "hybrid" else "")


def check(config):
    opts = config.variant_params
    if opts["splits"] > 1 or opts["decomposition"] == "hybrid":
        what = "split-K" if opts["splits"] > 1 else "the hybrid decomposition"
        if config.target != "cuda":
            return f"{what} is a cuda schedule; on the CPU the stream_k variant splits K"
        if config.target_params["schedule"] != "cooperative":
            return f"{what} runs on CUTLASS's stream-K scheduler, with the cooperative schedule only"
        if opts["splits"] > 1 and opts["decomposition"] == "hybrid":
            return "splits > 1 is split-K; it takes decomposition=data_parallel (not hybrid)"
    return None


def template_values(config, target):
    return {"hybrid": "true" if config.variant_params["decomposition"] == "hybrid" else "false"}


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
    options=(*EPILOGUE_OPTIONS, SPLITS, DECOMPOSITION),
    launch_options=(WORKERS,),
    name_suffix=name_suffix,
    check=check,
    k_splits=lambda config: config.variant_params["splits"],
    shares_last_wave=lambda config: config.variant_params["decomposition"] == "hybrid",
    # a hybrid tile's stream-K pieces: at most one per worker, as the stream_k variant's
    partial_sums=lambda config: (targets.get(config.target).parallelism(config)
                                 if config.variant_params["decomposition"] == "hybrid"
                                 else config.variant_params["splits"]),
    packs_a_once=True,  # templates/cpu.cpp: dcpu::SharedPackedA
    target_schedules=("gemv",),  # templates/cuda.cu: the cuda target's kernel for M or N up to 4
    default_configs=default_configs,
    operands=(*gemm_operands(), BIAS),
    problem_options=epilogue_problem_options,
    description="data-parallel GEMM: one output block tile per work item (cuda: or split-K, or hybrid "
                "stream-K); fused bias and activation",
)

dispatcher_register_variants = registers(RECORD)
dispatcher_codegen = renders(VARIANT, HERE, template_values)
dispatcher_launch = launches_gemm(VARIANT, registry=True)
