"""Fused epilogues: what a variant adds to its record to offer them.

After alpha * acc + beta * C a kernel may add a bias (one value per output
row or per output column, stored in the output dtype) and then apply an
activation (relu, gelu = x * Phi(x) with the exact erf, silu = x *
sigmoid(x)), before converting to the output dtype: CUTLASS's order
(`LinCombPerRowBiasEltAct`). Both are compiled into the kernel, so they are
variant-block options (`bias`, `activation`) and the kernel name carries
them; templates read `${bias}` and `${activation}`. The bias's orientation
is never passed: the core reads it off the bias operand's strides, after
any transposition of the problem (a per-column bias of C is per-row of C^T).
"""

from __future__ import annotations

from .errors import ProblemError
from .kinds import Operand
from .problem import fixed_fields
from .records import Option

BIASES = ("none", "row", "col")
ACTIVATIONS = ("none", "relu", "gelu", "silu")

OPTIONS = (
    Option("bias", "none", "fused bias: one value per output row or per output column",
           choices=BIASES),
    Option("activation", "none", "fused activation after the bias", choices=ACTIVATIONS),
)

# The bias operand: broadcast to the output's matrices, (N,) or (1, N) per
# column, (M, 1) per row, with optional batch dims.
BIAS = Operand("bias", ("m", "n"), batched=True, optional=True, dtype="out",
               doc="bias per output column (N,) or per row (M, 1), in the output dtype")


def name_suffix(opts: dict) -> str:
    """The kernel-name part of the epilogue; empty for the plain one, so
    plain kernels keep their names."""
    parts = []
    if opts.get("bias", "none") != "none":
        parts.append(f"bias{opts['bias']}")
    if opts.get("activation", "none") != "none":
        parts.append(opts["activation"])
    return "".join(f"_{p}" for p in parts)


def problem_options(extras: dict) -> dict:
    """The bias option a call's bias operand implies ((row, col) strides in
    elements as the kernel reads it, or None)."""
    strides = extras.get("bias")
    if strides is None:
        return {"bias": "none"}
    row_stride, col_stride = strides
    if row_stride == col_stride == 0:  # one value: N = 1 (a bias (1,)) reads it as a column's
        return {"bias": "col"}
    if col_stride == 0:
        return {"bias": "row"}
    if row_stride == 0:
        return {"bias": "col"}
    raise ProblemError("bias must be one value per output column (shape (N,) or (1, N)) or per "
                       "row (shape (M, 1)), not a full matrix")


def unmet_fields(problem, config) -> list:
    """[(field, the config's value, the problem's)] for each value the
    problem fixes that `config` does not carry, and for each epilogue the
    config fuses that the problem does not ask for (a plain problem's
    epilogue is the options' defaults): empty if it may run it."""
    want = {o.name: o.default for o in OPTIONS if o.name in config.variant_params}
    want.update(fixed_fields(problem))
    return [(field, config.variant_params.get(field), value) for field, value in want.items()
            if config.variant_params.get(field) != value]
