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
# skinny M), plus swizzled large tiles, small tiles for problems of few
# tiles, split-K for few tiles of a long K, and the target's gemv kernel for
# M or N up to 4 (its own bandwidth estimate, `cuda.gemv_estimate_us`, ranks
# it: NVIDIA's model does not know it). The tuning database's times choose
# among them; where it has none, the model ranks them.
#
# Small tiles: 64 x 4096 x 4096 has 32 tiles of 64x128 for 132 SMs; 64x64
# ping-pong tiles ran it at 0.96x cuBLAS against 0.84x, 1024^3 on 128x64
# cooperative tiles at 0.91x against 0.84x (H100, splitk_probe_h100_*.json).
# Split-K is the tree reduction's (`reduction=tree`: partials summed by a
# kernel of its own, on ping-pong tiles): 8 x 2048 x 8192 ran 0.92x cuBLAS on
# 64x64 tiles in 4 slices, against 0.66x for 64x128 ping-pong, 0.73x for the
# best data-parallel kernel (64x64) and 0.67x for CUTLASS's own split-K (its
# fix-up adds the slices in turn). NVIDIA's model once ranked CUTLASS's
# split-K first where it ran 1.1-2.3x slower; the tuning database's times
# decide near its grid (M 16..8192, N and K 512..8192, each within 2x).
# The large tiles come in the hybrid decomposition too: on mid-size squares
# their last wave leaves most SMs idle (5120^3: 6.06 waves), where the
# stream-K variant's 128x256 hybrid ran 0.96x cuBLAS against the
# data-parallel catalog's best 0.88x (H100). The model does not tell the two
# apart; on its tie the name puts data-parallel first, and the tuning
# database picks hybrid where it measured faster.
def _coop(m, n, cm, cn, **extra):
    return dict(tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn, schedule="cooperative", **extra)


def _pingpong(m, n, cm, cn, **extra):
    return dict(tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn, schedule="pingpong", **extra)


CUDA_CATALOG = (
    _coop(128, 256, 2, 1), _coop(256, 128, 1, 2), _coop(128, 128, 2, 1), _coop(128, 128, 1, 2),
    _coop(128, 128, 2, 4), _coop(256, 128, 2, 4), _coop(128, 256, 2, 1, swizzle=4),
    _coop(256, 128, 1, 2, swizzle=4), _pingpong(64, 128, 1, 4), _pingpong(64, 128, 2, 1),
    _pingpong(64, 256, 1, 2), _pingpong(64, 128, 2, 4),
    _coop(128, 256, 2, 1, decomposition="hybrid"), _coop(256, 128, 1, 2, decomposition="hybrid"),
    _pingpong(64, 64, 1, 1), _pingpong(64, 64, 1, 2), _coop(128, 64, 1, 1),
    _pingpong(64, 64, 1, 1, splits=4, reduction="tree"), _pingpong(64, 128, 1, 1, splits=4, reduction="tree"),
    # M or N up to 4 (rcr): a block's warps stream a few rows of the big operand, splitting K
    dict(tile_m=4, tile_n=4, cluster_m=1, cluster_n=1, schedule="gemv"),
)

# How output tiles become work (the cuda template): K slices summed per
# output tile (split-K), by CUTLASS's stream-K fix-up in a fixed order
# (`linear`, cooperative schedule only: dcuda::Decomposition) or by a
# reduction kernel of the target's (`tree`: cuda/split_k_tree.hpp, any
# schedule, the epilogue applied there); or the hybrid decomposition:
# CUTLASS's heuristic, which keeps a problem data-parallel where its last
# wave of tiles is at least half full (or a tile has 8 K tiles or fewer) and
# otherwise shares the last full and the partial wave out stream-K (every
# tile, with two waves or fewer). Both run on CUTLASS's stream-K scheduler
# with a fixed-order fix-up; the `stream_k` variant offers its other modes
# and reductions.
SPLITS = Option("splits", 1, "K slices per output tile (cuda split-K; 1: no split)", low=1, high=16)
REDUCTION = Option("reduction", "linear",
                   "how split-K sums its slices: linear (CUTLASS's stream-K fix-up, slice after slice in a "
                   "fixed order; cooperative schedule) or tree (fp32 partials in the workspace, summed "
                   "pairwise by a reduction kernel that applies the epilogue; any schedule)",
                   choices=("linear", "tree"))
DECOMPOSITION = Option("decomposition", "data_parallel",
                       "data_parallel (persistent, a whole tile per work item) or hybrid (cuda: CUTLASS's "
                       "heuristic, the last waves stream-K where the last one is less than half full)",
                       choices=("data_parallel", "hybrid"))


def name_suffix(opts: dict) -> str:
    split = f"_splitk{opts['splits']}" if opts["splits"] > 1 else ""
    split += "_tree" if opts["reduction"] == "tree" else ""
    return epilogue_suffix(opts) + split + ("_hybrid" if opts["decomposition"] == "hybrid" else "")


def check(config):
    opts = config.variant_params
    split, hybrid, tree = opts["splits"] > 1, opts["decomposition"] == "hybrid", opts["reduction"] == "tree"
    if tree and not split:
        return "reduction=tree sums split-K's slices: it takes splits > 1"
    if not (split or hybrid):
        return None
    what = "split-K" if split else "the hybrid decomposition"
    if config.target != "cuda":
        return f"{what} is a cuda schedule; on the CPU the stream_k variant splits K"
    if config.target_params["schedule"] == "gemv":
        return f"{what} does not apply to the gemv schedule"
    if not tree and config.target_params["schedule"] != "cooperative":
        return (f"{what} runs on CUTLASS's stream-K scheduler, with the cooperative schedule only "
                f"(split-K with reduction=tree runs on any)")
    if split and hybrid:
        return "splits > 1 is split-K; it takes decomposition=data_parallel (not hybrid)"
    return None


def template_values(config, target):
    opts = config.variant_params
    return {"hybrid": "true" if opts["decomposition"] == "hybrid" else "false",
            "tree": int(opts["reduction"] == "tree")}


# fp8's own: its 128x128 tile swizzled, which ran 8192^3 at 0.81x
# torch._scaled_mm against 0.75-0.78x unswizzled and 6144^3 at 0.82x against
# 0.78x (H100, benchmarks/results/tile_probe_h100_aaf0389.json); unmeasured
# for 16-bit types. And 128x192, the largest cooperative tile whose two
# accumulators fit (`cuda.fp8_fits`): half again the reuse of 128x128, whose
# best kernels ran 0.77-0.85x torch._scaled_mm (cuda_gemm_fp8_h100_c7c89ef.json);
# not yet measured.
FP8_CATALOG = (_coop(128, 128, 2, 1, swizzle=2), _coop(128, 192, 2, 1), _coop(128, 192, 1, 2))


def default_configs(target, dtype, layout):
    if target == "cuda":
        fp8 = dtypes.get(dtype).is_float8
        return targets.get(target).catalog(CUDA_CATALOG + (FP8_CATALOG if fp8 else ()), dtype)
    return list(CPU_DEFAULTS) if target == "cpu" else []


RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="gemm",
    targets=("cpu", "cuda"),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    options=(*EPILOGUE_OPTIONS, SPLITS, REDUCTION, DECOMPOSITION),
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
