"""Grouped GEMM on the CPU: mixed shapes, empty groups, errors."""

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes, errors
from dispatcher.verify import max_rel, random_matrix, reference

from conftest import parity_grid  # noqa: E402

SMALL = dict(tile_m=24, tile_n=64, tile_k=32)


def groups(shapes, dtype, layout, rng):
    As = [random_matrix(m, k, dtype, layout[0], rng) for m, _, k in shapes]
    Bs = [random_matrix(k, n, dtype, layout[1], rng) for _, n, k in shapes]
    return As, Bs


MIXED = [(37, 53, 71), (0, 64, 32), (1, 1, 1), (130, 9, 200), (64, 128, 64)]


@pytest.mark.parametrize("dtype, layout", parity_grid("grouped", dtypes.INPUT_TOKENS, ["rc", "rr", "cr", "cc"]))
def test_mixed_shapes_every_dtype(dtype, layout, rng):
    As, Bs = groups(MIXED, dtype, layout, rng)
    outs = dispatcher.grouped_gemm(As, Bs, config=SMALL)
    tol = dtypes.relative_tolerance(dtypes.output_for(dtype).token, 200)
    for a, b, out in zip(As, Bs, outs):
        assert out.shape == (a.shape[0], b.shape[1])
        assert max_rel(out, reference(a, b)) <= tol


@pytest.mark.parametrize("layout", ["rr", "cr", "cc"])
def test_layouts(layout, rng):
    As, Bs = groups(MIXED, "fp32", layout, rng)
    outs = dispatcher.grouped_gemm(As, Bs, alpha=-1.5, config=SMALL)
    for a, b, out in zip(As, Bs, outs):
        assert max_rel(out, reference(a, b, alpha=-1.5)) <= 1e-5


def test_default_selection_many_groups(rng):
    shapes = [(int(m), 96, 80) for m in rng.integers(1, 200, size=40)]
    As, Bs = groups(shapes, "fp32", "rr", rng)
    outs = dispatcher.grouped_gemm(As, Bs)
    for a, b, out in zip(As, Bs, outs):
        assert max_rel(out, reference(a, b)) <= 1e-5


def test_no_groups_and_all_empty():
    assert dispatcher.grouped_gemm([], []) == []
    outs = dispatcher.grouped_gemm([np.ones((0, 4), np.float32)], [np.ones((4, 3), np.float32)])
    assert outs[0].shape == (0, 3)


def test_bad_group_lists():
    f = np.ones((4, 4), np.float32)
    with pytest.raises(errors.ProblemError, match="2 A matrices but 1 B"):
        dispatcher.grouped_gemm([f, f], [f])
    with pytest.raises(errors.DtypeError, match="group 1 is fp16"):
        dispatcher.grouped_gemm([f, f.astype(np.float16)], [f, f.astype(np.float16)])
    with pytest.raises(errors.ProblemError, match="group 0"):
        dispatcher.grouped_gemm([np.ones((4, 5), np.float32)], [f])
    with pytest.raises(errors.LayoutError, match="mix row- and column-major"):
        dispatcher.grouped_gemm([f[:3], np.asfortranarray(f[:3])], [f, f])
