"""The tuning database: measured kernel times per problem, read by selection.

One SQLite file (default `<build cache>/tuning.sqlite`), one row per
(variant, target, arch, dtype, out dtype, layout, problem, kernel) holding
that kernel's config and time: a sweep stores every kernel it measured,
autotune the one it keeps. Writers from several processes are safe: WAL
journal, a busy timeout, and an upsert that keeps the faster time.

`winner` answers an exactly tuned problem with its fastest kernel. Any
other problem, where the database swept kernels at enough problems (a
sweep's grid), gets the kernel of least fitted time (`fitted_times`:
each kernel's times as a curve over the problem's tiles, waves and K;
the user's own fits, then their own nearest tuned problems, then the
shipped fits). Otherwise it is decided by the tuned problems near it (within a factor 2
of each size): of the `NEIGHBOURS` nearest, the kernel measured at all of
them whose times there, carried over to this problem by the occupancy
model (`selection.estimated_cost`: waves of tiles over the GPU's SMs
differ from shape to shape; from `CARRIED_FROM` neighbours on, one alone
decides by its times as measured), add up to the least (geometric mean). A
nearest winner alone missed the mid-size shapes: 2304 x 2560 x 12288 ran
the winner of 2560 x 2560 x 6144 (256x128, cluster 2x4) at 0.80 of cuBLAS
where a hybrid stream-K kernel ran 0.98 (H100). A kernel runs as its
target carries it over from a neighbour (`neighbour_config`: on cuda
without its swizzle); where no kernel was measured at all the nearest,
the selection model decides.

Shipped times: `dispatcher/data/tuning/<arch>.json` holds rows of the
same kind for one arch (`Target.arch_id`), measured by the tile engine's
catalog sweeps on a named GPU (each file says which and how: `export`), so
a fresh install selects as a tuned one. A lookup reads its arch's file
only: a CPU call never parses the GPU's rows. A database reads them beside its own rows: an exact entry of its own
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
from .epilogue import unmet_fields
from .errors import DispatcherError
from .files import read_json
from .fitted_times import fitted_kernels
from .selection import estimated_cost

_SCHEMA = """
CREATE TABLE IF NOT EXISTS timings (
    variant TEXT, target TEXT, arch TEXT, dtype TEXT, out_dtype TEXT, layout TEXT,
    problem TEXT, size_a REAL, size_b REAL, size_c REAL,
    kernel TEXT, config TEXT, latency_ms REAL, source TEXT, updated TEXT,
    PRIMARY KEY (variant, target, arch, dtype, out_dtype, layout, problem, kernel))
"""
# Databases written before `timings` hold one winner per problem in this table; it is read as
# timings of one kernel each.
_LEGACY_TABLE = "winners"
_COLUMNS = ("variant, target, arch, dtype, out_dtype, layout, problem, size_a, size_b, size_c, "
            "kernel, config, latency_ms, source, updated")


def problem_key(problem) -> tuple:
    """(text key, three sizes for the nearest-problem distance): the problem's own."""
    return problem.tuning_key()


SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "tuning"
# The farthest a tuned problem may be and still decide another's kernel: a
# factor of 2 in each of the three sizes. Past it the winner says little (a
# GEMV is no 512-wide GEMM) and the selection model ranks instead.
NEAREST_WITHIN = 2
# How many of the nearest tuned problems decide together. Replayed on the shipped H100 times
# against the measured catalog of 64 benchmark shapes (benchmarks/selection_replay.py on
# cuda_gemm_midsize_h100_ef3555f.json and cuda_gemm_h100_ef3555f.json), default kernel over the
# best: the nearest one's times alone regret geomean 1.021, worst 1.278; 4 nearest 1.017 / 1.126;
# 8 nearest 1.017 / 1.126 (the nearest winner alone, as the GPU measured it: 1.029 / 1.227).
NEIGHBOURS = 8
# The fewest deciding neighbours whose times the occupancy model carries over to the problem; one
# alone decides by its times as measured. On one neighbour the model alone picked split-K and
# hybrid kernels for few-tile problems that ran slower than measured there (2315x272x10368: split-K
# 2 at 1.35x the catalog's best; H100, cuda_gemm_random_h100_3f8c54f.json); averaged over several
# its errors cancel. Replayed (benchmarks/selection_replay.py) on the 70 shapes of the *_3f8c54f
# runs: carried from one on 1.025 / 1.347, from two on 1.017 / 1.120; on the ef3555f runs' 70:
# 1.017 / 1.126 (6 picks untimed) and 1.021 / 1.140 (1 untimed).
CARRIED_FROM = 2
# An export keeps a problem's kernels up to this factor slower than its fastest: no choice of the
# replay above changes when the slower ones are left out (replayed on the full sweeps).
EXPORT_WITHIN = 1.5
# The columns one set of winners is tuned for (a sweep covers one scope over its grid of problems).
SCOPE = ("variant", "target", "arch", "dtype", "out_dtype", "layout")


@functools.lru_cache(maxsize=None)
def shipped_rows(arch: str, directory: Path = SHIPPED_DIR) -> dict:
    """The shipped times of `arch` (the file `<arch>.json`, if there is
    one): scope (variant, target, arch, dtype, out dtype, layout) ->
    [(problem, size_a, size_b, size_c, config JSON, latency ms), ...]."""
    path = directory / f"{arch}.json"
    if not path.exists():
        return {}
    rows: dict = {}
    try:
        _, configs, found = _shipped_file(path)
        if not all(isinstance(config, dict) for config in configs.values()):
            raise TypeError("a config that is not an object")
        config_json = {name: json.dumps(config) for name, config in configs.items()}
        for r in found:
            scope = tuple(r[c] for c in SCOPE)
            numbers = (r["size_a"], r["size_b"], r["size_c"], r["latency_ms"])
            if not isinstance(r["problem"], str) or not all(type(x) in (int, float) for x in numbers):
                raise TypeError(f"a row's problem, sizes or time of the wrong type: {r!r:.200}")
            if r["arch"] != arch:
                raise ValueError(f"a row of arch {r['arch']!r}: this file holds {arch}'s rows only")
            rows.setdefault(scope, []).append((r["problem"], *numbers[:3], config_json[r["kernel"]], numbers[3]))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise DispatcherError(f"shipped tuning times {path} are not an export of `TuningDatabase.export` "
                              f"for {arch} ({type(e).__name__}: {e}); remove or rebuild the file") from None
    return rows


@functools.lru_cache(maxsize=16384)
def _config(text: str):
    """The KernelConfig of a stored row, or None for a stale one (its plugin or schema changed)."""
    try:
        return KernelConfig.from_dict(json.loads(text))
    except DispatcherError:
        return None


def _near(tuned_sizes, sizes) -> bool:
    """Whether a tuned problem is within `NEAREST_WITHIN` of each size."""
    return all(max(x, y) <= NEAREST_WITHIN * min(x, y) for x, y in _pairs(tuned_sizes, sizes))


def _distance(tuned_sizes, sizes) -> float:
    """The log-distance of two problems' sizes."""
    return sum(abs(math.log(x) - math.log(y)) for x, y in _pairs(tuned_sizes, sizes))


def _pairs(tuned_sizes, sizes):
    return [(max(x, 1.0), max(y, 1.0)) for x, y in zip(tuned_sizes, sizes)]


@functools.lru_cache(maxsize=4096)
def _neighbour_config(config):
    """Its target's `neighbour_config` of a stored config (`config` itself where unchanged)."""
    adapted = targets.get(config.target).neighbour_config(config)
    return config if adapted.name == config.name else adapted


@functools.lru_cache(maxsize=4096)
def _builds(config) -> bool:
    return not config.problems()


@attrs.frozen
class Winner:
    """What decides a problem's kernel in a tuning database: the config, the
    tuned problem it won (the problem itself, or the nearest neighbour of
    those that decided it), and whether that row was shipped with the package."""
    config: KernelConfig
    problem: str
    shipped: bool
    exact: bool
    adapted: str = ""  # what the config changes from the tuned winner (an epilogue, an output, a neighbour's swizzle)
    neighbours: int = 0  # how many nearby tuned problems decided it (0: exact)
    fitted: int = 0  # the tuned problems its fitted time model was fitted to (0: not decided so)
    predicted_ms: float = 0.0  # that model's time for the problem

    def __str__(self):
        adapted = f", with {self.adapted}" if self.adapted else ""
        if self.fitted:
            return (f"{self.config.name} (least time fitted to the {'shipped' if self.shipped else 'own'} times "
                    f"of {self.fitted} tuned problems: {self.predicted_ms * 1e3:.4g} us{adapted})")
        where = ("this problem" if self.exact else "this shape" if self.neighbours == 0
                 else f"the nearest tuned problem, {self.problem}"
                 if self.neighbours == 1 else f"the {self.neighbours} nearest tuned problems, nearest {self.problem}")
        return f"{self.config.name} ({'shipped' if self.shipped else 'own'} times of {where}{adapted})"


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
        self._legacy = None  # whether the file has an older version's winners table (`_tables`)

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
        """Keep `latency_ms` as `config`'s time on `problem` if it is faster
        than the stored one. True if it was stored."""
        return self.record_all([(problem, config, latency_ms)], source) > 0

    def record_all(self, measured, source: str = "") -> int:
        """`record` for many (problem, config, latency ms) at once, in one
        transaction (a sweep's every measurement). Returns how many were stored."""
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        rows = []
        for problem, config, latency_ms in measured:
            key, (a, b, c) = problem_key(problem)
            rows.append((*self._scope(problem, config.target), key, a, b, c, config.name,
                         json.dumps(config.to_dict()), float(latency_ms), source, now))
        with self._connect() as con:
            before = con.total_changes
            con.executemany(
                "INSERT INTO timings VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT(variant, target, arch, dtype, out_dtype, layout, problem, kernel) DO UPDATE SET "
                "config=excluded.config, latency_ms=excluded.latency_ms, source=excluded.source, "
                "updated=excluded.updated WHERE excluded.latency_ms < timings.latency_ms", rows)
            return con.total_changes - before

    def _shipped(self, problem) -> list:
        if not self.shipped:
            return []
        scope = self._scope(problem)
        return shipped_rows(scope[SCOPE.index("arch")]).get(scope, [])

    def _own(self, problem, key=None) -> list:
        """This database's rows of `problem`'s scope (of the tuned problem
        `key` only, if given), as `shipped_rows` gives them."""
        if not self.path.exists():
            return []
        where = "WHERE variant=? AND target=? AND arch=? AND dtype=? AND out_dtype=? AND layout=?" + \
            (" AND problem=?" if key is not None else "")
        parameters = self._scope(problem) + ((key,) if key is not None else ())
        columns = "problem, size_a, size_b, size_c, config, latency_ms"
        tables = self._tables()
        sql = " UNION ALL ".join(f"SELECT {columns} FROM {t} {where}" for t in tables)
        return self._select(sql, parameters * len(tables))

    def _tables(self) -> list:
        """The tables rows are read from: `timings`, and the winners table of
        a database written before it (looked up once: this version never
        makes one)."""
        if self._legacy is None:
            self._legacy = bool(self._select("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                                             (_LEGACY_TABLE,)))
        return ["timings"] + ([_LEGACY_TABLE] if self._legacy else [])

    def lookup(self, problem, record=None):
        """The tuned config for `problem`, or None (`winner`)."""
        found = self.winner(problem, record)
        return found and found.config

    def winner(self, problem, record=None) -> "Winner | None":
        """The tuned entry that decides `problem`, or None: an exact entry
        (the user's own before a shipped one), else the choice of the nearest
        tuned problems (module docstring; record: the problem's variant, whose
        split-K and hybrid kernels the occupancy model counts so), where
        they measured a kernel in common. A problem that no times of its own
        decide takes, in `_relaxed` order, the choice for the same problem
        without its fused epilogue (bias, activation: it runs once per output
        element, after the main loop the tiles were tuned for), or with its
        input's default output dtype (the output only changes the epilogue's
        stores), with what differs set back (the shipped sweeps tune plain
        GEMMs with default outputs)."""
        found = self._winner(problem, record)
        if found is not None:
            return found or None  # False: its nearest neighbours share no kernel, the model decides
        for relaxed, fields, what in _relaxed(problem):
            found = self._winner(relaxed, record)
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

    def _winner(self, problem, record) -> "Winner | None | bool":
        """`winner`'s lookup of `problem` as it is: None where no row is near,
        False where the nearest rows have no kernel in common."""
        key, sizes = problem_key(problem)
        measured = {}  # (shipped, tuned problem) -> (its sizes, {kernel name: (config, ms)}), usable ones only
        usable = ([], [])  # own, shipped: every usable row as (its sizes, config text, ms), for the fitted times
        runs = {}  # config text -> its config where it runs `problem`, else None (asked once per kernel)
        near = {}  # tuned problem -> whether it is near enough (asked once: it has a row per kernel)
        for shipped, rows in ((0, self._own(problem)), (1, self._shipped(problem))):
            for tuned, a, b, c, text, ms in rows:
                if text not in runs:
                    config = _config(text)
                    # (a tuned plain kernel must not serve a fused-epilogue call)
                    runs[text] = config if config is not None and self._runs(problem, config) else None
                config = runs[text]
                if config is None:
                    continue
                usable[shipped].append(((a, b, c), text, ms))
                if tuned not in near:
                    near[tuned] = tuned == key or _near((a, b, c), sizes)
                if not near[tuned]:
                    continue
                times = measured.setdefault((shipped, tuned), ((a, b, c), {}))[1]
                if config.name not in times or ms < times[config.name][1]:
                    times[config.name] = (config, ms)
        exact = [s for s, tuned in measured if tuned == key]
        if exact:
            shipped = min(exact)  # the user's own first
            config, _ = min(measured[shipped, key][1].values(), key=lambda t: (t[1], t[0].name))
            return Winner(config, key, bool(shipped), True)
        own_near = any(s == 0 for s, _ in measured)
        for shipped, rows in enumerate(usable):  # the user's own times first
            if shipped and own_near:
                break  # own times near it that no fit covers decide below, before shipped fits
            # kernels kept at a near tuned problem (an export drops the much slower: `EXPORT_WITHIN`),
            # or every fitted one where none is near
            kept = {name for (s, _), (_, times) in measured.items() if s == shipped for name in times}
            found = self._fitted_winner(problem, record, key, sizes, rows, bool(shipped), kept)
            if found is not None:
                return found
        # the nearest of the nearest one's kind (own before shipped where as near), nearest first
        by_distance = sorted((_distance(s, sizes), shipped, tuned) for (shipped, tuned), (s, _) in measured.items())
        if not by_distance:
            return None
        shipped = min(s for d, s, _ in by_distance if d <= by_distance[0][0] + 1e-9)  # (to rounding)
        pool = [(d, tuned) for d, s, tuned in by_distance if s == shipped][:NEIGHBOURS]
        carried = [(measured[shipped, tuned][0], self._carried_times(problem, measured[shipped, tuned][1]))
                   for _, tuned in pool]
        # the most of the nearest that measured a kernel in common, never splitting equally near ones
        # (databases of winners only: the nearest winner, unless an equally near one disagrees)
        for count in range(len(pool), 0, -1):
            if count < len(pool) and pool[count][0] <= pool[count - 1][0] + 1e-9:
                continue
            common = set.intersection(*(set(times) for _, times in carried[:count]))
            if common:
                break
        else:
            return False
        carried = carried[:count]
        # each neighbour as a problem of this one's kind, where its times are carried over by the model
        theres = [problem.at_tuning_sizes(sizes_of) if count >= CARRIED_FROM else None for sizes_of, _ in carried]

        def mean_log_time(name):
            """The mean over the neighbours of log(its time there, carried over to `problem`)."""
            config = carried[0][1][name][0]
            here = estimated_cost(problem, config, record) if any(t is not None for t in theres) else 0.0
            total = 0.0
            for there, (_, times) in zip(theres, carried):
                cost = estimated_cost(there, config, record) if there is not None else 0.0
                scale = math.log(here / cost) if min(here, cost) > 0 else 0.0  # (no tiles: nothing to scale)
                total += math.log(max(times[name][1], 1e-12)) + scale  # (a time of 0 recorded by hand)
            return total / len(carried)

        name = min(sorted(common), key=mean_log_time)
        config, _, measured_as = carried[0][1][name]
        note = f"its target's change for a neighbour's kernel ({measured_as})" if measured_as != name else ""
        return Winner(config, pool[0][1], bool(shipped), False, adapted=note, neighbours=count)

    def _fitted_winner(self, problem, record, key, sizes, rows, shipped: bool, kept: set) -> "Winner | None":
        """The kernel of least fitted time on `problem` (`key`, `sizes`: its
        `problem_key`, which the caller has; `fitted_times`) of those fitted
        to `rows` ((sizes, config text, ms), ...) that take it and are in
        `kept` (all, where it is empty), run as its target
        carries it over from the tuned problems (`_carried_over`: cuda drops
        a swizzle, which pays off only on the tile grid it was measured on;
        a fitted twin of that kernel competes as itself); or None where none
        is fitted, or where a kernel of the target's own schedule (gemv: M
        or N up to 4) takes the problem and none of those does."""
        if getattr(problem, "batch", 1) != 1 or not rows:
            return None  # a batched kind's rows mix batch counts its tuning sizes do not give back
        template = problem.at_tuning_sizes((1, 1, 1))
        if template is None:
            return None  # its kind's tuning sizes do not give a problem back
        target = targets.get(problem.target)
        fitted = fitted_kernels(template, record, tuple(rows), _config, target.parallelism_hint())
        candidates = {}  # name -> (the config that runs, its fit)
        for name, f in fitted.items():
            schedule = target.template_schedule(f.config)
            runs = self._carried_over(problem, f.config)
            if ((kept and name not in kept) or not f.answers(sizes) or (runs.name != name and runs.name in fitted)
                    or (schedule is not None and not target.takes_schedule(schedule, problem))):
                continue
            candidates[name] = (runs, f)
        own = {s for s in getattr(record, "target_schedules", ()) if target.takes_schedule(s, problem)}
        if not candidates or (own and not any(target.template_schedule(f.config) in own
                                              for _, f in candidates.values())):
            return None
        times = {name: f.predicted_ms(problem, record, sizes) for name, (_, f) in candidates.items()}
        name = min(sorted(times), key=times.get)
        runs = candidates[name][0]
        return Winner(runs, key, shipped, False, fitted=candidates[name][1].problems,
                      predicted_ms=times[name],
                      adapted=f"its target's change for the fitted kernel ({name})" if runs.name != name else "")

    def _carried_times(self, problem, times: dict) -> dict:
        """{kernel name: (config, ms, the kernel measured)} of one
        neighbour's usable times as they carry over to `problem`
        (`_carried_over`): a kernel the target changes takes its measured
        time to its change, unless the neighbour measured that one too."""
        carried = {}
        for name, (config, ms) in times.items():
            adapted = self._carried_over(problem, config)
            if adapted.name != name and adapted.name in times:
                continue
            if adapted.name not in carried or ms < carried[adapted.name][1]:
                carried[adapted.name] = (adapted, ms, name)
        return carried

    @staticmethod
    def _carried_over(problem, config):
        """What of a neighbour's kernel `config` runs `problem`: its target's
        `neighbour_config` of it where that config can run it, else itself."""
        adapted = _neighbour_config(config)
        return adapted if adapted is not config and TuningDatabase._runs(problem, adapted) else config

    @staticmethod
    def _runs(problem, config) -> bool:
        """Whether `config` builds and runs `problem` (its fused epilogue, its output)."""
        return _builds(config) and not unmet_fields(problem, config)

    def has(self, problem) -> bool:
        """Whether `problem` itself (not a nearest neighbour) has a usable
        entry of this database's own, measured here: autotune asks, and
        tunes a problem that only shipped winners (of another card) or a
        stale row of its own cover."""
        key = problem_key(problem)[0]
        return any((config := _config(text)) is not None and self._runs(problem, config)
                   for *_, text, _ in self._own(problem, key))  # (rows of `key` only)

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
        file of shipped times (`SHIPPED_DIR`, `write_shipped`); about: the GPU
        or CPU and the commands that measured them. Returns the row count; a
        DispatcherError, with nothing written, where there are none."""
        rows = [{**r, "config": json.loads(r["config"])} for r in self.entries(target)]
        if not rows:
            raise DispatcherError(f"the tuning database {self.path} has no times"
                                  f"{' for target ' + target if target else ''} to export: run "
                                  "`gemm-dispatcher sweep` first")
        return write_shipped(path, about, rows)

    def entries(self, target: str | None = None) -> list:
        """The database's own rows as dicts (of `target` only, if given)."""
        if not self.path.exists():
            return []
        tables = self._tables()
        sql = " UNION ALL ".join(f"SELECT {_COLUMNS} FROM {t} WHERE ? IS NULL OR target = ?" for t in tables)
        return self._select(sql + " ORDER BY variant, problem, latency_ms", (target, target) * len(tables),
                            named=True)


def _shipped_file(path) -> tuple:
    """(about, {kernel: config dict}, rows) of a file of shipped times."""
    found = read_json(path, "shipped tuning times", DispatcherError)
    return found["about"], found["configs"], found["rows"]


def read_shipped(path) -> tuple:
    """(about, rows) of a file of shipped times, each row with its `config` dict."""
    about, configs, rows = _shipped_file(path)
    return about, [{**r, "config": configs[r["kernel"]]} for r in rows]


def write_shipped(path, about: str, rows: list) -> int:
    """Write `rows` (dicts of the database's columns, each with its `config`
    dict) as a file of shipped times: each kernel's config once, then a row
    per problem and kernel, one a line, leaving out kernels more than
    `EXPORT_WITHIN` slower than their problem's fastest. Whole or not at
    all. Returns the rows written."""
    problem_of = lambda r: (*(r[c] for c in SCOPE), r["problem"])  # noqa: E731
    each: dict = {}  # one row per problem and kernel: its fastest (a database's timings and older winners both)
    for r in rows:
        if (problem_of(r), r["kernel"]) not in each or r["latency_ms"] < each[problem_of(r), r["kernel"]]["latency_ms"]:
            each[problem_of(r), r["kernel"]] = r
    fastest: dict = {}
    for r in each.values():
        fastest[problem_of(r)] = min(fastest.get(problem_of(r), math.inf), r["latency_ms"])
    kept = sorted((r for r in each.values() if r["latency_ms"] <= EXPORT_WITHIN * fastest[problem_of(r)]),
                  key=lambda r: (*(r[c] for c in SCOPE), r["size_a"], r["size_b"], r["size_c"], r["latency_ms"]))
    configs = {r["kernel"]: r["config"] for r in kept}
    lines = ["{" + f'"about": {json.dumps(about)},', '"configs": {']
    lines += [f" {json.dumps(name)}: {json.dumps(configs[name])}," for name in sorted(configs)]
    lines[-1] = lines[-1].rstrip(",")
    lines += ["},", '"rows": [']
    lines += [" " + json.dumps({k: v for k, v in r.items() if k != "config"}) + "," for r in kept]
    lines[-1] = lines[-1].rstrip(",")
    lines.append("]}")
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("\n".join(lines) + "\n")
    partial.replace(path)
    return len(kept)
