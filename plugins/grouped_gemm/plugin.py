"""Hooks of the `grouped` variant.

Its argument is a list of problems, which the single-problem registry path
cannot express, so launch bypasses the registry and calls the library's
`dispatcher_run_grouped_gemm` directly with per-group sizes, pointers and
leading dimensions. The kernel runs one parallel region over the tiles of
all groups.
"""

from __future__ import annotations

from pathlib import Path

from dispatcher import dtypes, targets
from dispatcher.library import GroupedCall, LaunchResult
from dispatcher.plugin_api import VariantRecord, for_variant, registers, renders
from dispatcher.workspace import WORKSPACES

VARIANT = "grouped"
HERE = Path(__file__).parent

# Block tiles as wide as a typical N and short in M, so small groups waste
# little and each thread packs a group's B panel once (measured in
# benchmarks/cpu_variants.py).
CPU_DEFAULTS = (
    dict(tile_m=48, tile_n=512, tile_k=256),
    dict(tile_m=96, tile_n=128, tile_k=256),
)


CUDA_DEFAULTS = (
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, schedule="cooperative"),
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, schedule="cooperative"),
)


def default_configs(target, dtype, layout):
    if target == "cuda":
        return [dict(d, tile_k=targets.get(target).default_tile_k(dtype)) for d in CUDA_DEFAULTS]
    return list(CPU_DEFAULTS) if target == "cpu" else []


RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="grouped",
    targets=("cpu", "cuda"),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    name_suffix=lambda opts: "_grouped",
    default_configs=default_configs,
    description="grouped GEMM: G independent problems, one launch, one tile scheduler",
)


dispatcher_register_variants = registers(RECORD)
dispatcher_codegen = renders(VARIANT, HERE)


@for_variant(VARIANT)
def dispatcher_launch(library, problem, operands, options):
    stream = options.get("stream", 0)
    call = GroupedCall(operands, stream=stream)
    WORKSPACES.attach(library, call.args, stream)
    library.run_grouped(call.args)  # direct call: no registry table
    return LaunchResult(library.name)
