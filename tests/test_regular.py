"""Regular GEMM on the CPU: every dtype x layout against a float64 reference
(the fast suite runs a Latin square of it: see conftest.parity_grid)."""

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes
from dispatcher.verify import max_rel, poison, random_matrix, reference, tolerance

from conftest import parity_grid  # noqa: E402

LAYOUTS = ("rcr", "rrr", "crr", "ccr")
# Small tiles so that these shapes cover several blocks, partial edge blocks
# and several K blocks; 61x200x71 has four column tiles, so its A is packed
# once for all of them (tile_gemm.hpp's SharedPackedA).
SMALL = dict(tile_m=24, tile_n=64, tile_k=32)
SHAPES = [(37, 53, 71), (96, 128, 64), (1, 1, 1), (131, 7, 257), (61, 200, 71)]


def run_checked(a, b, variant="regular", config=SMALL, **kw):
    out_dtype = dtypes.output_for(dtypes.get(a.dtype).token, kw.pop("out_dtype", None))
    out = poison(np.empty((a.shape[0], b.shape[1]), out_dtype.numpy))
    dispatcher.gemm(a, b, out=out, variant=variant, config=config, **kw)
    return out


def check_small_config(dtype, layout, cases, scaled, rng):
    """The SMALL config of `dtype` and `layout` on each ((m, n, k), workers)
    of `cases` against float64, poisoned outputs; then, where outputs do not
    round (int32 does: test_reliability.py), alpha and beta with c on the
    (m, n, k) `scaled` on the same kernel."""
    config = dispatcher.KernelConfig.create(dtype=dtype, layout=layout, **SMALL)
    for (m, n, k), workers in cases:
        a = random_matrix(m, k, dtype, layout[0], rng)
        b = random_matrix(k, n, dtype, layout[1], rng)
        out = run_checked(a, b, config=config, options={"workers": workers})
        assert max_rel(out, reference(a, b)) <= tolerance(config, k), (dtype, layout, (m, n, k))
    if dtypes.get(dtype).acc != "int32":
        m, n, k = scaled
        a, b = random_matrix(m, k, dtype, layout[0], rng), random_matrix(k, n, dtype, layout[1], rng)
        c = random_matrix(m, n, dtypes.output_for(dtype).token, "r", rng)
        out = dispatcher.gemm(a, b, c=c, alpha=0.5, beta=-2.0, config=config)
        assert max_rel(out, reference(a, b, c, 0.5, -2.0)) <= tolerance(config, k)


@pytest.mark.parametrize("dtype, layout", parity_grid("regular", dtypes.INPUT_TOKENS, LAYOUTS))
def test_every_dtype_and_layout(dtype, layout, rng):
    for m, n, k in SHAPES:
        a = random_matrix(m, k, dtype, layout[0], rng)
        b = random_matrix(k, n, dtype, layout[1], rng)
        out = run_checked(a, b)
        ref = reference(a, b)
        config = dispatcher.KernelConfig.create(dtype=dtype, layout=layout, **SMALL)
        assert max_rel(out, ref) <= tolerance(config, k), (dtype, layout, (m, n, k))


@pytest.mark.parametrize("dtype, layout", parity_grid("regular", dtypes.INPUT_TOKENS, LAYOUTS))
def test_one_output_row_or_column_every_dtype_and_layout(dtype, layout, rng):
    """A vector times a matrix and a matrix times a vector (tile_gemm.hpp's
    vector_product: no packing; dot products where the matrix runs along K,
    else scaled sums of its lines), read in the config's layout (so every
    stride of the vector and of the matrix is taken): runs of output lines
    longer than a tile, several runs on four workers, against float64;
    alpha and beta with c on the same kernel."""
    shapes = ((1, 300, 129), (300, 1, 129), (1, 2600, 40), (2600, 1, 7), (1, 1, 300))
    check_small_config(dtype, layout, [(s, 4) for s in shapes], (1, 700, 50), rng)


@pytest.mark.parametrize("dtype, layout", parity_grid("regular", ("fp32", "bf16", "int8"), ("rrr", "rcr", "crr")))
def test_one_tile_row_runs_k_blocks_outermost(dtype, layout, rng):
    """M within one block tile, several K blocks and column tiles: each thread
    runs K blocks outermost over its column tiles (tile_gemm.hpp's
    compute_row_run), in groups of tiles whose accumulators fit
    kRowRunAccBytes (5773 columns of 64: 91 tiles, groups of 42 on each of two
    workers), row-major B and column-major A packed by rows
    (pack_slivers_by_rows) and column-major B transposed in registers, with
    partial slivers, a partial last K block and an odd K (a k group of two
    int8 values half full); alpha and beta with c on the same kernel."""
    cases = [((20, 5773, 101), 2), ((5, 300, 65), 1), ((24, 200, 64), 4)]
    check_small_config(dtype, layout, cases, (9, 700, 70), rng)


@pytest.mark.parametrize("dtype, layout", parity_grid("regular", ("fp32", "bf16"), LAYOUTS))
def test_rows_enough_for_every_thread_share_b_panels(dtype, layout, rng):
    """At least 512 output rows a thread, a float output, beta 0 and two K
    blocks or more: K blocks outermost over the whole output, one B panel per
    K block packed by all the threads and shared, the sums kept in C
    (tile_gemm.hpp's compute_shared_panels), on one, two and three workers,
    with partial micro-tiles at C's edges, a partial last K block, a second
    column chunk (2100 columns: panels of 2048 at tile_k 256) and the fused
    bias, activation and alpha applied to C after the last K block; poisoned
    outputs against float64 on the same inputs."""
    config = dispatcher.KernelConfig.create(dtype=dtype, layout=layout, dtype_c="fp32", **SMALL)
    wide = config.replace(tile_k=256)
    for (m, n, k), workers, cfg in [((1100, 77, 150), 2, config), ((530, 45, 70), 1, config),
                                    ((1601, 40, 100), 3, config), ((1030, 2100, 300), 2, wide)]:
        a = random_matrix(m, k, dtype, layout[0], rng)
        b = random_matrix(k, n, dtype, layout[1], rng)
        out = run_checked(a, b, config=cfg, out_dtype="fp32", options={"workers": workers})
        assert max_rel(out, reference(a, b)) <= tolerance(cfg, k), (dtype, layout, (m, n, k), workers)
    m, n, k = 1040, 70, 90
    a, b = random_matrix(m, k, dtype, layout[0], rng), random_matrix(k, n, dtype, layout[1], rng)
    bias = random_matrix(1, n, "fp32", "r", rng)[0]
    out = poison(np.empty((m, n), np.float32))
    dispatcher.matmul(a, b, bias=bias, activation="gelu", alpha=0.5, out=out,
                      config=config.replace(bias="col", activation="gelu"),
                      options={"workers": 2})
    ref = reference(a, b, alpha=0.5, bias=bias, activation="gelu")
    assert max_rel(out, ref) <= tolerance(config, k), (dtype, layout, "bias + gelu")


@pytest.mark.parametrize("out_dtype", ["fp32", "bf16"])
def test_fp8_output_dtype_choice(out_dtype, rng):
    a = random_matrix(45, 33, "fp8_e5m2", "r", rng)
    b = random_matrix(33, 29, "fp8_e5m2", "c", rng)
    out = run_checked(a, b, out_dtype=out_dtype)
    assert out.dtype == dtypes.get(out_dtype).numpy
    assert max_rel(out, reference(a, b)) <= dtypes.relative_tolerance(out_dtype, 33)


# (an FNUZ encoding in CI's slow step, as in the parity grid: its kernel differs from fp8_e4m3's by a decode table)
@pytest.mark.parametrize("dtype,expected", [("fp8_e4m3", "fp16"),
                                            pytest.param("fp8_e5m2fnuz", "fp16", marks=pytest.mark.slow),
                                            ("int8", "int32"), ("bf16", "bf16")])
def test_default_output_dtypes_follow_ck(rng, dtype, expected):
    a = random_matrix(8, 8, dtype, "r", rng)
    assert dtypes.get(dispatcher.gemm(a, a, config=SMALL).dtype).token == expected


def test_alpha_beta(rng):
    a = random_matrix(50, 40, "fp32", "r", rng)
    b = random_matrix(40, 30, "fp32", "c", rng)
    c = random_matrix(50, 30, "fp32", "r", rng)
    out = dispatcher.gemm(a, b, c=c, alpha=0.5, beta=-2.0, config=SMALL)
    assert max_rel(out, reference(a, b, c, 0.5, -2.0)) <= 1e-5
    # in place: c is the output
    expected = reference(a, b, c, 1.5, 1.0)
    dispatcher.gemm(a, b, c=c, out=c, alpha=1.5, beta=1.0, config=SMALL)
    assert max_rel(c, expected) <= 1e-5


def test_beta_zero_never_reads_c(rng):
    a = random_matrix(30, 20, "fp32", "r", rng)
    b = random_matrix(20, 10, "fp32", "r", rng)
    out = poison(np.empty((30, 10), np.float32))  # NaN * 0 would leak through
    dispatcher.gemm(a, b, out=out, beta=0.0, config=SMALL)
    assert np.isfinite(out).all()


def test_views_and_slices_run_in_place(rng):
    big_a = random_matrix(200, 300, "fp32", "r", rng)
    big_b = random_matrix(300, 150, "fp32", "c", rng)
    a, b = big_a[10:77, 5:260], big_b[5:260, 3:100]   # strided views, not copies
    big_out = poison(np.empty((100, 200), np.float32))
    out = big_out[7:74, 50:147]
    dispatcher.gemm(a, b, out=out, config=SMALL)
    assert max_rel(out, reference(a, b)) <= 1e-5
    untouched = np.ones(big_out.shape, bool)
    untouched[7:74, 50:147] = False
    assert np.isnan(big_out[untouched]).all(), "wrote outside the output view"


def test_column_major_output(rng):
    a = random_matrix(33, 40, "bf16", "r", rng)
    b = random_matrix(40, 21, "bf16", "c", rng)
    out = poison(np.asfortranarray(np.empty((33, 21), a.dtype)))
    dispatcher.gemm(a, b, out=out, config=SMALL)
    assert max_rel(out, reference(a, b)) <= dtypes.relative_tolerance("bf16", 40)


def test_transposed_inputs_are_read_as_column_major(rng):
    a = random_matrix(64, 48, "fp16", "r", rng)
    b = random_matrix(32, 48, "fp16", "r", rng)
    out = dispatcher.gemm(a, b.T)  # b.T is column-major: selected kernel is 'rcr'
    assert max_rel(out, reference(a, b.T)) <= dtypes.relative_tolerance("fp16", 48)


def test_a_single_column_b_is_read_column_major(rng):
    """A matrix times a vector runs as rcr (the GPU's gemv layout); a column
    cut from a wider row-major matrix can only be read row-major."""
    a = random_matrix(70, 96, "fp32", "r", rng)
    for b, layout in ((random_matrix(96, 1, "fp32", "r", rng), "rcr"),
                      (random_matrix(96, 5, "fp32", "r", rng)[:, 3:4], "rrr")):
        out = poison(np.empty((70, 1), np.float32))
        held = dispatcher.plan(a=a, b=b, out=out)
        held(a, b, out=out)
        assert held.plan.chosen[0].layout == layout
        assert max_rel(out, reference(a, b)) <= 1e-5
    vector = random_matrix(96, 1, "fp32", "r", rng)  # a config that reads it row-major is honoured
    for config in (dict(SMALL, layout="rrr"), dispatcher.KernelConfig.create(dtype="fp32", layout="rrr", **SMALL)):
        out = poison(np.empty((70, 1), np.float32))
        dispatcher.gemm(a, vector, out=out, config=config)
        assert max_rel(out, reference(a, vector)) <= 1e-5
    row = random_matrix(1, 96, "fp32", "r", rng)  # and a single row of A read column-major
    b = random_matrix(96, 30, "fp32", "r", rng)
    out = poison(np.empty((1, 30), np.float32))
    dispatcher.gemm(row, b, out=out, config=dict(SMALL, layout="crr"))
    assert max_rel(out, reference(row, b)) <= 1e-5


def test_selected_default_kernel_on_larger_problem(rng):
    a = random_matrix(300, 520, "fp32", "r", rng)
    b = random_matrix(520, 610, "fp32", "r", rng)
    out = poison(np.empty((300, 610), np.float32))
    dispatcher.gemm(a, b, out=out)
    assert max_rel(out, reference(a, b)) <= 1e-5


def test_empty_dimensions(rng):
    a = np.zeros((0, 5), np.float32)
    b = np.zeros((5, 3), np.float32)
    assert dispatcher.gemm(a, b).shape == (0, 3)
    c = random_matrix(4, 3, "fp32", "r", rng)
    out = dispatcher.gemm(np.zeros((4, 0), np.float32), np.zeros((0, 3), np.float32), c=c, beta=2.0)
    np.testing.assert_array_equal(out, 2.0 * c)
