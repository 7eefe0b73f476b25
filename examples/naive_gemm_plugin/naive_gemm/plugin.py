"""Hooks of the `naive` variant (the walkthrough in docs/writing-a-plugin.md)."""

from pathlib import Path

from dispatcher import dtypes
from dispatcher.plugin_api import VariantRecord, launches_gemm, registers, renders

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

dispatcher_register_variants = registers(RECORD)
dispatcher_codegen = renders(VARIANT, Path(__file__).parent)
dispatcher_launch = launches_gemm(VARIANT)
