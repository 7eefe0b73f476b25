"""Hooks of the `grouped` variant.

Its argument is a list of problems, which the single-problem registry path
cannot express, so launch bypasses the registry and calls the library's
entry point directly: `dispatcher_run_grouped_gemm` with per-group sizes,
pointers and leading dimensions (`grouped_gemm`'s list form), or
`dispatcher_run_grouped_mm` with one stacked A, a (G, K, N) B and row
offsets that the kernel reads where they live (`grouped_mm`, the
mixture-of-experts form). The kernel runs one parallel region (one launch)
over the tiles of all groups.
"""

from __future__ import annotations

from pathlib import Path

from dispatcher import dtypes, targets
from dispatcher.library import GroupedCall, LaunchResult, grouped_mm_args
from dispatcher.plugin_api import VariantRecord, for_variant, registers, renders
from dispatcher.problem import StackedOperands
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


# The sm_90a catalog: cooperative tiles only (ping-pong 128x256 grouped
# instances ran 20x slower than their cooperative twins); 128-row tiles for
# many small groups, 256-wide for few large ones.
CUDA_CATALOG = (
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, schedule="cooperative"),
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, schedule="cooperative"),
    dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, schedule="cooperative"),
    dict(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2, schedule="cooperative"),
)


def default_configs(target, dtype, layout):
    if target == "cuda":
        return targets.get(target).catalog(CUDA_CATALOG, dtype)
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
    if isinstance(operands, StackedOperands):
        args = grouped_mm_args(operands, stream=stream)
        WORKSPACES.attach(library, args, stream)
        library.run_grouped_mm(args)
    else:
        call = GroupedCall(operands, stream=stream)
        WORKSPACES.attach(library, call.args, stream)
        library.run_grouped(call.args)  # direct call: no registry table
    return LaunchResult(library.name)


# A plan that binds this launch may call the stacked form's entry point
# itself with a copy of the same argument block and the workspace it asks
# for (`dispatcher.plans.GroupedPlan.runner`): it does nothing else.
dispatcher_launch.direct_grouped_mm = lambda library: library.require("dispatcher_run_grouped_mm")
