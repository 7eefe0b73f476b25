"""Benchmarks write their JSON first and plot only where matplotlib is
installed: `benchmarks/common.pyplot` is the one place that imports it."""

import ast
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _imports(path: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return names


def test_only_common_imports_matplotlib():
    scripts = sorted(BENCH.glob("*.py"))
    assert len(scripts) > 5
    for path in scripts:
        if path.name != "common.py":
            assert not any(n.split(".")[0] == "matplotlib" for n in _imports(path)), path.name


def test_a_benchmark_without_matplotlib_skips_its_plot(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    monkeypatch.syspath_prepend(str(BENCH))
    import cpu_gemm
    cpu_gemm.plot([{"rows": []}], tmp_path / "cpu_gemm.png")
    assert not (tmp_path / "cpu_gemm.png").exists()
    assert "matplotlib not installed: no cpu_gemm.png" in capsys.readouterr().err
