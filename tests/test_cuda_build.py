"""CUDA templates compile (no GPU needed): one CUTLASS SM90 instance of each
variant with nvcc, so a template break fails CI. Skipped without nvcc or the
nvidia-cutlass headers; about a minute per instance on 2 cores."""

from concurrent.futures import ThreadPoolExecutor

import pytest

import dispatcher
from dispatcher.api import Dispatcher
from dispatcher.errors import ToolchainError
from dispatcher.targets import cuda

try:
    cuda.Toolchain.find()
    MISSING = None
except ToolchainError as e:
    MISSING = str(e)

pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}")]

CONFIGS = [
    dict(variant="regular", dtype="bf16", layout="rcr", raster="along_n", swizzle=2),
    dict(variant="stream_k", dtype="bf16", layout="rrr", reduction="linear", decomposition="stream_k"),
    # the tree reduction: a partials GEMM and a reduction kernel of our own
    dict(variant="stream_k", dtype="bf16", layout="crr", reduction="tree", decomposition="split_k", splits=5),
    dict(variant="grouped", dtype="fp16", layout="rcr", raster="along_m"),
    # the target's gemv kernel (not CUTLASS), with a bias per row and SiLU
    dict(variant="regular", dtype="fp16", layout="rcr", schedule="gemv", tile_m=4, tile_n=4, bias="row",
         activation="silu"),
]
# The batched variant (batch mode L), both CUTLASS bias fusions and the
# regular variant's hybrid decomposition: about five more minutes of nvcc on
# 2 cores, so outside the fast suite (.ci/run runs them after it:
# -m "slow and nvcc"). Each with the end its name must have.
EPILOGUE_CONFIGS = [
    (dict(variant="batched", dtype="bf16", layout="rcr", bias="col", activation="gelu"), "_batched_biascol_gelu"),
    (dict(variant="regular", dtype="fp8_e4m3", layout="rcr", bias="row", activation="relu"), "_biasrow_relu"),
    (dict(variant="regular", dtype="bf16", layout="rrr", bias="col", activation="relu", decomposition="hybrid"),
     "_biascol_relu_hybrid"),
]


def build_all(field_sets):
    d = Dispatcher()
    configs = [dispatcher.KernelConfig.create(**{"target": "cuda", "tile_m": 128, "tile_n": 128,
                                                 "tile_k": 128 // dispatcher.dtypes.get(f["dtype"]).itemsize,
                                                 "cluster_m": 1, **f}) for f in field_sets]
    with ThreadPoolExecutor(2) as pool:
        return list(zip(configs, pool.map(lambda c: d.build(d.codegen(c)), configs)))


@pytest.fixture(scope="module")
def built():
    return build_all(CONFIGS)


def test_each_variant_compiles_and_exports_its_abi(built):
    expected = {"regular": {"dispatcher_run_gemm", "dispatcher_registry"},
                "stream_k": {"dispatcher_run_gemm", "dispatcher_workspace_size"},
                "grouped": {"dispatcher_run_grouped_gemm", "dispatcher_grouped_workspace_size",
                            "dispatcher_run_grouped_mm", "dispatcher_grouped_mm_workspace_size"}}
    for config, lib in built:
        symbols = _exported_symbols(lib.path)
        assert expected[config.variant] <= symbols, (config.name, symbols)
        if config.target_params["schedule"] == "gemv":
            assert "dispatcher_workspace_size" in symbols and config.name.endswith("_gemv_sauto_biasrow_silu")
        assert {"dispatcher_abi_version", "dispatcher_kernel_name", "dispatcher_last_error"} <= symbols
        assert lib.name == config.name


@pytest.mark.slow
def test_batched_fused_epilogue_and_hybrid_instances_compile():
    built = build_all([fields for fields, _ in EPILOGUE_CONFIGS])
    for (config, lib), (_, suffix) in zip(built, EPILOGUE_CONFIGS):
        assert {"dispatcher_run_gemm", "dispatcher_abi_version"} <= _exported_symbols(lib.path)
        assert lib.name == config.name and config.name.endswith(suffix), config.name


def _exported_symbols(path):
    import subprocess
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}
