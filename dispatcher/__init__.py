"""gemm-dispatcher: one Python API for every GEMM variant, as pluggy plugins.

    import dispatcher, numpy as np
    c = dispatcher.gemm(np.ones((64, 32), np.float32), np.ones((32, 16), np.float32))

See docs/architecture.md for the path of a call through the hooks.
"""

from .blas_threads import share_cores_with_numpy

share_cores_with_numpy()  # before anything below imports numpy

from .api import Dispatcher, gemm, grouped_gemm, grouped_mm
from .api import matmul, plan, run
from .build import BuildCache
from .config import KernelConfig
from .errors import (AliasingError, BuildError, CacheError, ConfigError, DispatcherError,
                     DtypeError, KernelError, LayoutError, LibraryError, PluginError,
                     ProblemError, ToolchainError, UnsupportedProblem)
from .problem import GemmProblem, GroupedGemmProblem

__all__ = [
    "Dispatcher", "gemm", "grouped_gemm", "grouped_mm", "matmul", "plan", "run", "BuildCache", "KernelConfig", "GemmProblem",
    "GroupedGemmProblem", "AliasingError", "BuildError", "CacheError", "ConfigError",
    "DispatcherError", "DtypeError", "KernelError", "LayoutError", "LibraryError", "PluginError",
    "ProblemError", "ToolchainError", "UnsupportedProblem",
]
