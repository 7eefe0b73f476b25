"""Selection between tuned problems by each kernel's fitted time
(`dispatcher.fitted_times`): the fit against times the test computes
itself, the range a fit answers for, and the order of a database's answers
(exact, fitted, nearest)."""

import math

import dispatcher
import numpy as np
import pytest
from dispatcher.fitted_times import MIN_PROBLEMS, features, fit
from dispatcher.plugins import get_manager
from dispatcher.problem import GemmProblem
from dispatcher.targets import cuda as cuda_target
from dispatcher.tuning import TuningDatabase

SMS = 132  # the cuda target's workers where no GPU is visible (these tests' machines)


def _cuda(**fields):
    return dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_k=64, **fields)


def _problem(m, n, k):
    return GemmProblem(m, n, k, "bf16", "bf16", "rcr", "regular", "cuda")


def _time_of(m, n, k, tile, launch, per_tile, per_k_tile):
    """A kernel's time as the test writes it: whole waves of its tiles over
    132 SMs, each tile a fixed cost and one per K tile of 64."""
    waves = math.ceil(math.ceil(m / tile[0]) * math.ceil(n / tile[1]) / SMS)
    return launch + waves * (per_tile + per_k_tile * math.ceil(k / 64))


GRID = [(m, n, k) for m in (64, 256, 1024, 4096) for n in (512, 2048, 8192) for k in (512, 2048, 8192)]
OTHER = (dict(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, schedule="pingpong"), (64, 64), (0.003, 0.001, 0.0003))


def _swept(config, times_of) -> list:
    """Samples of `config` timed by times_of(m, n, k), beside OTHER's on the
    same grid: a sweep's rows (a database of winners only gets no fit)."""
    other, tile, costs = _cuda(**OTHER[0]), OTHER[1], OTHER[2]
    return [((float(m), float(n), float(k)), _problem(m, n, k), c, t(m, n, k)) for m, n, k in GRID
            for c, t in ((config, times_of), (other, lambda m, n, k: _time_of(m, n, k, tile, *costs)))]


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    monkeypatch.setattr(cuda_target.CudaTarget, "parallelism", lambda self, config: SMS)


def test_a_fit_recovers_the_times_it_was_given_and_predicts_a_problem_between_them():
    record = get_manager().variant("regular")
    config = _cuda(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1)
    costs = (0.005, 0.002, 0.0004)
    fitted = fit(_swept(config, lambda m, n, k: _time_of(m, n, k, (128, 256), *costs)), record)[config.name]
    assert fitted.problems == len(GRID) and fitted.error < 1e-6
    assert fitted.coefficients[:3] == pytest.approx(costs, rel=1e-6) and fitted.coefficients[3] == 0.0
    between = _problem(3000, 5000, 3000)
    assert fitted.predicted_ms(between, record, (3000, 5000, 3000)) == pytest.approx(
        _time_of(3000, 5000, 3000, (128, 256), *costs))


def test_a_fit_is_corrected_by_its_error_at_the_tuned_problems_nearby():
    """A kernel that ran 30% slower than its curve around 1024x2048x2048
    (what the model cannot see: a cluster that suits those tile grids
    badly, say) is predicted slower near there, by up to that much, and
    about as its curve says far away, where the tuned problems met the
    curve (within what the slow ones pulled the fit off)."""
    record = get_manager().variant("regular")
    config = _cuda(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1)
    costs = (0.005, 0.002, 0.0004)
    slow_near = {(1024, 2048, 2048), (1024, 512, 2048), (256, 2048, 2048), (1024, 2048, 512)}

    def times_of(m, n, k):
        return _time_of(m, n, k, (128, 256), *costs) * (1.3 if (m, n, k) in slow_near else 1.0)

    fitted = fit(_swept(config, times_of), record)[config.name]
    near, far = (1100, 1800, 2048), (4000, 8000, 8000)
    curve = {p: float(np.dot(features(_problem(*p), config, record), fitted.coefficients)) for p in (near, far)}
    assert 1.15 < fitted.predicted_ms(_problem(*near), record, near) / curve[near] <= 1.3
    assert fitted.predicted_ms(_problem(*far), record, far) == pytest.approx(curve[far], rel=0.02)


def test_a_hybrid_kernel_counts_its_tiles_in_pieces_as_cutlass_decides():
    """CUTLASS's heuristic stream-K (tile_scheduler_params.h): whole waves
    where the last is full, at least half full, or K too short to split;
    else the last two waves' tiles in pieces, spread evenly (unrounded)."""
    target = dispatcher.targets.get("cuda")
    assert target.shared_waves(132, SMS, 32) == (1.0, 0)  # a full wave
    assert target.shared_waves(200, SMS, 32) == (2.0, 0)  # a tail of 68 tiles: half full
    assert target.shared_waves(176, SMS, 8) == (2.0, 0)  # 8 K tiles: nothing to split
    assert target.shared_waves(176, SMS, 32) == (pytest.approx(176 / SMS), 176)  # all in pieces
    assert target.shared_waves(300, SMS, 32) == (pytest.approx(300 / SMS), 300 - SMS)  # one wave data-parallel
    assert target.shared_waves(40, SMS, 32) == (1.0, 40)  # under a third of a wave, split over all
    hybrid = _cuda(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2, decomposition="hybrid")
    plain = _cuda(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2)
    record = get_manager().variant("regular")
    # 1024 x 5632 x 2048: 176 tiles of 256x128, every one summed from pieces through fp32 partials
    assert features(_problem(1024, 5632, 2048), hybrid, record)[3] == pytest.approx(176 * 256 * 128 * 4e-6)
    assert features(_problem(1024, 5632, 2048), plain, record)[1:4:2] == (2.0, 0.0)


def test_fitted_coefficients_are_never_negative():
    """Times that fall with the waves would fit a negative per-tile cost:
    it is clipped at zero and the others refitted."""
    config = _cuda(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1)
    fitted = fit(_swept(config, lambda m, n, k: 1.0 / (1 + m * n / 1e6)), get_manager().variant("regular"))[config.name]
    assert min(fitted.coefficients) >= 0.0


def test_a_kernel_measured_at_too_few_problems_gets_no_fit():
    config = _cuda(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1)
    samples = [((float(m), float(n), float(k)), _problem(m, n, k), config, 1.0) for m, n, k in GRID[:MIN_PROBLEMS - 1]]
    assert fit(samples, get_manager().variant("regular")) == {}


def test_a_cluster_launches_whole_clusters_of_tiles():
    """A 2x4 cluster on a problem one 128x128 tile wide and two tall runs
    one cluster: 8 CTAs, 6 of them idle."""
    target = dispatcher.targets.get("cuda")
    assert target.launched_tiles(_problem(200, 100, 64), _cuda(tile_m=128, tile_n=128, cluster_m=2, cluster_n=4)) == 8
    assert target.launched_tiles(_problem(200, 100, 64), _cuda(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1)) == 2


def _grid_database(tmp_path, kernels, grid=GRID):
    """A database of every (kernel, tile, costs) in `kernels` timed by `_time_of` on `grid`."""
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    for config, tile, costs in kernels:
        for m, n, k in grid:
            db.record(_problem(m, n, k), config, _time_of(m, n, k, tile, *costs))
    return db


def test_between_tuned_problems_the_kernel_of_least_fitted_time_runs(tmp_path):
    """Small tiles cost less to start and more per tile: the fitted curves
    cross, and a problem off the grid gets the kernel whose curve is lower
    there, though its nearest tuned problem's winner is the other one."""
    record = get_manager().variant("regular")
    small = _cuda(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong")
    large = _cuda(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1)
    kernels = [(small, (64, 128), (0.004, 0.001, 0.0002)), (large, (128, 256), (0.006, 0.003, 0.0007))]
    db = _grid_database(tmp_path, kernels)
    problem = _problem(1500, 2800, 2048)  # its nearest tuned problem: 1024x2048x2048
    times = {config: _time_of(1500, 2800, 2048, tile, *costs) for config, tile, costs in kernels}
    faster = min(times, key=times.get)
    nearest = {config: _time_of(1024, 2048, 2048, tile, *costs) for config, tile, costs in kernels}
    assert faster != min(nearest, key=nearest.get)  # the nearest winner would be the other one
    found = db.winner(problem, record)
    assert found.config == faster and found.fitted == len(GRID) and not found.exact
    assert f"fitted to the own times of {len(GRID)} tuned problems" in str(found)
    assert db.winner(_problem(1024, 2048, 2048), record).exact  # a tuned problem keeps its own winner


def test_a_fit_answers_only_near_the_sizes_its_kernel_was_measured_at(tmp_path):
    """A kernel measured only on large problems (an export drops the times
    of a kernel much slower than a problem's best) does not answer a small
    one, however fast its fit extrapolates; a kernel measured down to the
    database's smallest size answers any smaller one."""
    record = get_manager().variant("regular")
    everywhere = _cuda(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong")
    large_only = _cuda(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1)
    db = _grid_database(tmp_path, [(everywhere, (64, 128), (0.004, 0.001, 0.0002))])
    for m, n, k in GRID:
        if m >= 1024:
            db.record(_problem(m, n, k), large_only, 0.001)  # the fastest where it was measured
    assert db.winner(_problem(3000, 3000, 3000), record).config == large_only
    small = db.winner(_problem(100, 3000, 3000), record)  # M 100: below its 1024 / 2
    assert small.config == everywhere and small.fitted
    tiny = db.winner(_problem(8, 3000, 3000), record)  # 8: past 64 / 2, but 64 is the database's least M
    assert tiny.config == everywhere and tiny.fitted


def test_a_users_own_fitted_times_come_before_shipped_ones(tmp_path, monkeypatch):
    """Own rows that fit a kernel decide before shipped ones (measured on another card)."""
    import dispatcher.tuning as tuning
    record = get_manager().variant("regular")
    mine = _cuda(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2)
    theirs = _cuda(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1)
    shipped = [((float(m), float(n), float(k)), theirs, 0.5 * _time_of(m, n, k, (128, 128), 0.005, 0.002, 0.0004))
               for m, n, k in GRID]
    db = _grid_database(tmp_path, [(mine, (128, 128), (0.005, 0.002, 0.0004))])
    monkeypatch.setattr(TuningDatabase, "_shipped", lambda self, problem: [
        (f"{int(a)}x{int(b)}x{int(c)}", a, b, c, tuning.json.dumps(config.to_dict()), ms)
        for (a, b, c), config, ms in shipped])
    found = db.winner(_problem(1500, 3000, 3000), record)
    assert found.config == mine and not found.shipped


def test_fits_leave_a_problem_of_the_targets_own_gemv_kernel_to_the_model(tmp_path):
    """M or N up to 4 is the gemv kernel's (its bandwidth estimate ranks it):
    fits that never measured it do not decide such a problem; a wider one
    they do."""
    record = get_manager().variant("regular")
    kernel = _cuda(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong")
    db = _grid_database(tmp_path, [(kernel, (64, 128), (0.004, 0.001, 0.0002)), (_cuda(**OTHER[0]), *OTHER[1:])])
    assert db.winner(_problem(4, 3000, 3000), record) is None
    assert db.winner(_problem(3000, 1, 3000), record) is None
    assert db.winner(_problem(5, 3000, 3000), record).fitted == len(GRID)
    from dispatcher.api import Dispatcher
    assert "gemv" in Dispatcher(tuning=db).select(_problem(4, 3000, 3000)).name


def test_only_kernels_kept_at_a_near_tuned_problem_compete(tmp_path):
    """A kernel whose fit is the least but which the near tuned problem did
    not keep (an export drops kernels much slower than its best) does not run."""
    record = get_manager().variant("regular")
    fast, slow = _cuda(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong"), _cuda(**OTHER[0])
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    for m, n, k in GRID:
        db.record(_problem(m, n, k), slow, _time_of(m, n, k, OTHER[1], *OTHER[2]))
        if (m, n, k) != (1024, 2048, 2048):
            db.record(_problem(m, n, k), fast, 0.5 * _time_of(m, n, k, OTHER[1], *OTHER[2]))
    assert db.winner(_problem(4096, 8192, 8192), record).config == fast  # no tuned problem near: every fit
    assert db.winner(_problem(1100, 2100, 2100), record).config == slow  # near 1024x2048x2048, which kept slow alone


def test_winners_only_and_zero_times_give_no_fit_and_no_error(tmp_path):
    """One kernel per tuned problem (autotune's rows) is no curve: the nearest
    tuned problems decide. A time of 0 recorded by hand is left out of a fit."""
    record = get_manager().variant("regular")
    first, second = _cuda(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong"), _cuda(**OTHER[0])
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    for i, (m, n, k) in enumerate(GRID):
        db.record(_problem(m, n, k), first if i % 2 else second, 1.0)
    found = db.winner(_problem(1100, 2100, 2100), record)
    assert not found.fitted and found.neighbours >= 1
    swept = _grid_database(tmp_path / "swept", [(first, (64, 128), (0.004, 0.001, 0.0002)), (second, *OTHER[1:])])
    swept.record(_problem(333, 444, 555), first, 0.0)
    assert swept.winner(_problem(1500, 2800, 2048), record).fitted == len(GRID)


def test_own_times_near_a_problem_decide_before_shipped_fits(tmp_path, monkeypatch):
    """The user's own nearest tuned problem (no fit of their own) decides
    before the shipped times' fits, as it did before fits."""
    import dispatcher.tuning as tuning
    record = get_manager().variant("regular")
    mine, theirs = _cuda(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, schedule="pingpong"), _cuda(**OTHER[0])
    shipped = [((float(m), float(n), float(k)), c, _time_of(m, n, k, tile, *costs)) for m, n, k in GRID
               for c, tile, costs in ((theirs, *OTHER[1:]), (mine, (64, 128), (0.04, 0.01, 0.002)))]
    monkeypatch.setattr(TuningDatabase, "_shipped", lambda self, problem: [
        (f"{int(a)}x{int(b)}x{int(c)}", a, b, c, tuning.json.dumps(config.to_dict()), ms)
        for (a, b, c), config, ms in shipped])
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    assert db.winner(_problem(3100, 5000, 3000), record).config == theirs  # the shipped fits
    db.record(_problem(3000, 5000, 3000), mine, 1.0)
    found = db.winner(_problem(3100, 5000, 3000), record)
    assert found.config == mine and not found.shipped and found.neighbours == 1
