"""The content-addressed build cache: reuse, atomic publish, concurrency, corruption."""

import json
import multiprocessing as mp
import os
import stat

import pytest

import dispatcher
from dispatcher import errors
from dispatcher.api import Dispatcher
from dispatcher.build import BuildCache
from dispatcher.library import Library

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


def test_second_build_compiles_nothing(tmp_path):
    from dispatcher.targets.cpu import Toolchain
    cache = BuildCache(tmp_path / "cache")
    tc = CountingToolchain(Toolchain.find())
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
    from dispatcher.targets.cpu import Toolchain
    try:
        built = BuildCache(root).build(_source(dtype="bf16", layout="crr"), Toolchain.find())
        queue.put(str(built.path))
    except Exception as e:  # reported to the parent
        queue.put(f"error: {e!r}")


def test_two_processes_building_the_same_config(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    root = str(tmp_path / "shared")
    procs = [ctx.Process(target=_build_in_child, args=(root, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(not r.startswith("error") for r in results), results
    assert results[0] == results[1]
    assert len(list((tmp_path / "shared" / "kernels").iterdir())) == 1


def test_corrupt_entry_is_detected_and_rebuilt(tmp_path):
    from dispatcher.targets.cpu import Toolchain
    cache = BuildCache(tmp_path / "cache")
    source = _source(dtype="int8")
    built = cache.build(source, Toolchain.find())
    with open(built.path, "r+b") as f:  # flip bytes in the middle of the library
        f.seek(os.path.getsize(built.path) // 2)
        f.write(b"\xde\xad\xbe\xef")
    with pytest.raises(errors.CacheError, match="corrupt"):
        cache.lookup(built.key)
    assert [e["status"] for e in cache.entries()] == ["corrupt"]
    with pytest.warns(UserWarning, match="corrupt"):
        rebuilt = cache.build(source, Toolchain.find())
    assert Library(rebuilt.path, expected_name=source.name)
    assert cache.lookup(built.key) is not None


def test_metadata_records_the_config(tmp_path):
    from dispatcher.targets.cpu import Toolchain
    cache = BuildCache(tmp_path / "cache")
    source = _source()
    built = cache.build(source, Toolchain.find())
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
