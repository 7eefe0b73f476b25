"""The CLI and the procedural kernel names."""

import json
import os
import subprocess
import sys

import pytest

import dispatcher
from dispatcher.api import default_dispatcher


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "dispatcher", *args], capture_output=True,
                          text=True, timeout=600, env=os.environ)
    return proc


def test_name_is_stable_and_documented():
    config = dispatcher.KernelConfig.create(dtype="fp16", layout="rrr", tile_m=96, tile_n=128,
                                            tile_k=256)
    assert config.name == "gemm_fp16_fp16_rrr_96x128x256_cpu_mt12x32_t0"
    sk = dispatcher.KernelConfig.create(variant="stream_k", dtype="fp8_e4m3", dtype_c="bf16",
                                        tile_m=48, tile_n=64, tile_k=256)
    assert sk.name == "gemm_fp8_e4m3_bf16_rcr_48x64x256_cpu_mt12x32_t0_streamk_linear_hybrid"
    assert dispatcher.KernelConfig.create(variant="grouped").name.endswith("_grouped")
    assert dispatcher.KernelConfig.from_dict(sk.to_dict()) == sk


@pytest.mark.parametrize("variant", ["regular", "stream_k", "grouped"])
def test_built_library_reports_its_config_name(variant):
    config = dispatcher.KernelConfig.create(variant=variant, tile_m=24, tile_n=64, tile_k=32)
    assert default_dispatcher().library(config).name == config.name


def test_cli_run_verify_json():
    proc = cli("run", "--variant", "stream_k", "--m", "40", "--n", "64", "--k", "3000",
               "--dtype", "fp16", "--layout", "crr", "--verify", "--json", "--repeat", "2")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["verified"] and row["max_rel"] <= row["tolerance"]
    assert "_streamk_" in row["kernel"] and row["gflops"] > 0


def test_cli_run_grouped_and_text_output():
    proc = cli("run", "--variant", "grouped", "--groups", "128x64x64,0x64x64,5x64x64", "--verify",
               "--repeat", "2")
    assert proc.returncode == 0, proc.stderr
    assert "_grouped" in proc.stdout and "max_rel" in proc.stdout and "ok" in proc.stdout


def test_cli_run_with_config_and_bad_key():
    proc = cli("run", "--m", "30", "--n", "30", "--k", "30", "--config", "tile_m=24", "tile_n=32",
               "--verify", "--json", "--repeat", "1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kernel"].startswith("gemm_fp32_fp32_rcr_24x32x")
    bad = cli("run", "--m", "8", "--config", "tiles=3")
    assert bad.returncode == 2 and "ConfigError" in bad.stderr and "'tiles'" in bad.stderr


def test_cli_kernels_and_plugins():
    kernels = json.loads(cli("kernels", "--json").stdout)
    assert all(k["status"] == "ok" for k in kernels)
    plugins = json.loads(cli("plugins", "--json").stdout)
    assert {"regular", "grouped", "stream_k"} <= {v for p in plugins for v in p["variants"]}
