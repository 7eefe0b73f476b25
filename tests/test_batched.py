"""Declared problem kinds on the CPU: `dispatcher.matmul` with numpy matmul
semantics (batched variant: broadcast batch dims, any strides), `dispatcher.run`,
and the fused epilogues (bias per row or column, relu/gelu/silu, fp8 scales)
on `regular` and `batched`, each against a float64 reference on the same
quantized inputs, into poisoned outputs."""

import math

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes
from dispatcher.verify import max_rel, poison, random_matrix

# Small tiles: several blocks and partial edge blocks per matrix.
SMALL = dict(tile_m=24, tile_n=64, tile_k=32)
ACTIVATIONS = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}


def batch_of(shape, dtype, rng, layout="r"):
    """Random matrices of `dtype` stacked to `shape` (..., rows, cols)."""
    count = math.prod(shape[:-2])
    mats = [random_matrix(*shape[-2:], dtype, layout, rng) for _ in range(count)]
    x = np.stack(mats).reshape(shape)
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2) if layout == "c" else x


def ref(a, b, bias=None, activation="none", alpha=1.0):
    out = alpha * np.matmul(a.astype(np.float64), b.astype(np.float64))
    if bias is not None:
        out = out + bias.astype(np.float64)
    return ACTIVATIONS[activation](out)


def poisoned(shape, dtype):
    return poison(np.empty(shape, dtypes.output_for(dtype).numpy))


def close(out, expected, dtype, k):
    return max_rel(out, expected) <= dtypes.relative_tolerance(dtypes.output_for(dtype).token, k)


@pytest.mark.parametrize("shape_a, shape_b", [
    ((5, 37, 29), (5, 29, 41)),          # plain batch
    ((3, 37, 29), (29, 41)),             # b broadcast (one B for all)
    ((37, 29), (4, 29, 41)),             # a broadcast
    ((2, 1, 20, 16), (3, 16, 24)),       # batch dims broadcast both ways: several launches
    ((2, 3, 1, 16), (2, 3, 16, 1)),      # M = N = 1
])
def test_matmul_follows_numpy(shape_a, shape_b, rng):
    a, b = batch_of(shape_a, "fp32", rng), batch_of(shape_b, "fp32", rng)
    expected = ref(a, b)
    out = poison(np.empty(expected.shape, np.float32))
    assert dispatcher.matmul(a, b, out=out, config=SMALL) is out
    assert close(out, expected, "fp32", a.shape[-1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "int8", "fp8_e4m3"])
def test_batched_dtypes_and_strided_views(dtype, rng):
    # a: column-major matrices; b: every other batch of a larger array; out: row-major view
    a = batch_of((4, 33, 47), dtype, rng, layout="c")
    b = batch_of((8, 47, 30), dtype, rng)[::2]
    big = poisoned((4, 33, 40), dtype)
    out = big[:, :, 5:35]
    dispatcher.matmul(a, b, out=out, config=SMALL)
    assert close(out, ref(a, b), dtype, 47)
    assert np.all(np.isnan(big[:, :, :5])) or np.issubdtype(big.dtype, np.integer)


def test_column_major_out_is_run_transposed(rng):
    a, b = batch_of((3, 21, 18), "fp32", rng), batch_of((3, 18, 26), "fp32", rng)
    bias = random_matrix(1, 26, "fp32", "r", rng)[0]
    out = np.swapaxes(poison(np.empty((3, 26, 21), np.float32)), -1, -2)  # column-major matrices
    dispatcher.matmul(a, b, out=out, bias=bias, activation="relu", config=SMALL)
    assert close(out, ref(a, b, bias, "relu"), "fp32", 18)


def test_matmul_routes_2d_to_regular_and_vectors_like_numpy(rng):
    a, b = random_matrix(40, 30, "fp32", "r", rng), random_matrix(30, 20, "fp32", "c", rng)
    assert close(dispatcher.matmul(a, b, config=SMALL), ref(a, b), "fp32", 30)
    v = random_matrix(1, 30, "fp32", "r", rng)[0]
    assert dispatcher.matmul(v, b).shape == np.matmul(v, b).shape == (20,)
    assert close(dispatcher.matmul(a, v), ref(a, v[:, None])[:, 0], "fp32", 30)
    d = dispatcher.Dispatcher()
    dispatcher.matmul(a, b, dispatcher=d)
    assert {p.variant for p in d._selected} == {"regular"}
    dispatcher.matmul(a[None], b, dispatcher=d)
    assert {p.variant for p in d._selected} == {"regular", "batched"}


# Each activation on each variant, each with one bias orientation (and both
# orientations on each variant): 8 kernels, not 16. The fast suite runs four
# of them, each activation once, each variant and orientation twice; the slow
# step the rest.
_slow = pytest.mark.slow
EPILOGUES = [("regular", "col", "gelu"), ("regular", "row", "relu"),
             pytest.param("regular", "col", "silu", marks=_slow), pytest.param("regular", "row", "none", marks=_slow),
             ("batched", "col", "none"), pytest.param("batched", "row", "gelu", marks=_slow),
             pytest.param("batched", "col", "relu", marks=_slow), ("batched", "row", "silu")]


@pytest.mark.parametrize("variant, per, activation", EPILOGUES)
def test_fused_epilogues(variant, per, activation, rng):
    batch = (3,) if variant == "batched" else ()
    m, n, k = 37, 45, 29
    a, b = batch_of(batch + (m, k), "bf16", rng), batch_of(batch + (k, n), "bf16", rng)
    bias = random_matrix(1, n, "bf16", "r", rng)[0] if per == "col" else random_matrix(m, 1, "bf16", "r", rng)
    out = poisoned(batch + (m, n), "bf16")
    dispatcher.run(variant, a=a, b=b, out=out, bias=bias, activation=activation, alpha=0.75,
                   config=SMALL)
    assert close(out, ref(a, b, bias, activation, 0.75), "bf16", k)
    # one output row, then one output column (tile_gemm.hpp's vector products), the same kernel
    for m, n in ((1, 150), (150, 1)):
        a, b = batch_of(batch + (m, k), "bf16", rng), batch_of(batch + (k, n), "bf16", rng, "c")
        bias = random_matrix(1, n, "bf16", "r", rng)[0] if per == "col" else random_matrix(m, 1, "bf16", "r", rng)
        out = poisoned(batch + (m, n), "bf16")
        dispatcher.run(variant, a=a, b=b, out=out, bias=bias, activation=activation, alpha=0.75, config=SMALL)
        assert close(out, ref(a, b, bias, activation, 0.75), "bf16", k), (m, n)


@pytest.mark.parametrize("per", ["col", "row"])
def test_strided_bias_across_several_tiles(per, rng):
    """A bias that is a strided view, on an output of several tiles each way:
    each tile reads its own rows or columns of it (a column bias is gathered
    once per tile)."""
    m, n, k = 61, 150, 40
    a, b = random_matrix(m, k, "fp32", "r", rng), random_matrix(k, n, "fp32", "c", rng)
    length = n if per == "col" else m
    bias = random_matrix(1, 3 * length, "fp32", "r", rng)[0][::3]
    bias = bias if per == "col" else bias[:, None]
    out = poisoned((m, n), "fp32")
    dispatcher.matmul(a, b, bias=bias, activation="silu", alpha=0.5, out=out, config=SMALL)
    assert close(out, ref(a, b, bias, "silu", 0.5), "fp32", k)


def test_batched_bias_and_int32_epilogue(rng):
    a, b = batch_of((2, 19, 23), "int8", rng), batch_of((2, 23, 17), "int8", rng)
    bias = batch_of((2, 1, 17), "int32", rng)
    out = dispatcher.matmul(a, b, bias=bias, activation="relu", config=SMALL)
    assert out.dtype == np.int32 and np.array_equal(out, ref(a, b, bias, "relu"))


def test_fp8_per_tensor_scales(rng):
    a, b = batch_of((2, 30, 64), "fp8_e4m3", rng), batch_of((64, 20), "fp8_e4m3", rng)
    out = dispatcher.matmul(a, b, scale_a=0.5, scale_b=3.0, activation="silu", config=SMALL)
    assert close(out, ref(a, b, activation="silu", alpha=1.5), "fp8_e4m3", 64)


def test_the_epilogue_is_in_the_kernel_name(rng):
    d = dispatcher.Dispatcher(tuning=None)
    a, b = batch_of((2, 8, 8), "fp32", rng), batch_of((8, 8), "fp32", rng)
    dispatcher.matmul(a, b, bias=np.ones(8, np.float32), activation="gelu", dispatcher=d)
    (config,) = d._selected.values()
    assert config.name.endswith("_batched_biascol_gelu")
    assert config.variant_params == {"bias": "col", "activation": "gelu"}


@pytest.mark.parametrize("call, error, match", [
    (lambda a, b: dispatcher.matmul(a, b[:5]), dispatcher.ProblemError, "inner dimensions differ"),
    (lambda a, b: dispatcher.matmul(a[:2], b[None].repeat(3, 0)), dispatcher.ProblemError, "do not broadcast"),
    (lambda a, b: dispatcher.matmul(a, b, bias=np.ones((6, 7), np.float32)), dispatcher.ProblemError,
     "not a full matrix"),
    (lambda a, b: dispatcher.matmul(a, b, bias=np.ones(5, np.float32)), dispatcher.ProblemError, "N dim is 5"),
    (lambda a, b: dispatcher.matmul(a, b, bias=np.ones(7, np.float16)), dispatcher.DtypeError,
     "takes it as fp32"),
    (lambda a, b: dispatcher.matmul(a, b, activation="tanh"), dispatcher.ConfigError, "allowed"),
    (lambda a, b: dispatcher.matmul(a, b, activation=["gelu"]), dispatcher.ConfigError, "allowed"),
    (lambda a, b: dispatcher.matmul(a, b, out_dtype=["fp32"]), dispatcher.DtypeError, "unknown dtype"),
    (lambda a, b: dispatcher.matmul(a, b, scale_a=0.0), dispatcher.ProblemError, "nonzero"),
    (lambda a, b: dispatcher.run("regular", a=a, b=b), dispatcher.ProblemError, "takes a matrix a"),
    (lambda a, b: dispatcher.run("batched", a=a, b=b, gamma=1), dispatcher.ProblemError, "no argument"),
    (lambda a, b: dispatcher.run("grouped", a=a, b=b), dispatcher.ConfigError, "declares no operands"),
    (lambda a, b: dispatcher.gemm(a, a, variant="batched"), dispatcher.ConfigError,
     "runs batched problems: call dispatcher.run or dispatcher.matmul"),
    (lambda a, b: dispatcher.gemm(a, b), dispatcher.ProblemError, r"for batches use dispatcher.matmul"),
    (lambda a, b: dispatcher.matmul(a, b, out=np.broadcast_to(np.empty((6, 7), np.float32), (3, 6, 7))),
     dispatcher.ProblemError, "read-only"),
    (lambda a, b: dispatcher.matmul(a, b, out=np.lib.stride_tricks.as_strided(
        np.empty((6, 7), np.float32), (3, 6, 7), (0, 28, 4), writeable=True)),
     dispatcher.ProblemError, "batches would overlap"),
    (lambda a, b: dispatcher.matmul(a, b, out=a[:, :, :7]), dispatcher.AliasingError, "overlaps a"),
])
def test_bad_calls_get_specific_errors(call, error, match, rng):
    a, b = batch_of((3, 6, 9), "fp32", rng), random_matrix(9, 7, "fp32", "r", rng)
    with pytest.raises(error, match=match):
        call(a, b)


def test_zero_sizes(rng):
    a, b = np.ones((0, 4, 3), np.float32), batch_of((3, 5), "fp32", rng)
    assert dispatcher.matmul(a, b).shape == (0, 4, 5)
    out = dispatcher.matmul(np.ones((2, 4, 0), np.float32), np.ones((0, 5), np.float32))
    assert out.shape == (2, 4, 5) and not out.any()


@pytest.mark.parametrize("shape_a, shape_b", [((80, 13, 9), (80, 9, 11)), ((40, 50, 33), (33, 70))])
def test_many_tiles_on_two_workers(shape_a, shape_b, rng):
    """Enough tiles for the dynamic schedule and the prefetch of each next tile."""
    a, b = batch_of(shape_a, "fp16", rng), batch_of(shape_b, "fp16", rng)
    bias = random_matrix(shape_a[-2], 1, "fp16", "r", rng)
    out = poisoned(a.shape[:-1] + b.shape[-1:], "fp16")
    dispatcher.matmul(a, b, out=out, bias=bias, activation="silu", config=SMALL, options={"workers": 2})
    assert close(out, ref(a, b, bias, "silu"), "fp16", shape_a[-1])
