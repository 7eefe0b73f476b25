"""Plans: one kind of call, worked out once.

Everything a call's result depends on, except the data, is decided by the
problem kind (the variant's record), the operands' shapes, strides, dtypes
and memory, the call's options and the kernel chosen for it: the checks,
the selection, the argument block, the output's size and the bound entry
point. A `Plan` holds all of that. It is made on a call's first
appearance and memoized by the call's signature (`Dispatcher.plans`), so
a warm call only confirms that its arrays are the ones the plan was made
for (finding the plan by their specs is that check), checks what depends
on the data (writability, aliasing), binds pointers and scalars and
launches. A plan binds what the hook chain chose (the selected config,
its library and the `dispatcher_launch` implementation that answered);
registering a plugin forgets every plan.

Users may hold one (`dispatcher.plan(...)`) to skip even the lookup:
    p = dispatcher.plan("regular", a=a, b=b)
    c = p(a, b)            # any arrays with a's and b's shapes, strides, dtypes
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping

import attrs
import numpy as np

from . import dispatch, kinds, plugins, targets
from .errors import AliasingError, ProblemError
from .library import GroupedMmArgs, bound_gemm_args, data_pointer, gemm_args, grouped_mm_args
from .memory import span
from .problem import ArraySpec, StackedOperands, _integer_output_scalars, check_offsets
from .workspace import WORKSPACES


def planned(dispatcher, record, arrays: dict, choices: tuple, out_dtype, target: str, needs_c: bool,
            config=None, options=None, strict=False, autotune=False) -> "Plan":
    """The plan of a call of `record`'s kind on `arrays` (operand name ->
    array in `target`'s memory, or None), memoized in `dispatcher.plans`
    by everything it depends on. choices: the checked variant values;
    options: resolved launch options (hashable values)."""
    specs = tuple((o.name, ArraySpec.of(arrays.get(o.name))) for o in kinds.operands_of(record))
    signature = (id(record), specs, choices, out_dtype, target, needs_c, _hashable(config),
                 tuple(sorted((options or {}).items())), strict, autotune, _alignment(target, arrays))
    dispatcher._check_generation()
    found = dispatcher.plans.get(signature)
    if found is None:
        layout = kinds.layout(record, specs, choices, out_dtype, target, needs_c, _config_layout(config))
        found = Plan(dispatcher, record, layout, target, specs, config, options, strict, autotune)
        found.alignment = signature[-1]
        if config is not None and layout.problem is not None:
            found.config = dispatcher.config_matching(layout.problem, config)  # a clear error before any build
        dispatcher.plans[signature] = found
    return found


def _config_layout(config) -> str | None:
    """The layout a given config (a KernelConfig or a dict of fields) reads
    its operands in; None: no config, or one that does not say."""
    layout = config.get("layout") if isinstance(config, Mapping) else getattr(config, "layout", None)
    return layout if isinstance(layout, str) and len(layout) == 3 else None


def _tensor_pointer(t) -> int:
    return t.data_ptr()


def _alignment(target: str, arrays: dict) -> tuple:
    """The alignment class of a call on a target whose kernels stage
    misaligned operands in a workspace (cuda: TMA's 16 bytes): whether each
    array's address is aligned. Part of a plan's signature, so what its
    first call staged, and the workspace that took, holds for every later
    call."""
    if not targets.get(target).pads:
        return ()
    return tuple(sorted((name, data_pointer(x) % ALIGNMENT == 0) for name, x in arrays.items() if x is not None))


# The address alignment a plan's signature records on a target that pads.
ALIGNMENT = 16

# (alpha, beta, scale_a, scale_b) of a plain call (`Plan.runner`).
DEFAULT_SCALARS = (1.0, 0.0, 1.0, 1.0)


def _hashable(config):
    """A config as part of a plan's signature: a dict of fields by its items."""
    if isinstance(config, Mapping):
        try:
            return tuple(sorted(config.items()))
        except TypeError:  # unorderable keys: the config check says what is wrong
            return id(config)
    try:
        hash(config)
    except TypeError:
        return id(config)
    return config


class _Launches:
    """The launch side every plan shares: its first launch autotunes (if
    asked and the problem is new), runs the selected or given kernel,
    falling back down the ranking on status -2, and binds the kernel and
    the `dispatcher_launch` implementation that ran; later launches call
    that implementation directly."""

    def __init__(self, dispatcher, problem, config, options, strict, autotune):
        self.dispatcher, self.problem = dispatcher, problem
        self.config, self.options, self.strict, self.autotune = config, options or {}, strict, autotune
        self.generation = dispatcher.manager.generation
        self.chosen = None  # (config, library, bound launch) once the first launch has run

    def __repr__(self):
        return f"{type(self).__name__}({self.problem}, kernel={self.chosen[0].name if self.chosen else None})"

    def current(self, dispatcher=None) -> bool:
        """Whether the plan still binds what the hook chain of `dispatcher`
        (None: the default dispatcher) would choose: no plugin registered
        since, no manager reset."""
        d = self.dispatcher
        if dispatcher is not None:
            return d is dispatcher and self.generation == d.manager.generation
        return d is dispatch._DEFAULT and self.generation == d.manager.generation and \
            d.manager is plugins._MANAGER

    def launch(self, block):
        if self.chosen is None or self.generation != self.dispatcher.manager.generation:
            self._choose(block)
            return
        config, library, launch = self.chosen
        if launch is None or launch(library=library, problem=self.problem, operands=block,
                                    options=self.options) is None:
            self.dispatcher.launch(library, self.problem, block, self.options, resolved=True)

    def _choose(self, block):
        d = self.dispatcher
        if self.config is None and self.autotune:
            d.autotune_if_new(self.problem, block, self.options)
        self.problem, config = d.run_or_fall_back(self.problem, block, self.config, self.options,
                                                  self.strict, resolved=True)
        self.generation = d.manager.generation
        self.chosen = (config, d.library(config), d.bound_launch(self.problem.variant))


class GroupedPlan(_Launches):
    """A grouped call (`grouped_gemm`'s list form or `grouped_mm`'s
    stacked form) with its groups' shapes, strides and dtypes fixed: its
    layout (`problem.grouped_layout` / `stacked_layout`) and kernel."""

    def __init__(self, dispatcher, layout, config, options, strict=False, autotune=False):
        super().__init__(dispatcher, layout.problem, config, options, strict, autotune)
        self.layout = layout
        self._direct = None  # (entry point, argument template, library) of a stacked launch
        self.runners = {}  # `runner`'s functions by operand order and scalars, for the kernel bound now

    def _choose(self, block):
        """The first launch (see `_Launches`), then, for a stacked call whose
        launch says how (`direct_grouped_mm`), the kernel's entry point and
        the argument block each call copies."""
        super()._choose(block)
        self.runners, self._direct = {}, None  # they bound the kernel chosen before
        config, library, launch = self.chosen
        direct = getattr(launch, "direct_grouped_mm", None)
        if direct is not None and isinstance(block, StackedOperands):
            self._direct = (direct(library), grouped_mm_args(block, stream=self.options.get("stream", 0)), library)

    def runner(self, order: tuple, scalars: tuple):
        """A stacked call's runner (see `Plan.runner`): a function of (a, b,
        offsets) in `order` that checks host offsets, allocates the result,
        points a copy of the argument block at the arrays and calls the
        entry point, with alpha = scalars[0]; None until the first launch
        bound a kernel whose launch allows it."""
        found = self.runners.get(_runner_key(order, scalars))
        if found is not None:
            return found
        if self._direct is None or order != ("a", "b", "offsets"):
            return None
        entry, template, library = self._direct
        stream, alpha, layout = self.options.get("stream", 0), scalars[0], self.layout
        shape = (layout.total_m, layout.problem.n)

        def run(a, b, offsets):
            if type(offsets) is np.ndarray:
                check_offsets(offsets, layout.total_m)
            result = new_result(a, shape, layout.dst)
            pointer = data_pointer if type(result) is np.ndarray else _tensor_pointer
            args = GroupedMmArgs.from_buffer_copy(template)
            args.a, args.b, args.c, args.offsets = pointer(a), pointer(b), pointer(result), pointer(offsets)
            args.alpha = alpha
            WORKSPACES.attach(library, args, stream)  # asked each call: staging depends on the addresses
            _enter(entry, library, args)
            return result
        self.runners[_runner_key(order, scalars)] = run
        return run


def planned_grouped(dispatcher, layout, config=None, options=None, autotune=False) -> GroupedPlan:
    """The plan of a grouped call of `layout` (itself memoized by the
    groups' specs), memoized in `dispatcher.plans`."""
    signature = ("grouped", layout, _hashable(config), tuple(sorted((options or {}).items())), autotune)
    dispatcher._check_generation()
    found = dispatcher.plans.get(signature)
    if found is None:
        found = dispatcher.plans[signature] = GroupedPlan(dispatcher, layout, config, options, False, autotune)
    return found


@attrs.frozen
class NativeLaunch:
    """A plan's launch as native code runs it (`Plan.native_launch`)."""
    entry: int            # the kernel entry point's address
    last_error: int       # its library's `dispatcher_last_error`'s address
    block: bytes          # the argument block with the plan's scalars, its pointers null
    extra: list           # the extra operands' (row, col, batch) strides, in call order
    rows: int             # the result's shape (batch: its leading dim where it is 3-D, else 0) and
    cols: int             # numpy dtype
    dtype: object
    check: object         # the library's status check: raises the exception of a nonzero status
    batch: int = 0
    out: bool = False     # the output is given, last in the call (else a new row-major result)
    workspace: int = 0    # the scratch bytes each call needs (its own: a stream-K or split-K kernel's partials)
    zeroed: bool = False  # whether that scratch must be zeroed first (the target's `zeroes_workspace`)


class Plan(_Launches):
    """A declared kind's call with its shapes, strides, dtypes, memory,
    options and kernel fixed (module docstring)."""

    def __init__(self, dispatcher, record, layout: kinds.Layout, target: str, specs: tuple,
                 config=None, options=None, strict=False, autotune=False):
        super().__init__(dispatcher, layout.problem, config, options, strict, autotune)
        self.record, self.layout = record, layout
        self.target, self.specs = targets.get(target), specs
        self.names = kinds.role_names(record)
        # (entry point, argument template, library, workspace bytes, or None: asked each call) of a
        # standard GEMM launch
        self._direct = None
        self.runners = {}  # `runner`'s functions by operand order and scalars, while the kernel they bind is the plan's
        self.alignment = ()   # the alignment class of its signature (`_alignment`)

    def _runs_direct(self) -> bool:
        """Whether a runner may run the plan's calls: one launch, nothing
        staged or copied, the bound kernel's entry point."""
        layout = self.layout
        return (self._direct is not None and layout.problem is not None and layout.problem.k > 0
                and layout.c is None and not layout.staged)

    def _new_result(self, like):
        """A new row-major result of the kind `like` is (`new_result`)."""
        return new_result(like, self.layout.result_shape, self.layout.result_dtype)

    def runner(self, order: tuple, scalars: tuple = DEFAULT_SCALARS):
        """The plan's calls on arrays passed in `order` (operand names; the
        output's name among them: the result goes there, else into a new
        row-major array) with the core scalars `scalars` (alpha, beta,
        scale_a, scale_b; beta 0) and the variant's parameters at their
        defaults: a function of those arrays that checks what depends on
        the data (the output writable and apart from the inputs), points
        an argument block of its own (one kept per thread, taken while in
        use) at them and calls the entry point; the
        fewest steps a call can take. The api's memo of calls (`api._RUNNERS`)
        and held plans run them. None where such calls cannot go straight
        to the kernel (yet: a plan's first call binds it). Made once per
        order and scalars and bound kernel: a plan that chooses again (after
        a plugin registration) drops them."""
        found = self.runners.get(_runner_key(order, scalars))
        if found is not None:
            return found
        if not self._runs_direct() or self.layout.integer_output or self.record.params or scalars[1] != 0:
            return None
        slots, out = self._slots, self.names.get("out")
        inputs = [name for name in slots if name is not None]
        given = inputs + ([out] if out in order else [])
        if (out in order) != (dict(self.specs).get(out) is not None) or slots[2] is not None \
                or None in slots[:2] + slots[3:] or sorted(given) != sorted(order):
            return None
        entry, template, library, workspace = self._direct
        ia, ib = order.index(slots[0]), order.index(slots[1])
        extras = tuple(order.index(name) for name in slots[3:])  # where the extra operands are in a call
        stream, new_result = self.options.get("stream", 0), self._new_result
        io = order.index(out) if out in order else None
        spans = dict((name, span(spec)) for name, spec in self.specs if spec is not None)
        apart = tuple((order.index(name), name, spans[name]) for name in inputs)  # what out must not overlap

        def result_of(arrays, pointer):
            """The given output, checked, or a new result."""
            if io is None:
                return new_result(arrays[0])
            result = arrays[io]
            if type(result) is np.ndarray and not result.flags.writeable:
                raise ProblemError(f"{out} is read-only")
            start = pointer(result)
            end = start + spans[out]
            for i, name, span in apart:
                x = pointer(arrays[i])
                if x < end and start < x + span and _shares_memory(result, arrays[i]):
                    raise AliasingError(f"{out} overlaps {name}; the kernel would read what it writes")
            return result

        # Argument blocks for reuse: a call takes one (or makes one), points
        # it at its arrays, and puts it back after its kernel returned (an
        # entry point reads the block while it runs and keeps nothing of it).
        # Kept per thread and taken out while in use, so neither another
        # thread's call (while this kernel runs without the GIL) nor a call
        # nested in this one on the same thread (a signal handler, a
        # profiler or __del__ running Python between the filling and the
        # kernel) can repoint the block a kernel is about to read.
        blocks = threading.local()

        def new_block():  # the plan's template with these scalars, its extra operands' array its own
            args = bound_gemm_args(template, (0,) * len(slots), scalars, ())
            return args, [args._extra[i] for i in range(len(extras))]

        def run(*arrays):
            pointer = data_pointer if type(arrays[0]) is np.ndarray else _tensor_pointer
            result = result_of(arrays, pointer)
            block = blocks.__dict__.pop("free", None) or new_block()
            args, extra = block
            args.a, args.b, args.c = pointer(arrays[ia]), pointer(arrays[ib]), pointer(result)
            for operand, i in zip(extra, extras):
                operand.data = pointer(arrays[i])
            if workspace != 0:  # None: its size asked each call (`_workspace_of`)
                WORKSPACES.attach(library, args, stream, workspace)
            _enter(entry, library, args)
            blocks.free = block  # not after a failed call: its block is simply dropped
            return result
        self.runners[_runner_key(order, scalars)] = run
        return run

    def native_launch(self, order: tuple, scalars: tuple = DEFAULT_SCALARS) -> "NativeLaunch | None":
        """What native code needs to run the calls `runner(order, scalars)`
        runs, the way that runner does (dispatcher/numpy_calls.c,
        dispatcher/torch/native_linear.cpp). None where the runner would
        be, or where a call needs more than a block, an entry point and
        scratch of a size fixed by the plan: a workspace sized at each
        call, a result of more than 3 dims, an output given anywhere but
        last."""
        if self.runner(order, scalars) is None:
            return None
        entry, template, library, workspace = self._direct
        out = self.names.get("out")
        given = bool(order) and order[-1] == out  # the output given: C points at it
        slots = self._slots  # the block's A, B, C (None: the result or the output given) and extra operands
        shape = self.layout.result_shape
        if workspace is None or len(shape) not in (2, 3) or slots[2] is not None \
                or slots[:2] + slots[3:] + ((out,) if given else ()) != tuple(order):
            return None
        block = bound_gemm_args(template, (0,) * len(slots), scalars, ())
        extra = [(block.extra[i].row_stride, block.extra[i].col_stride, block.extra[i].batch_stride)
                 for i in range(len(slots) - 3)]
        block.extra = None
        return NativeLaunch(ctypes.cast(entry, ctypes.c_void_p).value, library.last_error_address, bytes(block),
                            extra, *shape[-2:], self.layout.result_dtype, library.check,
                            shape[0] if len(shape) == 3 else 0, given, workspace, self.target.zeroes_workspace)

    def matches(self, arrays: dict) -> bool:
        """Whether `arrays` are what the plan was made for: their specs and
        alignment class."""
        return all(ArraySpec.of(arrays.get(name)) == spec for name, spec in self.specs) and \
            _alignment(self.target.name, arrays) == self.alignment

    # ----------------------------------------------------------- per call
    def __call__(self, arrays: dict, core: tuple, params: tuple, memory, allocate, stream: int = 0):
        """Run the planned call on `arrays` (operand name -> array in the
        target's memory, matching the plan's specs); returns the result.
        core: (alpha, beta, scale_a, scale_b); params: the variant's."""
        layout, names = self.layout, self.names
        out = arrays.get(names.get("out"))
        if out is not None:
            _check_out(memory, out, names, arrays)
        if layout.c is not None:
            c = arrays[layout.c]
            for role in ("a", "b"):
                if memory.overlaps(c, arrays[names[role]]):
                    raise AliasingError(f"{layout.c} overlaps {names[role]}; pass a copy")
        result = out if out is not None and not layout.staged else \
            allocate(layout.result_shape, layout.result_dtype)
        if layout.problem is None:  # an empty output
            return result
        if layout.integer_output:
            _integer_output_scalars(layout.result_dtype, alpha=core[0], beta=core[1])
        if core[1] and layout.c is not None:
            c = arrays[layout.c]
            if not _same_elements(c, result):
                if out is not None and memory.overlaps(c, out) and not _same_elements(c, out):
                    raise AliasingError(f"{layout.c} partially overlaps {names['out']}; it may be "
                                        f"{names['out']} itself, or a view of exactly its elements")
                memory.copy(result, c, stream)
        elif core[1] and layout.staged:  # beta scales out itself: the temporary starts as out
            memory.copy(result, out, stream)
        if layout.problem.k == 0:
            self._empty_product(result, core[1], params, memory, allocate)
        else:
            self._launch(arrays, result, core, params, allocate)
        if layout.staged:
            memory.copy(out, result, stream)
            return out
        return result

    def _pointers(self, arrays: dict, result) -> tuple:
        out = self.names.get("out")
        return tuple(data_pointer(result if name == out else arrays[name]) for name in self.layout.names)

    def _launch(self, arrays: dict, result, core: tuple, params: tuple, allocate):
        """Bind and launch: straight into the kernel's entry point once a
        standard GEMM launch is bound, else each argument block through
        the bound hook implementation."""
        direct = self._direct
        if direct is not None and self.generation == self.dispatcher.manager.generation:
            entry, template, library, workspace = direct
            args = bound_gemm_args(template, self._pointers(arrays, result), core, params)
            if workspace != 0:
                WORKSPACES.attach(library, args, self.options.get("stream", 0), workspace)
            library.check(entry(args))
            return
        for block in kinds.bind(self.layout, self._pointers(arrays, result), core, params):
            self.launch(block)

    def _choose(self, block):
        """The first launch (see `_Launches`), then, for a standard GEMM
        launch of one block, the kernel's entry point, the argument block
        to copy for each call and the workspace bytes it asks for (the
        signature holds everything they depend on: shapes, strides,
        options and the alignment class, which decides what a CUDA kernel
        stages)."""
        super()._choose(block)
        self.runners, self._direct = {}, None  # they bound the kernel chosen before
        config, library, launch = self.chosen
        direct = getattr(launch, "direct_gemm", None)
        if direct is not None and not self.layout.outer_dims:
            template = gemm_args(block, workers=self.options.get("workers", 0),
                                 stream=self.options.get("stream", 0))
            self._direct = (direct(library), template, library, _workspace_of(library, template, self.target))
        out = self.names.get("out")
        self._slots = tuple(None if name == out else name for name in self.layout.names)  # None: the result

    def _empty_product(self, result, beta: float, params: tuple, memory, allocate):
        """K = 0: C = beta * C, with nothing added. On the host in float64
        (then stored as the kernels store); elsewhere by the kernel itself
        on zero-filled K = 16 operands with alpha = 0, so the target's own
        epilogue scales C (or writes zeros when beta is 0)."""
        record = self.record
        plain = not params and len(self.layout.names) == 3 and \
            all(v == _default(record, n) for n, v in self.layout.problem.options)
        if not plain:
            raise ProblemError("K = 0 is not supported with extra operands, parameters or a fused "
                               "epilogue: there is no product to apply them to")
        if isinstance(result, np.ndarray):
            result[...] = _stored(beta * result.astype(np.float64), result.dtype) if beta else 0
            return
        depth, stream = 16, self.options.get("stream", 0)
        specs = dict(self.specs)
        a, b = specs[self.names["a"]], specs[self.names["b"]]
        zeros = {self.names["a"]: allocate(a.shape[:-1] + (depth,), a.dtype),
                 self.names["b"]: allocate(b.shape[:-2] + (depth, b.shape[-1]), b.dtype),
                 self.names["out"]: result}
        for name in (self.names["a"], self.names["b"]):
            memory.zero(zeros[name], zeros[name].size * zeros[name].itemsize, stream)
        plan = planned(self.dispatcher, record, zeros, (), self.layout.problem.out_dtype,
                       self.target.name, False, None, self.options)
        plan(zeros, (0.0, beta, 1.0, 1.0), (), memory, allocate, stream)


def _workspace_of(library, template, target):
    """The workspace bytes a plan's launches ask for, or None where the
    target's kernels size it at each call (`workspace_per_call`: a CPU
    stream-K kernel's follows the OpenMP thread count, which can change
    between calls) and the library asks for one."""
    if target.workspace_per_call and library.asks_workspace(type(template)):
        return None
    return library.workspace_size(template)


def _runner_key(order: tuple, scalars: tuple) -> tuple:
    """A plan's memo key of its runners: 0.0 and -0.0 are one dict key, so
    a zero alpha's sign is added (it decides the sign of zero results)."""
    return (order, scalars) if scalars[0] else (order, scalars, repr(scalars[0]))


def _enter(entry, library, args):
    """Call a kernel's entry point with an argument block; a nonzero status
    becomes the library's exception."""
    status = entry(args)
    if status:
        library.check(status)


def new_result(like, shape, dtype):
    """A new row-major array of the kind `like` is: a numpy array, or a torch
    tensor on its device."""
    if type(like) is np.ndarray:
        return np.empty(shape, dtype)
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        from .targets.cuda_memory import torch_types
        found = _TORCH_DTYPES[dtype] = torch_types()[1][np.dtype(dtype)]
    return like.new_empty(shape, dtype=found)


_TORCH_DTYPES: dict = {}  # a result's numpy dtype -> its torch dtype, once a call on tensors asks


def _shares_memory(x, y) -> bool:
    """Whether two arrays whose extents overlap share an element: numpy
    says exactly; device memory counts the overlap of extents, as the
    device's `overlaps` does."""
    return np.shares_memory(x, y) if type(x) is np.ndarray else True


def _default(record, name):
    return next((o.default for o in record.options if o.name == name), None)


def _stored(values: np.ndarray, dtype) -> np.ndarray:
    """float64 `values` converted as the kernels' epilogue converts them: an
    integer output rounded half to even and saturated (docs/reference.md,
    "int32 outputs"), a float output rounded to nearest."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        values = np.clip(np.rint(values), info.min, info.max)
    return values.astype(dtype)


def _same_elements(x, y) -> bool:
    """Whether x and y are the same elements of one buffer (out itself, or a
    view such as out[...]): C is then updated in place, with nothing to copy."""
    return x is y or (ArraySpec.of(x) == ArraySpec.of(y) and data_pointer(x) == data_pointer(y))


def check_writable(memory, out, name: str):
    """An output the caller passed must be writable (checked before the
    plan: a read-only broadcast view fails here, not on its strides)."""
    if out is not None and not memory.writable(out):
        raise ProblemError(f"{name} is read-only")


def _check_out(memory, out, names: dict, arrays: dict):
    """out shares no memory with what the kernel reads."""
    for name, x in arrays.items():
        if x is not None and name not in (names["out"], names.get("c")) and memory.overlaps(out, x):
            raise AliasingError(f"{names['out']} overlaps {name}; the kernel would read what it writes")
