"""The plugin contract: hook documentation, discovery, isolation, conflicts, tracing."""

import inspect
import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from dispatcher import hookspecs
from dispatcher.errors import PluginError
from dispatcher.plugins import PluginManager
from dispatcher.records import VariantRecord

from conftest import make_importable

ROOT = Path(__file__).resolve().parent.parent
HOOKS = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
         if name.startswith("dispatcher_")]


def test_every_hook_is_documented():
    assert set(HOOKS) == {"dispatcher_register_variants", "dispatcher_codegen", "dispatcher_build",
                          "dispatcher_select_library", "dispatcher_launch"}
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert ":return:" in doc, f"{name} does not document its return value"
        assert "firstresult" in doc.lower() or name in hookspecs.__doc__, name
        for param in inspect.signature(getattr(hookspecs, name)).parameters:
            assert f":param {param}:" in doc, f"{name} does not document {param}"


def test_every_hook_is_implemented_by_a_builtin_plugin():
    pm = PluginManager()
    implemented = {h for info in pm.plugins() for h in info.hooks}
    assert set(HOOKS) <= implemented
    builtin = {i.name: i for i in pm.plugins()}
    for name, variant in [("regular_gemm", "regular"), ("grouped_gemm", "grouped"),
                          ("stream_k", "stream_k")]:
        assert builtin[name].status == "loaded"
        assert builtin[name].variants == (variant,)
        assert builtin[name].source.startswith("gemm-dispatcher")  # registered by entry point


class FakeEntryPoint:
    def __init__(self, name, target):
        self.name, self.value, self._target, self.dist = name, repr(target), target, None

    def load(self):
        if isinstance(self._target, Exception):
            raise self._target
        return self._target


def _variant_plugin(variant):
    class Plugin:
        @hookspecs.hookimpl
        def dispatcher_register_variants(self):
            return [VariantRecord(variant, "gemm", ("cpu",), ("fp32",), ("rcr",))]
    return Plugin()


def _builtin_eps():
    return list(metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP))


def test_broken_plugin_is_reported_and_others_work():
    eps = _builtin_eps() + [FakeEntryPoint("broken", ImportError("no module named 'missing'"))]
    pm = PluginManager(entry_points=eps)
    broken = {i.name: i for i in pm.plugins()}["broken"]
    assert broken.status == "failed" and "missing" in broken.error
    assert pm.variant("regular").name == "regular"


def test_two_providers_of_one_variant_name_both():
    eps = _builtin_eps() + [FakeEntryPoint("copycat", _variant_plugin("regular"))]
    with pytest.raises(PluginError, match="'regular' is provided by copycat and regular_gemm|"
                                          "'regular' is provided by regular_gemm and copycat"):
        PluginManager(entry_points=eps)


def test_disable_plugins(monkeypatch):
    monkeypatch.setenv("DISPATCHER_DISABLE_PLUGINS", "stream_k, grouped_gemm")
    pm = PluginManager()
    status = {i.name: i.status for i in pm.plugins()}
    assert status["stream_k"] == status["grouped_gemm"] == "disabled"
    with pytest.raises(PluginError, match="plugin stream_k is disabled"):
        pm.variant("stream_k")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "dispatcher", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=600)



def test_trace_plugins_prints_hook_calls():
    proc = _cli("run", "--m", "16", "--n", "16", "--k", "16", "--repeat", "1",
                env={"DISPATCHER_TRACE_PLUGINS": "1"})
    assert proc.returncode == 0, proc.stderr
    for hook in ("dispatcher_select_library", "dispatcher_codegen", "dispatcher_build",
                 "dispatcher_launch"):
        assert hook in proc.stderr


def test_out_of_tree_plugin_is_discovered_and_runs(tmp_path):
    """A third-party package, made importable with an entry point and no
    change to the core, adds variant `naive` that the CLI lists and the API runs."""
    env = make_importable(tmp_path / "site", ROOT / "examples" / "naive_gemm_plugin" / "naive_gemm",
                          "naive-gemm-plugin", "naive_gemm", "naive_gemm.plugin")
    listed = json.loads(_cli("plugins", "--json", env=env).stdout)
    naive = {p["name"]: p for p in listed}["naive_gemm"]
    assert naive["status"] == "loaded" and naive["variants"] == ["naive"]
    assert naive["version"] == "0.1.0"

    script = textwrap.dedent("""
        import numpy as np, dispatcher
        from dispatcher.verify import random_matrix, reference, max_rel, poison
        rng = np.random.default_rng(0)
        a = random_matrix(37, 29, "bf16", "c", rng); b = random_matrix(29, 41, "bf16", "r", rng)
        out = poison(np.empty((37, 41), a.dtype))
        dispatcher.gemm(a, b, out=out, variant="naive")
        print(max_rel(out, reference(a, b)))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) <= 2 ** -7 * 4


def test_out_of_tree_plugin_with_its_own_problem_kind(tmp_path):
    """The documented example (docs/writing-a-plugin.md): variant `residual`
    declares its operands (a batched GEMM plus an extra `residual` operand)
    and a scalar parameter; `dispatcher.run` reaches it with no core change
    and no ctypes of its own, checked against float64 on poisoned outputs."""
    env = make_importable(tmp_path / "site", ROOT / "examples" / "residual_gemm_plugin" / "residual_gemm",
                          "residual-gemm-plugin", "residual_gemm", "residual_gemm.plugin")
    script = textwrap.dedent("""
        import numpy as np, dispatcher
        from dispatcher.verify import max_rel, poison
        rng = np.random.default_rng(0)
        q = lambda *s: rng.uniform(-2, 2, s).astype(np.float32)
        a, b = q(3, 37, 29), q(29, 41)                   # b broadcast over the batch
        r = q(3, 41, 37).transpose(0, 2, 1)              # a strided residual view
        out = poison(np.empty((3, 37, 41), np.float32))
        dispatcher.run("residual", a=a, b=b, residual=r, out=out, gamma=-0.5, alpha=2.0,
                       options={"workers": 2})
        ref = 2.0 * np.matmul(a.astype(np.float64), b) - 0.5 * r
        print(max_rel(out, ref))
        try:
            dispatcher.run("residual", a=a, b=b, residual=r[:, :5])
        except dispatcher.ProblemError as e:
            print("refused:", e)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    error, refused = proc.stdout.splitlines()
    assert float(error) <= 1e-5
    assert "residual has shape (3, 5, 41): its M dim is 5, expected 37" in refused
    # The CLI runs it with every declared operand and parameter, and verifies it
    # against the record's reference (a run without `residual` would fail in the kernel).
    for layout in ("rcr", "crr"):
        proc = _cli("run", "--variant", "residual", "--m", "37", "--n", "41", "--k", "29", "--layout", layout,
                    "--repeat", "1", "--warmup", "0", "--verify", "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        row = json.loads(proc.stdout)
        assert row["verified"] and row["max_rel"] <= 1e-5, row
    lines = [l for l in (ROOT / "examples" / "residual_gemm_plugin" / "residual_gemm" / "plugin.py")
             .read_text().splitlines()]
    assert len(lines) <= 150


def test_cli_refuses_to_verify_a_variant_without_a_reference(monkeypatch, capsys):
    """A variant whose kernel needs an extra operand and a parameter, and
    whose record has no reference: `run --verify` is one line and exit 2,
    before anything is built."""
    import types

    from dispatcher import cli
    from dispatcher.plugin_api import Operand, Param, gemm_operands, registers
    record = VariantRecord("scaled", "scaled", ("cpu",), ("fp32",), ("rcr",),
                           operands=(*gemm_operands(), Operand("scale", ("m", "n"), dtype="out")),
                           params=(Param("gamma", 1.0),))
    manager = PluginManager()
    manager.register(types.SimpleNamespace(dispatcher_register_variants=registers(record)), "scaled")
    monkeypatch.setattr(cli, "get_manager", lambda: manager)
    monkeypatch.setattr(cli.Dispatcher, "library", lambda *a: pytest.fail("built a kernel"))
    assert cli.main(["run", "--variant", "scaled", "--m", "8", "--n", "8", "--k", "8", "--verify"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "variant 'scaled' takes scale, gamma and has no reference" in err[0], err


def test_every_tile_library_name_a_template_uses_is_documented():
    """docs/writing-a-plugin.md's tile-library table names every dcpu::,
    T::, dispatcher_abi:: and DISPATCHER_ name the CPU templates of the
    built-in and example plugins use, and every plugin_api export."""
    import re

    from dispatcher import plugin_api
    doc = (ROOT / "docs" / "writing-a-plugin.md").read_text()
    templates = [*ROOT.glob("plugins/*/templates/cpu*"), *ROOT.glob("examples/*/*/templates/cpu*")]
    assert len(templates) >= 6
    used = set()
    for path in templates:
        used |= set(re.findall(r"\b(?:dcpu::|dispatcher_abi::|T::)[A-Za-z_]\w*(?:::[a-z_]+)?|\bDISPATCHER_[A-Z_]+",
                               path.read_text()))
    assert {"T::MC", "T::KC", "T::A::storage", "dcpu::parallel_tiles", "dcpu::thread_count",
            "DISPATCHER_DEFINE_GEMM_EXPORTS"} <= used
    assert not [n for n in sorted(used) if n not in doc]
    assert not [n for n in plugin_api.__all__ if f"`{n}" not in doc]


def test_plugin_api_skeleton_and_template_lookup(tmp_path):
    """for_variant answers for its variant only; render finds one template
    per target, a named one among several, or a folder whose main file is
    compiled and whose headers travel with it; ambiguity is an error."""
    import types

    from dispatcher.codegen import render
    from dispatcher.errors import ConfigError
    from dispatcher.plugin_api import for_variant

    @for_variant("mine")
    def dispatcher_codegen(config, target):
        return "answered"

    assert dispatcher_codegen(types.SimpleNamespace(variant="mine"), None) == "answered"
    assert dispatcher_codegen(config=types.SimpleNamespace(variant="other"), target=None) is None

    config = types.SimpleNamespace(variant="mine", name="k1", variant_params={"bias": "row"})
    target = types.SimpleNamespace(name="cpu", prelude=lambda c: "// prelude")
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "cpu.cpp").write_text("${prelude} plain ${bias}")
    (templates / "cpu-fast.cpp").write_text("${prelude} fast ${extra}")
    assert render(tmp_path, config, target).files == (("k1.cpp", "// prelude plain row"),)
    assert render(tmp_path, config, target, template="fast", extra=7).files[0][1] == "// prelude fast 7"
    (templates / "cpu.cc").write_text("")
    with pytest.raises(ConfigError, match="several template"):
        render(tmp_path, config, target)
    (templates / "cpu").mkdir()
    (templates / "cpu" / "main.cpp").write_text('#include "helpers.hpp"\n${prelude}')
    (templates / "cpu" / "helpers.hpp").write_text("// ${bias} helpers")
    assert render(tmp_path, config, target).files == (
        ("k1.cpp", '#include "helpers.hpp"\n// prelude'), ("helpers.hpp", "// row helpers"))
