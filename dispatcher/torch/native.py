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
autocast, a plan whose scratch is sized per call) goes the Python way,
which is the same kernels and rules.

The core's plain calls on tensors (`dispatcher.gemm(a, b)`, `matmul(a, b)`),
`matmul`'s batched calls and those with a fused bias and activation, and held plans
(`dispatcher.plan`) use the module too: `product` makes a plan's C++
`Product` (its launch for tensors of one key and one activation, no
autograd), and the core's table of them (`Products`) serves those calls
first (`native_module.PRODUCTS`, `MATMULS`); the core finds this module
through the `dispatcher.native_calls` entry point named `torch`.

The module is one of the dispatcher's native modules
(`dispatcher.native_module`: built from source into the build cache in the
background the first time a process asks for it; `DISPATCHER_NO_NATIVE_CALLS=1`
keeps every call in Python), built against torch's headers; until it is
loaded, calls go the Python way. `extension(wait=True)` waits for it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dispatcher import native_module, plugins
from dispatcher.build import GeneratedSource
from dispatcher.memory import View
from dispatcher.native_module import ExtensionToolchain, ModuleBuild, NativeModule
from dispatcher.plugins import get_manager
from dispatcher.torch import eager
from dispatcher.torch.tensors import torch_types

NAME = "dispatcher_torch_native"
SOURCE = Path(__file__).with_name("native_linear.cpp")


def _toolchain() -> ExtensionToolchain:
    """g++ with torch's headers and libraries."""
    import torch.utils.cpp_extension as extension
    libraries = extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ExtensionToolchain.find(
        "CXX", ("g++", "c++"), "C++ torch extension of dispatcher.torch's native Linear", f"torch {torch.__version__}",
        ("-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={NAME}",
         *(f"-I{p}" for p in extension.include_paths()),
         *(f"-L{p}" for p in libraries), *(f"-Wl,-rpath,{p}" for p in libraries),
         # the libraries come before the source on the command line (`compile`)
         "-Wl,--no-as-needed", "-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python"))


def source():
    """The module's source and toolchain (`native_module.build`)."""
    return GeneratedSource(ModuleBuild(NAME, f"torch {torch.__version__}"), ((f"{NAME}.cpp", SOURCE.read_text()),)), \
        _toolchain()


def _loaded(module):
    """Once loaded: the core's plain calls, its calls into an out and
    matmul's calls (batched, a bias, an activation) on tensors try the
    module's products."""
    _PRODUCTS.append(module.Products())
    native_module.PRODUCTS.append(_PRODUCTS[0])
    native_module.MATMULS.append(_PRODUCTS[0].matmul)
    native_module.INTO.append(_PRODUCTS[0].into)


_PRODUCTS: list = []  # the module's Products of the core's calls, once loaded
_MODULE = NativeModule(NAME, f"{__name__}:source", on_load=_loaded)


extension = _MODULE.get  # the loaded module, or None (`NativeModule.get`; wait=True waits for it)
failure = _MODULE.failure  # why there is no module, once that is known


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
        self.fruitless = 0  # `learn` calls in a row that found nothing planned and planned nothing

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
        Nothing where a launch cannot run natively. Calls that nothing can
        be planned for retry at doubling intervals, not on every call; a
        call whose plans stay incomplete (a gradient wanted, its backward
        launch not planned) comes here as often as the C++ side sends it
        back: its first few, then at doubling intervals (meanwhile the C++
        side runs it, its backward through the operator, whose plans are
        what a later call here plans natively).
        The caller ran the call as a plain eager one (`forward`)."""
        if x.dim() != 2:
            return
        have = self.plans.planned(x, weight, bias)
        if not have:
            self.fruitless += 1
            if self.fruitless & (self.fruitless - 1):
                return
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


def product(key, arrays: tuple, plan, order: tuple, scalars: tuple, activation):
    """The C++ launch of a plan's products on tensors like `arrays` (a, b
    and a bias or an output given, if any) with `activation` (the core's
    `gemm(a, b)`, `gemm(a, b, out=out)` and `matmul` on CUDA tensors, a held
    plan's calls; `native_module.Launches.make`): no autograd, as on the
    Python way. False for a bias that is not one value per column (1-D), and
    for an output that is not a plain row-major matrix (or wants a gradient)
    or comes with a bias or an activation (the Python way runs those)."""
    into = arrays[2] if len(arrays) > 2 and order[-1] == plan.names.get("out") else None
    bias = arrays[2] if len(arrays) > 2 and into is None else None
    if (bias is not None and bias.dim() != 1) or \
            (into is not None and (len(arrays) > 3 or activation is not None or into.dim() != 2 or not _row_major(into)
                                   or into.requires_grad or into.is_neg() or into.is_conj())):
        return False
    return _MODULE.launch(plan, order, scalars, lambda module, found: _product(module, found, arrays, bias,
                                                                              activation, into))


def _product(module, found, arrays: tuple, bias, activation, into):
    """The module's Product of `found`; None where the example out overlaps
    a or b (the C++ `fits_out` refuses it; the call runs the Python way,
    which says why), so that a later call of the key learns one."""
    if into is not None and not all(_apart(into, x) for x in arrays[:2]):
        return None
    return module.Product(arrays[0], arrays[1], bias, activation or "", _spec(found), into)


def _apart(out, x) -> bool:
    """Whether the bytes `out` spans miss `x`'s (native_linear.cpp `fits_out`)."""
    (o0, o1), (x0, x1) = _bytes(out).extent(), _bytes(x).extent()
    return o0 == o1 or not (x0 < o1 and o0 < x1)


def _bytes(t) -> View:
    """The memory a tensor's elements span (torch strides are never negative)."""
    size = t.element_size()
    return View(t.shape, [s * size for s in t.stride()], f"u{size}", t.data_ptr())


def _forget_products():
    """A plugin registration: what selection chooses may have changed."""
    if _PRODUCTS:
        _PRODUCTS[0].clear_all()


for _kind in (torch.Tensor, torch.nn.Parameter):
    native_module.KINDS[_kind] = native_module.Launches(product, lambda launch: _PRODUCTS[0].add(launch))
plugins.on_change(_forget_products)


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
    return None if found is None else _spec(found)


def _spec(found) -> tuple:
    """A `plans.NativeLaunch` as the module takes it (native_linear.cpp `launch_of`)."""
    return (found.entry, found.last_error, found.block, found.extra, found.rows, found.cols,
            torch_types()[1][found.dtype], found.batch, found.workspace, found.zeroed)
