"""Migration from CK's legacy Tile Engine: every reference config, names, the driver."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher import cli, errors
from dispatcher.config import KernelConfig
from dispatcher.legacy import configs, names
from dispatcher.plugins import get_manager
from dispatcher.targets import cpu, cpu_isa
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


def emitted_configs(migration, dtype="fp32"):
    """Every config of a migrated cpu sweep, unfiltered: `sweep.expand` drops
    those this machine cannot run, and the test must judge all of them on
    their ISA, whatever this machine is."""
    axes = list(migration.sweep)
    for combo in itertools.product(*(sweep.axis_values(a, migration.sweep[a]) for a in axes)):
        yield KernelConfig.create(variant=migration.variant, target="cpu", dtype=dtype, layout="rcr",
                                  **dict(zip(axes, combo)))


def structural_problems(config):
    """Why `config` cannot be built for its ISA on any machine that runs it."""
    reasons = (cpu.CPU.build_problem(config), get_manager().variant(config.variant).check(config))
    return [r for r in reasons if r]


@needs_ck_data
@pytest.mark.parametrize("isa", sorted(cpu_isa.ISAS))
@pytest.mark.parametrize("filename", sorted(EXPECTED))
def test_every_reference_config_migrates_for_every_isa(filename, isa):
    variant, ck_kernels = EXPECTED[filename]
    raw = json.loads((CK_DATA / filename).read_text())
    m = configs.migrate(raw, target="cpu", variant=variant, isa=isa)
    assert m.ck_kernels == ck_kernels
    # every legacy key is accounted for: mapped or dropped with a reason
    accounted = {k.split(".")[-1].split("=")[0] for k, _ in m.mapped + m.dropped}
    legacy_keys = set(raw.get("tile_config", {})) | set(raw.get("trait_config", {})) | \
        {k for k in raw if k not in ("tile_config", "trait_config", "streamk_config")}
    assert legacy_keys <= accounted | {"tile_config", "trait_config"}, legacy_keys - accounted
    assert all(reason for _, reason in m.dropped)
    assert m.sweep["isa"] == {"values": [isa]} and f"isa {isa} (as asked)" in m.report()
    emitted = list(emitted_configs(m))
    assert emitted
    for config in emitted:
        assert config.target_params["isa"] == isa
        assert structural_problems(config) == [], config.name


def test_micro_tile_is_the_isa_default_when_it_divides_else_the_largest_valid_one():
    avx512, avx2 = cpu_isa.ISAS["avx512"], cpu_isa.ISAS["avx2"]
    assert cpu.micro_tile_for(avx512, [96, 192], [64]) == (12, 32)
    assert cpu.micro_tile_for(avx512, [128, 256], [128]) == (8, 32)
    assert cpu.micro_tile_for(avx2, [128], [128]) == (4, 16)   # not 8x32: 37 registers of 16
    assert cpu.micro_tile_for(avx512, [64], [8]) is None       # narrower than one 16-lane vector


def test_migrate_assumes_the_active_isa_and_refuses_unknown_ones():
    raw = {"tile_config": {"tile_m": [128], "tile_n": [128], "tile_k": [64]}}
    m = configs.migrate(raw)
    assert m.sweep["isa"] == {"values": [cpu_isa.active().name]}
    assert f"isa {cpu_isa.active().name} (assumed: the active ISA" in m.report()
    assert "isa" not in configs.migrate(raw, target="cuda").sweep
    with pytest.raises(errors.ConfigError, match="unknown CPU ISA 'sse'"):
        configs.migrate(raw, isa="sse")
    with pytest.raises(errors.ConfigError, match="cpu target option"):
        configs.migrate(raw, target="cuda", isa="avx2")


def test_migrate_cli_isa_flag(tmp_path, capsys):
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"tile_config": {"tile_m": [128], "tile_n": [128], "tile_k": [64]}}))
    assert cli.main(["migrate", str(legacy), "--isa", "neon", "-o", str(tmp_path / "sweep.json")]) == 0
    assert "isa neon (as asked), micro_m 8, micro_n 8" in capsys.readouterr().err
    assert json.loads((tmp_path / "sweep.json").read_text())["isa"] == {"values": ["neon"]}
    with pytest.raises(SystemExit) as refused:
        cli.main(["migrate", str(legacy), "--isa", "sse"])
    assert refused.value.code == 2 and "--isa: unknown CPU ISA 'sse'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--isa is a cpu target option"):
        cli.main(["migrate", str(legacy), "--target", "cuda", "--isa", "avx2"])


@needs_ck_data
def test_legacy_streamk_reduction_trait_and_old_token():
    raw = json.loads((CK_DATA / "tile_engine__ops__gemm_streamk__configs__default_config.json").read_text())
    m = configs.migrate(raw, target="cpu")
    assert m.variant == "stream_k"
    assert m.sweep["reduction"] == {"values": ["atomic", "linear", "tree"]}
    assert not any("tree" in k for k, _ in m.dropped)
    assert any(k == "problem" and "empty" in why for k, why in m.dropped)
    old = dict(raw, trait_config=dict(raw["trait_config"], reduction_strategy={"values": ["reduction", "atomic"]}))
    assert configs.migrate(old).sweep["reduction"] == {"values": ["atomic", "linear"]}


def test_tree_reduction_migrates_to_tree():
    only_tree = {"tile_config": {"tile_m": [64], "tile_n": [64], "tile_k": [64]},
                 "streamk_config": {"reduction_strategy": {"values": ["tree"]}}}
    assert configs.migrate(only_tree).sweep["reduction"] == {"values": ["tree"]}
    # cuda's tree is split_k's: the report says which axes the sweep needs
    cuda = configs.migrate(only_tree, target="cuda")
    assert cuda.sweep["reduction"] == {"values": ["tree"]}
    assert any(old == "reduction_strategy=tree" and "decomposition=split_k" in new for old, new in cuda.mapped)


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


@pytest.mark.parametrize("isa", sorted(cpu_isa.ISAS))
def test_names_map_to_gemm_dispatcher_configs(isa):
    k = names.parse(NAMES[2][0])
    config = names.to_config(k, "cpu", isa)
    assert config.variant == "stream_k" and config.variant_params["reduction"] == "linear"
    assert (config.tile_m, config.tile_n, config.tile_k) == (128, 128, 64)
    assert f"_cpu_{isa}_mt" in config.name and structural_problems(config) == []
    tree = names.to_config(names.parse(NAMES[3][0]), "cpu", isa)
    assert tree.variant_params["reduction"] == "tree" and structural_problems(tree) == []
    with pytest.raises(errors.ConfigError, match="three MxNxK triples"):
        names.parse("gemm_fp16_rcr_nonsense")


def _names_file(tmp_path):
    f = tmp_path / "names.txt"
    f.write_text("\n".join(n for n, _, _ in NAMES) + "\nnot_a_kernel\n")
    return f


def test_migrate_names_cli_flags_unmappable(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dispatcher", "migrate", "--names", str(_names_file(tmp_path))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    header, *rows = proc.stdout.splitlines()
    assert header.startswith("#") and len(rows) == len(NAMES) + 1
    unmapped = [r.split("\t")[0] for r in rows if "\tUNMAPPED\t" in r]
    assert unmapped == ["not_a_kernel"]  # garbage, nothing else


# NAMES rows the cpu target cannot build on any ISA: fp16 stream-K with the atomic reduction
ATOMIC_FP16 = {0, 1}


@pytest.mark.parametrize("isa", sorted(cpu_isa.ISAS))
def test_migrate_names_maps_on_any_machine_and_says_what_builds_here(tmp_path, capsys, isa):
    assert cli.main(["migrate", "--names", str(_names_file(tmp_path)), "--isa", isa]) == 1  # garbage
    rows = [r.split("\t") for r in capsys.readouterr().out.splitlines()[1:]]
    not_runnable = cpu_isa.why_not_runnable(cpu_isa.get(isa))
    for i, (name, form, bridge) in enumerate(NAMES):
        got_name, got_bridge, ours, buildable = rows[i]
        assert (got_name, got_bridge) == (name, bridge) and f"_cpu_{isa}_mt" in ours
        expected = [r for r in (not_runnable, "atomic reduction" if i in ATOMIC_FP16 else None) if r]
        if expected:
            assert buildable.startswith("no: ") and all(r in buildable for r in expected), buildable
        else:
            assert buildable == "yes"


# slow (15 s: the legacy driver end to end, with builds); CI runs it in its slow step
@pytest.mark.slow
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
