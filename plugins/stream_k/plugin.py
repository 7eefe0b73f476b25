"""Hooks of the `stream_k` variant.

Launch bypasses the kernel registry, as CK's stream-K bridge does: the
library exports `dispatcher_run_gemm` and `dispatcher_workspace_size` and no
registry table. The plugin owns the workspace: it asks the kernel for its
size, allocates it (grown on demand, one per thread so concurrent launches
never share one) and zeroes it before every launch.

Variant block:
  reduction      atomic (partials added into C; nondeterministic order) or
                 linear (partials written to the workspace and summed by the
                 tile's owner in a fixed order: bit-identical across runs)
  decomposition  hybrid (full waves data-parallel, the rest stream-K; the
                 default), stream_k (every tile split), data_parallel
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from dispatcher import dtypes, targets
from dispatcher.codegen import render
from dispatcher.hookspecs import hookimpl
from dispatcher.library import LaunchResult, gemm_args
from dispatcher.records import Option, VariantRecord

VARIANT = "stream_k"
HERE = Path(__file__).parent
REDUCTIONS = ("atomic", "linear")
DECOMPOSITIONS = ("hybrid", "stream_k", "data_parallel")

# Stream-K pays off on few-tile, long-K problems, so its defaults are
# smaller block tiles than the regular variant's.
CPU_DEFAULTS = (
    dict(tile_m=96, tile_n=128, tile_k=256, micro_m=12, micro_n=32),
    dict(tile_m=48, tile_n=64, tile_k=256, micro_m=12, micro_n=32),
)


def name_suffix(opts: dict) -> str:
    return f"_streamk_{opts['reduction']}_{opts['decomposition']}"


def check(config):
    if config.variant_params["reduction"] == "atomic" and config.dtype_c not in ("fp32", "int32"):
        return (f"atomic reduction adds partials into C, which needs an fp32 or int32 output "
                f"(got {config.dtype_c}); use reduction=linear")
    return None


def default_configs(target, dtype, layout):
    if target != "cpu":
        return []
    out_default = dtypes.output_for(dtype).token
    reduction = "atomic" if out_default in ("fp32", "int32") else "linear"
    return [dict(d, reduction=reduction) for d in CPU_DEFAULTS]


RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="gemm",
    targets=("cpu",),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    options=(
        Option("reduction", "linear", "how partial tiles are combined", choices=REDUCTIONS),
        Option("decomposition", "hybrid", "which tiles are split", choices=DECOMPOSITIONS),
    ),
    name_suffix=name_suffix,
    default_configs=default_configs,
    check=check,
    fallback="regular",
    partial_sums=lambda config: targets.get(config.target).parallelism(config),
    description="stream-K: K-iterations split evenly over persistent workers, partial tiles fixed up",
)


@hookimpl
def dispatcher_register_variants():
    return [RECORD]


@hookimpl
def dispatcher_codegen(config, target):
    if config.variant != VARIANT:
        return None
    opts = config.variant_params
    return render(HERE, config, target,
                  reduction=f"Reduction::{opts['reduction']}",
                  decomposition=f"Decomposition::{opts['decomposition']}")


class _Workspaces(threading.local):
    """One grow-on-demand workspace per thread: never shared by concurrent launches."""

    def __init__(self):
        self.buffer = np.empty(0, np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        if self.buffer.nbytes < nbytes:
            self.buffer = np.empty(nbytes, np.uint8)
        return self.buffer


_workspaces = _Workspaces()


@hookimpl
def dispatcher_launch(library, problem, operands, options):
    if problem.variant != VARIANT:
        return None
    workers = options.get("workers", 0)
    nbytes = library.workspace_size(gemm_args(operands, workers=workers))
    workspace = _workspaces.get(nbytes)
    workspace[:nbytes] = 0
    args = gemm_args(operands, workers=workers, workspace=workspace.ctypes.data if nbytes else 0,
                     workspace_bytes=nbytes)
    library.run_gemm(args)  # direct call: no registry table
    return LaunchResult(library.name, workspace_bytes=nbytes)
