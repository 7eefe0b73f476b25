"""The tuning database: the measured winner per problem, read by selection.

One SQLite file (default `<build cache>/tuning.sqlite`), one row per
(variant, target, arch, dtype, out dtype, layout, problem) holding the
fastest kernel's config and time. Writers from several processes are safe:
WAL journal, a busy timeout, and an upsert that keeps the faster entry.
`lookup` answers exactly tuned problems, else the nearest tuned problem of
the same kind (log-distance of the sizes).

Shipped winners: `dispatcher/data/tuning/*.json` hold rows of the same
kind, measured by the tile engine's catalog sweeps on a named GPU (each
file says which and how: `export`), so a fresh install selects as a tuned
one. A database reads them beside its own rows: an exact entry of its own
first, then an exact shipped one, then the nearest of either (its own on
a tie). They are data, versioned with the kernels they name: a row whose
config no longer builds is skipped.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import time
from pathlib import Path

from . import selection, targets
from .config import KernelConfig
from .errors import DispatcherError
from .problem import unmet_fields

_SCHEMA = """
CREATE TABLE IF NOT EXISTS winners (
    variant TEXT, target TEXT, arch TEXT, dtype TEXT, out_dtype TEXT, layout TEXT,
    problem TEXT, size_a REAL, size_b REAL, size_c REAL,
    kernel TEXT, config TEXT, latency_ms REAL, source TEXT, updated TEXT,
    PRIMARY KEY (variant, target, arch, dtype, out_dtype, layout, problem))
"""


def problem_key(problem) -> tuple:
    """(text key, three sizes for the nearest-problem distance): the problem's own."""
    return problem.tuning_key()


SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "tuning"
# The farthest a tuned problem may be and still decide another's kernel: a
# factor of 2 in each of the three sizes (the sum of their log-distances).
# Past it the winner says little (a GEMV is no 512-wide GEMM) and the
# selection model ranks instead.
NEAREST_WITHIN = 3 * math.log(2)
_COLUMNS = ("variant", "target", "arch", "dtype", "out_dtype", "layout", "problem", "size_a", "size_b",
            "size_c", "kernel", "config", "latency_ms", "source", "updated")


@functools.lru_cache(maxsize=None)
def shipped_rows(directory: Path = SHIPPED_DIR) -> dict:
    """The shipped winners: scope (variant, target, arch, dtype, out dtype,
    layout) -> [(problem, size_a, size_b, size_c, config JSON), ...]."""
    rows: dict = {}
    for path in sorted(directory.glob("*.json")):
        for r in json.loads(path.read_text())["rows"]:
            scope = tuple(r[c] for c in _COLUMNS[:6])
            rows.setdefault(scope, []).append((r["problem"], r["size_a"], r["size_b"], r["size_c"],
                                               json.dumps(r["config"])))
    return rows


class TuningDatabase:
    def __init__(self, path, shipped: bool = True):
        """shipped: whether lookups also read the winners shipped with the
        package (module docstring)."""
        self.path = Path(path)
        self.shipped = shipped

    @classmethod
    def default(cls) -> "TuningDatabase":
        """The one in the writable build cache (the per-user one while
        `$DISPATCHER_CACHE_DIR` is a read-only shared cache), as `Dispatcher` reads."""
        from .build import BuildCache
        return cls(BuildCache().root / "tuning.sqlite")

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=60)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute(_SCHEMA)
        return con

    def _scope(self, problem, config_target=None) -> tuple:
        target = config_target or problem.target
        return (problem.variant, target, targets.get(target).arch_id(), problem.dtype,
                problem.out_dtype, problem.layout)

    def record(self, problem, config: KernelConfig, latency_ms: float, source: str = "") -> bool:
        """Keep `config` as the winner for `problem` if it is faster than the
        stored one. True if it was stored."""
        key, (a, b, c) = problem_key(problem)
        row = (*self._scope(problem, config.target), key, a, b, c, config.name,
               json.dumps(config.to_dict()), float(latency_ms), source, time.strftime("%Y-%m-%dT%H:%M:%S"))
        with self._connect() as con:
            cur = con.execute(
                "INSERT INTO winners VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT(variant, target, arch, dtype, out_dtype, layout, problem) DO UPDATE SET "
                "kernel=excluded.kernel, config=excluded.config, latency_ms=excluded.latency_ms, "
                "source=excluded.source, updated=excluded.updated "
                "WHERE excluded.latency_ms < winners.latency_ms", row)
            return cur.rowcount > 0

    def _shipped(self, problem) -> list:
        return shipped_rows().get(self._scope(problem), []) if self.shipped else []

    def lookup(self, problem, candidates=(), record=None):
        """The tuned config for `problem`, or None: an exact entry (the
        module docstring says whose first), else the winner of the nearest
        tuned problem within `NEAREST_WITHIN`; where several are equally
        near and disagree, the one the selection model ranks first (for
        the variant `record`; without it, the first in the order of the tuned
        problems' keys)."""
        key, sizes = problem_key(problem)
        own = self._select("SELECT problem, size_a, size_b, size_c, config FROM winners WHERE variant=? "
                           "AND target=? AND arch=? AND dtype=? AND out_dtype=? AND layout=?",
                           self._scope(problem)) if self.path.exists() else []
        usable = []  # (distance, shipped, problem, config), nearest first
        for row, shipped in [(r, 0) for r in own] + [(r, 1) for r in self._shipped(problem)]:
            distance = -1.0 if row[0] == key else sum(
                abs(math.log(max(x, 1.0)) - math.log(max(y, 1.0))) for x, y in zip(row[1:4], sizes))
            if distance > NEAREST_WITHIN:
                continue
            try:
                config = KernelConfig.from_dict(json.loads(row[4]))
            except DispatcherError:
                continue  # a stale entry (plugin or schema changed): not usable
            # (a tuned plain kernel must not serve a fused-epilogue call)
            if not config.problems() and not unmet_fields(problem, config):
                usable.append((distance, shipped, row[0], config))
        if not usable:
            return None
        usable.sort(key=lambda u: u[:3])
        if usable[0][0] < 0:
            return usable[0][3]
        tied = list({u[3].name: u[3] for u in usable if u[0] <= usable[0][0] + 1e-9}.values())
        if record is None or len(tied) == 1:
            return usable[0][3]
        return selection.rank(problem, tied, record)[0].config

    def has(self, problem) -> bool:
        """Whether `problem` itself (not a nearest neighbour) has an entry,
        its own or shipped."""
        key, _ = problem_key(problem)
        if any(row[0] == key for row in self._shipped(problem)):
            return True
        if not self.path.exists():
            return False
        return bool(self._select("SELECT 1 FROM winners WHERE variant=? AND target=? AND arch=? AND "
                                 "dtype=? AND out_dtype=? AND layout=? AND problem=?",
                                 (*self._scope(problem), key)))

    def _select(self, sql: str, parameters) -> list:
        """The rows of one query, or DispatcherError if the file is not a
        readable database."""
        try:
            with self._connect() as con:
                return con.execute(sql, parameters).fetchall()
        except sqlite3.DatabaseError as e:
            raise DispatcherError(f"tuning database {self.path} is unreadable: {e}") from None

    def export(self, path, about: str) -> int:
        """Write this database's rows to a JSON file of shipped winners
        (`SHIPPED_DIR`); about: the GPU or CPU and the commands that
        measured them. Returns the row count."""
        rows = [{**r, "config": json.loads(r["config"])} for r in self.entries()]
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n")
        partial.replace(path)  # whole or not at all
        return len(rows)

    def entries(self) -> list:
        if not self.path.exists():
            return []
        with self._connect() as con:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute("SELECT * FROM winners ORDER BY variant, problem")]
