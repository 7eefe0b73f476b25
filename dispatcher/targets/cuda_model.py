"""Estimated run time of a CUDA config on a problem, with no GPU needed.

NVIDIA's `nvidia-matmul-heuristics` (PyPI) models Hopper and CUTLASS 3
kernels analytically: given a problem and a kernel configuration (CTA tile,
cluster, split-K, swizzle) it estimates the run time on a named GPU. It
knows the CTA tiles of its own CUTLASS 3 space (the warp and instruction
shapes below were read from its proposals), so a config outside that space
gets no estimate (None) and selection ranks it by the core's occupancy
model instead. Without the package every estimate is None.

The model ranks the output tile, cluster, split-K and swizzle; its K tile
is fixed per precision (`_MODEL_TILE_K`, what its proposals use), and the
catalogs build the K tile that measured faster (see
`CudaTarget.default_tile_k`).
"""

from __future__ import annotations

import ctypes
import functools

# Precision strings of the model: A/B, compute, C.
_PRECISION = {("bf16", "bf16"): "BSB", ("fp16", "fp16"): "HSH", ("bf16", "fp32"): "BSS",
              ("fp16", "fp32"): "HSS", ("fp8_e4m3", "bf16"): "QSB", ("fp8_e4m3", "fp16"): "QSH",
              ("fp8_e5m2", "bf16"): "QSB", ("fp8_e5m2", "fp16"): "QSH"}

# The K tile of the model's proposals, by input dtype.
_MODEL_TILE_K = {"bf16": 128, "fp16": 64, "fp8_e4m3": 128, "fp8_e5m2": 128}

# CTA tile -> (warp tile, instruction tile) as the model's own proposals give them.
_SHAPES = {
    (64, 128, 128): ((64, 32, 64), (64, 8, 32)), (64, 256, 128): ((64, 64, 64), (64, 8, 32)),
    (256, 128, 128): ((64, 64, 64), (64, 8, 32)), (128, 128, 128): ((64, 64, 128), (64, 8, 32)),
    (128, 256, 128): ((64, 64, 128), (64, 8, 32)), (64, 192, 128): ((64, 32, 128), (64, 8, 16)),
    (128, 128, 64): ((64, 64, 64), (64, 8, 16)), (128, 256, 64): ((64, 64, 64), (64, 8, 16)),
    (256, 128, 64): ((64, 64, 64), (64, 8, 16)), (128, 64, 64): ((64, 32, 32), (64, 8, 16)),
    (64, 128, 64): ((64, 32, 32), (64, 8, 16)), (64, 64, 64): ((64, 16, 64), (64, 8, 16)),
    (64, 192, 64): ((64, 32, 64), (64, 8, 16)), (64, 256, 64): ((64, 64, 64), (64, 8, 16)),
    (256, 64, 64): ((64, 64, 64), (64, 8, 16)),
}

# Layout of the model's row-major problem: A transposed, B transposed.
_LAYOUTS = {"rr": "NN_ROW_MAJOR", "rc": "NT_ROW_MAJOR", "cr": "TN_ROW_MAJOR", "cc": "TT_ROW_MAJOR"}

NAME = "nvidia-matmul-heuristics (H200_SXM)"


@functools.lru_cache(maxsize=None)
def _model():
    """The model's interface for an H200, or None when the package is absent."""
    try:
        import nvMatmulHeuristics as nvmmh
    except (ImportError, OSError):
        return None
    return nvmmh, nvmmh.NvMatmulHeuristicsInterfaceEx(
        backend=nvmmh.NvMatmulHeuristicsTarget.CUTLASS3, gpu=nvmmh.NvMatmulHeuristicsNvidiaGpu.H200_SXM)


def available() -> bool:
    return _model() is not None


@functools.lru_cache(maxsize=65536)
def estimate_us(m: int, n: int, k: int, layout: str, dtype: str, out_dtype: str, tile_mn: tuple,
                cluster: tuple, splits: int = 1, swizzle: int = 1, along_m: bool = False):
    """Microseconds the model expects for one (m, n, k) GEMM with this output
    tile (its K tile the model's own), or None when the model is absent or
    does not know the config. along_m: tiles handed out down C's columns
    (the model's column-major CTA order), else along its rows."""
    found = _model()
    precision = _PRECISION.get((dtype, out_dtype))
    tile = (*tile_mn, _MODEL_TILE_K.get(dtype, 0))
    shapes = _SHAPES.get(tile)
    if found is None or precision is None or shapes is None or min(m, n, k) < 1:
        return None
    nvmmh, model = found
    layout_enum = getattr(nvmmh.NvMatmulHeuristicsMatmulLayout, _LAYOUTS[layout[:2]])
    problem = model.makeNvMatmulHeuristicsProblem(m, n, k, layout_enum)
    model._ensure_discovery_loaded(model.target, precision, problem.matmulLayout)
    kernel = model.nvmmhKernelConfiguration()
    (warp, instr) = shapes
    for i in range(3):
        kernel.cta[i], kernel.warp[i], kernel.instr[i] = tile[i], warp[i], instr[i]
    kernel.splitK, kernel.loadStages, kernel.gridSwizzle, kernel.ctaOrder = splits, 0, swizzle, int(along_m)
    kernel.cluster[0], kernel.cluster[1] = cluster
    seconds = model.nvMatmulHeuristicsEstimateRuntime(
        model.handle, precision.encode(), ctypes.c_int(model.target), ctypes.byref(problem),
        ctypes.byref(kernel), model.hardware_descriptor)
    return seconds * 1e6 if seconds > 0 else None
