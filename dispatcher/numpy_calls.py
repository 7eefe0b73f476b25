"""Plain `gemm(a, b)` and `matmul(a, b)` calls on numpy arrays, in C
(numpy_calls.c).

A warm plain call through Python costs its key, its plan's lookup and its
argument block: a few microseconds, more than a small product's kernel.
Once the Python way has bound a plain call's plan (`api._learn_native`),
its launch (`Plan.native_launch`) becomes a C `Launch`, which the module's
`call(a, b)` runs for later calls with the same shapes, strides and dtypes
(and a held plan calls directly); calls with an output given, too
(`call(a, b, out)`: a row-major or any other layout the plan writes in
place);
what it has no launch for goes the Python way, which is the same kernels
and rules. A plugin registration makes it forget every launch.

The module is one of the dispatcher's native modules (`native_module`):
loaded from the build cache on a process's first plain call, or built
there then (about a second with gcc, beside the seconds that call's
kernel takes to build) where it is not.
`DISPATCHER_NO_NATIVE_CALLS=1` keeps every call in Python.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import native_module, plugins
from .build import GeneratedSource
from .native_module import ExtensionToolchain, ModuleBuild, NativeModule

NAME = "dispatcher_numpy_calls"
SOURCE = Path(__file__).with_name("numpy_calls.c")


def source():
    """The module's source and toolchain (`native_module.build`)."""
    against = f"numpy {np.__version__}"
    toolchain = ExtensionToolchain.find("CC", ("gcc", "cc", "clang"), "C extension of dispatcher's plain numpy calls",
                                        against, (f"-I{np.get_include()}",))
    return GeneratedSource(ModuleBuild(NAME, against), ((f"{NAME}.c", SOURCE.read_text()),)), toolchain


def _loaded(module):
    """Once loaded: the core's plain calls try the module first."""
    native_module.PRODUCTS.insert(0, module.call)
    native_module.INTO.insert(0, module.call)


_MODULE = NativeModule(NAME, f"{__name__}:source", on_load=_loaded, build_now=True)


extension = _MODULE.get  # the loaded module, or None (`NativeModule.get`; wait=True waits for it)
failure = _MODULE.failure  # why there is no module, once that is known


def launch(key, arrays: tuple, plan, order: tuple, scalars: tuple, activation):
    """The C launch of a plan's plain calls on numpy arrays like `arrays`
    (a, b, and the output where one is given), in `order` with `scalars`
    (`native_module.Launches.make`; the C key is the arrays' own, whatever
    the caller's `key`); False for calls with a bias or an activation,
    batched ones and those whose kernel needs scratch memory, which stay on
    the Python way."""
    if activation is not None or len(arrays) not in (2, 3):
        return False
    specs = tuple((x.shape, x.strides, x.dtype) for x in arrays)

    def make(module, found):
        if found.batch or found.extra or found.workspace or len(arrays) != 2 + found.out or \
                (found.out and arrays[-1].dtype is not np.dtype(found.dtype)):  # an equal dtype of another object
            return False
        return module.Launch(specs, found.entry, found.block, found.rows, found.cols, np.dtype(found.dtype),
                             found.check)
    return _MODULE.launch(plan, order, scalars, make)


def learn(launch):
    """`call(a, b)` runs the calls of the launch's key with it."""
    _MODULE.module.learn(launch)


def _forget():
    """A plugin registration: what selection chooses may have changed."""
    if _MODULE.module is not None:
        _MODULE.module.clear()


native_module.KINDS[np.ndarray] = native_module.Launches(launch, learn)
plugins.on_change(_forget)
