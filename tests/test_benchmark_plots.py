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


def test_merge_tuning_replaces_a_scope_or_adds_to_it():
    """benchmarks/merge_tuning.py: a scope is replaced whole, or with add
    only the rows of the new problems and kernels are (the rest stay)."""
    sys.path.insert(0, str(BENCH))
    try:
        import merge_tuning
    finally:
        sys.path.remove(str(BENCH))
    scope = dict(variant="regular", target="cuda", arch="sm_90a", dtype="bf16", out_dtype="bf16", layout="rcr")
    row = lambda problem, kernel, ms: dict(scope, problem=problem, kernel=kernel, latency_ms=ms)  # noqa: E731
    old = [row("8x8x8", "k1", 1.0), row("8x8x8", "k2", 2.0), row("16x16x16", "k1", 3.0)]
    new = [row("8x8x8", "k1", 0.5), row("8x8x8", "k3", 0.7)]
    other = dict(row("8x8x8", "k1", 9.0), layout="rrr")
    whole = {(r["layout"], r["problem"], r["kernel"], r["latency_ms"])
                          for r in merge_tuning.merged(new, old + [other])}
    assert whole == {("rcr", "8x8x8", "k1", 0.5), ("rcr", "8x8x8", "k3", 0.7), ("rrr", "8x8x8", "k1", 9.0)}
    merged_set = {(r["layout"], r["problem"], r["kernel"], r["latency_ms"])
                  for r in merge_tuning.merged(new, old + [other], add=True)}
    assert merged_set == {("rcr", "8x8x8", "k1", 0.5), ("rcr", "8x8x8", "k2", 2.0), ("rcr", "16x16x16", "k1", 3.0),
                          ("rcr", "8x8x8", "k3", 0.7), ("rrr", "8x8x8", "k1", 9.0)}


def test_interleaved_timing_rotates_which_contender_goes_first(monkeypatch):
    """common.time_interleaved: round r starts with the r-th contender, so
    no contender always runs right after the same other one."""
    monkeypatch.syspath_prepend(str(BENCH))
    import common
    from dispatcher.timing import TimingOptions

    ran = []
    fns = {name: (lambda name=name: ran.append(name)) for name in ("a", "b", "c")}
    times = iter(range(1, 100))
    medians = common.time_interleaved(fns, TimingOptions(warmup=0, repeat=3), rounds=3, settle=0,
                                      timer=lambda fn, options: [fn(0) or next(times)])
    assert ran == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert medians == {"a": 6, "b": 4, "c": 5}  # a: 1, 6, 8; b: 2, 4, 9; c: 3, 5, 7
    assert common.time_interleaved({}, TimingOptions(warmup=0, repeat=3), settle=0) == {}
