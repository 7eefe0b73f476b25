"""The tile engine: expansion, problem files, isolation of faulty kernels,
resume after a kill, results, the tuning database feeding selection."""

import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest

import dispatcher
from dispatcher import errors
from dispatcher.api import Dispatcher
from dispatcher.problem import GemmProblem
from dispatcher.targets import cpu_isa
from dispatcher.tile_engine import problems, results, sweep
from dispatcher.tuning import TuningDatabase

from conftest import make_importable, wait_until

HERE = Path(__file__).resolve().parent
SMALL_PROBLEMS = [[64, 96, 80], [33, 65, 17], [128, 128, 128]]


# ------------------------------------------------------------- expansion
def test_values_and_ranges_expand_to_the_product():
    plan = sweep.expand({"tile_config": {"tile_m": {"values": [24, 48]},
                                         "tile_n": {"min": 32, "max": 96, "step": 32}},
                         "tile_k": {"values": [64]}},
                        variant="regular", target="cpu", dtype="fp32", layout="rcr")
    # tile_n 32, 64, 96 x tile_m 24, 48: every ISA's default micro-tile divides them all
    assert len(plan.configs) == 6 and not plan.filtered
    assert {c.tile_n for c in plan.configs} == {32, 64, 96}


def test_a_tile_the_default_micro_tile_does_not_divide_gets_one_that_does():
    """Without a micro-tile axis each config takes its ISA's micro-tile that
    divides its tile: the default where it does (so 2 x micro_m keeps it)."""
    micro_m, micro_n = cpu_isa.active().micro_tile
    plan = sweep.expand({"tile_m": {"values": [2 * micro_m, 32, 25]}, "tile_n": {"values": [64]},
                         "tile_k": {"values": [32]}}, variant="regular", target="cpu", dtype="fp32", layout="rcr")
    assert not plan.filtered and len(plan.configs) == 3
    micro = {c.tile_m: (c.target_params["micro_m"], c.target_params["micro_n"]) for c in plan.configs}
    assert micro[2 * micro_m] == (micro_m, micro_n)
    assert all(tile % mm == 0 and 64 % mn == 0 for tile, (mm, mn) in micro.items())


def test_ck_range_semantics():
    assert sweep.axis_values("tile_m", {"min": 64, "max": 256, "step": 256}) == [64]
    assert sweep.axis_values("tile_m", {"min": 64, "max": 256, "step": 64}) == [64, 128, 192, 256]
    assert sweep.axis_values("tile_m", {"min": 3, "max": 5}) == [3, 4, 5]


def test_invalid_combinations_are_filtered_with_reasons():
    micro_m, micro_n = cpu_isa.active().micro_tile
    plan = sweep.expand({"tile_m": {"values": [2 * micro_m, 2 * micro_m + 1]}, "tile_n": {"values": [micro_n]},
                         "tile_k": {"values": [32]}, "micro_m": {"values": [micro_m]}},
                        variant="regular", target="cpu", dtype="fp32", layout="rcr")
    assert len(plan.configs) == 1
    (point, reason), = plan.filtered
    assert point["tile_m"] == 2 * micro_m + 1 and "not a multiple of the micro-tile" in reason
    assert "divides it on ISA" in reason  # which micro-tile would fit this tile
    plan = sweep.expand({"reduction": {"values": ["atomic", "linear"]}, "tile_m": {"values": [24]},
                         "tile_n": {"values": [64]}, "tile_k": {"values": [32]}},
                        variant="stream_k", target="cpu", dtype="bf16", layout="rcr")
    assert len(plan.configs) == 1 and "atomic reduction" in plan.filtered[0][1]


def test_unknown_axes_and_values_are_named():
    with pytest.raises(errors.ConfigError, match="'warp_m'"):
        sweep.expand({"warp_m": {"values": [2]}}, variant="regular", target="cpu", dtype="fp32",
                     layout="rcr")
    with pytest.raises(errors.ConfigError, match="unknown key.*'vals'"):
        sweep.expand({"tile_m": {"vals": [2]}}, variant="regular", target="cpu", dtype="fp32",
                     layout="rcr")
    with pytest.raises(errors.ConfigError, match="'micro_n' = 70 is out of range"):
        sweep.expand({"micro_n": {"values": [32, 70]}}, variant="regular", target="cpu",
                     dtype="fp32", layout="rcr")
    with pytest.raises(errors.ConfigError, match="min 9 > max 3"):
        sweep.axis_values("tile_m", {"min": 9, "max": 3})


def test_max_kernels_and_dedup():
    plan = sweep.expand({"tile_m": {"values": [24, 24, 48, 96]}, "tile_n": {"values": [64]},
                         "tile_k": {"values": [32]}}, variant="regular", target="cpu",
                        dtype="fp32", layout="rcr", max_kernels=2)
    assert [c.tile_m for c in plan.configs] == [24, 48]


# ----------------------------------------------------------- problem files
def test_problem_files(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"problems": [{"M": 1, "N": 2, "K": 3}, [4, 5, 6]]}))
    assert problems.load(p, "gemm") == [(1, 2, 3), (4, 5, 6)]
    assert problems.load([{"groups": [[1, 2, 3], [0, 4, 4]]}], "grouped") == [((1, 2, 3), (0, 4, 4))]
    with pytest.raises(errors.ProblemError, match="expected keys M, N, K"):
        problems.load([{"M": 1, "N": 2}], "gemm")
    with pytest.raises(errors.ProblemError, match="unknown key"):
        problems.load({"problem": []}, "gemm")


# ------------------------------------------------------- the whole sweep
def sweep_cli(tmp_path, config, *args, env=None, timeout=900):
    cfg = tmp_path / "sweep.json"
    cfg.write_text(json.dumps(config))
    probs = tmp_path / "problems.json"
    probs.write_text(json.dumps(SMALL_PROBLEMS))
    cmd = [sys.executable, "-m", "dispatcher", "sweep", str(cfg), "--problems", str(probs),
           "--quiet", "--repeat", "2", "--warmup", "1", "--json", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or os.environ)


@pytest.fixture
def faulty_env(tmp_path):
    return make_importable(tmp_path / "site", HERE / "plugins" / "faulty_gemm", "faulty-gemm",
                           "faulty_gemm", "faulty_gemm.plugin")


# slow (15 s: it waits out a hung worker's timeout); CI runs it in its slow step
@pytest.mark.slow
def test_crash_hang_and_wrong_kernels_fail_their_rows_only(tmp_path, faulty_env):
    out = tmp_path / "out"
    proc = sweep_cli(tmp_path, {"behaviour": {"values": ["ok", "segfault", "hang", "wrong"]},
                                "tile_m": {"values": [24]}, "tile_n": {"values": [64]},
                                "tile_k": {"values": [32]}},
                     "--variant", "faulty", "--verify", "--kernel-timeout", "5", "--out", str(out),
                     env=faulty_env)
    assert proc.returncode == 0, proc.stderr
    rows = results.read(out)
    assert len(rows) == 4 * len(SMALL_PROBLEMS)
    by = lambda b: [r for r in rows if r["kernel"].endswith(f"_faulty_{b}")]
    assert all(r["status"] == "ok" and r["verified"] == "True" for r in by("ok"))
    assert all(r["status"] == "failed" and "crashed (signal 11)" in r["reason"] for r in by("segfault"))
    assert all(r["status"] == "failed" and "timed out" in r["reason"] for r in by("hang"))
    assert all(r["status"] == "failed" and "wrong result" in r["reason"] for r in by("wrong"))
    summary = json.loads(proc.stdout)
    assert len(summary["winners"]) == len(SMALL_PROBLEMS)
    assert all(w["kernel"].endswith("_faulty_ok") for w in summary["winners"].values())
    lines = (out / "results.jsonl").read_text().splitlines()
    assert "environment" in json.loads(lines[0]) and len(lines) == 1 + len(rows)


def _kill_session(proc):
    """Kill a child started with start_new_session and everything it started."""
    with contextlib.suppress(ProcessLookupError):  # all gone already
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.mark.slow  # 24 s on a 2-core EPYC: CI runs it in its slow step
def test_resume_after_a_kill_loses_and_duplicates_nothing(tmp_path, faulty_env):
    out = tmp_path / "out"
    config = {"behaviour": {"values": ["ok"]}, "tile_m": {"values": [12, 24, 36, 48]},
              "tile_n": {"values": [32, 64]}, "tile_k": {"values": [32]}}
    cfg = tmp_path / "sweep.json"
    cfg.write_text(json.dumps(config))
    probs = tmp_path / "problems.json"
    probs.write_text(json.dumps(SMALL_PROBLEMS))
    # slow enough (~0.1 s a measurement) that the kill lands mid-sweep
    cmd = [sys.executable, "-m", "dispatcher", "sweep", str(cfg), "--problems", str(probs),
           "--variant", "faulty", "--quiet", "--repeat", "20000", "--out", str(out)]
    log = tmp_path / "sweep.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, env=faulty_env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    try:
        wait_until(lambda: len(results.read(out)) >= 4, [proc], 300, "4 result rows", log)
    finally:
        _kill_session(proc)
    before = results.read(out)
    assert 4 <= len(before) < 8 * len(SMALL_PROBLEMS), "the kill came too late to test anything"
    done = sweep_cli(tmp_path, config, "--variant", "faulty", "--out", str(out), "--resume",
                     env=faulty_env)
    assert done.returncode == 0, done.stderr
    rows = results.read(out)
    keys = [(r["kernel"], r["problem_idx"]) for r in rows]
    assert len(keys) == len(set(keys)) == 8 * len(SMALL_PROBLEMS)
    assert {(r["kernel"], r["problem_idx"]) for r in before} <= set(keys)


@pytest.mark.slow  # builds its two kernels in a cache of its own: CI runs it in its slow step
def test_an_interrupted_sweep_records_what_it_measured(tmp_path, faulty_env):
    """Ctrl-C (or `timeout -s INT`) mid-sweep: one line and status 130, and
    the times measured so far are in the tuning database, not only on disk."""
    out = tmp_path / "out"
    env = {**faulty_env, "DISPATCHER_CACHE_DIR": str(tmp_path / "cache")}
    cfg = tmp_path / "sweep.json"
    cfg.write_text(json.dumps({"behaviour": {"values": ["ok"]}, "tile_m": {"values": [12, 24]},
                               "tile_n": {"values": [32]}, "tile_k": {"values": [32]}}))
    probs = tmp_path / "problems.json"
    probs.write_text(json.dumps(SMALL_PROBLEMS))
    log = tmp_path / "sweep.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dispatcher", "sweep", str(cfg), "--problems", str(probs),
                                 "--variant", "faulty", "--quiet", "--repeat", "20000", "--out", str(out)],
                                env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_until(lambda: len(results.read(out)) >= 2, [proc], 300, "2 result rows", log)
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: proc.poll() is not None, [], 60, "the interrupted sweep to exit", log)
    finally:
        _kill_session(proc)
    measured = [r for r in results.read(out) if r["status"] == "ok"]
    said = log.read_text()
    assert proc.returncode == 130 and "gemm-dispatcher: interrupted" in said, (proc.returncode, said[-2000:])
    assert 2 <= len(measured) < 2 * len(SMALL_PROBLEMS), \
        f"the interrupt came too late to test anything ({len(measured)} rows): {said[-2000:]}"
    import sqlite3  # (the faulty variant is not registered in this process: the rows as stored)
    with contextlib.closing(sqlite3.connect(tmp_path / "cache" / "tuning.sqlite")) as con:
        stored = {(problem, kernel): ms for problem, kernel, ms in
                  con.execute("SELECT problem, kernel, latency_ms FROM timings WHERE variant = 'faulty'")}
    assert stored == {("x".join(map(str, SMALL_PROBLEMS[int(r["problem_idx"])])), r["kernel"]):
                      pytest.approx(float(r["latency_ms"])) for r in measured}, said[-2000:]


def test_a_sweep_measures_every_kernel_on_a_share_of_the_problems_before_the_next_share():
    """A sweep stopped early still ranks every kernel where it got to: jobs
    run share by share (the problems of one index modulo 4, spanning the
    grid; the same for every kernel, whatever a resumed sweep has left of
    each), each share over every kernel, and together they hold each
    (kernel, problem) pair once."""
    from dispatcher.tile_engine.runner import PROBLEM_SHARES, share_jobs

    configs = [attrs.make_class("C", ["name"])(n) for n in ("k1", "k2", "k3")]
    todo = {"k1": list(range(10)), "k2": [0, 3, 5], "k3": []}
    jobs = share_jobs(configs, todo)
    assert [(j.config.name, j.problems) for j in jobs[:2]] == [("k1", (0, 4, 8)), ("k2", (0,))]
    pairs = [(j.config.name, p) for j in jobs for p in j.problems]
    assert sorted(pairs) == sorted((k, p) for k, ps in todo.items() for p in ps) and len(set(pairs)) == len(pairs)
    share_of = {(j.config.name, p): i for i, j in enumerate(jobs) for p in j.problems}
    first_share_ends = max(i for i, j in enumerate(jobs) if 0 in j.problems)
    assert all(0 < i <= first_share_ends for (k, p), i in share_of.items() if p == 0 and k != "k1")
    assert all(i > first_share_ends for (k, p), i in share_of.items() if p % PROBLEM_SHARES != 0)
    assert share_jobs(configs, {"k3": []}) == []


def _processes() -> dict:
    """{pid: (parent pid, session id, start time, state)} of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue  # it exited meanwhile
        if stat:  # fields after "(comm)": state ppid pgrp session ... starttime (the 20th)
            fields = stat[stat.rindex(")") + 2:].split()
            table[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[19], fields[0])
    return table


def _session(sid: int) -> set:
    """The live (not zombie) processes of session `sid`: (pid, start time)."""
    return {(pid, p[2]) for pid, p in _processes().items() if p[1] == sid and p[3] != "Z"}


def _compiling(sweep_pid: int) -> bool:
    """Whether a build worker of the sweep runs a compiler (a grandchild)."""
    table = _processes()
    workers = {pid for pid, p in table.items() if p[0] == sweep_pid}
    return any(p[0] in workers for p in table.values())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_a_sweep_killed_while_building_leaves_no_process(tmp_path):
    """Its build pool dies with it instead of blocking for ever on its work queue."""
    env = {**os.environ, "DISPATCHER_CACHE_DIR": str(tmp_path / "cache")}  # all to build
    cfg = tmp_path / "sweep.json"
    cfg.write_text(json.dumps({"tile_m": {"values": [12 * i for i in range(1, 9)]},
                               "tile_n": {"values": [32]}, "tile_k": {"values": [32]}}))
    log = tmp_path / "sweep.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dispatcher", "sweep", str(cfg), "--quiet",
                                 "--workers", "2", "--out", str(tmp_path / "out")],
                                env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_until(lambda: _compiling(proc.pid), [proc], 120, "a compile of the build phase", log)
        assert len(_session(proc.pid)) >= 3  # the sweep, its pool, a compiler
        proc.kill()  # the sweep only, as an OOM kill or `kill -9 PID` would
        proc.wait(timeout=60)
        wait_until(lambda: not _session(proc.pid), [], 60,
                   "every process of the killed sweep to exit (its pool workers, their compilers)")
    finally:
        _kill_session(proc)


@pytest.mark.slow  # 17 s on a 2-core EPYC: CI runs it in its slow step
def test_cpu_fake_device_list_merges_results(tmp_path, monkeypatch):
    # a cache of its own: the check below that a refused sweep built nothing
    # must not see kernels other tests (other xdist workers) add meanwhile
    monkeypatch.setenv("DISPATCHER_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    proc = sweep_cli(tmp_path, {"tile_m": {"values": [12, 24, 36]}, "tile_n": {"values": [32, 64]},
                                "tile_k": {"values": [32]}},
                     "--variant", "regular", "--devices", "0,1", "--verify", "--rotating", "3",
                     "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = results.read(out)
    keys = {(r["kernel"], r["problem_idx"]) for r in rows}
    assert len(rows) == len(keys) == 6 * len(SMALL_PROBLEMS)
    assert {r["device"] for r in rows} == {"cpu:0", "cpu:1"}
    assert all(r["status"] == "ok" for r in rows)
    kernels = Path(os.environ["DISPATCHER_CACHE_DIR"]) / "kernels"
    cached = set(kernels.iterdir())
    again = sweep_cli(tmp_path, {"tile_m": {"values": [60]}, "tile_n": {"values": [32]},
                                 "tile_k": {"values": [32]}}, "--variant", "regular", "--out", str(out))
    assert again.returncode == 2 and "--resume" in again.stderr  # no silent duplicates
    assert set(kernels.iterdir()) == cached  # refused before building anything
    bad = sweep_cli(tmp_path, {"tile_m": {"values": [12]}}, "--devices", "a,b", "--out", str(tmp_path / "o2"))
    assert bad.returncode == 2 and "--devices wants device ids" in bad.stderr


# ------------------------------------------------------- tuning database
def test_tuning_database_feeds_selection(tmp_path):
    db = TuningDatabase(tmp_path / "t.sqlite")
    d = Dispatcher(tuning=db)
    problem = GemmProblem(300, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")
    heuristic = d.select(problem)
    tuned = dispatcher.KernelConfig.create(layout="rrr", tile_m=36, tile_n=96, tile_k=64)
    assert tuned != heuristic
    assert db.record(problem, tuned, 1.0)
    assert db.record(problem, heuristic, 2.0)  # every kernel's time is kept
    assert not db.record(problem, tuned, 3.0), "a slower time replaced a faster one"
    assert Dispatcher(tuning=db).select(problem) == tuned  # the fastest
    near = GemmProblem(320, 210, 90, "fp32", "fp32", "rrr", "regular", "cpu")
    assert Dispatcher(tuning=db).select(near) == tuned          # nearest tuned problem
    other = GemmProblem(300, 200, 100, "fp16", "fp16", "rrr", "regular", "cpu")
    assert Dispatcher(tuning=db).select(other) != tuned         # another dtype is not tuned
    a = np.random.default_rng(0).standard_normal((300, 100)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((100, 200)).astype(np.float32)
    out = dispatcher.gemm(a, b, dispatcher=Dispatcher(tuning=db))
    assert np.allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_a_catalog_sweep_is_the_variants_default_configs_over_the_other_axes():
    d = Dispatcher(tuning=None)
    problem = GemmProblem(1, 1, 1, "fp32", "fp32", "rcr", "regular", "cpu")
    catalog = {c.name for c in d.candidates(problem)}
    plan = sweep.expand({"catalog": True}, variant="regular", target="cpu", dtype="fp32", layout="rcr")
    assert {c.name for c in plan.configs} == catalog and not plan.filtered
    deeper = sweep.expand({"catalog": True, "tile_k": {"values": [64, 128]}}, variant="regular",
                          target="cpu", dtype="fp32", layout="rcr")
    assert len(deeper.configs) == 2 * len(catalog) and {c.tile_k for c in deeper.configs} == {64, 128}
    with pytest.raises(errors.ConfigError, match="'catalog' must be true or false"):
        sweep.expand({"catalog": "yes"}, variant="regular", target="cpu", dtype="fp32", layout="rcr")


def test_shipped_winners_are_read_after_a_databases_own_exact_entries(tmp_path, monkeypatch):
    """A database exported to JSON (as dispatcher/data/tuning is built) is
    read by every database that ships winners: its exact entry, then its
    nearest one within a factor 2 of each size; an exact entry of the
    user's own comes first, and so does an own one as near as the nearest
    shipped; `shipped=False` reads none; `has` (autotune's question) counts
    the user's own entries only."""
    from dispatcher import tuning
    problem = GemmProblem(300, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")
    far = GemmProblem(600, 400, 199, "fp32", "fp32", "rrr", "regular", "cpu")  # just inside NEAREST_WITHIN
    farther = GemmProblem(600, 400, 201, "fp32", "fp32", "rrr", "regular", "cpu")  # just past it
    skewed = GemmProblem(300, 200, 13, "fp32", "fp32", "rrr", "regular", "cpu")  # 8x in K alone
    shipped = dispatcher.KernelConfig.create(layout="rrr", tile_m=36, tile_n=96, tile_k=64)
    own = dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=32)
    source = TuningDatabase(tmp_path / "measured.sqlite", shipped=False)
    source.record(problem, shipped, 1.0)
    shipped_dir = tmp_path / "shipped"
    shipped_dir.mkdir()
    arch = dispatcher.targets.get("cpu").arch_id()
    assert source.export(shipped_dir / f"{arch}.json", "a test") == 1
    assert json.loads((shipped_dir / f"{arch}.json").read_text())["about"] == "a test"
    (shipped_dir / "sm_00.json").write_text("{another arch's file, never read for a cpu problem")
    read = tuning.shipped_rows.__wrapped__
    monkeypatch.setattr(tuning, "shipped_rows", lambda arch: read(arch, shipped_dir))
    fresh = TuningDatabase(tmp_path / "fresh.sqlite")
    assert not fresh.has(problem)  # shipped rows are another machine's: autotune still measures
    assert fresh.lookup(problem) == shipped and fresh.lookup(far) == shipped  # exact, then nearest
    assert fresh.lookup(farther) is None and fresh.lookup(skewed) is None  # too far to say: the model ranks
    decided = fresh.winner(far)  # what explain shows
    assert (decided.config, decided.shipped, decided.exact) == (shipped, True, False)
    assert decided.problem == tuning.problem_key(problem)[0] and decided.problem in str(decided)
    assert Dispatcher(tuning=fresh).select(problem) == shipped
    assert TuningDatabase(tmp_path / "fresh.sqlite", shipped=False).lookup(problem) is None
    fresh.record(far, own, 5.0)
    assert fresh.lookup(far) == own and fresh.lookup(problem) == shipped  # exact of either first
    fresh.record(problem, own, 9.0)
    assert fresh.has(problem) and fresh.lookup(problem) == own  # the user's own exact entry first


@pytest.mark.parametrize("own_m, m, shipped_m", [(200, 300, 450), (16, 24, 36), (8, 12, 18)])
def test_an_own_winner_as_near_as_a_shipped_one_comes_first(own_m, m, shipped_m, tmp_path, monkeypatch):
    """1.5x either way: equally near, whatever the rounding of the two
    log-distances (16, 24, 36 differ in their last bit)."""
    from dispatcher import tuning
    small = dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=32)
    large = dispatcher.KernelConfig.create(layout="rrr", tile_m=36, tile_n=96, tile_k=64)
    source = TuningDatabase(tmp_path / "measured.sqlite", shipped=False)
    source.record(GemmProblem(shipped_m, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu"), small, 1.0)
    source.export(tmp_path / f"{dispatcher.targets.get('cpu').arch_id()}.json", "a test")
    read = tuning.shipped_rows.__wrapped__
    monkeypatch.setattr(tuning, "shipped_rows", lambda arch: read(arch, tmp_path))
    db = TuningDatabase(tmp_path / "own.sqlite")
    db.record(GemmProblem(own_m, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu"), large, 1.0)
    between = GemmProblem(m, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")
    assert db.lookup(between) == large  # the user's own measurement, not a tie the model decides


def test_a_fused_epilogue_problem_takes_the_plain_problems_winner_with_its_epilogue(tmp_path):
    """A call with a bias and an activation that no winner of its own
    decides gets the tiles the plain problem's winner has, with its own
    epilogue (the sweeps tune plain GEMMs); its own winner comes first."""
    from dispatcher.kinds import KindProblem
    db = TuningDatabase(tmp_path / "own.sqlite", shipped=False)
    won = dispatcher.KernelConfig.create(layout="rrr", tile_m=36, tile_n=96, tile_k=64)
    shape = (300, 200, 100, 1, "fp32", "fp32", "rrr", "regular", "cpu")
    db.record(KindProblem(*shape, (("activation", "none"), ("bias", "none")), ()), won, 1.0)
    fused = KindProblem(*shape, (("activation", "relu"), ("bias", "col")), (("activation", "relu"), ("bias", "col")))
    found = db.winner(fused)
    assert found.config == won.replace(activation="relu", bias="col") and not found.exact
    assert found.adapted == "this problem's epilogue"
    assert "with this problem" in str(found) and not db.has(fused)  # autotune still measures it
    assert db.winner(KindProblem(900, 200, 100, *shape[3:], fused.options, fused.fixed)) is None  # 3x M: too far
    own = dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=32, activation="relu", bias="col")
    db.record(fused, own, 1.0)
    assert db.lookup(fused) == own and not db.winner(fused).adapted and db.has(fused)


def test_a_fused_sweep_measures_and_records_the_problem_a_fused_call_looks_up(tmp_path):
    """`"fixed"` in a sweep: every kernel carries the epilogue, every problem
    runs with a bias operand and the activation and is verified against a
    float64 reference with them, and the times are keyed by the epilogue,
    so that a call with that epilogue finds its own exact winner."""
    import math
    from dispatcher.tile_engine import engine
    db = TuningDatabase(tmp_path / "fused.sqlite", shipped=False)
    config = {"tile_m": {"values": [12, 24]}, "tile_n": {"values": [32]}, "tile_k": {"values": [32]},
              "fixed": {"bias": "row", "activation": "silu"}}
    summary = engine.run(engine.SweepOptions(config=config, variant="regular", layout="rrr", problems=None,
                                             verify=True, out=str(tmp_path / "out"), tuning=db, progress=False))
    rows = results.read(tmp_path / "out")
    assert rows and all(r["status"] == "ok" and r["verified"] == "True" for r in rows)
    assert all(r["kernel"].endswith("_biasrow_silu") for r in rows) and summary["failed_rows"] == 0
    rng = np.random.default_rng(3)
    m, n, k = engine.DEFAULT_PROBLEMS["gemm"][2]
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal((m, 1)).astype(np.float32)
    d = Dispatcher(tuning=db)
    out = dispatcher.matmul(a, b, bias=bias, activation="silu", dispatcher=d)
    (problem, chosen), = d._selected.items()
    found = db.winner(problem)
    assert found.exact and found.config == chosen and chosen.name == summary["winners"][2]["kernel"]
    x = a.astype(np.float64) @ b + bias
    want = x / (1.0 + np.exp(-x))
    assert np.max(np.abs(out - want)) / np.max(np.abs(want)) < 1e-5
    # the plain problem of the same shape has no time of its own: the fused rows are not its
    plain = GemmProblem(m, n, k, "fp32", "fp32", "rrr", "regular", "cpu")
    assert db.winner(plain) is None and not math.isnan(summary["winners"][2]["latency_ms"])


def test_a_sweeps_fixed_values_are_checked():
    expand = lambda raw: sweep.expand(raw, variant="regular", target="cpu", dtype="fp32", layout="rcr")
    with pytest.raises(errors.ConfigError, match="'colour', not an option of variant 'regular'"):
        expand({"catalog": True, "fixed": {"colour": "red"}})
    with pytest.raises(errors.ConfigError, match="'activation'"):
        expand({"catalog": True, "fixed": {"activation": "tanh"}})
    with pytest.raises(errors.ConfigError, match="also in 'fixed'"):
        expand({"activation": {"values": ["relu"]}, "fixed": {"activation": "gelu"}})
    plan = expand({"catalog": True, "fixed": {"activation": "gelu"}})
    assert plan.fixed == (("activation", "gelu"),) and all(c.name.endswith("_gelu") for c in plan.configs)


def test_verify_refuses_a_fixed_option_it_has_no_reference_for(tmp_path):
    from dispatcher.tile_engine import engine
    o = engine.SweepOptions(config={"tile_m": {"values": [12]}, "fixed": {"splits": 2}}, variant="regular",
                            verify=True, out=str(tmp_path / "out"), tuning=None, progress=False)
    with pytest.raises(errors.ConfigError, match="fixes splits=2: run it without --verify"):
        engine.run(o)
    assert not (tmp_path / "out").exists()  # refused before anything was built or written


def test_a_kernel_that_fuses_an_epilogue_never_runs_a_plain_problem():
    """A config with an activation (and no bias) given to a plain call is
    refused: it would apply the activation the call did not ask for."""
    a = np.ones((8, 16), np.float32)
    with pytest.raises(errors.ConfigError, match="activation 'gelu' but the problem needs 'none'"):
        dispatcher.gemm(a, a.T.copy(), config=dict(tile_m=12, tile_n=32, tile_k=32, activation="gelu"))


def test_a_problem_with_another_output_dtype_takes_the_default_outputs_winner(tmp_path):
    """fp8 in, bf16 out (torch._scaled_mm's usual output) with no winner of
    its own gets the tiles of the fp8 -> fp16 winner (the dtype's default
    output, which the shipped sweeps tune), writing bf16; with a fused
    epilogue too; its own winner comes first."""
    from dispatcher.kinds import KindProblem
    db = TuningDatabase(tmp_path / "own.sqlite", shipped=False)
    won = dispatcher.KernelConfig.create(target="cuda", dtype="fp8_e4m3", layout="rcr", tile_m=128, tile_n=128,
                                         tile_k=128, cluster_m=1, cluster_n=2)
    assert won.dtype_c == "fp16"
    db.record(GemmProblem(4096, 4096, 4096, "fp8_e4m3", "fp16", "rcr", "regular", "cuda"), won, 1.0)
    bf16_out = GemmProblem(4000, 4096, 4096, "fp8_e4m3", "bf16", "rcr", "regular", "cuda")
    found = db.winner(bf16_out)
    assert found.config == won.replace(dtype_c="bf16") and not found.exact and "bf16 output" in str(found)
    shape = (4096, 4096, 4096, 1, "fp8_e4m3", "bf16", "rcr", "regular", "cuda")
    fused = KindProblem(*shape, (("activation", "relu"), ("bias", "col")), (("activation", "relu"), ("bias", "col")))
    found = db.winner(fused)
    assert found.config == won.replace(dtype_c="bf16", activation="relu", bias="col")
    assert found.adapted == "this problem's epilogue and bf16 output"
    fp32_out = GemmProblem(4096, 4096, 4096, "fp8_e4m3", "fp32", "rcr", "regular", "cuda")
    assert db.winner(fp32_out).config.dtype_c == "fp32"
    own = won.replace(dtype_c="bf16", cluster_m=2, cluster_n=1)
    db.record(bf16_out, own, 1.0)
    assert db.winner(bf16_out).config == own and db.winner(bf16_out).exact
    # its own equally near rows that disagree leave it to the model, not to the default output's winner
    disagree = TuningDatabase(tmp_path / "disagree.sqlite", shipped=False)
    disagree.record(GemmProblem(4096, 4096, 4096, "fp8_e4m3", "fp16", "rcr", "regular", "cuda"), won, 1.0)
    for m, config in ((2048, won.replace(dtype_c="bf16")), (8192, own)):
        disagree.record(GemmProblem(m, 4096, 4096, "fp8_e4m3", "bf16", "rcr", "regular", "cuda"), config, 1.0)
    assert disagree.winner(GemmProblem(4096, 4096, 4096, "fp8_e4m3", "bf16", "rcr", "regular", "cuda")) is None


def test_a_stale_row_of_ones_own_does_not_stop_autotune(tmp_path, monkeypatch):
    """An own exact row whose config no longer builds is skipped by lookups,
    and `has` (autotune's question) says no, so the problem is measured again."""
    import sqlite3
    db = TuningDatabase(tmp_path / "own.sqlite", shipped=False)
    problem = GemmProblem(300, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")
    db.record(problem, dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=32), 1.0)
    assert db.has(problem)
    with sqlite3.connect(db.path) as con:
        con.execute("UPDATE timings SET config = ?", (json.dumps({"variant": "regular", "tile_q": 3}),))
    assert db.lookup(problem) is None and not db.has(problem)


def test_shipped_rows_of_the_wrong_types_are_a_dispatcher_error(tmp_path):
    from dispatcher import tuning
    row = {"variant": "regular", "target": "cpu", "arch": "cpu-x", "dtype": "fp32", "out_dtype": "fp32",
           "layout": "rrr", "problem": "1x1x1", "size_a": 1, "size_b": 1, "size_c": 1, "kernel": "k",
           "latency_ms": 1.0}
    for bad_row, configs in (({"size_a": "64"}, {"k": {}}), ({"latency_ms": None}, {"k": {}}), ({}, {"k": "x"}),
                             ({}, {"k": None}), ({"problem": 7}, {"k": {}}), ({"kernel": "other"}, {"k": {}}),
                             ({}, []), ({"arch": "cpu-y"}, {"k": {}})):
        (tmp_path / "cpu-x.json").write_text(json.dumps({"about": "", "configs": configs,
                                                         "rows": [{**row, **bad_row}]}))
        with pytest.raises(errors.DispatcherError, match="cpu-x.json are not an export"):
            tuning.shipped_rows.__wrapped__("cpu-x", tmp_path)
    assert tuning.shipped_rows.__wrapped__("cpu-z", tmp_path) == {}  # no file of its own: no rows


def test_export_tuning_writes_this_machines_winners_for_shipping(tmp_path):
    env = {**os.environ, "DISPATCHER_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "winners.json"

    def export(*args):
        return subprocess.run([sys.executable, "-m", "dispatcher", "export-tuning", str(out), *args],
                              capture_output=True, text=True, timeout=120, env=env)
    empty = export()
    assert empty.returncode == 2 and "no times to export" in empty.stderr and not out.exists()
    db = TuningDatabase(tmp_path / "cache" / "tuning.sqlite")
    config = dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=32)
    db.record(GemmProblem(300, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu"), config, 1.0)
    done = export("--about", "a test")
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    assert written["about"] == "a test" and [r["kernel"] for r in written["rows"]] == [config.name]
    out.unlink()
    other = export("--target", "cuda")  # this database holds cpu winners only
    assert other.returncode == 2 and "no times for target cuda" in other.stderr and not out.exists()


def test_every_shipped_winner_names_a_config_that_builds_for_its_scope():
    """dispatcher/data/tuning is data versioned with the kernels it names:
    a plugin or schema change that makes a row stale fails here, before a
    user's lookup silently skips it."""
    from dispatcher import tuning
    rows = {scope: entries for path in tuning.SHIPPED_DIR.glob("*.json")
            for scope, entries in tuning.shipped_rows.__wrapped__(path.stem).items()}
    assert rows, "no shipped winners"
    for (variant, target, arch, dtype, out_dtype, layout), entries in rows.items():
        for problem, *sizes, config_json, latency_ms in entries:
            config = dispatcher.KernelConfig.from_dict(json.loads(config_json))
            assert not config.problems(), (problem, config.name, config.problems())
            assert (config.variant, config.target, config.dtype_a, config.dtype_c, config.layout) == \
                (variant, target, dtype, out_dtype, layout), (problem, config.name)
            assert all(x >= 1 for x in sizes) and arch.startswith("sm_") and latency_ms > 0


def test_equally_near_winners_that_disagree_leave_it_to_the_model(tmp_path):
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    small = dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=32)
    large = dispatcher.KernelConfig.create(layout="rrr", tile_m=36, tile_n=96, tile_k=64)
    db.record(GemmProblem(200, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu"), large, 1.0)
    db.record(GemmProblem(450, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu"), small, 1.0)
    between = GemmProblem(300, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")  # 1.5x from each
    assert db.lookup(between) is None
    assert Dispatcher(tuning=db).select(between) == Dispatcher(tuning=None).select(between)
    nearer = GemmProblem(290, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")
    assert db.lookup(nearer) == large  # no kernel in common: the nearest one's winner, as it is not a tie
    alone = GemmProblem(150, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")  # 450 is past 2x
    assert db.lookup(alone) == large  # one neighbour: its winner


def test_a_neighbours_swizzled_cuda_winner_runs_unswizzled(tmp_path):
    """The cuda target's `neighbour_config`: a swizzle won on the tile grid
    of the problem it was measured on, so a nearby problem takes the
    winner's unswizzled twin; the problem itself keeps the swizzle."""
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    swizzled = dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_m=128, tile_n=256, tile_k=64,
                                              cluster_m=2, cluster_n=1, swizzle=4)
    tuned = GemmProblem(8192, 2048, 8192, "bf16", "bf16", "rcr", "regular", "cuda")
    db.record(tuned, swizzled, 1.0)
    assert db.lookup(tuned) == swizzled
    near = db.winner(GemmProblem(6411, 2391, 4929, "bf16", "bf16", "rcr", "regular", "cuda"))
    assert near.config == swizzled.replace(swizzle=1) and not near.exact
    assert swizzled.name in near.adapted and swizzled.name not in near.config.name and near.neighbours == 1
    # equally near neighbours whose winners are the swizzled kernel and its twin agree: both would run the twin
    two = TuningDatabase(tmp_path / "two.sqlite", shipped=False)
    two.record(GemmProblem(4096, 2048, 8192, "bf16", "bf16", "rcr", "regular", "cuda"), swizzled, 1.0)
    two.record(GemmProblem(8192, 2048, 4096, "bf16", "bf16", "rcr", "regular", "cuda"), swizzled.replace(swizzle=1), 1.0)
    assert two.lookup(GemmProblem(6000, 2048, 6000, "bf16", "bf16", "rcr", "regular", "cuda")) == \
        swizzled.replace(swizzle=1)
    # a fused epilogue's call says both changes
    fused = db.winner(attrs.evolve(GemmProblem(6411, 2391, 4929, "bf16", "bf16", "rcr", "regular", "cuda"),
                                   out_dtype="fp32"))
    assert fused.config == swizzled.replace(swizzle=1, dtype_c="fp32")
    assert "fp32 output" in fused.adapted and swizzled.name in fused.adapted


def _cuda(**fields):
    return dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_k=64, **fields)


def test_neighbours_decide_together_on_a_kernel_good_at_all_of_them(tmp_path):
    """Each of two neighbours has another winner, both measured a third
    kernel within 5% of their best: that one runs between them (the
    nearest winner alone is 2x slower at the other neighbour). Same tiles,
    so the occupancy model changes none of the times."""
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    first, second, both = (_cuda(tile_m=128, tile_n=128, cluster_m=m, cluster_n=n)
                           for m, n in ((1, 2), (2, 1), (2, 4)))
    for shape, times in (((2048, 2048, 4096), (1.0, 2.0, 1.05)), ((4096, 4096, 4096), (2.0, 1.0, 1.05))):
        for config, ms in zip((first, second, both), times):
            db.record(GemmProblem(*shape, "bf16", "bf16", "rcr", "regular", "cuda"), config, ms)
    found = db.winner(GemmProblem(2900, 2900, 4096, "bf16", "bf16", "rcr", "regular", "cuda"))
    assert (found.config, found.neighbours, found.exact) == (both, 2, False)
    assert db.lookup(GemmProblem(2048, 2048, 4096, "bf16", "bf16", "rcr", "regular", "cuda")) == first  # exact


def test_a_neighbours_times_carry_over_by_its_waves_of_tiles(tmp_path):
    """At two neighbours of exactly one wave of 128x256 tiles (132 on 132
    SMs: no GPU here) the data-parallel kernel beat its hybrid stream-K twin
    by 2%; at 143 tiles the data-parallel one needs a second wave for 11
    tiles and the hybrid one shares them out: the hybrid runs. One
    neighbour alone decides by its times as measured (`CARRIED_FROM`)."""
    from dispatcher.plugins import get_manager
    record = get_manager().variant("regular")
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    plain = _cuda(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1)
    hybrid = plain.replace(decomposition="hybrid")
    more = GemmProblem(128 * 13, 256 * 11, 4096, "bf16", "bf16", "rcr", "regular", "cuda")
    for k in (3072, 6144):
        tuned = GemmProblem(128 * 12, 256 * 11, k, "bf16", "bf16", "rcr", "regular", "cuda")
        db.record(tuned, plain, 1.0 * k)
        db.record(tuned, hybrid, 1.02 * k)
        assert db.lookup(tuned, record) == plain
        assert db.lookup(more, record) == (plain if k == 3072 else hybrid)  # one neighbour, then two
    assert db.lookup(GemmProblem(128 * 12, 256 * 11, 4096, "bf16", "bf16", "rcr", "regular", "cuda"), record) == plain
    assert Dispatcher(tuning=db).select(more) == hybrid  # the default selection passes the record
    from dispatcher.kinds import KindProblem  # what a call makes: the same answer as explain's GemmProblem
    call = KindProblem(128 * 13, 256 * 11, 4096, 1, "bf16", "bf16", "rcr", "regular", "cuda",
                       (("activation", "none"), ("bias", "none")), ())
    assert db.lookup(call, record) == hybrid


def test_a_neighbourhood_of_winners_only_takes_the_most_of_the_nearest_that_agree(tmp_path):
    """Rows of one kernel each (older databases, autotune's): the nearest
    ones that measured a kernel in common decide (here the nearer two of
    three), and an empty problem (no tiles to carry times over by) still
    gets an answer, not a math error."""
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    first = _cuda(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2)
    other = _cuda(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1)
    for m, config in ((2000, first), (2600, first), (3900, other)):
        db.record(GemmProblem(m, 4096, 4096, "bf16", "bf16", "rcr", "regular", "cuda"), config, 1.0)
    found = db.winner(GemmProblem(2300, 4096, 4096, "bf16", "bf16", "rcr", "regular", "cuda"))
    assert (found.config, found.neighbours, found.problem) == (first, 2, "2600x4096x4096")
    assert "the 2 nearest tuned problems" in str(found)
    assert db.winner(GemmProblem(2300, 0, 4096, "bf16", "bf16", "rcr", "regular", "cuda")) is None  # 0 vs 4096: too far
    db.record(GemmProblem(2000, 1, 4096, "bf16", "bf16", "rcr", "regular", "cuda"), first, 1.0)
    assert db.lookup(GemmProblem(2300, 0, 4096, "bf16", "bf16", "rcr", "regular", "cuda")) == first


def test_a_database_of_the_winners_table_is_read_as_times(tmp_path):
    """A database written before per-kernel times held one winner per
    problem in a `winners` table: its rows still decide, beside new ones."""
    import sqlite3
    path = tmp_path / "old.sqlite"
    config = dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=32)
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE winners (variant TEXT, target TEXT, arch TEXT, dtype TEXT, out_dtype TEXT, "
                    "layout TEXT, problem TEXT, size_a REAL, size_b REAL, size_c REAL, kernel TEXT, config TEXT, "
                    "latency_ms REAL, source TEXT, updated TEXT, PRIMARY KEY (variant, target, arch, dtype, "
                    "out_dtype, layout, problem))")
        db = TuningDatabase(path, shipped=False)
        problem = GemmProblem(300, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")
        con.execute("INSERT INTO winners VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (*db._scope(problem), "300x200x100", 300, 200, 100, config.name, json.dumps(config.to_dict()),
                     1.0, "old", "then"))
    assert db.lookup(problem) == config and db.has(problem) and len(db.entries()) == 1
    faster = config.replace(tile_m=36, tile_n=96, tile_k=64)
    db.record(problem, faster, 0.5)
    assert db.lookup(problem) == faster and len(db.entries()) == 2


def test_an_export_keeps_each_problems_kernels_near_its_fastest(tmp_path):
    """`write_shipped`: a kernel more than EXPORT_WITHIN slower than its
    problem's fastest is left out (no neighbourhood would choose it); the
    file reads back as the rows kept, each with its config."""
    from dispatcher import tuning
    db = TuningDatabase(tmp_path / "t.sqlite", shipped=False)
    problem = GemmProblem(300, 200, 100, "fp32", "fp32", "rrr", "regular", "cpu")
    configs = [dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=k) for k in (32, 64, 128)]
    for config, ms in zip(configs, (1.0, tuning.EXPORT_WITHIN, tuning.EXPORT_WITHIN * 1.01)):
        db.record(problem, config, ms)
    assert db.export(tmp_path / "x.json", "a test") == 2
    about, rows = tuning.read_shipped(tmp_path / "x.json")
    assert about == "a test" and [r["kernel"] for r in rows] == [c.name for c in configs[:2]]
    assert [dispatcher.KernelConfig.from_dict(r["config"]) for r in rows] == configs[:2]


def _write_many(path, start):
    db = TuningDatabase(path)
    for i in range(start, start + 30):
        problem = GemmProblem(64 + i, 64, 64, "fp32", "fp32", "rcr", "regular", "cpu")
        db.record(problem, dispatcher.KernelConfig.create(tile_m=24, tile_n=64, tile_k=32), float(i))


def test_concurrent_writers(tmp_path):
    path = tmp_path / "t.sqlite"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(path, s)) for s in (0, 15, 30)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert len(TuningDatabase(path).entries()) == 60


@pytest.mark.slow  # 12 s of sweeps and a plot: CI's slow step
def test_report_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    proc = sweep_cli(tmp_path, {"tile_m": {"values": [12, 24]}, "tile_n": {"values": [32]},
                                "tile_k": {"values": [32]}}, "--variant", "grouped", "--out", str(out))
    # grouped needs grouped problems: the CLI rejects a gemm problem file clearly
    assert proc.returncode == 2 and "grouped problem 0" in proc.stderr
    probs = tmp_path / "g.json"
    probs.write_text(json.dumps({"problems": [{"groups": [[8, 32, 16], [0, 32, 16], [40, 64, 32]]}]}))
    proc = subprocess.run([sys.executable, "-m", "dispatcher", "sweep", str(tmp_path / "sweep.json"),
                           "--variant", "grouped", "--problems", str(probs), "--quiet", "--verify",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rep = subprocess.run([sys.executable, "-m", "dispatcher", "report", str(out), "--plot",
                          str(tmp_path / "p.png")], capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr
    assert "3 groups" in rep.stdout and "_grouped" in rep.stdout
    assert (tmp_path / "p.png").stat().st_size > 1000
    row = results.read(out)[0]
    assert row["group_count"] == "3" and row["status"] == "ok" and row["verified"] == "True"
