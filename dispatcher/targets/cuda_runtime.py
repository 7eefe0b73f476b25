"""The CUDA runtime the cuda target's memory work goes through: torch's or
CuPy's, whichever the process uses.

Every device-memory action the cuda target takes (allocate, set, copy,
move to and from the host, make a device current, read the current
stream, time with events) is one method here, in two implementations:
`TorchRuntime` allocates from torch's caching allocator and runs on
torch's streams, so a call inside `torch.cuda.graph` capture is captured
(no raw cudaMalloc, no CuPy) and `dispatcher.torch` needs no CuPy;
`CupyRuntime` serves CuPy users. `runtime()` picks torch once torch is
imported (or CuPy is missing), else CuPy.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from ..errors import ToolchainError


class _Interface:
    """A device buffer of `nbytes` at `ptr`, as `__cuda_array_interface__`
    (how torch and CuPy both take foreign device memory without copying)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 2}


def _raw(dtype) -> np.dtype:
    """The unsigned integer dtype of an element's size: copies move bits."""
    return np.dtype(f"u{np.dtype(dtype).itemsize}")


class TorchRuntime:
    name = "torch"

    def __init__(self):
        import torch
        self.torch = torch
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._get_device = getattr(torch._C, "_cuda_getDevice", None)  # skips torch.cuda's lazy-init check
        self._ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def device_count(self) -> int:
        return self.torch.cuda.device_count()

    def capability(self) -> tuple:
        return self.torch.cuda.get_device_capability()

    def multiprocessors(self) -> int:
        return self.torch.cuda.get_device_properties(self.torch.cuda.current_device()).multi_processor_count

    def current_device(self) -> int:
        if self._get_device is not None:
            return self._get_device()
        return self.torch.cuda.current_device()

    def set_device(self, device: int):
        self.torch.cuda.set_device(device)

    def current_stream(self, device: int) -> int:
        """The device's current stream as a raw handle (torch's
        `_cuda_getCurrentRawStream` skips building a Stream object)."""
        if self._raw_stream is not None:
            return self._raw_stream(device)
        return self.torch.cuda.current_stream(device).cuda_stream

    def _on(self, stream: int):
        """A context running torch's work on `stream` (nothing to switch when it is current)."""
        import contextlib
        if not stream or stream == self.current_stream(self.current_device()):
            return contextlib.nullcontext()
        return self.torch.cuda.stream(self.torch.cuda.ExternalStream(stream))

    def empty(self, nbytes: int, stream: int = 0):
        """(address, owner) of `nbytes` from torch's caching allocator, for
        use on `stream` (the allocator ties a block to a stream)."""
        with self._on(stream):
            t = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8, device="cuda")
        return t.data_ptr(), t

    def tensor(self, view):
        """A torch tensor over a View's elements (as integers of their size)."""
        start, end = view.extent()
        if end == start:
            return self.torch.empty(view.shape, dtype=self._ints[view.itemsize], device="cuda")
        raw = self.torch.as_tensor(_Interface(start, end - start), device="cuda")
        size = view.itemsize
        return raw.view(self._ints[size]).as_strided(view.shape, [s // size for s in view.strides])

    def memset(self, ptr: int, value: int, nbytes: int, stream: int = 0):
        if nbytes <= 0:
            return
        with self._on(stream):
            self.torch.as_tensor(_Interface(ptr, nbytes), device="cuda").fill_(value)

    def copy(self, dst, src, stream: int = 0):
        with self._on(stream):
            self.tensor(dst).copy_(self.tensor(src))

    def to_host(self, view, host: np.ndarray, stream: int = 0):
        with self._on(stream):
            values = self.tensor(view).cpu().numpy()
        host.view(_raw(host.dtype))[...] = values.view(_raw(host.dtype))

    def from_host(self, host: np.ndarray, stream: int = 0) -> tuple:
        """(address, byte strides, owner) of a device copy of `host` (its layout kept)."""
        fortran = host.flags.f_contiguous and not host.flags.c_contiguous
        flat = host.view(_raw(host.dtype)).ravel(order="F" if fortran else "C")
        raw = self.torch.from_numpy(flat.view(np.dtype(f"i{host.itemsize}") if host.itemsize > 1 else np.uint8))
        with self._on(stream):
            t = raw.to("cuda", non_blocking=False)
        return t.data_ptr(), tuple(s * host.itemsize for s in _contiguous_strides(host)), t

    def synchronize(self, stream: int = 0):
        if stream:
            self.torch.cuda.ExternalStream(stream).synchronize()
        else:
            self.torch.cuda.synchronize()

    def event_timer(self, stream: int = 0):
        """(record(), elapsed seconds between two records) on `stream`."""
        torch = self.torch
        target = torch.cuda.ExternalStream(stream) if stream else torch.cuda.current_stream()

        def record():
            event = torch.cuda.Event(enable_timing=True)
            event.record(target)
            return event

        def elapsed(start, stop):
            stop.synchronize()
            return start.elapsed_time(stop) / 1e3
        return record, elapsed


class CupyRuntime:
    name = "cupy"

    def __init__(self):
        import cupy
        self.cp = cupy

    def device_count(self) -> int:
        return self.cp.cuda.runtime.getDeviceCount()

    def capability(self) -> tuple:
        cc = self.cp.cuda.Device().compute_capability
        return int(cc[:-1]), int(cc[-1])

    def multiprocessors(self) -> int:
        return self.cp.cuda.Device().attributes["MultiProcessorCount"]

    def current_device(self) -> int:
        return self.cp.cuda.runtime.getDevice()

    def set_device(self, device: int):
        self.cp.cuda.runtime.setDevice(device)

    def current_stream(self, device: int) -> int:
        return self.cp.cuda.get_current_stream().ptr

    def empty(self, nbytes: int, stream: int = 0):
        buf = self.cp.empty(max(nbytes, 1), self.cp.uint8)
        return buf.data.ptr, buf

    def array(self, view):
        cp = self.cp
        start, end = view.extent()
        memory = cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(view.ptr, end - start, view.owner), 0)
        return cp.ndarray(view.shape, _raw(view.dtype), memory, strides=view.strides)

    def memset(self, ptr: int, value: int, nbytes: int, stream: int = 0):
        if nbytes > 0:
            self.cp.cuda.runtime.memsetAsync(ptr, value, nbytes, stream)

    def copy(self, dst, src, stream: int = 0):
        with self.cp.cuda.ExternalStream(stream):
            self.array(dst)[...] = self.array(src)

    def to_host(self, view, host: np.ndarray, stream: int = 0):
        with self.cp.cuda.ExternalStream(stream):
            host.view(_raw(host.dtype))[...] = self.cp.asnumpy(self.array(view))

    def from_host(self, host: np.ndarray, stream: int = 0) -> tuple:
        order = "F" if (host.flags.f_contiguous and not host.flags.c_contiguous) else "C"
        buf = self.cp.asarray(np.asarray(host, order=order).view(_raw(host.dtype)), order=order)
        return buf.data.ptr, buf.strides, buf

    def synchronize(self, stream: int = 0):
        self.cp.cuda.ExternalStream(stream).synchronize()

    def event_timer(self, stream: int = 0):
        cp = self.cp
        target = cp.cuda.ExternalStream(stream) if stream else cp.cuda.get_current_stream()

        def record():
            event = cp.cuda.Event()
            event.record(target)
            return event

        def elapsed(start, stop):
            stop.synchronize()
            return cp.cuda.get_elapsed_time(start, stop) / 1e3
        return record, elapsed


def _contiguous_strides(host: np.ndarray) -> tuple:
    """Element strides of `host`'s elements copied in C order, or in F order
    when it is Fortran-ordered (a column-major operand stays column-major)."""
    shape = host.shape
    fortran = host.flags.f_contiguous and not host.flags.c_contiguous
    dims = range(len(shape)) if fortran else reversed(range(len(shape)))
    strides, step = [0] * len(shape), 1
    for d in dims:
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


@functools.lru_cache(maxsize=None)
def _make(name: str):
    return TorchRuntime() if name == "torch" else CupyRuntime()


def runtime(prefer: str | None = None):
    """The runtime `prefer`red ("torch" for torch tensors, "cupy" for CuPy
    arrays) where it is installed; else torch's once torch is imported, or
    when CuPy is missing; else CuPy's. ToolchainError when neither is
    installed."""
    if prefer == "torch" or "torch" in sys.modules and prefer != "cupy":
        return _make("torch")
    try:
        import cupy  # noqa: F401
        return _make("cupy")
    except ImportError:
        pass
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ToolchainError("the cuda target needs torch (with CUDA) or CuPy for device memory and "
                             "streams: pip install torch, or 'gemm-dispatcher[cuda]'") from None
    return _make("torch")
