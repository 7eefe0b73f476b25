"""Stream-K on the CPU: parity, reductions (atomic, linear, tree), decompositions, determinism, fallback."""

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes, errors
from dispatcher.verify import max_rel, poison, random_matrix, reference, tolerance

from conftest import parity_grid  # noqa: E402

# 1 tile wide, 8 K-iterations deep on most shapes below: every worker gets a
# share of a tile, so partial tiles and the fix-up are exercised.
SMALL = dict(tile_m=24, tile_n=64, tile_k=32)
SHAPES = [(23, 61, 257), (50, 130, 100), (1, 1, 70)]
LAYOUTS = ("rcr", "rrr", "crr", "ccr")


def run(a, b, workers=2, strict=True, **config):
    out_dtype = dtypes.output_for(dtypes.get(a.dtype).token)
    out = poison(np.empty((a.shape[0], b.shape[1]), out_dtype.numpy))
    cfg = {**SMALL, **config}
    dispatcher.gemm(a, b, out=out, variant="stream_k", config=cfg, options={"workers": workers},
                    strict=strict)
    return out


def check(dtype, layout, rng, **config):
    for m, n, k in SHAPES:
        a = random_matrix(m, k, dtype, layout[0], rng)
        b = random_matrix(k, n, dtype, layout[1], rng)
        out = run(a, b, **config)
        cfg = dispatcher.KernelConfig.create(variant="stream_k", dtype=dtype, layout=layout,
                                             **SMALL, **config)
        assert max_rel(out, reference(a, b)) <= tolerance(cfg, k), (dtype, layout, (m, n, k))


@pytest.mark.parametrize("dtype, layout", parity_grid("stream_k linear", dtypes.INPUT_TOKENS, LAYOUTS))
def test_linear_every_dtype_and_layout(dtype, layout, rng):
    check(dtype, layout, rng, reduction="linear", decomposition="stream_k")


@pytest.mark.parametrize("dtype, layout", parity_grid("stream_k tree", dtypes.INPUT_TOKENS, LAYOUTS))
def test_tree_every_dtype_and_layout(dtype, layout, rng):
    check(dtype, layout, rng, reduction="tree", decomposition="stream_k")


# (M, N, K), workers: one tile split over every worker (8: three full tree
# rounds; 5 and 3: rounds with an odd partial out), and 3x3 tiles whose
# splits fall at different places per tile.
MANY_PARTIALS = [((23, 61, 1000), 8), ((23, 61, 1000), 5), ((24, 64, 777), 3), ((50, 130, 300), 5),
                 ((50, 130, 300), 8)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp8_e5m2", "int8"])
@pytest.mark.parametrize("shape, workers", MANY_PARTIALS)
def test_tree_with_many_partials(shape, workers, dtype, rng):
    m, n, k = shape
    a, b = random_matrix(m, k, dtype, "r", rng), random_matrix(k, n, dtype, "c", rng)
    out = run(a, b, workers=workers, reduction="tree", decomposition="stream_k")
    # int8: exact (int32 partials); floats: a partial sum per worker
    limit = dtypes.relative_tolerance(dtypes.output_for(dtype).token, k, splits=workers)
    assert max_rel(out, reference(a, b)) <= limit, (shape, workers, dtype)


@pytest.mark.parametrize("dtype, layout", parity_grid("stream_k atomic", ["fp32", "int8"], ["rcr", "ccr"], offset=0))
def test_atomic(dtype, layout, rng):
    check(dtype, layout, rng, reduction="atomic", decomposition="stream_k")


@pytest.mark.parametrize("decomposition", ["hybrid", "data_parallel"])
@pytest.mark.parametrize("reduction", ["atomic", "linear", "tree"])
def test_decompositions(reduction, decomposition, rng):
    check("fp32", "rcr", rng, reduction=reduction, decomposition=decomposition)


@pytest.mark.parametrize("workers", [1, 3, 5])
def test_worker_counts(workers, rng):
    a = random_matrix(70, 130, "fp32", "r", rng)
    b = random_matrix(130, 150, "fp32", "c", rng)
    out = run(a, b, workers=workers, reduction="linear", decomposition="stream_k")
    assert max_rel(out, reference(a, b)) <= 1e-5


def test_alpha_beta_with_every_reduction(rng):
    a = random_matrix(40, 300, "fp32", "r", rng)
    b = random_matrix(300, 50, "fp32", "r", rng)
    c = random_matrix(40, 50, "fp32", "r", rng)
    for reduction in ("atomic", "linear", "tree"):
        out = dispatcher.gemm(a, b, c=c, alpha=2.0, beta=0.5, variant="stream_k",
                              config={**SMALL, "reduction": reduction, "decomposition": "stream_k"})
        assert max_rel(out, reference(a, b, c, 2.0, 0.5)) <= 1e-5


@pytest.mark.parametrize("reduction, workers", [("linear", 3), ("tree", 5)])
def test_linear_and_tree_are_bit_identical_across_runs(reduction, workers, rng):
    a = random_matrix(24, 5000, "fp32", "r", rng)
    b = random_matrix(5000, 64, "fp32", "c", rng)
    runs = [run(a, b, workers=workers, reduction=reduction, decomposition="stream_k") for _ in range(8)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    # the tile really is split: one worker alone sums in another order
    single = run(a, b, workers=1, reduction=reduction, decomposition="stream_k")
    assert not np.array_equal(single, runs[0])
    assert max_rel(single, reference(a, b)) <= 1e-5


def test_cuda_tree_runs_split_k():
    """CUTLASS's stream-K fix-up has no tree: on cuda the tree combines split_k's slices."""
    with pytest.raises(errors.ConfigError, match="decomposition=split_k"):
        dispatcher.Dispatcher().codegen(dispatcher.KernelConfig.create(
            variant="stream_k", target="cuda", dtype="bf16", reduction="tree", decomposition="stream_k"))


def test_atomic_needs_a_wide_output():
    with pytest.raises(errors.ConfigError, match="atomic reduction"):
        dispatcher.Dispatcher().codegen(dispatcher.KernelConfig.create(
            variant="stream_k", dtype="bf16", reduction="atomic"))


def test_unsupported_problem_falls_back_to_regular(rng):
    a = random_matrix(1, 1, "fp32", "r", rng)
    b = random_matrix(1, 1, "fp32", "r", rng)
    cfg = {**SMALL, "reduction": "linear", "decomposition": "stream_k"}
    with pytest.raises(errors.UnsupportedProblem, match="at least one K-iteration per worker"):
        dispatcher.gemm(a, b, variant="stream_k", config=cfg, options={"workers": 4})
    # the kernel's -2 with a selected (not insisted-on) kernel falls back to regular
    d = dispatcher.Dispatcher()
    problem = dispatcher.GemmProblem(1, 1, 1, "fp32", "fp32", "rrr", "stream_k")
    d._selected[problem] = d.config_for(problem, cfg)
    out = dispatcher.gemm(a, b, variant="stream_k", options={"workers": 4}, dispatcher=d)
    assert out[0, 0] == np.float32(a[0, 0] * b[0, 0])


@pytest.mark.parametrize("reduction", ["atomic", "linear", "tree"])
def test_repeated_calls_through_a_plans_runner_start_from_a_zeroed_workspace(reduction, rng):
    """Calls of a held stream_k plan (and plain calls of the default kernel)
    go straight to the plan's runner: every call's partials land in a
    zeroed workspace (a stale one would add the call before's), and every
    element of the poisoned out is written."""
    a, b = random_matrix(40, 700, "fp32", "r", rng), random_matrix(700, 60, "fp32", "c", rng)
    out = np.empty((40, 60), np.float32)
    held = dispatcher.plan("stream_k", a=a, b=b, out=out,
                           config={**SMALL, "reduction": reduction, "decomposition": "stream_k"})
    for _ in range(3):
        a2 = random_matrix(40, 700, "fp32", "r", rng)
        poison(out)
        assert held(a2, b, out=out) is out and max_rel(out, reference(a2, b)) <= 1e-5
        assert max_rel(dispatcher.gemm(a2, b, variant="stream_k"), reference(a2, b)) <= 1e-5
    assert held.plan.runners and held.plan.record.name == "stream_k"


def test_a_plans_calls_follow_a_change_of_the_openmp_thread_count(rng):
    """A CPU stream-K kernel sizes its workspace by the OpenMP thread count
    of each call, which a program may change between calls
    (omp_set_num_threads, threadpoolctl): a warm plan asks the size again
    instead of keeping its first call's."""
    import ctypes
    gomp = ctypes.CDLL("libgomp.so.1")
    a, b = random_matrix(200, 300, "fp32", "r", rng), random_matrix(300, 160, "fp32", "r", rng)
    dispatcher.gemm(a, b, variant="stream_k")  # loads the kernel (and libgomp)
    threads = gomp.omp_get_max_threads()
    try:
        gomp.omp_set_num_threads(1)
        for _ in range(2):
            assert max_rel(dispatcher.gemm(a, b, variant="stream_k"), reference(a, b)) <= 1e-5
        gomp.omp_set_num_threads(max(threads, 2) * 2)
        for _ in range(2):
            assert max_rel(dispatcher.gemm(a, b, variant="stream_k"), reference(a, b)) <= 1e-5
    finally:
        gomp.omp_set_num_threads(threads)
