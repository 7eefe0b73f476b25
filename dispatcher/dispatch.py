"""The hook chain, step by step: select -> codegen -> build -> load ->
launch (see `dispatcher.hookspecs`), with what each step's answer is kept
for: libraries are built on first use and cached on disk, loaded once per
process; selections and bound launches are memoized per process, and so
are the plans (`dispatcher.plans`) made under them, all forgotten when the
registered plugins change.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import attrs

from . import environ, targets
from .build import BuildCache
from .config import KernelConfig
from .epilogue import unmet_fields
from .errors import (BuildError, ConfigError, KernelError, LibraryError, PluginError, ToolchainError,
                     UnsupportedProblem)
from .library import Library
from .plugins import get_manager
from .problem import fixed_fields
from .records import check_offered, resolve_launch_options
from .selection import rank
from .timing import TimingOptions, median, spread
from .tuning import TuningDatabase

log = logging.getLogger("dispatcher")

# Autotune: how many candidates are built and timed (the default selection
# and the next ranked ones), how (each call from cold caches, enough calls
# for a stable median), and by how much one must beat the default to replace
# it: AUTOTUNE_MARGIN, or the timings' own noise where that is larger.
AUTOTUNE_TOP_K = 4
AUTOTUNE_TIMING = TimingOptions(warmup=3, repeat=25, flush_l2=True)
AUTOTUNE_MARGIN = 0.02


def autotune_winner(default, times: dict):
    """The config autotune keeps: `default` unless another's median time is
    lower by more than the noise (the larger of AUTOTUNE_MARGIN and both
    timings' `spread`), so that a tie measured through noise never replaces
    a kernel; then the fastest such one. times: config -> seconds of each call."""
    if default not in times:
        return min(times, key=lambda c: (median(times[c]), c.name)) if times else None
    base = median(times[default])
    better = [c for c in times if c != default and
              median(times[c]) * (1 + max(AUTOTUNE_MARGIN, spread(times[c]), spread(times[default]))) < base]
    return min(better, key=lambda c: (median(times[c]), c.name)) if better else default


def autotune_default() -> bool:
    """`DISPATCHER_AUTOTUNE=1` turns autotune on for calls that do not say."""
    return environ.flag("DISPATCHER_AUTOTUNE")


class Dispatcher:
    """The four hook steps, one method each, plus `run` that chains them."""

    def __init__(self, cache: BuildCache | None = None, tuning="default", manager=None):
        """tuning: a TuningDatabase, None for none, or "default" for the one
        in the build cache directory (what `gemm-dispatcher sweep` writes)."""
        self.manager = manager or get_manager()
        self.cache = cache or BuildCache()
        self.tuning = TuningDatabase(self.cache.root / "tuning.sqlite") if tuning == "default" else tuning
        self._libraries: dict = {}
        self._selected: dict = {}
        self._ready: dict = {}  # problem -> (selected config, its library): one lookup per call
        self._lock = threading.Lock()
        self.autotune_log: list = []  # what each autotune cost and chose
        self._launchers: dict = {}  # variant -> its bound dispatcher_launch implementation
        self.plans: dict = {}  # a call's signature -> its Plan (dispatcher.plans)
        self._generation = self.manager.generation

    @property
    def hook(self):
        return self.manager.hook

    # ------------------------------------------------------------ the steps
    def candidates(self, problem) -> list:
        """The variant's default configs for this problem that can be built here."""
        return self.default_configs(problem)[0]

    def default_configs(self, problem) -> tuple:
        """(the variant's default configs for `problem` that can be built
        here, sorted by name; [(config, why not)] for the others)."""
        record = self.manager.variant(problem.variant)
        check_offered(record, problem)
        configs, rejected = {}, []
        target = targets.get(problem.target)
        for fields in record.default_configs(problem.target, problem.dtype, problem.layout):
            try:
                config = self.config_for(problem, fields)
            except ConfigError as e:
                rejected.append((fields, str(e)))
                continue
            config = target.fit_sweep([config], tuple(fields))[0]  # a micro-tile that divides its tile
            problems = config.problems()
            if problems:
                rejected.append((config.name, "; ".join(problems)))
            else:
                configs[config.name] = config
        return [configs[n] for n in sorted(configs)], rejected

    def config_for(self, problem, fields) -> KernelConfig:
        """A KernelConfig for `problem` from a dict of fields (tiles, block
        options). Core fields it names are checked against the problem as a
        KernelConfig's are: a kernel built for other dtypes or another layout
        would read and write the buffers as what they are not."""
        if not isinstance(fields, Mapping):
            raise ConfigError(f"config must be a KernelConfig or a dict of config fields, "
                              f"got {type(fields).__name__}")
        base = dict(variant=problem.variant, target=problem.target, dtype=problem.dtype,
                    dtype_c=problem.out_dtype, layout=problem.layout,
                    **fixed_fields(problem))
        return self.config_matching(problem, KernelConfig.create(**{**base, **fields}))

    def select(self, problem) -> KernelConfig:
        key = problem
        if key not in self._selected:
            candidates, rejected = self.default_configs(problem)
            chosen = self.hook.dispatcher_select_library(
                problem=problem, candidates=candidates, tuning=self.tuning,
                record=self.manager.variant(problem.variant))
            if chosen is None:
                raise PluginError(self._no_kernel_message(problem, rejected))
            self._selected[key] = chosen
        return self._selected[key]

    def ranked(self, problem) -> list:
        """The buildable default configs as `selection.Estimate`s, best first."""
        return rank(problem, self.candidates(problem), self.manager.variant(problem.variant))

    def explain(self, problem) -> dict:
        """What selection would do for `problem`, running nothing: the
        tuning database's `Winner` (if any: which tuned problem, own or
        shipped), the ranked candidates with their estimates, and the
        rejected ones with the reason."""
        candidates, rejected = self.default_configs(problem)
        record = self.manager.variant(problem.variant)
        tuned = self.tuning.winner(problem, record) if self.tuning is not None else None
        chosen = self.hook.dispatcher_select_library(problem=problem, candidates=candidates,
                                                     tuning=self.tuning, record=record)
        return dict(problem=problem, tuned=tuned, chosen=chosen,
                    ranked=rank(problem, candidates, record), rejected=rejected)

    def _no_kernel_message(self, problem, rejected) -> str:
        target = targets.get(problem.target)
        lines = [f"no kernel can run variant {problem.variant!r} on {problem.target!r} "
                 f"({target.parallelism_hint()}) for {problem.dtype} {problem.layout}: "
                 + ("the tuning database has no entry and " if self.tuning is not None
                    else "no tuning database is used and ")
                 + ("every default config was rejected:" if rejected
                    else "the variant has no default config for it")]
        lines += [f"  {name}: {why}" for name, why in rejected]
        lines.append("What to do: pass config= with a config that builds here, tune the problem "
                     "with `gemm-dispatcher sweep`, or pick another variant or target "
                     "(the CPU target's ISA: DISPATCHER_CPU_ISA).")
        return "\n".join(lines)

    def codegen(self, config: KernelConfig):
        problems = config.problems()
        if problems:
            raise ConfigError(f"cannot build {config.name}: {'; '.join(problems)}")
        source = self.hook.dispatcher_codegen(config=config, target=targets.get(config.target))
        if source is None:
            raise PluginError(f"no plugin generates code for variant {config.variant!r}")
        return source

    def build(self, source):
        built = self.hook.dispatcher_build(source=source, target=targets.get(source.config.target),
                                           cache=self.cache)
        if built is None:
            raise PluginError(f"no plugin builds {source.name}")
        return built

    def load(self, built, config: KernelConfig) -> Library:
        targets.get(config.target).prepare_process()
        return Library(built.path, expected_name=config.name, config=config)

    def launch(self, library: Library, problem, operands, options=None, resolved: bool = False):
        """Run `problem` on `library`; `options` are checked against the
        variant's launch options first (they reach native code) unless
        `resolved` says the caller did. The first launch of a variant walks
        the hook chain and binds the implementation that answered; later
        launches call it directly (see `PluginManager.launcher`)."""
        if not resolved:
            options = resolve_launch_options(self.manager.variant(problem.variant), options)
        self._check_generation()
        bound = self._launchers.get(problem.variant)
        result = None
        if bound is not None:
            result = bound(library=library, problem=problem, operands=operands, options=options)
        if result is None:  # not bound yet, or the bound implementation passed this call on
            result, bound = self.manager.launcher(problem.variant, library, problem, operands, options)
            if bound is not None:
                self._launchers[problem.variant] = bound
        if result is None:
            raise PluginError(f"no plugin launches variant {problem.variant!r}")
        return result

    def bound_launch(self, variant: str):
        """The `dispatcher_launch` implementation bound for `variant`, or None."""
        return self._launchers.get(variant)

    def _check_generation(self):
        """Forget bound launches, selections and plans made under other plugins."""
        if self._generation != self.manager.generation:
            with self._lock:
                self._launchers.clear()
                self._selected.clear()
                self._ready.clear()
                self.plans.clear()
                self._generation = self.manager.generation

    # ------------------------------------------------------------- chains
    def library(self, config: KernelConfig) -> Library:
        """The loaded library of `config`: built once per machine, loaded once
        per process. Builds run outside the lock, so threads (autotune) build
        different configs at once; the build cache makes a second build of one
        config a lookup."""
        found = self._libraries.get(config)
        if found is None:
            built = self.load(self.build(self.codegen(config)), config)
            with self._lock:
                found = self._libraries.setdefault(config, built)
        return found

    def run(self, problem, operands, config=None, options=None):
        _, library = self._chosen(problem, config)
        return self.launch(library, problem, operands, options)

    def run_or_fall_back(self, problem, operands, config=None, options=None, strict=False,
                         resolved: bool = False):
        """`run`, but when the selected kernel returns status -2 the next
        ranked kernels of the variant are tried, then the variant's fallback
        (stream-K -> regular), unless `strict` or a config was given.
        Returns the (problem, config) that ran."""
        chosen, library = self._chosen(problem, config)
        try:
            self.launch(library, problem, operands, options, resolved)
            return problem, chosen
        except UnsupportedProblem:
            if strict or config is not None:
                raise
        for other in self.ranked(problem):
            if other.config != chosen:
                try:
                    library = self.library(other.config)
                    self.launch(library, problem, operands, options, resolved)
                except (UnsupportedProblem, BuildError, ToolchainError):
                    continue  # the next ranked kernel
                with self._lock:  # later calls of this problem go straight to it
                    self._selected[problem] = other.config
                    self._ready[problem] = (other.config, library)
                return problem, other.config
        fallback = self.manager.variant(problem.variant).fallback
        if not fallback:
            raise UnsupportedProblem(f"no kernel of variant {problem.variant!r} runs this problem "
                                     f"(every ranked candidate returned status -2)")
        return self.run_or_fall_back(attrs.evolve(problem, variant=fallback), operands, None, options,
                                     resolved=resolved)

    def _library_or_none(self, config):
        """The library of `config`, or None if it cannot be built here (an
        autotune candidate that fails is skipped, not the user's call)."""
        try:
            return self.library(config)
        except (BuildError, ToolchainError, LibraryError):
            return None

    def autotune_if_new(self, problem, operands, options=None):
        """`autotune` the first time `problem` is seen: not yet selected in
        this process and without an exact tuning-database entry of this
        machine's own (shipped winners were measured on another card)."""
        if problem not in self._ready and self.tuning is not None and not self.tuning.has(problem):
            self.autotune(problem, operands, options)

    def autotune(self, problem, operands, options=None, top_k: int = AUTOTUNE_TOP_K):
        """Build the default selection and the next ranked candidates (`top_k`
        in all) in parallel, time each on scratch outputs in this process
        (the target's timer: CUDA events on the GPU, from cold caches),
        keep the default unless another is faster by more than the noise
        (`autotune_winner`), store the winner in the tuning database and
        select it. Returns (winner, {config name: median seconds}, seconds
        this took), and logs that cost with every median and spread.
        Problems whose outputs are a list (the list form of grouped GEMM)
        are not autotuned."""
        started = time.perf_counter()
        target = targets.get(problem.target)
        if isinstance(operands.c, list):
            return None, {}, 0.0
        default = self.select(problem)
        configs = [default] + [e.config for e in self.ranked(problem) if e.config != default][:top_k - 1]
        with ThreadPoolExecutor(max_workers=min(len(configs), os.cpu_count() or 1)) as pool:
            libraries = list(pool.map(self._library_or_none, configs))
        memory = target.memory
        scratch = memory.empty(operands.c.shape, operands.c.dtype)  # never the caller's C
        trial = attrs.evolve(operands, c=scratch, ldc=max(operands.c.shape[1], 1),
                             **({"beta": 0.0} if hasattr(operands, "beta") else {}))
        options = resolve_launch_options(self.manager.variant(problem.variant), options)
        times = {}
        for config, library in zip(configs, libraries):
            if library is None:
                continue
            try:
                times[config] = target.measure(lambda i: self.launch(library, problem, trial, options),
                                               AUTOTUNE_TIMING, options.get("stream", 0))
            except (UnsupportedProblem, KernelError):
                continue
        winner = autotune_winner(default, times)
        if winner is None:
            return None, {}, time.perf_counter() - started
        if self.tuning is not None:
            self.tuning.record(problem, winner, median(times[winner]) * 1e3, source="autotune")
        with self._lock:
            self._selected[problem] = winner
            self._ready.pop(problem, None)
        spent = time.perf_counter() - started
        by_name = {c.name: median(t) for c, t in times.items()}
        log.info("autotune %s: %s won of %d in %.2f s (default %s)", problem, winner.name, len(times), spent,
                 default.name)
        self.autotune_log.append(dict(problem=problem, winner=winner.name, default=default.name, seconds=spent,
                                      times=by_name, spreads={c.name: spread(t) for c, t in times.items()}))
        return winner, by_name, spent

    def ready(self, problem) -> tuple:
        """(selected config, its loaded library) for `problem`, memoized: the
        per-call path of `gemm` on a known problem is one dict lookup."""
        self._check_generation()
        found = self._ready.get(problem)
        if found is None:
            config = self.select(problem)
            found = self._ready[problem] = (config, self.library(config))
        return found

    def _chosen(self, problem, config) -> tuple:
        """(config, library): the selected one, or `config` checked against the problem."""
        if config is None:
            return self.ready(problem)
        config = self.config_matching(problem, config)
        return config, self.library(config)

    def config_matching(self, problem, config) -> KernelConfig:
        """`config` (a KernelConfig or a dict of fields) checked against the problem."""
        check_offered(self.manager.variant(problem.variant), problem)
        if not isinstance(config, KernelConfig):
            return self.config_for(problem, config)
        for field, want in (("variant", problem.variant), ("target", problem.target),
                            ("dtype_a", problem.dtype), ("dtype_c", problem.out_dtype),
                            ("layout", problem.layout)):
            if getattr(config, field) != want:
                raise ConfigError(f"config {config.name} has {field} {getattr(config, field)!r} "
                                  f"but the problem needs {want!r}")
        unmet = unmet_fields(problem, config)
        if unmet:
            field, have, want = unmet[0]
            raise ConfigError(f"config {config.name} has {field} {have!r} but the problem needs {want!r}")
        return config


_DEFAULT: Dispatcher | None = None


def default_dispatcher() -> Dispatcher:
    global _DEFAULT
    if _DEFAULT is None or _DEFAULT.manager is not get_manager():
        _DEFAULT = Dispatcher()
    return _DEFAULT
