"""The cuda target on a GPU (marked `gpu`; run with `-m gpu` on a Hopper machine)."""

import math

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes, errors
from dispatcher.verify import max_rel, tolerance

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn,
         "fp8_e5m2": torch.float8_e5m2}
SHAPES = [(136, 200, 72), (512, 384, 256), (8, 8, 8), (1000, 1032, 1064)]
TILE = dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2)  # a catalog tile: prebuilt


def operand(rows, cols, dtype, layout, gen):
    x = (torch.rand(rows, cols, generator=gen, device="cuda") * 4 - 2).to(TORCH[dtype])
    return x if layout == "r" else x.t().contiguous().t()


def reference(a, b, alpha=1.0, c=None, beta=0.0):
    ref = alpha * (a.double().cpu().numpy() @ b.double().cpu().numpy())
    return ref + beta * c.double().cpu().numpy() if beta else ref


def config(variant, dtype, layout, **kw):
    from dispatcher.targets import cuda
    tile_k = cuda.CUDA.default_tile_k(dtype)
    return dispatcher.KernelConfig.create(variant=variant, target="cuda", dtype=dtype, layout=layout,
                                          **{**TILE, "tile_k": tile_k, **kw})


def run(variant, dtype, layout, shape, gen, **kw):
    m, n, k = shape
    a, b = operand(m, k, dtype, layout[0], gen), operand(k, n, dtype, layout[1], gen)
    cfg = config(variant, dtype, layout, **kw)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=TORCH.get(cfg.dtype_c, torch.float32))
    dispatcher.gemm(a, b, out=out, variant=variant, target="cuda", config=cfg)
    torch.cuda.synchronize()
    return max_rel(out.float().cpu().numpy(), reference(a, b)), tolerance(cfg, k)


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(0)


@pytest.mark.parametrize("layout", ["rcr", "rrr", "crr", "ccr"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_regular_parity(dtype, layout, gen):
    for shape in SHAPES:
        err, tol = run("regular", dtype, layout, shape, gen)
        assert err <= tol, (dtype, layout, shape, err)


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_regular_fp8(dtype, gen):
    for shape in [(136, 200, 128), (512, 384, 256), (16, 16, 16), (1000, 1032, 1056)]:  # 16-byte rows
        err, tol = run("regular", dtype, "rcr", shape, gen)
        assert err <= tol, (dtype, shape, err)


@pytest.mark.parametrize("decomposition,splits", [("hybrid", 1), ("stream_k", 1), ("split_k", 3),
                                                  ("data_parallel", 1)])
@pytest.mark.parametrize("reduction", ["linear", "atomic"])
def test_stream_k_modes(reduction, decomposition, splits, gen):
    for shape in [(136, 200, 4096), (256, 256, 8192), (1000, 1032, 1064)]:
        err, tol = run("stream_k", "bf16", "rcr", shape, gen, reduction=reduction,
                       decomposition=decomposition, splits=splits)
        assert err <= tol, (reduction, decomposition, shape, err)


@pytest.mark.parametrize("reduction, decomposition, splits", [("linear", "stream_k", 1), ("tree", "split_k", 8)])
def test_stream_k_linear_and_tree_are_deterministic(reduction, decomposition, splits, gen):
    a, b = operand(256, 8192, "bf16", "r", gen), operand(8192, 256, "bf16", "c", gen)
    cfg = config("stream_k", "bf16", "rcr", reduction=reduction, decomposition=decomposition, splits=splits)
    outs = [dispatcher.gemm(a, b, target="cuda", variant="stream_k", config=cfg) for _ in range(5)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


# The regular variant's split-K catalog entries (CUTLASS's stream-K scheduler
# in split-K mode): few-tile long-K problems, slices that leave a short last
# one (1064), one tile (8^3), and (rrr: a K x 1 B is row-major) an unaligned
# GEMV-like N = 1, B and C staged.
SPLIT_SHAPES = [(136, 200, 4096), (1000, 1032, 1064), (8, 8, 8)]


@pytest.mark.parametrize("layout, splits", [("rcr", 3), ("rcr", 8), ("rrr", 3)])
def test_regular_split_k(layout, splits, gen):
    for shape in SPLIT_SHAPES + ([(2047, 1, 4096)] if layout == "rrr" else []):
        err, tol = run("regular", "bf16", layout, shape, gen, splits=splits)
        assert err <= tol, (layout, splits, shape, err)


# The regular variant's split-K with the tree reduction (the target's
# reduction kernel), on the catalog's 64x64 ping-pong tiles: a skinny long K,
# slices that leave a short last one, one tile, and the Linear's layouts.
TREE_TILE = dict(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, schedule="pingpong")


@pytest.mark.parametrize("layout, splits", [("rcr", 4), ("rrr", 3), ("crr", 8)])
def test_regular_tree_split_k(layout, splits, gen):
    for shape in SPLIT_SHAPES + [(8, 2048, 8192), (64, 64, 100)]:
        err, tol = run("regular", "bf16", layout, shape, gen, splits=splits, reduction="tree", **TREE_TILE)
        assert err <= tol, (layout, splits, shape, err)


# A fused epilogue runs once per output tile, after its K slices are summed
# (the tree reduction: in its reduction kernel).
SPLIT_EPILOGUES = [(per, activation, reduction) for per, activation in (("col", "gelu"), ("row", "relu"))
                   for reduction in ("linear", "tree")]


@pytest.mark.parametrize("per, activation, reduction", SPLIT_EPILOGUES)
def test_regular_split_k_alpha_beta_and_epilogue(per, activation, reduction, gen):
    m, n, k = 200, 136, 3000
    tile = TREE_TILE if reduction == "tree" else {}
    a, b, c = operand(m, k, "bf16", "r", gen), operand(k, n, "bf16", "r", gen), operand(m, n, "bf16", "r", gen)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = config("regular", "bf16", "rrr", splits=3, reduction=reduction, **tile)
    dispatcher.gemm(a, b, c=c, alpha=2.0, beta=0.5, out=out, target="cuda", config=cfg)
    torch.cuda.synchronize()
    assert max_rel(out.float().cpu().numpy(), reference(a, b, 2.0, c, 0.5)) <= tolerance(cfg, k)
    bias = operand(1, n, "bf16", "r", gen)[0] if per == "col" else operand(m, 1, "bf16", "r", gen)
    out.fill_(float("nan"))
    cfg = config("regular", "bf16", "rrr", splits=3, bias=per, activation=activation, reduction=reduction, **tile)
    dispatcher.run("regular", a=a, b=b, out=out, bias=bias, activation=activation, alpha=0.5, target="cuda",
                   config=cfg)
    torch.cuda.synchronize()
    x = 0.5 * reference(a, b) + bias.double().cpu().numpy()
    expected = np.maximum(x, 0.0) if activation == "relu" else \
        0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    assert max_rel(out.float().cpu().numpy(), expected) <= tolerance(cfg, k)


# The regular variant's hybrid decomposition (CUTLASS's stream-K scheduler in
# its heuristic mode) on 128x128 tiles in 1x2 clusters, 132 SMs: 280 tiles
# (2.1 waves: 132 data-parallel, the last full wave and the partial one
# stream-K), aligned and not; 160 tiles (two waves or fewer: every tile
# stream-K); 80 (a last wave at least half full: data-parallel); one tile.
HYBRID_SHAPES = [(2560, 1792, 1024), (2500, 1780, 1000), (2000, 1032, 4096), (1000, 1032, 1064), (8, 8, 8)]


@pytest.mark.parametrize("layout", ["rcr", "rrr"])
def test_regular_hybrid(layout, gen):
    for shape in HYBRID_SHAPES:
        err, tol = run("regular", "bf16", layout, shape, gen, decomposition="hybrid")
        assert err <= tol, (layout, shape, err)


def test_regular_hybrid_is_deterministic(gen):
    a, b = operand(2560, 1024, "bf16", "r", gen), operand(1024, 1792, "bf16", "c", gen)
    cfg = config("regular", "bf16", "rcr", decomposition="hybrid")
    outs = [dispatcher.gemm(a, b, target="cuda", config=cfg) for _ in range(5)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("m, n, k", [(2500, 1780, 1000), (2000, 1032, 3000)])
def test_regular_hybrid_alpha_beta_and_epilogue(m, n, k, gen):
    a, b, c = operand(m, k, "bf16", "r", gen), operand(k, n, "bf16", "r", gen), operand(m, n, "bf16", "r", gen)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = config("regular", "bf16", "rrr", decomposition="hybrid")
    dispatcher.gemm(a, b, c=c, alpha=2.0, beta=0.5, out=out, target="cuda", config=cfg)
    torch.cuda.synchronize()
    assert max_rel(out.float().cpu().numpy(), reference(a, b, 2.0, c, 0.5)) <= tolerance(cfg, k)
    bias = operand(1, n, "bf16", "r", gen)[0]
    out.fill_(float("nan"))
    cfg = config("regular", "bf16", "rrr", decomposition="hybrid", bias="col", activation="relu")
    dispatcher.run("regular", a=a, b=b, out=out, bias=bias, activation="relu", alpha=0.5, target="cuda",
                   config=cfg)
    torch.cuda.synchronize()
    expected = np.maximum(0.5 * reference(a, b) + bias.double().cpu().numpy(), 0.0)
    assert max_rel(out.float().cpu().numpy(), expected) <= tolerance(cfg, k)


# The cuda target's gemv schedule (native/cuda/gemv.hpp): M or N up to 4 (its
# instances for 1, 2 and 4 small rows), K a multiple of 8 (16-byte loads) or not
# (one element a lane), a K shorter than a block's first step, one and many blocks.
GEMV = dict(tile_m=4, tile_n=4, cluster_m=1, cluster_n=1, schedule="gemv")
GEMV_SHAPES = [(1, 4096, 4096), (4, 2048, 1000), (2, 300, 72), (3, 77, 35), (2047, 1, 4096), (333, 4, 520),
               (3, 3, 3), (2, 5000, 16384), (1, 300, 77), (129, 2, 35)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gemv_schedule_small_m_or_n(dtype, gen):
    for shape in GEMV_SHAPES:
        err, tol = run("regular", dtype, "rcr", shape, gen, **GEMV)
        assert err <= tol, (dtype, shape, err)


@pytest.mark.parametrize("per, activation", [("col", "gelu"), ("row", "silu")])
def test_gemv_schedule_epilogue_alpha_beta_views_and_fp32_out(per, activation, gen):
    m, n, k = 3, 1000, 777
    a = operand(m, k + 1, "bf16", "r", gen)[:, 1:]  # a view 2 bytes off: the one-element path
    b = operand(k, n, "bf16", "c", gen)
    c = operand(m, n, "bf16", "r", gen)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = config("regular", "bf16", "rcr", **GEMV)
    dispatcher.gemm(a, b, c=c, alpha=2.0, beta=0.5, out=out, target="cuda", config=cfg)
    torch.cuda.synchronize()
    assert max_rel(out.float().cpu().numpy(), reference(a, b, 2.0, c, 0.5)) <= tolerance(cfg, k)
    bias = operand(1, n, "bf16", "r", gen)[0] if per == "col" else operand(m, 1, "bf16", "r", gen)
    wide = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    cfg = config("regular", "bf16", "rcr", dtype_c="fp32", bias=per, activation=activation, **GEMV)
    dispatcher.run("regular", a=a, b=b, out=wide, bias=bias.float(), activation=activation, alpha=0.5,
                   target="cuda", config=cfg)
    torch.cuda.synchronize()
    x = 0.5 * reference(a, b) + bias.double().cpu().numpy()
    expected = x / (1.0 + np.exp(-x)) if activation == "silu" else \
        0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    assert max_rel(wide.cpu().numpy(), expected) <= tolerance(cfg, k)


def test_gemv_schedule_refuses_wide_problems_and_is_chosen_for_few_columns(gen):
    a, b = operand(64, 128, "bf16", "r", gen), operand(128, 64, "bf16", "c", gen)
    with pytest.raises(errors.UnsupportedProblem):
        dispatcher.gemm(a, b, target="cuda", config=config("regular", "bf16", "rcr", **GEMV), strict=True)
    a, x = operand(2047, 4096, "bf16", "r", gen), operand(4096, 4, "bf16", "c", gen)
    held = dispatcher.plan(a=a, b=x)  # the default selection's plan, as dispatcher.gemm(a, x) makes it
    y = held(a, x)
    torch.cuda.synchronize()
    chosen = held.plan.chosen[0]
    assert chosen.target_params["schedule"] == "gemv"  # no tuned row near: its estimate ranks first
    assert max_rel(y.float().cpu().numpy(), reference(a, x)) <= tolerance(chosen, 4096)
    v = operand(4096, 1, "bf16", "r", gen)  # a contiguous vector, read column-major (rcr): no tuned row near,
    held = dispatcher.plan(a=a, b=v)
    y = held(a, v)
    torch.cuda.synchronize()
    assert held.plan.chosen[0].target_params["schedule"] == "gemv"  # and the gemv estimate ranks first
    assert max_rel(y.float().cpu().numpy(), reference(a, v)) <= tolerance(held.plan.chosen[0], 4096)


# The tree reduction (split_k slices' fp32 partials in the workspace, then a
# pairwise reduction kernel): every layout, many slices, K that leaves a
# short last slice (1064, 4100), one slice only (8, 100 with tile_k 64), and
# fp8 (tile_k 128, fp16 output). benchmarks/cuda_sweeps.py builds these.
TREE_KERNELS = [("bf16", layout, 3) for layout in ("rcr", "rrr", "crr", "ccr")] + \
    [("bf16", "rcr", 8), ("fp8_e4m3", "rcr", 4)]
TREE_SHAPES = [(136, 200, 4096), (256, 256, 8192), (1000, 1032, 1064), (64, 64, 100), (8, 8, 8),
               (96, 160, 4100)]


@pytest.mark.parametrize("dtype, layout, splits", TREE_KERNELS)
def test_stream_k_tree(dtype, layout, splits, gen):
    for shape in TREE_SHAPES:
        err, tol = run("stream_k", dtype, layout, shape, gen, reduction="tree", decomposition="split_k",
                       splits=splits)
        assert err <= tol, (dtype, layout, splits, shape, err)


def test_stream_k_tree_alpha_beta(gen):
    m, n, k = 200, 136, 3000
    a, b, c = operand(m, k, "bf16", "r", gen), operand(k, n, "bf16", "c", gen), operand(m, n, "bf16", "r", gen)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = config("stream_k", "bf16", "rcr", reduction="tree", decomposition="split_k", splits=3)
    dispatcher.gemm(a, b, c=c, alpha=2.0, beta=0.5, out=out, target="cuda", variant="stream_k", config=cfg)
    torch.cuda.synchronize()
    assert max_rel(out.float().cpu().numpy(), reference(a, b, 2.0, c, 0.5)) <= tolerance(cfg, k)


def test_alpha_beta_numpy_round_trip(gen):
    rng = np.random.default_rng(0)
    import ml_dtypes
    a = rng.uniform(-1, 1, (200, 64)).astype(ml_dtypes.bfloat16)
    b = rng.uniform(-1, 1, (64, 136)).astype(ml_dtypes.bfloat16)
    c = rng.uniform(-1, 1, (200, 136)).astype(ml_dtypes.bfloat16)
    out = dispatcher.gemm(a, b, c=c, alpha=0.5, beta=2.0, target="cuda",
                          config=config("regular", "bf16", "rrr"))
    assert isinstance(out, np.ndarray) and out.dtype == a.dtype
    ref = 0.5 * a.astype(np.float64) @ b.astype(np.float64) + 2.0 * c.astype(np.float64)
    assert max_rel(out, ref) <= dtypes.relative_tolerance("bf16", 64)


def test_views_run_in_place_and_auto_target(gen):
    big = operand(600, 512, "bf16", "r", gen)
    a, b = big[8:208, 64:320], operand(256, 192, "bf16", "r", gen)
    out = dispatcher.gemm(a, b, target="auto")
    assert isinstance(out, torch.Tensor) and out.is_cuda
    assert max_rel(out.float().cpu().numpy(), reference(a, b)) <= dtypes.relative_tolerance("bf16", 256)


def test_cupy_arrays(gen):
    cupy = pytest.importorskip("cupy")
    a = cupy.asarray(np.random.default_rng(0).uniform(-1, 1, (128, 64)).astype(np.float16))
    b = cupy.asarray(np.random.default_rng(1).uniform(-1, 1, (64, 96)).astype(np.float16))
    out = dispatcher.gemm(a, b, target="cuda")
    assert isinstance(out, cupy.ndarray) and out.dtype == np.float16
    ref = a.get().astype(np.float64) @ b.get().astype(np.float64)
    assert max_rel(out.get(), ref) <= dtypes.relative_tolerance("fp16", 64)


EVERY_SHAPE = [(999, 1023, 777), (4095, 4097, 4099), (2047, 1, 4096), (1, 4096, 4096), (7, 7, 7),
               (33, 65, 129), (16, 8192, 7168), (1, 1, 1)]


@pytest.mark.parametrize("variant", ["regular", "stream_k"])
def test_every_problem_runs_by_default(variant, gen):
    """Any M, N, K and leading dimension, default selection, no config: odd
    sizes break TMA's 16-byte rule and run through aligned copies."""
    for m, n, k in EVERY_SHAPE:
        a, b = operand(m, k, "bf16", "r", gen), operand(k, n, "bf16", "c", gen)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        dispatcher.gemm(a, b, out=out, variant=variant, target="cuda")
        torch.cuda.synchronize()
        err = max_rel(out.float().cpu().numpy(), reference(a, b))
        assert err <= dtypes.relative_tolerance("bf16", k, 8), (variant, m, n, k, err)


def test_unaligned_pointers_views_and_beta(gen):
    big = operand(300, 301, "bf16", "r", gen)
    a, b = big[1:200, 3:131], big[5:98, 7:135].t()       # odd offsets and an odd leading dimension (rcr)
    c = operand(199, 93, "bf16", "r", gen)
    out = torch.full((199, 93), float("nan"), device="cuda", dtype=torch.bfloat16)
    dispatcher.gemm(a, b, c=c, beta=0.5, alpha=2.0, out=out, target="cuda")
    torch.cuda.synchronize()
    assert max_rel(out.float().cpu().numpy(), reference(a, b, 2.0, c, 0.5)) <= dtypes.relative_tolerance("bf16", 128)


def test_k_zero_gives_beta_c(gen):
    a, b = operand(64, 0, "bf16", "r", gen), operand(0, 96, "bf16", "c", gen)
    c = operand(64, 96, "bf16", "r", gen)
    out = dispatcher.gemm(a, b, c=c, beta=3.0, target="cuda")
    torch.cuda.synchronize()
    assert max_rel(out.float().cpu().numpy(), 3.0 * c.double().cpu().numpy()) <= dtypes.relative_tolerance("bf16", 1)
    out = dispatcher.gemm(a, b, target="cuda")
    assert torch.count_nonzero(out).item() == 0


def test_gemm_replays_in_a_cuda_graph(gen):
    """Captured once, replayed with new data in the same buffers."""
    m, n, k = 512, 384, 256
    a, b = operand(m, k, "bf16", "r", gen), operand(k, n, "bf16", "c", gen)
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dispatcher.gemm(a, b, out=out, target="cuda")  # warm up: select, build, bind
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        dispatcher.gemm(a, b, out=out, target="cuda")
    for _ in range(2):
        a.copy_(operand(m, k, "bf16", "r", gen))
        b.copy_(operand(k, n, "bf16", "c", gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert max_rel(out.float().cpu().numpy(), reference(a, b)) <= dtypes.relative_tolerance("bf16", k)


def stacked_reference(a, b, offsets):
    a, b, offsets = a.double().cpu().numpy(), b.double().cpu().numpy(), offsets.cpu().numpy()
    ref, start = np.zeros((a.shape[0], b.shape[2])), 0
    for g, end in enumerate(offsets):
        ref[start:end] = a[start:end] @ b[g]
        start = end
    return ref


def moe(counts, n, k, gen, tail=0):
    offsets = torch.tensor(np.cumsum(counts), dtype=torch.int32, device="cuda")
    a = operand(int(sum(counts)) + tail, k, "bf16", "r", gen)
    b = torch.stack([operand(k, n, "bf16", "c", gen) for _ in counts])
    return a, b, offsets


def test_grouped_mm_with_empty_experts(gen):
    a, b, offsets = moe([7, 0, 300, 1, 0, 64, 129], 256, 512, gen, tail=5)
    out = dispatcher.grouped_mm(a, b, offsets, target="cuda")
    torch.cuda.synchronize()
    assert tuple(out.shape) == (a.shape[0], 256)
    assert max_rel(out.float().cpu().numpy(), stacked_reference(a, b, offsets)) <= dtypes.relative_tolerance("bf16", 512)


def test_grouped_mm_replays_in_a_cuda_graph_with_new_offsets(gen):
    a, b, offsets = moe([100, 28, 0, 128], 256, 256, gen)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = dispatcher.grouped_mm(a, b, offsets, target="cuda")  # warm up
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = dispatcher.grouped_mm(a, b, offsets, target="cuda")
    for counts in ([0, 0, 256, 0], [64, 64, 64, 64], [1, 2, 3, 4]):
        offsets.copy_(torch.tensor(np.cumsum(counts), dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert max_rel(out.float().cpu().numpy(), stacked_reference(a, b, offsets)) <= 1e-2, counts


@pytest.mark.parametrize("n", [128, 70])  # 70: C staged (copied in and back)
def test_grouped_mm_bad_device_offsets_write_nothing(n, gen):
    a, b, offsets = moe([10, 20, 30], n, 64, gen)
    offsets.copy_(torch.tensor([10, 5, 30], dtype=torch.int32))  # not non-decreasing
    dispatcher.grouped_mm(a, b, offsets, target="cuda")  # runs, raises nothing
    torch.cuda.synchronize()
    # nothing written: the new result holds whatever the allocator gave it, so
    # compare with a poisoned run through the Dispatcher
    assert torch.isnan(poisoned_grouped_mm(a, b, offsets).float()).all()


def poisoned_grouped_mm(a, b, offsets):
    """grouped_mm through the default Dispatcher into a result poisoned with
    NaN first (the public call's new result holds whatever the allocator
    gave it); returns that (total_M, N) tensor."""
    from dispatcher.problem import prepare_grouped_mm
    from dispatcher.targets import cuda_memory
    session = cuda_memory.DeviceSession(a, b, offsets)
    problem, operands, result = prepare_grouped_mm(*session.arrays, target="cuda", memory=session.memory,
                                                   allocate=session.empty)
    cuda_memory.DEVICE.poison(result, session.stream)
    dispatcher.api.default_dispatcher().run(problem, operands, None, {"stream": session.stream})
    torch.cuda.synchronize()
    return result.owner


# grouped_mm with operands TMA cannot read in place: K and N off a multiple of
# 8 bf16 (A, every B and C staged), and a B viewed at an odd offset (B alone).
@pytest.mark.parametrize("n, k, b_offset", [(70, 100, 0), (256, 512, 1), (8, 8, 0)])
def test_grouped_mm_stages_unaligned_operands(n, k, b_offset, gen):
    counts = [7, 0, 300, 1, 64, 129]
    a, b, offsets = moe(counts, n, k, gen, tail=5)
    if b_offset:  # the same matrices one element into a larger buffer: a misaligned pointer
        b = torch.cat([b.new_zeros(1), b.reshape(-1)])[b_offset:].reshape(b.shape)
    out = poisoned_grouped_mm(a, b, offsets)
    assert max_rel(out.float().cpu().numpy(), stacked_reference(a, b, offsets)) <= dtypes.relative_tolerance("bf16", k)
    public = dispatcher.grouped_mm(a, b, offsets)  # the public call, target following the data
    torch.cuda.synchronize()
    assert torch.equal(public, out)


def test_autotune_on_the_gpu(tmp_path, gen):
    from dispatcher.api import Dispatcher
    from dispatcher.tuning import TuningDatabase
    d = Dispatcher(tuning=TuningDatabase(tmp_path / "t.sqlite"))
    a, b = operand(768, 1024, "bf16", "r", gen), operand(1024, 640, "bf16", "c", gen)
    out = dispatcher.gemm(a, b, target="cuda", autotune=True, dispatcher=d)
    torch.cuda.synchronize()
    assert max_rel(out.float().cpu().numpy(), reference(a, b)) <= dtypes.relative_tolerance("bf16", 1024)
    assert len(d.autotune_log) == 1 and len(d.autotune_log[0]["times"]) >= 2


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_grouped_mixed_sizes(dtype, gen):
    shapes = [(128, 256, 64), (0, 256, 64), (8, 72, 136), (1000, 512, 256), (64, 64, 0)]
    As = [operand(m, k, dtype, "r", gen) for m, n, k in shapes]
    Bs = [operand(k, n, dtype, "c", gen) for m, n, k in shapes]
    outs = dispatcher.grouped_gemm(As, Bs, target="cuda", config=config("grouped", dtype, "rcr"))
    torch.cuda.synchronize()
    for a, b, o, (m, n, k) in zip(As, Bs, outs, shapes):
        assert tuple(o.shape) == (m, n)
        if m * n:
            assert max_rel(o.float().cpu().numpy(), reference(a, b)) <= dtypes.relative_tolerance(dtype, max(k, 1))


def test_cuda_without_gpu_message_is_clear(monkeypatch):
    from dispatcher.targets import cuda
    monkeypatch.setattr(cuda.CudaTarget, "available", lambda self: False)
    with pytest.raises(errors.ToolchainError, match="needs an NVIDIA GPU"):
        dispatcher.gemm(np.ones((8, 8), np.float16), np.ones((8, 8), np.float16), target="cuda")


@pytest.mark.parametrize("variant", ["regular", "stream_k"])
def test_repeated_calls_reuse_params_only_for_the_same_call(variant, gen):
    """A kernel keeps the params of its last call per thread: alternating
    operand sets, alpha, and new data in the same buffers must all be right."""
    m, n, k = 256, 384, 512
    cfg = config(variant, "bf16", "rcr")
    pairs = [(operand(m, k, "bf16", "r", gen), operand(k, n, "bf16", "c", gen)) for _ in range(2)]
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    for alpha, (a, b) in [(1.0, pairs[0]), (1.0, pairs[1]), (1.0, pairs[0]), (0.5, pairs[0])]:
        for _ in range(2):  # the second call repeats the first exactly
            out.fill_(float("nan"))
            dispatcher.gemm(a, b, out=out, alpha=alpha, variant=variant, target="cuda", config=cfg)
            torch.cuda.synchronize()
            assert max_rel(out.float().cpu().numpy(), reference(a, b, alpha)) <= tolerance(cfg, k)
    a, b = pairs[0]
    a.copy_(operand(m, k, "bf16", "r", gen))  # same buffers, new contents
    dispatcher.gemm(a, b, out=out, variant=variant, target="cuda", config=cfg)
    torch.cuda.synchronize()
    assert max_rel(out.float().cpu().numpy(), reference(a, b)) <= tolerance(cfg, k)
