"""docs/reference.md's "Bad input" table, row by row.

The table is parsed from the document; each row's `id` names a case below
and its last column the outcome the case must have: exactly that
`dispatcher.errors` class (not a subclass or a parent), a `UserWarning`,
`exit 2` with one line on stderr (the CLI), or `none` (no error; the case
checks the result). A row without a case or a case without a row fails, so
the table and these tests cannot drift apart.
"""

from __future__ import annotations

import ctypes.util
import pwd
import re
import types
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import dispatcher
from dispatcher import build, errors, targets
from dispatcher.cli import main as cli_main
from dispatcher.targets import cpu_isa

DOC = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
SMALL = dict(tile_m=24, tile_n=64, tile_k=32)


def parse_table() -> dict:
    """{id: outcome} from the table under '## Bad input'."""
    text = DOC.read_text()
    section = text.split("\n## Bad input\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 4 or not cells[0].startswith("`"):
            continue
        row_id = cells[0].strip("`")
        outcome = re.match(r"`([^`]+)`", cells[-1])
        assert outcome, f"row {row_id}: the last column starts with no `outcome`"
        assert row_id not in rows, f"row {row_id} appears twice"
        rows[row_id] = outcome.group(1)
    return rows


ROWS = parse_table()


def f32(*shape):
    return np.ones(shape, np.float32)


def i8(*shape):
    return np.ones(shape, np.int8)


class Calls(tuple):
    """Several calls of one row: each must have the row's outcome."""


class Cli(tuple):
    """Command lines of one CLI row (a string, a list, or a function of ctx
    that gives the list): each must exit 2 with one line on stderr."""


def each(*calls) -> Calls:
    return Calls(calls)


# ------------------------------------------------------------------ cases
def _read_only_out():
    out = f32(3, 5)
    out.setflags(write=False)
    return dispatcher.gemm(f32(3, 4), f32(4, 5), out=out)


def _not_runnable_isa() -> str:
    return next(name for name in cpu_isa.ISAS if cpu_isa.why_not_runnable(cpu_isa.get(name)))


def _config_for_isa(isa: str) -> dict:
    spec = cpu_isa.get(isa)
    return dict(SMALL, isa=isa, micro_m=spec.isa.micro_tile[0], micro_n=spec.isa.micro_tile[1])


def _cuda_unavailable(ctx):
    from dispatcher import targets
    ctx.monkeypatch.setattr(type(targets.get("cuda")), "available", lambda self: False)
    dispatcher.gemm(f32(3, 4), f32(4, 5), target="cuda")


def _isa_env(ctx, value):
    ctx.monkeypatch.setenv("DISPATCHER_CPU_ISA", value)
    dispatcher.KernelConfig.create(**SMALL)


def _disable_plugins_unknown(ctx):
    from dispatcher.plugins import PluginManager
    ctx.monkeypatch.setenv("DISPATCHER_DISABLE_PLUGINS", "stream_kk")
    PluginManager()


def _compiler_missing(ctx):
    from dispatcher.targets.cpu import Toolchain
    ctx.monkeypatch.setenv("CXX", "/nonexistent/g++")
    ctx.monkeypatch.setenv("PATH", "/nonexistent")
    Toolchain.find.cache_clear()
    try:
        Toolchain.find(cpu_isa.active().name)
    finally:
        Toolchain.find.cache_clear()


def _compiler_rejects(ctx):
    from dispatcher.build import BuildCache, GeneratedSource
    from dispatcher.targets.cpu import Toolchain
    cache = BuildCache(ctx.tmp_path / "c")
    source = GeneratedSource(dispatcher.KernelConfig.create(**SMALL), (("broken.cpp", "not C++;"),))
    try:
        cache.build(source, Toolchain.find(cpu_isa.active().name))
    finally:
        assert not any((ctx.tmp_path / "c" / "kernels").iterdir()), "a failed build left an entry"


def _cache_corrupt_entry(ctx):
    from dispatcher.api import Dispatcher
    from dispatcher.build import BuildCache
    cache = BuildCache(ctx.tmp_path / "cache")
    d = Dispatcher(cache=cache, tuning=None)
    config = dispatcher.KernelConfig.create(dtype="int8", **SMALL)
    built = d.build(d.codegen(config))
    data = bytearray(built.path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4] = b"\xde\xad\xbe\xef"
    built.path.write_bytes(bytes(data))
    with pytest.raises(errors.CacheError, match="corrupt"):
        cache.lookup(built.key)
    try:
        library = d.library(config)  # warns, moves the entry aside, rebuilds
    finally:
        assert [e["status"] for e in cache.entries()] == ["ok"]
    a = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    out = dispatcher.gemm(a, a.T, config=SMALL, dispatcher=d)  # a.T is column-major: rcr
    assert library.name == config.name and np.array_equal(out, a.astype(np.int32) @ a.T.astype(np.int32))


def _read_only(ctx, folder: Path):
    """`folder` read-only to this process: by its mode and, since root
    writes through any mode, by the cache's writability check too."""
    writable = build._writable
    ctx.monkeypatch.setattr(build, "_writable", lambda p: writable(p) and not Path(p).is_relative_to(folder))
    folder.chmod(0o555)
    ctx.cleanups.append(lambda: folder.chmod(0o755))


def _shipped_tuning_corrupt(ctx):
    """A file among the shipped tuning winners that `TuningDatabase.export`
    did not write, not JSON or not its rows: a lookup names it."""
    from dispatcher import tuning
    from dispatcher.problem import GemmProblem
    read = tuning.shipped_rows.__wrapped__
    ctx.monkeypatch.setattr(tuning, "shipped_rows", lambda arch: read(arch, ctx.tmp_path))
    problem = GemmProblem(64, 64, 64, "fp32", "fp32", "rcr", "regular", "cpu")
    shipped = ctx.tmp_path / f"{targets.get('cpu').arch_id()}.json"  # the file of this problem's arch
    shipped.write_text("{bad")
    with pytest.raises(errors.DispatcherError, match=f"{shipped.name} is not valid JSON"):
        tuning.TuningDatabase(ctx.tmp_path / "own.sqlite").lookup(problem)
    shipped.write_text('{"rows": [{"variant": "regular"}]}')
    tuning.TuningDatabase(ctx.tmp_path / "own.sqlite").lookup(problem)


def _cache_is_a_file(ctx):
    (ctx.tmp_path / "cache").write_text("")
    build.BuildCache(ctx.tmp_path / "cache")


def _cache_read_only(ctx):
    root = ctx.tmp_path / "cache"
    root.mkdir()
    _read_only(ctx, root)
    build.BuildCache(root)


def _cache_no_home(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)
    for name in ("DISPATCHER_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        ctx.monkeypatch.delenv(name, raising=False)

    def no_entry(uid):
        raise KeyError(uid)
    ctx.monkeypatch.setattr(pwd, "getpwuid", no_entry)
    build.BuildCache()


def _abi_bad_arguments():
    from dispatcher.api import default_dispatcher
    from dispatcher.library import gemm_args
    from dispatcher.kinds import prepare_gemm
    problem, ops, _ = prepare_gemm(f32(8, 8), f32(8, 8))
    d = default_dispatcher()
    library = d.library(d.config_matching(problem, SMALL))
    args = gemm_args(ops)
    args.lda = 2  # smaller than K
    library.run_gemm(args)


def _zero_size():
    assert dispatcher.gemm(f32(0, 4), f32(4, 5)).shape == (0, 5)
    assert dispatcher.gemm(f32(3, 4), f32(4, 0), variant="stream_k").shape == (3, 0)
    c = np.array([[-3, 3, 5, 2**31 - 1]], np.int32)
    got = dispatcher.gemm(i8(1, 0), i8(0, 4), c=c, beta=1.5)
    expected = np.clip(np.rint(1.5 * c.astype(np.float64)), -2**31, 2**31 - 1).astype(np.int32)
    assert np.array_equal(got, expected)
    assert np.array_equal(dispatcher.gemm(f32(2, 0), f32(0, 3)), np.zeros((2, 3), np.float32))


def _zero_groups():
    for out_dtype in (None, "int32", "fp16"):
        assert dispatcher.grouped_gemm([], [], out_dtype=out_dtype) == []
    assert dispatcher.grouped_gemm([], [], target="auto") == []  # no arrays: the cpu target


def _c_is_out():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (5, 6)).astype(np.float32), rng.uniform(-1, 1, (6, 7)).astype(np.float32)
    for view in (lambda o: o, lambda o: o[...]):
        out = rng.uniform(-1, 1, (5, 7)).astype(np.float32)
        expected = 2.0 * (a.astype(np.float64) @ b) - 0.5 * out
        dispatcher.gemm(a, b, c=view(out), out=out, alpha=2.0, beta=-0.5, config=SMALL)
        assert np.allclose(out, expected, rtol=1e-5, atol=1e-5)


def _unaligned_or_read_only_inputs():
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = bytearray(values.nbytes + 1)
    a = np.frombuffer(buf, np.float32, offset=1, count=12).reshape(3, 4)
    a[...] = values
    assert a.ctypes.data % 4
    b = np.arange(20, dtype=np.float32).reshape(4, 5)
    b.setflags(write=False)
    assert np.array_equal(dispatcher.gemm(a, b, config=SMALL), values @ b)


def _torch():
    return pytest.importorskip("torch")


def _narrow_dispatcher():
    """A Dispatcher whose plugins add variant `narrow`: fp32 and bf16 inputs, layout rcr."""
    from dispatcher.api import Dispatcher
    from dispatcher.plugin_api import VariantRecord, gemm_operands, registers
    from dispatcher.plugins import PluginManager
    record = VariantRecord("narrow", "gemm", ("cpu",), ("fp32", "bf16"), ("rcr",), operands=gemm_operands(),
                           default_configs=lambda target, dtype, layout: [SMALL])
    manager = PluginManager()
    manager.register(types.SimpleNamespace(dispatcher_register_variants=registers(record)), "narrow")
    return Dispatcher(manager=manager, tuning=None)


def _dtype_not_offered():
    d = _narrow_dispatcher()
    f16 = lambda *shape: np.ones(shape, np.float16)
    for call in (lambda: dispatcher.gemm(f16(3, 4), f16(4, 5), variant="narrow", dispatcher=d),
                 lambda: dispatcher.gemm(f16(3, 4), f16(4, 5), variant="narrow", config=SMALL, dispatcher=d),
                 lambda: dispatcher.run("narrow", a=f16(3, 4), b=f16(4, 5), dispatcher=d)):
        with pytest.raises(errors.DtypeError, match="takes fp32, bf16 inputs, not fp16") as info:
            call()
        assert "sweep" not in str(info.value)
    with pytest.raises(errors.LayoutError, match="reads layouts rcr"):
        dispatcher.gemm(f32(3, 4), f32(4, 5), variant="narrow", dispatcher=d)  # rrr
    raise info.value


def _offsets(dtype=np.int32, values=(3, 4, 5)):
    rows, groups = 12, len(values)
    return f32(rows, 4), f32(groups, 4, 5), np.array(values, dtype)


def _torch_offsets_long():
    torch = _torch()
    a, b, offsets = map(torch.from_numpy, _offsets())
    from dispatcher.torch import grouped_mm
    try:
        grouped_mm(a, b, offsets.long())
    except errors.DispatcherError as e:
        assert "int32" in str(e) and "float" not in str(e), e
        raise


def _torch_mixed(which):
    torch = _torch()
    import dispatcher.torch as dt
    a, b = torch.ones(3, 4), torch.ones(4, 5)
    if which == "gemm":
        return dt.gemm(a, b.to("meta"))
    if which == "c":
        return dt.gemm(a, b, c=torch.ones(3, 5, device="meta"), beta=1.0)
    a, b, offsets = map(torch.from_numpy, _offsets())
    return dt.grouped_mm(a, b.to("meta"), offsets)


def _out_dtype_names():
    torch = _torch()
    import dispatcher.torch as dt
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (5, 6)).astype(np.float32), rng.uniform(-1, 1, (6, 7)).astype(np.float32)
    expected = (a.astype(np.float64) @ b).astype(np.float16)
    for name in ("fp16", "float16", "half", np.float16, np.dtype(np.float16), torch.float16):
        got = [dispatcher.gemm(a, b, out_dtype=name, config=SMALL),
               dispatcher.matmul(a, b, out_dtype=name, config=SMALL),
               dispatcher.grouped_gemm([a], [b], out_dtype=name, config=SMALL)[0],
               dispatcher.grouped_mm(a, b[None], np.array([5], np.int32), out_dtype=name, config=SMALL),
               dt.gemm(torch.from_numpy(a), torch.from_numpy(b), out_dtype=name, config=SMALL).numpy(),
               dt.grouped_mm(torch.from_numpy(a), torch.from_numpy(b[None]), torch.tensor([5], dtype=torch.int32),
                             out_dtype=name, config=SMALL).numpy()]
        for out in got:
            assert out.dtype == np.float16 and np.allclose(out, expected, rtol=2e-3, atol=2e-3), name


def _torch_meta_tensors():
    torch = _torch()
    import dispatcher.torch as dt
    a, b = torch.ones(3, 4, device="meta"), torch.ones(4, 5, device="meta", dtype=torch.float32)
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = dt.gemm(a, b, out_dtype="fp16")
        assert out.device.type == "meta" and out.shape == (3, 5) and out.dtype == torch.float16
    out = dt.grouped_mm(torch.ones(6, 4, device="meta"), torch.ones(2, 4, 5, device="meta"),
                        torch.ones(2, dtype=torch.int32, device="meta"))
    assert out.device.type == "meta" and out.shape == (6, 5)


def _sweep_tiles_off_the_micro_tile():
    from dispatcher.tile_engine import sweep
    axes = {"tile_m": {"values": [32, 64]}, "tile_n": {"values": [32, 64]}, "tile_k": {"values": [64]}}
    for isa in cpu_isa.ISAS:
        plan = sweep.expand(dict(axes, isa={"values": [isa]}), variant="regular", target="cpu", dtype="fp32",
                            layout="rcr")
        assert not [why for _, why in plan.filtered if "micro-tile" in why], (isa, plan.filtered)
        for c in plan.configs:
            o = c.target_params
            assert c.tile_m % o["micro_m"] == 0 and c.tile_n % o["micro_n"] == 0, c.name
        if cpu_isa.why_not_runnable(cpu_isa.get(isa)) is None:
            assert len(plan.configs) == 4, isa
    config = next(c for c in sweep.expand(axes, variant="regular", target="cpu", dtype="fp32", layout="rcr").configs
                  if (c.tile_m, c.tile_n) == (32, 64))
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (70, 50)).astype(np.float32), rng.uniform(-1, 1, (50, 90)).astype(np.float32)
    assert np.allclose(dispatcher.gemm(a, b, config=dict(config.to_dict(), layout="rrr")),
                       a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def _bool_env_invalid(ctx):
    from dispatcher.plugins import PluginManager
    ctx.monkeypatch.setenv("DISPATCHER_TRACE_PLUGINS", "2")
    with pytest.raises(errors.ConfigError, match="DISPATCHER_TRACE_PLUGINS='2' is not a boolean"):
        PluginManager()
    ctx.monkeypatch.delenv("DISPATCHER_TRACE_PLUGINS")
    ctx.monkeypatch.setenv("DISPATCHER_AUTOTUNE", "maybe")
    dispatcher.gemm(f32(3, 4), f32(4, 5))


def _undecodable(ctx, command: str) -> list:
    """`command` on a file of latin-1 bytes, which are not UTF-8."""
    path = ctx.tmp_path / "latin1.json"
    path.write_bytes('{"tile_config": {"tile_m": {"values": [64]}}, "note": "caf\xe9"}'.encode("latin-1"))
    return command.format(path).split()


def cli(ctx, *argv):
    """(status, stderr lines) of one CLI call in this process."""
    ctx.capsys.readouterr()
    try:
        status = cli_main(list(argv))
    except SystemExit as e:
        status = e.code
    err = ctx.capsys.readouterr().err
    return status, [line for line in err.splitlines() if line.strip()]


# id -> a function of ctx (monkeypatch, tmp_path, capsys, cleanups) that must have the
# row's outcome; or each(...) of calls that each must; or Cli(...) of command lines.
CASES = {
    "not-an-array": each(lambda: dispatcher.gemm([[1.0]], f32(1, 1)),
                                     lambda: dispatcher.gemm(np.float32(1), f32(1, 1)),
                                     lambda: dispatcher.gemm("abc", f32(1, 1)),
                                     lambda: dispatcher.gemm(f32(1, 1), f32(1, 1), out=[[0.0]]),
                                     lambda: dispatcher.gemm(f32(1, 1), f32(1, 1), c=[[0.0]], beta=1.0)),
    "none-operand": each(lambda: dispatcher.gemm(None, f32(4, 5)),
                                     lambda: dispatcher.gemm(f32(3, 4), None),
                                     lambda: dispatcher.grouped_gemm([None], [f32(4, 5)])),
    "masked-array": each(
        lambda: dispatcher.gemm(np.ma.masked_array(f32(3, 4)), f32(4, 5)),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out=np.ma.masked_array(f32(3, 5))),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), c=np.ma.masked_array(f32(3, 5)), beta=1.0),
        lambda: dispatcher.grouped_gemm([f32(3, 4)], [np.ma.masked_array(f32(4, 5))])),
    "not-2d": each(lambda: dispatcher.gemm(f32(3, 4, 1), f32(4, 5)),
                               lambda: dispatcher.gemm(np.ones(4, np.float32), f32(4, 5))),
    "k-mismatch": lambda ctx: dispatcher.gemm(f32(3, 4), f32(5, 6)),
    "int8-k-too-deep": each(
        lambda: dispatcher.gemm(i8(1, 131072), i8(131072, 1)),
        lambda: dispatcher.grouped_gemm([i8(1, 131072)], [i8(131072, 1)])),
    "dtype-mismatch": lambda ctx: dispatcher.gemm(f32(3, 4), np.ones((4, 5), ml_dtypes.bfloat16)),
    "dtype-unsupported": each(
        *(lambda t=t: dispatcher.gemm(np.ones((3, 4), t), np.ones((4, 5), t))
          for t in (np.float64, bool, np.complex64, object, ">f4"))),
    "dtype-output-only": lambda ctx: dispatcher.gemm(np.ones((3, 4), np.int32), np.ones((4, 5), np.int32)),
    "dtype-not-offered": lambda ctx: _dtype_not_offered(),
    "out-dtype-unknown": each(lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out_dtype="int4"),
                                          lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out_dtype=3.5)),
    "out-dtype-not-allowed": each(
        lambda: dispatcher.gemm(i8(3, 4), i8(4, 5), out_dtype="fp16"),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out_dtype="int8"),
        lambda: dispatcher.grouped_gemm([i8(3, 4)], [i8(4, 5)], out_dtype="fp32")),
    "negative-strides": each(
        lambda: dispatcher.gemm(f32(3, 4)[::-1], f32(4, 5)),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out=f32(3, 5)[::-1]),
        lambda: dispatcher.grouped_gemm([f32(3, 4)[::-1]], [f32(4, 5)])),
    "non-unit-inner-stride": each(
        lambda: dispatcher.gemm(f32(3, 8)[:, ::2], f32(4, 5)),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out=f32(3, 10)[:, ::2])),
    "zero-strides": each(
        lambda: dispatcher.gemm(np.broadcast_to(f32(1, 4), (3, 4)), f32(4, 5)),
        lambda: dispatcher.gemm(np.broadcast_to(np.float32(1), (3, 4)), f32(4, 5))),
    "grouped-mixed-layouts": lambda ctx: dispatcher.grouped_gemm(
        [f32(3, 4), np.asfortranarray(f32(3, 4))], [f32(4, 5), f32(4, 5)]),
    "out-wrong-shape": each(lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out=f32(5, 3)),
                                        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out=f32(3, 5, 1))),
    "out-wrong-dtype": each(
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), out=np.ones((3, 5), np.float16), out_dtype="fp32"),
        lambda: dispatcher.gemm(i8(3, 4), i8(4, 5), out=np.ones((3, 5), np.float32))),
    "out-read-only": lambda ctx: _read_only_out(),
    "out-overlaps-input": each(
        lambda: (lambda a: dispatcher.gemm(a, f32(4, 4), out=a))(f32(4, 4)),
        lambda: (lambda w: dispatcher.gemm(w[:4, :3], f32(3, 5), out=w[2:6, :5]))(f32(8, 8))),
    "c-wrong-shape": lambda ctx: dispatcher.gemm(f32(3, 4), f32(4, 5), c=f32(5, 3), beta=1.0),
    "c-wrong-dtype": lambda ctx: dispatcher.gemm(f32(3, 4), f32(4, 5), c=np.ones((3, 5), np.float16),
                                                 beta=1.0),
    "c-overlaps-input": lambda ctx: (lambda b: dispatcher.gemm(f32(4, 4), b, c=b, beta=1.0))(f32(4, 4)),
    "c-partially-overlaps-out": each(
        lambda: (lambda w: dispatcher.gemm(f32(4, 3), f32(3, 5), c=w[:4], out=w[1:], beta=1.0))(f32(5, 5)),
        lambda: (lambda s: dispatcher.gemm(f32(4, 3), f32(3, 4), c=s.T, out=s, beta=1.0))(f32(4, 4))),
    "beta-without-c": lambda ctx: dispatcher.gemm(f32(3, 4), f32(4, 5), beta=1.0),
    "scalar-not-real": each(
        *(lambda v=v: dispatcher.gemm(f32(3, 4), f32(4, 5), alpha=v) for v in ("2", None, True, np.ones(2))),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), c=f32(3, 5), beta=1j),
        lambda: dispatcher.grouped_gemm([f32(3, 4)], [f32(4, 5)], alpha="2")),
    "scalar-not-finite-int32": each(
        lambda: dispatcher.gemm(i8(2, 2), i8(2, 2), alpha=float("nan")),
        lambda: dispatcher.gemm(i8(2, 2), i8(2, 2), c=np.zeros((2, 2), np.int32), beta=float("inf")),
        lambda: dispatcher.grouped_gemm([i8(2, 2)], [i8(2, 2)], alpha=float("-inf"))),
    "config-not-a-config": lambda ctx: dispatcher.gemm(f32(3, 4), f32(4, 5), config=[24, 64, 32]),
    "config-unknown-key": each(
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), config=dict(tile_q=3)),
        lambda: dispatcher.KernelConfig.create(variant="regular", target="cpu", cluster_m=2)),
    "config-disagrees": each(
        *(lambda fields=fields: dispatcher.gemm(f32(3, 4), f32(4, 5), config=dict(SMALL, **fields))
          for fields in (dict(dtype="fp16"), dict(dtype_c="bf16"), dict(layout="rcr"),
                         dict(variant="stream_k"), dict(target="cuda"))),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), config=dispatcher.KernelConfig.create(layout="rcr", **SMALL)),
        lambda: dispatcher.grouped_gemm([f32(3, 4)], [f32(4, 5)], config=dict(SMALL, layout="rcr"))),
    "config-bad-value": each(
        *(lambda fields=fields: dispatcher.gemm(f32(3, 4), f32(4, 5), config=dict(SMALL, **fields))
          for fields in (dict(tile_m=0), dict(tile_n=4097), dict(tile_k=2**31), dict(tile_m=24.0),
                         dict(tile_m="24"), dict(isa="sse9"), dict(micro_n=70), dict(threads=5000),
                         dict(dtype_c="fp64"), dict(layout="rxr"))),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), variant="stream_k", config=dict(SMALL, reduction="fancy")),
        lambda: dispatcher.KernelConfig.create(dtype_a="fp32", dtype_b="fp16")),
    "config-not-buildable": each(
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), config=dict(SMALL, tile_m=25)),
        lambda: dispatcher.gemm(np.ones((3, 4), np.float16), np.ones((4, 5), np.float16), variant="stream_k",
                                config=dict(SMALL, reduction="atomic")),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), variant="stream_k",
                                config=dict(SMALL, decomposition="split_k", splits=2)),
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), config=dict(SMALL, layout="rrc"))),
    "config-isa-not-runnable": lambda ctx: dispatcher.gemm(f32(3, 4), f32(4, 5),
                                                           config=_config_for_isa(_not_runnable_isa())),
    "config-cannot-run-problem": lambda ctx: dispatcher.gemm(
        f32(1, 1), f32(1, 1), variant="stream_k", options={"workers": 2},
        config=dict(SMALL, reduction="linear", decomposition="stream_k")),
    "options-not-a-dict": lambda ctx: dispatcher.gemm(f32(3, 4), f32(4, 5), options=[("workers", 2)]),
    "options-unknown-key": each(
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), options={"wrkers": 2}),
        lambda: dispatcher.grouped_gemm([f32(3, 4)], [f32(4, 5)], options={"workers": 2})),
    "options-bad-value": each(
        *(lambda v=v, variant=variant: dispatcher.gemm(f32(3, 4), f32(4, 5), variant=variant,
                                                       options={"workers": v})
          for v in (1025, -1, "x", 2.0, 100000) for variant in ("regular", "stream_k"))),
    "variant-unknown": lambda ctx: dispatcher.gemm(f32(3, 4), f32(4, 5), variant="nope"),
    "variant-wrong-kind": each(
        lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), variant="grouped"),
        lambda: dispatcher.grouped_gemm([f32(3, 4)], [f32(4, 5)], variant="regular")),
    "variant-not-a-name": lambda ctx: dispatcher.gemm(f32(3, 4), f32(4, 5), variant=3),
    "target-unknown": each(lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), target="gpu"),
                                       lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), target=0),
                                       lambda: dispatcher.KernelConfig.create(target="tpu")),
    "cuda-unavailable": _cuda_unavailable,
    "grouped-not-a-list": each(lambda: dispatcher.grouped_gemm(None, None),
                                           lambda: dispatcher.grouped_gemm(3, 4)),
    "grouped-count-mismatch": lambda ctx: dispatcher.grouped_gemm([f32(3, 4)], []),
    "grouped-shapes": each(lambda: dispatcher.grouped_gemm([f32(3, 4)], [f32(5, 5)]),
                                       lambda: dispatcher.grouped_gemm([np.ones(4, np.float32)], [f32(4, 5)])),
    "grouped-dtype-mismatch": lambda ctx: dispatcher.grouped_gemm(
        [f32(3, 4), np.ones((3, 4), np.float16)], [f32(4, 5), np.ones((4, 5), np.float16)]),
    "offsets-not-int32": each(
        lambda: dispatcher.grouped_mm(*_offsets(np.int64)),
        lambda: dispatcher.grouped_mm(*_offsets(np.float32)),
        _torch_offsets_long),
    "offsets-out-of-range": each(
        *(lambda v=v: dispatcher.grouped_mm(*_offsets(values=v)) for v in ((3, 4, 13), (-1, 2, 9), (3, 2, 9)))),
    "torch-mixed-devices": each(*(lambda w=w: _torch_mixed(w) for w in ("gemm", "c", "grouped_mm"))),
    "bool-env-invalid": _bool_env_invalid,
    "isa-env-unknown": lambda ctx: _isa_env(ctx, "sse9"),
    "isa-env-not-runnable": lambda ctx: _isa_env(ctx, _not_runnable_isa()),
    "disable-plugins-unknown": _disable_plugins_unknown,
    "compiler-missing": _compiler_missing,
    "compiler-rejects": _compiler_rejects,
    "cache-corrupt-entry": _cache_corrupt_entry,
    "cache-is-a-file": _cache_is_a_file,
    "shipped-tuning-corrupt": _shipped_tuning_corrupt,
    "cache-read-only": _cache_read_only,
    "cache-no-home": _cache_no_home,
    "library-not-ours": each(
        lambda: dispatcher.library.Library("/nonexistent/missing.so"),
        lambda: dispatcher.library.Library(ctypes.util.find_library("m") or "libm.so.6")),
    "abi-bad-arguments": lambda ctx: _abi_bad_arguments(),
    "cli-bad-size": Cli(["run --m -5", "run --m 0", "run --repeat 0", "run --warmup -1"]),
    "cli-bad-choice": Cli(["run --layout xyz", "run --layout RCR", "run --dtype fp64", "run --target gpu"]),
    "cli-bad-groups": Cli(["run --variant grouped --groups 128x512", "run --groups 128x512x512"]),
    "cli-bad-config": Cli([["run", "--config", "{bad"], "run --config tile_q=3"]),
    "cli-missing-file": Cli(["sweep /nonexistent/missing.json --variant regular"]),
    "cli-undecodable-file": Cli([lambda ctx, c=c: _undecodable(ctx, c) for c in (
        "migrate {}", "sweep {} --variant regular", "migrate --names {}", "report {}")]),
    "cli-unknown-argument": Cli(["kernels --bogus"]),
    "zero-size": lambda ctx: _zero_size(),
    "zero-groups": lambda ctx: _zero_groups(),
    "c-is-out": lambda ctx: _c_is_out(),
    "unaligned-or-read-only-inputs": lambda ctx: _unaligned_or_read_only_inputs(),
    "out-dtype-names": lambda ctx: _out_dtype_names(),
    "torch-meta-tensors": lambda ctx: _torch_meta_tensors(),
    "sweep-tiles-off-the-micro-tile": lambda ctx: _sweep_tiles_off_the_micro_tile(),
}


@pytest.fixture
def ctx(monkeypatch, tmp_path, capsys):
    context = types.SimpleNamespace(monkeypatch=monkeypatch, tmp_path=tmp_path, capsys=capsys, cleanups=[])
    yield context
    for cleanup in context.cleanups:
        cleanup()


def test_the_table_is_there():
    assert len(ROWS) >= 50, f"only {len(ROWS)} rows parsed from {DOC}"


def _expect(outcome: str, call):
    """Run `call`; it must have `outcome`."""
    if outcome == "none":
        call()
    elif outcome == "UserWarning":
        with pytest.warns(UserWarning):
            call()
    else:
        cls = getattr(errors, outcome, None)
        assert isinstance(cls, type) and issubclass(cls, errors.DispatcherError), \
            f"the outcome {outcome!r} is not a dispatcher.errors class, UserWarning, exit 2 or none"
        with pytest.raises(errors.DispatcherError) as info:
            call()
        assert type(info.value) is cls, f"{type(info.value).__name__} ({info.value}), not {outcome}"


@pytest.mark.parametrize("row", sorted(set(ROWS) | set(CASES)))
def test_row(row, ctx):
    assert row in ROWS, f"case {row!r} has no row in the Bad input table of {DOC.name}"
    assert row in CASES, f"row {row!r} of the Bad input table has no case"
    outcome, case = ROWS[row], CASES[row]
    assert (outcome == "exit 2") == isinstance(case, Cli), \
        f"row {row!r}: CLI rows (exit 2) and Cli cases go together"
    if isinstance(case, Cli):
        for argv in case:
            argv = argv(ctx) if callable(argv) else argv.split() if isinstance(argv, str) else argv
            status, err = cli(ctx, *argv)
            assert status == 2 and len(err) == 1 and "error" in err[0], (argv, status, err)
        return
    for call in case if isinstance(case, Calls) else [lambda: case(ctx)]:
        _expect(outcome, call)
