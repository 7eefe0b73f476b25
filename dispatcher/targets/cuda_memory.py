"""Device memory, streams and array interop of the cuda target.

Accepted operands: torch CUDA tensors (read in place through `data_ptr()` and
`stride()`, bf16 and fp8 included), any object with
`__cuda_array_interface__` (CuPy arrays; read in place), and numpy arrays
(copied to the device and back). Kernels run on the caller's current stream:
torch's for torch tensors, CuPy's otherwise. Allocations, copies and sets go
through `cuda_runtime.runtime()`: torch's caching allocator and streams once
torch is in the process (capturable in a CUDA graph, no CuPy needed), else
CuPy's.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from .. import dtypes
from ..errors import DtypeError, ProblemError
from ..memory import View
from .cuda_runtime import runtime


@functools.lru_cache(maxsize=None)
def device_count() -> int:
    """GPUs visible to this process (asked once: CUDA fixes it at init)."""
    return runtime().device_count()


def compute_capability() -> tuple:
    return runtime().capability()


@functools.lru_cache(maxsize=None)
def multiprocessors() -> int:
    return runtime().multiprocessors()


@functools.lru_cache(maxsize=64)
def _is_torch_type(cls) -> bool:
    return cls.__module__.startswith("torch") and hasattr(cls, "data_ptr")


def _is_torch(x) -> bool:
    return _is_torch_type(type(x))


def is_device_array(x) -> bool:
    if _is_torch(x):  # before the interface, which a CUDA tensor builds on every access
        return x.is_cuda
    return hasattr(x, "__cuda_array_interface__")


DeviceArray = View  # a view of device memory


# torch dtype name -> dtype token; the torch dtype objects themselves are
# looked up once (see torch_types) so torch is imported only when used;
# dispatcher.torch shares the table.
_TORCH_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8_e4m3",
                "float8_e5m2": "fp8_e5m2", "int8": "int8", "int32": "int32"}


@functools.lru_cache(maxsize=None)
def torch_types() -> tuple:
    """({torch dtype: (numpy dtype, itemsize)}, {numpy dtype: torch dtype}) of this torch."""
    import torch
    to_numpy, from_numpy = {}, {}
    for name, token in _TORCH_NAMES.items():
        if hasattr(torch, name):
            d = dtypes.get(token)
            to_numpy[getattr(torch, name)] = (d.numpy, d.itemsize)
            from_numpy[d.numpy] = getattr(torch, name)
    return to_numpy, from_numpy


def _row_major_strides(shape, itemsize) -> list:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def _torch_view(x) -> DeviceArray:
    found = torch_types()[0].get(x.dtype)
    if found is None:
        raise DtypeError(f"torch dtype {x.dtype} is not supported")
    dtype, size = found
    return DeviceArray(x.shape, [s * size for s in x.stride()], dtype, x.data_ptr(), x)


class _BoundDevice(threading.local):
    device = -1


_BOUND = _BoundDevice()


def _bind_thread(device: int):
    """Make `device` (the operands' GPU) current in this thread, with its
    primary context; its kernels launch there. CUTLASS encodes TMA descriptors with the driver API,
    which needs a current context, and a thread that has made no runtime
    call has none: torch runs backward passes on its own device threads
    (cuTensorMapEncodeTiled failed there with error 201, invalid context)."""
    if _BOUND.device != device:
        runtime().set_device(device)
        _BOUND.device = device


def view(x) -> DeviceArray:
    """A DeviceArray over a user's device array, without copying."""
    if _is_torch(x):
        return _torch_view(x)
    iface = x.__cuda_array_interface__
    dtype = np.dtype(iface["typestr"])
    shape = iface["shape"]
    strides = iface.get("strides") or _row_major_strides(shape, dtype.itemsize)
    return DeviceArray(shape, strides, dtype, iface["data"][0], x)


class DeviceMemory:
    name = "device"

    def accepts(self, x) -> bool:
        return isinstance(x, DeviceArray)

    def empty(self, shape, dtype, stream: int = 0):
        """Device bytes typed as `dtype`, row-major, for use on `stream`."""
        dtype = np.dtype(dtype)
        ptr, owner = runtime().empty(math.prod(shape) * dtype.itemsize, stream)
        return DeviceArray(shape, _row_major_strides(shape, dtype.itemsize), dtype, ptr, owner)

    def device(self) -> int:
        """The device this thread's launches run on."""
        return runtime().current_device()

    def overlaps(self, x, y) -> bool:
        (a0, a1), (b0, b1) = x.extent(), y.extent()
        return a0 < b1 and b0 < a1

    def copy(self, dst, src, stream: int = 0):
        """dst[...] = src on `stream` (the default stream when 0)."""
        runtime().copy(dst, src, stream)

    def writable(self, x) -> bool:
        return True

    def poison(self, x, stream: int = 0):
        """All bits set: NaN for floats, -1 for integers."""
        start, end = x.extent()
        runtime().memset(start, 0xFF, end - start, stream)

    def zero(self, x, nbytes: int, stream: int = 0):
        runtime().memset(x.ptr, 0, nbytes, stream)

    def to_host(self, x: DeviceArray, host: np.ndarray, stream: int = 0):
        runtime().to_host(x, host, stream)

    def from_host(self, x: np.ndarray, stream: int = 0) -> DeviceArray:
        ptr, strides, owner = runtime().from_host(x, stream)
        return DeviceArray(x.shape, strides, x.dtype, ptr, owner)


DEVICE = DeviceMemory()

class DeviceSession:
    """Imports one call's arrays to the device and returns results in kind:
    numpy in -> numpy out (copied back), device arrays in -> device out."""

    memory = DEVICE

    def __init__(self, *arrays):
        self.host_inputs = self.device_arrays = False
        self.torch_like = None
        for x in arrays:
            if x is None:
                continue
            if _is_torch(x):
                self.torch_like = x
            elif isinstance(x, np.ndarray):
                self.host_inputs = True
            elif hasattr(x, "__cuda_array_interface__"):
                self.device_arrays = True
            else:
                raise ProblemError(f"the cuda target takes torch CUDA tensors, CUDA arrays or numpy "
                                   f"arrays, got {type(x).__name__}")
        # the caller's library says which current stream the call runs on
        mine = runtime("torch" if self.torch_like is not None else "cupy" if self.device_arrays else None)
        device = self.torch_like.get_device() if self.torch_like is not None else mine.current_device()
        _bind_thread(device)
        self.stream = mine.current_stream(device)
        self.arrays = tuple([self.to_device(x) for x in arrays])
        self.in_place = not self.host_inputs  # the kernels read and write the caller's arrays (no copies)

    def to_device(self, x):
        if x is None:
            return None
        if isinstance(x, np.ndarray):
            return DEVICE.from_host(x, self.stream)
        return view(x)

    def empty(self, shape, dtype):
        """An output of the kind the caller passed: a torch tensor if any
        input was one, a CuPy array for CUDA arrays, else device memory."""
        dtype = np.dtype(dtype)
        if self.torch_like is not None:  # new_empty: same device, no device parsing
            t = self.torch_like.new_empty(shape, dtype=torch_types()[1][dtype])
            return DeviceArray(shape, _row_major_strides(shape, dtype.itemsize), dtype, t.data_ptr(), t)
        if self.device_arrays:
            import cupy
            buf = cupy.empty(shape, np.dtype(f"u{dtype.itemsize}"))
            return DeviceArray(shape, buf.strides, dtype, buf.data.ptr, buf)
        return DEVICE.empty(shape, dtype, self.stream)

    def finish(self, result: DeviceArray, host_out=None):
        """The user-facing result: `host_out` filled (numpy callers) or the device array."""
        if host_out is not None or self.host_inputs:
            host = host_out if host_out is not None else np.empty(result.shape, result.dtype)
            DEVICE.to_host(result, host, self.stream)
            return host
        owner = result.owner
        if _is_torch(owner) or result.dtype.kind not in "fiu":
            return owner
        return owner.view(result.dtype)
