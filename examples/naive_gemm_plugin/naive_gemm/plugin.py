"""Hooks of the `naive` variant (the walkthrough in docs/writing-a-plugin.md)."""

from pathlib import Path

from dispatcher import dtypes
from dispatcher.codegen import render
from dispatcher.hookspecs import hookimpl
from dispatcher.library import LaunchResult, gemm_args
from dispatcher.records import VariantRecord

VARIANT = "naive"

RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="gemm",
    targets=("cpu",),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    name_suffix=lambda opts: "_naive",
    # The block tile is unused by this kernel; one config serves every problem.
    default_configs=lambda target, dtype, layout: [dict(tile_m=12, tile_n=32, tile_k=1)],
    description="one dot product per output element (an example plugin)",
)


@hookimpl
def dispatcher_register_variants():
    return [RECORD]


@hookimpl
def dispatcher_codegen(config, target):
    if config.variant != VARIANT:
        return None
    return render(Path(__file__).parent, config, target)


@hookimpl
def dispatcher_launch(library, problem, operands, options):
    if problem.variant != VARIANT:
        return None
    library.run_gemm(gemm_args(operands))
    return LaunchResult(library.name)
