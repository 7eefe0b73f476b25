"""`grouped_mm`, the stacked (mixture-of-experts) form of grouped GEMM, on the CPU."""

import ctypes

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes, errors
from dispatcher.library import grouped_mm_args
from dispatcher.problem import prepare_grouped_mm
from dispatcher.errors import ProblemError
from dispatcher.verify import max_rel, poison, random_matrix

from conftest import parity_grid  # noqa: E402

SMALL = dict(tile_m=24, tile_n=64, tile_k=32)


def experts(counts, n, k, dtype, rng, b_layout="r", tail=0):
    """Stacked A with `tail` rows no group owns, B (G, K, N) and int32 offsets."""
    offsets = np.cumsum(counts, dtype=np.int64).astype(np.int32)
    total = int(offsets[-1]) + tail if len(counts) else tail
    a = random_matrix(total, k, dtype, "r", rng)
    b = np.stack([random_matrix(k, n, dtype, b_layout, rng) for _ in counts]) if len(counts) else \
        np.zeros((0, k, n), dtypes.get(dtype).numpy)
    if b_layout == "c":  # each b[g] column-major: (G, N, K) storage seen as (G, K, N)
        b = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1)
    return a, b, offsets


def stacked_reference(a, b, offsets, alpha=1.0):
    """float64, group by group; rows no group owns are zero."""
    ref = np.zeros((a.shape[0], b.shape[2]))
    start = 0
    for g, end in enumerate(offsets):
        ref[start:end] = alpha * (a[start:end].astype(np.float64) @ b[g].astype(np.float64))
        start = end
    return ref


def run_poisoned(a, b, offsets, config=SMALL, **kw):
    """Run through the Dispatcher on a poisoned result, so an element no
    kernel wrote is caught."""
    problem, operands, result = prepare_grouped_mm(
        a, b, offsets, allocate=lambda shape, dtype: poison(np.empty(shape, dtype)), **kw)
    dispatcher.api.default_dispatcher().run(problem, operands, config)
    return result


# offset 0: B row-major for even dtype indices, column-major for odd ones; four of
# these are test_grouped.py's fast cells (rr, rc), so their kernels are built once
@pytest.mark.parametrize("dtype, b_layout", parity_grid("grouped_mm", dtypes.INPUT_TOKENS, ["r", "c"], offset=0))
def test_every_dtype_with_empty_experts(dtype, b_layout, rng):
    a, b, offsets = experts([7, 0, 33, 1, 0, 50], 40, 72, dtype, rng, b_layout, tail=5)
    out = run_poisoned(a, b, offsets)
    tol = dtypes.relative_tolerance(dtypes.output_for(dtype).token, 72)
    assert max_rel(out, stacked_reference(a, b, offsets)) <= tol


def test_default_selection_and_public_call(rng):
    a, b, offsets = experts([int(x) for x in rng.integers(0, 90, size=16)], 96, 64, "fp32", rng)
    out = dispatcher.grouped_mm(a, b, offsets, alpha=0.5)
    assert out.shape == (a.shape[0], 96) and out.dtype == np.float32
    assert max_rel(out, stacked_reference(a, b, offsets, 0.5)) <= 1e-5


def test_one_expert_and_no_row_owned(rng):
    a, b, offsets = experts([64], 48, 32, "bf16", rng)
    assert max_rel(run_poisoned(a, b, offsets), stacked_reference(a, b, offsets)) <= 1e-2
    a, b, offsets = experts([0, 0, 0], 48, 32, "fp32", rng, tail=9)  # no group owns a row
    assert np.array_equal(run_poisoned(a, b, offsets), np.zeros((9, 48), np.float32))


def test_degenerate_sizes(rng):
    a, b, offsets = experts([], 8, 16, "fp32", rng, tail=3)  # G = 0
    assert np.array_equal(dispatcher.grouped_mm(a, b, offsets), np.zeros((3, 8), np.float32))
    a, b, offsets = experts([2, 3], 8, 0, "fp32", rng)  # K = 0: an empty product
    assert np.array_equal(dispatcher.grouped_mm(a, b, offsets), np.zeros((5, 8), np.float32))
    a, b, offsets = experts([0, 0], 8, 16, "fp32", rng)  # total_M = 0
    assert dispatcher.grouped_mm(a, b, offsets).shape == (0, 8)


def test_signature_is_coarse(rng):
    """Two routings of one layer share the selection and tuning key: the
    token count is bucketed, the per-expert split is not part of it."""
    first = prepare_grouped_mm(*experts([10, 50, 4], 64, 32, "fp32", rng))[0]
    second = prepare_grouped_mm(*experts([30, 30, 3], 64, 32, "fp32", rng))[0]
    assert first == second and first.tokens == 64
    assert first.tuning_key() == second.tuning_key()
    more = prepare_grouped_mm(*experts([40, 40, 3], 64, 32, "fp32", rng))[0]
    assert more.tokens == 128 and more != first


@pytest.mark.parametrize("bad, match", [
    ([3, 2, 9], r"offsets\[1\] = 2 is smaller than 3"),
    ([-1, 2, 9], r"offsets\[0\] = -1 is smaller than 0"),
    ([3, 4, 99], r"offsets\[2\] = 99 exceeds a's 12 rows"),
])
def test_bad_offsets_are_refused(bad, match, rng):
    a, b, _ = experts([3, 4, 5], 16, 8, "fp32", rng)
    with pytest.raises(errors.ProblemError, match=match):
        dispatcher.grouped_mm(a, b, np.array(bad, np.int32))


def test_kernel_refuses_bad_offsets_and_writes_nothing(rng):
    """The native entry point checks offsets too (the device form cannot be
    checked on the host): status -1, and the output keeps its poison."""
    a, b, offsets = experts([3, 4, 5], 64, 32, "fp32", rng)
    problem, operands, result = prepare_grouped_mm(a, b, offsets)
    d = dispatcher.api.default_dispatcher()
    library = d.library(d.config_for(problem, SMALL))
    poison(result)
    bad = np.array([3, 2, 12], np.int32)
    args = grouped_mm_args(operands)
    args.offsets = ctypes.c_void_p(bad.ctypes.data)
    with pytest.raises(errors.KernelError, match=r"offsets\[1\] = 2 is smaller"):
        library.run_grouped_mm(args)
    assert np.isnan(result).all()


@pytest.mark.parametrize("call, error, match", [
    (lambda a, b, o: dispatcher.grouped_mm(a, b[0], o), errors.ProblemError, "b must be 3-D"),
    (lambda a, b, o: dispatcher.grouped_mm(a[None], b, o), errors.ProblemError, "a must be 2-D"),
    (lambda a, b, o: dispatcher.grouped_mm(a, b, o.astype(np.int64)), errors.ProblemError, "int32"),
    (lambda a, b, o: dispatcher.grouped_mm(a, b, o[:2]), errors.ProblemError, "2 entries but b has 3"),
    (lambda a, b, o: dispatcher.grouped_mm(a[:, :4], b, o), errors.ProblemError, "inner dimensions"),
    (lambda a, b, o: dispatcher.grouped_mm(a, b.astype(np.float16), o), errors.DtypeError, "both inputs"),
    (lambda a, b, o: dispatcher.grouped_mm(a, b, o[::-1].copy()[::-1]), errors.LayoutError, "contiguous"),
    (lambda a, b, o: dispatcher.grouped_mm(a, b, o, variant="regular"), errors.ConfigError, "grouped"),
    (lambda a, b, o: dispatcher.grouped_mm(a, b, o, options={"bogus": 1}), errors.ConfigError, "bogus"),
])
def test_bad_arguments(call, error, match, rng):
    a, b, offsets = experts([3, 4, 5], 16, 8, "fp32", rng)
    with pytest.raises(error, match=match):
        call(a, b, offsets)


def test_repeated_calls_take_their_plans_runner_and_still_check_offsets(rng, monkeypatch):
    """From the second call on, a stacked call goes straight to its plan's
    runner (counted): every row of the poisoned result is written (rows past
    offsets[-1] as zeros), new offsets are honoured, and bad host offsets
    are still refused, exactly at their limits."""
    from dispatcher import api
    a = random_matrix(40, 24, "fp32", "r", rng)
    b = rng.standard_normal((3, 24, 16)).astype(np.float32)
    dispatcher.grouped_mm(a, b, np.array([10, 10, 30], np.int32))
    entry = next(v for v in api._RUNNERS.values() if v[1] == ("a", "b", "offsets") and v[0].layout.total_m == 40)
    runner, ran = entry[0].runner(entry[1], entry[2]), []
    monkeypatch.setitem(entry[0].runners, entry[1:3], lambda *x: ran.append(1) or runner(*x))
    from dispatcher import plans
    monkeypatch.setattr(plans, "new_result", lambda *x: poison(np.empty(x[1], x[2])))
    for ends in ([5, 20, 40], [0, 0, 33], [40, 40, 40]):
        offsets = np.array(ends, np.int32)
        got = dispatcher.grouped_mm(a, b, offsets)
        want = np.zeros((40, 16))
        for g, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
            want[start:end] = a[start:end].astype(np.float64) @ b[g]
        assert max_rel(got, want) <= 1e-5, ends
    assert len(ran) == 3
    with pytest.raises(ProblemError, match="exceeds a's 40 rows"):
        dispatcher.grouped_mm(a, b, np.array([5, 20, 41], np.int32))
    with pytest.raises(ProblemError, match="non-decreasing"):
        dispatcher.grouped_mm(a, b, np.array([5, 4, 40], np.int32))
    with pytest.raises(ProblemError, match="non-decreasing"):
        dispatcher.grouped_mm(a, b, np.array([-1, 4, 40], np.int32))
