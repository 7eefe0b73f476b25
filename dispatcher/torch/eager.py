"""Plain eager calls of the `dispatcher.torch` operators: what counts as
one, and the plans they run.

A plain eager call (`plain`) is one torch would send straight to the
operator's kernel: not traced, no dispatch or function mode, no functorch
transform, every tensor a plain tensor (or Parameter) on a CPU or CUDA
device whose memory holds its values (not a negative view or a zero
tensor). The operators skip torch's dispatcher for them (`ops._Operator`),
and run each kind of call through a plan held by a key of everything the
plan depends on (`gemm_key`, `linear_key`, `planned`); the native Linear
(`native.py`) hands those plans' launches to C++.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode

import dispatcher
from dispatcher.api import RUNNERS_KEPT, exact_key, operands_key
from dispatcher.torch.tensors import for_target, from_target, target_of

_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a Parameter adds no behaviour to a call
# Whether autocast is on for any device (a private torch function; where a
# torch lacks it, say yes and let `autocast` ask per device).
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
_function_mode = torch._C._is_torch_function_mode_enabled
_transform = torch._C._functorch.peek_interpreter_stack
_compiling = torch.compiler.is_compiling


def plain(tensors) -> bool:
    """Whether an eager call on `tensors` (None entries skipped) is plain
    (module docstring), so it may skip torch's dispatcher."""
    if _compiling() or _dispatch_mode() is not None or _function_mode() or \
            _transform() is not None:
        return False
    for t in tensors:  # a loop, not all(...): this runs on every call
        if t is not None and (type(t) not in _PLAIN or not (t.is_cuda or t.is_cpu) or t.is_neg()
                              or t._is_zerotensor()):
            return False
    return True


# The held plan (`dispatcher.plan`) of each kind of plain eager call, by
# everything the plan depends on: the op, its options and `operands_key` of
# its tensors. A warm call runs the plan's runner on the tensors themselves
# (a CPU tensor's memory is what the plan's numpy view of it read; the
# result is a new tensor on the inputs' device), skipping the numpy views,
# `dispatcher.run`'s own key and the result's wrapping.
_HELD: dict = {}


def held_plan(key):
    """The held plan of the calls of `key` (`gemm_key`, `linear_key`), or None."""
    return _HELD.get(key) if key is not None else None


def gemm_key(a, b, variant: str, alpha: float, out_dtype, autotune):
    """The key of a plain `gemm_dispatcher::gemm` call (c and config None), or None."""
    key = operands_key(a, b)
    return None if key is None else ("gemm", variant, exact_key(alpha), out_dtype, autotune, key)


def linear_key(x, transposed, bias, variant: str, autotune):
    """The key of a `gemm_dispatcher::linear` call (config None) on x and
    weight.t(), or None."""
    key = operands_key(x, transposed) if bias is None else operands_key(x, transposed, bias)
    return None if key is None else ("linear", variant, autotune, bias is None, key)


def plain_eager(tensors) -> bool:
    """Whether a call on `tensors` (None entries skipped) is a plain eager
    call that autocast leaves alone: what native code may run itself."""
    return plain(tensors) and not any_autocast()


def planned(key, variant: str, operands: dict, general, **options):
    """A plain call on tensors (operand name -> tensor or None, the first
    one `a`'s) through the plan held by `key` (None: the call has none,
    e.g. tensors on two devices). `general(arrays)` runs the call on the
    arrays as the target takes them through the public entry point that
    checks everything of it (`dispatcher.gemm` or `dispatcher.run`): the
    first call of each key goes that way, and holds its plan
    (`dispatcher.plan(variant, **arrays, **options)`) for the next ones."""
    held = _HELD.get(key) if key is not None else None
    if held is not None:
        runner = held.runner()
        if runner is not None:
            return runner(*[operands[name] for name in held.order])
    target = target_of(*operands.values())
    arrays = {name: for_target(t, target) for name, t in operands.items() if t is not None}
    if key is None:
        return from_target(general(arrays))
    if held is None or not held.plan.current():  # new, or made before a plugin registration
        result = general(arrays)
        if len(_HELD) >= RUNNERS_KEPT:  # many shapes: start again rather than keep them all
            _HELD.clear()
        _HELD[key] = dispatcher.plan(variant, **arrays, **options)  # the plan that call made and bound
        return from_target(result)
    return from_target(held(**arrays))  # not run by a runner: its own checked path
