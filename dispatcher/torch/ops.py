"""The `gemm_dispatcher::*` torch operators: eager kernels, fake (meta)
implementations for `torch.compile`, and autograd through the dispatcher's
own kernels.

An operator's arguments must be tensors, numbers, strings or dtypes, so a
kernel config travels as a string key: `config_key(config)` registers a
`KernelConfig` (or a dict of config fields) and returns the key the ops
take (the wrappers here do that for you).

`grouped_mm` is the stacked mixture-of-experts form (dispatcher.grouped_mm,
in `torch._grouped_mm`'s argument order). Its dA is a grouped_mm on the
transposed view of b; its dB (one K x N product per group, summed over that
group's rows) is `gemm_dispatcher::grouped_mm_grad_b`, a grouped_gemm over
per-group views, which reads the offsets on the host (a synchronisation on
CUDA, in the backward only).

Backward passes are GEMMs on transposed *views*: dA = alpha * dC @ B^T and
dB = alpha * A^T @ dC, each written in its operand's layout (a column-major
operand gets the row-major transpose product, viewed back), so a
`weight.t()` operand receives a gradient laid out as `weight` and nothing is
copied.
"""

import json
from collections.abc import Mapping
from typing import Optional

import torch

import dispatcher
from dispatcher.config import KernelConfig
from dispatcher.errors import ConfigError, DispatcherError, ProblemError, UnsupportedProblem

from dispatcher.torch import native
from dispatcher.torch.eager import any_autocast, gemm_key, linear_key, plain, plain_eager, planned
from dispatcher.torch.tensors import (check_readable, column_major, device_of, for_target, from_target,
                                      out_dtype_of, output_dtype, readable, target_of, token)

_CONFIGS: dict = {}
_grad_enabled = torch.is_grad_enabled

# The operators are defined with `torch.library.Library` (a schema, a
# Python kernel for CPU and CUDA, a fake kernel, autograd), not
# `torch.library.custom_op`, whose Python wrapper layers cost about 10-20 us
# a call (pytorch issues 139500, 177109); opcheck, fake tensors, autograd
# and torch.compile see the same operator either way.
_LIBRARY = torch.library.Library("gemm_dispatcher", "DEF")


class _Operator:
    """`gemm_dispatcher::<schema>`: its kernel on CPU and CUDA, its fake
    (meta) kernel and, if given, its autograd formula, registered with
    torch; calling it runs the operator.

    An eager call on plain tensors skips torch's dispatcher: it runs the
    kernel function itself, or, when a gradient is wanted, an
    `autograd.Function` of the same kernel, setup and backward. Going
    through the Python operator costs more than a small GEMM (the
    dispatcher's Python kernel call and `register_autograd`'s wrapper:
    about 25 us a call on a CPU, pytorch issues 139500, 177109), and it
    adds nothing there. Everything that must see the operator takes it:
    torch.compile's tracing, dispatch and function modes (FakeTensorMode,
    FlopCounterMode, ...), torch.func transforms, meta tensors and tensor
    subclasses.
    """

    def __init__(self, schema: str, kernel, fake, backward=None, setup_context=None, tensors: int = 3):
        name = schema.split("(", 1)[0]
        _LIBRARY.define(schema)
        for key in ("CPU", "CUDA"):
            _LIBRARY.impl(name, kernel, key)
        torch.library.register_fake(f"gemm_dispatcher::{name}", fake, lib=_LIBRARY)
        self.function = None
        if backward is not None:
            torch.library.register_autograd(f"gemm_dispatcher::{name}", backward, setup_context=setup_context,
                                            lib=_LIBRARY)
            def forward(ctx, *args):  # no `setup_context` method: apply would bind defaults via inspect (~50 us)
                output = kernel(*args)
                setup_context(ctx, args, output)
                return output
            self.function = type(f"{name}_function", (torch.autograd.Function,), {
                "forward": staticmethod(forward), "backward": staticmethod(backward)})
            # autograd.Function.apply's C++ part: its Python wrapper binds
            # default arguments and unwraps functorch's dead wrappers, for
            # calls that `plain` sends elsewhere (~5 us a call).
            self.apply = super(torch.autograd.Function, self.function).apply
        self.kernel, self.tensors = kernel, tensors  # the leading `tensors` arguments are the tensors
        self.operator = getattr(torch.ops.gemm_dispatcher, name).default

    def __call__(self, *args):
        tensors = args[:self.tensors]
        if not plain(tensors):
            return self.operator(*args)
        if self.function is not None and _grad_enabled():
            for t in tensors:  # a loop, not any(...): this runs on every call
                if t is not None and t.requires_grad:
                    return self.apply(*args)
        return self.kernel(*args)


def config_key(config) -> Optional[str]:
    """The key an op takes for `config` (a KernelConfig, a dict of config
    fields, a key already registered, or None for the selected kernel)."""
    if config is None or (isinstance(config, str) and config in _CONFIGS):
        return config
    if isinstance(config, KernelConfig):
        key = config.name
    elif isinstance(config, Mapping):
        key = json.dumps(dict(config), sort_keys=True, default=list)
    else:
        raise ConfigError(f"config must be a KernelConfig or a dict of config fields, "
                          f"got {type(config).__name__}")
    _CONFIGS[key] = config
    return key


def _config(key: Optional[str]):
    if key is None:
        return None
    try:
        return _CONFIGS[key]
    except KeyError:
        raise ConfigError(f"config key {key!r} is not registered in this process; pass the op "
                          "dispatcher.torch.config_key(config)") from None


def _check_shapes(a: torch.Tensor, b: torch.Tensor):
    if a.dim() != 2 or b.dim() != 2:
        raise ProblemError(f"a and b must be 2-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ProblemError(f"a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")


def _in_torch_words(left: torch.Tensor, right: torch.Tensor, **named):
    """Called when the dispatcher refused a call: raise torch's words for
    what is wrong (`left @ right` of 2-D tensors that multiply, `named`
    operands with readable strides: "pass x.contiguous()") where they
    apply. An accepted call is checked once, by its plan, not here too."""
    _check_shapes(left, right)
    for name, t in named.items():
        check_readable(name, t)


# ------------------------------------------------------------------ gemm
def _gemm(a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor] = None, alpha: float = 1.0,
          beta: float = 0.0, out_dtype: Optional[torch.dtype] = None, variant: str = "regular",
          config: Optional[str] = None, autotune: Optional[bool] = None) -> torch.Tensor:
    """alpha * a @ b + beta * c through dispatcher.gemm, into a new row-major tensor."""
    if c is None and config is None:  # the plain call (a backward's too): a held plan
        key = gemm_key(a, b, variant, alpha, out_dtype, autotune)
        dtype = None if out_dtype is None else token(out_dtype)
        try:
            return planned(key, variant, {"a": a, "b": b},
                           lambda arrays: dispatcher.gemm(arrays["a"], arrays["b"], alpha=alpha, out_dtype=dtype,
                                                          variant=variant, autotune=autotune),
                           alpha=alpha, out_dtype=dtype, autotune=autotune)
        except DispatcherError:
            _in_torch_words(a, b, a=a, b=b)
            raise
    target = target_of(a, b, c)
    _check_shapes(a, b)  # before the output's allocation
    check_readable("a", a)
    check_readable("b", b)
    out = a.new_empty((a.shape[0], b.shape[1]), dtype=output_dtype(a, out_dtype))
    dispatcher.gemm(for_target(a, target), for_target(b, target), c=for_target(c, target),
                    alpha=alpha, beta=beta, out=for_target(out, target), variant=variant,
                    target=target, config=_config(config), autotune=autotune)
    return out


def _gemm_fake(a, b, c=None, alpha=1.0, beta=0.0, out_dtype=None, variant="regular", config=None,
               autotune=None):
    _check_shapes(a, b)
    device_of(a, b, c)  # torch routes a call with any meta tensor here: real and meta mixed is refused
    return a.new_empty((a.shape[0], b.shape[1]), dtype=output_dtype(a, out_dtype))


def _gemm_setup(ctx, inputs, output):
    a, b, c, alpha, beta, _, variant, _, autotune = inputs
    ctx.save_for_backward(a, b)
    ctx.alpha, ctx.beta = alpha, beta
    ctx.selection = dict(variant=variant, autotune=autotune)
    ctx.c_dtype = None if c is None else c.dtype


def _gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    need_a, need_b, need_c = (*ctx.needs_input_grad, False, False, False)[:3]  # (c=None: no entry)
    grad_a = grad_b = grad_c = None
    if need_a or need_b:
        dc = _operand(grad, a.dtype)
        if need_a:
            grad_a = _product_like(a, dc, b.t(), ctx.alpha, ctx.selection)
        if need_b:
            grad_b = _product_like(b, a.t(), dc, ctx.alpha, ctx.selection)
    if need_c:
        grad_c = (grad * ctx.beta).to(ctx.c_dtype)
    return grad_a, grad_b, grad_c, None, None, None, None, None, None


_GEMM = _Operator("gemm(Tensor a, Tensor b, Tensor? c=None, float alpha=1.0, float beta=0.0, "
                  "ScalarType? out_dtype=None, str variant='regular', str? config=None, bool? autotune=None) "
                  "-> Tensor", _gemm, _gemm_fake, _gemm_backward, _gemm_setup)


# ---------------------------------------------------------------- linear
def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
            variant: str = "regular", config: Optional[str] = None,
            autotune: Optional[bool] = None) -> torch.Tensor:
    """x @ weight^T + bias in one kernel: the bias is the GEMM's fused
    epilogue (one value per output column), as cuBLAS's addmm fuses it."""
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    transposed = weight.t()
    key = linear_key(x, transposed, bias, variant, autotune) if config is None else None
    try:
        options = dict(config=_config(config), autotune=autotune)
        return planned(key, variant, {"a": x, "b": transposed, "bias": bias},
                       lambda arrays: dispatcher.run(variant, **arrays, **options), **options)
    except UnsupportedProblem:  # no fused kernel reads these operands in place (cuda: misaligned ones)
        target = target_of(x, weight, bias)
        y = from_target(dispatcher.gemm(for_target(x, target), for_target(transposed, target),
                                        variant=variant, autotune=autotune))
        return y if bias is None else y.add_(bias)
    except DispatcherError:
        _in_torch_words(x, transposed, x=x, weight=weight)
        raise


def _linear_fake(x, weight, bias=None, variant="regular", config=None, autotune=None):
    _check_shapes(x, weight.t())
    device_of(x, weight, bias)
    return x.new_empty((x.shape[0], weight.shape[0]))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, variant, _, autotune = inputs
    ctx.save_for_backward(x, weight)
    ctx.selection = dict(variant=variant, autotune=autotune)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _linear_backward(ctx, grad):
    """dX = dY @ W, dW = dY^T @ X (each in its operand's layout), db = sum of dY's rows."""
    x, weight = ctx.saved_tensors
    need_x, need_w, need_b = (*ctx.needs_input_grad, False, False, False)[:3]
    dy = _operand(grad, x.dtype)
    grad_x = _product_like(x, dy, weight, 1.0, ctx.selection) if need_x else None
    grad_w = _product_like(weight, dy.t(), x, 1.0, ctx.selection) if need_w else None
    grad_b = grad.sum(0).to(ctx.bias_dtype) if need_b else None
    return grad_x, grad_w, grad_b, None, None, None


_LINEAR = _Operator("linear(Tensor x, Tensor weight, Tensor? bias=None, str variant='regular', "
                    "str? config=None, bool? autotune=None) -> Tensor",
                    _linear, _linear_fake, _linear_backward, _linear_setup)


def linear(x, weight, bias=None, *, variant="regular", config=None, autotune=None):
    """`torch.ops.gemm_dispatcher.linear`: x @ weight^T + bias with the bias
    fused into the kernel (x 2-D, weight (out, in) as nn.Linear holds it),
    differentiable and traceable. variant: one whose record declares a
    bias operand (regular); config, autotune: as for `gemm`."""
    x, weight, bias = autocast(x, weight, bias)
    return _LINEAR(x, weight, bias, variant, config_key(config), autotune)


def _operand(grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An incoming gradient as a GEMM operand: the inputs' dtype (a GEMM has
    one input dtype; it differs when out_dtype did), and copied only when the
    kernels cannot read its strides (e.g. the expanded gradient of a sum)."""
    grad = grad.to(dtype)
    return grad if readable(grad) else grad.contiguous()


def _product_like(like: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float,
                  selection: dict) -> torch.Tensor:
    """alpha * x @ y laid out as `like`: for a column-major `like`, the
    row-major product y^T @ x^T viewed transposed (no copy either way).
    selection: the forward's variant and autotune."""
    # straight to the operator (gemm()'s autocast and config key would do
    # nothing here); an out_dtype that is the inputs' own rule is left out,
    # so a plain call takes dispatcher.gemm's shortest path
    default = _DEFAULT_OUTPUT.get(x.dtype)
    if default is None:
        default = _DEFAULT_OUTPUT[x.dtype] = output_dtype(x, None)
    out_dtype = None if like.dtype == default else like.dtype
    if column_major(like):
        return _GEMM(y.t(), x.t(), None, alpha, 0.0, out_dtype, selection["variant"], None,
                     selection["autotune"]).t()
    return _GEMM(x, y, None, alpha, 0.0, out_dtype, selection["variant"], None, selection["autotune"])


_DEFAULT_OUTPUT: dict = {}  # an input torch dtype -> its GEMM's default output dtype (CK's rule)


def autocast(*tensors) -> tuple:
    """`tensors` as torch's own matmuls take them under `torch.autocast` for
    their device: floating ones cast to the autocast dtype (bf16 or fp16);
    unchanged when autocast is off. Differentiable (a cast), and traced by
    torch.compile like any cast."""
    if not any_autocast():  # the common case, without asking each tensor its device
        return tensors
    device = next((t.device.type for t in tensors if t is not None), None)
    if device not in ("cpu", "cuda") or not torch.is_autocast_enabled(device):  # meta has no autocast
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def gemm(a, b, *, c=None, alpha=1.0, beta=0.0, out_dtype=None, variant="regular", config=None,
         autotune=None):
    """`torch.ops.gemm_dispatcher.gemm`: alpha * a @ b + beta * c on the
    dispatcher's kernels, differentiable and traceable by torch.compile.

    a, b: 2-D tensors of one dtype on one device (CPU tensors run on the cpu
    target, CUDA tensors on the cuda target, on the current stream), row- or
    column-major (transposed views are read in place). variant: a
    single-GEMM variant (regular, stream_k), for the backward GEMMs too.
    config: a KernelConfig, a dict of config fields, or None to select one
    (the tuning database first); it applies to this product, not to its
    backward GEMMs, which are selected for their own shapes and layouts.
    autotune: as for dispatcher.gemm (None: $DISPATCHER_AUTOTUNE), for the
    backward GEMMs too; each problem is tuned once, on its first call, so
    make that call before capturing a CUDA graph. Under `torch.autocast`,
    floating inputs are cast to the autocast dtype first, as for torch.mm.
    A plain product (no c, config or out_dtype, alpha 1) that wants no
    gradient runs natively once planned (docs/pytorch.md, "Native calls").
    """
    plans = None
    if c is None and config is None and out_dtype is None and alpha == 1.0 and beta == 0.0 \
            and plain_eager((a, b)) and not (_grad_enabled() and (a.requires_grad or b.requires_grad)) \
            and a.dim() == b.dim() == 2:
        plans = native.gemm_plans(variant, autotune)
        if plans is not None:  # a @ b is linear(a, b^T)
            y = plans.forward(a, b.t(), None)
            if y is not None:
                return y
    a, b, c = autocast(a, b, c)
    y = _GEMM(a, b, c, alpha, beta, out_dtype_of(out_dtype), variant, config_key(config), autotune)
    if plans is not None:
        plans.learn(a, b.t(), None, backward=False)
    return y


# ------------------------------------------------------------ grouped_mm
def _check_grouped(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor):
    if a.dim() != 2 or b.dim() != 3 or offsets.dim() != 1:
        raise ProblemError(f"grouped_mm takes a (total_M, K), b (G, K, N) and offsets (G,), got shapes "
                           f"{tuple(a.shape)}, {tuple(b.shape)} and {tuple(offsets.shape)}")
    if a.shape[1] != b.shape[1] or offsets.shape[0] != b.shape[0]:
        raise ProblemError(f"a {tuple(a.shape)}, b {tuple(b.shape)} and offsets {tuple(offsets.shape)} "
                           "do not fit: a's K must be b's dim 1, and offsets needs one entry per group")
    if offsets.dtype != torch.int32:
        raise ProblemError(f"offsets must be torch.int32 cumulative row ends, got {offsets.dtype}; "
                           "pass offsets.to(torch.int32)")
    device_of(a, b, offsets)  # the fake implementation too: real and meta mixed is refused


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor,
                out_dtype: Optional[torch.dtype] = None, alpha: float = 1.0,
                config: Optional[str] = None, autotune: Optional[bool] = None) -> torch.Tensor:
    """Rows [offsets[g-1], offsets[g]) of a times b[g], through dispatcher.grouped_mm."""
    _check_grouped(a, b, offsets)
    check_readable("a", a)
    check_readable("b", b)
    target = target_of(a, b, offsets)
    result = dispatcher.grouped_mm(for_target(a, target), for_target(b, target),
                                   for_target(offsets, target),
                                   out_dtype=None if out_dtype is None else token(out_dtype),
                                   alpha=alpha, target=target, config=_config(config), autotune=autotune)
    return from_target(result)


def _grouped_mm_fake(a, b, offsets, out_dtype=None, alpha=1.0, config=None, autotune=None):
    _check_grouped(a, b, offsets)
    return a.new_empty((a.shape[0], b.shape[2]), dtype=output_dtype(a, out_dtype))


def _grouped_mm_grad_b(a: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor, alpha: float,
                       transposed: bool) -> torch.Tensor:
    """dB of grouped_mm: alpha * a[rows_g]^T @ grad[rows_g] per group, (G, K, N)
    with b's dtype; `transposed`: (G, N, K), each group's product
    grad[rows_g]^T @ a[rows_g], for a b whose groups are column-major.
    A group without rows gets zeros."""
    target = target_of(a, grad, offsets)
    ends = offsets.tolist()
    groups = [(g, start, end) for g, (start, end) in enumerate(zip([0, *ends[:-1]], ends)) if end > start]
    shape = (len(ends), grad.shape[1], a.shape[1]) if transposed else (len(ends), a.shape[1], grad.shape[1])
    out = a.new_zeros(shape)
    left, right = (grad, a) if transposed else (a, grad)
    products = dispatcher.grouped_gemm(
        [for_target(left[start:end].t(), target) for _, start, end in groups],
        [for_target(right[start:end], target) for _, start, end in groups],
        out_dtype=token(a.dtype), alpha=alpha, target=target)
    for (g, _, _), product in zip(groups, products):
        out[g].copy_(from_target(product))
    return out


def _grouped_mm_grad_b_fake(a, grad, offsets, alpha, transposed):
    device_of(a, grad, offsets)
    g, k, n = offsets.shape[0], a.shape[1], grad.shape[1]
    return a.new_empty((g, n, k) if transposed else (g, k, n))


_GROUPED_MM_GRAD_B = _Operator(
    "grouped_mm_grad_b(Tensor a, Tensor grad, Tensor offsets, float alpha, bool transposed) -> Tensor",
    _grouped_mm_grad_b, _grouped_mm_grad_b_fake)


def _grouped_mm_setup(ctx, inputs, output):
    a, b, offsets, _, alpha, _, autotune = inputs
    ctx.save_for_backward(a, b, offsets)
    ctx.alpha, ctx.autotune = alpha, autotune


def _grouped_mm_backward(ctx, grad):
    a, b, offsets = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[:2]
    grad_a = grad_b = None
    dc = _operand(grad, a.dtype)
    if need_a:
        grad_a = grouped_mm(dc, b.transpose(1, 2), offsets, out_dtype=a.dtype, alpha=ctx.alpha,
                            autotune=ctx.autotune)
    if need_b:
        transposed = b.shape[0] > 0 and column_major(b[0])
        grad_b = _GROUPED_MM_GRAD_B(a, dc, offsets, ctx.alpha, transposed)
        if transposed:
            grad_b = grad_b.transpose(1, 2)
    return grad_a, grad_b, None, None, None, None, None


_GROUPED_MM = _Operator(
    "grouped_mm(Tensor a, Tensor b, Tensor offsets, ScalarType? out_dtype=None, float alpha=1.0, "
    "str? config=None, bool? autotune=None) -> Tensor",
    _grouped_mm, _grouped_mm_fake, _grouped_mm_backward, _grouped_mm_setup)


def grouped_mm(a, b, offsets, *, out_dtype=None, alpha=1.0, config=None, autotune=None):
    """`torch.ops.gemm_dispatcher.grouped_mm`: dispatcher.grouped_mm as a
    differentiable, traceable op, in `torch._grouped_mm`'s argument order.

    a (total_M, K), b (G, K, N) (each b[g] row- or column-major: a
    `w.transpose(1, 2)` view is read in place), offsets (G,) int32
    cumulative row ends on a's device; returns (total_M, N), rows past
    offsets[-1] zero. config, autotune: as for `gemm` (dB, a list-form
    grouped GEMM, is not autotuned).
    """
    return _GROUPED_MM(a, b, offsets, out_dtype_of(out_dtype), alpha,
                                                config_key(config), autotune)
