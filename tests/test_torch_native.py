"""dispatcher.torch.Linear's native calls (dispatcher/torch/native.py and
native_linear.cpp): once the Python way has planned a kind of call, later
calls and their backward run in C++, with the same kernels; each result
against a float64 reference of the same quantized inputs (outputs poisoned:
every torch.empty comes filled with NaN), and the Python way wherever the
native one has no plan."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.native

import dispatcher.torch as dt  # noqa: E402
from dispatcher import dtypes, native_module  # noqa: E402
from dispatcher.plugins import get_manager  # noqa: E402
from conftest import built_native_module  # noqa: E402
from dispatcher.torch import native  # noqa: E402
from dispatcher.verify import max_rel  # noqa: E402

TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(scope="module", autouse=True)
def built():
    """The module before the tests (`built_native_module`)."""
    return built_native_module(native, "CXX", ("g++", "c++"))


@pytest.fixture(autouse=True)
def poisoned_allocations():
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(False)


def quantized(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 4 - 2).to(TORCH[dtype])


def f64(t):
    return t.detach().double().numpy()


def reference(lin, rows):
    """float64 rows @ weight^T (+ bias) of a layer."""
    product = rows @ f64(lin.weight).T
    return product if lin.bias is None else product + f64(lin.bias)


def layer(dtype, bias=True, **kw):
    base = torch.nn.Linear(48, 40, bias=bias, dtype=TORCH[dtype])
    with torch.no_grad():
        base.weight.copy_(quantized((40, 48), dtype, 1))
        if bias:
            base.bias.copy_(quantized((40,), dtype, 2))
    return dt.Linear.from_linear(base, **kw)


def native_plans(module):
    found = module.__dict__.get("_native")
    return 0 if found is None else len(found.plans)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("bias", [True, False])
def test_warm_calls_run_natively_forward_and_backward(dtype, bias):
    """Calls 1 and 2 go the Python way (the first backward plans the
    backward GEMMs); from call 3 on, the forward and backward run in C++
    (the output's grad_fn is torch's C++ function node), and every output
    and gradient matches the float64 reference, 2-D and 3-D inputs alike."""
    lin = layer(dtype, bias)
    tol = dtypes.relative_tolerance(dtype, 48)
    w, b = f64(lin.weight), f64(lin.bias) if bias else 0.0
    for step in range(4):
        x = quantized((3, 7, 48) if step % 2 else (21, 48), dtype, 10 + step).requires_grad_()
        y = lin(x)
        rows = f64(x).reshape(-1, 48)
        assert max_rel(f64(y).reshape(-1, 40), rows @ w.T + b) <= tol, step
        if step >= 2:  # the product's node (under a 3-D input's reshape) is the C++ one
            node = y.grad_fn.next_functions[0][0] if x.dim() == 3 else y.grad_fn
            assert type(node).__name__ == "CppFunction", step
        dy = quantized(tuple(y.shape), dtype, 30 + step)
        y.backward(dy)
        dyr = f64(dy).reshape(-1, 40)
        assert max_rel(f64(x.grad).reshape(-1, 48), dyr @ w) <= tol, step
        assert max_rel(f64(lin.weight.grad), dyr.T @ rows) <= dtypes.relative_tolerance(dtype, 21), step
        if bias:
            assert max_rel(f64(lin.bias.grad), dyr.sum(0)) <= dtypes.relative_tolerance(dtype, 21), step
        lin.zero_grad()
    assert native_plans(lin) == 1  # (21, 48) rows and a 3-D input's (21, 48) view are one kind of call


def test_no_grad_calls_plan_the_forward_only_and_stay_right():
    lin = layer("fp32")
    x = quantized((9, 48), "fp32", 3)
    with torch.no_grad():
        ys = [lin(x) for _ in range(3)]
    assert native_plans(lin) == 1
    for y in ys:
        assert y.grad_fn is None and max_rel(f64(y), reference(lin, f64(x))) <= 1e-6


def test_a_new_shape_stride_or_dtype_goes_the_python_way_and_is_planned_then():
    lin = layer("fp32")
    with torch.no_grad():
        for x in (quantized((8, 48), "fp32", 4), quantized((8, 48), "fp32", 4).t().contiguous().t(),
                  quantized((5, 48), "fp32", 5)):
            for _ in range(2):
                assert max_rel(f64(lin(x)), reference(lin, f64(x))) <= 1e-6
    assert native_plans(lin) == 3


def test_a_plugin_registration_forgets_the_native_plans():
    lin = layer("fp32")
    x = quantized((8, 48), "fp32", 6)
    with torch.no_grad():
        lin(x), lin(x)
        assert native_plans(lin) == 1

        class Nothing:
            pass
        manager = get_manager()
        manager.register(Nothing(), "nothing-native-test")
        try:
            y = lin(x)  # the Python way, with plans made again
            assert native_plans(lin) in (0, 1)
            assert max_rel(f64(y), reference(lin, f64(x))) <= 1e-6
        finally:
            manager.unregister(name="nothing-native-test")


def test_double_backward_through_native_calls_records_the_gradient_products():
    """create_graph=True: the native backward computes dX through the
    operator, so the gradient is itself differentiable, as on the Python way."""
    lin = layer("fp32")
    double = torch.nn.Linear(48, 40).double()
    with torch.no_grad():
        double.weight.copy_(lin.weight.double())
        double.bias.copy_(lin.bias.double())
    for step in range(3):
        x = quantized((6, 48), "fp32", 40 + step).requires_grad_()
        g, = torch.autograd.grad(lin(x).square().sum(), x, create_graph=True)
        g2, = torch.autograd.grad(g.square().sum(), x)
        xr = x.detach().double().requires_grad_()
        r, = torch.autograd.grad(double(xr).square().sum(), xr, create_graph=True)
        r2, = torch.autograd.grad(r.square().sum(), xr)
        assert max_rel(f64(g), f64(r)) <= 1e-5 and max_rel(f64(g2), f64(r2)) <= 1e-5, step


def test_autocast_and_unfused_bias_calls_stay_on_the_python_way():
    lin = layer("fp32")
    x = quantized((8, 48), "fp32", 7)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            y = lin(x)
            assert y.dtype == torch.bfloat16
    assert native_plans(lin) == 0
    unfused = layer("fp32", variant="stream_k")  # stream_k fuses no bias: a GEMM, then the addition
    with torch.no_grad():
        for _ in range(3):
            assert max_rel(f64(unfused(x)), reference(unfused, f64(x))) <= 1e-5
    assert unfused.__dict__.get("_native") is None


def test_the_switch_keeps_every_call_in_python():
    code = ("import torch, dispatcher.torch as dt\n"
            "from dispatcher.torch import native\n"
            "print(native.extension(wait=True), native.failure())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, native_module.SWITCH: "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"None {native_module.SWITCH} is set"


def test_native_and_python_ways_agree_bit_for_bit():
    """The same kernels and rules: a warm native call returns exactly what
    the Python way returns for the same inputs."""
    lin = layer("bf16")
    x = quantized((33, 48), "bf16", 8)
    with torch.no_grad():
        first = lin(x)  # the Python way
        lin(x)
        again = lin(x)  # native
    assert native_plans(lin) == 1
    assert torch.equal(first, again) and not np.isnan(f64(again)).any()


def test_a_copied_or_pickled_linear_plans_its_own_calls():
    import copy
    import io
    lin = layer("fp32")
    x = quantized((8, 48), "fp32", 9)
    with torch.no_grad():
        lin(x), lin(x)
    assert native_plans(lin) == 1
    buffer = io.BytesIO()
    torch.save(lin, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(lin), torch.load(buffer, weights_only=False)):
        assert native_plans(other) == 0
        with torch.no_grad():
            for _ in range(3):
                assert max_rel(f64(other(x)), reference(lin, f64(x))) <= 1e-6
        assert native_plans(other) == 1


@pytest.mark.parametrize("layout", ["rr", "rc", "cr"])
def test_gemm_products_without_gradients_run_natively(layout):
    """dispatcher.torch.gemm's plain products (no c, config, out_dtype;
    alpha 1) that want no gradient run natively from their second call,
    any operand layout; one that wants a gradient stays on the operator."""
    native.gemm_plans("regular", None).plans.clear()
    a = quantized((19, 48), "fp32", 11)
    b = quantized((48, 23), "fp32", 12)
    if layout[0] == "c":
        a = a.t().contiguous().t()
    if layout[1] == "c":
        b = b.t().contiguous().t()
    for _ in range(3):
        assert max_rel(f64(dt.gemm(a, b)), f64(a) @ f64(b)) <= 1e-6
    assert len(native.gemm_plans("regular", None).plans) == 1
    leaf = a.clone().requires_grad_()
    y = dt.gemm(leaf, b)
    assert type(y.grad_fn).__name__ != "CppFunction" and max_rel(f64(y), f64(a) @ f64(b)) <= 1e-6
    assert len(native.gemm_plans("regular", None).plans) == 1


def test_a_layer_whose_settings_change_makes_new_plans():
    """variant, autotune and config are read on every call, as on the
    Python way: a config set after warm-up is checked (and refused here),
    a new variant runs its own kernels."""
    import dispatcher
    lin = layer("fp32")
    x = quantized((8, 48), "fp32", 13)
    with torch.no_grad():
        lin(x), lin(x), lin(x)
        assert native_plans(lin) == 1
        lin.config = dt.config_key({"tile_m": 12345})
        with pytest.raises(dispatcher.ConfigError):
            lin(x)
        lin.config = None
        lin.variant, lin.bias = "stream_k", None  # stream_k: a plain GEMM (it fuses no bias)
        for _ in range(3):
            assert max_rel(f64(lin(x)), reference(lin, f64(x))) <= 1e-5
        assert lin.__dict__["_native"].settings[0] == "stream_k"


def test_a_first_layer_trains_natively_without_a_gradient_of_its_input():
    """x without a gradient, the weight with one: the backward needs dW
    only, which the first backward plans."""
    lin = layer("fp32")
    for step in range(4):
        x = quantized((12, 48), "fp32", 50 + step)
        y = lin(x)
        if step >= 2:
            assert type(y.grad_fn).__name__ == "CppFunction", step
        dy = quantized((12, 40), "fp32", 60 + step)
        y.backward(dy)
        assert max_rel(f64(lin.weight.grad), f64(dy).T @ f64(x)) <= 1e-5, step
        lin.zero_grad()


def test_a_column_major_input_gets_its_gradient_in_its_layout():
    """Backward launches are planned for row-major inputs only; a
    column-major input's gradient (on the Python way, then through the
    operator from the native backward) is laid out as the input."""
    lin = layer("fp32")
    for step in range(8):
        x = quantized((16, 48), "fp32", 70 + step).t().contiguous().t().requires_grad_()
        view = x * 1.0  # column-major too; its hook sees the gradient as the layer returns it
        seen = []
        view.register_hook(lambda g: seen.append(g.stride()))
        y = lin(view)
        y.backward(quantized((16, 40), "fp32", 80 + step))
        assert seen == [view.stride()], step
        assert max_rel(f64(x.grad), f64(quantized((16, 40), "fp32", 80 + step)) @ f64(lin.weight)) <= 1e-5
    assert type(y.grad_fn).__name__ == "CppFunction"  # the forward runs natively all the same


def test_calls_that_want_gradients_but_never_run_a_backward_go_native():
    """Evaluation without no_grad: the weight wants a gradient, no backward
    ever plans its launch; after a few calls the forward runs natively."""
    lin = layer("fp32")
    x = quantized((10, 48), "fp32", 90)
    for _ in range(6):  # calls 1-4 go the Python way, 5 and 6 native (8 goes back once: doubling)
        y = lin(x)
        assert max_rel(f64(y), reference(lin, f64(x))) <= 1e-6
    assert type(y.grad_fn).__name__ == "CppFunction"
    y.backward(quantized((10, 40), "fp32", 91))  # its backward: through the operator
    assert max_rel(f64(lin.weight.grad), f64(quantized((10, 40), "fp32", 91)).T @ f64(x)) <= 1e-5


def test_backward_launches_missed_at_first_are_planned_later():
    """A layer evaluated with a weight that wants a gradient (no backward
    runs: its forward soon runs natively, its backward launches stay
    unplanned), then trained: the C++ backward computes the gradients
    through the operator, whose plans a call sent back at a doubling
    interval plans natively; from then on forward and backward run in C++
    (the H100's profile of such a layer found dW through the operator on
    every step), and every gradient is right."""
    lin = layer("fp32")
    x = quantized((13, 48), "fp32", 92)  # rows no other test's calls have: no held plans of its backward yet

    def planned():
        return lin.__dict__["_native"].plans.planned(x, lin.weight, lin.bias)
    for _ in range(6):
        lin(x)
    assert planned() == 1  # the forward only
    w = f64(lin.weight)
    for step in range(6):
        xg = x.clone().requires_grad_()
        y = lin(xg)
        dy = quantized((13, 40), "fp32", 100 + step)
        y.backward(dy)
        assert max_rel(f64(xg.grad), f64(dy) @ w) <= 1e-5, step
        assert max_rel(f64(lin.weight.grad), f64(dy).T @ f64(x)) <= 1e-5, step
        lin.zero_grad()
    assert planned() == 7  # forward, dX and dW
    assert type(y.grad_fn).__name__ == "CppFunction"


def test_negative_views_are_resolved_not_read_as_their_memory():
    lin = layer("fp32")
    x = quantized((8, 48), "fp32", 14)
    w = quantized((48, 12), "fp32", 15)
    with torch.no_grad():
        for _ in range(3):
            assert max_rel(f64(lin(torch._neg_view(x))), reference(lin, -f64(x))) <= 1e-6
            assert max_rel(f64(dt.gemm(torch._neg_view(x), w)), -f64(x) @ f64(w)) <= 1e-6
            assert max_rel(f64(dt.gemm(x, torch._neg_view(w))), -f64(x) @ f64(w)) <= 1e-6


def test_gemm_compiles_in_a_full_graph_and_refuses_non_tensors_as_before():
    a, b = quantized((8, 48), "fp32", 16), quantized((48, 12), "fp32", 17)
    compiled = torch.compile(lambda x, y: dt.gemm(x, y), fullgraph=True, backend="eager")
    assert max_rel(f64(compiled(a, b)), f64(a) @ f64(b)) <= 1e-6
    with pytest.raises((TypeError, RuntimeError)):
        dt.gemm(np.ones((8, 48), np.float32), b)


def test_the_plans_of_many_shapes_are_bounded():
    lin = layer("fp32")
    with torch.no_grad():
        for m in range(1, 71):
            x = quantized((m, 48), "fp32", m)
            lin(x), lin(x)
    assert 0 < native_plans(lin) <= 64


def test_a_plans_product_runs_on_tensors_of_its_key_without_autograd():
    """`native.product`: the C++ launch of the core's plain gemm(a, b) and
    held plans on tensors (CUDA tensors on a GPU; a CPU plan and tensors
    here), and `Products`, the table the core tries first."""
    import dispatcher
    a, b = quantized((24, 40), "fp32", 1), quantized((40, 20), "fp32", 2)
    held = dispatcher.plan(a=a.numpy(), b=b.numpy())
    held(a.numpy(), b.numpy())  # binds the kernel
    product = native.product(None, (a, b), held.plan, held.order, held.scalars, None)
    assert product
    for seed in range(3):
        x = quantized((24, 40), "fp32", 10 + seed).requires_grad_()
        y = product(x, b)
        assert y.grad_fn is None and not y.requires_grad
        assert max_rel(f64(y), f64(x) @ f64(b)) <= 1e-6
    assert product(quantized((24, 41), "fp32", 3)[:, :40], b) is None  # other strides
    assert product(a.double(), b.double()) is None and product(b.t(), a.t()) is None
    class Sub(torch.Tensor):
        pass
    assert product(a.as_subclass(Sub), b) is None  # a subclass may mean something else: its own way
    table = native.extension().Products()
    with pytest.raises(TypeError):
        table.add(None)
    table.add(product)
    assert max_rel(f64(table(a, b)), f64(a) @ f64(b)) <= 1e-6 and table(b.t(), a.t()) is None
    assert table.hits() == 1

    class Nothing:
        pass
    manager = get_manager()
    manager.register(Nothing(), "nothing-product-test")
    try:
        assert product(a, b) is None  # stale: a plugin registration may change what selection chooses
    finally:
        manager.unregister(name="nothing-product-test")


def test_products_with_a_bias_and_an_activation_run_only_their_own_calls():
    """`Products.matmul`: matmul's calls with a fused bias and activation
    (CUDA tensors on a GPU; a CPU plan and tensors here) run the product of
    their key and activation, right against float64; a plain call, another
    activation or a bias of another shape never runs it."""
    import math

    import dispatcher
    a, b = quantized((24, 40), "fp32", 1), quantized((40, 20), "fp32", 2)
    bias = quantized((20,), "fp32", 3)
    table = native.extension().Products()
    held_plain = dispatcher.plan(a=a.numpy(), b=b.numpy())
    held_plain(a.numpy(), b.numpy())  # binds the kernel
    products = {}
    for activation in ("gelu", "relu"):
        for with_bias in (True, False):
            arrays = (a, b, bias) if with_bias else (a, b)
            named = dict(zip(("a", "b", "bias"), (x.numpy() for x in arrays)))
            held = dispatcher.plan(**named, activation=activation)
            held(**named)  # binds the kernel
            product = native.product(None, arrays, held.plan, held.order, held.scalars, activation)
            assert product
            table.add(product)
            products[activation, with_bias] = product
    gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))
    acts = {"gelu": gelu, "relu": lambda v: np.maximum(v, 0.0)}
    for seed in range(2):
        x = quantized((24, 40), "fp32", 10 + seed)
        for (activation, with_bias) in products:
            y = table.matmul(x, b, bias if with_bias else None, activation)
            expected = acts[activation](f64(x) @ f64(b) + (f64(bias) if with_bias else 0.0))
            assert max_rel(f64(y), expected) <= 1e-6, (activation, with_bias)
    assert table.hits() == 2 * len(products)
    assert table(a, b) is None  # a plain call: no product of its key and no activation here
    assert table.matmul(a, b, bias, "silu") is None and table.matmul(a, b, None, None) is None
    assert table.matmul(a, b, bias[None, :], "gelu") is None  # a 2-D bias: another key
    assert table.matmul(a, b, quantized((40,), "fp32", 4)[::2], "gelu") is None  # another stride
    assert table.matmul(a, b, bias, 3) is None  # not a name
    table.add(native.product(None, (a, b), held_plain.plan, held_plain.order, held_plain.scalars, None))
    assert table.matmul(a, b, None, None) is not None
    assert table.matmul(a, b, None, "") is None  # an empty name is no activation's (the Python way refuses it)
    assert native.product(None, (a, b, bias[:, None][:20]), held.plan, held.order, held.scalars, "gelu") is False


def test_products_into_an_out_write_it_and_refuse_what_they_may_not_write():
    """`Products.into` and a Product made with an example out (the core's
    gemm(a, b, out=out) and a held plan's plan(a, b, out) on CUDA tensors; a
    CPU plan and tensors here): each call writes a @ b into the out it is
    given (poisoned first), right against float64, and returns it; an out
    that overlaps an operand, wants a gradient, or has another layout,
    shape or dtype gets None (the Python way decides), and so does a plain
    call (no out) or an out for a plain product."""
    import dispatcher
    a, b = quantized((24, 40), "fp32", 1), quantized((40, 20), "fp32", 2)
    out = torch.full((24, 20), float("nan"))
    held = dispatcher.plan(a=a.numpy(), b=b.numpy(), out=out.numpy())
    held(a.numpy(), b.numpy(), out=out.numpy())  # binds the kernel
    product = native.product(None, (a, b, out), held.plan, held.order, held.scalars, None)
    assert product
    table = native.extension().Products()
    table.add(product)
    for seed in range(2):
        x = quantized((24, 40), "fp32", 10 + seed)
        for call in (lambda: table.into(x, b, out), lambda: product(x, b, out)):
            out.fill_(float("nan"))
            assert call() is out
            assert max_rel(f64(out), f64(x) @ f64(b)) <= 1e-6
    assert table.hits() == 2
    whole = torch.full((40 * 20 + 24 * 20,), float("nan"))
    b_inside = whole[:800].view(40, 20)
    b_inside.copy_(b)
    right_after = whole[800:].view(24, 20)  # one buffer, apart in bytes: runs
    assert table.into(a, b_inside, right_after) is right_after
    assert max_rel(f64(right_after), f64(a) @ f64(b)) <= 1e-6
    assert table.into(a, b_inside, whole[320:800].view(24, 20)) is None  # b's last rows' bytes
    assert table(a, b) is None and table.into(a, b, out.t().contiguous().t()) is None  # no plain product; F-order
    assert table.into(a, b, out.requires_grad_()) is None
    out.requires_grad_(False)
    assert table.into(a, b, out[:, :19]) is None and table.into(a, b, out.double()) is None
    assert table.into(a, a[:, :20], out) is None  # another key
    assert native.product(None, (a, b, out.t()), held.plan, held.order, held.scalars, None) is False
    # an example out overlapping an operand: no product yet (None: a later call of the key learns one)
    assert native.product(None, (a, b_inside, whole[320:800].view(24, 20)), held.plan, held.order, held.scalars,
                          None) is None
    wanting = torch.full((24, 20), float("nan"), requires_grad=True)
    assert native.product(None, (a, b, wanting), held.plan, held.order, held.scalars, None) is False


def test_batched_products_run_for_matmul_not_for_gemm():
    """`Products.matmul` runs batched (3-D) products, a broadcast 2-D b too,
    right against float64; gemm's plain calls (`Products.__call__`) take
    matrices only, so a batched product never answers them."""
    import dispatcher
    table = native.extension().Products()
    cases = [((3, 24, 40), (3, 40, 20)), ((3, 24, 40), (40, 20))]
    for shape_a, shape_b in cases:
        a, b = quantized(shape_a, "fp32", 1), quantized(shape_b, "fp32", 2)
        held = dispatcher.plan("batched", a=a.numpy(), b=b.numpy())
        held(a.numpy(), b.numpy())  # binds the kernel
        product = native.product(None, (a, b), held.plan, held.order, held.scalars, None)
        assert product
        table.add(product)
        for seed in range(2):
            x = quantized(shape_a, "fp32", 10 + seed)
            y = table.matmul(x, b, None, None)
            assert tuple(y.shape) == shape_a[:-1] + shape_b[-1:]
            assert max_rel(f64(y), np.matmul(f64(x), f64(b))) <= 1e-6, (shape_a, shape_b)
            assert max_rel(f64(product(x, b)), np.matmul(f64(x), f64(b))) <= 1e-6  # a held plan's call
        assert table(a, b) is None  # gemm(a, b) refuses batches: never a product's answer
    assert table.hits() == 4
    a, b = quantized((4, 24, 40), "fp32", 3), quantized((4, 40, 20), "fp32", 4)
    assert table.matmul(a, b, None, None) is None  # another batch size: another key
