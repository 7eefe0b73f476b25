"""Migration from CK's legacy Tile Engine: every reference config, names, the driver."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher import errors
from dispatcher.legacy import configs, names
from dispatcher.tile_engine import sweep

CK_DATA = Path(__file__).resolve().parents[2] / "shared" / "reference" / "ck_data"
needs_ck_data = pytest.mark.skipif(not CK_DATA.is_dir(), reason="../shared/reference/ck_data not present")

# file -> (variant, kernels CK expands it to before target filtering)
EXPECTED = {
    "tile_engine__ops__gemm__gemm_streamk__configs__default_config.json": ("stream_k", 4),
    "tile_engine__ops__gemm__configs__default_ci_config.json": ("regular", 16),
    "tile_engine__ops__gemm__grouped_gemm__configs__default_ci_config.json": ("grouped", 16),
    "dispatcher__codegen__default_config.json": ("regular", 256),
    "tile_engine__ops__gemm_streamk__configs__default_config.json": ("stream_k", 106488),
}


@needs_ck_data
@pytest.mark.parametrize("filename", sorted(EXPECTED))
def test_every_reference_config_migrates(filename):
    variant, ck_kernels = EXPECTED[filename]
    raw = json.loads((CK_DATA / filename).read_text())
    m = configs.migrate(raw, target="cpu", variant=variant)
    assert m.ck_kernels == ck_kernels
    # every legacy key is accounted for: mapped or dropped with a reason
    accounted = {k.split(".")[-1].split("=")[0] for k, _ in m.mapped + m.dropped}
    legacy_keys = set(raw.get("tile_config", {})) | set(raw.get("trait_config", {})) | \
        {k for k in raw if k not in ("tile_config", "trait_config", "streamk_config")}
    assert legacy_keys <= accounted | {"tile_config", "trait_config"}, legacy_keys - accounted
    assert all(reason for _, reason in m.dropped)
    plan = sweep.expand(m.sweep, variant=variant, target="cpu", dtype="fp32", layout="rcr")
    assert plan.configs, "nothing buildable on the cpu target"


@needs_ck_data
def test_legacy_streamk_reduction_trait_and_old_token():
    raw = json.loads((CK_DATA / "tile_engine__ops__gemm_streamk__configs__default_config.json").read_text())
    m = configs.migrate(raw, target="cpu")
    assert m.variant == "stream_k"
    assert m.sweep["reduction"] == {"values": ["atomic", "linear"]}
    assert any("tree" in k for k, _ in m.dropped)
    assert any(k == "problem" and "empty" in why for k, why in m.dropped)
    old = dict(raw, trait_config=dict(raw["trait_config"], reduction_strategy={"values": ["reduction", "atomic"]}))
    assert configs.migrate(old).sweep["reduction"] == {"values": ["atomic", "linear"]}


def test_old_tile_configs_form_and_codegen_lists():
    old = {"tile_configs": {"fp16": {"rcr": [
        {"tile_m": 128, "tile_n": 128, "tile_k": 64, "warp_m": 2, "warp_n": 2, "warp_k": 1,
         "warp_tile_m": 32, "warp_tile_n": 32, "warp_tile_k": 16},
        {"tile_m": 256, "tile_n": 128, "tile_k": 32, "warp_m": 2, "warp_n": 2, "warp_k": 1,
         "warp_tile_m": 32, "warp_tile_n": 32, "warp_tile_k": 16}]}},
        "traits": {"pipelines": ["mem", "compv3"], "epilogues": ["cshuffle"], "schedulers": ["intrawave"]},
        "structured_sparsity": [False], "padding": [False], "persistent": [False],
        "reduction_strategy": ["reduction"]}
    old["trait_config"] = {"reduction_strategy": old.pop("reduction_strategy")}
    m = configs.migrate(old, dtype="fp16", layout="rcr")
    assert m.sweep["tile_m"] == {"values": [128, 256]} and m.sweep["reduction"] == {"values": ["linear"]}
    with pytest.raises(errors.ConfigError, match="no entry for bf16/rcr"):
        configs.migrate(old, dtype="bf16")


def test_unknown_legacy_keys_are_errors():
    with pytest.raises(errors.ConfigError, match="'tile_confg'"):
        configs.migrate({"tile_confg": {}})
    with pytest.raises(errors.ConfigError, match="unknown trait_config key"):
        configs.migrate({"tile_config": {"tile_m": [64], "tile_n": [64], "tile_k": [64]},
                         "trait_config": {"pipelien": {"values": ["mem"]}}})
    with pytest.raises(errors.ConfigError, match="only the tree reduction"):
        configs.migrate({"tile_config": {"tile_m": [64], "tile_n": [64], "tile_k": [64]},
                         "streamk_config": {"reduction_strategy": {"values": ["tree"]}}})


NAMES = [
    # (name, form, bridge name)
    ("benchmark_gemm_streamk_fp16_rcr_compv3_cshuffle_intrawave_atomic_False_False_False_False_256x256x32_1x4x1_16x16x16",
     "executable", "gemm_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_False_256x256x32_1x4x1_16x16x16_streamk"),
    ("benchmark_gemm_streamk_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_False_atomic_256x256x32_1x4x1_16x16x16",
     "executable", "gemm_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_False_256x256x32_1x4x1_16x16x16_streamk"),
    ("fp16_rcr_compv3_cshuffle_intrawave_reduction_True_True_True_False_128x128x64_2x2x1_32x32x16",
     "header", "gemm_fp16_rcr_compv3_cshuffle_intrawave_True_True_True_False_128x128x64_2x2x1_32x32x16_streamk_linear"),
    ("gemm_bf16_rcr_compv3_cshuffle_intrawave_False_False_False_False_tree_128x128x64_2x2x1_32x32x16",
     "list", "gemm_bf16_rcr_compv3_cshuffle_intrawave_False_False_False_False_128x128x64_2x2x1_32x32x16_streamk_tree"),
    ("gemm_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_True_64x64x64_2x2x1_16x16x32_grouped",
     "bridge", "gemm_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_True_64x64x64_2x2x1_16x16x32_grouped"),
    ("gemm_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_False_64x64x64_2x2x1_32x32x16",
     "bridge", "gemm_fp16_rcr_compv3_cshuffle_intrawave_False_False_False_False_64x64x64_2x2x1_32x32x16"),
]


@pytest.mark.parametrize("name,form,bridge", NAMES)
def test_name_forms_and_round_trip(name, form, bridge):
    k = names.parse(name)
    assert k.form == form and k.bridge_name == bridge
    assert names.parse(bridge).bridge_name == bridge  # the bridge form is a fixed point
    assert names.parse(bridge) == names.parse(bridge)


def test_names_map_to_gemm_dispatcher_configs():
    k = names.parse(NAMES[2][0])
    config = names.to_config(k, "cpu")
    assert config.variant == "stream_k" and config.variant_params["reduction"] == "linear"
    assert (config.tile_m, config.tile_n, config.tile_k) == (128, 128, 64)
    with pytest.raises(errors.ConfigError, match="tree"):
        names.to_config(names.parse(NAMES[3][0]))
    with pytest.raises(errors.ConfigError, match="three MxNxK triples"):
        names.parse("gemm_fp16_rcr_nonsense")


def test_migrate_names_cli_flags_unmappable(tmp_path):
    f = tmp_path / "names.txt"
    f.write_text("\n".join(n for n, _, _ in NAMES) + "\nnot_a_kernel\n")
    proc = subprocess.run([sys.executable, "-m", "dispatcher", "migrate", "--names", str(f)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == len(NAMES) + 1
    assert sum("UNMAPPED" in l for l in lines) == 4  # two fp16 atomic (cpu), tree, garbage


def test_legacy_driver_writes_legacy_outputs(tmp_path):
    cfg = tmp_path / "legacy.json"
    cfg.write_text(json.dumps({"tile_config": {"tile_m": {"values": [32]}, "tile_n": {"values": [64]},
                                               "tile_k": {"values": [64]}},
                               "trait_config": {"reduction_strategy": {"values": ["reduction", "atomic"]}},
                               "problem": {}}))
    proc = subprocess.run(
        [sys.executable, "-m", "dispatcher", "legacy-streamk-benchmark", "build", "--config", str(cfg),
         "--problem-sizes", "64,64,4096", "96,80,512", "--warmup", "1", "--repeat", "3", "--verify",
         "--csv", str(tmp_path / "r.csv"), "--best", str(tmp_path / "best.txt"),
         "--json", str(tmp_path / "r.json"), "--out", str(tmp_path / "new")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "DEPRECATED" in proc.stderr and "gemm-dispatcher sweep" in proc.stderr
    best = (tmp_path / "best.txt").read_text().splitlines()
    assert [l.split(":")[0] for l in best] == ["m64_n64_k4096", "m96_n80_k512"]
    assert all("TFLOPS" in l and "GB/s" in l and " ms)" in l for l in best)
    header = (tmp_path / "r.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["rocm_version", "device_name", "split_k", "m"] and "reduction_strategy" in header
    report = json.loads((tmp_path / "r.json").read_text())
    assert set(report) == {"benchmark_metadata", "performance_summary", "kernel_results", "best_kernels_by_problem"}
    assert {r["reduction_strategy"] for r in report["kernel_results"]} == {"Atomic", "Reduction"}
