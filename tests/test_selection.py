"""Selection without a sweep: ranking, `explain`, the status -2 fallback
chain and autotune (CPU target; the cuda ranking runs without a GPU)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dispatcher
from dispatcher import errors, targets
from dispatcher.api import Dispatcher
from dispatcher.dispatch import AUTOTUNE_TOP_K
from dispatcher.plugins import PluginManager
from dispatcher.kinds import prepare_gemm
from dispatcher.problem import GemmProblem
from dispatcher.targets import cuda_model
from dispatcher.tuning import TuningDatabase
from dispatcher.verify import max_rel, poison, random_matrix, reference

HERE = Path(__file__).parent


def explain(*args):
    out = subprocess.run([sys.executable, "-m", "dispatcher", "explain", *args, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


needs_model = pytest.mark.skipif(not cuda_model.available(), reason="nvidia-matmul-heuristics is not installed")


@needs_model
def test_explain_ranks_the_cuda_catalog_without_a_gpu():
    # fp16 stream_k: no shipped times decide it (they are bf16's), so the model's ranking chooses
    found = explain("--target", "cuda", "--dtype", "fp16", "--m", "64", "--n", "1024", "--k", "32768",
                    "--variant", "stream_k")
    assert found["tuned"] is None
    ranked = found["ranked"]
    assert len(ranked) >= 4 and found["chosen"] == ranked[0]["kernel"]
    modelled = [r["estimate"] for r in ranked if r["model"].startswith("nvidia-matmul-heuristics")]
    assert len(modelled) >= 4 and [r["estimate"] for r in ranked[:len(modelled)]] == sorted(modelled)
    # few output tiles, very long K: the model wants the K dimension split
    assert "split_k" in ranked[0]["kernel"]
    assert explain("--target", "cuda", "--dtype", "fp16", "--m", "64", "--n", "1024", "--k", "32768",
                   "--variant", "stream_k") == found  # deterministic


@needs_model
def test_explain_skinny_and_large_problems_choose_different_tiles():
    skinny = explain("--target", "cuda", "--dtype", "bf16", "--m", "16", "--n", "8192", "--k", "7168")
    large = explain("--target", "cuda", "--dtype", "bf16", "--m", "8192", "--n", "8192", "--k", "8192")
    assert skinny["chosen"] != large["chosen"]
    assert "_64x" in skinny["chosen"]  # a 64-row tile for M = 16


def test_the_fp8_catalogs_leave_out_tiles_whose_two_accumulators_spill():
    """fp8 kernels hold a second fp32 accumulator per warp group: the
    catalogs keep tiles of at most 64x192 per consumer warp group for fp8
    (128x192 cooperative, 64x192 ping-pong) in every variant, and bf16
    keeps its large tiles."""
    for variant in ("regular", "stream_k", "grouped", "batched"):
        fp8 = Dispatcher(tuning=None).candidates(GemmProblem(1, 1, 1, "fp8_e4m3", "fp16", "rcr", variant, "cuda"))
        bf16 = Dispatcher(tuning=None).candidates(GemmProblem(1, 1, 1, "bf16", "bf16", "rcr", variant, "cuda"))
        assert fp8 and all(c.tile_m * c.tile_n <= (128 * 192 if c.target_params["schedule"] == "cooperative"
                                                    else 64 * 192) for c in fp8), [c.name for c in fp8]
        assert any(c.tile_m * c.tile_n > 128 * 192 for c in bf16), variant
    assert targets.cuda.fp8_fits(dict(tile_m=128, tile_n=192, schedule="cooperative"))
    assert not targets.cuda.fp8_fits(dict(tile_m=128, tile_n=256, schedule="cooperative"))
    assert targets.cuda.fp8_fits(dict(tile_m=64, tile_n=192, schedule="pingpong"))
    assert not targets.cuda.fp8_fits(dict(tile_m=64, tile_n=256, schedule="pingpong"))


def test_a_cuda_configs_raster_order_is_in_its_name_source_and_model_estimate():
    """along_m / along_n are named (`_rm`, `_rn`), compiled in as
    dcuda::schedule's kRaster and given to the model as its CTA order; the
    default keeps the names, source and estimates kernels had; any other
    value is a ConfigError naming the choices."""
    def config(**raster):
        return dispatcher.KernelConfig.create(target="cuda", dtype="bf16", layout="rcr", tile_m=128, tile_n=256,
                                              tile_k=64, **raster)
    default, along_m, along_n = config(), config(raster="along_m"), config(raster="along_n")
    assert default.name.endswith("_c2x1_coop_sauto") and along_m.name == default.name + "_rm" \
        and along_n.name == default.name + "_rn"
    d = Dispatcher()
    for c, value in ((default, 0), (along_m, 1), (along_n, 2)):
        assert f"static constexpr int kRaster = {value};" in d.codegen(c).files[0][1]
    with pytest.raises(dispatcher.ConfigError, match="along_m"):
        config(raster="hilbert")
    if cuda_model.available():  # the default is CUTLASS's rule: along N for a tall C, along M for a wide one
        for m, n, same in ((16384, 1024, 2), (1024, 16384, 1)):
            problem = GemmProblem(m, n, 4096, "bf16", "bf16", "rcr", "regular", "cuda")
            estimates = [targets.get("cuda").model_estimate(problem, c, 1) for c in (default, along_m, along_n)]
            assert estimates[0] == estimates[same] and estimates[1] != estimates[2], (m, n, estimates)


def test_the_gemv_schedule_is_checked_named_and_ranked_by_its_bandwidth_estimate():
    """The cuda target's kernel for M or N up to 4: its configs (4x4 tiles,
    no clusters, rcr, fp16/bf16, variants whose template implements it) are
    refused otherwise with the reason; its estimate is the bytes it streams
    (infinite where both M and N exceed 4), which explain names, and it
    ranks first for a matrix times a vector."""
    from dispatcher.targets import cuda
    def gemv(**kw):
        fields = dict(target="cuda", dtype="bf16", layout="rcr", tile_m=4, tile_n=4, tile_k=64, cluster_m=1,
                      schedule="gemv")
        return dispatcher.KernelConfig.create(**{**fields, **kw})
    assert gemv().name == "gemm_bf16_bf16_rcr_4x4x64_cuda_c1x1_gemv_sauto" and gemv().problems() == []
    for kw, reason in ((dict(layout="rrr"), "layout rcr"), (dict(dtype="fp8_e4m3", tile_k=128), "fp16 and bf16"),
                       (dict(tile_n=64), "4x4"), (dict(cluster_n=2), "no clusters"),
                       (dict(variant="stream_k"), "has no gemv kernel"), (dict(variant="batched"), "no gemv")):
        assert any(reason in p for p in gemv(**kw).problems()), (kw, gemv(**kw).problems())
    assert "#define DCUDA_GEMV 1" in Dispatcher().codegen(gemv()).files[0][1]
    assert cuda.gemv_estimate_us(5, 5, 4096, gemv()) == math.inf
    # M = 3: the big operand (N x K bf16) and C once from HBM, the small one once per block of 4 rows from L2
    assert cuda.gemv_estimate_us(3, 2048, 8192, gemv()) == pytest.approx(
        (2048 * 8192 * 2 + 3 * 2048 * 2) / cuda.GEMV_BYTES_PER_US + 512 * 3 * 8192 * 2 / cuda.GEMV_L2_BYTES_PER_US
        + cuda.GEMV_LAUNCH_US)
    assert cuda.gemv_estimate_us(2047, 1, 4096, gemv()) == cuda.gemv_estimate_us(1, 2047, 4096, gemv())
    if cuda_model.available():
        found = explain("--target", "cuda", "--dtype", "bf16", "--m", "2047", "--n", "1", "--k", "4096")
        assert found["chosen"] == found["ranked"][0]["kernel"] == gemv().name
        assert found["ranked"][0]["model"] == cuda.GEMV_MODEL
        assert all(r["model"] != cuda.GEMV_MODEL for r in found["ranked"][1:])
        wide = explain("--target", "cuda", "--dtype", "bf16", "--m", "512", "--n", "512", "--k", "512")
        assert wide["ranked"][-1]["kernel"] == gemv().name  # it cannot run it: last


def test_a_kernel_that_cannot_run_a_problem_ranks_after_every_other(monkeypatch):
    """The gemv kernel's infinite estimate on a wide problem ranks it last
    even where NVIDIA's model knows no config (all of them on the occupancy
    model's tier)."""
    from dispatcher import selection
    from dispatcher.plugins import get_manager
    monkeypatch.setattr(cuda_model, "estimate_us", lambda *args, **kw: None)
    problem = GemmProblem(4096, 4096, 4096, "bf16", "bf16", "rcr", "regular", "cuda")
    d = Dispatcher()
    candidates, _ = d.default_configs(problem)
    ranked = selection.rank(problem, candidates, get_manager().variant("regular"))
    assert ranked[-1].config.target_params["schedule"] == "gemv" and math.isinf(ranked[-1].value)
    assert all(e.tier == 1 for e in ranked[:-1])


def test_explain_gives_the_reason_for_each_rejected_config():
    found = explain("--target", "cuda", "--dtype", "fp8_e4m3", "--layout", "rrr", "--m", "64", "--n", "64",
                    "--k", "64")
    assert found["chosen"] is None and not found["ranked"]
    assert found["rejected"] and all("K-major" in r["reason"] for r in found["rejected"])


def test_explain_on_cpu_uses_the_occupancy_model_and_matches_selection():
    found = explain("--m", "300", "--n", "500", "--k", "200", "--layout", "rrr")
    assert found["ranked"][0]["model"].startswith("occupancy")
    a, b = np.ones((300, 200), np.float32), np.ones((200, 500), np.float32)
    problem = prepare_gemm(a, b)[0]
    assert Dispatcher(tuning=None).select(problem).name == found["chosen"]


def test_explain_refuses_bad_input_in_one_line():
    out = subprocess.run([sys.executable, "-m", "dispatcher", "explain", "--m", "8", "--n", "8", "--k", "8",
                          "--variant", "nope"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no plugin provides variant 'nope'" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture
def faulty_dispatcher():
    """A Dispatcher whose process-wide manager also has the test plugin
    `faulty` (configs are checked against the process-wide manager)."""
    from dispatcher.plugins import get_manager, reset_manager
    sys.path.insert(0, str(HERE / "plugins"))
    try:
        from faulty_gemm import plugin
    finally:
        sys.path.pop(0)
    previous = get_manager()
    manager = PluginManager()
    manager.register(plugin, "faulty_gemm_test")
    reset_manager(manager)
    yield Dispatcher(tuning=None, manager=manager)
    reset_manager(previous)


def test_status_minus_two_falls_back_to_the_next_ranked_kernel(faulty_dispatcher, rng):
    d = faulty_dispatcher
    a, b = random_matrix(40, 30, "fp32", "r", rng), random_matrix(30, 50, "fp32", "r", rng)
    problem, operands, result = prepare_gemm(a, b, variant="faulty")
    ranked = [e.config.variant_params["behaviour"] for e in d.ranked(problem)]
    assert ranked == ["unsupported", "ok"]
    with pytest.raises(errors.UnsupportedProblem, match="runs no problem"):
        d.run_or_fall_back(problem, operands, strict=True)
    poison(result)
    ran_problem, ran = d.run_or_fall_back(problem, operands)
    assert ran.variant_params["behaviour"] == "ok"
    assert max_rel(result, reference(a, b)) <= 1e-5
    assert d.select(problem) == ran  # later calls of the problem go straight to the kernel that ran


def test_autotune_times_the_top_candidates_and_stores_the_winner(tmp_path, rng):
    tuning = TuningDatabase(tmp_path / "tuning.sqlite")
    d = Dispatcher(tuning=tuning)
    a, b = random_matrix(130, 70, "fp32", "r", rng), random_matrix(70, 90, "fp32", "c", rng)
    out = poison(np.empty((130, 90), np.float32))
    c = poison(np.empty((130, 90), np.float32))
    c[...] = 1.0
    dispatcher.gemm(a, b, c=c, out=out, beta=0.5, autotune=True, dispatcher=d)
    assert max_rel(out, reference(a, b, c, beta=0.5)) <= 1e-5  # autotune never touched C or out
    assert len(d.autotune_log) == 1
    entry = d.autotune_log[0]
    assert len(entry["times"]) == min(AUTOTUNE_TOP_K, len(d.ranked(prepare_gemm(a, b)[0]))) and entry["seconds"] > 0
    problem = prepare_gemm(a, b)[0]
    assert tuning.has(problem) and d.select(problem).name == entry["winner"]
    # a second process (a fresh Dispatcher) uses the stored winner and does not tune again
    again = Dispatcher(tuning=tuning)
    dispatcher.gemm(a, b, autotune=True, dispatcher=again)
    assert again.autotune_log == [] and again.select(problem).name == entry["winner"]


def test_autotune_keeps_the_default_unless_another_wins_by_more_than_the_noise():
    from dispatcher.dispatch import AUTOTUNE_MARGIN, autotune_winner
    from dispatcher.timing import spread

    default, near, far, noisy = (dispatcher.KernelConfig.create(dtype="fp32", tile_m=m, tile_n=64, tile_k=64)
                                 for m in (48, 96, 144, 192))
    steady = lambda t: [t] * 25  # noqa: E731 - timings with no spread
    assert autotune_winner(default, {default: steady(1.0), near: steady(1.0 - AUTOTUNE_MARGIN / 2)}) == default
    assert autotune_winner(default, {default: steady(1.0), near: steady(0.97), far: steady(0.9)}) == far
    # a candidate whose own timings spread by 10% must beat the default by more than that
    wobbly = [0.85] * 8 + [0.92] * 9 + [1.05] * 8
    assert spread(wobbly) > 0.05
    assert autotune_winner(default, {default: steady(1.0), noisy: wobbly}) == default
    assert autotune_winner(default, {default: steady(1.0), noisy: [x * 0.8 for x in wobbly]}) == noisy
    # the default could not run: the fastest of the rest
    assert autotune_winner(default, {near: steady(1.0), far: steady(0.9)}) == far
    assert autotune_winner(default, {}) is None


def test_autotune_records_the_default_and_every_spread(tmp_path, rng, monkeypatch):
    """A measured tie (every candidate within the margin) keeps the default
    selection, and the tuning database stores it."""
    from dispatcher import targets

    d = Dispatcher(tuning=TuningDatabase(tmp_path / "tuning.sqlite"))
    a, b = random_matrix(130, 70, "fp32", "r", rng), random_matrix(70, 90, "fp32", "r", rng)
    problem = prepare_gemm(a, b)[0]
    default = d.select(problem)
    ties = iter(range(1000))
    monkeypatch.setattr(type(targets.get("cpu")), "measure",
                        lambda self, fn, options, stream=0: [(fn(0), 1.0 - 0.001 * (next(ties) % 7))[1]] * 5)
    winner, times, _ = d.autotune(problem, prepare_gemm(a, b)[1])
    assert winner == default and len(times) >= 2
    entry = d.autotune_log[0]
    assert entry["default"] == default.name and set(entry["spreads"]) == set(entry["times"])
    assert Dispatcher(tuning=d.tuning).select(problem) == default


def test_autotune_is_off_by_default_and_on_with_the_environment(tmp_path, monkeypatch, rng):
    a, b = random_matrix(33, 20, "fp32", "r", rng), random_matrix(20, 17, "fp32", "r", rng)
    d = Dispatcher(tuning=TuningDatabase(tmp_path / "t.sqlite"))
    dispatcher.gemm(a, b, dispatcher=d)
    assert d.autotune_log == []
    monkeypatch.setenv("DISPATCHER_AUTOTUNE", "1")
    d = Dispatcher(tuning=TuningDatabase(tmp_path / "t2.sqlite"))
    assert max_rel(dispatcher.gemm(a, b, dispatcher=d), reference(a, b)) <= 1e-5
    assert len(d.autotune_log) == 1


def test_prebuild_builds_the_catalog(tmp_path):
    import os
    env = {**os.environ, "DISPATCHER_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "dispatcher", "prebuild", "--variant", "grouped",
                          "--dtype", "fp32", "--quiet"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert "2 built or already cached, 0 failed" in out.stdout
    listed = subprocess.run([sys.executable, "-m", "dispatcher", "kernels", "--json"], capture_output=True,
                            text=True, timeout=60, env=env)
    names = {e.get("name") for e in json.loads(listed.stdout)}
    assert len([n for n in names if n and n.endswith("_grouped")]) == 2


def test_declared_kind_problems_have_a_tuning_key(tmp_path, rng):
    """A tuning database that exists is asked for every kind of problem,
    batched (declared operands) included."""
    tuning = TuningDatabase(tmp_path / "tuning.sqlite")
    a, b = random_matrix(16, 8, "fp32", "r", rng), random_matrix(8, 12, "fp32", "r", rng)
    d = Dispatcher(tuning=tuning)
    problem = prepare_gemm(a, b)[0]
    tuning.record(problem, d.select(problem), 1.0)  # the file now exists
    x, w = np.stack([a, a, a]), np.stack([b, b, b])
    out = dispatcher.matmul(x, w, dispatcher=d)
    assert max_rel(out, np.stack([reference(a, b)] * 3)) <= 1e-5


def test_the_occupancy_model_counts_the_rows_a_skinny_problem_computes(rng):
    """On the cpu a tile larger than the problem computes only the
    micro-tiles that cover it: for M = 16 an 8-row micro-tile wastes no
    row and a 12-row one 8 of 24, so the skinny default (64x192, 8-row
    micro-tile on avx512) ranks first, where counting whole tiles ranked
    48x512 first (0.88x OpenBLAS against 1.19x for 64x192 on a 2-core
    Xeon: benchmarks/results/cpu_gemm_spr_2core_fp32_skinny.json)."""
    from dispatcher import targets
    from dispatcher.selection import estimated_cost
    d = Dispatcher(tuning=None)
    a, b = np.zeros((16, 4096), np.float32), np.zeros((4096, 4096), np.float32)
    problem = prepare_gemm(a, b)[0]
    configs = {(c.tile_m, c.tile_n): c for c in d.candidates(problem)}
    cpu = targets.get("cpu")
    for (tm, tn), c in configs.items():
        rows, columns = cpu.computed_tile(problem, c)
        micro_m = c.target_params["micro_m"]
        assert rows == min(tm, -(-16 // micro_m) * micro_m) and columns == tn
    if cpu.computed_tile(problem, configs[64, 192])[0] == 16 and configs[48, 512].target_params["micro_m"] == 12:
        assert estimated_cost(problem, configs[64, 192]) < estimated_cost(problem, configs[48, 512])
        assert d.ranked(problem)[0].config == configs[64, 192]
