"""Scratch memory the variants own (stream-K partials, grouped staging).

One buffer per thread, target memory, device and stream: grown on demand,
reused across launches, never shared by launches that may run concurrently,
and zeroed before every launch on targets that ask for it
(`zeroes_workspace`: cpu; a CUDA kernel clears what it needs itself, which
spares a memset of its staged copies on every call). A buffer that is
outgrown is kept, not freed: a CUDA graph captured with it still points at
it.
"""

from __future__ import annotations

import threading

import numpy as np


class Workspaces(threading.local):
    def __init__(self):
        self.buffers = {}
        self.outgrown = []  # kept alive for the graphs that captured them

    def get(self, memory, nbytes: int, stream: int = 0, zeroed: bool = True) -> int:
        """The address of `nbytes` bytes in `memory`, zeroed if asked (0 when nbytes is 0)."""
        if nbytes <= 0:
            return 0
        key = (memory.name, memory.device(), stream)
        buf = self.buffers.get(key)
        if buf is None or buf.size < nbytes:
            if buf is not None:
                self.outgrown.append(buf)
            buf = self.buffers[key] = memory.empty((nbytes,), np.uint8, stream)
        if zeroed:
            memory.zero(buf, nbytes, stream)
        from .library import data_pointer
        return data_pointer(buf)

    def attach(self, library, args, stream: int = 0, nbytes: int | None = None) -> int:
        """Point an ABI struct (GemmArgs or GroupedArgs) at a workspace of
        the size the kernel asks for (zeroed where its target says so);
        returns that size. nbytes: that size, where the caller asked
        already (a plan asks once for all its calls)."""
        from . import targets
        if nbytes is None:
            nbytes = library.workspace_size(args)
        target = targets.get(library.config.target)
        args.workspace = self.get(target.memory, nbytes, stream, target.zeroes_workspace) or None
        args.workspace_bytes = nbytes
        return nbytes


WORKSPACES = Workspaces()
