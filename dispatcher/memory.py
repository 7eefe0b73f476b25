"""Where operands live, as the core sees it: a `Memory` says which arrays it
accepts, allocates outputs, copies, and tells whether two buffers overlap.

`HOST` is numpy memory (the cpu target). The cuda target's device memory is
in `dispatcher.targets.cuda_memory`. A target's `session(...)` imports the
caller's arrays into its memory and turns the result back into what the
caller passed (numpy in, numpy out; torch in, torch out).
"""

from __future__ import annotations

import numpy as np

from .errors import ProblemError


class HostMemory:
    name = "host"

    def accepts(self, x) -> bool:
        return isinstance(x, np.ndarray)

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def overlaps(self, x, y) -> bool:
        return np.shares_memory(x, y)

    def copy(self, dst, src, stream: int = 0):
        dst[...] = src

    def writable(self, x) -> bool:
        return x.flags.writeable

    def poison(self, x, stream: int = 0):
        from .verify import poison
        poison(x)

    def zero(self, x, nbytes: int, stream: int = 0):
        x.reshape(-1).view(np.uint8)[:nbytes] = 0


HOST = HostMemory()


class HostSession:
    """The cpu target's session: arrays are used as they are."""

    memory = HOST
    stream = 0

    def __init__(self, *arrays):
        for x in arrays:
            if x is not None and not isinstance(x, np.ndarray):
                raise ProblemError(f"the cpu target takes numpy arrays, got {type(x).__name__}")
        self.arrays = arrays

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def finish(self, result, host_out=None):
        return result
