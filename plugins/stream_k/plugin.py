"""Hooks of the `stream_k` variant.

Launch bypasses the kernel registry, as CK's stream-K bridge does: the
library exports `dispatcher_run_gemm` and `dispatcher_workspace_size` and no
registry table. Its workspace is the size the kernel asks for, grown on
demand, one per thread so concurrent launches never share one, and zeroed
before every launch on the cpu (`dispatcher.workspace`).

Variant block:
  reduction      atomic (partials combined in arrival order: nondeterministic;
                 on the CPU added into one workspace tile per split tile),
                 linear (partials summed in a fixed order: bit-identical across
                 runs; CUTLASS's Deterministic) or tree (partials combined
                 pairwise in log2 steps, a fixed pairing: bit-identical across
                 runs; CK's Tree). On the CPU the tree's additions of a step are
                 spread over the workers; on cuda the tree runs split_k: each K
                 slice's fp32 partial goes to the workspace and a reduction
                 kernel combines them (templates/cuda-tree.cu). Either way the
                 epilogue (alpha, beta, conversion) runs once, on the sum.
  decomposition  hybrid (full waves data-parallel, the rest stream-K; the
                 default; CUTLASS's Heuristic), stream_k (every tile split),
                 split_k (`splits` equal K slices; cuda), data_parallel
  splits         the split count of split_k
"""

from __future__ import annotations

from pathlib import Path

from dispatcher import dtypes, targets
from dispatcher.plugin_api import WORKERS, Option, VariantRecord, for_variant, launches_gemm, registers, render

VARIANT = "stream_k"
HERE = Path(__file__).parent
REDUCTIONS = ("atomic", "linear", "tree")
DECOMPOSITIONS = ("hybrid", "stream_k", "split_k", "data_parallel")
# The same vocabulary in CUTLASS's StreamKScheduler enums (which have no tree:
# the cuda tree is a template of its own).
CUTLASS_REDUCTION = {"atomic": "Nondeterministic", "linear": "Deterministic"}
CUTLASS_DECOMPOSITION = {"hybrid": "Heuristic", "stream_k": "StreamK", "split_k": "SplitK",
                         "data_parallel": "DataParallel"}

# Stream-K pays off on few-tile, long-K problems, so its defaults are
# smaller block tiles than the regular variant's.
CPU_DEFAULTS = (
    dict(tile_m=96, tile_n=128, tile_k=256),
    dict(tile_m=48, tile_n=64, tile_k=256),
)


# The sm_90a catalog: stream-K's own decomposition on the tiles NVIDIA's
# model favours, and split-K with the split counts it proposes for few-tile,
# long-K problems (cooperative only: CUTLASS's StreamKScheduler).
def _coop(m, n, cm, cn, **variant):
    return dict(tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn, schedule="cooperative",
                reduction="linear", **variant)


CUDA_CATALOG = (
    _coop(128, 256, 2, 1), _coop(128, 128, 1, 2), _coop(128, 128, 2, 1),
    _coop(128, 128, 1, 2, decomposition="split_k", splits=3),
    _coop(128, 128, 1, 2, decomposition="split_k", splits=8),
    _coop(256, 128, 1, 2, decomposition="split_k", splits=4),
    # few tiles of a long K (256 x 1024 x 32768: eight 256x128 tiles): every SM busy on
    # K slices while the 1x2 cluster multicasts A, the smaller operand's tile read once
    _coop(256, 128, 1, 2), _coop(256, 128, 1, 2, decomposition="split_k", splits=16),
    # the tree (its own reduction kernel, any schedule) on the same problems: 256 x 1024 x 32768
    # ran 0.96x cuBLAS on 64x128 ping-pong in 4 slices and 512 x 512 x 65536 0.89x on 128x128
    # in 8, against 0.73x and 0.75x for the linear fix-up's best (H100, kernel alone,
    # benchmarks/results/tile_probe_h100_aaf0389.json)
    dict(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong", reduction="tree",
         decomposition="split_k", splits=4),
    dict(_coop(128, 128, 1, 2), reduction="tree", decomposition="split_k", splits=8),
)


def name_suffix(opts: dict) -> str:
    split = f"{opts['splits']}" if opts["decomposition"] == "split_k" else ""
    return f"_streamk_{opts['reduction']}_{opts['decomposition']}{split}"


def check(config):
    opts = config.variant_params
    if opts["splits"] > 1 and opts["decomposition"] != "split_k":
        return "splits > 1 needs decomposition=split_k"
    if config.target == "cpu":
        if opts["reduction"] == "atomic" and config.dtype_c not in ("fp32", "int32"):
            return (f"atomic reduction is offered for fp32 and int32 outputs on the CPU "
                    f"(got {config.dtype_c}); use reduction=linear")
        if opts["decomposition"] == "split_k":
            return "split_k is a cuda decomposition; the CPU kernels split by K-iterations (stream_k)"
    if config.target == "cuda":
        if opts["reduction"] == "tree" and opts["decomposition"] != "split_k":
            return ("the cuda tree reduction combines the partials of split_k's K slices (CUTLASS's "
                    "stream-K fix-up has no tree); use decomposition=split_k")
        if opts["reduction"] != "tree" and config.target_params["schedule"] != "cooperative":
            return "CUTLASS's StreamKScheduler runs with the cooperative schedule only"
    return None


def default_configs(target, dtype, layout):
    if target == "cuda":
        return targets.get(target).catalog(CUDA_CATALOG, dtype)
    if target != "cpu":
        return []
    # Atomic where the default output takes it (it wins the tie on cost by
    # name), and linear always: the hook is not told the output dtype, and
    # fp32 inputs asked for fp16 or bf16 outputs had no default at all.
    out_default = dtypes.output_for(dtype).token
    reductions = ("atomic", "linear") if out_default in ("fp32", "int32") else ("linear",)
    return [dict(d, reduction=r) for r in reductions for d in CPU_DEFAULTS]


RECORD = VariantRecord(
    name=VARIANT,
    problem_kind="gemm",
    targets=("cpu", "cuda"),
    dtypes=dtypes.INPUT_TOKENS,
    layouts=("rcr", "rrr", "crr", "ccr"),
    options=(
        Option("reduction", "linear", "how partial tiles are combined", choices=REDUCTIONS),
        Option("decomposition", "hybrid", "which tiles are split", choices=DECOMPOSITIONS),
        Option("splits", 1, "K slices of split_k", low=1, high=64),
    ),
    launch_options=(WORKERS,),
    name_suffix=name_suffix,
    default_configs=default_configs,
    check=check,
    fallback="regular",
    partial_sums=lambda config: targets.get(config.target).parallelism(config),
    k_splits=lambda config: (config.variant_params["splits"]
                             if config.variant_params["decomposition"] == "split_k" else 1),
    description="stream-K: K-iterations split evenly over persistent workers, partial tiles fixed up",
)


dispatcher_register_variants = registers(RECORD)


@for_variant(VARIANT)
def dispatcher_codegen(config, target):
    opts = config.variant_params
    if target.name == "cuda":
        if opts["reduction"] == "tree":
            return render(HERE, config, target, template="tree", splits=opts["splits"])
        return render(HERE, config, target, reduction=CUTLASS_REDUCTION[opts["reduction"]],
                      decomposition=CUTLASS_DECOMPOSITION[opts["decomposition"]],
                      splits=opts["splits"])
    return render(HERE, config, target,
                  reduction=f"Reduction::{opts['reduction']}",
                  decomposition=f"Decomposition::{opts['decomposition']}")


# The library's own `dispatcher_run_gemm`, no registry table; the workspace
# it asks for is grown on demand and zeroed before each launch where the
# target says so (`WORKSPACES`), and a plan calls that entry point itself.
dispatcher_launch = launches_gemm(VARIANT)
