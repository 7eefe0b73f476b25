"""Plain `gemm(a, b)` and `matmul(a, b)` calls on numpy arrays, in C
(numpy_calls.c).

A warm plain call through Python costs its key, its plan's lookup and its
argument block: a few microseconds, more than a small product's kernel.
Once the Python way has bound a plain call's plan (`api._remember`),
`learn` hands its launch (`Plan.native_launch`) to the C module, whose
`call(a, b)` runs later calls with the same shapes, strides and dtypes;
what it has no launch for goes the Python way, which is the same kernels
and rules. A plugin registration makes it forget every launch.

The module is one of the dispatcher's native modules (`native_module`):
built from source into the build cache in the background on a process's
first plain call (about a second with gcc), loaded when built; calls go the
Python way meanwhile, and the launches learned meanwhile are handed over
on load. `DISPATCHER_NO_NATIVE_CALLS=1` keeps every call in Python.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import plugins
from .build import GeneratedSource
from .native_module import ExtensionToolchain, ModuleBuild, NativeModule

NAME = "dispatcher_numpy_calls"
SOURCE = Path(__file__).with_name("numpy_calls.c")
PENDING_KEPT = 256  # launches learned before the module loads, kept to hand over


def source():
    """The module's source and toolchain (`native_module.build`)."""
    against = f"numpy {np.__version__}"
    toolchain = ExtensionToolchain.find("CC", ("gcc", "cc", "clang"), "C extension of dispatcher's plain numpy calls",
                                        against, (f"-I{np.get_include()}",))
    return GeneratedSource(ModuleBuild(NAME, against), ((f"{NAME}.c", SOURCE.read_text()),)), toolchain


CALLS = None  # the loaded module, whose `call(a, b)` the api's plain calls try first
_PENDING: list = []  # (key, plan, order, scalars) learned while the module was not loaded


def _loaded(module):
    """In the loading thread: hand the pending launches over, then let calls in."""
    global CALLS
    while _PENDING:
        key, plan, order, scalars = _PENDING.pop()
        if plan.current():  # else a plugin registration came between
            _learn(module, key, plan, order, scalars)
    CALLS = module


_MODULE = NativeModule(NAME, f"{__name__}:source", on_load=_loaded)


def extension(wait: bool = False):
    """The loaded module, or None: not loaded yet (the first ask starts its
    build; `wait=True` waits for it), switched off, or it failed to build
    or load (`failure()` says why)."""
    return _MODULE.get(wait)


def failure() -> str | None:
    """Why there is no module, once that is known (None: loaded, or not yet known)."""
    return _MODULE.failure


def launch(key, plan, order: tuple, scalars: tuple):
    """The C launch of a plan's calls on numpy arrays of `key`
    (`api.operands_key(a, b)`) in `order` with `scalars`: callable as
    launch(a, b), which returns None for arrays of another key, or once a
    plugin registration made it stale. None while the module is not
    loaded (the first ask starts its build); False where it will not be:
    the module cannot load, or the plan's launch is not one C makes."""
    module = _MODULE.get()
    if module is None:
        return None if _MODULE.failure is None else False
    return _launch(module, key, plan, order, scalars) or False


def _launch(module, key, plan, order, scalars):
    found = plan.native_launch(order, scalars)
    if found is None or found.extra:
        return None
    return module.Launch(key, found.entry, found.block, found.rows, found.cols, np.dtype(found.dtype), found.check)


def learn(key, plan, order: tuple, scalars: tuple):
    """After the Python way ran a plain call on numpy arrays whose runner
    it memoized under `key` (`api.operands_key(a, b)`): its later calls run
    in C, where the plan's launch is one C can make."""
    module = _MODULE.get()
    if module is not None:
        _learn(module, key, plan, order, scalars)
    elif _MODULE.failure is None:
        if len(_PENDING) >= PENDING_KEPT:
            del _PENDING[0]
        _PENDING.append((key, plan, order, scalars))


def _learn(module, key, plan, order, scalars):
    found = _launch(module, key, plan, order, scalars)
    if found is not None:
        module.learn(found)


def _forget():
    """A plugin registration: what selection chooses may have changed."""
    _PENDING.clear()
    if _MODULE.module is not None:
        _MODULE.module.clear()


plugins.on_change(_forget)
