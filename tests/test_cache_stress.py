"""The build cache under concurrency, corruption and kills (issue 13).

- A bounded run of `benchmarks/cache_stress.py`: worker processes and
  threads building, loading, running, pruning, listing and corrupting one
  cache and writing one tuning database while workers are SIGKILLed; no
  wrong answer, no crash, no lost tuning row, no half-written entry seen.
- A `hypothesis` state machine over one process's view of the cache:
  builds, corruptions of every kind, prunes and listings in any order.
- Regression tests for the defects the stress run found: races between
  builders, `prune` and listings, and a library changed after the cache
  checked it (loaded anyway) or after it was loaded (crashed the process).
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

import dispatcher
from dispatcher import build, errors
from dispatcher.api import Dispatcher
from dispatcher.build import BuildCache
from dispatcher.library import Library

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from cache_stress import stress_configs  # noqa: E402

CONFIGS = stress_configs()[:3]


class CopyToolchain:
    """The real toolchain's identity (so the cache keys are the real ones),
    but a compile copies the library the real one built once: the cache's
    logic runs unchanged, without a compiler's seconds per rebuild."""

    def __init__(self, real, pristine: dict):
        self.flags, self.cache_flags, self.identity = real.flags, real.cache_flags, real.identity
        self.pristine, self.compiles = pristine, 0

    def compile(self, source, output, extra_flags=(), shared_dir=None):
        self.compiles += 1
        Path(output).write_bytes(self.pristine[Path(output).name[3:-3]])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """name -> library bytes of each config, compiled once."""
    from dispatcher.targets.cpu import Toolchain

    cache = BuildCache(tmp_path_factory.mktemp("pristine"))
    d = Dispatcher(cache=cache, tuning=None)
    # the toolchain of the configs' own ISA (fp32 needs none of the active
    # spec's extensions, so it is built for the plain base): the one a
    # Dispatcher uses for them, so _run finds the entries the machine made
    (isa,) = {c.target_params["isa"] for c in CONFIGS}
    tc = Toolchain.find(isa)
    return {c.name: d.build(d.codegen(c)).path.read_bytes() for c in CONFIGS}, tc


@pytest.fixture
def toolchain(pristine):
    return CopyToolchain(pristine[1], pristine[0])


def _source(config):
    return Dispatcher(tuning=None).codegen(config)


def _run(cache, config, seed=0) -> bool:
    """True if `config` computes one small GEMM right through `cache` (a fresh Dispatcher)."""
    rng = np.random.default_rng(seed)
    order = {"r": "C", "c": "F"}
    a = np.asarray(rng.uniform(-1, 1, (37, 29)), np.float32, order=order[config.layout[0]])
    b = np.asarray(rng.uniform(-1, 1, (29, 23)), np.float32, order=order[config.layout[1]])
    out = dispatcher.gemm(a, b, config=config, dispatcher=Dispatcher(cache=cache, tuning=None))
    return np.allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def _replace(path: Path, data: bytes):
    """Write `data` as a new file renamed over `path` (a process that mapped the old one keeps it)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.rename(tmp, path)


# ------------------------------------------------------------ the stress run
@pytest.mark.stress
def test_bounded_stress_run(tmp_path):
    """About 25 s: 3 workers x 2 threads, a kill every ~2.5 s, a corruption every ~1.5 s."""
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "cache_stress.py"), "--seconds", "20",
           "--workers", "3", "--threads", "2", "--kill-every", "2.5", "--corrupt-every", "1.5",
           "--nice", "0", "--seed", "1", "--dir", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=240)  # workers exit within 0.5 s of their controller
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate(timeout=30)
        pytest.fail(f"the stress run did not finish within 240 s:\n{log[-3000:]}")
    assert out.exists(), log[-3000:]
    figures = json.loads(out.read_text())
    detail = json.dumps({k: figures.get(k) for k in (
        "failures", "crash_reports", "samples", "unexplained_samples", "lost_rows_sample",
        "hung_reports", "final_errors", "at_end", "recovery")}, indent=1)[-6000:]
    assert figures["ok"] and proc.returncode == 0, detail
    assert figures["kills"] > 0 and figures["corruptions_injected"] > 0, detail
    assert figures["actions"]["gemm"] > 0 and figures["actions"]["record"] > 0, detail


# ------------------------------------------------------------ state machine
class CacheMachine(RuleBasedStateMachine):
    """One process's sequence of cache operations against a model: an entry
    is sound, corrupt or absent; a build makes it sound (moving a corrupt one
    aside), prune removes corrupt ones, entries() reports exactly the model."""

    tc = tmp = None  # set by the test

    def __init__(self):
        super().__init__()
        self.root = Path(self.tmp) / f"m{id(self)}"
        self.cache = BuildCache(self.root)
        self.sources = [_source(c) for c in CONFIGS]
        self.keys = [self.cache.key(s, self.tc) for s in self.sources]
        self.model = ["absent"] * len(CONFIGS)
        self.strays = 0

    def teardown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def _entry(self, i) -> Path:
        return self.cache.entry_dir(self.keys[i])

    @rule(i=st.integers(0, len(CONFIGS) - 1), fresh_run=st.booleans())
    def build_and_run(self, i, fresh_run):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = self.cache.build(self.sources[i], self.tc)
        assert built.name == CONFIGS[i].name
        self.model[i] = "sound"
        if fresh_run:
            assert _run(self.cache, CONFIGS[i], seed=i)

    @precondition(lambda self: "sound" in self.model)
    @rule(data=st.data(), mode=st.sampled_from(
        ["truncate", "flip", "delete_library", "delete_meta", "garbage_meta", "swap_library",
         "bad_hash_in_meta"]))
    def corrupt(self, data, mode):
        i = data.draw(st.sampled_from([j for j, s in enumerate(self.model) if s == "sound"]))
        entry = self._entry(i)
        meta = json.loads((entry / "meta.json").read_text())
        lib = entry / meta["library"]
        blob = lib.read_bytes()
        if mode == "truncate":
            _replace(lib, blob[:data.draw(st.integers(0, len(blob) - 1))])
        elif mode == "flip":
            pos = data.draw(st.integers(0, len(blob) - 1))
            _replace(lib, blob[:pos] + bytes([blob[pos] ^ 0x5A]) + blob[pos + 1:])
        elif mode == "delete_library":
            lib.unlink()
        elif mode == "delete_meta":
            (entry / "meta.json").unlink()
        elif mode == "garbage_meta":
            (entry / "meta.json").write_bytes(data.draw(st.sampled_from(
                [b"", b"{", b"[]", b"null", b'{"name": 5}', b"\xff\xfe"])))
        elif mode == "swap_library":
            other = self.tc.pristine[CONFIGS[(i + 1) % len(CONFIGS)].name]
            _replace(lib, other)
            meta["sha256"] = hashlib.sha256(other).hexdigest()
            (entry / "meta.json").write_text(json.dumps(meta))
        else:
            meta["sha256"] = "0" * 64
            (entry / "meta.json").write_text(json.dumps(meta))
        self.model[i] = "corrupt"
        with pytest.raises(errors.CacheError, match="corrupt"):
            self.cache.lookup(self.keys[i], CONFIGS[i].name)

    @rule()
    def stray_folder(self):
        (self.root / "kernels" / f"stray{self.strays}").mkdir()
        self.strays += 1

    @rule()
    def prune(self):
        expected = self.model.count("corrupt") + self.strays
        assert self.cache.prune() == expected
        self.model = ["absent" if s == "corrupt" else s for s in self.model]
        self.strays = 0

    @rule()
    def entries(self):
        listed = {e["key"]: e["status"] for e in self.cache.entries()}
        want = {self.keys[i]: {"sound": "ok", "corrupt": "corrupt"}[s]
                for i, s in enumerate(self.model) if s != "absent"}
        assert {k: v for k, v in listed.items() if not k.startswith("stray")} == want
        assert sum(k.startswith("stray") for k in listed) == self.strays

    @invariant()
    def quarantine_is_bounded_and_no_staging_is_left(self):
        tmp = list((self.root / "tmp").iterdir())
        assert sum(".corrupt." in p.name for p in tmp) <= build.QUARANTINE_KEEP
        assert all(".corrupt." in p.name for p in tmp), tmp  # nothing was killed here


def test_cache_state_machine(toolchain, tmp_path):
    CacheMachine.tc, CacheMachine.tmp = toolchain, tmp_path
    run_state_machine_as_test(CacheMachine, settings=settings(
        max_examples=25, stateful_step_count=25, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))


# ------------------------------------------------- defects the stress run found
def test_listing_skips_an_entry_moved_away_meanwhile(toolchain, tmp_path, monkeypatch):
    """entries() (so `kernels` and prune) raised AttributeError when an entry
    was moved aside between the folder listing and its reading."""
    cache = BuildCache(tmp_path / "cache")
    cache.build(_source(CONFIGS[0]), toolchain)
    read = build._read_entry

    def moved_meanwhile(entry, name=None):
        os.rename(entry, cache.root / "tmp" / "moved")  # another process's set-aside
        return read(entry, name)
    monkeypatch.setattr(build, "_read_entry", moved_meanwhile)
    assert cache.entries() == []


def test_two_prunes_at_once(tmp_path, monkeypatch):
    """prune raised FileNotFoundError for a leftover another prune removed first."""
    cache = BuildCache(tmp_path / "cache")
    for name in ("a.killed", "b.killed"):
        (cache.root / "tmp" / name).mkdir()
        os.utime(cache.root / "tmp" / name, (0, 0))
    rmtree = shutil.rmtree

    def the_other_prune_too(path, *args, **kw):
        for name in ("a.killed", "b.killed"):
            rmtree(cache.root / "tmp" / name, ignore_errors=True)
    monkeypatch.setattr(build.shutil, "rmtree", the_other_prune_too)
    assert cache.prune() == 1
    assert list((cache.root / "tmp").iterdir()) == []


def test_a_builder_never_moves_aside_an_entry_another_just_rebuilt(toolchain, tmp_path, monkeypatch):
    """Two builders see one corrupt entry; the first moves it aside and
    rebuilds. The second moved the *rebuilt* entry aside (a reader loading it
    failed) and compiled again. Now a corrupt entry is moved aside only
    under its lock, after checking it again."""
    cache = BuildCache(tmp_path / "cache")
    source = _source(CONFIGS[0])
    built = cache.build(source, toolchain)
    built.path.write_bytes(b"damaged")
    read, state = build._read_entry, {"raced": False}

    def other_builder_wins(entry, name=None):
        try:
            return read(entry, name)
        except errors.CacheError:
            if not state["raced"]:  # this builder saw it corrupt: the other one rebuilds now
                state["raced"] = True
                other = threading.Thread(target=BuildCache(cache.root).build, args=(source, toolchain))
                other.start()
                other.join(60)
            raise
    monkeypatch.setattr(build, "_read_entry", other_builder_wins)
    with pytest.warns(UserWarning, match="corrupt"):
        assert cache.build(source, toolchain).path == built.path
    assert toolchain.compiles == 2  # the first build and one rebuild, not two
    monkeypatch.setattr(build, "_read_entry", read)
    quarantined = sorted((cache.root / "tmp").glob("*.corrupt.*"))
    assert len(quarantined) == 1
    assert (quarantined[0] / built.path.name).read_bytes() == b"damaged"
    assert [e["status"] for e in cache.entries()] == ["ok"]


def test_prune_leaves_an_entry_rebuilt_since_it_was_listed(toolchain, tmp_path, monkeypatch):
    """prune deleted an entry that a builder had rebuilt after prune listed it
    corrupt, under readers' feet; now it checks again under the entry's lock."""
    cache = BuildCache(tmp_path / "cache")
    source = _source(CONFIGS[0])
    cache.build(source, toolchain).path.write_bytes(b"damaged")
    listing = BuildCache.entries

    def rebuilt_after_listing(self):
        items = listing(self)
        with pytest.warns(UserWarning, match="corrupt"):
            BuildCache(cache.root).build(source, toolchain)
        return items
    monkeypatch.setattr(BuildCache, "entries", rebuilt_after_listing)
    assert cache.prune() == 0
    monkeypatch.setattr(BuildCache, "entries", listing)
    assert [e["status"] for e in cache.entries()] == ["ok"]


def _child(cache_root: Path, body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import os, sys, numpy as np, dispatcher
        from dispatcher import errors
        from dispatcher.api import Dispatcher
        from dispatcher.build import BuildCache
        cfg = dispatcher.KernelConfig.from_dict({config})
        d = Dispatcher(cache=BuildCache({root!r}), tuning=None)
        a = np.ones((40, 30), np.float32); b = np.ones((30, 20), np.float32)
        def run(d):
            return bool(np.allclose(dispatcher.gemm(a, b, config=cfg, dispatcher=d), 30))
    """).format(config=CONFIGS[0].to_dict(), root=str(cache_root)) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_library_damaged_in_place_after_loading_keeps_running(toolchain, tmp_path):
    """A process that loaded a sound library died (SIGBUS) when the file was
    truncated in place afterwards, or ran other code (SIGTRAP, wrong values)
    when bytes were overwritten: it now runs a private copy of what it checked."""
    cache = BuildCache(tmp_path / "cache")
    cache.build(_source(CONFIGS[0]), toolchain)
    done = _child(cache.root, """
        built = d.build(d.codegen(cfg))
        assert run(d)
        size = os.path.getsize(built.path)
        with open(built.path, "r+b") as f:
            f.seek(0x1000)
            f.write(b"\\xcc" * (size - 0x2000))  # int3 over the code
            f.truncate(size // 3)
        print(run(d), run(d))
    """)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["True", "True"]


def test_a_library_changed_between_check_and_load_is_not_loaded(toolchain, tmp_path):
    """The cache checked the library's hash, then dlopen read whatever the
    file held by then: a library truncated in between crashed the process
    (SIGBUS). Now the bytes loaded are the bytes checked, else CacheError,
    and the next call moves the entry aside and rebuilds it."""
    cache = BuildCache(tmp_path / "cache")
    cache.build(_source(CONFIGS[0]), toolchain)
    done = _child(cache.root, """
        import warnings
        built = d.build(d.codegen(cfg))
        cut = built.path.with_name("cut")
        cut.write_bytes(built.path.read_bytes()[:20000])
        os.rename(cut, built.path)
        try:
            d.load(built, cfg)
            print("loaded")
        except errors.CacheError as e:
            print("refused", "changed after its entry was checked" in str(e))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            print(run(d))
    """)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["refused", "True", "True"]
