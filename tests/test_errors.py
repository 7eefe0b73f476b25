"""Bad input gets a specific exception: never a crash, a hang or a wrong answer."""

import ctypes.util

import ml_dtypes
import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes, environ, errors
from dispatcher.api import default_dispatcher
from dispatcher.library import gemm_args
from dispatcher.kinds import prepare_gemm
from dispatcher.targets import cpu_isa
from dispatcher.targets.cpu import Toolchain

ACTIVE_ISA = cpu_isa.active().name

SMALL = dict(tile_m=24, tile_n=64, tile_k=32)


def f32(*shape):
    return np.ones(shape, np.float32)


def test_mismatched_k():
    with pytest.raises(errors.ProblemError, match="K 4 != 5"):
        dispatcher.gemm(f32(3, 4), f32(5, 6))


def test_unsupported_dtype():
    """The message lists the dtypes really accepted: int32 as an output, never as an input."""
    with pytest.raises(errors.DtypeError, match="float64") as info:
        dispatcher.gemm(np.ones((3, 4)), np.ones((4, 5)))
    inputs, outputs = str(info.value).split("inputs: ")[1].split("; outputs: ")
    assert inputs.split(", ") == list(dtypes.INPUT_TOKENS) and "int32" not in inputs
    assert outputs.split(", ") == ["fp32", "fp16", "bf16", "int32"]


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), (" YES ", True), ("On", True),
                                       ("0", False), ("false", False), ("no", False), ("OFF", False),
                                       ("", False), (None, False)])
def test_boolean_environment_values(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("DISPATCHER_AUTOTUNE", raising=False)
    else:
        monkeypatch.setenv("DISPATCHER_AUTOTUNE", value)
    assert environ.flag("DISPATCHER_AUTOTUNE") is on


@pytest.mark.parametrize("value", ["maybe", "2", "-1", "y", "enabled"])
def test_boolean_environment_refuses_other_values(monkeypatch, value):
    monkeypatch.setenv("DISPATCHER_AUTOTUNE", value)
    with pytest.raises(errors.ConfigError, match=f"DISPATCHER_AUTOTUNE='{value}' is not a boolean"):
        environ.flag("DISPATCHER_AUTOTUNE")


def test_every_boolean_environment_variable_goes_through_one_helper():
    """No module reads a DISPATCHER_ switch with its own rule: every
    os.environ read of a variable documented as a switch is environ.flag's."""
    import pathlib
    import re
    root = pathlib.Path(dispatcher.__file__).parent
    doc = (root.parent / "docs" / "reference.md").read_text()
    switches = set(re.findall(r"`(DISPATCHER_[A-Z_]+)=1`", doc))
    assert switches == {"DISPATCHER_AUTOTUNE", "DISPATCHER_TRACE_PLUGINS", "DISPATCHER_NO_NATIVE_CALLS"}
    for path in root.rglob("*.py"):
        for name in switches:
            assert not re.search(rf"(os\.environ|getenv)[^\n]*{name}", path.read_text()), (path, name)


def test_mixed_input_dtypes():
    with pytest.raises(errors.DtypeError, match="one dtype"):
        dispatcher.gemm(f32(3, 4), np.ones((4, 5), ml_dtypes.bfloat16))


def test_not_two_dimensional():
    with pytest.raises(errors.ProblemError, match="2-D"):
        dispatcher.gemm(f32(3, 4, 1), f32(4, 5))
    with pytest.raises(errors.ProblemError, match="numpy array"):
        dispatcher.gemm([[1.0]], f32(1, 1))


def test_negative_strides():
    with pytest.raises(errors.LayoutError, match="negative strides"):
        dispatcher.gemm(f32(3, 4)[::-1], f32(4, 5))


def test_non_unit_inner_stride():
    with pytest.raises(errors.LayoutError, match="unit inner stride"):
        dispatcher.gemm(f32(3, 8)[:, ::2], f32(4, 5))


def test_output_aliasing_inputs():
    a = f32(4, 4)
    with pytest.raises(errors.AliasingError, match="out overlaps a"):
        dispatcher.gemm(a, f32(4, 4), out=a)
    with pytest.raises(errors.AliasingError, match="c overlaps b"):
        b = f32(4, 4)
        dispatcher.gemm(f32(4, 4), b, c=b, beta=1.0)


def test_output_shape_and_dtype():
    with pytest.raises(errors.ProblemError, match="expected"):
        dispatcher.gemm(f32(3, 4), f32(4, 5), out=f32(5, 3))
    with pytest.raises(errors.DtypeError, match="output dtype"):
        dispatcher.gemm(f32(3, 4), f32(4, 5), out=np.ones((3, 5), np.float16), out_dtype="fp32")
    with pytest.raises(errors.DtypeError, match="not supported for int8"):
        dispatcher.gemm(np.ones((3, 4), np.int8), np.ones((4, 5), np.int8), out_dtype="fp16")


def test_beta_without_c():
    with pytest.raises(errors.ProblemError, match="beta"):
        dispatcher.gemm(f32(3, 4), f32(4, 5), beta=1.0)


def test_unknown_config_key_is_named():
    with pytest.raises(errors.ConfigError, match="'tile_q'"):
        dispatcher.gemm(f32(3, 4), f32(4, 5), config=dict(tile_q=3))
    with pytest.raises(errors.ConfigError, match="'cluster_m'"):  # the cuda target's, on the cpu
        dispatcher.KernelConfig.create(variant="regular", target="cpu", cluster_m=2)


def test_invalid_config_values_name_the_allowed_ones():
    with pytest.raises(errors.ConfigError, match=r"'micro_n' = 70 is out of range \[4, 64\]"):
        dispatcher.KernelConfig.create(micro_n=70)
    with pytest.raises(errors.ConfigError, match="'isa' = 'sse9' is invalid: unknown CPU ISA 'sse9'; "
                                                 "choose one of avx512, avx2"):
        dispatcher.KernelConfig.create(isa="sse9")
    with pytest.raises(errors.ConfigError, match="tile_m must be a positive integer"):
        dispatcher.KernelConfig.create(tile_m=0)
    with pytest.raises(errors.ConfigError, match="layout 'rxr'"):
        dispatcher.KernelConfig.create(layout="rxr")
    with pytest.raises(errors.ConfigError, match="allowed: atomic, linear|'fancy'"):
        dispatcher.KernelConfig.create(variant="stream_k", reduction="fancy")
    with pytest.raises(errors.ConfigError, match="not a multiple of the micro-tile"):
        default_dispatcher().codegen(dispatcher.KernelConfig.create(tile_m=25))


def test_config_for_another_problem():
    config = dispatcher.KernelConfig.create(layout="rrr", **SMALL)
    with pytest.raises(errors.ConfigError, match="layout 'rrr' but the problem needs 'rcr'"):
        dispatcher.gemm(f32(3, 4), np.asfortranarray(f32(4, 5)), config=config)


def test_unknown_variant():
    with pytest.raises(errors.PluginError, match="no plugin provides variant 'nope'"):
        dispatcher.gemm(f32(3, 4), f32(4, 5), variant="nope")


def test_kernel_runtime_failure_carries_library_message():
    a, b = f32(8, 8), f32(8, 8)
    problem, ops, _ = prepare_gemm(a, b)
    d = default_dispatcher()
    lib = d.library(d.config_matching(problem, SMALL))
    args = gemm_args(ops)
    args.lda = 2  # smaller than K
    with pytest.raises(errors.KernelError, match="leading dimension smaller"):
        lib.run_gemm(args)
    args = gemm_args(ops)
    args.a = None
    with pytest.raises(errors.KernelError, match="null operand pointer"):
        lib.run_gemm(args)


def test_missing_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.setenv("PATH", "/nonexistent")
    Toolchain.find.cache_clear()
    try:
        with pytest.raises(errors.ToolchainError, match="no C\\+\\+ compiler for ISA"):
            Toolchain.find(ACTIVE_ISA)
    finally:
        Toolchain.find.cache_clear()


def test_compiler_error_is_reported(tmp_path):
    from dispatcher.build import BuildCache, GeneratedSource

    cache = BuildCache(tmp_path / "c")
    config = dispatcher.KernelConfig.create(**SMALL)
    source = GeneratedSource(config, (("broken.cpp", "this is not C++;"),))
    with pytest.raises(errors.BuildError, match="compilation of broken.cpp failed") as info:
        cache.build(source, Toolchain.find(ACTIVE_ISA))
    assert "error" in info.value.log
    assert not any((tmp_path / "c" / "kernels").iterdir()), "a failed build left an entry"
    assert not any((tmp_path / "c" / "tmp").iterdir()), "a failed build left its staging dir"


def test_library_that_is_not_ours(tmp_path):
    from dispatcher.library import Library
    with pytest.raises(errors.LibraryError, match="cannot load"):
        Library(tmp_path / "missing.so")
    with pytest.raises(errors.LibraryError, match="not a gemm-dispatcher library"):
        Library(ctypes.util.find_library("m") or "libm.so.6")
