"""The Python API, the entry points of every call: `gemm`, `matmul`,
`run` and `plan` for single, batched and declared problem kinds,
`grouped_gemm` and `grouped_mm` for grouped ones.

A call's path: its variant's record (`plugins`) -> its arrays imported
into the target's memory (`targets`) -> the plan of its kind of call
(`plans`: checks, layout and selection made once, `kinds`) -> the bound
launch (`dispatch`, the variant's `dispatcher_launch`) -> the kernel's C
entry point (`library`). See docs/architecture.md.
"""

from __future__ import annotations

import numpy as np

from . import dtypes, kinds, native_module, numpy_calls, plans, plugins, targets  # noqa: F401 - numpy_calls registers its kind
from .dispatch import Dispatcher, autotune_default, default_dispatcher
from .errors import ConfigError, DispatcherError, ProblemError
from .plugins import get_manager
from .problem import (ArraySpec, check_arrays, grouped_layout, grouped_operands, operand_list, stacked_layout,
                      stacked_operands)
from .records import resolve_launch_options

__all__ = ["Dispatcher", "gemm", "grouped_gemm", "grouped_mm", "matmul", "plan", "run"]


def _resolve_target(target: str, *arrays) -> str:
    """"auto": the target whose memory holds the arrays (numpy: cpu; torch
    CUDA tensors and CUDA arrays: cuda); else the named target."""
    if target == "auto":
        held = [x for x in arrays if x is not None]
        for x in held:
            if type(x) is not np.ndarray:
                return targets.for_arrays(*held)
        return "cpu"
    if not isinstance(target, str):
        raise ConfigError(f"target must be a target name or 'auto', got {type(target).__name__}")
    targets.get(target)
    return target


def _own_target(target, a, b) -> bool:
    """Whether a named `target` is the one "auto" picks for the arrays (it
    changes nothing: the call may take the native launches of "auto" calls)."""
    try:
        return type(target) is str and _resolve_target("auto", a, b) == target
    except DispatcherError:  # arrays of no one target: the general path says what is wrong
        return False


# What each problem kind is called with.
_CALLS = {"gemm": "dispatcher.gemm", "grouped": "dispatcher.grouped_gemm"}


def _record(dispatcher, name):
    manager = dispatcher.manager if dispatcher is not None else get_manager()
    if not isinstance(name, str):
        raise ConfigError(f"variant must be a variant name, got {type(name).__name__}")
    return manager.variant(name)


_CHECKED: dict = {}  # (variant name, kind) -> (manager, generation, record) of the default manager


def _variant(dispatcher, name, kind: str):
    """The record of variant `name`, which must run `kind` problems: a
    grouped variant cannot run one GEMM, nor a single-GEMM variant a list.
    Remembered per manager generation for calls on the default manager."""
    if dispatcher is None:
        found = _CHECKED.get((name, kind))
        if found is not None and found[0] is plugins._MANAGER and found[1] == found[0].generation:
            return found[2]
    record = _record(dispatcher, name)
    if record.problem_kind == kind and dispatcher is None:
        manager = get_manager()
        _CHECKED[name, kind] = (manager, manager.generation, record)
    if record.problem_kind != kind:
        manager = dispatcher.manager if dispatcher is not None else get_manager()
        fitting = sorted(n for n, r in manager.variants().items() if r.problem_kind == kind)
        raise ConfigError(f"variant {name!r} runs {record.problem_kind} problems: call "
                          f"{_CALLS.get(record.problem_kind, 'dispatcher.run or dispatcher.matmul' if record.operands else 'its own entry point')}, or give "
                          f"{_CALLS[kind]} one of its variants: {', '.join(fitting) or '(none)'}")
    return record


def _autotuning(flag) -> bool:
    return autotune_default() if flag is None else bool(flag)


_DEFAULT_OPTIONS: dict = {}  # (id(record), stream) -> (record, its default launch options)


def _launch_options(record, options, stream: int) -> dict:
    """The call's launch options, checked before any build; the stream is
    the session's unless the caller set one."""
    if options is None:  # the common case, worked out once per record and stream
        found = _DEFAULT_OPTIONS.get((id(record), stream))
        if found is None or found[0] is not record:
            resolved = resolve_launch_options(record, None)
            resolved["stream"] = stream
            found = _DEFAULT_OPTIONS[id(record), stream] = (record, resolved)
        return found[1]
    resolved = resolve_launch_options(record, options)
    if "stream" not in options:
        resolved["stream"] = stream
    return resolved


def _session(record, arrays: dict, target: str):
    """(target name, session, {operand name: array in the target's memory})."""
    names = tuple(arrays)
    roles = kinds.role_names(record)
    check_arrays([(roles[r], arrays.get(roles[r])) for r in ("a", "b")],
                 [(n, x) for n, x in arrays.items() if n not in (roles["a"], roles["b"])])
    target = _resolve_target(target, *arrays.values())
    session = targets.get(target).session(*arrays.values())
    return target, session, dict(zip(names, session.arrays))


def _call(record, arrays: dict, params: dict, choices: dict, *, out_dtype, target, config, options,
          strict, autotune, dispatcher, remember=None):
    """Every declared kind's call: checks, the plan of its kind of call
    (made once), the launch; the result in the kind the caller passed.
    remember: (key, operand order) of a call that `_RUNNERS` may serve
    (the key holds everything the plan depends on): where the plan's
    runner can run such calls on the caller's own arrays, the next call
    of that key goes straight to it; (key, order, activation) for a plain
    call (`_native`) or another matmul call with no out (batched, a bias,
    an activation: `_native_matmul`), which a native module may learn too."""
    d = dispatcher or default_dispatcher()
    if options is not None:
        resolve_launch_options(record, options)  # a bad option is refused before anything else
    target, session, imported = _session(record, arrays, target)
    out_name = kinds.role_names(record).get("out")
    plans.check_writable(session.memory, imported.get(out_name), out_name)
    resolved = _launch_options(record, options, session.stream)
    core, values = kinds.scalars(record, params)
    if out_dtype is not None:
        out_dtype = dtypes.get(out_dtype).token  # a clear error for a bad one, and hashable
    plan = plans.planned(d, record, imported, kinds.check_choices(record, choices) if choices else (),
                         out_dtype, target, core[1] != 0, config, resolved, bool(strict),
                         _autotuning(autotune) if config is None else False)
    result = plan(imported, core, values, session.memory, session.empty, session.stream)
    if remember is not None and session.in_place:
        _remember(remember[0], plan, remember[1], core, dispatcher)
        if len(remember) > 2:  # native code may run the next ones
            _learn_native(remember[0], tuple(arrays[n] for n in remember[1]), plan, remember[1], core,
                          remember[2], new_plan=True)
    out = arrays.get(plan.names.get("out"))
    host_out = out if isinstance(out, np.ndarray) and imported.get(plan.names.get("out")) is not out else None
    return session.finish(result, host_out)


_RUNTIME = []  # the torch runtime, once asked for
_PLAIN_TENSORS = []  # torch.Tensor and torch.nn.Parameter, once a tensor is seen


def _plain_tensor_types() -> tuple:
    """The torch types `operands_key` takes: tensors and Parameters (an
    nn.Linear's bias), not subclasses that change what a call means."""
    if not _PLAIN_TENSORS:
        import torch
        _PLAIN_TENSORS.append((torch.Tensor, torch.nn.Parameter))
    return _PLAIN_TENSORS[0]


def _torch_stream(device: int):
    """The current stream of `device`, or None where `device` is not this
    thread's current device: the kernel would launch on another GPU, so the
    call takes the general path, whose session makes it current."""
    if not _RUNTIME:
        from .targets.cuda_runtime import runtime
        _RUNTIME.append(runtime("torch"))
    rt = _RUNTIME[0]
    return rt.current_stream(device) if rt.current_device() == device else None


def plan(variant: str = "regular", *, target: str = "auto", out_dtype=None, config=None, options=None,
         strict=False, autotune=None, dispatcher=None, **arguments) -> "HeldPlan":
    """Plan a kind of call once and hold it, for the lowest per-call cost:

        p = dispatcher.plan("regular", a=a, b=b)   # checks, selection, build: now
        c = p(a, b)                                # a call: bind and launch
        p(a2, b2, out=c)                           # arrays with the planned specs

    arguments: example operands (the arrays of a first call: their shapes,
    strides, dtypes and memory are what the plan is for; `out` and `c` too
    if calls will pass them), parameters and variant values, as for
    `dispatcher.run`. The other keywords as for `dispatcher.gemm`.
    """
    record = _record(dispatcher, variant)
    operands, params, choices = kinds.split_call(record, arguments)
    d = dispatcher or default_dispatcher()
    if options is not None:
        resolve_launch_options(record, options)
    target, session, imported = _session(record, operands, target)
    core, _ = kinds.scalars(record, params)
    if out_dtype is not None:
        out_dtype = dtypes.get(out_dtype).token
    made = plans.planned(d, record, imported, kinds.check_choices(record, choices) if choices else (),
                         out_dtype, target, core[1] != 0, config,
                         _launch_options(record, options, session.stream), bool(strict),
                         _autotuning(autotune) if config is None else False)
    held = HeldPlan(made, record, target, params, dispatcher)
    if made.problem is not None and session.in_place and "stream" not in (options or {}):
        # calls on arrays like these may go straight to the plan's runner
        held.order = tuple(n for n in held.names if operands.get(n) is not None)
        held.key = operands_key(*(operands[n] for n in held.order))
        held.scalars = core
    return held


class HeldPlan:
    """A plan held by the caller (`dispatcher.plan`): calling it runs the
    planned kind of call on new arrays, positional in the variant's
    declared operand order (a, b first) or by name, with new scalars.
    Calls (a, b) or (a, b, out=out) with the plan's specs run natively
    once the module of their kind is loaded (numpy arrays: `numpy_calls`;
    CUDA tensors: dispatcher.torch's)."""

    def __init__(self, made, record, target: str, params: dict, dispatcher=None):
        self.plan, self.record, self.target, self.dispatcher = made, record, targets.get(target), dispatcher
        self.names = tuple(o.name for o in kinds.operands_of(record))
        self.params = params
        self.beta_given = kinds.scalars(record, params)[0][1] != 0
        # (operand names, `operands_key`, core scalars) of the planned call, where its
        # runner may run calls with the same arrays' specs and no new scalars
        self.order = self.key = self.scalars = None
        # its native launch for positional calls (a, b) (`native_module.Launches.make`): None
        # until made, False where there is none
        self.native = None

    def __repr__(self):
        return f"HeldPlan({self.plan!r})"

    def runner(self):
        """The fewest steps a call of the plan can take: a function of
        arrays passed in `order`, with the planned shapes, strides, dtypes
        and memory, which it does not check (the caller knows them, e.g.
        by the `operands_key` it found this plan by), that binds them and
        runs the kernel; its result is of the kind its first array is (a
        numpy array, or a tensor on that tensor's device). None until a
        first call has bound the kernel, where calls cannot go straight to
        it (staged operands, a beta), or once a plugin registration
        changed what the hook chain would choose."""
        if self.order is None or not self.plan.current(self.dispatcher):
            return None
        return self.plan.runner(self.order, self.scalars)

    def _planned_arrays(self, operands: tuple, arguments: dict):
        """A call's arrays in `order` where it passes exactly the planned
        operands and nothing else, else None."""
        if not arguments and len(operands) == len(self.order) and self.order == self.names[:len(operands)]:
            return operands  # positional in the declared order: the commonest call, as it is
        if len(operands) > len(self.names):
            return None
        given = {**arguments, **dict(zip(self.names, operands))}
        arrays = [given.get(n) for n in self.order]
        return arrays if len(given) == len(arrays) else None

    def __call__(self, *operands, **arguments):
        native = self.native
        arrays = self._planned_arrays(operands, arguments) if self.key is not None else None
        if native and arrays is not None:
            result = native(*arrays)  # None: not arrays of the plan's key, or stale
            if result is not None:
                return result
        if arrays is not None and operands_key(*arrays) == self.key:
            runner = self.runner()
            if runner is not None:
                if (native is None or (native and not native.current)) \
                        and self.order[2:] in ((), (self.plan.names.get("out"),)):
                    self.native = _native_launch(self.key, tuple(arrays), self.plan, self.order, self.scalars,
                                                 None, self.dispatcher)[1]
                return runner(*arrays)
        if len(operands) > len(self.names):
            raise ProblemError(f"the plan takes at most {len(self.names)} operands "
                               f"({', '.join(self.names)}), got {len(operands)}")
        given, params, choices = kinds.split_call(self.record, arguments) if arguments else ({}, {}, {})
        if choices:
            raise ProblemError(f"a held plan's variant values are fixed; got {', '.join(choices)}: "
                               "make another plan")
        given.update(zip(self.names, operands))
        params = {**self.params, **params} if params else self.params
        session = self.target.session(*(given.get(n) for n in self.names))
        imported = {n: x for n, x in zip(self.names, session.arrays) if x is not None}
        out_name = self.plan.names.get("out")
        plans.check_writable(session.memory, imported.get(out_name), out_name)
        core, values = kinds.scalars(self.record, params)
        plan = self.plan
        if not plan.matches(imported) or (core[1] != 0) != self.beta_given \
                or plan.options.get("stream", 0) != session.stream:
            raise ProblemError(f"these arrays do not match the plan ({_described(plan.specs)}), or "
                               "beta or the stream changed; make a new plan (dispatcher.plan) for them")
        result = plan(imported, core, values, session.memory, session.empty, session.stream)
        out = given.get(plan.names.get("out"))
        host_out = out if isinstance(out, np.ndarray) and imported.get(plan.names.get("out")) is not out else None
        return session.finish(result, host_out)


def _described(specs: tuple) -> str:
    return "; ".join(f"{name}: {spec.shape} {np.dtype(spec.dtype).name} strides {spec.strides}"
                     for name, spec in specs if spec is not None)


def gemm(a, b, *, c=None, alpha=1.0, beta=0.0, out_dtype=None, out=None, variant="regular",
         target="auto", config=None, strict=False, autotune=None, options=None, dispatcher=None):
    """alpha * a @ b + beta * c, on the selected (or given) kernel.

    a, b: 2-D arrays of one input dtype, row- or column-major (views are read
    in place). On the cuda target: torch CUDA tensors or CUDA arrays (used in
    place, on the caller's current stream) or numpy arrays (copied to the
    device and back). c: the matrix beta scales (needed when beta != 0,
    unless out holds it). out: write the result here (any layout); else a
    new row-major array of the inputs' kind is returned. out_dtype: defaults
    to CK's rule (fp8 -> fp16, int8 -> int32). target: "auto" (the default:
    the target whose memory holds the arrays), "cpu" or "cuda" (numpy
    arrays are copied to the device and back). config: a KernelConfig or a
    dict of config fields; None selects one. strict: if the kernel cannot
    run the problem (status -2), raise `UnsupportedProblem` instead of
    falling back to the variant's fallback. autotune: the first time a
    problem is seen (no exact tuning-database entry), build and time the
    top ranked kernels and keep the fastest (`Dispatcher.autotune`); None:
    `$DISPATCHER_AUTOTUNE`.
    """
    defaults = (c is None and type(alpha) is float and alpha == 1.0 and type(beta) is float and beta == 0.0
                and out_dtype is None and variant == "regular" and config is None and strict is False
                and autotune is None and options is None and dispatcher is None
                and (target == "auto" or _own_target(target, a, b)))
    plain = defaults and out is None
    if defaults:  # the commonest calls, which native code may run
        result = _native(a, b) if out is None else _native_into(a, b, out)
        if result is not None:
            return result
    if plain:  # its key is its operands' (shared with matmul(a, b))
        key = operands_key(a, b)
    elif c is None and config is None and options is None and type(alpha) is float and type(beta) is float \
            and beta == 0.0:  # a call whose other arguments only decide its plan: they are in its key
        key = operands_key(a, b) if out is None else operands_key(a, b, out)
        if key is not None:
            key = ("gemm", exact_key(alpha), out_dtype, variant, target, strict, autotune, id(dispatcher), key)
    else:
        key = None
    if key is not None and not a.ndim == b.ndim == 2:  # matmul's batched pairs are not gemm's
        key = None
    try:
        runner = _runner(key)
    except TypeError:  # an unhashable argument: the general path says what is wrong with it
        runner = key = None
    if runner is not None:
        if defaults and _NATIVE_MISSES.get(key, 0) >= 0:  # the native module missed it
            _learn_native(key, (a, b) if out is None else (a, b, out), *_RUNNERS[key][:3], None)
        return runner(a, b) if out is None else runner(a, b, out)
    record = _variant(dispatcher, variant, "gemm")
    roles = kinds.role_names(record)
    arrays = {roles["a"]: a, roles["b"]: b}
    if c is not None:
        arrays[roles["c"]] = c
    if out is not None:
        arrays[roles["out"]] = out
    return _call(record, arrays, {"alpha": alpha, "beta": beta}, {}, out_dtype=out_dtype, target=target,
                 config=config, options=options, strict=strict, autotune=autotune, dispatcher=dispatcher,
                 remember=None if key is None else (key, tuple(arrays)) + ((None,) if defaults else ()))


# Calls whose plan a key read straight off the call decides: `gemm` and
# `matmul` with every default (sharing the key of (a, b): both run the
# regular variant on 2-D operands with the same plan; matmul's batched
# ones have more dims, which gemm refuses), `gemm` with an out, target,
# dispatcher, alpha, out_dtype, strict or autotune (all in its key),
# `matmul` with a bias, an activation or an out, `run` with only operands,
# variant values and float scalars (see `operands_key`). Each key maps to
# (plan, operand order, core scalars, the dispatcher given or None), and
# the plan's runner for that order and those scalars runs the call, so
# that such a call costs a key, a lookup and the runner.
_RUNNERS: dict = {}
RUNNERS_KEPT = 4096  # entries before the memo starts again (each keeps its plan and dispatcher alive)


def _remember(key, plan, order: tuple, scalars: tuple, dispatcher):
    """After a call of `key` went the general way on the caller's own
    arrays: its plan's runner serves the next ones, where the plan has one."""
    if plan.runner(order, scalars) is not None:
        if len(_RUNNERS) >= RUNNERS_KEPT:  # many shapes or dispatchers: start again rather than keep them all
            _RUNNERS.clear()
        _RUNNERS[key] = (plan, order, scalars, dispatcher)


def _native(a, b):
    """The result of a plain call (a @ b, every default) that a native
    module ran (`native_module.PRODUCTS`: numpy arrays in C, CUDA tensors
    in C++), else None."""
    for product in native_module.PRODUCTS:
        result = product(a, b)
        if result is not None:
            return result
    return None


def _native_into(a, b, out):
    """`out` after a native module wrote a @ b into it (`native_module.INTO`:
    numpy arrays in C), else None."""
    for product in native_module.INTO:
        result = product(a, b, out)
        if result is not None:
            return result
    return None


# native-eligible key -> 1 + the Python way's calls of it since its launch was learned (absent: never
# learned; -1: it has no native launch)
_NATIVE_MISSES: dict = {}


def _native_matmul(a, b, bias, activation):
    """The result of matmul's call with every default but a bias and an
    activation (None each for a batched plain call) that a native module
    ran (`native_module.MATMULS`: CUDA tensors in C++), else None."""
    for product in native_module.MATMULS:
        result = product(a, b, bias, activation)
        if result is not None:
            return result
    return None


def _learn_native(key, arrays: tuple, plan, order: tuple, scalars: tuple, activation, new_plan=False):
    """After the Python way ran a plain call of `key` on `arrays` (a, b),
    or matmul's call (batched, or with a bias: a, b, bias, and `activation`): the module
    of their kind learns its plan's launch, so that it runs the next ones.
    new_plan: the call made the plan; else it came from `_RUNNERS`, because
    the module was still loading (asked again on every call: a cheap no),
    or because the launch it learned was pushed out of a full table since
    (learned again at doubling intervals, so kinds that keep pushing each
    other out do not each cost a new launch per call)."""
    seen = 0 if new_plan else _NATIVE_MISSES.get(key, 0)  # callers skip kinds known to have none (-1)
    if seen > 0:
        seen = _NATIVE_MISSES[key] = seen + 1
        if seen & (seen - 1):
            return
    kind, launch = _native_launch(key, arrays, plan, order, scalars, activation)
    if launch is not None and len(_NATIVE_MISSES) >= RUNNERS_KEPT:  # many kinds: start again
        _NATIVE_MISSES.clear()
    if launch:
        kind.learn(launch)
        _NATIVE_MISSES[key] = max(seen, 1)
    elif launch is False:
        _NATIVE_MISSES[key] = -1


plugins.on_change(_NATIVE_MISSES.clear)


def _native_launch(key, arrays: tuple, plan, order: tuple, scalars: tuple, activation, dispatcher=None):
    """(the native kind of the arrays, the plan's launch in it for calls on
    arrays like `arrays` of `key` with `activation`): the launch None while
    its module is loading, or where a registration made it stale while it
    was made; False where there is none."""
    kind = native_module.kind_of(arrays[0])
    if kind is None:
        return None, False
    launch = kind.make(key, arrays, plan, order, scalars, activation)
    return kind, launch if not launch or plan.current(dispatcher) else None


def exact_key(x: float):
    """A float as a part of a key: -0.0 apart from 0.0 (equal as keys, not as
    alphas: the sign of zero results), and NaN equal to NaN."""
    return x if x and x == x else repr(x)


def _runner(key):
    """The runner of the calls of `key` (None: none yet, or its plan no
    longer binds what the hook chain would choose)."""
    found = _RUNNERS.get(key) if key is not None else None
    if found is None or not found[0].current(found[3]):
        return None
    return found[0].runner(found[1], found[2])


def operands_key(*arrays):
    """What a plain call's plan depends on, read straight off its operands,
    all numpy arrays, all torch CPU tensors or all torch CUDA tensors of one
    device (shapes, strides, dtypes; for CUDA tensors the device, the
    current stream and each address's alignment class); None for anything
    else. (The cpu target takes numpy arrays: CPU tensors have keys for
    `dispatcher.torch`, which runs their plans on numpy views of them.)"""
    kind = type(arrays[0])
    if kind is np.ndarray:
        if len(arrays) == 2:  # gemm(a, b) and matmul(a, b): the commonest, spelled out
            a, b = arrays
            return ((a.shape, a.strides, a.dtype), (b.shape, b.strides, b.dtype)) if type(b) is np.ndarray else None
        for x in arrays:
            if type(x) is not np.ndarray:
                return None
        return tuple([(x.shape, x.strides, x.dtype) for x in arrays])
    if not kind.__module__.startswith("torch"):
        return None
    plain = _plain_tensor_types()
    first = arrays[0]
    if kind not in plain:
        return None
    if first.is_cpu:
        key = ["cpu"]
        for x in arrays:
            if type(x) not in plain or not x.is_cpu or x.is_neg() or x._is_zerotensor():  # memory is not values
                return None
            key.append((x.shape, x.stride(), x.dtype))
        return tuple(key)
    if not first.is_cuda:
        return None
    device = first.get_device()
    stream = _torch_stream(device)
    if stream is None:
        return None
    key = [device, stream]  # one pass, no generator: this runs on every call
    for x in arrays:
        if type(x) not in plain or not x.is_cuda or x.get_device() != device or x.is_neg() or x._is_zerotensor():
            return None
        key.append((x.shape, x.stride(), x.dtype, x.data_ptr() % plans.ALIGNMENT == 0))
    return tuple(key)


def run(variant: str, *, target: str = "auto", out_dtype=None, config=None, options=None, strict=False,
        autotune=None, dispatcher=None, **arguments):
    """Run `variant` on its declared operands and parameters, e.g.
    `run("batched", a=a, b=b, bias=bias, activation="gelu")`; returns the
    output (`out` if given).

    arguments: the variant's operands (arrays, by the names it declares:
    a, b, c, out and its extra operands by default), its scalar parameters
    and the core's (`alpha`, `beta`, and the per-tensor input scales
    `scale_a`, `scale_b` of fp8), and values of its variant block that the
    call fixes (e.g. `activation`). target, config, options, out_dtype,
    strict and autotune as for `dispatcher.gemm`.
    """
    remember = None
    if target == "auto" and out_dtype is None and config is None and options is None and strict is False \
            and autotune is None and dispatcher is None:
        found = _plain_run_key(variant, arguments)
        try:
            runner = _runner(found and found[0])
        except TypeError:  # an unhashable value: the general path says what is wrong with it
            runner = found = None
        if runner is not None:
            return runner(*found[2])
        remember = found and found[:2]
    return _run(variant, arguments, target=target, out_dtype=out_dtype, config=config, options=options,
                strict=strict, autotune=autotune, dispatcher=dispatcher, remember=remember)


def _run(variant: str, arguments: dict, *, target, out_dtype, config, options, strict, autotune, dispatcher,
         remember=None):
    """`run`'s general path (remember: as for `_call`)."""
    record = _record(dispatcher, variant)
    if not record.operands and record.problem_kind != "gemm":
        raise ConfigError(f"variant {variant!r} declares no operands ({record.problem_kind} problems): "
                          "call dispatcher.grouped_gemm or dispatcher.grouped_mm")
    operands, params, choices = kinds.split_call(record, arguments)
    return _call(record, operands, params, choices, out_dtype=out_dtype, target=target, config=config,
                 options=options, strict=strict, autotune=autotune, dispatcher=dispatcher, remember=remember)


def _plain_run_key(variant: str, arguments: dict):
    """(key, operand order, the operands in that order) of a plain `run` call: one whose arguments are
    arrays, strings (variant values), floats (scalars) and None (in the key
    by name: a value the general path refuses, say `alpha=None`, is never
    remembered); None for any other."""
    if type(variant) is not str:
        return None
    order, values, arrays = [], [], []
    for name, x in arguments.items():
        kind = type(x)
        if kind is str or x is None:
            values.append((name, x))
        elif kind is float:
            values.append((name, exact_key(x)))
        else:
            order.append(name)
            arrays.append(x)
    if not order:
        return None
    key = operands_key(*arrays)
    order = tuple(order)
    return None if key is None else (("run", variant, order, tuple(values), key), order, arrays)


def matmul(a, b, *, out=None, out_dtype=None, bias=None, activation=None, alpha=1.0,
           scale_a=1.0, scale_b=1.0, variant=None, target="auto", config=None, options=None,
           dispatcher=None):
    """act(alpha * scale_a * scale_b * (a @ b) + bias) with numpy's `matmul`
    semantics: 2-D operands run on `regular`, operands with batch dims on
    `batched` (batch dims broadcast, any strides), a 1-D operand is a
    vector (numpy arrays). bias: broadcastable to the result's matrices,
    one value per output column (N,) or per row (M, 1), optionally with
    batch dims; stored in the output dtype. activation: relu, gelu or silu.
    """
    defaults = (type(alpha) is float and alpha == 1.0 and type(scale_a) is float and scale_a == 1.0
                and type(scale_b) is float and scale_b == 1.0 and out_dtype is None and variant is None
                and config is None and options is None and dispatcher is None
                and (target == "auto" or _own_target(target, a, b)))
    key = order = None  # every argument but bias, activation and out at its default: a key of its own
    if defaults and out is None:
        result = _native(a, b) if bias is None and activation is None else None  # the plain call: gemm(a, b)'s
        if result is None:  # batched, or with a bias or an activation
            result = _native_matmul(a, b, bias, activation)
        if result is not None:
            return result
    elif defaults and bias is None and activation is None:
        result = _native_into(a, b, out)
        if result is not None:
            return result
    if defaults and (activation is None or type(activation) is str):
        extra = (() if bias is None else (bias,)) + (() if out is None else (out,))  # the arrays after a, b
        order = ("a", "b") + (() if bias is None else ("bias",)) + (() if out is None else ("out",))
        key = operands_key(a, b, *extra)
        if key is not None and len(order) + (activation is not None) > 2:  # else the plain call: gemm(a, b)'s key
            key = ("matmul", activation, order, key)
        if key is not None and (a.ndim < 2 or b.ndim < 2):  # a vector: the general path squeezes it
            key = None
    runner = _runner(key)
    native = key is not None and (out is None or (bias is None and activation is None))  # not both out and bias
    if runner is not None:
        if native and _NATIVE_MISSES.get(key, 0) >= 0:  # the native module missed it
            _learn_native(key, (a, b, *extra), *_RUNNERS[key][:3], activation)
        return runner(a, b, *extra)
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
    result = _run(variant, {"a": a, "b": b, "out": out, "alpha": alpha, **extra}, target=target,
                  out_dtype=out_dtype, config=config, options=options, strict=False, autotune=None,
                  dispatcher=dispatcher,
                  remember=None if key is None else (key, order) + ((activation,) if native else ()))
    return result.squeeze(tuple(squeeze)) if squeeze else result


def _numpy_only(x, name: str):
    if not isinstance(x, np.ndarray):
        raise ProblemError(f"{name} is 1-D: vectors are supported for numpy arrays; reshape it to 2-D")
    return x


def grouped_gemm(list_a, list_b, *, out_dtype=None, alpha=1.0, target="auto", config=None,
                 variant="grouped", options=None, dispatcher=None):
    """[alpha * a_g @ b_g for each g] in one launch; returns a list of arrays.

    Groups may differ in M, N and K (M_g = 0 is fine); they share one dtype
    and one layout. Arrays as for `gemm`.
    """
    list_a, list_b = operand_list(list_a, "list_a"), operand_list(list_b, "list_b")
    check_arrays([*((f"a[{g}]", x) for g, x in enumerate(list_a)),
                  *((f"b[{g}]", x) for g, x in enumerate(list_b))])
    record = _variant(dispatcher, variant, "grouped")
    if options is not None:
        resolve_launch_options(record, options)
    target = _resolve_target(target, *list_a, *list_b)
    session = targets.get(target).session(*list_a, *list_b)
    arrays = session.arrays
    if out_dtype is not None:
        out_dtype = dtypes.get(out_dtype).token
    layout = grouped_layout(tuple(map(ArraySpec.of, arrays[:len(list_a)])),
                            tuple(map(ArraySpec.of, arrays[len(list_a):])), out_dtype, variant, target)
    operands, results = grouped_operands(layout, arrays[:len(list_a)], arrays[len(list_a):], alpha,
                                         session.memory, session.empty)
    if any(m * n for m, n, _ in layout.problem.groups):  # else every result is empty
        d = dispatcher or default_dispatcher()
        plans.planned_grouped(d, layout, config, _launch_options(record, options, session.stream)).launch(operands)
    return [session.finish(r) for r in results]


def grouped_mm(a, b, offsets, *, out_dtype=None, alpha=1.0, target="auto", config=None,
               variant="grouped", autotune=None, options=None, dispatcher=None):
    """The mixture-of-experts form of a grouped GEMM, in `torch._grouped_mm`'s
    argument order: rows [offsets[g-1], offsets[g]) of the stacked `a`
    (total_M, K) times `b[g]` (b is (G, K, N), row- or column-major per
    group), into one new (total_M, N) row-major result; rows past
    offsets[-1] are zero. `offsets`: (G,) int32 cumulative row ends on the
    same device as `a` (groups with no rows are fine).

    No per-group Python work and, on the cuda target, no host
    synchronisation: the kernel derives each group's size and pointers from
    `offsets` on the device, so a call can be captured in a CUDA graph and
    replayed with new offsets. Selection and tuning key on (G, N, K, the
    token count rounded up to a power of two), not on the routing, and so
    does `autotune` (as for `gemm`).
    """
    key = None
    if config is None and options is None and type(alpha) is float:  # the other arguments only decide its plan
        key = operands_key(a, b, offsets)
        if key is not None:
            key = ("grouped_mm", variant, out_dtype, exact_key(alpha), target, autotune, id(dispatcher), key)
    try:
        runner = _runner(key)
    except TypeError:  # an unhashable argument: the general path says what is wrong with it
        runner = key = None
    if runner is not None:
        return runner(a, b, offsets)
    check_arrays([("a", a), ("b", b), ("offsets", offsets)])
    record = _variant(dispatcher, variant, "grouped")
    if options is not None:
        resolve_launch_options(record, options)
    target = _resolve_target(target, a, b, offsets)
    session = targets.get(target).session(a, b, offsets)
    a_, b_, offsets_ = session.arrays
    if out_dtype is not None:
        out_dtype = dtypes.get(out_dtype).token
    layout = stacked_layout(ArraySpec.of(a_), ArraySpec.of(b_), ArraySpec.of(offsets_), out_dtype, variant,
                            target)
    operands, result = stacked_operands(layout, a_, b_, offsets_, alpha, session.empty)
    if result.size:
        if layout.problem.k == 0 or layout.problem.group_count == 0:  # an empty product, or no group owns a row
            session.memory.zero(result, result.size * result.itemsize, session.stream)
        else:
            d = dispatcher or default_dispatcher()
            plan = plans.planned_grouped(d, layout, config, _launch_options(record, options, session.stream),
                                         _autotuning(autotune) if config is None else False)
            plan.launch(operands)
            if key is not None and session.in_place:
                _remember(key, plan, ("a", "b", "offsets"), (operands.alpha,), dispatcher)
    return session.finish(result)
