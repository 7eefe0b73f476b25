"""The cuda target on a GPU (marked `gpu`; run with `-m gpu` on a Hopper machine)."""

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
TILE = dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1)


def operand(rows, cols, dtype, layout, gen):
    x = (torch.rand(rows, cols, generator=gen, device="cuda") * 4 - 2).to(TORCH[dtype])
    return x if layout == "r" else x.t().contiguous().t()


def reference(a, b, alpha=1.0, c=None, beta=0.0):
    ref = alpha * (a.double().cpu().numpy() @ b.double().cpu().numpy())
    return ref + beta * c.double().cpu().numpy() if beta else ref


def config(variant, dtype, layout, **kw):
    tile_k = 128 // dtypes.get(dtype).itemsize
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


def test_stream_k_linear_is_deterministic(gen):
    a, b = operand(256, 8192, "bf16", "r", gen), operand(8192, 256, "bf16", "c", gen)
    cfg = config("stream_k", "bf16", "rcr", reduction="linear", decomposition="stream_k")
    outs = [dispatcher.gemm(a, b, target="cuda", variant="stream_k", config=cfg) for _ in range(5)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


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


def test_misaligned_problem_is_unsupported(gen):
    a, b = operand(7, 7, "bf16", "r", gen), operand(7, 7, "bf16", "r", gen)  # 14-byte rows
    with pytest.raises(errors.UnsupportedProblem, match="16-byte aligned"):
        dispatcher.gemm(a, b, target="cuda", config=config("regular", "bf16", "rrr"))
    # stream-K falls back to regular when not strict -- which also rejects it
    with pytest.raises(errors.UnsupportedProblem):
        dispatcher.gemm(a, b, target="cuda", variant="stream_k")


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
