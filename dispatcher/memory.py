"""Where operands live, as the core sees it: a `Memory` says which arrays it
accepts, allocates outputs, copies, and tells whether two buffers overlap.

`HOST` is numpy memory (the cpu target). The cuda target's device memory is
in `dispatcher.targets.cuda_memory`. A target's `session(...)` imports the
caller's arrays into its memory and turns the result back into what the
caller passed (numpy in, numpy out; torch in, torch out).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ProblemError


class View:
    """A typed, strided view of memory at an address (numpy dtype, byte
    strides): what an argument block points at, on any target. `owner`
    keeps the memory alive (None: the caller does)."""

    __slots__ = ("shape", "strides", "dtype", "ptr", "owner", "ndim", "size", "itemsize")

    def __init__(self, shape, strides, dtype, ptr, owner=None):
        self.shape, self.strides = tuple(shape), tuple(strides)
        self.dtype, self.ptr, self.owner = np.dtype(dtype), int(ptr), owner
        self.ndim, self.size, self.itemsize = len(self.shape), math.prod(self.shape), self.dtype.itemsize

    @property
    def T(self):
        return View(self.shape[::-1], self.strides[::-1], self.dtype, self.ptr, self.owner)

    def extent(self) -> tuple:
        """[first byte, last byte + 1) this view touches."""
        return self.ptr, self.ptr + (span(self) if self.size else 0)


def span(x) -> int:
    """Bytes from a non-empty array's first element to past its last
    (strides >= 0): of a View, an ArraySpec, anything with shape, strides
    (bytes) and itemsize."""
    return sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + x.itemsize


class HostMemory:
    name = "host"

    def accepts(self, x) -> bool:
        return isinstance(x, np.ndarray)

    def empty(self, shape, dtype, stream: int = 0):
        return np.empty(shape, dtype)

    def device(self) -> int:
        return 0

    def overlaps(self, x, y) -> bool:
        return np.shares_memory(x, y)

    def copy(self, dst, src, stream: int = 0):
        dst[...] = src

    def writable(self, x) -> bool:
        return x.flags.writeable

    def poison(self, x, stream: int = 0):
        poison(x)

    def zero(self, x, nbytes: int, stream: int = 0):
        x.reshape(-1).view(np.uint8)[:nbytes] = 0


HOST = HostMemory()


class HostSession:
    """The cpu target's session: arrays are used as they are."""

    memory = HOST
    stream = 0
    in_place = True  # the kernels read and write the caller's arrays (no copies)

    def __init__(self, *arrays):
        for x in arrays:
            if x is not None and not isinstance(x, np.ndarray):
                hint = ("; for CPU torch tensors use dispatcher.torch (gemm, linear, grouped_mm), or pass "
                        "tensor.numpy()") if getattr(x, "is_cpu", False) is True else ""
                raise ProblemError(f"the cpu target takes numpy arrays, got {type(x).__name__}{hint}")
        self.arrays = arrays

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def finish(self, result, host_out=None):
        return result


def poison(x: np.ndarray) -> np.ndarray:
    """Fill an output buffer with a value no kernel writes: NaN, or the
    minimum of an integer type."""
    if np.issubdtype(x.dtype, np.integer):
        x[...] = np.iinfo(x.dtype).min
    else:
        x[...] = np.nan
    return x
