"""dispatcher.torch on CPU tensors: the gemm_dispatcher::gemm op against a
float64 reference, its autograd against torch's own gradients, opcheck,
torch.compile without graph breaks, and Linear in a model that trains as
the nn.Linear one does."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dispatcher  # noqa: E402
from conftest import train_losses  # noqa: E402
import dispatcher.torch as dt  # noqa: E402
from dispatcher.torch import eager, ops  # noqa: E402
from dispatcher import dtypes  # noqa: E402
from dispatcher.plugins import get_manager  # noqa: E402
from dispatcher.torch.tensors import host_view, token  # noqa: E402
from dispatcher.verify import max_rel, reference  # noqa: E402

TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# A GEMM of bf16 operands whose K is small: the bound of one output rounding
# and float32 accumulation (dtypes.relative_tolerance).
TOL = {d: dtypes.relative_tolerance(d, 512) for d in TORCH}


@pytest.fixture(autouse=True)
def poisoned_allocations():
    """Every torch.empty (the op's outputs included) comes filled with NaN,
    so an element a kernel fails to write cannot pass as a result."""
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(False)


def matrix(rows, cols, dtype, layout="r", seed=0):
    """Values in [-2, 2) quantized to `dtype`; 'c': a column-major view."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 4 - 2).to(TORCH[dtype])
    return x.t().contiguous().t() if layout == "c" else x


def f64(x):
    return None if x is None else x.detach().double().numpy()


def ref(a, b, c=None, alpha=1.0, beta=0.0):
    return reference(f64(a), f64(b), f64(c), alpha, beta)


def rel(out, expected):
    return max_rel(f64(out), expected)


def test_importing_dispatcher_does_not_import_torch():
    """Every module of the package but dispatcher.torch (and __main__, the CLI)."""
    code = """if True:
        import importlib, pathlib, sys, dispatcher
        root = pathlib.Path(dispatcher.__file__).parent
        for path in root.rglob("*.py"):
            name = ".".join(("dispatcher", *path.relative_to(root).with_suffix("").parts))
            if not name.startswith("dispatcher.torch") and not name.endswith("__main__"):
                importlib.import_module(name.removesuffix(".__init__"))
                assert "torch" not in sys.modules, f"importing {name} imported torch"
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_import_without_torch_says_how_to_install(tmp_path):
    (tmp_path / "torch.py").write_text("raise ImportError('No module named torch')")
    done = subprocess.run([sys.executable, "-c", "import dispatcher.torch"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert "pip install 'gemm-dispatcher[torch]'" in done.stderr and done.returncode == 1


@pytest.mark.parametrize("dtype,layout", [("fp32", "rr"), ("fp32", "rc"), ("fp32", "cr"),
                                          ("bf16", "rc"), ("fp16", "rr")])
def test_gemm_matches_float64_reference(dtype, layout):
    a, b = matrix(37, 70, dtype, layout[0], 1), matrix(70, 53, dtype, layout[1], 2)
    out = dt.gemm(a, b)
    assert out.dtype == TORCH[dtype] and out.shape == (37, 53) and out.is_contiguous()
    assert rel(out, ref(a, b)) <= TOL[dtype]


def test_gemm_alpha_beta_c_and_out_dtype():
    a, b, c = matrix(40, 64, "bf16", "r", 1), matrix(64, 24, "bf16", "c", 2), matrix(40, 24, "fp32", "r", 3)
    out = dt.gemm(a, b, c=c, alpha=0.5, beta=-2.0, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert rel(out, ref(a, b, c, 0.5, -2.0)) <= TOL["fp32"] * 4
    assert torch.equal(c, matrix(40, 24, "fp32", "r", 3))  # c is read, not written


def test_output_dtype_follows_dispatcher_rule():
    a = matrix(8, 8, "fp32").to(torch.int8)
    out = dt.gemm(a, a)
    assert out.dtype == torch.int32
    assert torch.equal(out, (a.long() @ a.long()).int())


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


# bf16 in CI's slow step: the fast suite keeps bf16's forward (opcheck, the reference test) and its
# backward under autocast (test_linear_under_autocast_computes_as_nn_linear)
@pytest.mark.parametrize("dtype", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])
def test_autograd_matches_torch_gradients(dtype):
    """Gradients of a, b (a transposed view) and c against torch's autograd
    on float64 copies of the same inputs; each has its leaf's layout."""
    a0, w0, c0 = matrix(33, 48, dtype, "r", 1), matrix(20, 48, dtype, "r", 2), matrix(33, 20, dtype, "r", 3)
    a, w, c = _leaves(a0, w0, c0)
    a64, w64, c64 = _leaves(a0.double(), w0.double(), c0.double())
    g = matrix(33, 20, dtype, "r", 4)
    dt.gemm(a, w.t(), c=c, alpha=1.5, beta=0.25).backward(g)
    (1.5 * a64 @ w64.t() + 0.25 * c64).backward(g.double())
    for got, want in ((a, a64), (w, w64), (c, c64)):
        assert got.grad.dtype == got.dtype and got.grad.stride() == got.stride()
        assert rel(got.grad, f64(want.grad)) <= TOL[dtype] * 2


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """A pass-through dispatch mode that records the operators it sees."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", ["eager", "operator"])
def test_eager_calls_and_the_operator_agree(path, monkeypatch):
    """An eager call on plain tensors runs the kernel function (or its
    autograd.Function) without torch's dispatcher; under a dispatch mode
    the same call is the operator, which the mode sees, with
    register_autograd's formula. Both against the float64 reference, with
    the same gradients."""
    calls = []
    monkeypatch.setattr(dt.ops._GEMM, "operator", lambda *args: calls.append(1) or
                        torch.ops.gemm_dispatcher.gemm.default(*args))
    a0, w0, c0 = matrix(33, 48, "fp32", "r", 1), matrix(20, 48, "fp32", "r", 2), matrix(33, 20, "fp32", "r", 3)
    a, w, c = _leaves(a0, w0, c0)
    g = matrix(33, 20, "fp32", "r", 4)
    recorder = _Recorder()
    with recorder if path == "operator" else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
        out = dt.gemm(a, w.t(), c=c, alpha=1.5, beta=0.25)
    assert rel(out, ref(a0, w0.t(), c0, 1.5, 0.25)) <= TOL["fp32"]
    assert (torch.ops.gemm_dispatcher.gemm.default in recorder.seen) == (path == "operator") == bool(calls)
    out.backward(g)
    a64, w64, c64 = _leaves(a0.double(), w0.double(), c0.double())
    (1.5 * a64 @ w64.t() + 0.25 * c64).backward(g.double())
    for got, want in ((a, a64), (w, w64), (c, c64)):
        assert rel(got.grad, f64(want.grad)) <= TOL["fp32"] * 2


def test_backward_reads_transposed_views_without_copies(monkeypatch):
    """Each backward GEMM reads the saved operands and the gradient in place."""
    a, w = _leaves(matrix(16, 32, "fp32", "r", 1), matrix(8, 32, "fp32", "r", 2))
    out = dt.gemm(a, w.t())
    grad = matrix(16, 8, "fp32", "r", 3)
    seen, planned = [], ops.planned
    monkeypatch.setattr(ops, "planned", lambda key, variant, operands, general, **kw:
                        seen.append(operands) or planned(key, variant, operands, general, **kw))
    out.backward(grad)
    buffers = [host_view(t) for t in (a, w, grad)]
    assert len(seen) == 2
    for operands in seen:  # every operand is a view of a, w or grad
        for operand in (operands["a"], operands["b"]):
            assert any(np.shares_memory(host_view(operand), buf) for buf in buffers)


def test_warm_op_calls_run_their_held_plan_on_the_tensors(monkeypatch):
    """The first eager call of a kind plans it, once; later ones run the
    plan's runner on the tensors themselves (no numpy view, no new plan),
    right against the float64 reference; a new shape, stride or dtype
    plans again, and so does every kind after a plugin registration."""
    monkeypatch.setattr(eager, "_HELD", {})
    made, views = [], []
    plan, for_target = dispatcher.plan, eager.for_target
    monkeypatch.setattr(dispatcher, "plan", lambda *x, **kw: made.append(x) or plan(*x, **kw))
    monkeypatch.setattr(eager, "for_target", lambda t, target: views.append(t) or for_target(t, target))
    a, w, bias = matrix(24, 40, "fp32", "r", 1), matrix(16, 40, "fp32", "r", 2), matrix(1, 16, "fp32", "r", 3)[0]
    linear = torch.nn.Linear(40, 16)
    with torch.no_grad():
        linear.weight.copy_(w)
        linear.bias.copy_(bias)
    layer = dt.Linear.from_linear(linear)

    def check(x, calls):
        for _ in range(calls):
            assert max_rel(dt.gemm(x, w.t()), reference(f64(x), f64(w).T)) <= 1e-5
            with torch.no_grad():
                y = layer(x)
            assert max_rel(y, reference(f64(x), f64(w).T) + f64(bias)) <= 1e-5
    check(a, 3)
    assert len(made) == 2 and len(views) == 2 + 3  # the first calls only: gemm's a, b; linear's x, w, bias
    made.clear(), views.clear()
    check(a[::1, :].t().contiguous().t(), 2)  # column-major: a new stride
    check(a[:13], 2)  # a new shape
    assert len(made) == 4
    made.clear()
    check(a.double().float(), 2)  # another tensor with the same specs: no new plan
    assert made == []

    class Nothing:
        pass
    manager = get_manager()
    manager.register(Nothing(), "nothing-test-plugin")
    try:
        check(a, 2)
        assert len(made) == 2
    finally:
        manager.unregister(name="nothing-test-plugin")
    made.clear()
    dt.gemm(a.to(torch.bfloat16), w.t().to(torch.bfloat16))  # a new dtype
    assert len(made) == 1


def test_sum_backward_gradient_with_zero_strides():
    """The gradient of .sum() is an expanded (stride 0) tensor: copied once, then right."""
    a, b = _leaves(matrix(12, 16, "fp32", "r", 1), matrix(16, 8, "fp32", "r", 2))
    dt.gemm(a, b).sum().backward()
    assert torch.allclose(a.grad, torch.ones(12, 8) @ b.detach().t(), rtol=1e-6)
    assert torch.allclose(b.grad, a.detach().t() @ torch.ones(12, 8), rtol=1e-6)


@pytest.mark.parametrize("case", ["fp32", "bf16_transposed_b", "c_beta_out_dtype"])
def test_opcheck(case):
    a = matrix(24, 40, "bf16" if case != "fp32" else "fp32", "r", 1).requires_grad_()
    b = matrix(40, 16, a.dtype == torch.bfloat16 and "bf16" or "fp32", "c", 2).requires_grad_()
    args = (a, b)
    if case == "c_beta_out_dtype":
        args = (a, b, matrix(24, 16, "fp32", "r", 3).requires_grad_(), 1.0, 0.5, torch.float32)
    result = torch.library.opcheck(torch.ops.gemm_dispatcher.gemm.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_bad_input_raises_dispatcher_errors():
    a = matrix(8, 4, "fp32")
    with pytest.raises(dispatcher.ProblemError, match="do not multiply"):
        dt.gemm(a, a)
    with pytest.raises(dispatcher.ProblemError, match="2-D"):
        dt.gemm(a[0], a.t())
    with pytest.raises(dispatcher.DtypeError, match="float64"):
        dt.gemm(a.double(), a.t().double())
    with pytest.raises(dispatcher.LayoutError, match=r"pass a.contiguous\(\)"):
        dt.gemm(matrix(4, 16, "fp32")[:, ::2], a)
    with pytest.raises(dispatcher.ConfigError, match="not registered"):
        torch.ops.gemm_dispatcher.gemm(a, a.t(), None, 1.0, 0.0, None, "regular", "no-such-key")
    with pytest.raises(dispatcher.ConfigError, match="KernelConfig or a dict"):
        dt.gemm(a, a.t(), config=42)


def test_the_ops_refuse_variants_of_other_problem_kinds():
    """gemm and linear run single-GEMM variants: another kind is the
    ConfigError dispatcher.gemm / dispatcher.run give, on every call."""
    a, b = matrix(8, 16, "fp32"), matrix(16, 4, "fp32")
    for _ in range(2):
        with pytest.raises(dispatcher.ConfigError, match="runs grouped problems"):
            dt.gemm(a, b, variant="grouped")
        with pytest.raises(dispatcher.ConfigError, match="runs batched problems"):
            dt.gemm(a, b, variant="batched")
        with pytest.raises(dispatcher.ConfigError, match="declares no operands"):
            ops.linear(a, b.t(), variant="grouped")


def test_variant_and_autotune_reach_the_backward_gemms(monkeypatch):
    """Both travel with the op into its backward; autotune itself is
    dispatcher.gemm's (here switched off after the record, to build nothing more)."""
    a, b = _leaves(matrix(12, 16, "fp32", "r", 1), matrix(16, 8, "fp32", "r", 2))
    seen, planned = [], ops.planned

    def spy(key, variant, operands, general, **kw):
        seen.append((variant, kw["autotune"]))
        return planned(key, variant, operands, general, **{**kw, "autotune": False})

    monkeypatch.setattr(ops, "planned", spy)
    for name in ("gemm", "run"):  # the first call of a kind goes through them
        entry = getattr(dispatcher, name)
        monkeypatch.setattr(dispatcher, name, lambda *x, entry=entry, **kw: entry(*x, **{**kw, "autotune": False}))
    out = dt.gemm(a, b, variant="stream_k", autotune=True)
    out.backward(matrix(12, 8, "fp32", "r", 3))
    assert seen == [("stream_k", True)] * 3
    assert torch.allclose(out, a.detach() @ b.detach(), rtol=1e-5, atol=1e-5)
    seen.clear()
    dt.Linear(16, 4, bias=False, autotune=False)(a)
    dt.Linear(16, 4, bias=True, variant="stream_k", autotune=False)(a)  # stream_k fuses no bias: gemm + add
    assert seen == [("regular", False), ("stream_k", False)]


def test_config_passes_through(monkeypatch):
    fields = dict(tile_m=24, tile_n=64, tile_k=32)
    seen, gemm = [], dispatcher.gemm
    monkeypatch.setattr(dispatcher, "gemm", lambda *x, **kw: seen.append(kw["config"]) or gemm(*x, **kw))
    layer = dt.Linear(32, 16, bias=False, config=fields)
    x = matrix(5, 32, "fp32")
    assert torch.allclose(layer(x), x @ layer.weight.detach().t(), rtol=1e-5, atol=1e-6)
    assert seen == [fields]
    config = dispatcher.KernelConfig.create(layout="rcr", **fields)
    assert dt.config_key(config) == config.name and dt.config_key(config.name) == config.name


# ------------------------------------------------------------------ Linear
def test_linear_is_a_drop_in():
    torch.manual_seed(0)
    ref_layer = torch.nn.Linear(48, 24)
    layer = dt.Linear(48, 24)
    layer.load_state_dict(ref_layer.state_dict())
    assert set(layer.state_dict()) == {"weight", "bias"}
    torch.nn.Linear(48, 24).load_state_dict(layer.state_dict())
    x = matrix(2 * 7 * 48, 1, "fp32").reshape(2, 7, 48)
    assert torch.allclose(layer(x), ref_layer(x), rtol=1e-5, atol=1e-5)
    assert isinstance(layer, torch.nn.Linear)


def test_linear_under_autocast_computes_as_nn_linear():
    """An fp32 layer under torch.autocast(bf16): bf16 output and fp32
    parameter gradients, as nn.Linear gives; the same values within bf16
    rounding (both compute from the same bf16-cast inputs)."""
    torch.manual_seed(0)
    ref_layer = torch.nn.Linear(64, 40)
    layer = dt.Linear.from_linear(torch.nn.Linear(64, 40))
    layer.load_state_dict(ref_layer.state_dict())
    x = matrix(24, 64, "fp32")
    outs, grads = [], []
    for model in (ref_layer, layer):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
        y.float().square().sum().backward()
        outs.append(y)
        grads.append(model.weight.grad)
    assert outs[1].dtype == outs[0].dtype == torch.bfloat16
    assert grads[1].dtype == torch.float32
    assert rel(outs[1], f64(outs[0])) <= 2 * TOL["bf16"]
    assert rel(grads[1], f64(grads[0])) <= 4 * TOL["bf16"]


def test_swap_linears_in_place_shares_parameters():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8, bias=False))
            self.attn = torch.nn.MultiheadAttention(8, 2)  # out_proj: an nn.Linear subclass, kept

    model = Block()
    weight = model.inner[0].weight
    assert dt.swap_linears(model) is model
    assert type(model.inner[0]) is dt.Linear and type(model.inner[2]) is dt.Linear
    assert model.inner[0].weight is weight and model.inner[2].bias is None
    assert type(model.attn.out_proj) is not dt.Linear
    bare = torch.nn.Linear(4, 4)
    assert type(dt.swap_linears(bare)) is dt.Linear and dt.swap_linears(bare).weight is bare.weight


def mlp(dtype, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32),
                               torch.nn.GELU(), torch.nn.Linear(32, 1)).to(dtype)


def batch(dtype):
    gen = torch.Generator().manual_seed(7)
    return torch.randn(64, 32, generator=gen).to(dtype), torch.randn(64, 1, generator=gen).to(dtype)


# bf16 in CI's slow step (the ops' bf16 path stays in the fast suite:
# test_gemm_matches_float64_reference, test_opcheck)
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5),
                                        pytest.param(torch.bfloat16, 3e-2, marks=pytest.mark.slow)])
def test_mlp_trains_as_nn_linear(dtype, rtol):
    expected = train_losses(mlp(dtype), *batch(dtype))
    got = train_losses(dt.swap_linears(mlp(dtype)), *batch(dtype))
    assert expected[-1] < expected[0]  # it learns
    np.testing.assert_allclose(got, expected, rtol=rtol)


# ------------------------------------------------------------------ compile
def check_compiled_matches_eager(backend):
    """Forward and backward of a Linear MLP compiled whole (fullgraph raises
    on a graph break) against eager: outputs and input gradients."""
    model = dt.swap_linears(mlp(torch.float32))
    x = matrix(16, 32, "fp32").requires_grad_()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    expected = model(x)
    expected.sum().backward()
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-6)
    assert torch.allclose(grad, x.grad, rtol=1e-5, atol=1e-6)


def test_compile_fullgraph_no_graph_break():
    model = dt.swap_linears(mlp(torch.float32))
    assert torch._dynamo.explain(model)(matrix(16, 32, "fp32")).graph_break_count == 0
    check_compiled_matches_eager("aot_eager")


@pytest.mark.torch_inductor
def test_compile_inductor_fullgraph():
    """Inductor (C++ codegen on CPU) around the op."""
    torch.use_deterministic_algorithms(False)  # inductor's generated code, not our allocations
    check_compiled_matches_eager("inductor")


# ------------------------------------------------------------------ grouped_mm
def routed(dtype, transposed_b, seed=0):
    """Stacked tokens (27 rows, the last 4 routed nowhere), 3 experts of
    which the middle one gets no rows; b as (G, K, N), or as the transposed
    view of (G, N, K) weights."""
    a = matrix(27, 40, dtype, "r", seed)
    w = torch.stack([matrix(24, 40, dtype, "r", seed + 1 + g) for g in range(3)])
    b = w.transpose(1, 2) if transposed_b else w.transpose(1, 2).contiguous()
    return a, b, torch.tensor([9, 9, 23], dtype=torch.int32)


def grouped_reference(a, b, offsets, alpha=1.0):
    """The float64 result, built with torch autograd so gradients come with it."""
    rows = [0, *offsets.tolist()]
    parts = [alpha * a[rows[g]:rows[g + 1]] @ b[g] for g in range(b.shape[0])]
    return torch.cat([*parts, torch.zeros(a.shape[0] - rows[-1], b.shape[2], dtype=a.dtype)])


@pytest.mark.parametrize("dtype,transposed_b", [("fp32", False), ("bf16", True)])
def test_grouped_mm_matches_float64_reference(dtype, transposed_b):
    a, b, offsets = routed(dtype, transposed_b)
    out = dt.grouped_mm(a, b, offsets, alpha=0.5)
    assert out.shape == (27, 24) and out.dtype == TORCH[dtype]
    assert rel(out, f64(grouped_reference(a.double(), b.double(), offsets, 0.5))) <= TOL[dtype]
    assert torch.equal(out[23:], torch.zeros(4, 24, dtype=out.dtype))


@pytest.mark.parametrize("dtype", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])  # (as above)
def test_grouped_mm_autograd_matches_torch_gradients(dtype):
    a0, b0, offsets = routed(dtype, True, seed=3)
    w0 = b0.transpose(1, 2)  # the (G, N, K) weights a model holds
    a, w = _leaves(a0, w0)
    a64, w64 = _leaves(a0.double(), w0.double())
    g = matrix(27, 24, dtype, "r", 9)
    dt.grouped_mm(a, w.transpose(1, 2), offsets, alpha=1.5).backward(g)
    grouped_reference(a64, w64.transpose(1, 2), offsets, 1.5).backward(g.double())
    for got, want in ((a, a64), (w, w64)):
        assert got.grad.dtype == got.dtype and got.grad.stride() == got.stride()
        assert rel(got.grad, f64(want.grad)) <= TOL[dtype] * 2
    assert torch.equal(w.grad[1], torch.zeros_like(w.grad[1]))  # the expert without rows


@pytest.mark.parametrize("op", ["grouped_mm", "grouped_mm_grad_b"])
def test_grouped_opcheck(op):
    a, b, offsets = routed("bf16", True)
    if op == "grouped_mm":
        args = (a.requires_grad_(), b.requires_grad_(), offsets)
    else:
        args = (a, matrix(27, 24, "bf16"), offsets, 1.0, True)
    result = torch.library.opcheck(getattr(torch.ops.gemm_dispatcher, op).default, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_grouped_mm_compiles_fullgraph():
    a0, b0, offsets = routed("fp32", True)
    a, w = _leaves(a0, b0.transpose(1, 2))

    def experts(x, weights):
        return torch.nn.functional.gelu(dt.grouped_mm(x, weights.transpose(1, 2), offsets)).sum()

    compiled = torch.compile(experts, backend="aot_eager", fullgraph=True)
    compiled(a, w).backward()
    grads = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = None
    experts(a, w).backward()
    assert torch.allclose(grads[0], a.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(grads[1], w.grad, rtol=1e-5, atol=1e-5)


def test_grouped_mm_bad_input():
    a, b, offsets = routed("fp32", False)
    with pytest.raises(dispatcher.ProblemError, match="do not fit"):
        dt.grouped_mm(a, b, offsets[:2])
    with pytest.raises(dispatcher.LayoutError, match=r"pass b.contiguous\(\)"):
        dt.grouped_mm(a, b[:, :, ::2], offsets)
    with pytest.raises(dispatcher.ProblemError, match="non-decreasing"):
        dt.grouped_mm(a, b, torch.tensor([9, 4, 23], dtype=torch.int32))


def test_plain_api_on_cpu_tensors_points_to_dispatcher_torch():
    """dispatcher.gemm runs numpy arrays on the cpu target; CPU tensors get
    a ProblemError that names the torch entry points, not a bare type."""
    a = torch.ones(3, 4)
    with pytest.raises(dispatcher.ProblemError, match="dispatcher.torch"):
        dispatcher.gemm(a, torch.ones(4, 2))


def test_objects_that_are_not_tensors_get_the_general_error():
    """The plain-call key reads tensors' devices only after checking that
    they are tensors: anything else is refused as the general path says."""
    for bad in (torch.Size([3, 4]), torch.nn.Linear(4, 2)):
        with pytest.raises(dispatcher.DispatcherError):
            dispatcher.gemm(bad, torch.ones(4, 2))
