"""Python extension modules of the dispatcher's own, for the calls whose
Python steps cost more than their kernels: `numpy_calls` (plain `gemm(a, b)`
/ `matmul(a, b)` and held plans on numpy arrays) and `dispatcher.torch.native`
(the same on CUDA tensors, its `Product`s, and Linear's calls). What the
core's plain calls ask of them is here too: `PRODUCTS`, `MATMULS`, `INTO`, `KINDS`,
`kind_of`.

Each is compiled from source into the build cache (`BuildCache`: keyed by
its source, compiler and what it is built against). The first time a
process asks for it, it is loaded right away where the cache holds it,
or built right away where it compiles in a second (`build_now`); else a
child process builds it, which a background thread waits for, and until
it is loaded, calls go the Python way, which runs the same kernels.
The child runs in a session of its own, so a process that exits while it
compiles leaves it to finish and publish the module for the next one.
Set `DISPATCHER_NO_NATIVE_CALLS=1` to keep every call in Python.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
from importlib import metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import warnings

import attrs

from . import environ
from .build import BuildCache
from .errors import BuildError, CacheError, ConfigError, ToolchainError
from .library import GemmArgs
from .targets.toolchain import NATIVE_DIR, CompilerMixin, headers_hash

SWITCH = "DISPATCHER_NO_NATIVE_CALLS"

# What the loaded modules offer the core's plain calls (`gemm(a, b)`,
# `matmul(a, b)` with every default): callables (a, b) -> a @ b, or None for
# arrays they have no launch for, tried in order before the Python way.
PRODUCTS: list = []
# The same for `matmul`'s calls with every default but a bias and an
# activation, batched (3-D) ones too: callables (a, b, bias or None,
# activation name or None) -> act(a @ b + bias), or None; tried where
# `PRODUCTS` (matrices, no bias or activation) have nothing.
MATMULS: list = []
# The same for `gemm(a, b, out=out)` and `matmul(a, b, out=out)` with every
# other argument at its default: callables (a, b, out) -> out, or None.
INTO: list = []


@attrs.frozen
class Launches:
    """How one kind of array's calls run natively, registered by the Python
    side of the module that runs them (`KINDS`)."""
    # (key, arrays, plan, order, scalars, activation) -> the plan's launch of
    # calls on arrays like `arrays` (a, b and the bias, if any, in `order`)
    # with that activation (None or its name): a plain one (a and b, no
    # activation) callable as launch(a, b), which returns None for arrays of
    # another key or once a plugin registration made it stale; None while
    # the module is not loaded; False where there will be none
    make: object
    # (launch) -> None: the module's table of calls (its `PRODUCTS` and
    # `MATMULS` entries) runs the calls of the launch's key with it
    learn: object


KINDS: dict = {}  # array type -> its Launches
# Where the kinds of an array library's arrays come from: the entry points
# of this group, each named after the library's top-level package (torch:
# dispatcher.torch.native, in pyproject.toml), loaded the first time the
# core sees that library's arrays, as plugins are; the core imports none
# of them itself.
ENTRY_POINT_GROUP = "dispatcher.native_calls"
_LOADED_PROVIDERS: set = set()  # the packages whose entry point was looked up
_PROVIDERS_LOCK = threading.Lock()


def kind_of(a) -> Launches | None:
    """How calls on arrays of a's type run natively, or None."""
    kind = KINDS.get(type(a))
    if kind is None:
        package = type(a).__module__.partition(".")[0]
        with _PROVIDERS_LOCK:  # one thread loads a provider; the others wait for it
            if package not in _LOADED_PROVIDERS:
                _LOADED_PROVIDERS.add(package)
                for found in metadata.entry_points(group=ENTRY_POINT_GROUP, name=package):
                    try:
                        found.load()  # it registers its kinds
                    except ImportError:
                        pass
        kind = KINDS.get(type(a))
    return kind


@attrs.frozen
class ModuleBuild:
    """The build cache's "config" of a module: its name and the versions it
    is built against (Python's ABI is in the toolchain's identity)."""
    name: str
    against: str

    def to_dict(self) -> dict:
        return {"name": self.name, "against": self.against}


@attrs.frozen
class ExtensionToolchain(CompilerMixin):
    """A compiler building a Python extension module: Python's headers and
    the kernels' ABI header, plus what the module is built against
    (`extra`: its include folders, libraries and definitions)."""
    compiler: str
    flags: tuple
    identity: str
    label: str

    @classmethod
    def find(cls, variable: str, names: tuple, label: str, against: str, extra=()) -> "ExtensionToolchain":
        """The compiler $`variable` names, else the first of `names` found;
        `against`: the versions the module is built against, for the key."""
        compiler = next(filter(None, (shutil.which(n) for n in (os.environ.get(variable), *names) if n)), None)
        if not compiler:
            raise ToolchainError(f"no compiler for the {label} (install {names[0]} or set ${variable})")
        flags = ("-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-w", f"-I{NATIVE_DIR}",
                 f"-I{sysconfig.get_paths()['include']}", *extra)
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
        identity = f"{' '.join(version)} | {against} | python {sys.version_info[:2]} | headers:{headers_hash()}"
        return cls(compiler, flags, identity, label)

    @property
    def cache_flags(self) -> tuple:
        """The flags that change the binary: not where headers and libraries are."""
        return tuple(f for f in self.flags if not f.startswith(("-I", "-L", "-Wl,-rpath")))


class NativeModule:
    """One module, imported once per process: from the build cache, or
    built in the background (module docstring). `builder` names a
    function, "package.module:name", that returns the module's (GeneratedSource, toolchain): the child
    process calls it and builds. The module must export `ARGS_BYTES`, the
    size of the argument block it was compiled with. A process forked while
    the build runs starts over in the child (the thread is not forked).
    `on_load(module)` runs once the module is imported, before anyone can
    see it (an exception there counts as a failure to load). `build_now`: a module
    that compiles in about a second is built in the asking thread, as a
    call's kernel is, where the cache lacks it, so that even the first
    process runs its calls natively from the start."""

    def __init__(self, name: str, builder: str, on_load=None, build_now: bool = False):
        self.name, self.builder, self.on_load, self.build_now = name, builder, on_load, build_now
        self._reset()
        os.register_at_fork(after_in_child=self._forked)

    def _reset(self):
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = None
        self.module = None
        self.why_not = None  # why there is no module, once that is known

    def get(self, wait: bool = False):
        """The loaded module, or None: not loaded yet (the first ask starts
        its build; `wait=True` waits for it), switched off, or it failed to
        build or load (`failure()` says why)."""
        if self.module is not None or self.why_not is not None:
            return self.module
        with self.lock:
            if self.thread is None:
                try:
                    self.why_not = f"{SWITCH} is set" if environ.flag(SWITCH) else None
                except ConfigError as e:  # the calls are right either way: keep them in Python, and say so
                    self.why_not = f"{e}; native calls stay off"
                    warnings.warn(self.why_not, stacklevel=3)
                if self.why_not is None:
                    self._load_built()
                if self.module is not None or self.why_not is not None:
                    self.done.set()
                    return self.module
                self.thread = threading.Thread(target=self._build_and_load, name=f"{self.name} build",
                                               daemon=True)
                self.thread.start()
        if wait:
            self.done.wait()
        return self.module

    def launch(self, plan, order: tuple, scalars: tuple, make):
        """A plan's product launch in this module (`Launches.make`):
        `make(module, found)` with its `Plan.native_launch`; None while the
        module is not loaded (asking starts its build); False where there
        will be none (the module cannot load, or the plan has no native
        launch: scratch sized per call, an output given where it cannot
        go)."""
        module = self.get()
        if module is None:
            return None if self.why_not is None else False
        found = plan.native_launch(order, scalars)
        return False if found is None else make(module, found)

    def failure(self) -> str | None:
        """Why there is no module, once that is known (None: loaded, or not yet known)."""
        return self.why_not

    def _forked(self):
        if self.module is None:
            self._reset()

    def _load_built(self):
        """Load the module here and now where the build cache already holds
        it (every process after the one that built it: a lookup, not a child
        process, so the first calls already run natively), or, with
        `build_now`, where this thread builds it."""
        try:
            source, toolchain = _sources(self.builder)
            cache = BuildCache()
            found = cache.build(source, toolchain) if self.build_now else \
                cache.lookup(cache.key(source, toolchain), source.name)
        except (ToolchainError, BuildError) as e:  # no compiler, or it failed: the calls stay in Python
            self.why_not = f"{type(e).__name__}: {e}"
            return
        except CacheError:  # a damaged entry: the background build sets it aside and builds again
            return
        if found is not None:
            self._load(found.path)

    def _build_and_load(self):
        try:
            # bounded: the compiler has its own limit (CompilerMixin.timeout_s), this covers the rest
            child = subprocess.run([sys.executable, "-c", f"from {__name__} import build; build({self.builder!r})"],
                                   capture_output=True, text=True, start_new_session=True,
                                   timeout=CompilerMixin.timeout_s + 300)
            if child.returncode != 0:
                lines = (child.stderr.strip() or f"exit status {child.returncode}").splitlines()
                raise RuntimeError(lines[-1])
        except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, and says why
            self.why_not = f"{type(e).__name__}: {e}"
        else:
            self._load(child.stdout.strip().splitlines()[-1])
        finally:
            self.done.set()

    def _load(self, path):
        """Import the module built at `path`; a failure says why."""
        try:
            spec = importlib.util.spec_from_file_location(self.name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if module.ARGS_BYTES != ctypes.sizeof(GemmArgs):
                raise RuntimeError(f"{self.name} was built for another ABI: its argument block has "
                                   f"{module.ARGS_BYTES} bytes, dispatcher's {ctypes.sizeof(GemmArgs)}")
            if self.on_load is not None:
                self.on_load(module)
            self.module = module  # last: whoever sees it may use what on_load set up
        except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, and says why
            self.why_not = f"{type(e).__name__}: {e}"


def _sources(builder: str):
    """The (GeneratedSource, toolchain) that `builder`, "package.module:name", returns."""
    module, name = builder.split(":")
    return getattr(importlib.import_module(module), name)()


def build(builder: str):
    """Build a module into the build cache (or find it there) and print its
    path: the body of the loader's child process."""
    print(BuildCache().build(*_sources(builder)).path)
