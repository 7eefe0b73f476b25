"""The `gemm_dispatcher::*` torch operators: eager kernels, fake (meta)
implementations for `torch.compile`, and autograd through the dispatcher's
own kernels.

An operator's arguments must be tensors, numbers, strings or dtypes, so a
kernel config travels as a string key: `config_key(config)` registers a
`KernelConfig` (or a dict of config fields) and returns the key the ops
take (the wrappers here do that for you).

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
from dispatcher.errors import ConfigError, ProblemError
from dispatcher.torch.tensors import column_major, for_target, output_dtype, readable, target_of

_CONFIGS: dict = {}


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


# ------------------------------------------------------------------ gemm
@torch.library.custom_op("gemm_dispatcher::gemm", mutates_args=())
def _gemm(a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor] = None, alpha: float = 1.0,
          beta: float = 0.0, out_dtype: Optional[torch.dtype] = None, variant: str = "regular",
          config: Optional[str] = None) -> torch.Tensor:
    """alpha * a @ b + beta * c through dispatcher.gemm, into a new row-major tensor."""
    _check_shapes(a, b)
    target = target_of(a, b, c)
    out = a.new_empty((a.shape[0], b.shape[1]), dtype=output_dtype(a, out_dtype))
    dispatcher.gemm(for_target(a, target), for_target(b, target), c=for_target(c, target),
                    alpha=alpha, beta=beta, out=for_target(out, target), variant=variant,
                    target=target, config=_config(config))
    return out


@_gemm.register_fake
def _gemm_fake(a, b, c=None, alpha=1.0, beta=0.0, out_dtype=None, variant="regular", config=None):
    _check_shapes(a, b)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=output_dtype(a, out_dtype))


def _gemm_setup(ctx, inputs, output):
    a, b, c, alpha, beta, *_ = inputs
    ctx.save_for_backward(a, b)
    ctx.alpha, ctx.beta = alpha, beta
    ctx.c_dtype = None if c is None else c.dtype


def _gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    need_a, need_b, need_c = (*ctx.needs_input_grad, False, False, False)[:3]  # (c=None: no entry)
    grad_a = grad_b = grad_c = None
    if need_a or need_b:
        dc = _operand(grad, a.dtype)
        if need_a:
            grad_a = _product_like(a, dc, b.t(), ctx.alpha)
        if need_b:
            grad_b = _product_like(b, a.t(), dc, ctx.alpha)
    if need_c:
        grad_c = (grad * ctx.beta).to(ctx.c_dtype)
    return grad_a, grad_b, grad_c, None, None, None, None, None


_gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup)


def _operand(grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An incoming gradient as a GEMM operand: the inputs' dtype (a GEMM has
    one input dtype; it differs when out_dtype did), and copied only when the
    kernels cannot read its strides (e.g. the expanded gradient of a sum)."""
    grad = grad.to(dtype)
    return grad if readable(grad) else grad.contiguous()


def _product_like(like: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha * x @ y laid out as `like`: for a column-major `like`, the
    row-major product y^T @ x^T viewed transposed (no copy either way)."""
    if column_major(like):
        return gemm(y.t(), x.t(), alpha=alpha, out_dtype=like.dtype).t()
    return gemm(x, y, alpha=alpha, out_dtype=like.dtype)


def gemm(a, b, *, c=None, alpha=1.0, beta=0.0, out_dtype=None, variant="regular", config=None):
    """`torch.ops.gemm_dispatcher.gemm`: alpha * a @ b + beta * c on the
    dispatcher's kernels, differentiable and traceable by torch.compile.

    a, b: 2-D tensors of one dtype on one device (CPU tensors run on the cpu
    target, CUDA tensors on the cuda target, on the current stream), row- or
    column-major (transposed views are read in place). config: a
    KernelConfig, a dict of config fields, or None to select one (the tuning
    database first); it applies to this product, not to its backward GEMMs,
    which are selected for their own shapes and layouts.
    """
    return torch.ops.gemm_dispatcher.gemm(a, b, c, alpha, beta, out_dtype, variant, config_key(config))
