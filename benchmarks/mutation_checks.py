"""A boundary-mutation pass over the input checks: is every bounded check
tested exactly at and exactly one past its limit?

Each comparison `<`, `<=`, `>`, `>=` inside the check functions listed in
CHECKS becomes two mutants, one moving the boundary each way by one:
`a > b` -> `a >= b` (the limit itself now refused) and `a > b + 1` (one
past it now accepted); likewise `a >= b` -> `a > b`, `a >= b - 1`; `a < b`
-> `a <= b`, `a < b - 1`; `a <= b` -> `a < b`, `a <= b + 1`. (A held-out
mutation moved the grouped_mm offsets check to `> total_m + 1` and every
test passed.) Each mutant is written into a copy of the tree and the tests
run on it: first tests/test_check_edges.py (the edge cases, seconds), then,
if it survives, the wider suites of BROADER. A mutant that no test kills
and that changes no observable behaviour is listed in EQUIVALENT with the
reason; any other survivor is a missing test.

    python benchmarks/mutation_checks.py [--only problem.py]

writes benchmarks/results/mutation_checks.json (each mutant: file, line,
function, change, and the test that killed it, or "survived"/"equivalent").
Set DISPATCHER_TEST_CACHE_DIR to a warm build cache to skip rebuilding.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "mutation_checks.json"

# file -> the check functions (or Class.method) whose comparisons are mutated
CHECKS = {
    "dispatcher/problem.py": ["possible_layouts", "_check_exact_accumulation", "prepare_grouped_mm",
                              "_check_offsets"],
    "dispatcher/config.py": ["_tile_size"],
    "dispatcher/records.py": ["Option.check"],
    "dispatcher/kinds.py": ["_element_strides", "_tensor", "_layout"],
    "dispatcher/targets/cpu_isa.py": ["Isa.micro_tile_problem"],
    "dispatcher/tile_engine/sweep.py": ["axis_values"],
    "dispatcher/tile_engine/problems.py": ["_single", "_grouped"],
    "dispatcher/cli.py": ["_at_least", "_groups"],
}
FIRST = ["tests/test_check_edges.py"]
BROADER = ["tests/test_bad_input_table.py", "tests/test_errors.py", "tests/test_grouped_mm.py",
           "tests/test_batched.py", "tests/test_cli_and_names.py"]

# (file, function, change) -> why the mutant cannot be told apart from the original
_SINGLE = ("a single row (column) is never stepped over to a next one: its leading dimension read as "
           "its row stride or as its length reads the same elements")
EQUIVALENT: dict = {
    ("dispatcher/problem.py", "possible_layouts", "rows > 1  ->  rows >= 1"): _SINGLE,
    ("dispatcher/problem.py", "possible_layouts", "cols > 1  ->  cols >= 1"): _SINGLE,
    ("dispatcher/kinds.py", "_tensor", "len(shape) < 2  ->  len(shape) <= 2"):
        "a 2-D operand is padded with (1,) * 0 leading dims: nothing",
}

_FLIP = {ast.Gt: (ast.GtE, 1), ast.GtE: (ast.Gt, -1), ast.Lt: (ast.LtE, -1), ast.LtE: (ast.Lt, 1)}
_SYMBOL = {ast.Gt: ">", ast.GtE: ">=", ast.Lt: "<", ast.LtE: "<="}


def _is_set(node) -> bool:
    return isinstance(node, ast.Set) or (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "set")


def _plus(node, step: int):
    return ast.BinOp(node, ast.Add() if step > 0 else ast.Sub(), ast.Constant(1))


def _functions(tree: ast.Module, names: list) -> list:
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            found.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            found += [(f"{node.name}.{f.name}", f) for f in node.body
                      if isinstance(f, ast.FunctionDef) and f"{node.name}.{f.name}" in names]
    missing = set(names) - {name for name, _ in found}
    assert not missing, f"no function(s) {missing}"
    return found


def mutants(path: str, names: list) -> list:
    """[(line, function, change, mutated source)] of `path`'s check functions."""
    source = (ROOT / path).read_text()
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    out = []
    for function, node in _functions(ast.parse(source), names):
        for compare in (n for n in ast.walk(node) if isinstance(n, ast.Compare)):
            start = offsets[compare.lineno - 1] + compare.col_offset
            end = offsets[compare.end_lineno - 1] + compare.end_col_offset
            original = source[start:end]
            for i, op in enumerate(compare.ops):
                sides = [compare.left, *compare.comparators][i:i + 2]
                if type(op) not in _FLIP or any(_is_set(x) for x in sides):  # subset tests have no boundary
                    continue
                flipped, shift = _FLIP[type(op)]
                for kind in ("limit", "one past"):
                    m = ast.parse(original, mode="eval").body
                    if kind == "limit":
                        m.ops[i] = flipped()
                    elif i == len(m.ops) - 1:  # the boundary moved one step the other way
                        m.comparators[i] = _plus(m.comparators[i], shift)
                    elif i == 0:  # in a chain, move the left operand (the right one is the next's)
                        m.left = _plus(m.left, -shift)
                    else:
                        continue
                    text = ast.unparse(m)
                    change = f"{original}  ->  {text}"
                    out.append((compare.lineno, function, change, source[:start] + f"({text})" + source[end:]))
    return out


def _run_tests(tree: Path, tests: list, timeout: float) -> str | None:
    """The first failing test's id, or None if every test passed."""
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'plugins'}",
           "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    if proc.returncode == 0:
        return None
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
    return failed.group(1) if failed else f"pytest exit {proc.returncode}: {proc.stdout[-300:]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="mutate only files whose path ends so")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per test run")
    args = parser.parse_args()
    checks = {p: f for p, f in CHECKS.items() if not args.only or p.endswith(args.only)}
    todo = [(path, *m) for path, names in checks.items() for m in mutants(path, names)]
    if args.list:
        for path, line, function, change, _ in todo:
            print(f"{path}:{line} {function}: {change}")
        print(f"{len(todo)} mutants")
        return 0
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", "__pycache__", "results", "*.so"))
        baseline = _run_tests(tree, FIRST + BROADER, args.timeout)
        if baseline is not None:
            raise SystemExit(f"the unmutated tree fails: {baseline}")
        for n, (path, line, function, change, mutated) in enumerate(todo, 1):
            target = tree / path
            original = target.read_text()
            target.write_text(mutated)
            try:
                killed = _run_tests(tree, FIRST, args.timeout) or _run_tests(tree, BROADER, args.timeout)
            finally:
                target.write_text(original)
            why = EQUIVALENT.get((path, function, change))
            status = "killed" if killed else "equivalent" if why else "survived"
            rows.append(dict(file=path, line=line, function=function, change=change, status=status,
                             killed_by=killed, **({"equivalent": why} if why and not killed else {})))
            print(f"[{n}/{len(todo)}] {status:10} {path}:{line} {change}  {killed or why or ''}", flush=True)
    summary = {s: sum(r["status"] == s for r in rows) for s in ("killed", "survived", "equivalent")}
    RESULT.write_text(json.dumps(dict(
        description=__doc__.split("\n\n")[0].replace("\n", " "), first=FIRST, broader=BROADER,
        summary=summary, seconds=round(time.time() - started), mutants=rows), indent=1) + "\n")
    print(f"{summary}; wrote {RESULT}")
    return 1 if summary["survived"] else 0


if __name__ == "__main__":
    sys.exit(main())
