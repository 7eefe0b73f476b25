"""The fused activations of the CPU epilogue, value by value, against float64.

Each activation runs in a real kernel, built for every ISA this machine runs
(vec_math.hpp: vectorized exp and normal CDF, with GCC vector extensions of
the ISA's width): out = act(a @ b + bias) with zero a and b, so each output
is act(bias[j]) of one float32 input, over a dense grid, magnitudes across
the whole float32 range (subnormals included), and NaN and infinities. The
relative error against the float64 value of the same float32 input stays
within 4 x 2^-23, the output-rounding share of `dtypes.relative_tolerance`
for fp32, so a fused activation needs no tolerance rule of its own. Below
the smallest normal float the error is measured against it.

The slow test scans 598 million float32 inputs per ISA (every one with |x|
in [2^-24, 2^8)) through `tests/native/activation_scan.cpp`, the bound
docs/architecture.md states.
"""

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes
from dispatcher.targets import cpu_isa
from dispatcher.targets.cpu import Toolchain
from dispatcher.targets.toolchain import NATIVE_DIR

# Many kernels built per ISA: CI runs them after the fast suite (-m kernels).
pytestmark = pytest.mark.kernels

ISAS = [isa.name for isa in cpu_isa.supported()]
FLT_MIN = float(np.finfo(np.float32).tiny)
BOUND = 4 * 2.0**-23
assert BOUND <= dtypes.relative_tolerance("fp32", 1)
# An output no activation below gives (gelu >= -0.17, silu >= -0.28, relu >= 0),
# so an element the kernel did not write is seen.
SENTINEL = -1.0
# Tiles every ISA's micro-tile divides; the last tile of a row is partial.
TILES = dict(tile_m=24, tile_n=64, tile_k=32)

_erfc = np.vectorize(math.erfc, otypes=[np.float64])
REFERENCE = {  # float64, from the float32 input
    "relu": lambda x: np.where(np.isnan(x), np.nan, np.maximum(x, 0.0)),
    "gelu": lambda x: 0.5 * x * _erfc(-x / math.sqrt(2.0)),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}


def finite_inputs() -> np.ndarray:
    tiny = np.finfo(np.float32).smallest_subnormal
    magnitudes = np.geomspace(float(tiny), float(np.finfo(np.float32).max), 6000)
    edges = [0.0, -0.0, 0.75, -0.75, 14.5, -14.5, 88.72, -88.72, 104.0, -104.0, 150.0, -150.0]
    x = np.concatenate([np.linspace(-20.0, 20.0, 40001), magnitudes, -magnitudes, edges])
    return x.astype(np.float32)


def run(x: np.ndarray, activation: str, isa: str) -> np.ndarray:
    """act(x) per element through the kernel's epilogue (a per-column bias)."""
    n = x.size
    a, b = np.zeros((1, 1), np.float32), np.zeros((1, n), np.float32)
    out = np.full((1, n), SENTINEL, np.float32)
    dispatcher.matmul(a, b, out=out, bias=x, activation=activation, config={"isa": isa, **TILES})
    return out[0]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_activation_within_four_ulps_of_float64(activation, isa):
    finite = finite_inputs()
    x = np.concatenate([finite, np.array([np.nan, -np.inf, np.inf], np.float32)])
    out = run(x, activation, isa)
    got, nan, neg_inf, pos_inf = out[:finite.size], *out[finite.size:]

    with np.errstate(over="ignore"):
        expected = REFERENCE[activation](finite.astype(np.float64))
    error = np.abs(got - expected) / np.maximum(np.abs(expected), FLT_MIN)
    worst = int(np.argmax(error))
    assert error[worst] <= BOUND, (f"{activation} on {isa}: relative error {error[worst]:.3g} "
                                   f"at x = {finite[worst]!r} (got {got[worst]!r}, "
                                   f"float64 {expected[worst]!r})")
    assert np.isnan(nan)
    assert (neg_inf, pos_inf) == (0.0, np.inf)  # the limits


def test_integer_kernels_take_the_double_path(rng):
    """int8 -> int32: the epilogue computes in double (exact for int32) and
    rounds once; gelu of negative sums is tiny, not 1 + erf's cancellation."""
    a = rng.integers(-128, 128, (6, 40)).astype(np.int8)
    b = rng.integers(-128, 128, (40, 9)).astype(np.int8)
    out = np.full((6, 9), np.iinfo(np.int32).min, np.int32)
    dispatcher.matmul(a, b, out=out, activation="gelu")
    acc = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_array_equal(out, np.rint(REFERENCE["gelu"](acc)).astype(np.int32))


@pytest.mark.slow
@pytest.mark.parametrize("isa", ISAS)
def test_scan_of_598_million_inputs_within_four_ulps(isa, tmp_path):
    spec = cpu_isa.get(isa)
    scan = tmp_path / "activation_scan"
    subprocess.run([Toolchain.find(isa).compiler, "-O3", *spec.march, "-fopenmp", "-std=c++17",
                    f"-DVEC_BYTES={spec.isa.vector_bytes}", f"-I{NATIVE_DIR}",
                    str(Path(__file__).parent / "native" / "activation_scan.cpp"), "-o", str(scan)],
                   check=True, timeout=300)
    lines = subprocess.run([str(scan)], check=True, capture_output=True, text=True,
                           timeout=1800).stdout.split("\n")
    for function, error, x, wrong_specials in (line.split() for line in lines if line):
        assert float(error) <= BOUND, f"{function} on {isa}: {float(error):.3g} at x = {x}"
        assert wrong_specials == "0", f"{function} on {isa}: {wrong_specials} wrong NaN or inf results"
