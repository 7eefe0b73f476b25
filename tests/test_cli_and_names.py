"""The CLI and the procedural kernel names."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dispatcher
from dispatcher import errors
from dispatcher.api import default_dispatcher
from dispatcher.cli import main
from dispatcher.plugins import PluginManager


def cli(*args, env=None):
    proc = subprocess.run([sys.executable, "-m", "dispatcher", *args], capture_output=True,
                          text=True, timeout=600, env=env or os.environ)
    return proc


def cli_in_process(capsys, *args) -> tuple:
    """(exit status, stdout, stderr) of `gemm-dispatcher ARGS` run in this process."""
    try:
        status = main(list(args))
    except SystemExit as e:  # argparse: usage errors and --help
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def test_name_is_stable_and_documented():
    config = dispatcher.KernelConfig.create(dtype="fp16", layout="rrr", tile_m=96, tile_n=128,
                                            tile_k=256, isa="avx2")
    assert config.name == "gemm_fp16_fp16_rrr_96x128x256_cpu_avx2_mt6x16_t0"
    sk = dispatcher.KernelConfig.create(variant="stream_k", dtype="fp8_e4m3", dtype_c="bf16",
                                        tile_m=48, tile_n=64, tile_k=256, isa="avx512")
    assert sk.name == "gemm_fp8_e4m3_bf16_rcr_48x64x256_cpu_avx512_mt12x32_t0_streamk_linear_hybrid"
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


@pytest.mark.parametrize("args, says", [
    (["run", "--m", "-5"], "argument --m: must be >= 1, got -5"),
    (["run", "--m", "0"], "argument --m: must be >= 1, got 0"),
    (["run", "--repeat", "0"], "argument --repeat: must be >= 1"),
    (["run", "--variant", "grouped", "--groups", "128x512"], "wants MxNxK[,MxNxK...]"),
    (["run", "--m", "8", "--groups", "8x8x8"], "--groups needs a grouped variant"),
    (["run", "--layout", "xyz"], "invalid choice: 'xyz' (choose from 'rcr', 'rrr', 'crr', 'ccr')"),
    (["run", "--layout", "RCR"], "invalid choice: 'RCR' (choose from 'rcr', 'rrr', 'crr', 'ccr')"),
    (["run", "--config", "{bad"], "is not valid JSON"),
    (["run", "--config", "tile_m"], "--config wants key=value"),
    (["sweep", "missing.json"], "cannot read sweep config missing.json"),
    (["sweep", "missing.json", "--kernel-timeout", "0"], "argument --kernel-timeout: must be >= 0.1"),
])
def test_cli_errors_are_one_line_with_status_2(capsys, args, says):
    status, _, err = cli_in_process(capsys, *args)
    assert status == 2 and says in err
    assert len(err.strip().splitlines()) == 1, err


def test_cli_and_api_report_an_unknown_target_alike(capsys):
    a = np.ones((2, 2), np.float32)
    with pytest.raises(errors.ConfigError) as api:
        dispatcher.gemm(a, a, target="gpu")
    status, _, err = cli_in_process(capsys, "run", "--target", "gpu")
    assert status == 2 and str(api.value) in err


def test_cli_help_shows_defaults_and_choices(capsys):
    status, out, _ = cli_in_process(capsys, "run", "--help")
    assert status == 0
    assert "(default: 1024)" in out and "(default: rcr)" in out
    assert "{rcr,rrr,crr,ccr}" in out and "{cpu,cuda}" in out


def test_legacy_streamk_benchmark_help(capsys):
    status, out, _ = cli_in_process(capsys, "legacy-streamk-benchmark", "--help")
    assert status == 0 and "--problem-sizes" in out


def test_an_unknown_plugin_name_to_disable_is_reported(monkeypatch):
    monkeypatch.setenv("DISPATCHER_DISABLE_PLUGINS", "stream_kk")
    with pytest.warns(UserWarning, match="names no installed plugin: stream_kk; installed: .*stream_k"):
        PluginManager()
    proc = cli("plugins", "--json", env={**os.environ, "DISPATCHER_DISABLE_PLUGINS": "stream_kk"})
    warning, = proc.stderr.strip().splitlines()
    assert proc.returncode == 0 and warning.startswith("gemm-dispatcher: warning: ") and "stream_kk" in warning


def test_float32_work_never_imports_ml_dtypes():
    """ml_dtypes' import alone takes about a second (0.7 on numpy 2.4): a
    process that multiplies float32 never pays it, and a bfloat16 array
    still finds its dtype once its caller imported ml_dtypes."""
    code = """
import sys, numpy as np, dispatcher
a = np.arange(12, dtype=np.float32).reshape(3, 4)
assert np.array_equal(dispatcher.gemm(a, a.T), a.astype(np.float64) @ a.T)
print("ml_dtypes" in sys.modules)
import ml_dtypes
print(dispatcher.dtypes.get(a.astype(ml_dtypes.bfloat16).dtype).token)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "bf16"]
