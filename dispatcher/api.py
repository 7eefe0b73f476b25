"""The Python API: `gemm`, `grouped_gemm` and the step-by-step `Dispatcher`.

One call walks select -> codegen -> build -> load -> launch through the
hooks (see `dispatcher.hookspecs`). Libraries are built on first use and
cached on disk; loaded libraries and selections are memoized per process.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import attrs
import numpy as np

from . import targets
from .build import BuildCache
from .config import KernelConfig
from .errors import ConfigError, PluginError, ProblemError, UnsupportedProblem
from .library import Library
from .plugins import get_manager
from .problem import check_arrays, operand_list, prepare_gemm, prepare_grouped
from .records import resolve_launch_options
from .tuning import TuningDatabase


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
        configs, rejected = {}, []
        for fields in record.default_configs(problem.target, problem.dtype, problem.layout):
            try:
                config = self.config_for(problem, fields)
            except ConfigError as e:
                rejected.append((fields, str(e)))
                continue
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
                    **_fixed_fields(problem))
        return self.config_matching(problem, KernelConfig.create(**{**base, **fields}))

    def select(self, problem) -> KernelConfig:
        key = problem
        if key not in self._selected:
            candidates, rejected = self.default_configs(problem)
            chosen = self.hook.dispatcher_select_library(
                problem=problem, candidates=candidates, tuning=self.tuning)
            if chosen is None:
                raise PluginError(self._no_kernel_message(problem, rejected))
            self._selected[key] = chosen
        return self._selected[key]

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
        return Library(built.path, expected_name=config.name, config=config)

    def launch(self, library: Library, problem, operands, options=None):
        """Run `problem` on `library`; `options` are checked against the
        variant's launch options first (they reach native code)."""
        options = resolve_launch_options(self.manager.variant(problem.variant), options)
        result = self.hook.dispatcher_launch(library=library, problem=problem, operands=operands,
                                             options=options)
        if result is None:
            raise PluginError(f"no plugin launches variant {problem.variant!r}")
        return result

    # ------------------------------------------------------------- chains
    def library(self, config: KernelConfig) -> Library:
        """The loaded library of `config`: built once per machine, loaded once per process."""
        with self._lock:
            if config not in self._libraries:
                self._libraries[config] = self.load(self.build(self.codegen(config)), config)
            return self._libraries[config]

    def run(self, problem, operands, config=None, options=None):
        _, library = self._chosen(problem, config)
        return self.launch(library, problem, operands, options)

    def run_or_fall_back(self, problem, operands, config=None, options=None, strict=False):
        """`run`, but a selected kernel's status -2 retries with the variant's
        fallback (stream-K -> regular) unless `strict` or a config was given.
        Returns the (problem, config) that ran."""
        chosen, library = self._chosen(problem, config)
        try:
            self.launch(library, problem, operands, options)
            return problem, chosen
        except UnsupportedProblem:
            fallback = self.manager.variant(problem.variant).fallback
            if strict or config is not None or not fallback:
                raise
        problem = attrs.evolve(problem, variant=fallback)
        chosen, library = self.ready(problem)
        self.launch(library, problem, operands, options)
        return problem, chosen

    def ready(self, problem) -> tuple:
        """(selected config, its loaded library) for `problem`, memoized: the
        per-call path of `gemm` on a known problem is one dict lookup."""
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
        if not isinstance(config, KernelConfig):
            return self.config_for(problem, config)
        for field, want in (("variant", problem.variant), ("target", problem.target),
                            ("dtype_a", problem.dtype), ("dtype_c", problem.out_dtype),
                            ("layout", problem.layout)):
            if getattr(config, field) != want:
                raise ConfigError(f"config {config.name} has {field} {getattr(config, field)!r} "
                                  f"but the problem needs {want!r}")
        for field, want in _fixed_fields(problem).items():
            if config.variant_params.get(field) != want:
                raise ConfigError(f"config {config.name} has {field} "
                                  f"{config.variant_params.get(field)!r} but the problem needs {want!r}")
        return config


def _fixed_fields(problem) -> dict:
    """Variant-block values a problem of a declared kind fixes (its fused
    epilogue: `kinds.KindProblem.config_fields`); none for other problems."""
    return getattr(problem, "config_fields", {})


_DEFAULT: Dispatcher | None = None


def default_dispatcher() -> Dispatcher:
    global _DEFAULT
    if _DEFAULT is None or _DEFAULT.manager is not get_manager():
        _DEFAULT = Dispatcher()
    return _DEFAULT


def _resolve_target(target: str, *arrays) -> str:
    if not isinstance(target, str):
        raise ConfigError(f"target must be a target name or 'auto', got {type(target).__name__}")
    if target == "auto":
        return targets.for_arrays(*arrays)
    targets.get(target)
    return target


# What each problem kind is called with.
_CALLS = {"gemm": "dispatcher.gemm", "grouped": "dispatcher.grouped_gemm"}


def _variant(dispatcher, name, kind: str):
    """The record of variant `name`, which must run `kind` problems: a
    grouped variant cannot run one GEMM, nor a single-GEMM variant a list."""
    manager = dispatcher.manager if dispatcher is not None else get_manager()
    if not isinstance(name, str):
        raise ConfigError(f"variant must be a variant name, got {type(name).__name__}")
    record = manager.variant(name)
    if record.problem_kind != kind:
        fitting = sorted(n for n, r in manager.variants().items() if r.problem_kind == kind)
        raise ConfigError(f"variant {name!r} runs {record.problem_kind} problems: call "
                          f"{_CALLS.get(record.problem_kind, 'dispatcher.run or dispatcher.matmul' if record.operands else 'its own entry point')}, or give "
                          f"{_CALLS[kind]} one of its variants: {', '.join(fitting) or '(none)'}")
    return record


def _stored(values: np.ndarray, dtype) -> np.ndarray:
    """float64 `values` converted as the kernels' epilogue converts them: an
    integer output rounded half to even and saturated (docs/reference.md,
    "int32 outputs"), a float output rounded to nearest."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        values = np.clip(np.rint(values), info.min, info.max)
    return values.astype(dtype)


def gemm(a, b, *, c=None, alpha=1.0, beta=0.0, out_dtype=None, out=None, variant="regular",
         target="cpu", config=None, strict=False, options=None, dispatcher=None):
    """alpha * a @ b + beta * c, on the selected (or given) kernel.

    a, b: 2-D arrays of one input dtype, row- or column-major (views are read
    in place). On the cuda target: torch CUDA tensors or CUDA arrays (used in
    place, on the caller's current stream) or numpy arrays (copied to the
    device and back). c: the matrix beta scales (needed when beta != 0).
    out: write the result here (any layout); else a new row-major array of
    the inputs' kind is returned. out_dtype: defaults to CK's rule
    (fp8 -> fp16, int8 -> int32). target: "cpu", "cuda" or "auto" (the
    target owning the arrays). config: a KernelConfig or a dict of config
    fields; None selects one. strict: if the kernel cannot run the problem
    (status -2), raise `UnsupportedProblem` instead of falling back to the
    variant's fallback.
    """
    check_arrays([("a", a), ("b", b)], [("c", c), ("out", out)])
    resolve_launch_options(_variant(dispatcher, variant, "gemm"), options)  # before any build
    target = _resolve_target(target, a, b)
    session = targets.get(target).session(a, b, c, out)
    a_, b_, c_, out_ = session.arrays
    problem, operands, result = prepare_gemm(a_, b_, c=c_, out=out_, alpha=alpha, beta=beta,
                                             out_dtype=out_dtype, variant=variant, target=target,
                                             memory=session.memory, allocate=session.empty)
    host_out = out if isinstance(out, np.ndarray) and out_ is not out else None  # numpy out, device run
    if problem.m == 0 or problem.n == 0:
        return session.finish(result, host_out)
    if problem.k == 0:
        if target != "cpu":
            raise ProblemError("K = 0 is only supported on the cpu target")
        beta = operands.beta  # an empty product: C = beta * C, never reading C when beta is 0
        result[...] = _stored(beta * result.astype(np.float64), result.dtype) if beta else 0
        return result
    d = dispatcher or default_dispatcher()
    options = {"stream": session.stream, **(options or {})}
    d.run_or_fall_back(problem, operands, config, options, strict)
    return session.finish(result, host_out)


def grouped_gemm(list_a, list_b, *, out_dtype=None, alpha=1.0, target="cpu", config=None,
                 variant="grouped", options=None, dispatcher=None):
    """[alpha * a_g @ b_g for each g] in one launch; returns a list of arrays.

    Groups may differ in M, N and K (M_g = 0 is fine); they share one dtype
    and one layout. Arrays as for `gemm`.
    """
    list_a, list_b = operand_list(list_a, "list_a"), operand_list(list_b, "list_b")
    check_arrays([*((f"a[{g}]", x) for g, x in enumerate(list_a)),
                  *((f"b[{g}]", x) for g, x in enumerate(list_b))])
    resolve_launch_options(_variant(dispatcher, variant, "grouped"), options)
    target = _resolve_target(target, *list_a, *list_b)
    session = targets.get(target).session(*list_a, *list_b)
    arrays = session.arrays
    problem, operands, results = prepare_grouped(
        arrays[:len(list_a)], arrays[len(list_a):], out_dtype=out_dtype, alpha=alpha,
        variant=variant, target=target, memory=session.memory, allocate=session.empty)
    if any(m * n for m, n, _ in problem.groups):  # else every result is empty
        options = {"stream": session.stream, **(options or {})}
        (dispatcher or default_dispatcher()).run(problem, operands, config, options)
    return [session.finish(r) for r in results]
