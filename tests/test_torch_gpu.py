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
# A Linear (in, out features) whose forward kernel needs scratch at these tokens
# (test_linear_calls_whose_kernels_need_scratch_run_in_cpp; benchmarks/cuda_sweeps.py builds its kernels)
SCRATCH_TOKENS, SCRATCH_LINEAR = 1024, (3072, 2816)


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


def _captured(fn, *feeds):
    """fn() captured in a CUDA graph (after one eager call outside it), then
    replayed once per feed (a function that writes new data into the
    captured inputs): yields the captured output after each replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for feed in feeds:
        feed()
        out.fill_(float("nan")) if out.is_floating_point() else None
        graph.replay()
        torch.cuda.synchronize()
        yield out


def test_matmul_epilogue_and_plain_gemm_capture_and_replay():
    """dispatcher.matmul with a fused bias + GELU and dispatcher.gemm on
    torch tensors, captured and replayed with new data (torch's allocator,
    no CuPy, inside the capture)."""
    import dispatcher
    a, b = matrix(256, 512, 1), matrix(512, 384, 2)
    bias = matrix(1, 384, 5).reshape(384)
    for out in _captured(lambda: dispatcher.matmul(a, b, bias=bias, activation="gelu"),
                         lambda: a.copy_(matrix(256, 512, 8))):
        expected = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
        assert rel(out, expected) <= 2 * BF16
    for out in _captured(lambda: dispatcher.gemm(a, b), lambda: b.copy_(matrix(512, 384, 9))):
        assert rel(out, a.double() @ b.double()) <= BF16


def test_linear_forward_backward_captured_and_make_graphed_callables():
    """A dispatcher.torch.Linear MLP through torch.cuda.make_graphed_callables:
    forward and backward replay and match nn.Linear's gradients."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                              torch.nn.Linear(512, 256)).cuda().bfloat16()
    ours = dt.swap_linears(__import__("copy").deepcopy(ref))
    x = matrix(128, 256, 3).requires_grad_()
    graphed = torch.cuda.make_graphed_callables(ours, (x,))
    for seed in (4, 5):
        xs = matrix(128, 256, seed).requires_grad_()
        x64 = xs.detach().clone().requires_grad_()
        out = graphed(xs)
        expected = ref(x64)
        assert rel(out, expected.double()) <= 4 * BF16
        out.float().sum().backward()
        expected.float().sum().backward()
        assert rel(xs.grad, x64.grad) <= 8 * BF16


@pytest.mark.native
def test_linear_native_calls_on_cuda_forward_backward_and_captured():
    """Linear's native calls (dispatcher/torch/native.py) on CUDA tensors:
    from the third call on the forward and backward run in C++ (torch's C++
    node), on the current stream, right against float64; a call under
    capture (another stream) goes the Python way and replays right."""
    from dispatcher.torch import native
    assert native.extension(wait=True) is not None, native.failure()
    torch.manual_seed(0)
    ref = torch.nn.Linear(512, 384).cuda().bfloat16()
    ours = dt.Linear.from_linear(__import__("copy").deepcopy(ref))
    for step in range(4):
        x = matrix(256, 512, 10 + step).requires_grad_()
        x64 = x.detach().double().requires_grad_()
        y = ours(x)
        expected = x64 @ ref.weight.double().t() + ref.bias.double()
        assert rel(y, expected) <= BF16, step
        if step >= 2:
            assert type(y.grad_fn).__name__ == "CppFunction", step
        g = matrix(256, 384, 20 + step)
        y.backward(g)
        expected.backward(g.double())
        assert rel(x.grad, x64.grad) <= 2 * BF16, step
    x = matrix(256, 512, 30)
    with torch.no_grad():
        ours(x)  # warm on this stream
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ours(x)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            y = ours(x)
        x.copy_(matrix(256, 512, 31))
        graph.replay()
        torch.cuda.synchronize()
        assert rel(y, x.double() @ ref.weight.double().t() + ref.bias.double()) <= BF16


@pytest.mark.native
def test_linear_backward_launches_missed_at_first_are_planned_on_cuda():
    """As on the CPU (test_torch_native.py): forward-only calls with a
    weight that wants a gradient, then training steps; the backward's
    GEMMs end up planned in C++ (the H100 profile of call_overhead.py's
    Linear had dW through the Python operator on every step), and the
    gradients stay right against float64."""
    from dispatcher.torch import native
    assert native.extension(wait=True) is not None, native.failure()
    torch.manual_seed(0)
    ours = dt.Linear.from_linear(torch.nn.Linear(320, 192).cuda().bfloat16())
    x = matrix(136, 320, 50)
    for _ in range(6):
        ours(x)
    w = ours.weight.double()
    for step in range(6):
        xg = x.clone().requires_grad_()
        dy = matrix(136, 192, 60 + step)
        ours(xg).backward(dy)
        assert rel(xg.grad, dy.double() @ w) <= 2 * BF16, step
        assert rel(ours.weight.grad, dy.double().t() @ x.double()) <= 2 * BF16, step
        ours.zero_grad()
    assert ours.__dict__["_native"].plans.planned(x, ours.weight, ours.bias) == 7


@pytest.mark.native
def test_linear_calls_whose_kernels_need_scratch_run_in_cpp():
    """A Linear whose forward kernel needs scratch memory (the shipped
    selection for 1024 x 2816 x 3072 is a hybrid stream-K kernel whose
    176 tiles all run in pieces, summed through partial tiles in a
    workspace; benchmarks/cuda_sweeps.py builds it): its calls too run in
    C++ from the third on, forward and backward (torch_mlp.py's eager
    steps had gone the Python way on every call: 0.95 ms of host time per
    step at d 2048), the forward on scratch from torch's allocator, and
    stay right against float64."""
    from dispatcher.torch import eager, native
    assert native.extension(wait=True) is not None, native.failure()
    torch.manual_seed(0)
    ours = dt.Linear.from_linear(torch.nn.Linear(*SCRATCH_LINEAR, bias=False).cuda().bfloat16())
    w = ours.weight.double()
    for step in range(4):
        x = matrix(SCRATCH_TOKENS, SCRATCH_LINEAR[0], 70 + step).requires_grad_()
        y = ours(x)
        assert rel(y, x.double() @ w.t()) <= BF16, step
        if step >= 2:
            assert type(y.grad_fn).__name__ == "CppFunction", step
        dy = matrix(SCRATCH_TOKENS, SCRATCH_LINEAR[1], 80 + step)
        y.backward(dy)
        assert rel(x.grad, dy.double() @ w) <= 2 * BF16, step
        assert rel(ours.weight.grad, dy.double().t() @ x.double()) <= 2 * BF16, step
        ours.zero_grad()
    launch = native._launch(eager.gemm_key(x, ours.weight.t(), "regular", 1.0, None, None))
    assert launch is not None and launch[8] > 0, "the forward's kernel takes no scratch: pick a shape whose does"
    assert ours.__dict__["_native"].plans.planned(x, ours.weight, None) == 7


@pytest.mark.native
def test_plain_gemm_and_held_plans_on_cuda_tensors_run_in_cpp_and_are_right():
    """dispatcher.gemm(a, b), matmul with a fused bias and GELU, a batched
    matmul (a broadcast a) and a held plan on CUDA tensors: from their
    third call on, the C++ product of
    dispatcher.torch's module runs them (`native.Product`), right against
    float64, on the current stream; a
    call on another stream or under capture goes its own way and replays right."""
    import dispatcher
    from dispatcher.torch import native
    assert native.extension(wait=True) is not None, native.failure()
    a, b = matrix(256, 320, 1), matrix(320, 192, 2)
    bias = matrix(1, 192, 3)[0]
    batch_b = torch.stack([matrix(320, 192, 4 + i) for i in range(3)])
    held = dispatcher.plan(a=a, b=b)
    hits = None
    for step in range(4):
        if step == 2:  # gemm and matmul share their kind, the epilogue call has its own: learned by now
            hits = native._PRODUCTS[0].hits()
        a.copy_(matrix(256, 320, 10 + step))
        expected = a.double() @ b.double()
        assert rel(dispatcher.gemm(a, b), expected) <= BF16, step
        assert rel(dispatcher.matmul(a, b), expected) <= BF16, step
        assert rel(held(a, b), expected) <= BF16, step
        fused = dispatcher.matmul(a, b, bias=bias, activation="gelu")
        assert rel(fused, torch.nn.functional.gelu(expected + bias.double())) <= 2 * BF16, step
        assert rel(dispatcher.matmul(a.expand(3, -1, -1), batch_b), a.double() @ batch_b.double()) <= BF16, step
    # steps 2 and 3: gemm, matmul, the fused epilogue call and the batched one in C++
    assert native._PRODUCTS[0].hits() - hits == 8 and held.native
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dispatcher.gemm(a, b)  # warm on this stream
        dispatcher.gemm(a, b)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = dispatcher.gemm(a, b)
    a.copy_(matrix(256, 320, 40))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(y, a.double() @ b.double()) <= BF16


@pytest.mark.native
def test_gemm_into_an_out_on_cuda_tensors_runs_in_cpp_and_is_right():
    """dispatcher.gemm(a, b, out=out), matmul's and a held plan's call into
    an out on CUDA tensors: from their second call on, the C++ product of
    dispatcher.torch's module writes into the out (NaN-poisoned first),
    right against float64, and returns it; an out that overlaps an
    operand is refused as before."""
    import dispatcher
    from dispatcher.errors import AliasingError
    from dispatcher.torch import native
    assert native.extension(wait=True) is not None, native.failure()
    a, b = matrix(256, 320, 1), matrix(320, 192, 2)
    out = torch.full((256, 192), float("nan"), device="cuda", dtype=torch.bfloat16)
    held = dispatcher.plan(a=a, b=b, out=out)
    calls = (lambda: dispatcher.gemm(a, b, out=out), lambda: dispatcher.matmul(a, b, out=out),
             lambda: held(a, b, out=out))
    hits = None
    for step in range(3):
        if step == 2:  # learned by now (gemm and matmul share their kind)
            hits = native._PRODUCTS[0].hits()
        a.copy_(matrix(256, 320, 10 + step))
        for call in calls:
            out.fill_(float("nan"))
            assert call() is out
            assert rel(out, a.double() @ b.double()) <= BF16, step
    assert native._PRODUCTS[0].hits() - hits == 2 and held.native
    assert held(a, b, out=out, alpha=2.0) is out  # new scalars: the Python way (not the native launch's)
    assert rel(out, 2.0 * (a.double() @ b.double())) <= BF16
    whole = torch.empty(256 * 320, device="cuda", dtype=torch.bfloat16)
    inside = whole.view(256, 320)  # a's key, and an out of the learned kind within its bytes
    inside.copy_(a)
    with pytest.raises(AliasingError):
        dispatcher.gemm(inside, b, out=whole[:256 * 192].view(256, 192))


def test_dispatcher_torch_runs_with_cupy_hidden(tmp_path):
    """dispatcher.torch imports and runs (forward, backward, capture) in a
    process where `import cupy` fails: every allocation is torch's."""
    import subprocess
    import sys
    code = r'''
import sys
class NoCupy:
    def find_spec(self, name, path=None, target=None):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("cupy hidden by the test")
sys.meta_path.insert(0, NoCupy())
import torch, dispatcher, dispatcher.torch as dt
a = torch.randn(300, 200, device="cuda", dtype=torch.bfloat16, requires_grad=True)
b = torch.randn(200, 130, device="cuda", dtype=torch.bfloat16)
out = dt.gemm(a, b)
out.float().sum().backward()
err = (out.double() - a.double() @ b.double()).abs().max().item() / (a.double() @ b.double()).abs().max().item()
odd = dispatcher.gemm(a.detach()[:, :199], b[:199, :129])   # unaligned: staged through torch's allocator
err2 = (odd.double() - a.detach()[:, :199].double() @ b[:199, :129].double()).abs().max().item()
assert "cupy" not in sys.modules, "cupy was imported"
print("ok", err, err2)
'''
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _, err, err2 = done.stdout.split()
    assert float(err) <= BF16 and float(err2) <= 1.0  # err2: absolute, on values of size ~15


@pytest.mark.parametrize("entry", ["gemm", "matmul", "run", "plan", "torch.gemm"])
def test_unaligned_operands_through_every_entry_point(entry):
    """Odd K and N (rows of 2 * odd bytes: no 16-byte pitch) and views at odd
    offsets, through each single-GEMM entry point, against float64; three
    calls each with new values in the same views: the later ones run where
    warm calls run (C++ for gemm, matmul, a held plan and dt.gemm), whose
    launch stages the operands in scratch from torch's allocator."""
    import dispatcher
    big_a, big_b = matrix(260, 520, 1), matrix(520, 300, 2)
    a, b = big_a[1:256, 3:514], big_b[3:514, 5:290]  # 255 x 511, 511 x 285, odd offsets
    held = dispatcher.plan("regular", a=a, b=b)
    call = {"gemm": lambda: dispatcher.gemm(a, b), "matmul": lambda: dispatcher.matmul(a, b),
            "run": lambda: dispatcher.run("regular", a=a, b=b), "plan": lambda: held(a, b),
            "torch.gemm": lambda: dt.gemm(a, b)}[entry]
    for step in range(3):
        big_a.copy_(matrix(260, 520, 10 + step))
        assert rel(call(), a.double() @ b.double()) <= BF16, step


def test_a_held_plan_on_torch_tensors():
    import dispatcher
    a, b = matrix(256, 256, 1), matrix(256, 256, 2)
    p = dispatcher.plan("regular", a=a, b=b)
    for seed in (3, 4):
        a2 = matrix(256, 256, seed)
        assert rel(p(a2, b), a2.double() @ b.double()) <= BF16


def test_calls_with_an_out_run_their_runner_on_torch_tensors():
    """gemm with an out and a target, and a held plan made with an out, go
    straight to their plan's runner from the second call: the out (poisoned
    first) is written and returned, an out overlapping an input is refused."""
    import dispatcher
    from dispatcher import api
    from dispatcher.errors import AliasingError
    a, b = matrix(256, 256, 1), matrix(256, 256, 2)
    out = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    held = dispatcher.plan("regular", a=a, b=b, out=out)
    for seed in (3, 4, 5):
        a2 = matrix(256, 256, seed)
        for call in (lambda: dispatcher.gemm(a2, b, out=out, target="cuda"), lambda: held(a2, b, out=out)):
            out.fill_(float("nan"))
            assert call() is out and rel(out, a2.double() @ b.double()) <= BF16
    assert any("out" in entry[1] and entry[0].target.name == "cuda" for entry in api._RUNNERS.values())
    inside = out[:, :]  # a's specs in out's memory
    with pytest.raises(AliasingError, match="out overlaps a"):
        held(inside, b, out=out)
    with pytest.raises(AliasingError, match="out overlaps a"):
        dispatcher.gemm(inside, b, out=out, target="cuda")
