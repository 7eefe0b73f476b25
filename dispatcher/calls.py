"""The front doors of declared problem kinds: `run(variant, **operands,
**params)` for any variant whose record declares its operands, and
`matmul(a, b, ...)` with numpy's `matmul` semantics (2-D -> `regular`,
batched -> `batched`).
"""

from __future__ import annotations

import numpy as np

from . import targets
from .errors import ConfigError, ProblemError
from .kinds import MAIN, prepare, split_call
from .plugins import get_manager
from .problem import check_arrays
from .records import resolve_launch_options


def run(variant: str, *, target: str = "cpu", out_dtype=None, config=None, options=None,
        dispatcher=None, **arguments):
    """Run `variant` on its declared operands and parameters, e.g.
    `run("batched", a=a, b=b, bias=bias, activation="gelu")`; returns the
    output (`out` if given).

    arguments: the variant's operands (arrays: a, b, out and its extra
    operands), its scalar parameters and the core's (`alpha`, and the
    per-tensor input scales `scale_a`, `scale_b` of fp8), and values of its
    variant block that the call fixes (e.g. `activation`). target, config,
    options, out_dtype as for `dispatcher.gemm`.
    """
    from .api import _resolve_target, default_dispatcher

    manager = dispatcher.manager if dispatcher is not None else get_manager()
    if not isinstance(variant, str):
        raise ConfigError(f"variant must be a variant name, got {type(variant).__name__}")
    record = manager.variant(variant)
    if not record.operands:
        raise ConfigError(f"variant {variant!r} declares no operands ({record.problem_kind} problems): "
                          "call dispatcher.gemm or dispatcher.grouped_gemm")
    operands, params, choices = split_call(record, arguments)
    names = [o.name for o in record.operands]
    check_arrays([(n, operands.get(n)) for n in MAIN[:2]],
                 [(n, operands.get(n)) for n in names if n not in MAIN[:2]])
    resolve_launch_options(record, options)  # before any build
    target = _resolve_target(target, *(x for x in operands.values() if x is not None))
    session = targets.get(target).session(*(operands.get(n) for n in names))
    arrays = dict(zip(names, session.arrays))
    prepared = prepare(record, arrays, params, choices, out_dtype=out_dtype, target=target,
                       memory=session.memory, allocate=session.empty)
    host_out = operands.get("out")
    host_out = host_out if isinstance(host_out, np.ndarray) and arrays["out"] is not host_out else None
    if prepared.empty:
        return session.finish(prepared.result, host_out)
    if prepared.problem.k == 0:  # an empty product: zeros, if nothing else reaches out
        plain = all(v == _default(record, n) for n, v in prepared.problem.options)
        if not isinstance(prepared.result, np.ndarray) or not plain or record.params or \
                prepared.launches[0].extra:
            raise ProblemError("K = 0 is only supported on host (cpu target) arrays, without extra "
                               "operands, parameters or a fused epilogue")
        prepared.result[...] = 0
        return prepared.result
    d = dispatcher or default_dispatcher()
    options = {"stream": session.stream, **(options or {})}
    for block in prepared.launches:
        d.run(prepared.problem, block, config, options)
    return session.finish(prepared.result, host_out)


def _default(record, name):
    return next(o.default for o in record.options if o.name == name)


def matmul(a, b, *, out=None, out_dtype=None, bias=None, activation=None, alpha=1.0,
           scale_a=1.0, scale_b=1.0, variant=None, target="cpu", config=None, options=None,
           dispatcher=None):
    """act(alpha * scale_a * scale_b * (a @ b) + bias) with numpy's `matmul`
    semantics: 2-D operands run on `regular`, operands with batch dims on
    `batched` (batch dims broadcast, any strides), a 1-D operand is a
    vector (numpy arrays). bias: broadcastable to the result's matrices,
    one value per output column (N,) or per row (M, 1), optionally with
    batch dims; stored in the output dtype. activation: relu, gelu or silu.
    """
    check_arrays([("a", a), ("b", b)], [("out", out), ("bias", bias)])
    squeeze = []
    if getattr(a, "ndim", 2) == 1:
        a, squeeze = _numpy_only(a, "a")[None, :], squeeze + [-2]
    if getattr(b, "ndim", 2) == 1:
        b, squeeze = _numpy_only(b, "b")[:, None], squeeze + [-1]
    if squeeze and out is not None:
        raise ProblemError("out= is not supported with a 1-D operand; pass 2-D operands")
    if variant is None:
        variant = "regular" if a.ndim == 2 and b.ndim == 2 else "batched"
    extra = {"bias": bias} if bias is not None else {}
    if activation is not None:
        extra["activation"] = activation
    if scale_a != 1.0 or scale_b != 1.0:
        extra.update(scale_a=scale_a, scale_b=scale_b)
    result = run(variant, a=a, b=b, out=out, alpha=alpha, target=target, out_dtype=out_dtype,
                 config=config, options=options, dispatcher=dispatcher, **extra)
    return result.squeeze(tuple(squeeze)) if squeeze else result


def _numpy_only(x, name: str):
    if not isinstance(x, np.ndarray):
        raise ProblemError(f"{name} is 1-D: vectors are supported for numpy arrays; reshape it to 2-D")
    return x
