"""Problem files: a list, or {"problems": [...]}.

Single problems are {"M": .., "N": .., "K": ..} or [M, N, K]; grouped ones
are {"groups": [[M, N, K], ...]}.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ProblemError
from ..files import read_json


def load(path_or_list, kind: str) -> list:
    """[(M, N, K), ...] for kind "gemm", [[(M, N, K), ...], ...] for "grouped"."""
    data = path_or_list
    if isinstance(path_or_list, (str, Path)):
        data = read_json(path_or_list, "problem file", ProblemError)
    if isinstance(data, dict):
        unknown = set(data) - {"problems"}
        if unknown:
            raise ProblemError(f"problem file has unknown key(s) {sorted(unknown)}; expected 'problems'")
        data = data.get("problems", [])
    if not isinstance(data, list) or not data:
        raise ProblemError("a problem file holds a non-empty list of problems")
    return [(_grouped if kind == "grouped" else _single)(p, i) for i, p in enumerate(data)]


def _single(p, i) -> tuple:
    if isinstance(p, dict):
        unknown = set(p) - {"M", "N", "K"}
        if unknown or len(p) != 3:
            raise ProblemError(f"problem {i}: expected keys M, N, K, got {sorted(p)}")
        p = [p["M"], p["N"], p["K"]]
    if not (isinstance(p, (list, tuple)) and len(p) == 3 and all(isinstance(v, int) and v >= 1 for v in p)):
        raise ProblemError(f"problem {i}: expected three positive integers M, N, K, got {p!r}")
    return tuple(p)


def _grouped(p, i) -> tuple:
    if not isinstance(p, dict) or set(p) != {"groups"}:
        raise ProblemError(f"grouped problem {i}: expected {{\"groups\": [[M, N, K], ...]}}, got {p!r}")
    groups = p["groups"]
    if not isinstance(groups, list):
        raise ProblemError(f"grouped problem {i}: groups must be a list")
    out = []
    for g in groups:
        if not (isinstance(g, (list, tuple)) and len(g) == 3 and all(isinstance(v, int) and v >= 0 for v in g)):
            raise ProblemError(f"grouped problem {i}: each group is [M, N, K] >= 0, got {g!r}")
        out.append(tuple(g))
    return tuple(out)
