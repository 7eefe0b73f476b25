"""Registration records: what a plugin or target declares about itself.

A variant plugin answers `dispatcher_register_variants` with `VariantRecord`s
(as conda plugins answer with registration records); targets describe their
config block with the same `Option` schema. The core validates configs
against these records, so a plugin adds options without touching the core.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Callable, Optional

import attrs

from .errors import ConfigError, DtypeError, LayoutError


@attrs.frozen
class Option:
    """One key of a config block: its default and what values it allows.

    Either `choices` (an explicit tuple), `convert` (a function of the value
    and `context`: the config's core fields and, under "block", the block's
    values given or resolved before it; it returns the canonical value or
    raises ConfigError: the CPU ISA, which names only what the micro-kernel
    a kernel of the config's dtype, tile and micro-tile uses) or an integer
    range `[low, high]`.
    `default` is a value, or a function of the block's given values for a
    default that depends on another key (the CPU micro-tile on its ISA); a
    default is checked (and converted) as a given value is.
    """

    name: str
    default: Any
    doc: str = ""
    choices: Optional[tuple] = None
    low: Optional[int] = None
    high: Optional[int] = None
    convert: Optional[Callable] = None

    def check(self, value, block: str, context: Optional[dict] = None):
        """`value` converted to the option's type, or ConfigError naming it.
        `context`: the config's core fields ({"dtype": ...}) where known."""
        if self.convert is not None:
            try:
                return self.convert(value, context or {})
            except ConfigError as e:
                raise ConfigError(f"{block} option {self.name!r} = {value!r} is invalid: {e}") from None
        if self.choices is not None:
            if value not in self.choices:
                raise ConfigError(
                    f"{block} option {self.name!r} = {value!r} is invalid; "
                    f"allowed: {', '.join(map(repr, self.choices))}")
            return value
        if type(value) is not int:  # a plain int skips the slow ABC check (every launch checks one)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) and not (
                    isinstance(value, str) and value.lstrip("-").isdigit()):
                raise ConfigError(f"{block} option {self.name!r} must be an integer, got {value!r}")
            value = int(value)
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise ConfigError(
                f"{block} option {self.name!r} = {value} is out of range [{self.low}, {self.high}]")
        return value

    def default_for(self, given: dict):
        return self.default(given) if callable(self.default) else self.default

    def describe(self) -> str:
        if self.choices is not None:
            return "|".join(map(str, self.choices))
        return f"{self.low}..{self.high}"


def _refuse_unknown(given, known, block: str):
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown {block} option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(known)) or '(none)'}")


def resolve_options(schema: tuple, given: dict, block: str, context: Optional[dict] = None) -> tuple:
    """Defaults filled in, every key and value checked (`context`: the
    config's core fields, for `Option.convert`, which also gets the block's
    values so far); a sorted tuple of (name, value) pairs, ready to live in
    a frozen config."""
    _refuse_unknown(given, {o.name for o in schema}, block)
    resolved = dict(given)
    for opt in schema:  # in schema order: a default may depend on an earlier key
        value = resolved[opt.name] if opt.name in given else opt.default_for(resolved)
        resolved[opt.name] = opt.check(value, block, opt.convert and {**(context or {}),
                                                                       "block": dict(resolved)})
    return tuple(sorted(resolved.items()))


# Launch options (`options=` of `gemm`): the core's, and the ones a variant
# declares in `VariantRecord.launch_options`. A worker count becomes the size
# of an OpenMP team, and libgomp kills the process when it cannot start one
# (40000 did; 100000 crashed), so it is bounded here, as the CPU target's
# `threads` is, before any native call.
MAX_WORKERS = 1024
STREAM = Option("stream", 0, "the target's stream handle (set from the arrays' session)", low=0)
WORKERS = Option("workers", 0, "threads or persistent workers of one launch (0: the kernel's default)",
                 low=0, high=MAX_WORKERS)


def resolve_launch_options(record, options) -> dict:
    """`options` checked against the core's and `record`'s launch options,
    defaults filled: an unknown key or a value out of range is a ConfigError
    before anything native runs. Lean, unlike `resolve_options`: it runs on
    every launch."""
    if options is None:
        options = {}
    elif not isinstance(options, Mapping):
        raise ConfigError(f"options must be a dict of launch options, got {type(options).__name__}")
    block = f"{record.name!r} launch"
    resolved = {}
    for opt in (STREAM, *record.launch_options):
        resolved[opt.name] = (opt.check(options[opt.name], block) if opt.name in options
                              else opt.default_for(resolved))
    if not options.keys() <= resolved.keys():
        _refuse_unknown(options, resolved, block)
    return resolved


@attrs.frozen
class VariantRecord:
    """What a variant plugin provides.

    problem_kind: "gemm" (one problem, `dispatcher_run_gemm`) or "grouped"
        (a list of problems, `dispatcher_run_grouped_gemm`).
    options: the schema of the variant block of `KernelConfig`.
    launch_options: the `options=` keys its launch reads besides the core's
        `stream` (e.g. `WORKERS`); any other key is refused.
    name_suffix: variant block -> the kernel-name suffix (e.g. "_grouped").
    default_configs: (target, dtype, layout) -> list of config dicts the
        selection considers when the tuning database has no answer.
    check: KernelConfig -> None if the variant can build it, else the reason.
    partial_sums: KernelConfig -> how many partial sums one output element
        may be combined from (stream-K, split-K); scales the tolerance.
    fallback: the variant `dispatcher.gemm` retries with when every ranked
        kernel of this one returns status -2 (unless the caller is strict).
    k_splits: KernelConfig -> how many K slices one output tile is summed
        from (split-K); what the performance model is told.
    shares_last_wave: KernelConfig -> whether its kernels share the tiles
        of a partial last wave out over all the workers (stream-K, hybrid):
        the occupancy model and the fitted times then count its waves as
        its target's `shared_waves` does (cuda: CUTLASS's heuristic, which
        keeps whole waves where the last is at least half full, and splits
        the last two waves' tiles into pieces otherwise).
    packs_a_once: its kernels pack all of A once per call where their
        target's tile library finds that pays (the cpu's `dcpu::SharedPackedA`),
        not once per tile: the occupancy model counts A's packing so.
    target_schedules: the schedules of a target that its templates
        implement themselves (the target's `template_schedule`; cuda: "gemv",
        dispatcher/native/cuda/gemv.hpp); configs of them are refused to
        every other variant.
    operands: the problem kind as data (`dispatcher.kinds.Operand`s: a, b,
        out and any extra operands such as a bias); a variant that declares
        them runs through `dispatcher.run(variant, **operands, **params)`.
    params: its scalar parameters (`dispatcher.kinds.Param`s), passed to
        the kernel in `dispatcher_gemm_args.params`, in this order.
    problem_options: {extra operand name: its (row, col) strides in
        elements as the kernel reads it, 0 = broadcast, or None if not
        given} -> variant-block values the call fixes (e.g. the fused
        bias's orientation); may raise ProblemError.
    reference: (operands, params) -> the float64 result, where `operands`
        maps each operand given (not `out`) to its values in float64 and
        `params` each parameter and `alpha` by name: what
        `gemm-dispatcher run --verify` checks a variant with extra
        operands or parameters against (None: such a run is refused).
    """

    name: str
    problem_kind: str
    targets: tuple
    dtypes: tuple
    layouts: tuple
    options: tuple = ()
    launch_options: tuple = ()
    name_suffix: Callable[[dict], str] = lambda opts: ""
    default_configs: Callable[[str, str, str], list] = lambda target, dtype, layout: []
    check: Callable[[Any], Optional[str]] = lambda config: None
    fallback: Optional[str] = None
    partial_sums: Callable[[Any], int] = lambda config: 1
    k_splits: Callable[[Any], int] = lambda config: 1
    shares_last_wave: Callable[[Any], bool] = lambda config: False
    packs_a_once: bool = False
    target_schedules: tuple = ()
    description: str = ""
    provider: str = ""
    operands: tuple = ()
    params: tuple = ()
    problem_options: Callable[[dict], dict] = lambda extras: {}
    reference: Optional[Callable[[dict, dict], Any]] = None


def check_offered(record, problem):
    """Refuse a problem `record` does not offer, whatever its configs: an
    input dtype (DtypeError), a layout (LayoutError) or a target
    (ConfigError) outside its declaration. No config or sweep could run it,
    so the error names what the variant offers instead."""
    if problem.dtype not in record.dtypes:
        raise DtypeError(f"variant {record.name!r} takes {', '.join(record.dtypes)} inputs, not "
                         f"{problem.dtype}; convert the inputs or pick another variant")
    if problem.layout not in record.layouts:
        raise LayoutError(f"variant {record.name!r} reads layouts {', '.join(record.layouts)} (A, B, C: "
                          f"r row-, c column-major), not {problem.layout}; pass operands in one of them")
    if problem.target not in record.targets:
        raise ConfigError(f"variant {record.name!r} runs on {', '.join(record.targets)}, not "
                          f"{problem.target!r}; pick another target or variant")
