"""`Linear`'s warm eager calls in C++ (native_linear.cpp), forward and backward,
and `gemm`'s products that want no gradient.

A Linear call through the Python operator costs microseconds per step (the
plan's key and lookup, the argument block, an autograd.Function and its
Python backward) that a small layer's kernel does not. Once the Python path
has planned and bound a Linear's calls of one kind (its forward GEMM with the
fused bias, and after a first backward the backward GEMM of each input that
wants a gradient), its `LinearPlans` hands their launches
(`Plan.native_launch`) to a C++ `Plans`, which runs later calls like it, and
their backward, without Python. What it has no plan for (a new shape,
stride, dtype, device, stream or alignment, a traced or mode-wrapped call,
autocast, a plan with a workspace) goes the Python way, which is the same
kernels and rules.

The module is built from source into the build cache (`BuildCache`, keyed by
the source, the compiler, torch's version and the ABI header) the first time
a process asks for it, by a child process that a background thread waits
for: until it is loaded, calls go the Python way. `extension(wait=True)`
waits for it. Set `DISPATCHER_NO_NATIVE_TORCH=1` to keep every call in
Python.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import attrs
import torch

from dispatcher import environ
from dispatcher.build import BuildCache, GeneratedSource
from dispatcher.errors import ToolchainError
from dispatcher.library import GemmArgs
from dispatcher.plugins import get_manager
from dispatcher.targets.toolchain import NATIVE_DIR, CompilerMixin, headers_hash
from dispatcher.torch import eager
from dispatcher.torch.tensors import torch_types

NAME = "dispatcher_torch_native"
SOURCE = Path(__file__).with_name("native_linear.cpp")
SWITCH = "DISPATCHER_NO_NATIVE_TORCH"


@attrs.frozen
class _Extension:
    """The build cache's "config" of the module: its name and what it is built against."""
    name: str
    torch: str

    def to_dict(self) -> dict:
        return {"name": self.name, "torch": self.torch}


@attrs.frozen
class _Toolchain(CompilerMixin):
    """g++ with torch's and Python's headers and torch's libraries."""
    compiler: str
    flags: tuple
    identity: str
    label = "C++ (torch extension)"

    @classmethod
    def find(cls) -> "_Toolchain":
        import torch.utils.cpp_extension as extension
        compiler = shutil.which(os.environ.get("CXX") or "g++") or shutil.which("c++")
        if not compiler:
            raise ToolchainError("no C++ compiler for dispatcher.torch's native Linear (g++ or $CXX)")
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        libraries = extension.library_paths()
        flags = ("-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-w",
                 f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={NAME}", f"-I{NATIVE_DIR}",
                 *(f"-I{p}" for p in extension.include_paths()), f"-I{sysconfig.get_paths()['include']}",
                 *(f"-L{p}" for p in libraries), *(f"-Wl,-rpath,{p}" for p in libraries),
                 # the libraries come before the source on the command line (`compile`)
                 "-Wl,--no-as-needed", "-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python")
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
        identity = f"{' '.join(version)} | torch {torch.__version__} | python {sys.version_info[:2]} " \
                   f"| headers:{headers_hash()}"
        return cls(compiler, flags, identity)

    @property
    def cache_flags(self) -> tuple:
        """The flags that change the binary: not where headers and libraries are."""
        return tuple(f for f in self.flags if not f.startswith(("-I", "-L", "-Wl,-rpath")))


class _Loader:
    """The module, built and imported once per process, in the background.

    The build runs in a child process of its own session (`build_library`),
    so a process that exits while it compiles leaves it to finish and
    publish the library into the build cache for the next one; the thread
    here waits for it and imports what it built. A process forked while the
    build runs starts over in the child (the thread is not forked)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = None
        self.module = None
        self.failure = None  # why there is no module, once that is known

    def get(self, wait: bool):
        if self.module is not None or self.failure is not None:
            return self.module
        with self.lock:
            if self.thread is None:
                if environ.flag(SWITCH):
                    self.failure = f"{SWITCH} is set"
                    self.done.set()
                    return None
                self.thread = threading.Thread(target=self._load, name=f"{NAME} build", daemon=True)
                self.thread.start()
        if wait:
            self.done.wait()
        return self.module

    def forked(self):
        if self.module is None:
            self.__init__()

    def _load(self):
        try:
            child = subprocess.run([sys.executable, "-c", f"from {__name__} import build_library; build_library()"],
                                   capture_output=True, text=True, start_new_session=True)
            if child.returncode != 0:
                lines = (child.stderr.strip() or f"exit status {child.returncode}").splitlines()
                raise RuntimeError(lines[-1])
            path = child.stdout.strip().splitlines()[-1]
            spec = importlib.util.spec_from_file_location(NAME, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if module.ARGS_BYTES != ctypes.sizeof(GemmArgs):
                raise RuntimeError(f"{NAME} was built for another ABI: its argument block has "
                                   f"{module.ARGS_BYTES} bytes, dispatcher's {ctypes.sizeof(GemmArgs)}")
            self.module = module
        except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, and says why
            self.failure = f"{type(e).__name__}: {e}"
        finally:
            self.done.set()


def build_library():
    """Build the module into the build cache (or find it there) and print
    its path: the body of the loader's child process."""
    source = GeneratedSource(_Extension(NAME, torch.__version__), ((f"{NAME}.cpp", SOURCE.read_text()),))
    print(BuildCache().build(source, _Toolchain.find()).path)


_LOADER = _Loader()
os.register_at_fork(after_in_child=_LOADER.forked)


def extension(wait: bool = False):
    """The loaded module, or None: not loaded yet (the first ask starts its
    build; `wait=True` waits for it), switched off, or it failed to build
    or load (`failure()` says why)."""
    return _LOADER.get(wait)


def failure() -> str | None:
    """Why there is no module, once that is known (None: loaded, or not yet known)."""
    return _LOADER.failure


class LinearPlans:
    """One Linear's calls that run in C++ (module docstring), for the
    settings it was made with (`settings`: the layer's variant, autotune,
    config and whether its bias is fused; a layer whose settings change
    makes new plans)."""

    def __init__(self, module, variant: str, autotune, settings=None):
        self.plans = module.Plans()
        self.variant, self.autotune, self.settings = variant, autotune, settings
        self.manager = get_manager()
        self.generation = self.manager.generation
        self.fruitless = 0  # `learn` calls in a row that planned nothing new

    def __reduce__(self):
        """A copied or pickled Linear (copy.deepcopy, torch.save) gets none:
        the plans are this process's, and its copy makes its own."""
        return type(None), ()

    def forward(self, x, weight, bias):
        """y for a plain eager call (`eager.plain_eager`: the caller asks)
        that it has plans for, else None (the Python way runs it, then
        `learn`)."""
        manager = get_manager()
        if manager is not self.manager or manager.generation != self.generation:
            self.plans.clear()  # a plugin registration: what selection chooses may have changed
            self.manager, self.generation = manager, manager.generation
            return None
        return self.plans.forward(x, weight, bias)

    def learn(self, x, weight, bias, backward: bool = True):
        """After the Python way ran a call (x, weight, bias): plan calls like
        it natively where the Python way holds their launches bound: this
        call's forward GEMM and, once a backward ran (and if `backward`),
        the backward GEMM of each input that wants a gradient, for a
        row-major gradient (so only where x and the weight are row-major:
        each gradient is laid out as its input, as on the Python way).
        Nothing where a launch cannot run natively. A call whose plans stay
        incomplete (a gradient wanted, no backward run) retries at
        doubling intervals, not on every call (and after a few such calls
        the C++ side runs it anyway, its backward through the operator).
        The caller ran the call as a plain eager one (`forward`)."""
        if x.dim() != 2:
            return
        self.fruitless += 1
        if self.fruitless & (self.fruitless - 1):
            return
        have = self.plans.planned(x, weight, bias)
        transposed = weight.t()
        forward = _launch(eager.linear_key(x, transposed, bias, self.variant, self.autotune) if bias is not None
                          else eager.gemm_key(x, transposed, self.variant, 1.0, None, self.autotune))
        if forward is None:
            return
        dx = dw = None
        if backward and _row_major(x) and _row_major(weight):
            dy = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
            if not have & 2:
                dx = _launch(eager.gemm_key(dy, weight, self.variant, 1.0, None, self.autotune))
            if not have & 4:
                dw = _launch(eager.gemm_key(dy.t(), x, self.variant, 1.0, None, self.autotune))
        if have and dx is None and dw is None:
            return  # nothing new
        self.plans.add(x, weight, bias, forward, dx, dw, self.variant, self.autotune)
        self.fruitless = 0


def _row_major(t) -> bool:
    return t.stride(1) == 1 and t.stride(0) == t.shape[1]


def gemm_plans(variant: str, autotune) -> LinearPlans | None:
    """The native plans of `dispatcher.torch.gemm`'s plain products without
    gradients (a @ b as linear(a, b^T), no backward) of one variant and
    autotune setting; None while the module is not loaded."""
    found = _GEMM_PLANS.get((variant, autotune))
    if found is None:
        module = extension()
        if module is None:
            return None
        found = _GEMM_PLANS[(variant, autotune)] = LinearPlans(module, variant, autotune)
    return found


_GEMM_PLANS: dict = {}  # (variant, autotune) -> LinearPlans of dispatcher.torch.gemm


def _launch(key):
    """The native launch of the Python way's held plan for `key`, or None."""
    held = eager.held_plan(key)
    if held is None or held.order is None or not held.plan.current():
        return None
    found = held.plan.native_launch(held.order, held.scalars)
    if found is None:
        return None
    return (*found[:-1], torch_types()[1][found[-1]])
