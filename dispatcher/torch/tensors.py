"""Torch tensors as the targets take them: the target a tensor's device
runs on, a zero-copy numpy view of a CPU tensor, and dtype mapping.

The cpu target reads numpy arrays, so a CPU tensor is handed over as a numpy
view of its storage (bf16 and fp8 have no numpy dtype inside torch: the
bytes are viewed as a same-size integer and then as the `ml_dtypes` type).
The cuda target takes torch CUDA tensors in place
(`dispatcher.targets.cuda_memory`), so they pass through untouched.
"""

from __future__ import annotations

import numpy as np
import torch

from dispatcher import dtypes
from dispatcher.errors import DtypeError, LayoutError, ProblemError
from dispatcher.targets.cuda_memory import torch_types

# Same-size integer types: numpy has them all, so torch can export their bytes.
_BYTES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
# The dtypes numpy has itself: exported directly.
_NATIVE = frozenset((torch.float32, torch.float16, torch.int8, torch.int32, torch.float64))
_NUMPY_NATIVE = frozenset(np.dtype(d) for d in (np.float32, np.float16, np.int8, np.int32, np.float64))


def token(dtype: torch.dtype) -> str:
    """The dispatcher dtype token of a torch dtype."""
    found = torch_types()[0].get(dtype)
    if found is None:
        names = {role: ", ".join(str(d) for d, (numpy, _) in torch_types()[0].items()
                                 if dtypes.get(numpy).token in tokens)
                 for role, tokens in (("inputs", dtypes.INPUT_TOKENS), ("outputs", dtypes.OUTPUT_TOKENS))}
        raise DtypeError(f"torch dtype {dtype} is not supported; inputs: {names['inputs']}; "
                         f"outputs: {names['outputs']}")
    return dtypes.get(found[0]).token


def out_dtype_of(out_dtype) -> torch.dtype | None:
    """An `out_dtype` as the ops' schema takes it (a torch dtype): a torch
    dtype, or any name `dispatcher.gemm` takes ("fp16", "bfloat16", a numpy
    dtype), or None."""
    if out_dtype is None or isinstance(out_dtype, torch.dtype):
        return out_dtype
    return torch_dtype(dtypes.get(out_dtype).token)


def torch_dtype(token_: str) -> torch.dtype:
    return torch_types()[1][dtypes.get(token_).numpy]


def output_dtype(a: torch.Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    """The result dtype of a GEMM on `a`'s dtype: `out_dtype`, or CK's rule
    (fp8 -> fp16, int8 -> int32, else the input's), as dispatcher.gemm."""
    requested = None if out_dtype is None else token(out_dtype)
    return torch_dtype(dtypes.output_for(token(a.dtype), requested).token)


def device_of(*tensors) -> torch.device:
    """The one device of these tensors (None entries skipped), or a
    ProblemError: the fake implementations ask this too, so a call mixing
    real and meta tensors is refused before anything is returned."""
    found = None
    for t in tensors:
        if t is not None:
            if found is None:
                found = t.device
            elif t.device != found:
                devices = sorted({str(x.device) for x in tensors if x is not None})
                raise ProblemError(f"operands are on different devices ({', '.join(devices)}); "
                                   "move them to one device")
    return found


def target_of(*tensors) -> str:
    """The target that runs on these tensors' device: "cpu" or "cuda"."""
    first = tensors[0]
    cuda = first is not None and first.is_cuda
    if cuda or (first is not None and first.is_cpu):  # the common case, without building device objects
        index = first.get_device()
        for t in tensors:
            if t is not None and not ((t.is_cuda and t.get_device() == index) if cuda else t.is_cpu):
                break
        else:
            return "cuda" if cuda else "cpu"
    device = device_of(*tensors)
    if device.type not in ("cpu", "cuda"):
        raise ProblemError(f"tensors on {device.type!r} are not supported; "
                           "gemm-dispatcher runs on 'cpu' and 'cuda' tensors")
    return device.type


def host_view(t: torch.Tensor | None) -> np.ndarray | None:
    """A numpy array over a CPU tensor's memory (same strides, no copy)."""
    if t is None:
        return None
    if t.dtype in _NATIVE:
        return t.detach().numpy()
    numpy_dtype = torch_types()[0].get(t.dtype, (None,))[0]
    if numpy_dtype is None:
        token(t.dtype)  # raises the DtypeError
    return t.detach().view(_BYTES[t.element_size()]).numpy().view(numpy_dtype)


def for_target(t: torch.Tensor | None, target: str):
    """`t` as the target takes it: a numpy view on cpu, the tensor on cuda;
    a negative view (torch._neg_view, whose memory holds minus its values)
    resolved into a tensor of its values first."""
    if t is not None and t.is_neg():
        t = t.resolve_neg()
    return host_view(t) if target == "cpu" else t


def readable(t: torch.Tensor) -> bool:
    """Whether the kernels can read 2-D `t` in place: row- or column-major
    with a unit inner stride (dispatcher.problem.possible_layouts' rule)."""
    rows, cols = t.shape
    s0, s1 = t.stride()
    row_major = (s1 == 1 or cols <= 1) and (s0 >= cols or rows <= 1)
    column_major = (s0 == 1 or rows <= 1) and (s1 >= rows or cols <= 1)
    return row_major or column_major


def check_readable(name: str, t: torch.Tensor):
    """A LayoutError, in torch's words, for an operand the kernels cannot
    read in place (each matrix of a 3-D one is checked alike)."""
    matrix = t[0] if t.dim() == 3 and t.shape[0] else t
    if matrix.dim() == 2 and not readable(matrix):
        raise LayoutError(f"{name} with shape {tuple(t.shape)} and strides {t.stride()} is neither row- nor "
                          f"column-major with unit inner stride; pass {name}.contiguous()")


def column_major(t: torch.Tensor) -> bool:
    """Whether 2-D `t` is column-major and not also row-major."""
    return t.stride(0) == 1 and t.stride(1) != 1 and t.shape[0] > 1


def from_host(x: np.ndarray) -> torch.Tensor:
    """A CPU tensor over a numpy array's memory (no copy); bf16 and fp8
    arrays pass through a same-size integer view, as in `host_view`."""
    if x.dtype in _NUMPY_NATIVE:
        return torch.from_numpy(x)
    dtype = torch_types()[1][np.dtype(x.dtype)]
    return torch.from_numpy(x.view(f"i{x.itemsize}")).view(dtype)


def from_target(x) -> torch.Tensor:
    """A result as a tensor: a numpy one (cpu target) wrapped, a tensor as it is."""
    return from_host(x) if isinstance(x, np.ndarray) else x
