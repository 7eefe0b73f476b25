"""Sweeps with `--executor ray` on a real two-node Ray cluster on this
machine (`ray.cluster_utils.Cluster`: a head and a second node, each with
its own CPUs and its own build cache, so libraries can only reach a node
through the object store): the same rows and winners as the local
executor, crash/hang/wrong kernels failing their rows, `--resume`, and a
node killed mid-sweep. Marked `ray` (cluster start-up is slow on 2 cores):
`python -m pytest -m ray`, which `.ci/run` runs after the fast suite."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.tile_engine import results

from conftest import assert_each_measured_once, make_importable, reaped, wait_until

ray_cluster_utils = pytest.importorskip("ray.cluster_utils")
pytestmark = pytest.mark.ray

HERE = Path(__file__).resolve().parent
PROBLEMS = [[64, 96, 80], [33, 65, 17], [128, 128, 128]]
MARKER = "DISPATCHER_RAY_TEST_RUN"  # in the environment of every process a test starts


def _marked_processes(marker: str) -> list:
    """Pids of the live processes (not this one) whose environment holds MARKER=marker."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile, or not ours
    return found


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A head (3 CPUs) and a second node (2 CPUs), each with its own build
    cache; every process started from here on carries a marker, and none
    may outlive the test."""
    if not Path("/proc/self/environ").exists():
        pytest.skip("checks for left-over processes through /proc")
    site_env = make_importable(tmp_path / "site", HERE / "plugins" / "faulty_gemm", "faulty-gemm",
                               "faulty_gemm", "faulty_gemm.plugin")
    monkeypatch.setenv("PYTHONPATH", site_env["PYTHONPATH"])
    monkeypatch.setenv(MARKER, str(tmp_path))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    caches = {"head": tmp_path / "cache-head", "node2": tmp_path / "cache-node2"}
    fast_health = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
    c = ray_cluster_utils.Cluster(shutdown_at_exit=True)
    try:
        c.head = c.add_node(num_cpus=3, include_dashboard=False, _system_config=fast_health,
                            env_vars={"DISPATCHER_CACHE_DIR": str(caches["head"])})
        c.node2 = c.add_node(num_cpus=2, env_vars={"DISPATCHER_CACHE_DIR": str(caches["node2"])})
        c.caches = {c.head.node_id[:8]: caches["head"], c.node2.node_id[:8]: caches["node2"]}
        yield c
    finally:
        c.shutdown()
        wait_until(lambda: not _marked_processes(str(tmp_path)), [], 60,
                   "every process of the Ray cluster and the sweeps to exit")


def sweep(tmp_path, behaviours, *args, tiles=(24,), popen=False, log=None):
    cfg = tmp_path / "sweep.json"
    cfg.write_text(json.dumps({"behaviour": {"values": list(behaviours)}, "tile_m": {"values": list(tiles)},
                               "tile_n": {"values": [64]}, "tile_k": {"values": [32]}}))
    probs = tmp_path / "problems.json"
    probs.write_text(json.dumps(PROBLEMS))
    cmd = [sys.executable, "-m", "dispatcher", "sweep", str(cfg), "--problems", str(probs),
           "--variant", "faulty", "--quiet", "--json", *args]
    if popen:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def outcome(row) -> tuple:
    """What a row says about its (kernel, problem), timings aside."""
    reason = row["reason"]
    for kind in ("crashed (signal 11)", "timed out", "wrong result"):
        reason = kind if kind in reason else reason
    return row["kernel"], row["problem_idx"], row["status"], reason


def test_ray_sweep_matches_local_rows_and_winners(tmp_path, cluster):
    behaviours = ("ok", "slow", "segfault", "hang", "wrong")
    common = ["--verify", "--kernel-timeout", "3", "--repeat", "3", "--warmup", "1"]
    local = sweep(tmp_path, behaviours, *common, "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    remote = sweep(tmp_path, behaviours, *common, "--out", str(tmp_path / "ray"),
                   "--executor", "ray", "--address", cluster.address)
    assert remote.returncode == 0, remote.stderr

    local_rows, ray_rows = results.read(tmp_path / "local"), results.read(tmp_path / "ray")
    assert len(ray_rows) == len({(r["kernel"], r["problem_idx"]) for r in ray_rows}) == 5 * len(PROBLEMS)
    assert sorted(map(outcome, ray_rows)) == sorted(map(outcome, local_rows))
    assert {outcome(r)[3] for r in ray_rows if r["status"] != "ok"} == \
        {"crashed (signal 11)", "timed out", "wrong result"}
    winners = {i: w["kernel"] for i, w in json.loads(remote.stdout)["winners"].items()}
    assert winners == {i: w["kernel"] for i, w in json.loads(local.stdout)["winners"].items()}
    assert len(winners) == len(PROBLEMS) and all(k.endswith("_faulty_ok") for k in winners.values())

    # one slot per node (3 // 2 + 2 // 2 CPUs of 2): both measured, each from its own
    # cache, which holds the library of every kernel measured there (built
    # there or received through the object store)
    by_node = {}
    for r in ray_rows:
        by_node.setdefault(r["device"].split("@")[1], set()).add(r["kernel"])
    assert set(by_node) == set(cluster.caches)
    for node, kernels in by_node.items():
        cached = {json.loads((e / "meta.json").read_text())["name"]
                  for e in (cluster.caches[node] / "kernels").iterdir()}
        assert kernels <= cached

    # --resume on the Ray executor: cut the results to 4 rows, resume, get the same set back
    out = tmp_path / "ray"
    csv_lines = (out / "results.csv").read_text().splitlines(keepends=True)
    (out / "results.csv").write_text("".join(csv_lines[:5]))
    resumed = sweep(tmp_path, behaviours, *common, "--out", str(out), "--resume",
                    "--executor", "ray", "--address", cluster.address)
    assert resumed.returncode == 0, resumed.stderr
    again = results.read(out)
    assert len(again) == len({(r["kernel"], r["problem_idx"]) for r in again}) == 5 * len(PROBLEMS)
    assert sorted(map(outcome, again)) == sorted(map(outcome, local_rows))
    assert again[:4] == ray_rows[:4] and json.loads(resumed.stdout)["measured"] == len(again) - 4


def _actor_processes(marker: str) -> list:
    """Pids of the live benchmark-slot actors of this test's cluster."""
    return [pid for pid in _marked_processes(marker)
            if (Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::SlotActor"))]


def test_an_actor_and_a_node_killed_mid_sweep_lose_and_duplicate_no_row(tmp_path, cluster):
    """A slot's actor is SIGKILLed, then the second node dies, each while
    measuring: their in-flight kernels go back on the queue and other
    actors measure them; every (kernel, problem) ends up exactly once, and
    every row the sweep had written stays."""
    node2 = cluster.node2.node_id[:8]
    tiles = (12, 24, 36, 48, 60, 72)
    log = tmp_path / "sweep.log"
    with open(log, "w") as err:
        proc = sweep(tmp_path, ["ok"], "--repeat", "10000", "--warmup", "1", "--slot-timeout", "15",
                     "--out", str(tmp_path / "out"), "--executor", "ray", "--address", cluster.address,
                     tiles=tiles, popen=True, log=err)
    with reaped(proc):
        wait_until(lambda: any(node2 in r["device"] for r in results.read(tmp_path / "out")), [proc],
                   240, "a row measured on the second node", log)
        before = results.read(tmp_path / "out")
        os.kill(_actor_processes(str(tmp_path))[0], signal.SIGKILL)
        wait_until(lambda: len(results.read(tmp_path / "out")) >= len(before) + 2, [proc], 120,
                   "two more rows after an actor was killed", log)
        cluster.remove_node(cluster.node2, allow_graceful=False)
        stdout, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, log.read_text()
    rows = results.read(tmp_path / "out")
    assert len(before) < len(rows), "the node died after the sweep: nothing tested"
    # the retried problems were measured by other actors: none failed
    assert_each_measured_once(rows, before, len(tiles) * len(PROBLEMS))
    stderr = log.read_text()
    assert stderr.count("back on the queue") >= 2, stderr[-3000:]
    assert json.loads(stdout)["failed_rows"] == 0
