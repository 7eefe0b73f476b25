"""Hooks of the `grouped` variant.

Its argument is a list of problems, which the single-problem registry path
cannot express, so launch bypasses the registry and calls the library's
`dispatcher_run_grouped_gemm` directly with per-group sizes, pointers and
leading dimensions. The kernel runs one parallel region over the tiles of
all groups.
"""

from __future__ import annotations

from pathlib import Path

from dispatcher import dtypes
from dispatcher.codegen import render
from dispatcher.hookspecs import hookimpl
from dispatcher.library import GroupedCall, LaunchResult
from dispatcher.records import VariantRecord

VARIANT = "grouped"
HERE = Path(__file__).parent

# Block tiles as wide as a typical N and short in M, so small groups waste
# little and each thread packs a group's B panel once (measured in
# benchmarks/cpu_variants.py).
CPU_DEFAULTS = (
    dict(tile_m=48, tile_n=512, tile_k=256, micro_m=12, micro_n=32),
    dict(tile_m=96, tile_n=128, tile_k=256, micro_m=12, micro_n=32),
)


def default_configs(target, dtype, layout):
    return list(CPU_DEFAULTS) if target == "cpu" else []


RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="grouped",
    targets=("cpu",),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    name_suffix=lambda opts: "_grouped",
    default_configs=default_configs,
    description="grouped GEMM: G independent problems, one launch, one tile scheduler",
)


@hookimpl
def dispatcher_register_variants():
    return [RECORD]


@hookimpl
def dispatcher_codegen(config, target):
    if config.variant != VARIANT:
        return None
    return render(HERE, config, target)


@hookimpl
def dispatcher_launch(library, problem, operands, options):
    if problem.variant != VARIANT:
        return None
    call = GroupedCall(operands)
    library.run_grouped(call.args)  # direct call: no registry table
    return LaunchResult(library.name)
