"""Scratch memory the variants own (stream-K partials, grouped staging).

One buffer per thread, target memory, device and stream: grown on demand,
reused across launches, never shared by launches that may run concurrently,
and zeroed before every launch. A buffer that is outgrown is kept, not
freed: a CUDA graph captured with it still points at it.
"""

from __future__ import annotations

import threading

import numpy as np


class Workspaces(threading.local):
    def __init__(self):
        self.buffers = {}
        self.outgrown = []  # kept alive for the graphs that captured them

    def get(self, memory, nbytes: int, stream: int = 0) -> int:
        """The address of `nbytes` zeroed bytes in `memory` (0 when nbytes is 0)."""
        if nbytes <= 0:
            return 0
        key = (memory.name, memory.device(), stream)
        buf = self.buffers.get(key)
        if buf is None or buf.size < nbytes:
            if buf is not None:
                self.outgrown.append(buf)
            buf = self.buffers[key] = memory.empty((nbytes,), np.uint8, stream)
        memory.zero(buf, nbytes, stream)
        from .library import data_pointer
        return data_pointer(buf)

    def attach(self, library, args, stream: int = 0) -> int:
        """Point an ABI struct (GemmArgs or GroupedArgs) at a zeroed workspace
        of the size the kernel asks for; returns that size."""
        from . import targets
        nbytes = library.workspace_size(args)
        args.workspace = self.get(targets.get(library.config.target).memory, nbytes, stream) or None
        args.workspace_bytes = nbytes
        return nbytes


WORKSPACES = Workspaces()
