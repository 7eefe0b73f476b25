"""dispatcher.torch on CUDA tensors (marked `gpu`; `-m gpu` on a Hopper
machine): the ops in bf16 against a float64 reference, autograd, opcheck,
torch.compile with inductor, Linear training, and CUDA-graph capture and
replay with new data in the same buffers. Kernels: benchmarks/build_cuda.py
--set torch builds them ahead for a machine without nvcc."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]

import dispatcher.torch as dt  # noqa: E402
from conftest import train_losses  # noqa: E402
from dispatcher import dtypes  # noqa: E402
from dispatcher.verify import max_rel  # noqa: E402

BF16 = dtypes.relative_tolerance("bf16", 4096)


def matrix(rows, cols, seed=0, layout="r"):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.rand(rows, cols, generator=gen, device="cuda") * 4 - 2).to(torch.bfloat16)
    return x.t().contiguous().t() if layout == "c" else x


def rel(out, expected):
    return max_rel(out.detach().double().cpu().numpy(), expected.detach().double().cpu().numpy())


@pytest.mark.parametrize("layout", ["rr", "rc", "cr"])
def test_gemm_bf16(layout):
    a, b = matrix(300, 520, 1, layout[0]), matrix(520, 264, 2, layout[1])
    out = dt.gemm(a, b)
    assert out.is_cuda and out.dtype == torch.bfloat16
    assert rel(out, a.double() @ b.double()) <= BF16


def test_autograd_bf16():
    a = matrix(256, 512, 1).requires_grad_()
    w = matrix(384, 512, 2).requires_grad_()
    a64, w64 = (t.detach().double().requires_grad_() for t in (a, w))
    g = matrix(256, 384, 3)
    dt.gemm(a, w.t()).backward(g)
    (a64 @ w64.t()).backward(g.double())
    assert w.grad.stride() == w.stride()
    assert rel(a.grad, a64.grad) <= 2 * BF16 and rel(w.grad, w64.grad) <= 2 * BF16


def test_opcheck_cuda():
    a, b = matrix(128, 256, 1).requires_grad_(), matrix(256, 192, 2, "c").requires_grad_()
    result = torch.library.opcheck(torch.ops.gemm_dispatcher.gemm.default, (a, b))
    assert set(result.values()) == {"SUCCESS"}, result


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256),
                               torch.nn.GELU(), torch.nn.Linear(256, 1)).cuda().bfloat16()


@pytest.mark.parametrize("backend", [None, "inductor"], ids=["eager", "inductor"])
def test_mlp_trains_as_nn_linear(backend):
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(512, 256, generator=gen, device="cuda").bfloat16()
    y = torch.randn(512, 1, generator=gen, device="cuda").bfloat16()
    expected = train_losses(mlp(), x, y)
    got = train_losses(dt.swap_linears(mlp()), x, y, backend=backend)
    np.testing.assert_allclose(got, expected, rtol=3e-2)


def test_cuda_graph_capture_and_replay():
    """The op captured in a CUDA graph, replayed after new data is copied
    into the same input buffers: the output buffer holds the new product."""
    a, b = matrix(256, 512, 1), matrix(512, 384, 2, "c")
    dt.gemm(a, b)  # select, load and run once outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dt.gemm(a, b)
    for seed in (3, 4):
        a.copy_(matrix(256, 512, seed))
        b.copy_(matrix(512, 384, seed + 10, "c"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel(out, a.double() @ b.double()) <= BF16


def experts():
    """1000 stacked tokens, 4 experts' (N, K) weights, routing with an empty group and 100 rows routed nowhere."""
    a = matrix(1000, 256, 1)
    w = torch.stack([matrix(128, 256, 2 + g) for g in range(4)])
    return a, w, torch.tensor([100, 100, 700, 900], dtype=torch.int32, device="cuda")


def test_grouped_mm_bf16_forward_backward():
    """grouped_mm on transposed expert weights and its gradients, against float64."""
    a0, w0, offsets = experts()
    a, w = a0.requires_grad_(), w0.requires_grad_()
    a64, w64 = (t.detach().double().requires_grad_() for t in (a, w))
    out = dt.grouped_mm(a, w.transpose(1, 2), offsets)
    rows = [0, *offsets.tolist()]
    ref = torch.cat([a64[rows[g]:rows[g + 1]] @ w64[g].t() for g in range(4)]
                    + [torch.zeros(100, 128, dtype=torch.float64, device="cuda")])
    assert rel(out, ref) <= BF16
    g = matrix(1000, 128, 9)
    out.backward(g)
    ref.backward(g.double())
    assert rel(a.grad, a64.grad) <= 2 * BF16 and rel(w.grad, w64.grad) <= 2 * BF16
    assert w.grad.stride() == w.stride()


def test_grouped_mm_cuda_graph_replays_new_offsets():
    """A captured grouped_mm replayed after new routing is written into the same offsets buffer."""
    x, w, offsets = experts()
    weights = w.transpose(1, 2)
    dt.grouped_mm(x, weights, offsets)  # select and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = dt.grouped_mm(x, weights, offsets)
    offsets.copy_(torch.tensor([250, 500, 750, 1000], dtype=torch.int32))
    replayed.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    xs = x.double()
    expected = torch.cat([xs[250 * g:250 * (g + 1)] @ weights[g].double() for g in range(4)])
    assert rel(replayed, expected) <= BF16
