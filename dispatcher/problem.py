"""Problems and operands: what is computed, and the buffers it is computed on.

`GemmProblem` / `GroupedGemmProblem` are frozen records (the selection and
tuning key). `prepare_gemm` / `prepare_grouped` turn user arrays into a
problem plus operands, inferring each operand's layout and leading
dimension from its strides, so views and slices run without copies. Every
check on user input lives here and raises a specific error.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable

import attrs
import numpy as np

from . import dtypes
from .errors import AliasingError, DtypeError, LayoutError, ProblemError
from .memory import HOST


@attrs.frozen
class GemmProblem:
    m: int
    n: int
    k: int
    dtype: str
    out_dtype: str
    layout: str
    variant: str = "regular"
    target: str = "cpu"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def shapes(self) -> tuple:
        return ((self.m, self.n, self.k),)

    def tile_count(self, tile_m: int, tile_n: int) -> int:
        return math.ceil(self.m / tile_m) * math.ceil(self.n / tile_n)

    def tuning_key(self) -> tuple:
        """(text key, three sizes for the tuning database's nearest-problem distance)."""
        return f"{self.m}x{self.n}x{self.k}", (float(self.m), float(self.n), float(self.k))

    def at_tuning_sizes(self, sizes) -> "GemmProblem":
        """This problem at another tuned problem's sizes (`tuning_key`): the
        tuning database asks the occupancy model how a neighbour's measured
        times carry over to this problem."""
        m, n, k = (max(int(x), 1) for x in sizes)
        return attrs.evolve(self, m=m, n=n, k=k)


@attrs.frozen
class GroupedGemmProblem:
    groups: tuple          # ((m, n, k), ...)
    dtype: str
    out_dtype: str
    layout: str
    variant: str = "grouped"
    target: str = "cpu"

    @property
    def flops(self) -> float:
        return float(sum(2.0 * m * n * k for m, n, k in self.groups))

    @property
    def shapes(self) -> tuple:
        return self.groups

    def tile_count(self, tile_m: int, tile_n: int) -> int:
        return sum(math.ceil(m / tile_m) * math.ceil(n / tile_n) for m, n, _ in self.groups)

    def tuning_key(self) -> tuple:
        return ("groups:" + ",".join("x".join(map(str, s)) for s in self.groups),
                (float(len(self.groups)), max(self.flops, 1.0), max((s[2] for s in self.groups), default=1)))

    def at_tuning_sizes(self, sizes) -> None:
        """None: its tuning sizes (groups, flops, longest K) do not give its groups back."""
        return None


def token_bucket(total_m: int) -> int:
    """The power of two at or above `total_m`: the coarse size a stacked
    grouped problem is selected and tuned by, so one tuned entry serves a
    layer whose routing (and token count) changes from step to step."""
    return 1 << max(0, int(total_m) - 1).bit_length()


@attrs.frozen
class StackedGroupedProblem:
    """The stacked (mixture-of-experts) grouped problem of `grouped_mm`: G
    groups sharing N and K whose row counts live in device-side offsets, so
    the host knows only their bucketed total (`tokens`, see `token_bucket`).
    Selection and tuning see this coarse signature, never the routing."""

    group_count: int
    n: int
    k: int
    tokens: int
    dtype: str
    out_dtype: str
    layout: str
    variant: str = "grouped"
    target: str = "cpu"

    @property
    def flops(self) -> float:
        return 2.0 * self.tokens * self.n * self.k

    @property
    def shapes(self) -> tuple:
        """The groups as if the tokens were spread evenly (what the host can know)."""
        rows = math.ceil(self.tokens / max(self.group_count, 1))
        return ((rows, self.n, self.k),) * self.group_count

    def tile_count(self, tile_m: int, tile_n: int) -> int:
        rows = math.ceil(self.tokens / max(self.group_count, 1))
        return self.group_count * math.ceil(rows / tile_m) * math.ceil(self.n / tile_n)

    def tuning_key(self) -> tuple:
        return (f"stacked:{self.group_count}x{self.n}x{self.k}:{self.tokens}",
                (float(self.group_count), max(self.flops, 1.0), float(self.k)))

    def at_tuning_sizes(self, sizes) -> None:
        """None: its tuning sizes (groups, flops, K) do not give its rows back."""
        return None


@attrs.define
class GemmOperands:
    """Buffers of one problem; C is written in place (row-major). The fields
    after `beta` are the argument block of batched and declared problem
    kinds (`dispatcher.kinds`): `a`/`b`/`c` are then the first batch's
    matrices, batch strides are in elements (0 = broadcast), `extra` holds
    (array, row stride, col stride, batch stride) per extra operand in the
    variant's declared order, `params` its scalar parameters, and
    `transposed` says the core computes C^T = B^T A^T. `owners`: the arrays
    those (address) views point into, held so that their memory lives as
    long as the operands do (`kinds.prepare`): a caller that keeps the
    operands and drops the result array would otherwise have every launch
    write C into freed memory (benchmarks/cpu_gemm.py did: heap corruption)."""

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    lda: int
    ldb: int
    ldc: int
    alpha: float = 1.0
    beta: float = 0.0
    batch: int = 1
    batch_stride_a: int = 0
    batch_stride_b: int = 0
    batch_stride_c: int = 0
    scale_a: float = 1.0
    scale_b: float = 1.0
    extra: tuple = ()
    params: tuple = ()
    transposed: bool = False
    owners: tuple = attrs.field(default=(), repr=False, eq=False)


@attrs.define
class GroupedOperands:
    a: list
    b: list
    c: list
    lda: np.ndarray
    ldb: np.ndarray
    ldc: np.ndarray
    alpha: float = 1.0
    beta: float = 0.0


@attrs.define
class StackedOperands:
    """Buffers of a stacked grouped problem (`dispatcher_grouped_mm_args`):
    A (total_m, K), B (G, K, N) stride_b elements apart, C (total_m, N)
    row-major, and the int32 row offsets, all in the target's memory."""

    a: np.ndarray
    b: np.ndarray
    offsets: np.ndarray
    c: np.ndarray
    lda: int
    ldb: int
    stride_b: int
    ldc: int
    alpha: float = 1.0


def fixed_fields(problem) -> dict:
    """Variant-block values a problem fixes (a declared kind's fused
    epilogue: `kinds.KindProblem.config_fields`); none for other problems.
    A kernel without them computes something else."""
    return getattr(problem, "config_fields", {})


# ------------------------------------------------------------------ layouts
def possible_layouts(x: np.ndarray, what: str) -> list:
    """[(layout char, leading dim)] this 2-D array can be read as, row first."""
    if x.ndim != 2:
        raise ProblemError(f"{what} must be a 2-D array, got {x.ndim}-D with shape {x.shape}")
    rows, cols = x.shape
    s0, s1 = x.strides
    size = x.itemsize
    if s0 < 0 or s1 < 0:
        raise LayoutError(f"{what} has negative strides {x.strides}; pass a copy "
                          "(np.ascontiguousarray) instead of a reversed view")
    if x.size == 0:  # numpy gives empty arrays zero strides; any layout reads nothing
        return [("r", max(cols, 1)), ("c", max(rows, 1))]
    found = []
    if (s1 == size or cols <= 1) and s0 % size == 0 and (s0 // size >= cols or rows <= 1):
        found.append(("r", max(s0 // size, cols, 1) if rows > 1 else max(cols, 1)))
    if (s0 == size or rows <= 1) and s1 % size == 0 and (s1 // size >= rows or cols <= 1):
        found.append(("c", max(s1 // size, rows, 1) if cols > 1 else max(rows, 1)))
    if not found:
        raise LayoutError(f"{what} with shape {x.shape} and strides {x.strides} is neither "
                          "row- nor column-major with unit inner stride; pass np.ascontiguousarray(...)")
    return found


def check_arrays(required, optional=()):
    """What no target can take, refused before any target sees the arrays:
    a missing operand, and a numpy masked array, whose mask the kernels
    would silently ignore (they read every element). (name, array) pairs."""
    for name, x in required:
        if x is None:
            raise ProblemError(f"{name} is None; it must be a 2-D array")
    for name, x in (*required, *optional):
        if np.ma.isMaskedArray(x):
            raise ProblemError(f"{name} is a numpy masked array, whose mask the kernels would ignore; "
                               f"pass {name}.filled(value), or np.asarray({name}) for the data under the mask")


def operand_list(x, name: str) -> list:
    """The per-group operands of `grouped_gemm` as a list."""
    if not isinstance(x, Iterable):
        raise ProblemError(f"{name} must be a list of 2-D arrays (one per group), got {type(x).__name__}")
    return list(x)


def _scalar(name: str, value) -> float:
    """alpha or beta as a float. A string or a complex number is refused, not
    converted (float("2") would have accepted the one, and numpy would drop
    the imaginary part of the other)."""
    if type(value) in (float, int) or isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)  # (a plain float or int skips the slow ABC check)
    raise ProblemError(f"{name} must be a real number, got {type(value).__name__} {value!r}")


def _integer_output_scalars(out_dtype, **scalars):
    """An integer output is rounded and saturated (docs/reference.md, "int32
    outputs"); a NaN or infinite scalar has no integer result."""
    if np.issubdtype(out_dtype, np.integer):
        for name, value in scalars.items():
            if not math.isfinite(value):
                raise ProblemError(f"{name} = {value} must be finite for an integer "
                                   f"({np.dtype(out_dtype).name}) output")


@functools.lru_cache(maxsize=None)
def _deepest_exact_k(token: str):
    """The largest K at which every dot product of `token` inputs fits its
    integer accumulator (None for float accumulators): deeper sums could wrap,
    which the int32 rule (docs/reference.md) does not allow."""
    src, acc = dtypes.get(token), dtypes.get(dtypes.get(token).acc).numpy
    if not np.issubdtype(acc, np.integer):
        return None
    info = np.iinfo(src.numpy)
    return int(np.iinfo(acc).max) // max(-int(info.min), int(info.max)) ** 2


def _check_exact_accumulation(src: dtypes.DType, k: int, what: str = "K"):
    deepest = _deepest_exact_k(src.token)
    if deepest is not None and k > deepest:
        raise ProblemError(f"{what} = {k} is too deep for {src.token} inputs: their {src.acc} "
                           f"accumulator is exact for K at most {deepest}; split K and add the results")


def _check_memory(memory, *named):
    for name, x in named:
        if x is not None and not memory.accepts(x):
            raise ProblemError(f"{name} must be an array in {memory.name} memory, got {type(x).__name__}")


def _same_input_dtype(dtype_a, dtype_b, name_a: str = "a", name_b: str = "b") -> dtypes.DType:
    da, db = dtypes.get(dtype_a), dtypes.get(dtype_b)
    if da != db:
        raise DtypeError(f"{name_a} is {da.token} but {name_b} is {db.token}; both inputs must have one dtype")
    if da.token not in dtypes.INPUT_TOKENS:
        raise DtypeError(f"{da.token} is not an input dtype; inputs: {', '.join(dtypes.INPUT_TOKENS)}")
    return da


def _check_no_alias(memory, out, what, *inputs):
    for name, x in inputs:
        if x is not None and memory.overlaps(out, x):
            raise AliasingError(f"{what} overlaps {name}; the kernel would read what it writes")


class ArraySpec(tuple):
    """(shape, strides, dtype) of an array: all the layout analysis reads,
    hashable so the analysis runs once per kind of call."""

    __slots__ = ()

    def __new__(cls, shape, strides, dtype):
        return tuple.__new__(cls, (tuple(shape), tuple(strides), dtype))

    @classmethod
    def of(cls, x):
        return None if x is None else cls(x.shape, x.strides, x.dtype)

    shape = property(lambda self: self[0])
    strides = property(lambda self: self[1])
    dtype = property(lambda self: self[2])
    ndim = property(lambda self: len(self[0]))
    size = property(lambda self: math.prod(self[0]))
    itemsize = property(lambda self: self[2].itemsize)
    T = property(lambda self: ArraySpec(self[0][::-1], self[1][::-1], self[2]))


@attrs.frozen
class GroupedLayout:
    """What the groups' shapes, strides and dtypes decide: the problem,
    each group's leading dimensions, the output dtype."""

    problem: GroupedGemmProblem
    lda: tuple
    ldb: tuple
    ldc: tuple
    dst: np.dtype


@functools.lru_cache(maxsize=1024)
def grouped_layout(specs_a: tuple, specs_b: tuple, out_dtype, variant: str, target: str) -> GroupedLayout:
    """Every check of a grouped call's groups (ArraySpecs), once per kind of call."""
    if len(specs_a) != len(specs_b):
        raise ProblemError(f"{len(specs_a)} A matrices but {len(specs_b)} B matrices")
    src = None
    shapes, layouts_a, layouts_b = [], [], []
    for g, (a, b) in enumerate(zip(specs_a, specs_b)):
        d = _same_input_dtype(a.dtype, b.dtype)
        if src is not None and d != src:
            raise DtypeError(f"group {g} is {d.token} but group 0 is {src.token}; groups share one dtype")
        src = d
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ProblemError(f"group {g}: a {a.shape} and b {b.shape} do not multiply")
        shapes.append((a.shape[0], b.shape[1], a.shape[1]))
        layouts_a.append(dict(possible_layouts(a, f"a[{g}]")))
        layouts_b.append(dict(possible_layouts(b, f"b[{g}]")))
    if src is None:
        src = _input_for_output(out_dtype)
    dst = dtypes.output_for(src.token, out_dtype)
    for g, (_, _, k) in enumerate(shapes):
        _check_exact_accumulation(src, k, f"group {g}: K")
    la = _common_layout(layouts_a, "A")
    lb = _common_layout(layouts_b, "B")
    problem = GroupedGemmProblem(tuple(shapes), src.token, dst.token, la + lb + "r", variant, target)
    return GroupedLayout(problem, tuple(l[la] for l in layouts_a), tuple(l[lb] for l in layouts_b),
                         tuple(max(n, 1) for _, n, _ in shapes), dst.numpy)


def grouped_operands(layout: GroupedLayout, list_a, list_b, alpha: float, memory, allocate) -> tuple:
    """(operands, results) of one grouped call on arrays its layout fits."""
    alpha = _scalar("alpha", alpha)
    _integer_output_scalars(layout.dst, alpha=alpha)
    results = [allocate((m, n), layout.dst) for m, n, _ in layout.problem.groups]
    operands = GroupedOperands(list(list_a), list(list_b), results, np.array(layout.lda, np.int64),
                               np.array(layout.ldb, np.int64), np.array(layout.ldc, np.int64), alpha, 0.0)
    return operands, results


def prepare_grouped(list_a, list_b, *, out_dtype=None, alpha=1.0, variant="grouped", target="cpu",
                    memory=HOST, allocate=None):
    """(problem, operands, results) for C_g = alpha * A_g @ B_g, g = 0..G-1."""
    list_a, list_b = list(list_a), list(list_b)
    for g, (a, b) in enumerate(zip(list_a, list_b)):
        _check_memory(memory, (f"a[{g}]", a), (f"b[{g}]", b))
    if out_dtype is not None:
        out_dtype = dtypes.get(out_dtype).token
    layout = grouped_layout(tuple(map(ArraySpec.of, list_a)), tuple(map(ArraySpec.of, list_b)),
                            out_dtype, variant, target)
    operands, results = grouped_operands(layout, list_a, list_b, alpha, memory, allocate or memory.empty)
    return layout.problem, operands, results


def _input_for_output(out_dtype) -> dtypes.DType:
    """The input dtype of a grouped problem with no groups: the first that
    can write `out_dtype` (int8 for int32), so any valid request is met."""
    if out_dtype is None:
        return dtypes.get(dtypes.INPUT_TOKENS[0])
    out = dtypes.get(out_dtype)
    for token in dtypes.INPUT_TOKENS:
        if out.token in dtypes.get(token).outputs:
            return dtypes.get(token)
    raise DtypeError(f"no input dtype has {out.token} outputs")


def _common_layout(per_group: list, what: str) -> str:
    for choice in ("r", "c"):
        if all(choice in options for options in per_group):
            return choice
    raise LayoutError(f"the {what} matrices mix row- and column-major layouts; "
                      "groups share one layout")


@attrs.frozen
class StackedLayout:
    """What a stacked call's shapes, strides and dtypes decide."""

    problem: StackedGroupedProblem
    total_m: int
    lda: int
    ldb: int
    stride_b: int
    dst: np.dtype


@functools.lru_cache(maxsize=1024)
def stacked_layout(a: ArraySpec, b: ArraySpec, offsets: ArraySpec, out_dtype, variant: str,
                   target: str) -> StackedLayout:
    """Every check of a `grouped_mm` call but the offsets' values, once per kind of call."""
    if a.ndim != 2:
        raise ProblemError(f"a must be 2-D (total_M, K), got shape {a.shape}")
    if b.ndim != 3:
        raise ProblemError(f"b must be 3-D (G, K, N), got shape {b.shape}")
    if offsets.ndim != 1 or np.dtype(offsets.dtype) != np.int32:
        raise ProblemError(f"offsets must be a 1-D int32 array of G cumulative row ends, got "
                           f"{offsets.ndim}-D {np.dtype(offsets.dtype).name}")
    (total_m, k), (groups, k2, n) = a.shape, b.shape
    if k != k2:
        raise ProblemError(f"inner dimensions differ: a is {a.shape}, b is {b.shape} (K {k} != {k2})")
    if offsets.shape[0] != groups:
        raise ProblemError(f"offsets has {offsets.shape[0]} entries but b has {groups} groups")
    if offsets.shape[0] and offsets.strides[0] != offsets.itemsize:
        raise LayoutError("offsets must be contiguous; pass a contiguous copy")
    src = _same_input_dtype(a.dtype, b.dtype)
    _check_exact_accumulation(src, k)
    dst = dtypes.output_for(src.token, out_dtype)
    la, lda = possible_layouts(a, "a")[0]
    if not b.size:  # numpy may give an empty array any strides; nothing is read from it
        lb, ldb = "r", max(n, 1)
    else:
        lb, ldb = possible_layouts(ArraySpec(b.shape[1:], b.strides[1:], np.dtype(b.dtype)), "each b[g]")[0]
    if b.size and (b.strides[0] % b.itemsize or b.strides[0] < 0):
        raise LayoutError(f"b's groups must be apart by a non-negative whole number of elements, got "
                          f"stride {b.strides[0]} bytes; pass np.ascontiguousarray(b)")
    problem = StackedGroupedProblem(groups, n, k, token_bucket(total_m), src.token, dst.token,
                                    la + lb + "r", variant, target)
    return StackedLayout(problem, total_m, lda, ldb, b.strides[0] // b.itemsize if b.size else 0, dst.numpy)


def stacked_operands(layout: StackedLayout, a, b, offsets, alpha: float, allocate) -> tuple:
    """(operands, result) of one stacked call on arrays its layout fits;
    host offsets are checked here (vectorized, no per-group Python work),
    device offsets by the kernels, which then write nothing
    (docs/reference.md, "grouped_mm")."""
    alpha = _scalar("alpha", alpha)
    _integer_output_scalars(layout.dst, alpha=alpha)
    if isinstance(offsets, np.ndarray):
        check_offsets(offsets, layout.total_m)
    n = layout.problem.n
    result = allocate((layout.total_m, n), layout.dst)
    return StackedOperands(a, b, offsets, result, layout.lda, layout.ldb, layout.stride_b, max(n, 1),
                           alpha), result


def prepare_grouped_mm(a, b, offsets, *, out_dtype=None, alpha=1.0, variant="grouped", target="cpu",
                       memory=HOST, allocate=None):
    """(problem, operands, result) for the stacked form: rows
    [offsets[g-1], offsets[g]) of `a` times b[g], into one (total_M, N) result."""
    _check_memory(memory, ("a", a), ("b", b), ("offsets", offsets))
    if out_dtype is not None:
        out_dtype = dtypes.get(out_dtype).token
    layout = stacked_layout(ArraySpec.of(a), ArraySpec.of(b), ArraySpec.of(offsets), out_dtype, variant, target)
    operands, result = stacked_operands(layout, a, b, offsets, alpha, allocate or memory.empty)
    return layout.problem, operands, result


def check_offsets(offsets: np.ndarray, total_m: int):
    """Host offsets: non-decreasing, from 0 up to at most total_M (each
    call's: a quick test of the common, valid case first)."""
    if not offsets.size:
        return
    if offsets[0] >= 0 and offsets[-1] <= total_m and (offsets.size == 1 or not (offsets[1:] < offsets[:-1]).any()):
        return
    steps = np.diff(offsets, prepend=np.int32(0))
    bad = np.flatnonzero(steps < 0)
    if bad.size:
        g = int(bad[0])
        raise ProblemError(f"offsets must be non-decreasing cumulative row ends: offsets[{g}] = "
                           f"{int(offsets[g])} is smaller than {int(offsets[g - 1]) if g else 0}")
    if int(offsets[-1]) > total_m:
        g = int(np.argmax(offsets > total_m))
        raise ProblemError(f"offsets[{g}] = {int(offsets[g])} exceeds a's {total_m} rows")
