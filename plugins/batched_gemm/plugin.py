"""Hooks of the `batched` variant: `batch` GEMMs of one shape in one launch,
each operand stepping by its own batch stride (0 = one matrix for every
batch), with the fused epilogues. Written only against the public plugin
API (`dispatcher.plugin_api`), as a third-party variant would be: the core
turns numpy-style batch broadcasting into batch count and strides.
"""

from __future__ import annotations

from pathlib import Path

from dispatcher import dtypes
from dispatcher.plugin_api import (BIAS, EPILOGUE_OPTIONS, WORKERS, VariantRecord,
                                   configs_per_target, epilogue_problem_options, epilogue_suffix,
                                   gemm_operands, launches_gemm, registers, renders)

VARIANT = "batched"

# Each batch is usually small, so the CPU tiles are too; one parallel loop
# runs over the tiles of every batch. On the GPU the large cooperative tile
# for throughput, a smaller one for batches of small matrices, and 128x128
# ping-pong tiles, which ran torch.bmm's shapes faster (H100, kernel alone,
# against torch.bmm: 4x2048x3072x1024 1.03x and 8x4096x4096x512 1.01x on
# them against 0.95x and 0.94x on 128x256 c2x1;
# benchmarks/results/tile_probe_h100_aaf0389.json).
DEFAULT_CONFIGS = configs_per_target(
    cpu=(dict(tile_m=96, tile_n=128, tile_k=256), dict(tile_m=48, tile_n=64, tile_k=256)),
    cuda=(dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, schedule="cooperative"),
          dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, schedule="cooperative"),
          dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, schedule="pingpong")),
)


RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="batched",
    targets=("cpu", "cuda"),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    options=EPILOGUE_OPTIONS,
    launch_options=(WORKERS,),
    name_suffix=lambda opts: "_batched" + epilogue_suffix(opts),
    default_configs=DEFAULT_CONFIGS,
    operands=(*gemm_operands(batched=True), BIAS),
    problem_options=epilogue_problem_options,
    description="strided-batched GEMM (numpy matmul broadcasting), fused bias and activation",
)

dispatcher_register_variants = registers(RECORD)
dispatcher_codegen = renders(VARIANT, Path(__file__).parent)
dispatcher_launch = launches_gemm(VARIANT)
