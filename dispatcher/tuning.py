"""The tuning database: the measured winner per problem, read by selection.

One SQLite file (default `<build cache>/tuning.sqlite`), one row per
(variant, target, arch, dtype, out dtype, layout, problem) holding the
fastest kernel's config and time. Writers from several processes are safe:
WAL journal, a busy timeout, and an upsert that keeps the faster entry.
`lookup` answers exactly tuned problems, else the nearest tuned problem of
the same kind within a factor 2 of each size (by the log-distance of the
sizes), whose winner runs as its target carries it over (`neighbour_config`:
on cuda without its swizzle).

Shipped winners: `dispatcher/data/tuning/*.json` hold rows of the same
kind, measured by the tile engine's catalog sweeps on a named GPU (each
file says which and how: `export`), so a fresh install selects as a tuned
one. A database reads them beside its own rows: an exact entry of its own
first, then an exact shipped one, then the nearest (its own, where one is
as near as the nearest shipped one). Autotune still measures a problem
that only shipped rows cover (`has`). They are data, versioned with the
kernels they name: a row whose config no longer builds is skipped.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import time
from pathlib import Path

import attrs

from . import dtypes, targets
from .config import KernelConfig
from .errors import DispatcherError
from .files import read_json
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
# factor of 2 in each of the three sizes. Past it the winner says little (a
# GEMV is no 512-wide GEMM) and the selection model ranks instead.
NEAREST_WITHIN = 2
# The columns one set of winners is tuned for (a sweep covers one scope over its grid of problems).
SCOPE = ("variant", "target", "arch", "dtype", "out_dtype", "layout")


@functools.lru_cache(maxsize=None)
def shipped_rows(directory: Path = SHIPPED_DIR) -> dict:
    """The shipped winners: scope (variant, target, arch, dtype, out dtype,
    layout) -> [(problem, size_a, size_b, size_c, config JSON), ...]."""
    rows: dict = {}
    for path in sorted(directory.glob("*.json")):
        try:
            for r in read_json(path, "shipped tuning winners", DispatcherError)["rows"]:
                scope = tuple(r[c] for c in SCOPE)
                sizes = (r["size_a"], r["size_b"], r["size_c"])
                if not isinstance(r["problem"], str) or not isinstance(r["config"], dict) or \
                        not all(type(x) in (int, float) for x in sizes):
                    raise TypeError(f"a row's problem, sizes or config of the wrong type: {r!r:.200}")
                rows.setdefault(scope, []).append((r["problem"], *sizes, json.dumps(r["config"])))
        except (KeyError, TypeError) as e:
            raise DispatcherError(f"shipped tuning winners {path} are not rows of `TuningDatabase.export` "
                                  f"({type(e).__name__}: {e}); remove or rebuild the file") from None
    return rows


@attrs.frozen
class Winner:
    """What decides a problem's kernel in a tuning database: the config, the
    tuned problem it won (the problem itself, or its nearest neighbour),
    and whether that row was shipped with the package."""
    config: KernelConfig
    problem: str
    shipped: bool
    exact: bool
    adapted: str = ""  # what the config changes from the tuned winner (an epilogue, an output, a neighbour's swizzle)

    def __str__(self):
        adapted = f", with {self.adapted}" if self.adapted else ""
        return (f"{self.config.name} ({'shipped' if self.shipped else 'own'} winner of "
                f"{'this problem' if self.exact else 'the nearest tuned problem, ' + self.problem}{adapted})")


def _relaxed(problem) -> list:
    """[(a problem like `problem` whose winner may serve it, the config
    fields that make that winner's config `problem`'s, what they are)]:
    without its fused epilogue, with its input's default output, both."""
    fixed = dict(getattr(problem, "fixed", ()))  # the values the call fixes away from the defaults
    plain = attrs.evolve(problem, fixed=(), options=tuple((k, v) for k, v in problem.options
                                                          if k not in fixed)) if fixed else None
    default_out = dtypes.output_for(problem.dtype).token
    out = {"dtype_c": problem.out_dtype} if default_out != problem.out_dtype else None
    found = []
    if plain is not None:
        found.append((plain, fixed, "this problem's epilogue"))
    if out:
        found.append((attrs.evolve(problem, out_dtype=default_out), out, f"this problem's {problem.out_dtype} output"))
    if plain is not None and out:
        found.append((attrs.evolve(plain, out_dtype=default_out), {**fixed, **out},
                      f"this problem's epilogue and {problem.out_dtype} output"))
    return found


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

    def lookup(self, problem):
        """The tuned config for `problem`, or None (`winner`)."""
        found = self.winner(problem)
        return found and found.config

    def winner(self, problem) -> "Winner | None":
        """The tuned entry that decides `problem`, or None: an exact entry
        (the user's own before a shipped one), else the winner of the
        nearest tuned problem within a factor `NEAREST_WITHIN` of each size
        (the user's own, where any is that near), as its target carries it
        over (`_carried_over`). Equally near neighbours whose winners would
        run different kernels leave it to the selection model (1024^3
        between grid shapes of 512 and 2048: their four winners ran up to
        13% slower than the model's pick on the H100). A problem that no
        winner of its own decides takes, in `_relaxed` order, the winner of
        the same problem without its fused epilogue (bias, activation: it
        runs once per output element, after the main loop the tiles were
        tuned for), or with its input's default output dtype (the output
        only changes the epilogue's stores), with what differs set back
        (the shipped sweeps tune plain GEMMs with default outputs)."""
        found = self._winner(problem)
        if found is not None:
            return found or None  # False: its equally near neighbours disagree, the model decides
        for relaxed, fields, what in _relaxed(problem):
            found = self._winner(relaxed)
            if found is False:
                return None
            if found is None:
                continue
            try:
                config = found.config.replace(**fields)
            except DispatcherError:
                continue
            if not config.problems():  # not exact: autotune (`has`) still measures the problem itself
                return attrs.evolve(found, config=config, exact=False,
                                    adapted="; ".join(x for x in (what, found.adapted) if x))
        return None

    def _winner(self, problem) -> "Winner | None | bool":
        """`winner`'s lookup of `problem` as it is: None where no row is near,
        False where the nearest rows disagree."""
        key, sizes = problem_key(problem)
        own = self._select("SELECT problem, size_a, size_b, size_c, config FROM winners WHERE variant=? "
                           "AND target=? AND arch=? AND dtype=? AND out_dtype=? AND layout=?",
                           self._scope(problem)) if self.path.exists() else []
        usable = []  # (distance, shipped, problem, config), nearest first
        for row, shipped in [(r, 0) for r in own] + [(r, 1) for r in self._shipped(problem)]:
            pairs = [(max(x, 1.0), max(y, 1.0)) for x, y in zip(row[1:4], sizes)]
            if row[0] != key and any(max(x, y) > NEAREST_WITHIN * min(x, y) for x, y in pairs):
                continue
            distance = -1.0 if row[0] == key else sum(abs(math.log(x) - math.log(y)) for x, y in pairs)
            try:
                config = KernelConfig.from_dict(json.loads(row[4]))
            except DispatcherError:
                continue  # a stale entry (plugin or schema changed): not usable
            # (a tuned plain kernel must not serve a fused-epilogue call)
            if self._runs(problem, config):
                usable.append((distance, shipped, row[0], config))
        if not usable:
            return None
        least = min(u[0] for u in usable)
        # the equally near (to rounding), the user's own first among them
        nearest = sorted((u for u in usable if u[0] <= least + 1e-9), key=lambda u: u[1:3])
        distance, shipped, tuned, config = nearest[0]
        if distance < 0:
            return Winner(config, tuned, bool(shipped), True)
        carried = [(u[1], self._carried_over(problem, u[3])) for u in nearest]
        if len({c.name for s, c in carried if s == shipped}) > 1:
            return False  # neighbours whose winners would run different kernels do not decide
        adapted = carried[0][1]
        note = f"its target's change for a neighbour (winner there: {config.name})" if adapted is not config else ""
        return Winner(adapted, tuned, bool(shipped), False, adapted=note)

    @staticmethod
    def _carried_over(problem, config):
        """What of a neighbour's winner `config` runs `problem`: its target's
        `neighbour_config` of it where that config can run it, else itself."""
        adapted = targets.get(config.target).neighbour_config(config)
        return adapted if adapted.name != config.name and TuningDatabase._runs(problem, adapted) else config

    @staticmethod
    def _runs(problem, config) -> bool:
        """Whether `config` builds and runs `problem` (its fused epilogue, its output)."""
        return not config.problems() and not unmet_fields(problem, config)

    def has(self, problem) -> bool:
        """Whether `problem` itself (not a nearest neighbour) has a usable
        entry of this database's own, measured here: autotune asks, and
        tunes a problem that only shipped winners (of another card) or a
        stale row of its own cover."""
        found = self.winner(problem)
        return found is not None and found.exact and not found.shipped

    def _select(self, sql: str, parameters, named: bool = False) -> list:
        """The rows of one query (`named`: as dicts of the table's column
        names), or DispatcherError if the file is not a readable database."""
        try:
            with self._connect() as con:
                if named:
                    con.row_factory = sqlite3.Row
                    return [dict(r) for r in con.execute(sql, parameters)]
                return con.execute(sql, parameters).fetchall()
        except sqlite3.DatabaseError as e:
            raise DispatcherError(f"tuning database {self.path} is unreadable: {e}") from None

    def export(self, path, about: str, target: str | None = None) -> int:
        """Write this database's rows (of `target` only, if given) to a JSON
        file of shipped winners (`SHIPPED_DIR`); about: the GPU or CPU and
        the commands that measured them. Returns the row count; a
        DispatcherError, with nothing written, where there are none."""
        rows = [{**r, "config": json.loads(r["config"])} for r in self.entries(target)]
        if not rows:
            raise DispatcherError(f"the tuning database {self.path} has no winners"
                                  f"{' for target ' + target if target else ''} to export: run "
                                  "`gemm-dispatcher sweep` first")
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n")
        partial.replace(path)  # whole or not at all
        return len(rows)

    def entries(self, target: str | None = None) -> list:
        """The database's own rows as dicts (of `target` only, if given)."""
        if not self.path.exists():
            return []
        return self._select("SELECT * FROM winners WHERE ? IS NULL OR target = ? ORDER BY variant, problem",
                            (target, target), named=True)
