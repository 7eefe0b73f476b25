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

Operands play roles: `a`, `b`, `c` (the matrix beta scales), `out` and
extra. The roles' default names are the roles themselves; a variant may
name them as its users do (`Operand("x", ("m", "k"), role="a")`), and
calls, errors and the CLI use those names. Everything that depends only on
the record, the operands' shapes, strides and dtypes and the call's fixed
values is worked out once (`layout`, memoized); per call only pointers and
scalars are bound (`bind`).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import attrs
import numpy as np

from . import dtypes
from .errors import DtypeError, LayoutError, ProblemError
from .library import data_pointer
from .memory import HOST, View
from .problem import ArraySpec, GemmOperands, _check_exact_accumulation, _same_input_dtype, _scalar, possible_layouts


ROLES = ("a", "b", "c", "out")


@attrs.frozen
class Operand:
    """One operand of a problem kind.

    dims: its matrix (or vector) dims over "m", "n", "k". batched: it may
    carry leading batch dims. dtype: "in" (the inputs' dtype), "out" (the
    output dtype) or a dtype token. role: "a", "b", "c", "out" or "extra"
    (the default: the name itself if it is a role, else "extra"). Extra
    operands are passed to the kernel in declaration order
    (`dispatcher_gemm_args.extra`)."""

    name: str
    dims: tuple
    output: bool = False
    batched: bool = False
    optional: bool = False
    dtype: str = "in"
    doc: str = ""
    role: str = attrs.field()

    @role.default
    def _role_from_name(self):
        return self.name if self.name in ROLES else "extra"

    @role.validator
    def _known_role(self, attribute, value):
        if value not in (*ROLES, "extra"):
            raise ValueError(f"operand {self.name!r} has role {value!r}; roles: {', '.join(ROLES)}, extra")


@attrs.frozen
class Param:
    """A scalar parameter of a variant (`dispatcher_gemm_args.params`)."""

    name: str
    default: float = 0.0
    doc: str = ""


def gemm_operands(batched: bool = False, a: str = "a", b: str = "b", out: str = "out") -> tuple:
    """The operands every kind has, under the names given: a, b, c (the
    matrix beta scales) and out."""
    return (Operand(a, ("m", "k"), batched=batched, role="a", doc="left matrix"),
            Operand(b, ("k", "n"), batched=batched, role="b", doc="right matrix"),
            Operand("c", ("m", "n"), batched=batched, optional=True, dtype="out", role="c",
                    doc="the matrix beta scales (needed when beta != 0 and out is not given)"),
            Operand(out, ("m", "n"), output=True, batched=batched, optional=True, dtype="out",
                    role="out", doc="where the result goes (else a new row-major array)"))


# Scalars every kind takes: they travel in the ABI's own fields.
CORE_PARAMS = ("alpha", "beta", "scale_a", "scale_b")


_PLAIN = None  # the plain GEMM's operands, made on first use


def operands_of(record) -> tuple:
    """The record's declared operands; a `gemm` kind that declares none
    has the plain GEMM's."""
    global _PLAIN
    if record.operands:
        return record.operands
    if _PLAIN is None:
        _PLAIN = gemm_operands()
    return _PLAIN


_ROLES: dict = {}  # id(record) -> (record, its role names): asked on every call


def role_names(record) -> dict:
    """{role: operand name} of the roles the record's operands play
    (extra operands excluded)."""
    found = _ROLES.get(id(record))
    if found is None or found[0] is not record:
        found = _ROLES[id(record)] = (record, {o.role: o.name for o in operands_of(record) if o.role != "extra"})
    return found[1]


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
    fixed: tuple = ()  # the options that differ from the variant's defaults

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
        the variant-block values the call sets (a fused epilogue) are part
        of the key, since a kernel tuned for one epilogue or batch count is
        another kernel's question. A single plain GEMM's key is "MxNxK", as
        the tile engine's sweeps write it."""
        fixed = "".join(f",{k}={v}" for k, v in self.fixed)
        shape = f"{self.m}x{self.n}x{self.k}" if self.batch == 1 else f"{self.batch}x{self.m}x{self.n}x{self.k}"
        return (shape + fixed, (float(self.batch * self.m), float(self.n), float(self.k)))

    def at_tuning_sizes(self, sizes) -> "KindProblem":
        """This problem at another tuned problem's sizes (`tuning_key`: the
        batch's rows, N, K), its batch kept: the tuning database asks the
        occupancy model how a neighbour's measured times carry over."""
        rows, n, k = (max(int(x), 1) for x in sizes)
        return attrs.evolve(self, m=max(round(rows / self.batch), 1), n=n, k=k)


@attrs.frozen
class _Tensor:
    """An operand broadcast to the call: its address and element size,
    batch strides over the call's batch shape and matrix strides, in
    elements (0 = broadcast)."""

    ptr: int
    dtype: object
    batch_strides: tuple
    rows: int
    cols: int
    row_stride: int
    col_stride: int

    @property
    def T(self) -> "_Tensor":
        return attrs.evolve(self, rows=self.cols, cols=self.rows, row_stride=self.col_stride,
                            col_stride=self.row_stride)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def matrix(self, base: int, index: tuple, dims: tuple) -> View:
        """Its matrix at outer batch `index` (see `at`), as a view."""
        size = self.itemsize
        return View((self.rows, self.cols), (self.row_stride * size, self.col_stride * size), self.dtype,
                    self.at(base, index, dims))

    def layout(self, what: str, prefer: str = "r") -> tuple:
        """(layout char, leading dim) its matrices are read with: `prefer`
        where both fit (a single row or column reads either way)."""
        size = self.itemsize
        found = possible_layouts(ArraySpec((self.rows, self.cols), (self.row_stride * size,
                                           self.col_stride * size), np.dtype(f"u{size}")), what)
        return next((f for f in found if f[0] == prefer), found[0])

    def at(self, base: int, index: tuple, dims: tuple) -> int:
        """The address of its matrix at outer batch `index` over batch dims
        `dims`, its array starting at `base`."""
        return base + self.ptr + sum(i * self.batch_strides[d] for i, d in zip(index, dims)) * self.itemsize


def _element_strides(x, what: str) -> tuple:
    size = x.dtype.itemsize
    if any(s < 0 for s in x.strides):
        raise LayoutError(f"{what} has negative strides {tuple(x.strides)}; pass a copy "
                          "(np.ascontiguousarray) instead of a reversed view")
    if any(s % size for s in x.strides):
        raise LayoutError(f"{what} has strides {tuple(x.strides)} that are not whole elements; pass a "
                          "copy (np.ascontiguousarray)")
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
    return _Tensor(0, np.dtype(x.dtype), tuple(batch), rows, cols, row_stride, col_stride)


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
    declared operands, its scalar parameters (and the core's alpha, beta
    and scales), and values of its variant block."""
    kinds_of = _argument_kinds(record)
    parts = ({}, {}, {})
    for key, value in kwargs.items():
        kind = kinds_of.get(key)
        if kind is None:
            _unknown_arguments(record, kwargs, kinds_of)
        parts[kind][key] = value
    return parts


_ARGUMENT_KINDS: dict = {}  # id(record) -> (record, {argument name: 0 operand, 1 parameter, 2 choice})


def _argument_kinds(record) -> dict:
    """Each keyword a `run` of `record` takes, by what it is (worked out
    once per record)."""
    found = _ARGUMENT_KINDS.get(id(record))
    if found is None or found[0] is not record:
        names = {o.name for o in operands_of(record)}
        kinds_of = {name: 2 for name in {o.name for o in record.options} - names}  # an operand implies its option
        kinds_of.update({p.name: 1 for p in record.params})
        kinds_of.update({name: 1 for name in CORE_PARAMS})
        kinds_of.update({name: 0 for name in names})
        found = _ARGUMENT_KINDS[id(record)] = (record, kinds_of)
    return found[1]


def _unknown_arguments(record, kwargs: dict, kinds_of: dict):
    unknown = sorted(set(kwargs) - set(kinds_of))
    params = sorted(name for name, kind in kinds_of.items() if kind == 1)
    choices = sorted(name for name, kind in kinds_of.items() if kind == 2)
    raise ProblemError(
        f"variant {record.name!r} takes no argument(s) {', '.join(map(repr, unknown))}; it takes "
        f"operands {', '.join(o.name for o in operands_of(record))}; parameters "
        f"{', '.join(params)}; options {', '.join(choices) or '(none)'}")


_ALPHA_BETA = frozenset(("alpha", "beta"))


def check_choices(record, choices: dict) -> tuple:
    """The variant-block values a call sets, checked, as a sorted tuple."""
    schema = {o.name: o for o in record.options}
    return tuple(sorted((name, schema[name].check(value, f"variant {record.name!r}"))
                        for name, value in choices.items()))


def scalars(record, params: dict) -> tuple:
    """((alpha, beta, scale_a, scale_b), the variant's own parameters in
    declaration order), each checked."""
    if not record.params and params.keys() <= _ALPHA_BETA:  # the common call: finite floats, at once
        alpha, beta = params.get("alpha", 1.0), params.get("beta", 0.0)
        if type(alpha) is float and type(beta) is float and alpha - alpha == 0 and beta - beta == 0:
            return (alpha, beta, 1.0, 1.0), ()
    core = (_scalar_param("alpha", params.get("alpha", 1.0)), _scalar_param("beta", params.get("beta", 0.0)),
            _scalar_param("scale_a", params.get("scale_a", 1.0), nonzero=True),
            _scalar_param("scale_b", params.get("scale_b", 1.0), nonzero=True))
    return core, tuple(_scalar_param(p.name, params.get(p.name, p.default)) for p in record.params)


@attrs.frozen
class Layout:
    """What a call's shapes, strides, dtypes and fixed values decide
    (memoized by `layout`): the problem, the result to allocate, and per
    kernel slot (A, B, C, then the extra operands given) the operand's
    name and strides as the kernel reads it.

    transposed: the kernel computes C^T = B^T A^T (a column-major out).
    staged: out is column-major but the kind is never transposed (it
    declares an extra operand with a K dim, which C^T = B^T A^T would hand
    the kernel as another operand's): the kernel writes a row-major
    temporary, which is copied into out. c: the name of the c operand given, copied
    into the result before the launch when beta != 0."""

    problem: Optional[KindProblem]  # None when there is nothing to compute (an empty output)
    result_shape: tuple
    result_dtype: object
    names: tuple = ()
    tensors: tuple = ()
    outer_dims: tuple = ()
    strides: tuple = ()
    lds: tuple = ()
    transposed: bool = False
    staged: bool = False
    c: Optional[str] = None

    @property
    def integer_output(self) -> bool:
        return self.result_dtype.kind in "iu"

    def outer_indices(self):
        """The outer batch indices, one launch each."""
        return np.ndindex(*(self.result_shape[d] for d in self.outer_dims))


class _Same:
    """A record as a cache key, by identity (its fields hold functions)."""

    __slots__ = ("record",)

    def __init__(self, record):
        self.record = record

    def __hash__(self):
        return id(self.record)

    def __eq__(self, other):
        return self.record is other.record


def layout(record, specs: tuple, choices: tuple, out_dtype, target: str, needs_c: bool,
           read_as: str | None = None) -> Layout:
    """The `Layout` of a call of `record`'s kind: specs are (operand name,
    ArraySpec or None) in declaration order; choices the checked variant
    values; needs_c: beta != 0; read_as: a given config's layout (e.g.
    "rrr"), which decides how an A or B that reads either way (a single row
    or column) is read."""
    return _layout(_Same(record), specs, choices, out_dtype, target, needs_c, read_as)


@functools.lru_cache(maxsize=4096)
def _layout(same: _Same, specs: tuple, choices: tuple, out_dtype, target: str, needs_c: bool,
            read_as: str | None) -> Layout:
    """Every shape, dtype, broadcast and layout check of a call, once."""
    record, arrays = same.record, dict(specs)
    declared = {o.name: o for o in operands_of(record)}
    roles = role_names(record)
    for o in declared.values():
        if not o.optional and arrays.get(o.name) is None:
            raise ProblemError(f"variant {record.name!r} needs operand {o.name!r} ({o.doc or o.dims})")
    na, nb, nout, nc = roles["a"], roles["b"], roles.get("out"), roles.get("c")
    a, b = arrays[na], arrays[nb]
    out, c = arrays.get(nout), arrays.get(nc)
    src = _same_input_dtype(a.dtype, b.dtype, na, nb)
    for name, x in ((na, a), (nb, b)):
        if x.ndim < 2 or (not declared[name].batched and x.ndim != 2):
            raise ProblemError(f"variant {record.name!r} takes a {'batched ' if declared[name].batched else ''}"
                               f"matrix {name} (2-D{' or more' if declared[name].batched else ''}), "
                               f"got shape {tuple(x.shape)}"
                               + ("" if declared[name].batched else
                                  "; for batches use dispatcher.matmul or variant 'batched'"))
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise ProblemError(f"inner dimensions differ: {na} is {tuple(a.shape)}, {nb} is {tuple(b.shape)} "
                           f"(K {k} != {k2})")
    _check_exact_accumulation(src, k)
    try:
        batch_shape = tuple(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    except ValueError:
        raise ProblemError(f"batch dims of {na} {tuple(a.shape[:-2])} and {nb} {tuple(b.shape[:-2])} "
                           "do not broadcast") from None
    dst = dtypes.output_for(src.token, out_dtype if out_dtype is not None else
                            (out.dtype if out is not None else None))
    sizes = dict(m=m, n=n, k=k)
    result_shape = batch_shape + (m, n)
    if needs_c and c is None and out is None:
        raise ProblemError(f"beta != 0 needs {nc or 'c'} (the matrix beta scales)"
                           + ("" if nc else f"; variant {record.name!r} takes none"))
    for name, x in ((nout, out), (nc, c)):
        if x is None:
            continue
        if tuple(x.shape) != result_shape:
            raise ProblemError(f"{name} has shape {tuple(x.shape)}, expected {result_shape}")
        if dtypes.get(x.dtype) != dst:
            raise DtypeError(f"{name} is {dtypes.get(x.dtype).token} but the output dtype is {dst.token}")
    if m == 0 or n == 0 or math.prod(batch_shape) == 0:
        return Layout(None, result_shape, dst.numpy)
    row_major = ArraySpec(result_shape, _row_major(result_shape, dst.itemsize), dst.numpy)
    extras = [o for o in declared.values() if o.role == "extra"]
    staged = (out is not None and _tensor(out, declared[nout], sizes, batch_shape, False).layout(nout)[0] == "c"
              and any("k" in o.dims for o in extras))
    result = row_major if out is None or staged else out
    tensors = {}
    for name, x in {**arrays, nout: result}.items():
        if x is None or name == nc:
            continue
        o = declared[name]
        want = {"in": src, "out": dst}.get(o.dtype) or dtypes.get(o.dtype)
        if dtypes.get(x.dtype) != want:
            raise DtypeError(f"{name} is {dtypes.get(x.dtype).token}; variant {record.name!r} "
                             f"takes it as {want.token}")
        tensors[name] = _tensor(x, o, sizes, batch_shape, broadcast=o.role == "extra")
    if any(s == 0 and d > 1 for s, d in zip(tensors[nout].batch_strides, batch_shape)):
        raise ProblemError(f"{nout} has a broadcast (stride 0) batch dim: its batches would overlap")
    if c is not None:
        _tensor(c, declared[nc], sizes, batch_shape, False)  # its strides are readable

    A, B, C = tensors[na], tensors[nb], tensors[nout]
    names = [na, nb, nout]
    transposed = C.layout(nout)[0] == "c"
    if transposed:  # C^T = B^T A^T, row-major C^T
        A, B, C = B.T, A.T, C.T
        names = [nb, na, nout]
        m, n = n, m
    # a single column of B (a matrix times a vector) is read column-major unless a config says otherwise:
    # rcr, the layout whose K is contiguous in both operands, which the GPU's gemv schedule takes and TMA
    # can load (a row-major K x 1 B has a leading dim of 1)
    (la, lda), (_, ldc) = A.layout(na, prefer=read_as[0] if read_as else "r"), C.layout(nout)
    lb, ldb = B.layout(nb, prefer=read_as[1] if read_as else ("c" if n == 1 else "r"))
    given = {o.name: tensors.get(o.name) for o in extras}
    if transposed:
        given = {name: t and t.T for name, t in given.items()}
    options = _options(record, choices, given)
    given = [(name, t) for name, t in given.items() if t is not None]
    ordered = [A, B, C, *(t for _, t in given)]
    outer_dims, count, strides = _collapse(batch_shape, ordered)
    options = tuple(sorted(options.items()))
    problem = KindProblem(m, n, k, count, src.token, dst.token, la + lb + "r", record.name, target,
                          options, non_default(record, options))
    return Layout(problem, result_shape, dst.numpy, tuple(names + [name for name, _ in given]),
                  tuple(ordered), outer_dims, tuple(strides), (lda, ldb, ldc), transposed, staged,
                  nc if c is not None else None)


def bind(layout: Layout, pointers: tuple, core: tuple, params: tuple) -> list:
    """The argument blocks (`GemmOperands`, one per launch) of a call:
    pointers: the address of each of `layout.names`' arrays (the result's
    for out); core: (alpha, beta, scale_a, scale_b); params: the variant's."""
    A, B, C, *given = layout.tensors
    dims, count = layout.outer_dims, layout.problem.batch
    alpha, beta, scale_a, scale_b = core
    blocks = []
    for index in (layout.outer_indices() if dims else ((),)):
        extra = tuple((t.matrix(base, index, dims), t.row_stride, t.col_stride, stride)
                      for t, base, stride in zip(given, pointers[3:], layout.strides[3:]))
        blocks.append(GemmOperands(
            A.matrix(pointers[0], index, dims), B.matrix(pointers[1], index, dims),
            C.matrix(pointers[2], index, dims), *layout.lds, alpha, beta, count,
            *layout.strides[:3], scale_a, scale_b, extra, params, layout.transposed))
    return blocks


def _row_major(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(strides[::-1])


def non_default(record, options: tuple) -> tuple:
    """The (option, value) pairs of `options` that differ from the variant's
    defaults: a problem's `fixed`, part of its tuning key (a call's and a
    fused sweep's record of the same problem must agree on it)."""
    defaults = {o.name: o.default for o in record.options}
    return tuple((name, v) for name, v in options if defaults.get(name) != v)


def _options(record, choices: tuple, extras: dict) -> dict:
    """The variant-block values the call fixes: the caller's and those the
    extra operands imply."""
    fixed = dict(choices)  # checked by `check_choices`
    implied = record.problem_options({name: None if t is None else (t.row_stride, t.col_stride)
                                      for name, t in extras.items()})
    for name, value in implied.items():
        if name in fixed and fixed[name] != value:
            raise ProblemError(f"{name}={fixed[name]!r} contradicts the operands, which imply {value!r}")
    return {**fixed, **implied}


def prepare(record, arrays: dict, params: dict, choices: dict, *, out_dtype=None, target="cpu", memory=HOST,
            allocate=None, stream: int = 0) -> tuple:
    """(problem, argument blocks, result) of a call of `record`'s kind on
    arrays already in `memory` (operand name -> array): the checks, layout
    and argument blocks a `dispatcher.run` call makes, for tools that launch
    a kernel themselves (the tile engine's benchmark workers, the CLI's
    `run`, benchmarks). `result` is the out operand or a new row-major
    array; c is copied into it when beta != 0. (None, (), result) when
    there is nothing to compute."""
    for name, x in arrays.items():
        if x is not None and not memory.accepts(x):
            raise ProblemError(f"{name} must be an array in {memory.name} memory, got {type(x).__name__}")
    core, values = scalars(record, params)
    specs = tuple((o.name, ArraySpec.of(arrays.get(o.name))) for o in operands_of(record))
    found = layout(record, specs, check_choices(record, choices),
                   None if out_dtype is None else dtypes.get(out_dtype).token, target, core[1] != 0)
    roles = role_names(record)
    out, c = arrays.get(roles.get("out")), arrays.get(roles.get("c"))
    result = out if out is not None else (allocate or memory.empty)(found.result_shape, found.result_dtype)
    if found.problem is None:
        return None, (), result
    if core[1] and c is not None and c is not out:
        memory.copy(result, c, stream)
    owners = tuple(result if name == roles["out"] else arrays[name] for name in found.names)
    blocks = bind(found, tuple(map(data_pointer, owners)), core, values)
    return found.problem, tuple(attrs.evolve(block, owners=owners) for block in blocks), result


def prepare_gemm(a, b, *, c=None, out=None, alpha=1.0, beta=0.0, out_dtype=None, variant="regular",
                 target="cpu", memory=HOST, allocate=None, stream: int = 0) -> tuple:
    """(problem, operands, result) of one plain GEMM (`prepare` of the
    variant's a, b, c and out)."""
    from .plugins import get_manager

    record = get_manager().variant(variant)
    roles = role_names(record)
    arrays = {roles["a"]: a, roles["b"]: b, roles.get("c", "c"): c, roles["out"]: out}
    problem, blocks, result = prepare(record, arrays, {"alpha": alpha, "beta": beta}, {}, out_dtype=out_dtype,
                                      target=target, memory=memory, allocate=allocate, stream=stream)
    return problem, blocks[0] if blocks else None, result
