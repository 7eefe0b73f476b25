"""Loading a built library and calling its C ABI (dispatcher/native/dispatcher_abi.h).

The loader probes the exported symbols, checks the ABI version and that the
library reports the kernel name it was built for (so a drift between the
Python name and the generated source is caught), and maps status codes to
exceptions: -1 -> KernelError with the library's last error, -2 ->
UnsupportedProblem.

A library the build cache has checked in this process (see
`build.checked_sha256`) is loaded from a private in-memory copy (a memfd)
of its bytes, and only if they still have the checked SHA-256, else
CacheError: a file damaged or replaced between the cache's check and the
load is never loaded, and a change to the file afterwards (even in place)
cannot reach this process's code. Copies are shared by content, one per
distinct library per process, and keep their descriptor open (glibc finds
an already loaded library by its path, so a reused `/proc/self/fd/N` would
return the wrong one). Other paths, and any library once memfds run out,
load from their file.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from pathlib import Path

import attrs
import numpy as np

from .errors import CacheError, KernelError, LibraryError, UnsupportedProblem

ABI_VERSION = 2
STATUS_OK, STATUS_ERROR, STATUS_UNSUPPORTED = 0, -1, -2

_i64 = ctypes.c_int64
_i64p = ctypes.POINTER(ctypes.c_int64)
_vp = ctypes.c_void_p


class OperandArg(ctypes.Structure):
    """`dispatcher_operand`: one extra operand (strides in elements, 0 broadcasts)."""
    _fields_ = [("data", _vp), ("row_stride", _i64), ("col_stride", _i64), ("batch_stride", _i64)]


class GemmArgs(ctypes.Structure):
    _fields_ = [("a", _vp), ("b", _vp), ("c", _vp),
                ("m", _i64), ("n", _i64), ("k", _i64),
                ("lda", _i64), ("ldb", _i64), ("ldc", _i64),
                ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
                ("workspace", _vp), ("workspace_bytes", _i64),
                ("workers", ctypes.c_int32), ("stream", _vp),
                ("batch", _i64), ("batch_stride_a", _i64), ("batch_stride_b", _i64),
                ("batch_stride_c", _i64), ("scale_a", ctypes.c_double), ("scale_b", ctypes.c_double),
                ("extra_count", ctypes.c_int32), ("extra", ctypes.POINTER(OperandArg)),
                ("param_count", ctypes.c_int32), ("params", ctypes.POINTER(ctypes.c_double))]


class GroupedArgs(ctypes.Structure):
    _fields_ = [("group_count", _i64), ("m", _i64p), ("n", _i64p), ("k", _i64p),
                ("a", ctypes.POINTER(_vp)), ("b", ctypes.POINTER(_vp)), ("c", ctypes.POINTER(_vp)),
                ("lda", _i64p), ("ldb", _i64p), ("ldc", _i64p),
                ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
                ("workspace", _vp), ("workspace_bytes", _i64), ("stream", _vp)]


class GroupedMmArgs(ctypes.Structure):
    _fields_ = [("group_count", _i64), ("offsets", _vp), ("total_m", _i64), ("n", _i64), ("k", _i64),
                ("a", _vp), ("lda", _i64), ("b", _vp), ("ldb", _i64), ("stride_b", _i64),
                ("c", _vp), ("ldc", _i64), ("alpha", ctypes.c_double),
                ("workspace", _vp), ("workspace_bytes", _i64), ("stream", _vp)]


_GEMM_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(GemmArgs))


class RegistryEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("run", _GEMM_FN)]


_private: dict = {}  # SHA-256 -> (memfd, CDLL) of the libraries loaded from a private copy
_private_lock = threading.Lock()


def _open_library(path: Path) -> ctypes.CDLL:
    """dlopen `path`; a library the build cache checked, from a private
    copy of exactly the bytes checked (module docstring). OSError if it
    cannot be read or loaded."""
    from .build import checked_sha256

    expected = checked_sha256(path)
    if expected is None or not hasattr(os, "memfd_create"):
        return ctypes.CDLL(str(path))
    image = path.read_bytes()
    if hashlib.sha256(image).hexdigest() != expected:
        raise CacheError(f"build-cache library {path} changed after its entry was checked (its "
                         "hash no longer matches): not loaded; the next build moves the entry "
                         "aside and rebuilds it")
    with _private_lock:
        if expected not in _private:
            try:
                fd = os.memfd_create(f"gemm-dispatcher:{path.name}")
            except OSError:  # e.g. out of descriptors: the file, just checked
                return ctypes.CDLL(str(path))
            try:
                view = memoryview(image)
                while view:
                    view = view[os.write(fd, view):]
                _private[expected] = (fd, ctypes.CDLL(f"/proc/self/fd/{fd}"))
            except OSError:
                os.close(fd)
                return ctypes.CDLL(str(path))  # no /proc, or memfds may not be mapped executable
        return _private[expected][1]


@attrs.frozen
class LaunchResult:
    kernel: str
    status: int = STATUS_OK
    workspace_bytes: int = 0


class Library:
    """One loaded .so. `symbols` lists which optional entry points it has."""

    OPTIONAL = ("dispatcher_run_gemm", "dispatcher_run_grouped_gemm", "dispatcher_registry",
                "dispatcher_workspace_size", "dispatcher_grouped_workspace_size",
                "dispatcher_run_grouped_mm", "dispatcher_grouped_mm_workspace_size")
    # The argument struct of each entry point and size query that takes one.
    _ARGS = {"dispatcher_run_gemm": GemmArgs, "dispatcher_workspace_size": GemmArgs,
             "dispatcher_run_grouped_gemm": GroupedArgs, "dispatcher_grouped_workspace_size": GroupedArgs,
             "dispatcher_run_grouped_mm": GroupedMmArgs, "dispatcher_grouped_mm_workspace_size": GroupedMmArgs}
    _SIZE_QUERIES = {GemmArgs: "dispatcher_workspace_size", GroupedArgs: "dispatcher_grouped_workspace_size",
                     GroupedMmArgs: "dispatcher_grouped_mm_workspace_size"}

    def __init__(self, path, expected_name: str | None = None, config=None):
        self.path = Path(path)
        self.config = config
        try:
            self._dll = _open_library(self.path)
        except OSError as e:
            raise LibraryError(f"cannot load {self.path}: {e}") from None
        for required in ("dispatcher_abi_version", "dispatcher_kernel_name", "dispatcher_last_error"):
            if not hasattr(self._dll, required):
                raise LibraryError(f"{self.path} does not export {required}: not a gemm-dispatcher library")
        self._dll.dispatcher_kernel_name.restype = ctypes.c_char_p
        self._dll.dispatcher_last_error.restype = ctypes.c_char_p
        version = self._dll.dispatcher_abi_version()
        if version != ABI_VERSION:
            raise LibraryError(f"{self.path} has ABI version {version}, expected {ABI_VERSION}")
        self.name = self._dll.dispatcher_kernel_name().decode()
        if expected_name is not None and self.name != expected_name:
            raise LibraryError(f"{self.path} reports kernel {self.name!r}, expected {expected_name!r}")
        self.symbols = tuple(s for s in self.OPTIONAL if hasattr(self._dll, s))
        for symbol in self.symbols:
            if symbol in self._ARGS:
                fn = getattr(self._dll, symbol)
                fn.argtypes = [ctypes.POINTER(self._ARGS[symbol])]
                fn.restype = _i64 if symbol.endswith("_size") else ctypes.c_int
        if "dispatcher_registry" in self.symbols:
            self._dll.dispatcher_registry.argtypes = [ctypes.POINTER(ctypes.c_int)]
            self._dll.dispatcher_registry.restype = ctypes.POINTER(RegistryEntry)

    def __repr__(self):
        return f"Library({self.name!r}, {str(self.path)!r})"

    @property
    def last_error_address(self) -> int:
        """The address of the library's `dispatcher_last_error` (native callers' messages)."""
        return ctypes.cast(self._dll.dispatcher_last_error, ctypes.c_void_p).value

    def require(self, symbol: str):
        if symbol not in self.symbols:
            raise LibraryError(f"{self.path} ({self.name}) does not export {symbol}")
        return getattr(self._dll, symbol)

    @functools.cached_property
    def registry(self) -> dict:
        """The library's kernel registry table: name -> entry point."""
        count = ctypes.c_int(0)
        entries = self.require("dispatcher_registry")(ctypes.byref(count))
        return {entries[i].name.decode(): entries[i].run for i in range(count.value)}

    def check(self, status: int) -> int:
        """Map a status code to an exception (or return it when 0)."""
        if status == STATUS_OK:
            return status
        message = self._dll.dispatcher_last_error().decode() or "(no message)"
        if status == STATUS_UNSUPPORTED:
            raise UnsupportedProblem(f"kernel {self.name} does not support this problem: {message}")
        raise KernelError(f"kernel {self.name} failed with status {status}: {message}")

    def run_gemm(self, args: GemmArgs, entry=None) -> int:
        fn = entry or self.require("dispatcher_run_gemm")
        return self.check(fn(ctypes.byref(args)))

    def run_grouped(self, args: GroupedArgs) -> int:
        return self.check(self.require("dispatcher_run_grouped_gemm")(ctypes.byref(args)))

    def run_grouped_mm(self, args: GroupedMmArgs) -> int:
        return self.check(self.require("dispatcher_run_grouped_mm")(ctypes.byref(args)))

    def asks_workspace(self, kind) -> bool:
        """Whether the library exports a workspace query for argument blocks of type `kind`."""
        return self._SIZE_QUERIES[kind] in self.symbols

    def workspace_size(self, args) -> int:
        """Scratch bytes the kernel needs for these arguments (0 if it exports no query)."""
        fn = self._SIZE_QUERIES[type(args)]
        if fn not in self.symbols:
            return 0
        size = int(getattr(self._dll, fn)(ctypes.byref(args)))
        if size < 0:  # the status a launch would give (-2: UnsupportedProblem)
            self.check(size)
        return size


def _reads_numpy_data_field() -> bool:
    """Whether an ndarray's data pointer can be read straight from its
    object: CPython lays out an object as its header then its fields, and
    numpy's array struct starts with the data pointer (`PyArray_DATA`).
    Checked on this interpreter against numpy's own answer."""
    x = np.arange(3, dtype=np.int64)[1:]
    return ctypes.c_void_p.from_address(id(x) + object.__basicsize__).value == x.ctypes.data


_FIELD_AT = ctypes.c_void_p.from_address
_DATA_OFFSET = object.__basicsize__ if _reads_numpy_data_field() else None


def data_pointer(x) -> int:
    """Address of an array's first element: a numpy array (host) or a
    `memory.View` (a device array, or a matrix of an argument block). A
    plain ndarray's is read from its object (0.4 us, where `x.ctypes.data`
    takes 3 us: it is read three times per call)."""
    if type(x) is np.ndarray and _DATA_OFFSET is not None:
        return _FIELD_AT(id(x) + _DATA_OFFSET).value or 0
    if isinstance(x, np.ndarray):
        return x.ctypes.data
    return x.ptr


def gemm_args(operands, workers: int = 0, stream: int = 0) -> GemmArgs:
    """The ABI struct of one problem's operands (`problem.GemmOperands`: one
    GEMM, or a batch of them with extra operands and parameters); a variant
    that needs scratch memory sets `workspace`/`workspace_bytes`. The
    arrays the struct points into are kept alive on it."""
    a, b, c = operands.a, operands.b, operands.c
    args = GemmArgs(data_pointer(a), data_pointer(b), data_pointer(c),
                    c.shape[-2], c.shape[-1], a.shape[-1],
                    operands.lda, operands.ldb, operands.ldc,
                    operands.alpha, operands.beta, None, 0, int(workers), stream or None,
                    operands.batch, operands.batch_stride_a, operands.batch_stride_b,
                    operands.batch_stride_c, operands.scale_a, operands.scale_b)
    if operands.extra:
        args._extra = (OperandArg * len(operands.extra))(
            *((data_pointer(x), rs, cs, bs) for x, rs, cs, bs in operands.extra))
        args.extra_count, args.extra = len(operands.extra), args._extra
    if operands.params:
        args._params = (ctypes.c_double * len(operands.params))(*operands.params)
        args.param_count, args.params = len(operands.params), args._params
    args._owners = (a, b, c, operands.owners)  # the arrays, or the arrays behind address views
    return args


def bound_gemm_args(template: GemmArgs, pointers: tuple, core: tuple, params: tuple) -> GemmArgs:
    """A copy of a plan's argument block `template` (`gemm_args`) pointed at
    one call's arrays: A, B, C, then the extra operands, whose strides it
    keeps; core: (alpha, beta, scale_a, scale_b); params: the variant's
    parameters. The template is shared by every call, so the copy gets
    arrays of its own for the extra operands and parameters."""
    args = GemmArgs.from_buffer_copy(template)
    args.a, args.b, args.c = pointers[0], pointers[1], pointers[2]
    args.alpha, args.beta, args.scale_a, args.scale_b = core
    if len(pointers) > 3:
        kept = template._extra
        extra = type(kept).from_buffer_copy(kept)
        for i in range(len(pointers) - 3):
            extra[i].data = pointers[3 + i]
        args._extra, args.extra = extra, extra
    if params:
        args._params = (ctypes.c_double * len(params))(*params)
        args.params = args._params
    return args


def grouped_mm_args(operands, stream: int = 0) -> GroupedMmArgs:
    """The ABI struct of a stacked grouped problem (see problem.StackedOperands)."""
    a, b, c = operands.a, operands.b, operands.c
    return GroupedMmArgs(b.shape[0], data_pointer(operands.offsets), a.shape[0], b.shape[2], a.shape[1],
                         data_pointer(a), operands.lda, data_pointer(b), operands.ldb, operands.stride_b,
                         data_pointer(c), operands.ldc, operands.alpha, None, 0, stream or None)


class GroupedCall:
    """The ABI struct of a grouped problem plus the arrays it points into,
    which must stay alive while the struct is used."""

    def __init__(self, operands, stream: int = 0):
        g = len(operands.a)
        self.dims = np.array([[c.shape[0], c.shape[1], a.shape[1]]
                              for a, c in zip(operands.a, operands.c)], np.int64).reshape(g, 3).T.copy()
        self.pointers = np.array([[data_pointer(x) for x in group]
                                  for group in (operands.a, operands.b, operands.c)],
                                 np.uint64).reshape(3, g)
        self.lds = [np.ascontiguousarray(x, np.int64) for x in (operands.lda, operands.ldb, operands.ldc)]
        i64, vpp = _i64p, ctypes.POINTER(_vp)
        self.args = GroupedArgs(
            g, *(self.dims[i].ctypes.data_as(i64) for i in range(3)),
            *(self.pointers[i].ctypes.data_as(vpp) for i in range(3)),
            *(ld.ctypes.data_as(i64) for ld in self.lds),
            operands.alpha, operands.beta, None, 0, stream or None)
