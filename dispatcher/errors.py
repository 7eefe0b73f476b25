"""Every exception gemm-dispatcher raises on purpose.

One base class, `DispatcherError`, so callers can catch the whole family; each
subclass also derives from the builtin a Python user would expect
(`ValueError` for bad arguments, `TypeError` for bad dtypes, `RuntimeError`
for failures of the toolchain or of a kernel).
"""


class DispatcherError(Exception):
    """Base of every gemm-dispatcher error."""


class ConfigError(DispatcherError, ValueError):
    """A kernel configuration names an unknown field or an invalid value."""


class ProblemError(DispatcherError, ValueError):
    """Operands do not form a valid problem: shapes, ranks, counts."""


class DtypeError(DispatcherError, TypeError):
    """An operand's dtype is not supported, or operands' dtypes disagree."""


class LayoutError(DispatcherError, ValueError):
    """An operand's strides are not a layout the kernels can read
    (negative or non-unit inner strides)."""


class AliasingError(DispatcherError, ValueError):
    """An output buffer overlaps an input buffer."""


class UnsupportedProblem(DispatcherError):
    """The kernel reported status -2: it cannot run this problem.

    Selection catches this and falls back to another kernel.
    """


class KernelError(DispatcherError, RuntimeError):
    """A kernel reported status -1; the message is the library's last error."""


class PluginError(DispatcherError):
    """Plugins conflict, or no plugin answers for a variant or target."""


class ToolchainError(DispatcherError, RuntimeError):
    """A compiler or header package the target needs is missing."""


class BuildError(DispatcherError, RuntimeError):
    """The compiler rejected a generated source; `log` holds its output."""

    def __init__(self, message, log=""):
        super().__init__(message)
        self.log = log


class CacheError(DispatcherError, RuntimeError):
    """A build-cache entry is corrupt (its stored hash does not match)."""


class LibraryError(DispatcherError, RuntimeError):
    """A built library cannot be loaded, lacks an ABI symbol, or reports a
    different kernel name or ABI version than expected."""
