"""The CUDA configs a GPU run needs, in one place, so they can be built ahead
in parallel (benchmarks/build_cuda.py) before the tests and benchmarks run:
the variants' sm_90a catalogs (what selection, autotune and the benchmark's
best-of-catalog column use) and the explicit configs of tests/test_cuda_gpu.py."""

from __future__ import annotations

from dispatcher import KernelConfig
from dispatcher.api import Dispatcher
from dispatcher.problem import GemmProblem
from dispatcher.targets import cuda

TILE = dict(target="cuda", tile_m=128, tile_n=128, cluster_m=1, cluster_n=2)  # tests/test_cuda_gpu.py's
TREE_TILE = dict(target="cuda", tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, schedule="pingpong")  # and this


def catalog(variants=("regular", "stream_k", "grouped"), dtypes=("bf16",), layouts=("rcr",), out_dtype=None) -> list:
    """The catalogs of `variants` for each input dtype and layout, with
    `out_dtype` (None: each dtype's default output) in their names."""
    d = Dispatcher(tuning=None)
    out = []
    for variant in variants:
        for dtype in dtypes:
            for layout in layouts:
                out += d.candidates(GemmProblem(1, 1, 1, dtype, out_dtype or _out(dtype), layout, variant, "cuda"))
    return out


def _sweep(name: str, dtype: str, layout: str, variant: str = "regular") -> list:
    """The configs a sweep file of benchmarks/sweeps expands to."""
    import json
    from pathlib import Path

    from dispatcher.tile_engine import sweep
    config = json.loads((Path(__file__).parent / "sweeps" / name).read_text())
    return sweep.expand(config, variant=variant, target="cuda", dtype=dtype, layout=layout, out_dtype=None,
                        max_kernels=None).configs


def _out(dtype):
    from dispatcher import dtypes
    return dtypes.output_for(dtype).token


def batched_configs():
    """What tests/test_batched_gpu.py and `benchmarks/batched.py --cuda` run:
    the tests' explicit tiles per epilogue, and the default configs the
    benchmark's selection picks from (batched bf16 plain, regular bf16 +
    per-column bias + GELU; row-major operands: layout rrr)."""
    from dispatcher.plugins import get_manager

    tile = dict(target="cuda", tile_m=128, tile_n=128, cluster_m=1)
    out = [KernelConfig.create(variant="batched", dtype="bf16", layout="rrr", tile_k=64, **tile),
           KernelConfig.create(variant="regular", dtype="fp8_e4m3", layout="rcr", tile_k=128, bias="col",
                               activation="relu", **tile)]
    for variant, bias, activation in (("regular", "col", "gelu"), ("regular", "row", "relu"),
                                      ("regular", "col", "silu"), ("regular", "row", "none"),
                                      ("batched", "col", "none"), ("batched", "row", "gelu")):
        out.append(KernelConfig.create(variant=variant, dtype="bf16", layout="rrr", tile_k=64, bias=bias,
                                       activation=activation, **tile))
    for variant, epilogue in (("batched", {}), ("regular", dict(bias="col", activation="gelu"))):
        for fields in get_manager().variant(variant).default_configs("cuda", "bf16", "rrr"):
            out.append(KernelConfig.create(variant=variant, target="cuda", dtype="bf16", layout="rrr",
                                           **fields, **epilogue))
    # the catalog's gemv entry cannot read rrr: what the target refuses is never built
    return list({c.name: c for c in out if not c.problems()}.values())


def test_configs() -> list:
    """The explicit configs of tests/test_cuda_gpu.py."""
    out = []
    for dtype in ("bf16", "fp16"):
        tile_k = cuda.CUDA.default_tile_k(dtype)
        for layout in ("rcr", "rrr", "crr", "ccr"):
            out.append(KernelConfig.create(dtype=dtype, layout=layout, tile_k=tile_k, **TILE))
        out.append(KernelConfig.create(variant="grouped", dtype=dtype, layout="rcr", tile_k=tile_k, **TILE))
    for dtype in ("fp8_e4m3", "fp8_e5m2"):
        out.append(KernelConfig.create(dtype=dtype, layout="rcr", tile_k=128, **TILE))
    for dec, splits in (("hybrid", 1), ("stream_k", 1), ("split_k", 3), ("data_parallel", 1)):
        for red in ("linear", "atomic"):
            out.append(KernelConfig.create(variant="stream_k", dtype="bf16", layout="rcr", tile_k=64,
                                           decomposition=dec, splits=splits, reduction=red, **TILE))
    for dtype, layout, splits in [("bf16", layout, 3) for layout in ("rcr", "rrr", "crr", "ccr")] + \
            [("bf16", "rcr", 8), ("fp8_e4m3", "rcr", 4)]:  # test_stream_k_tree's, and the determinism test's
        out.append(KernelConfig.create(variant="stream_k", dtype=dtype, layout=layout,
                                       tile_k=cuda.CUDA.default_tile_k(dtype), decomposition="split_k",
                                       splits=splits, reduction="tree", **TILE))
    for layout, splits in (("rcr", 3), ("rcr", 8), ("rrr", 3)):  # test_regular_split_k's
        out.append(KernelConfig.create(dtype="bf16", layout=layout, tile_k=64, splits=splits, **TILE))
    for layout, splits in (("rcr", 4), ("rrr", 3), ("crr", 8)):  # test_regular_tree_split_k's
        out.append(KernelConfig.create(dtype="bf16", layout=layout, tile_k=64, splits=splits, reduction="tree",
                                       **TREE_TILE))
    for bias, activation in (("col", "gelu"), ("row", "relu")):  # test_regular_split_k_alpha_beta_and_epilogue's
        for reduction, tile in (("linear", TILE), ("tree", TREE_TILE)):
            out.append(KernelConfig.create(dtype="bf16", layout="rrr", tile_k=64, splits=3, bias=bias,
                                           activation=activation, reduction=reduction, **tile))
    for layout, epilogue in (("rcr", {}), ("rrr", {}), ("rrr", dict(bias="col", activation="relu"))):
        out.append(KernelConfig.create(dtype="bf16", layout=layout, tile_k=64, decomposition="hybrid",
                                       **epilogue, **TILE))  # test_regular_hybrid*'s
    gemv = dict(target="cuda", layout="rcr", tile_m=4, tile_n=4, tile_k=64, cluster_m=1, cluster_n=1,
                schedule="gemv")  # the gemv tests'
    out += [KernelConfig.create(dtype=dtype, **gemv) for dtype in ("bf16", "fp16")]
    out += [KernelConfig.create(dtype="bf16", dtype_c="fp32", bias=bias, activation=activation, **gemv)
            for bias, activation in (("col", "gelu"), ("row", "silu"))]
    return out


def everything() -> list:
    seen = {}
    for c in catalog() + catalog(("regular",), ("fp8_e4m3",)) + test_configs() + batched_configs() + torch_configs():
        seen[c.name] = c
    return list(seen.values())


def torch_configs() -> list:
    """The catalogs dispatcher.torch's GPU tests and benchmarks/torch_mlp.py
    select from: a Linear's forward runs rcr (with a bias: its per-column
    bias epilogue), its dX rrr and its dW crr; a grouped_mm's forward on
    transposed expert weights rcr, its dA rrr and its dB (a grouped_gemm) crr."""
    from dispatcher.plugins import get_manager

    biased = [KernelConfig.create(variant="regular", target="cuda", dtype="bf16", layout="rcr", bias="col",
                                  **fields)
              for fields in get_manager().variant("regular").default_configs("cuda", "bf16", "rcr")]
    return catalog(("regular", "grouped"), ("bf16",), ("rcr", "rrr", "crr")) + biased


SETS = {"catalog": catalog, "tests": test_configs, "torch": torch_configs, "batched": batched_configs,
        "all": everything}


def selected(variant: str, calls: list, d: Dispatcher | None = None) -> list:
    """The configs `d` selects (no GPU needed: NVIDIA's model ranks the
    catalog; default: a Dispatcher without tuning winners) for calls of
    `variant`'s kind: each call a dict of operand name -> (shape, strides in
    elements, dtype token) and choices (out_dtype among them)."""
    import numpy as np

    from dispatcher import dtypes, kinds
    from dispatcher.dispatch import Dispatcher
    from dispatcher.plugins import get_manager
    from dispatcher.problem import ArraySpec

    record, d = get_manager().variant(variant), d or Dispatcher(tuning=None)
    out = {}
    for operands, choices in calls:
        def spec(name):
            if name not in operands:
                return None
            shape, strides, token = operands[name]
            dtype = dtypes.get(token).numpy
            return ArraySpec(shape, tuple(s * np.dtype(dtype).itemsize for s in strides), np.dtype(dtype))
        specs = tuple((o.name, spec(o.name)) for o in kinds.operands_of(record))
        choices = dict(choices)
        out_dtype = choices.pop("out_dtype", None)
        layout = kinds.layout(record, specs, tuple(sorted(choices.items())), out_dtype, "cuda", False)
        config = d.select(layout.problem)
        out[config.name] = config
    return list(out.values())


def overhead_configs() -> list:
    """What benchmarks/call_overhead.py's GPU part and profile_call.py select."""
    row = lambda m, n: ((m, n), (n, 1), "bf16")  # noqa: E731
    col = lambda m, n: ((m, n), (1, m), "bf16")  # noqa: E731
    plain = [({"a": row(256, 256), "b": row(256, 256)}, {}), ({"a": row(511, 3071), "b": row(3071, 2049)}, {}),
             ({"a": row(256, 256), "b": col(256, 256), "bias": ((256,), (1,), "bf16")}, {}),  # Linear
             ({"a": row(256, 256), "b": row(256, 256)}, {}), ({"a": col(256, 256), "b": row(256, 256)}, {})]
    fused = [({"a": row(n, n), "b": row(n, n), "bias": ((n,), (1,), "bf16")}, {"activation": "gelu"})
             for n in (256, 1024, 4096)]
    batched = [({"a": ((b, m, k), (m * k, k, 1), "bf16"), "b": ((b, k, n), (k * n, n, 1), "bf16")}, {})
               for b, m, n, k in ((48, 384, 640, 128), (16, 1024, 1024, 512), (4, 2048, 3072, 1024))]
    return selected("regular", plain + fused) + selected("batched", batched)


def torch_test_configs() -> list:
    """What tests/test_torch_gpu.py's MLP (256 -> 512 -> 256 -> 1, 512
    tokens, bias) and its Linear whose forward needs scratch (3072 -> 2816,
    1024 tokens, no bias: SCRATCH_LINEAR there) select beyond the catalogs:
    each layer's forward (x @ weight.t() + bias), dX (dy @ weight) and dW
    (dy.t() @ x), the last layer's N = 1 included; as the tests select them
    (the shipped winners first)."""
    from cuda_gemm import fresh

    row = lambda m, n: ((m, n), (n if m > 1 else 1, 1), "bf16")  # noqa: E731
    col = lambda m, n: ((m, n), (1, m if n > 1 else 1), "bf16")  # noqa: E731
    calls = []
    for tokens, fan_in, fan_out, bias in ((512, 256, 512, True), (512, 512, 256, True), (512, 256, 1, True),
                                          (1024, 3072, 2816, False)):
        forward = {"a": row(tokens, fan_in), "b": col(fan_in, fan_out)}
        calls += [({**forward, **({"bias": ((fan_out,), (1,), "bf16")} if bias else {})}, {}),
                  ({"a": row(tokens, fan_out), "b": row(fan_out, fan_in)}, {}),
                  ({"a": col(fan_out, tokens), "b": row(tokens, fan_in)}, {})]
    return selected("regular", calls, fresh())


def default_configs() -> list:
    """What benchmarks/cuda_gemm.py's default column runs: the kernels a
    fresh install selects, the shipped winners first, for its bf16 rcr
    corpus (regular, unaligned, skinny, stream_k), its random shapes (all three draws) and
    its fp8 squares (sm_90a: $DISPATCHER_CUDA_ARCH, else 90a without a GPU).
    Built ahead, no first call of the benchmark compiles."""
    from common import load_shapes
    from cuda_gemm import HELD_OUT_SEED, RANDOM_SEED, WORK_TERM_SEED, fresh, random_shapes

    d = fresh()
    rcr = lambda m, n, k, t="bf16": {"a": ((m, k), (k, 1), t), "b": ((k, n), (1, k), t)}  # noqa: E731
    corpus = load_shapes()["gpu"]
    plain = [(rcr(*s), {}) for part in ("regular", "unaligned", "skinny") for s in corpus[part]]
    plain += [(rcr(*s), {}) for seed in (RANDOM_SEED, HELD_OUT_SEED, WORK_TERM_SEED) for s in random_shapes(seed=seed)]
    fp8 = [(rcr(*s, "fp8_e4m3"), {"out_dtype": "bf16"}) for s in corpus["regular"]
           if min(s) >= 4096 and s[0] == s[1] == s[2]]
    stream_k = [(rcr(*s), {}) for s in corpus["stream_k"]]
    return selected("regular", plain + fp8, d) + selected("stream_k", stream_k, d)


def mlp_configs() -> list:
    """What benchmarks/torch_mlp.py's --grid selects (shipped winners first):
    each cell's six GEMMs."""
    from cuda_gemm import fresh
    from torch_mlp import GRID_D, GRID_TOKENS, gemm_problems, grid_hidden

    d = fresh()
    configs = [d.select(problem) for width in GRID_D for tokens in GRID_TOKENS
               for problem in gemm_problems(width, grid_hidden(width), tokens, "cuda").values()]
    return list({c.name: c for c in configs}.values())


SETS["overhead"] = overhead_configs
SETS["defaults"] = default_configs
SETS["mlp"] = mlp_configs
SETS["rrr"] = lambda: catalog(("regular",), ("bf16",), ("rrr",))  # cuda_gemm.py's unaligned part (row-major B)
SETS["crr"] = lambda: catalog(("regular",), ("bf16",), ("crr",))  # a Linear's dW: the tune step's bf16 crr sweep
SETS["rcr"] = lambda: catalog(("regular",), ("bf16",), ("rcr",))  # the regular variant's alone
# What `gpu_session.sh tune` sweeps with TUNE_SPECS="$(cat benchmarks/sweeps/cuda_tuning_specs_full.txt)"
# (a Linear's forward rcr, dX rrr and dW crr in bf16 and fp16, fp8 rcr) and cuda_gemm.py's fp8 part
SETS["tune"] = lambda: catalog(("regular",), ("bf16", "fp16"), ("rcr", "rrr", "crr")) + \
    catalog(("regular",), ("fp8_e4m3",), ("rcr",)) + catalog(("stream_k",), ("bf16",), ("rcr",))
SETS["torch"] = lambda: torch_configs() + torch_test_configs()
# cuda_gemm.py's fp8 (bf16 out), stream_k and grouped parts: the catalogs their best-of-catalog and autotune
# columns time (without them each first call compiles: the fp8 part's 10 kernels took its whole call on the GPU)
SETS["parts"] = lambda: catalog(("regular",), ("fp8_e4m3",), ("rcr",), out_dtype="bf16") + \
    catalog(("stream_k",), ("bf16",), ("rcr",)) + catalog(("grouped",), ("bf16", "fp8_e4m3"), ("rcr",))
# What `TUNE_SWEEP=catalog_splitk.json gpu_session.sh tune` sweeps for bf16 rcr: the catalog and its
# cooperative kernels with K split in 2, 4 and 8 (few output tiles, long K: 8 x 2048 x 8192 has 16 tiles)
SETS["splitk"] = lambda: _sweep("catalog_splitk.json", "bf16", "rcr")
# The same for a Linear's dW (crr: out x in x tokens, few tiles and long K where out and in are small: the
# MLP grid's kernel-limited cells), swept over the general grid so that the MLP grid stays a held-out check:
# `BUILD_SET=splitk_crr ... TUNE_SWEEP=catalog_splitk.json TUNE_SPECS=regular:bf16:crr:cuda_tuning_grid`
SETS["splitk_crr"] = lambda: _sweep("catalog_splitk.json", "bf16", "crr")
# Split-K in 3 and 6 slices: where a problem's tiles fill two thirds of a wave (2816 x 1024 in 256x128 tiles: 88
# tiles on 132 SMs, which the hybrid heuristic keeps data-parallel), 3 slices make two whole waves; the MLP grid's
# d = 1024 cells (0.77-0.80x cuBLAS in dW at the catalog's best): a probe over cuda_tuning_mlp_dw.json first,
# `BUILD_SET=splitk3_crr ... TUNE_SWEEP=catalog_splitk3.json TUNE_SPECS=regular:bf16:crr:cuda_tuning_mlp_dw`
SETS["splitk3_rcr"] = lambda: _sweep("catalog_splitk3.json", "bf16", "rcr")
SETS["splitk3_crr"] = lambda: _sweep("catalog_splitk3.json", "bf16", "crr")
SETS["hybrid"] = lambda: _sweep("catalog_hybrid.json", "bf16", "rcr")  # the split-K set's and the hybrid kernels
# What `TUNE_SWEEP=catalog_raster.json TUNE_SPECS=stream_k:bf16:rcr:cuda_tuning_grid_stream_k` sweeps
SETS["stream_k_raster"] = lambda: _sweep("catalog_raster.json", "bf16", "rcr", "stream_k")
# The GPU tests' split-K kernels (both variants, both reductions) and gemv kernels
SETS["split"] = lambda: [c for c in test_configs() if c.variant_params.get("splits", 1) > 1
                         or c.target_params["schedule"] == "gemv"]
# The gemv kernels of the GPU tests and what cuda_gemm.py's skinny part times them against
SETS["gemv"] = lambda: [c for c in test_configs() if c.target_params["schedule"] == "gemv"] + \
    catalog(("regular",), ("bf16",), ("rcr",))
