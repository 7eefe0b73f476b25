"""The CUDA configs the GPU tests and benchmarks run, in one place, so the
kernels can be built ahead (benchmarks/build_cuda.py) and carried to the GPU."""

from __future__ import annotations

from dispatcher import KernelConfig

BF16 = dict(target="cuda", dtype="bf16", layout="rcr", tile_k=64)

# (tile_m, tile_n, cluster_m, cluster_n, schedule[, swizzle])
REGULAR_TILES = [
    (128, 256, 2, 1, "cooperative"), (128, 256, 1, 2, "cooperative"), (256, 128, 2, 1, "cooperative"),
    (256, 128, 1, 2, "cooperative"), (128, 128, 1, 1, "cooperative"), (128, 128, 2, 1, "cooperative"),
    (128, 192, 1, 1, "cooperative"), (128, 128, 1, 1, "pingpong"), (64, 256, 1, 1, "pingpong"),
    # few-tile problems (1024^3, 64-row skinny): more, smaller tiles
    (64, 64, 1, 1, "pingpong"), (64, 128, 1, 1, "pingpong"), (128, 64, 1, 1, "cooperative"),
    # large squares: swizzled rasterization for L2 reuse between concurrent tiles
    (128, 256, 2, 1, "cooperative", 2), (128, 256, 2, 1, "cooperative", 4), (256, 128, 1, 2, "cooperative", 4),
]
# The stream-K sweep: every tile with each decomposition; its data_parallel
# rows (and regular kernels of the same tiles) are the baseline it is judged
# against. CUTLASS's stream-K scheduler runs the cooperative schedule only.
STREAM_K_TILES = [(128, 256, 2, 1), (128, 256, 1, 2), (256, 128, 2, 1), (128, 128, 1, 1), (128, 64, 1, 1)]
STREAM_K_MODES = [("hybrid", "linear"), ("stream_k", "linear"), ("stream_k", "atomic"), ("data_parallel", "linear")]
GROUPED_TILES = [  # as REGULAR_TILES
    (128, 256, 2, 1, "cooperative"), (128, 256, 1, 2, "cooperative"), (128, 128, 2, 1, "cooperative"),
    (128, 128, 1, 1, "cooperative"), (256, 128, 2, 1, "cooperative"), (128, 256, 1, 1, "cooperative"),
    (128, 128, 1, 1, "pingpong"), (64, 256, 1, 1, "pingpong"),
    # ping-pong tiles sharing B (2x1) or A (1x2) across a cluster, and N=768 in 4 tiles
    (64, 256, 2, 1, "pingpong"), (64, 256, 1, 2, "pingpong"), (128, 192, 2, 1, "cooperative"),
    (64, 256, 1, 1, "pingpong", 4), (128, 256, 2, 1, "cooperative", 4),
]


def regular_sweep():
    return [KernelConfig.create(variant="regular", tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn,
                                schedule=s, swizzle=sw[0] if sw else 1, **BF16)
            for m, n, cm, cn, s, *sw in REGULAR_TILES]


def stream_k_sweep():
    return [KernelConfig.create(variant="stream_k", tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn,
                                decomposition=dec, reduction=red, **BF16)
            for m, n, cm, cn in STREAM_K_TILES for dec, red in STREAM_K_MODES]


def same_tiles(config, other) -> bool:
    """Whether two configs share tile, cluster, schedule and swizzle (differing in variant only)."""
    keys = ("tile_m", "tile_n", "tile_k")
    return (all(getattr(config, k) == getattr(other, k) for k in keys)
            and config.target_params == other.target_params)


def grouped_sweep():
    return [KernelConfig.create(variant="grouped", tile_m=m, tile_n=n, cluster_m=cm, cluster_n=cn,
                                schedule=s, swizzle=sw[0] if sw else 1, **BF16)
            for m, n, cm, cn, s, *sw in GROUPED_TILES]


def test_configs():
    """What tests/test_cuda_gpu.py runs: explicit configs plus the variants'
    defaults the selection may pick."""
    from dispatcher.plugins import get_manager

    tile = dict(target="cuda", tile_m=128, tile_n=128, cluster_m=1)
    out = []
    for dtype in ("bf16", "fp16"):
        for layout in ("rcr", "rrr", "crr", "ccr"):
            out.append(KernelConfig.create(dtype=dtype, layout=layout, tile_k=64, **tile))
        out.append(KernelConfig.create(variant="grouped", dtype=dtype, layout="rcr", tile_k=64, **tile))
    for dtype in ("fp8_e4m3", "fp8_e5m2"):
        out.append(KernelConfig.create(dtype=dtype, layout="rcr", tile_k=128, **tile))
    for dec, splits in (("hybrid", 1), ("stream_k", 1), ("split_k", 3), ("data_parallel", 1)):
        for red in ("linear", "atomic"):
            out.append(KernelConfig.create(variant="stream_k", dtype="bf16", layout="rcr", tile_k=64,
                                           decomposition=dec, splits=splits, reduction=red, **tile))
    for variant, dtype, layout in (("regular", "bf16", "rrr"), ("regular", "fp16", "rrr"),
                                   ("stream_k", "bf16", "rrr"), ("regular", "bf16", "rcr")):
        record = get_manager().variant(variant)
        for fields in record.default_configs("cuda", dtype, layout):
            out.append(KernelConfig.create(variant=variant, target="cuda", dtype=dtype, layout=layout,
                                           **fields))
    return out


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
    return list({c.name: c for c in out}.values())


def smoke():
    return [c for c in regular_sweep()[:1] + stream_k_sweep()[:2] + grouped_sweep()[:1]]


def everything():
    seen = {}
    for c in test_configs() + batched_configs() + regular_sweep() + stream_k_sweep() + grouped_sweep():
        seen[c.name] = c
    return list(seen.values())


SETS = {"smoke": smoke, "tests": test_configs, "batched": batched_configs, "bench": lambda: regular_sweep() + stream_k_sweep() + grouped_sweep(),
        "all": everything}
