"""Batched GEMM (CUTLASS batch mode L) and the fused epilogues (CUTLASS
epilogue fusion operations) on a GPU, against float64 on the same quantized
inputs into NaN-poisoned outputs (marked `gpu`; `-m gpu` on a Hopper machine)."""

import math

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes
from dispatcher.verify import max_rel

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}
ACTIVATIONS = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}


def rand(shape, dtype, gen):
    return (torch.rand(*shape, generator=gen, device="cuda") * 4 - 2).to(TORCH[dtype])


def f64(x):
    return x.double().cpu().numpy()


def tol(dtype, k):
    return dtypes.relative_tolerance(dtypes.output_for(dtype).token, k)


# One explicit tile per kernel, so that benchmarks/cuda_sweeps.py's `batched`
# set (built ahead by build_cuda.py) holds every kernel these tests run.
TILE = dict(tile_m=128, tile_n=128, cluster_m=1)
EPILOGUES = [("regular", "col", "gelu"), ("regular", "row", "relu"), ("regular", "col", "silu"),
             ("regular", "row", "none"), ("batched", "col", "none"), ("batched", "row", "gelu")]


def tile(dtype):
    return dict(TILE, tile_k=128 // dtypes.get(dtype).itemsize)


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(0)


@pytest.mark.parametrize("shape_a, shape_b", [
    ((6, 136, 72), (6, 72, 200)),
    ((3, 2, 128, 64), (3, 2, 64, 96)),
    ((4, 256, 128), (128, 64)),            # one B for every batch (batch stride 0)
])
def test_batched_bf16(shape_a, shape_b, gen):
    a, b = rand(shape_a, "bf16", gen), rand(shape_b, "bf16", gen)
    expected = np.matmul(f64(a), f64(b))
    out = torch.full(expected.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    dispatcher.matmul(a, b, out=out, target="cuda", config=tile("bf16"))
    torch.cuda.synchronize()
    assert max_rel(f64(out), expected) <= tol("bf16", shape_a[-1])


@pytest.mark.parametrize("variant, per, activation", EPILOGUES)
def test_fused_epilogues(variant, per, activation, gen):
    batch = (3,) if variant == "batched" else ()
    m, n, k = 264, 192, 128
    a, b = rand(batch + (m, k), "bf16", gen), rand(batch + (k, n), "bf16", gen)
    bias = rand((n,), "bf16", gen) if per == "col" else rand((m, 1), "bf16", gen)
    out = torch.full(batch + (m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    dispatcher.run(variant, a=a, b=b, out=out, bias=bias, activation=activation, alpha=0.5,
                   target="cuda", config=tile("bf16"))
    torch.cuda.synchronize()
    expected = ACTIVATIONS[activation](0.5 * np.matmul(f64(a), f64(b)) + f64(bias))
    assert max_rel(f64(out), expected) <= tol("bf16", k)


def test_fp8_scales_and_bias(gen):
    a = rand((512, 256), "fp8_e4m3", gen)
    b = rand((256, 384), "fp8_e4m3", gen).t().contiguous().t()  # K-major B, as fp8 MMA needs
    bias = rand((384,), "fp16", gen)
    out = dispatcher.matmul(a, b, bias=bias, activation="relu", scale_a=0.25, scale_b=2.0, target="cuda",
                            config=tile("fp8_e4m3"))
    torch.cuda.synchronize()
    expected = np.maximum(0.5 * (f64(a) @ f64(b)) + f64(bias), 0)
    assert max_rel(f64(out), expected) <= tol("fp8_e4m3", 256)


@pytest.mark.parametrize("variant, per, activation", [("regular", "col", "gelu"), ("batched", "row", "gelu")])
def test_unaligned_operands_with_a_fused_epilogue(variant, per, activation, gen):
    """Odd M, N and K (no 16-byte pitch) and a bias at an odd offset: the
    kernel stages them in its workspace (native/cuda/staging.hpp), in batch
    mode too, and writes only the result's own elements."""
    batch = (3,) if variant == "batched" else ()
    m, n, k = 263, 191, 127
    a, b = rand(batch + (m, k), "bf16", gen), rand(batch + (k, n), "bf16", gen)
    bias = rand((n + 1,), "bf16", gen)[1:] if per == "col" else rand((m + 1, 1), "bf16", gen)[1:]
    whole = torch.full(batch + (m, n + 1), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = whole[..., :n]  # rows of 192 elements: the column past N must stay NaN
    dispatcher.run(variant, a=a, b=b, out=out, bias=bias, activation=activation, alpha=0.5,
                   target="cuda", config=tile("bf16"))
    torch.cuda.synchronize()
    expected = ACTIVATIONS[activation](0.5 * np.matmul(f64(a), f64(b)) + f64(bias))
    assert max_rel(f64(out), expected) <= tol("bf16", k)
    assert torch.isnan(whole[..., n]).all()


def test_unaligned_batched_matmul_replays_in_a_cuda_graph(gen):
    """A staged call (its copies, the GEMM and the copy back) is captured in
    a CUDA graph and replays with new data in the same buffers."""
    a, b = rand((4, 100, 77), "bf16", gen), rand((4, 77, 90), "bf16", gen)
    out = torch.empty((4, 100, 90), device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dispatcher.matmul(a, b, out=out, config=tile("bf16"))  # warm up: select, build, bind
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        dispatcher.matmul(a, b, out=out, config=tile("bf16"))
    for _ in range(2):
        a.copy_(rand((4, 100, 77), "bf16", gen))
        b.copy_(rand((4, 77, 90), "bf16", gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert max_rel(f64(out), np.matmul(f64(a), f64(b))) <= tol("bf16", 77)
