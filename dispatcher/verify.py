"""Test inputs and the float64 reference every correctness check uses.

Inputs are generated in float64, quantized to the dtype under test, and the
reference is computed in float64 on those same quantized values, so the
only differences left are the kernel's accumulation and output rounding.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from . import dtypes
from .memory import poison  # noqa: F401  (the tests' and tools' poison, with the inputs)


def random_matrix(rows: int, cols: int, dtype, layout: str = "r", rng=None) -> np.ndarray:
    """A (rows, cols) matrix of `dtype`, row- ('r') or column-major ('c')."""
    rng = rng if rng is not None else np.random.default_rng(0)
    d = dtypes.get(dtype)
    if d.acc == "int32":
        values = rng.integers(-8, 9, size=(rows, cols))
    else:
        values = rng.uniform(-2.0, 2.0, size=(rows, cols))
    x = values.astype(d.numpy)
    return np.asfortranarray(x) if layout == "c" else np.ascontiguousarray(x)


@functools.lru_cache(maxsize=None)
def _blas():
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


_ERFC = np.vectorize(math.erfc, otypes=[np.float64])

# The fused activations in float64 (`dispatcher.epilogue`): gelu with the
# exact erf (as erfc, which keeps its tiny values for negative inputs).
ACTIVATION_REFERENCE = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * _ERFC(-x / math.sqrt(2.0)),
    "silu": lambda x: x / (1.0 + np.exp(np.minimum(-x, 700.0))),  # (exp(710) overflows)
}


def reference(a, b, c=None, alpha=1.0, beta=0.0, bias=None, activation="none") -> np.ndarray:
    """activation(alpha * a @ b + beta * c + bias) in float64, on one BLAS
    thread: a threaded BLAS leaves its threads spinning for a while after a
    call, and a kernel timed next would share the cores with them (2x slower
    on 2 cores). bias: (N,) per column or (M, 1) per row."""
    with _blas().limit(limits=1, user_api="blas"):
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    if beta:
        ref = ref + beta * c.astype(np.float64)
    if bias is not None:
        ref = ref + np.asarray(bias, np.float64)
    return ACTIVATION_REFERENCE[activation](ref)


def epilogue_operands(fixed: dict, m: int, n: int, dtype, rng) -> tuple:
    """({bias: array}, {other option: value}) of a call whose problem fixes
    `fixed` (a sweep's fused epilogue): the bias operand its `bias` option
    implies, random values in `dtype` (the output's), (N,) per column or
    (M, 1) per row; every other option as the call's choice."""
    choices = dict(fixed)
    side = choices.pop("bias", "none")
    if side == "none":
        return {}, choices
    if side == "col":
        return {"bias": random_matrix(1, n, dtype, "r", rng).reshape(n)}, choices
    return {"bias": random_matrix(m, 1, dtype, "r", rng)}, choices


def max_rel(out, ref) -> float:
    """max|out - ref| / max|ref| (0 for an all-zero reference that is matched)."""
    out = np.asarray(out, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"shape {out.shape} != reference {ref.shape}")
    if out.size == 0:
        return 0.0
    if not np.all(np.isfinite(out)):
        return float("inf")
    scale = float(np.max(np.abs(ref)))
    err = float(np.max(np.abs(out - ref)))
    return err / scale if scale else err


def tolerance(config, k: int) -> float:
    """The max_rel a correct kernel of `config` stays within at depth K."""
    from .plugins import get_manager
    splits = get_manager().variant(config.variant).partial_sums(config)
    return dtypes.relative_tolerance(config.dtype_c, k, splits)
