"""Problem kinds as data: a variant declares its operands and parameters,
the core builds the problem, checks it and fills the argument block.

Every kind is a GEMM: operands `a` (M x K), `b` (K x N) and the output
`out` (M x N), each with leading batch dimensions if the variant declares
them `batched` (numpy `matmul` semantics: batch dimensions broadcast, any
strides), plus any number of extra operands (a bias, a scale vector) whose
dims name "m", "n" or "k" and may be 1 to broadcast (a bias (N,) is one
value per output column, (M, 1) one per row). `prepare` turns a call into
a `KindProblem` (the selection key) and one or more `GemmOperands` argument
blocks: batch dimensions collapse into one launch where every operand's
batch strides allow it, else one launch per outer index.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import attrs
import numpy as np

from . import dtypes
from .errors import DtypeError, ProblemError
from .problem import (ArraySpec, GemmOperands, _check_exact_accumulation, _check_no_alias,
                      _same_input_dtype, _scalar, possible_layouts)
from .library import data_pointer


@attrs.frozen
class Operand:
    """One operand of a problem kind.

    dims: its matrix (or vector) dims over "m", "n", "k". batched: it may
    carry leading batch dims. dtype: "in" (the inputs' dtype), "out" (the
    output dtype) or a dtype token. Extra operands are passed to the kernel
    in declaration order (`dispatcher_gemm_args.extra`)."""

    name: str
    dims: tuple
    output: bool = False
    batched: bool = False
    optional: bool = False
    dtype: str = "in"
    doc: str = ""


@attrs.frozen
class Param:
    """A scalar parameter of a variant (`dispatcher_gemm_args.params`)."""

    name: str
    default: float = 0.0
    doc: str = ""


def gemm_operands(batched: bool = False) -> tuple:
    """a, b and out: the operands every kind has."""
    return (Operand("a", ("m", "k"), batched=batched, doc="left matrix"),
            Operand("b", ("k", "n"), batched=batched, doc="right matrix"),
            Operand("out", ("m", "n"), output=True, batched=batched, optional=True, dtype="out",
                    doc="where the result goes (else a new row-major array)"))


# Scalars every kind takes: they travel in the ABI's own fields.
CORE_PARAMS = ("alpha", "scale_a", "scale_b")
MAIN = ("a", "b", "out")


@attrs.frozen
class KindProblem:
    """A problem of a declared kind: `batch` GEMMs of one shape (per launch),
    and the variant-block values the call fixes (`options`, e.g. the fused
    epilogue), which the selected kernel's config must carry."""

    m: int
    n: int
    k: int
    batch: int
    dtype: str
    out_dtype: str
    layout: str
    variant: str
    target: str = "cpu"
    options: tuple = ()

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def shapes(self) -> tuple:
        return ((self.m, self.n, self.k),) * self.batch

    @property
    def config_fields(self) -> dict:
        return dict(self.options)

    def tile_count(self, tile_m: int, tile_n: int) -> int:
        return self.batch * math.ceil(self.m / tile_m) * math.ceil(self.n / tile_n)

    def tuning_key(self) -> tuple:
        """(text key, sizes for the nearest-problem distance): the batch and
        the fixed variant-block values are part of the key, since a kernel
        tuned for one epilogue or batch count is another kernel's question."""
        fixed = "".join(f",{k}={v}" for k, v in self.options)
        return (f"{self.batch}x{self.m}x{self.n}x{self.k}{fixed}",
                (float(self.batch * self.m), float(self.n), float(self.k)))


@attrs.frozen
class Matrix:
    """One batch's matrix as the argument block points at it (either target)."""

    ptr: int
    shape: tuple


@attrs.frozen
class _Tensor:
    """An operand broadcast to the call: its address and element size,
    batch strides over the call's batch shape and matrix strides, in
    elements (0 = broadcast)."""

    ptr: int
    itemsize: int
    batch_strides: tuple
    rows: int
    cols: int
    row_stride: int
    col_stride: int

    @property
    def T(self) -> "_Tensor":
        return attrs.evolve(self, rows=self.cols, cols=self.rows, row_stride=self.col_stride,
                            col_stride=self.row_stride)

    def layout(self, what: str) -> tuple:
        """(layout char, leading dim) its matrices are read with."""
        size = self.itemsize
        return possible_layouts(ArraySpec((self.rows, self.cols), (self.row_stride * size,
                                          self.col_stride * size), np.dtype(f"u{size}")), what)[0]

    def at(self, base: int, index: tuple, dims: tuple) -> int:
        """The address of its matrix at outer batch `index` over batch dims
        `dims`, its array starting at `base`."""
        return base + self.ptr + sum(i * self.batch_strides[d] for i, d in zip(index, dims)) * self.itemsize


@attrs.frozen
class Prepared:
    """What a call becomes: the problem, one argument block per launch, the result."""

    problem: Optional[KindProblem]  # None when there is nothing to compute
    launches: tuple
    result: object
    empty: bool       # nothing to compute (a zero size)


def _element_strides(x, what: str) -> tuple:
    size = x.dtype.itemsize
    if any(s < 0 or s % size for s in x.strides):
        raise ProblemError(f"{what} has strides {tuple(x.strides)} that are negative or not whole "
                           "elements; pass a copy (np.ascontiguousarray)")
    return tuple(s // size for s in x.strides)


def _tensor(x, operand: Operand, sizes: dict, batch_shape: tuple, broadcast: bool) -> _Tensor:
    """`x` (an ArraySpec) read as `operand` in a call of `batch_shape`, at
    address 0 (`prepare` adds the array's); its dims of size 1
    broadcast (stride 0) if `broadcast` (extra operands), its leading batch
    dims broadcast as numpy's matmul broadcasts them."""
    what, dims = operand.name, operand.dims
    strides, shape = _element_strides(x, what), tuple(x.shape)
    if len(shape) < 2:  # a vector (N,) is read as (1, N)
        shape, strides = (1,) * (2 - len(shape)) + shape, (0,) * (2 - len(shape)) + strides
    rows, cols = (sizes[d] for d in dims)
    for d, have, need in zip(dims, shape[-2:], (rows, cols)):
        if have != need and not (broadcast and have == 1):
            raise ProblemError(f"{what} has shape {tuple(x.shape)}: its {d.upper()} dim is {have}, "
                               f"expected {need}" + (" (or 1 to broadcast)" if broadcast else ""))
    lead, lead_strides = shape[:-2], strides[:-2]
    if lead and not operand.batched:
        raise ProblemError(f"{what} has shape {tuple(x.shape)}; variant operand {what!r} takes no "
                           "batch dims")
    if len(lead) > len(batch_shape):
        raise ProblemError(f"{what} has batch dims {lead}, more than the call's {batch_shape}")
    pad = len(batch_shape) - len(lead)
    batch = [0] * pad
    for have, stride, n in zip(lead, lead_strides, batch_shape[pad:]):
        if have not in (n, 1):
            raise ProblemError(f"{what} has batch dims {lead} that do not broadcast to {batch_shape}")
        batch.append(0 if have == 1 else stride)
    row_stride, col_stride = (0 if have == 1 else s for have, s in zip(shape[-2:], strides[-2:]))
    return _Tensor(0, x.dtype.itemsize, tuple(batch), rows, cols, row_stride, col_stride)


def _collapse(batch_shape: tuple, tensors: list) -> tuple:
    """(outer batch dims, launch batch count, per-tensor launch batch
    stride): the innermost batch dims every tensor steps through with one
    stride become one launch; the dims outside them are looped over."""
    dims = [i for i, n in enumerate(batch_shape) if n > 1]
    split = len(dims)  # dims[split:] collapse into one launch
    while split > 0:
        if split < len(dims):
            outer, inner = dims[split - 1], dims[split]
            if any(t.batch_strides[outer] != t.batch_strides[inner] * batch_shape[inner] for t in tensors):
                break
        split -= 1
    inner_dims = dims[split:]
    count = math.prod(batch_shape[i] for i in inner_dims)
    strides = [t.batch_strides[inner_dims[-1]] if inner_dims else 0 for t in tensors]
    return tuple(dims[:split]), count, strides


def _scalar_param(name: str, value, nonzero=False) -> float:
    value = _scalar(name, value)
    if not math.isfinite(value) or (nonzero and value == 0):
        raise ProblemError(f"{name} = {value} must be finite{' and nonzero' if nonzero else ''}")
    return value


def split_call(record, kwargs: dict) -> tuple:
    """(operands, params, choices) of a `run` call's keywords: the variant's
    declared operands, its scalar parameters (and the core's alpha and
    scales), and values of its variant block."""
    names = {o.name for o in record.operands}
    params = {p.name for p in record.params} | set(CORE_PARAMS)
    choices = {o.name for o in record.options} - names  # an operand implies its own option
    unknown = sorted(set(kwargs) - names - params - choices)
    if unknown:
        raise ProblemError(
            f"variant {record.name!r} takes no argument(s) {', '.join(map(repr, unknown))}; it takes "
            f"operands {', '.join(o.name for o in record.operands)}; parameters "
            f"{', '.join(sorted(params))}; options {', '.join(sorted(choices)) or '(none)'}")
    pick = lambda keys: {k: v for k, v in kwargs.items() if k in keys}
    return pick(names), pick(params), pick(choices)


@attrs.frozen
class _Plan:
    """What a call's shapes, strides and dtypes decide (memoized): the
    problem, the result to allocate, and per operand role (A, B, C, then
    the extra operands given) its name and strides as the kernel reads it."""

    problem: Optional[KindProblem]
    result_shape: tuple
    result_dtype: object
    names: tuple = ()
    tensors: tuple = ()
    outer_dims: tuple = ()
    strides: tuple = ()
    lds: tuple = ()
    transposed: bool = False


class _Same:
    """A record as a cache key, by identity (its fields hold functions)."""

    __slots__ = ("record",)

    def __init__(self, record):
        self.record = record

    def __hash__(self):
        return id(self.record)

    def __eq__(self, other):
        return self.record is other.record


def prepare(record, arrays: dict, params: dict, choices: dict, *, out_dtype=None, target="cpu",
            memory, allocate) -> Prepared:
    """The problem and argument blocks of `record`'s kind for `arrays` (in
    the target's memory, keyed by operand name)."""
    for name, x in arrays.items():
        if x is not None and not memory.accepts(x):
            raise ProblemError(f"{name} must be an array in {memory.name} memory, got {type(x).__name__}")
    out = arrays.get("out")
    if out is not None and not memory.writable(out):
        raise ProblemError("out is read-only")
    if out_dtype is not None:
        out_dtype = dtypes.get(out_dtype).token  # a clear error for a bad one, and hashable
    schema = {o.name: o for o in record.options}
    choices = tuple(sorted((name, schema[name].check(value, f"variant {record.name!r}"))
                           for name, value in choices.items()))
    specs = tuple((o.name, ArraySpec.of(arrays.get(o.name))) for o in record.operands)
    plan = _plan(_Same(record), specs, choices, out_dtype, target)
    scalars = {"alpha": _scalar_param("alpha", params.get("alpha", 1.0)),
               **{s: _scalar_param(s, params.get(s, 1.0), nonzero=True) for s in ("scale_a", "scale_b")}}
    values = tuple(_scalar_param(p.name, params.get(p.name, p.default)) for p in record.params)
    if out is not None:
        _check_no_alias(memory, out, "out", *((name, x) for name, x in arrays.items()
                                              if name != "out" and x is not None))
    result = out if out is not None else allocate(plan.result_shape, plan.result_dtype)
    if plan.problem is None:
        return Prepared(None, (), result, True)
    bases = [data_pointer(result if name == "out" else arrays[name]) for name in plan.names]
    A, B, C, *given = plan.tensors
    (m, n, k), count, dims = (plan.problem.m, plan.problem.n, plan.problem.k), plan.problem.batch, plan.outer_dims
    launches = []
    for index in np.ndindex(*(plan.result_shape[d] for d in dims)):
        extra = tuple((Matrix(t.at(base, index, dims), (t.rows, t.cols)), t.row_stride, t.col_stride,
                       stride) for t, base, stride in zip(given, bases[3:], plan.strides[3:]))
        launches.append(GemmOperands(
            Matrix(A.at(bases[0], index, dims), (m, k)), Matrix(B.at(bases[1], index, dims), (k, n)),
            Matrix(C.at(bases[2], index, dims), (m, n)), *plan.lds, scalars["alpha"], 0.0, count,
            *plan.strides[:3], scalars["scale_a"], scalars["scale_b"], extra, values, plan.transposed))
    return Prepared(plan.problem, tuple(launches), result, False)


@functools.lru_cache(maxsize=4096)
def _plan(same: _Same, specs: tuple, choices: tuple, out_dtype, target: str) -> _Plan:
    """Every shape, dtype, broadcast and layout check of a call, memoized:
    repeated calls of one kind skip to binding pointers."""
    record, arrays = same.record, dict(specs)
    declared = {o.name: o for o in record.operands}
    for o in record.operands:
        if not o.optional and arrays.get(o.name) is None:
            raise ProblemError(f"variant {record.name!r} needs operand {o.name!r} ({o.doc or o.dims})")
    a, b, out = arrays["a"], arrays["b"], arrays.get("out")
    src = _same_input_dtype(a.dtype, b.dtype)
    for name, x in (("a", a), ("b", b)):
        if x.ndim < 2 or (not declared[name].batched and x.ndim != 2):
            raise ProblemError(f"variant {record.name!r} takes a {'batched ' if declared[name].batched else ''}"
                               f"matrix {name} (2-D{' or more' if declared[name].batched else ''}), "
                               f"got shape {tuple(x.shape)}"
                               + ("" if declared[name].batched else
                                  "; for batches use dispatcher.matmul or variant 'batched'"))
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise ProblemError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} "
                           f"(K {k} != {k2})")
    _check_exact_accumulation(src, k)
    try:
        batch_shape = tuple(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    except ValueError:
        raise ProblemError(f"batch dims of a {tuple(a.shape[:-2])} and b {tuple(b.shape[:-2])} "
                           "do not broadcast") from None
    dst = dtypes.output_for(src.token, out_dtype if out_dtype is not None else
                            (out.dtype if out is not None else None))
    sizes = dict(m=m, n=n, k=k)
    result_shape = batch_shape + (m, n)
    if out is not None:
        if tuple(out.shape) != result_shape:
            raise ProblemError(f"out has shape {tuple(out.shape)}, expected {result_shape}")
        if dtypes.get(out.dtype) != dst:
            raise DtypeError(f"out is {dtypes.get(out.dtype).token} but the output dtype is {dst.token}")
    if m == 0 or n == 0 or math.prod(batch_shape) == 0:
        return _Plan(None, result_shape, dst.numpy)
    result = out if out is not None else ArraySpec(result_shape, _row_major(result_shape, dst.itemsize), dst.numpy)
    tensors = {}
    for name, x in {**arrays, "out": result}.items():
        if x is None:
            continue
        o = declared[name]
        want = {"in": src, "out": dst}.get(o.dtype) or dtypes.get(o.dtype)
        if dtypes.get(x.dtype) != want:
            raise DtypeError(f"{name} is {dtypes.get(x.dtype).token}; variant {record.name!r} "
                             f"takes it as {want.token}")
        tensors[name] = _tensor(x, o, sizes, batch_shape, broadcast=name not in MAIN)
    if any(s == 0 and d > 1 for s, d in zip(tensors["out"].batch_strides, batch_shape)):
        raise ProblemError("out has a broadcast (stride 0) batch dim: its batches would overlap")

    A, B, C = tensors["a"], tensors["b"], tensors["out"]
    names = ["a", "b", "out"]
    transposed = C.layout("out")[0] == "c"
    if transposed:  # C^T = B^T A^T, row-major C^T
        A, B, C = B.T, A.T, C.T
        names = ["b", "a", "out"]
        m, n = n, m
    (la, lda), (lb, ldb), (_, ldc) = A.layout("a"), B.layout("b"), C.layout("out")
    extras = {o.name: tensors.get(o.name) for o in record.operands if o.name not in MAIN}
    if transposed:
        extras = {name: t and t.T for name, t in extras.items()}
    options = _options(record, choices, extras)
    given = [(name, t) for name, t in extras.items() if t is not None]
    ordered = [A, B, C, *(t for _, t in given)]
    outer_dims, count, strides = _collapse(batch_shape, ordered)
    problem = KindProblem(m, n, k, count, src.token, dst.token, la + lb + "r", record.name, target,
                          tuple(sorted(options.items())))
    return _Plan(problem, result_shape, dst.numpy, tuple(names + [name for name, _ in given]),
                 tuple(ordered), outer_dims, tuple(strides), (lda, ldb, ldc), transposed)


def _row_major(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(strides[::-1])


def _options(record, choices: tuple, extras: dict) -> dict:
    """The variant-block values the call fixes: the caller's and those the
    extra operands imply."""
    fixed = dict(choices)  # checked by `prepare`
    implied = record.problem_options({name: None if t is None else (t.row_stride, t.col_stride)
                                      for name, t in extras.items()})
    for name, value in implied.items():
        if name in fixed and fixed[name] != value:
            raise ProblemError(f"{name}={fixed[name]!r} contradicts the operands, which imply {value!r}")
    return {**fixed, **implied}
