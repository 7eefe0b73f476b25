"""The content-addressed build cache: reuse, atomic publish, concurrency, corruption."""

import hashlib
import json
import multiprocessing as mp
import os
import pwd
import queue
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

import dispatcher
from dispatcher import build, errors
from dispatcher.api import Dispatcher
from dispatcher.build import BuildCache
from dispatcher.library import Library
from dispatcher.targets import cpu_isa
from dispatcher.tuning import TuningDatabase

from conftest import wait_until

SMALL = dict(tile_m=24, tile_n=64, tile_k=32)


class CountingToolchain:
    """The real toolchain, counting compilations."""

    def __init__(self, real):
        self.real, self.compiles = real, 0
        self.flags, self.cache_flags, self.identity = real.flags, real.cache_flags, real.identity

    def compile(self, *args, **kw):
        self.compiles += 1
        return self.real.compile(*args, **kw)


def _source(**fields):
    d = Dispatcher(cache=BuildCache(os.environ["DISPATCHER_CACHE_DIR"]))
    return d.codegen(dispatcher.KernelConfig.create(**{**SMALL, **fields}))


def _toolchain():
    from dispatcher.targets.cpu import Toolchain
    return Toolchain.find(cpu_isa.active().name)


def _modes(folder: Path) -> dict:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in (folder, *folder.rglob("*"))}


@pytest.fixture
def read_only(monkeypatch):
    """make(folder): `folder` becomes read-only to this process, by its mode
    and, since root writes through any mode, by the cache's writability check
    too. Modes are restored afterwards so that pytest can delete the folder."""
    folders = []
    writable = build._writable
    monkeypatch.setattr(build, "_writable",
                        lambda p: writable(p) and not any(Path(p).is_relative_to(f) for f in folders))

    def make(folder: Path):
        folders.append(folder)
        for d in (folder, *folder.rglob("*")):
            if d.is_dir():
                d.chmod(0o555)
    yield make
    for folder in folders:
        for d in (folder, *folder.rglob("*")):
            if d.is_dir():
                d.chmod(0o755)


def test_second_build_compiles_nothing(tmp_path):
    cache = BuildCache(tmp_path / "cache")
    tc = CountingToolchain(_toolchain())
    source = _source(dtype="fp16")
    first = cache.build(source, tc)
    second = BuildCache(tmp_path / "cache").build(source, tc)
    assert tc.compiles == 1
    assert first.path == second.path
    assert Library(first.path, expected_name=source.name).name == source.name
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DISPATCHER_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert BuildCache().root == tmp_path / "elsewhere"


def _build_in_child(root, queue):
    try:
        built = BuildCache(root).build(_source(dtype="bf16", layout="crr"), _toolchain())
        queue.put(str(built.path))
    except Exception as e:  # reported to the parent
        queue.put(f"error: {e!r}")


def test_two_processes_building_the_same_config(tmp_path):
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    root = str(tmp_path / "shared")
    procs = [ctx.Process(target=_build_in_child, args=(root, reports)) for _ in range(2)]
    for p in procs:
        p.start()
    results = []

    def both_reported():
        try:
            while True:
                results.append(reports.get_nowait())
        except queue.Empty:
            return len(results) == len(procs)
    try:
        wait_until(both_reported, procs, 300, "both builders' results")
    finally:
        for p in procs:
            p.join(timeout=60)
            p.kill()
    assert all(not r.startswith("error") for r in results), results
    assert results[0] == results[1]
    assert len(list((tmp_path / "shared" / "kernels").iterdir())) == 1


def test_corrupt_entry_is_detected_and_rebuilt(tmp_path):
    cache = BuildCache(tmp_path / "cache")
    source = _source(dtype="int8")
    built = cache.build(source, _toolchain())
    with open(built.path, "r+b") as f:  # flip bytes in the middle of the library
        f.seek(os.path.getsize(built.path) // 2)
        f.write(b"\xde\xad\xbe\xef")
    with pytest.raises(errors.CacheError, match="corrupt"):
        cache.lookup(built.key)
    assert [e["status"] for e in cache.entries()] == ["corrupt"]
    with pytest.warns(UserWarning, match="corrupt"):
        rebuilt = cache.build(source, _toolchain())
    assert Library(rebuilt.path, expected_name=source.name)
    assert cache.lookup(built.key) is not None


def test_metadata_records_the_config(tmp_path):
    cache = BuildCache(tmp_path / "cache")
    source = _source()
    built = cache.build(source, _toolchain())
    meta = json.loads((built.path.parent / "meta.json").read_text())
    assert meta["name"] == source.name
    assert dispatcher.KernelConfig.from_dict(meta["config"]) == source.config


def test_killed_build_leaves_no_entry(tmp_path):
    """A build killed mid-compile leaves only a staging dir that prune removes."""
    cache = BuildCache(tmp_path / "cache")
    stale = cache.root / "tmp" / "deadbeef.killed"
    stale.mkdir()
    os.utime(stale, (0, 0))
    assert cache.entries() == []
    assert cache.prune() == 1
    assert not stale.exists()


def test_an_existing_cache_folder_keeps_its_mode(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # e.g. a folder all users of a machine share
    BuildCache(shared)
    Dispatcher(cache=BuildCache(shared))
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "kernels").stat().st_mode) == 0o700  # what it creates is private


def test_a_read_only_shared_cache_is_read_and_builds_go_to_the_user_cache(tmp_path, monkeypatch,
                                                                          read_only):
    shared, xdg = tmp_path / "shared", tmp_path / "xdg"
    prebuilt, missing = _source(dtype="fp16", layout="ccr"), _source(dtype="bf16", layout="ccr")
    BuildCache(shared).build(prebuilt, _toolchain())
    read_only(shared)
    modes = _modes(shared)
    monkeypatch.setenv("DISPATCHER_CACHE_DIR", str(shared))
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    cache, tc = BuildCache(), CountingToolchain(_toolchain())
    assert (cache.shared, cache.root) == (shared, xdg / "gemm-dispatcher")
    assert cache.build(prebuilt, tc).path.is_relative_to(shared) and tc.compiles == 0
    assert cache.build(missing, tc).path.is_relative_to(cache.root) and tc.compiles == 1
    assert sorted(e.get("shared", False) for e in cache.entries()) == [False, True]
    assert Dispatcher().library(prebuilt.config).name == prebuilt.name
    assert TuningDatabase.default().path.parent == cache.root == Dispatcher().tuning.path.parent
    assert _modes(shared) == modes  # nothing in it changed, nothing added


def _no_passwd_entry(uid):
    raise KeyError(uid)


@pytest.mark.parametrize("problem", ["a file", "read-only", "read-only everywhere", "no home"])
def test_cache_problems_are_errors_that_say_what_to_do(problem, tmp_path, monkeypatch, read_only):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "cache"
    if problem == "a file":
        root.write_text("")
    elif problem == "read-only":  # and nothing prebuilt in it to read
        root.mkdir()
        read_only(root)
    elif problem == "read-only everywhere":  # a prebuilt cache, but no writable one to build into
        (root / "kernels").mkdir(parents=True)
        (tmp_path / "xdg").mkdir()
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        read_only(root)
        read_only(tmp_path / "xdg")
    else:
        root = None
        for name in ("DISPATCHER_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(pwd, "getpwuid", _no_passwd_entry)
    with pytest.raises(errors.CacheError, match="set DISPATCHER_CACHE_DIR to a writable directory"):
        BuildCache(root)


def test_a_library_swapped_for_another_kernels_is_corrupt_and_rebuilt(tmp_path):
    """Another kernel's library with its hash recomputed: `kernels` reports the
    entry corrupt, and loading rebuilds it instead of failing for ever."""
    cache = BuildCache(tmp_path / "cache")
    d = Dispatcher(cache=cache, tuning=None)
    victim, other = (dispatcher.KernelConfig.create(**SMALL, dtype=t) for t in ("fp16", "bf16"))
    built, donor = (d.build(d.codegen(c)) for c in (victim, other))
    shutil.copy(donor.path, built.path)
    meta_path = built.path.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["sha256"] = hashlib.sha256(built.path.read_bytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))
    assert {e["key"]: e["status"] for e in cache.entries()}[built.key] == "corrupt"
    with pytest.warns(UserWarning, match="another kernel's library"):
        assert d.library(victim).name == victim.name
    assert [e["status"] for e in cache.entries()] == ["ok", "ok"]


def test_only_the_newest_quarantined_copies_are_kept(tmp_path):
    cache = BuildCache(tmp_path / "cache")
    source = _source(dtype="bf16")
    built = cache.build(source, _toolchain())
    for stamp in range(1, 6):  # copies set aside earlier, oldest first
        (cache.root / "tmp" / f"{built.key}.corrupt.{stamp}.1").mkdir()
    built.path.write_bytes(b"")
    with pytest.warns(UserWarning, match="corrupt"):
        cache.build(source, _toolchain())
    kept = sorted(p.name for p in (cache.root / "tmp").glob("*.corrupt.*"))
    assert len(kept) == build.QUARANTINE_KEEP
    assert f"{built.key}.corrupt.4.1" in kept and f"{built.key}.corrupt.5.1" in kept  # and the new one


@pytest.fixture
def fresh_header_state(monkeypatch):
    """precompiled_header's per-process state, fresh; and every compiler
    command run, recorded (`commands`)."""
    from dispatcher.targets import precompiled_header, toolchain
    monkeypatch.setattr(precompiled_header, "_plain_builds", {})
    monkeypatch.setattr(precompiled_header, "_unbuildable", set())
    commands = []
    run = toolchain.CompilerMixin.run_compiler

    def recorded(self, args, what):
        commands.append(list(args))
        return run(self, args, what)
    monkeypatch.setattr(toolchain.CompilerMixin, "run_compiler", recorded)
    return precompiled_header, commands


def _gemm_checked(root, tile_n, rng):
    """A 37x45x29 fp32 GEMM in 24 x tile_n tiles through a cache at `root`,
    checked against float64 (tile_n 32 or 64: a multiple of every ISA's micro-tile)."""
    a = rng.standard_normal((37, 29)).astype(np.float32)
    b = rng.standard_normal((29, 45)).astype(np.float32)
    out = np.full((37, 45), np.nan, np.float32)
    d = Dispatcher(cache=BuildCache(root))
    dispatcher.gemm(a, b, out=out, config=dict(tile_m=24, tile_n=tile_n, tile_k=32), dispatcher=d)
    assert np.abs(out - a.astype(np.float64) @ b).max() < 1e-4


def test_kernels_build_with_a_precompiled_header_and_without_a_broken_one(tmp_path, fresh_header_state, rng,
                                                                          monkeypatch):
    """The header is built into the cache's toolchains/ and kernels include
    it; a damaged header fails the build, which then succeeds without it,
    and is discarded for a new one."""
    header_module, commands = fresh_header_state
    root = tmp_path / "cache"
    monkeypatch.setattr(header_module, "PLAIN_FIRST", 0)
    _gemm_checked(root, 32, rng)  # builds the header, then the kernel with it
    gch, = (root / "toolchains").glob("pch-*/kernel.hpp.gch")
    assert "c++-header" in commands[0] and "-include" in commands[1]
    assert not list((root / "toolchains").glob("staging-*"))

    gch.write_bytes(gch.read_bytes()[:100_000])  # a truncated header: the build fails with it
    _gemm_checked(root, 64, rng)
    assert "-include" in commands[2] and "-include" not in commands[3]
    assert not gch.exists()


def test_the_header_waits_for_a_caches_first_builds_and_a_compiler_that_cannot_make_it(
        tmp_path, fresh_header_state, monkeypatch):
    """No header for a process's first PLAIN_FIRST builds in a cache (each
    cache counts its own); a compiler that cannot precompile is asked once
    and leaves nothing behind."""
    header_module, commands = fresh_header_state
    from dispatcher.targets import toolchain

    def refuses(self, args, what):
        commands.append(list(args))
        raise errors.BuildError("unsupported: c++-header", "")
    monkeypatch.setattr(toolchain.CompilerMixin, "run_compiler", refuses)
    monkeypatch.setattr(header_module, "PLAIN_FIRST", 2)
    folder, other = tmp_path / "toolchains", tmp_path / "other" / "toolchains"
    for _ in range(2):
        assert header_module.precompiled_header(_toolchain(), folder) is None
        assert header_module.precompiled_header(_toolchain(), other) is None
    assert commands == []  # not tried yet
    assert header_module.precompiled_header(_toolchain(), folder) is None
    assert len(commands) == 1 and "c++-header" in commands[0]
    assert list(folder.iterdir()) == [next(folder.glob("*.lock"))]  # no staging folder is left
    assert header_module.precompiled_header(_toolchain(), folder) is None  # not tried again
    assert len(commands) == 1
