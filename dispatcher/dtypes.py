"""The one dtype table: token, numpy type, accumulator and default output.

Every other module asks this table; no other module spells a dtype rule.
bfloat16 and the 8-bit floats come from ml_dtypes, the latter in both OCP
(`float8_e4m3fn`, `float8_e5m2`) and FNUZ (`float8_e4m3fnuz`, `float8_e5m2fnuz`)
encodings. ml_dtypes is imported the first time one of its types is needed,
not with this module: its import alone takes about a second (ml_dtypes 0.7
on numpy 2.4), which every fp32 call, CLI command and sweep worker process
would otherwise pay.
"""

from __future__ import annotations

import functools
import importlib

import attrs
import numpy as np

from .errors import DtypeError


# The types ml_dtypes provides, by their numpy names.
_ML_DTYPES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})


@functools.cache
def _numpy_dtype(name: str) -> np.dtype:
    if name in _ML_DTYPES:
        return np.dtype(getattr(importlib.import_module("ml_dtypes"), name))
    return np.dtype(name)


@attrs.frozen
class DType:
    token: str            # the name used in configs and kernel names
    numpy_name: str       # its numpy dtype's name
    itemsize: int
    acc: str              # accumulator token
    default_out: str      # output token when the caller does not ask
    outputs: tuple        # output tokens a kernel may write
    is_float8: bool = False

    @property
    def numpy(self) -> np.dtype:
        return _numpy_dtype(self.numpy_name)


_FLOAT_OUT = ("fp32", "fp16", "bf16")

TABLE: dict[str, DType] = {
    d.token: d
    for d in (
        DType("fp32", "float32", 4, "fp32", "fp32", _FLOAT_OUT),
        DType("fp16", "float16", 2, "fp32", "fp16", _FLOAT_OUT),
        DType("bf16", "bfloat16", 2, "fp32", "bf16", _FLOAT_OUT),
        DType("fp8_e4m3", "float8_e4m3fn", 1, "fp32", "fp16", _FLOAT_OUT, True),
        DType("fp8_e5m2", "float8_e5m2", 1, "fp32", "fp16", _FLOAT_OUT, True),
        DType("fp8_e4m3fnuz", "float8_e4m3fnuz", 1, "fp32", "fp16", _FLOAT_OUT, True),
        DType("fp8_e5m2fnuz", "float8_e5m2fnuz", 1, "fp32", "fp16", _FLOAT_OUT, True),
        DType("int8", "int8", 1, "int32", "int32", ("int32",)),
        DType("int32", "int32", 4, "int32", "int32", ("int32",)),
    )
}

INPUT_TOKENS = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz", "int8")
OUTPUT_TOKENS = tuple(dict.fromkeys(out for d in TABLE.values() for out in d.outputs))

# Aliases users type: numpy names and CK's short tokens.
_ALIASES = {
    "float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
    "float8_e4m3fnuz": "fp8_e4m3fnuz", "float8_e5m2fnuz": "fp8_e5m2fnuz",
    "fp8": "fp8_e4m3", "bf8": "fp8_e5m2",
}


# numpy dtype -> DType, filled as dtypes are met (so that a float32 array
# never imports ml_dtypes): one dict lookup on a warm call.
_BY_NUMPY = {d.numpy: d for d in TABLE.values() if d.numpy_name not in _ML_DTYPES}
_BY_NAME = {d.numpy_name: d for d in TABLE.values()}


def _of_numpy(np_dtype: np.dtype):
    """The DType of a numpy dtype, or None (an ml_dtypes type is compared
    with ml_dtypes' own, not only by name: another library may name one alike)."""
    found = _BY_NAME.get(np_dtype.name)
    if found is None or found.numpy != np_dtype:
        return None
    _BY_NUMPY[np_dtype] = found
    return found


SUPPORTED = f"inputs: {', '.join(INPUT_TOKENS)}; outputs: {', '.join(OUTPUT_TOKENS)}"


def get(spec) -> DType:
    """A DType from a token, an alias, a numpy dtype or a torch dtype (by
    its name: torch is not imported here)."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, np.dtype):
        found = _BY_NUMPY.get(spec) or _of_numpy(spec)
    else:
        found = TABLE.get(spec) if spec.__hash__ else None
    if found is not None:
        return found
    if type(spec).__module__ == "torch" and type(spec).__name__ == "dtype":
        spec = str(spec).removeprefix("torch.")
    if isinstance(spec, str) and _ALIASES.get(spec, spec) in TABLE:
        return TABLE[_ALIASES.get(spec, spec)]
    try:
        np_dtype = np.dtype(spec)
    except TypeError:
        raise DtypeError(f"unknown dtype {spec!r}; {SUPPORTED}") from None
    found = _of_numpy(np_dtype)
    if found is not None:
        return found
    raise DtypeError(f"dtype {np_dtype} is not supported; {SUPPORTED}")


def output_for(input_token: str, requested=None) -> DType:
    """The output dtype of a GEMM on `input_token` inputs (CK's rule unless
    the caller asks for another supported one)."""
    src = get(input_token)
    if requested is None:
        return get(src.default_out)
    out = get(requested)
    if out.token not in src.outputs:
        raise DtypeError(
            f"output dtype {out.token!r} is not supported for {src.token} inputs; "
            f"choose one of {', '.join(src.outputs)}")
    return out


def float8_decode_table(token: str) -> list[float]:
    """The float32 value of each of the 256 bit patterns of an 8-bit float."""
    d = get(token)
    if not d.is_float8:
        raise DtypeError(f"{token} is not an 8-bit float")
    return np.arange(256, dtype=np.uint8).view(d.numpy).astype(np.float32).tolist()


def relative_tolerance(out_token: str, k: int, splits: int = 1) -> float:
    """A bound for max|out-ref|/max|ref| of a GEMM writing `out_token`,
    against a float64 reference computed on the same quantized inputs.

    Inputs are exact in the compute type, so the error is float32
    accumulation (grows ~sqrt(K) per partial sum and with the number of
    partial sums) plus one rounding to the output dtype. Integer GEMMs are exact.
    """
    out = get(out_token)
    if out.acc == "int32":
        return 0.0
    rounding = {"fp32": 2.0**-23, "fp16": 2.0**-10, "bf16": 2.0**-7}[out.token]
    accumulation = 2.0**-23 * 4 * np.sqrt(max(k, 1)) * max(splits, 1)
    return float(4 * rounding + accumulation)
