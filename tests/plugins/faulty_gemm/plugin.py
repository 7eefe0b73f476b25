"""Variant `faulty`: a correct data-parallel GEMM, unless its `behaviour`
option makes it segfault, hang, write one wrong value, run slowly (right
results, many times the time: a kernel no sweep should pick) or return status
-2. Its default configs: an `unsupported` kernel that the occupancy model
ranks first on small problems (smaller tile), then an `ok` one."""

from pathlib import Path

from dispatcher import dtypes
from dispatcher.codegen import render
from dispatcher.hookspecs import hookimpl
from dispatcher.library import LaunchResult, gemm_args
from dispatcher.records import Option, VariantRecord

BEHAVIOURS = ("ok", "segfault", "hang", "wrong", "slow", "unsupported")
DEFAULTS = (dict(tile_m=48, tile_n=64, tile_k=64, behaviour="unsupported"),
            dict(tile_m=96, tile_n=128, tile_k=64, behaviour="ok"))

RECORD = VariantRecord(
    name="faulty", problem_kind="gemm", targets=("cpu",), dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    options=(Option("behaviour", "ok", "what the kernel does", choices=BEHAVIOURS),),
    name_suffix=lambda opts: f"_faulty_{opts['behaviour']}",
    default_configs=lambda target, dtype, layout: list(DEFAULTS) if target == "cpu" else [],
)


@hookimpl
def dispatcher_register_variants():
    return [RECORD]


@hookimpl
def dispatcher_codegen(config, target):
    if config.variant != "faulty":
        return None
    return render(Path(__file__).parent, config, target,
                  behaviour=BEHAVIOURS.index(config.variant_params["behaviour"]))


@hookimpl
def dispatcher_launch(library, problem, operands, options):
    if problem.variant != "faulty":
        return None
    library.run_gemm(gemm_args(operands))
    return LaunchResult(library.name)
