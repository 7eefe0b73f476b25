"""The mechanics every sweep executor shares, without a cluster: the
benchmark phase's queue when a slot's worker is lost (retried once, then
failed; no row lost or duplicated), slots that cannot start, the choice of
executor and its options, a local sweep that never imports Ray, and a
library installed from another host's cache only if its bytes check out."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import dispatcher
from dispatcher import errors
from dispatcher.api import Dispatcher
from dispatcher.build import BuildCache
from dispatcher.tile_engine import engine, executors, results, runner
from dispatcher.verify import poison, reference

from conftest import assert_each_measured_once, reaped, wait_until

KERNELS = [dispatcher.KernelConfig.create(tile_m=12 * i, tile_n=32, tile_k=32) for i in range(1, 5)]
PROBLEMS = 3
EVERY = {(c.name, i) for c in KERNELS for i in range(PROBLEMS)}


class Rows:
    """A ResultWriter's `write`, into a list."""

    def __init__(self):
        self.rows, self._lock = [], threading.Lock()

    def write(self, row):
        with self._lock:
            self.rows.append(row)


class FakeSlot:
    """Workers that measure instantly; `lose(kernel, idx, worker number)`
    says where a worker is lost (SlotLost) instead, `crash` likewise for
    WorkerDied; `opens`: how many workers it can start before failing."""

    def __init__(self, name, lose=lambda k, i, w: False, crash=lambda k, i: False, opens=99):
        self.label, self.lose, self.crash, self.opens = name, lose, crash, opens
        self.started, self.measured = 0, []

    def open(self):
        if self.started >= self.opens:
            raise runner.SlotLost(f"{self.label} cannot start a worker")
        self.started += 1
        return FakeWorker(self, self.started)


class FakeWorker:
    def __init__(self, slot, number):
        self.slot, self.number, self.label = slot, number, f"{slot.label}/{number}"
        self.killed = False

    def run(self, kernel, timeout):
        name = dispatcher.KernelConfig.from_dict(kernel["config"]).name
        for idx in kernel["problems"]:
            if self.slot.lose(name, idx, self.number):
                raise runner.SlotLost(f"{self.label} lost")
            if self.slot.crash(name, idx):
                raise runner.WorkerDied("worker crashed (signal 11)")
            self.slot.measured.append((name, idx, self.number))
            yield {"kernel": name, "problem_idx": idx, "device": self.label, "status": "ok", "reason": ""}

    def kill(self):
        self.killed = True


def bench(slots):
    out = Rows()
    rows = runner.benchmark(KERNELS, {c.name: "key" for c in KERNELS},
                            {c.name: list(range(PROBLEMS)) for c in KERNELS}, slots, 1.0, out, False)
    assert rows == out.rows  # every row returned was written, once
    keys = [(r["kernel"], r["problem_idx"]) for r in rows]
    assert len(keys) == len(set(keys)) and set(keys) == EVERY
    return {(r["kernel"], r["problem_idx"]): r for r in rows}


def test_a_lost_worker_s_unmeasured_problems_are_retried_once_elsewhere():
    k0 = KERNELS[0].name
    a = FakeSlot("a", lose=lambda k, i, w: (k, i, w) == (k0, 1, 1))  # its first worker, mid-kernel
    b = FakeSlot("b")
    rows = bench([a, b])
    assert all(r["status"] == "ok" for r in rows.values())
    # problem 0 was measured before the loss and not again; 1 and 2 by a fresh worker
    measured = [(k, i) for s in (a, b) for k, i, _ in s.measured if k == k0]
    assert sorted(measured) == [(k0, 0), (k0, 1), (k0, 2)]
    assert rows[(k0, 1)]["device"] != "a/1" and rows[(k0, 0)]["device"] == "a/1"


def test_a_measurement_that_loses_its_worker_twice_fails_with_the_reason():
    k1 = KERNELS[1].name
    doomed = lambda k, i, w: (k, i) == (k1, 2)
    rows = bench([FakeSlot("a", lose=doomed), FakeSlot("b", lose=doomed)])
    bad = {key for key, r in rows.items() if r["status"] != "ok"}
    assert bad == {(k1, 2)}
    assert "lost (on the retry too)" in rows[(k1, 2)]["reason"]


def test_a_crash_fails_its_rows_without_a_retry():
    k2 = KERNELS[2].name
    slot = FakeSlot("a", crash=lambda k, i: k == k2 and i >= 1)
    rows = bench([slot])
    assert {key for key, r in rows.items() if r["status"] != "ok"} == {(k2, 1), (k2, 2)}
    assert rows[(k2, 1)]["reason"] == "worker crashed (signal 11)"
    assert [m for m in slot.measured if m[0] == k2] == [(k2, 0, 1)]  # not run again


def test_slots_that_cannot_start_retire_and_the_last_fails_what_is_left():
    k3 = KERNELS[3].name
    # b's one worker is lost mid-sweep and b cannot start another: a does the rest
    a = FakeSlot("a")
    b = FakeSlot("b", lose=lambda k, i, w: k == k3 and i == 0, opens=1)
    assert all(r["status"] == "ok" for r in bench([a, b]).values())
    # no slot can start a worker at all: every row fails, saying why
    rows = bench([FakeSlot("a", opens=0), FakeSlot("b", opens=0)])
    assert all(r["status"] == "failed" and r["reason"].startswith("no benchmark slot left (")
               for r in rows.values())


def test_a_bug_in_a_slot_stops_the_sweep_instead_of_hanging_it():
    class Broken(FakeSlot):
        def open(self):
            raise KeyError("bug")
    with pytest.raises(KeyError):
        runner.benchmark(KERNELS, {c.name: "key" for c in KERNELS}, {c.name: [0] for c in KERNELS},
                         [Broken("a"), FakeSlot("b", lose=lambda k, i, w: True)], 1.0, Rows(), False)


def _options(**kw):
    return engine.SweepOptions(config={}, variant="regular", **kw)


def test_executor_options_belong_to_their_executor():
    with pytest.raises(errors.ConfigError, match="unknown executor 'dask'; known: local, ray"):
        executors.create(_options(executor="dask"))
    with pytest.raises(errors.ConfigError, match="--address is an option of --executor ray, not of --executor local"):
        executors.create(_options(address="10.0.0.1:6379"))
    with pytest.raises(errors.ConfigError, match="--slot-cpus is an option of --executor ray"):
        executors.create(_options(slot_cpus=4))
    with pytest.raises(errors.ConfigError, match="--devices is an option of --executor local, not of --executor ray"):
        executors.create(_options(executor="ray", devices="0,1"))
    assert isinstance(executors.create(_options(devices="0,1")), executors.LocalExecutor)


def test_without_ray_the_ray_executor_says_how_to_get_it(monkeypatch):
    real = executors.importlib.util.find_spec
    monkeypatch.setattr(executors.importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real(n, *a))
    with pytest.raises(errors.ConfigError, match=r"pip install 'gemm-dispatcher\[ray\]'"):
        executors.create(_options(executor="ray"))


def test_a_local_sweep_does_not_import_ray(tmp_path):
    code = f"""
import sys
from dispatcher import cli
from dispatcher.tile_engine import engine
summary = engine.run(engine.SweepOptions(
    config={{"tile_m": {{"values": [24]}}, "tile_n": {{"values": [32]}}, "tile_k": {{"values": [32]}}}},
    variant="regular", problems=[[20, 30, 40]], out={str(tmp_path / 'out')!r}, tuning=None, progress=False))
assert summary["measured"] == 1 and summary["failed_rows"] == 0, summary
print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_library_from_another_host_is_installed_only_if_its_bytes_check_out(tmp_path):
    config = dispatcher.KernelConfig.create(layout="rrr", tile_m=24, tile_n=64, tile_k=32)
    here = Dispatcher(tuning=None)
    built = here.build(here.codegen(config))
    image, meta = built.path.read_bytes(), dict(built.metadata)
    there = BuildCache(tmp_path / "there")

    damaged = bytearray(image)
    damaged[len(damaged) // 2] ^= 0x40
    with pytest.raises(errors.CacheError, match="does not have the SHA-256 its builder recorded"):
        there.install(built.key, meta, bytes(damaged))
    with pytest.raises(errors.CacheError, match="names no plain file"):
        there.install(built.key, {**meta, "library": "../../evil.so"}, image)
    assert not any((tmp_path / "there" / "kernels").iterdir())  # nothing published
    assert not any((tmp_path / "there" / "tmp").iterdir())       # nor left half-written

    installed = there.install(built.key, meta, image)
    assert installed.key == built.key and installed.path.read_bytes() == image
    # a dispatcher on that cache runs it without compiling (the entry stays the one installed)
    rng = np.random.default_rng(7)
    a = rng.standard_normal((50, 70)).astype(np.float32)
    b = rng.standard_normal((70, 90)).astype(np.float32)
    out = poison(np.empty((50, 90), np.float32))
    dispatcher.gemm(a, b, out=out, config=config, dispatcher=Dispatcher(cache=there, tuning=None))
    assert np.allclose(out, reference(a, b), rtol=1e-4, atol=1e-4)
    assert json.loads((there.entry_dir(built.key) / "meta.json").read_text()) == meta


def _worker_pids(parent: int) -> list:
    """The benchmark worker processes the sweep `parent` started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
            if stat and int(stat.rsplit(")", 1)[1].split()[1]) == parent \
                    and b"dispatcher.tile_engine.worker" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the worker through /proc")
def test_a_worker_killed_from_outside_is_replaced_and_its_problems_measured_once(tmp_path):
    """SIGKILL (the OOM killer, a user) is not the kernel's doing: unlike a
    crash, the kernel's unmeasured problems are retried on a fresh worker."""
    cfg, probs, out, log = tmp_path / "s.json", tmp_path / "p.json", tmp_path / "out", tmp_path / "log"
    cfg.write_text(json.dumps({"tile_m": {"values": [12, 24]}, "tile_n": {"values": [32, 64]},
                               "tile_k": {"values": [32]}}))
    probs.write_text(json.dumps([[32, 32, 32], [48, 64, 32]]))
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dispatcher", "sweep", str(cfg), "--problems", str(probs),
                                 "--quiet", "--json", "--repeat", "2000", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    with reaped(proc):
        wait_until(lambda: len(results.read(out)) >= 2 and _worker_pids(proc.pid), [proc], 300,
                   "two rows and a running worker", log)
        before = results.read(out)
        os.kill(_worker_pids(proc.pid)[0], signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log.read_text()
    assert_each_measured_once(results.read(out), before, 4 * 2)
    assert "killed (signal 9)" in log.read_text() and "back on the queue" in log.read_text()
    assert json.loads(stdout)["failed_rows"] == 0
