"""CK Tile Engine sweep configs -> gemm-dispatcher sweep configs.

Reads the legacy stream-K TE form (`reduction_strategy` inside
`trait_config`, the old token `reduction` = linear, an empty `problem`
block), the bridge TE form (`tile_config`, `trait_config`,
`streamk_config`), the codegen form (plain lists) and the old
`tile_configs[dtype][layout]` form. Every key is either mapped or
reported as dropped with its reason; nothing is ignored silently.

`ck_kernel_count` counts the kernels CK itself would expand the config to
(cartesian product; CK's trait rule drops the compute pipelines with the
interwave scheduler; its tile rule needs tile % (warps * warp tile) == 0),
before any target filtering.
"""

from __future__ import annotations

import itertools

import attrs

from ..errors import ConfigError
from ..files import read_json
from ..tile_engine.sweep import axis_values
from .names import STRATEGIES, target_fields

TILE_KEYS = ("tile_m", "tile_n", "tile_k")
CK_TILE_KEYS = ("warp_m", "warp_n", "warp_k", "warp_tile_m", "warp_tile_n", "warp_tile_k")
TRAIT_DEFAULTS = {"pipeline": ["compv3"], "scheduler": ["intrawave"], "epilogue": ["cshuffle"],
                  "pad_m": [False], "pad_n": [False], "pad_k": [False], "persistent": [False]}
COMPUTE_PIPELINES = ("compv3", "compv4", "compv5", "compv6", "comp_async", "basic_async_v1")

# Why each CK-only key has no gemm-dispatcher axis.
DROPPED = {
    "warp_m": "warps per block: CK's wave layout; CUTLASS derives warps from the schedule, the CPU has none",
    "warp_n": "warps per block (see warp_m)",
    "warp_k": "warps per block (see warp_m)",
    "warp_tile_m": "the MFMA instruction shape is AMD-specific (CUTLASS picks its wgmma shape)",
    "warp_tile_n": "the MFMA instruction shape (see warp_tile_m)",
    "warp_tile_k": "the MFMA instruction shape (see warp_tile_m)",
    "pipeline": "CK pipeline (mem/compv3/compv4...); CUTLASS SM90 collectives are TMA warp-specialized: "
                "sweep `schedule` and `stages` instead",
    "scheduler": "CK intrawave/interwave; no equivalent (see `schedule` on cuda)",
    "epilogue": "CK cshuffle/default; the epilogue is chosen by CUTLASS's collective builder",
    "pad_m": "padding: gemm-dispatcher kernels take any M, N, K (CPU) or check alignment at run time (cuda)",
    "pad_n": "padding (see pad_m)",
    "pad_k": "padding (see pad_m)",
    "persistent": "every gemm-dispatcher CUDA kernel is persistent; the CPU schedules tiles itself",
    "k_block_per_cu": "CK occupancy hint; no equivalent",
    "permute_n": "preshuffle-only CK option; no preshuffle variant here",
    "problem": "problems are given to the sweep separately (--problems)",
    "multi_d_config": "multi-D GEMM is not a gemm-dispatcher variant",
    "multi_abd_config": "multi-ABD GEMM is not a gemm-dispatcher variant",
    "structured_sparsity": "sparsity is not supported",
    "padding": "padding (see pad_m)",
}


@attrs.frozen
class Migration:
    sweep: dict              # a gemm-dispatcher sweep config
    mapped: tuple            # ((legacy key, new axis), ...)
    dropped: tuple           # ((legacy key, reason), ...)
    ck_kernels: int          # what CK expands the legacy config to
    variant: str

    def report(self) -> str:
        lines = [f"variant {self.variant}; CK expands this config to {self.ck_kernels} kernel(s)"]
        lines += [f"  mapped  {old} -> {new}" for old, new in self.mapped]
        lines += [f"  dropped {old}: {why}" for old, why in self.dropped]
        return "\n".join(lines)


def _spec(value, where):
    """A legacy axis value in TE form ({values} / {min,max,step}) or codegen form (a list)."""
    if isinstance(value, list):
        return {"values": value}
    if isinstance(value, dict):
        axis_values(where, value)  # validates, names the axis on error
        return value
    return {"values": [value]}


def _values(value, where):
    return axis_values(where, _spec(value, where))


def load(path_or_dict) -> dict:
    if isinstance(path_or_dict, dict):
        return path_or_dict
    return read_json(path_or_dict, "legacy config")


def _old_format(raw, dtype, layout):
    """The old default `tile_configs[dtype][layout]` list -> tile axes of its tiles."""
    tiles = raw["tile_configs"]
    try:
        entries = tiles[dtype][layout]
    except KeyError:
        raise ConfigError(f"legacy tile_configs has no entry for {dtype}/{layout}; "
                          f"it has {', '.join(f'{d}/{l}' for d in tiles for l in tiles[d])}") from None
    return entries


def _cpu_mapping(fields: dict, isa: str | None) -> str:
    """The report line of the cpu block: which ISA the sweep is for, and
    whether it was asked for or assumed (the active ISA)."""
    source = "as asked" if isa else "assumed: the active ISA; choose another with --isa"
    return (f"isa {fields['isa']} ({source}), micro_m {fields['micro_m']}, micro_n {fields['micro_n']}: "
            "the ISA's register tile that divides every CK tile")


def migrate(path_or_dict, *, target: str = "cpu", variant: str | None = None,
            dtype: str = "fp16", layout: str = "rcr", isa: str | None = None) -> Migration:
    """A legacy config -> a gemm-dispatcher sweep for `target`; on the cpu its
    configs are for ISA `isa` (None: the active ISA), which the sweep names."""
    raw = load(path_or_dict)
    known_top = {"tile_config", "trait_config", "streamk_config", "tile_configs", "traits"} | set(DROPPED)
    unknown = sorted(set(raw) - known_top)
    if unknown:
        raise ConfigError(f"unknown legacy config key(s) {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(sorted(known_top))}")
    mapped, dropped = [], []
    tile_cfg = dict(raw.get("tile_config", {}))
    trait_cfg = dict(raw.get("trait_config", {}))
    if "tile_configs" in raw:  # the old format: explicit tile dicts, traits as plain lists
        entries = _old_format(raw, dtype, layout)
        for key in TILE_KEYS + CK_TILE_KEYS:
            vals = sorted({e[key] for e in entries if key in e})
            if vals:
                tile_cfg[key] = vals
        for key, value in raw.get("traits", {}).items():
            trait_cfg[{"pipelines": "pipeline", "epilogues": "epilogue", "schedulers": "scheduler"}.get(key, key)] = value
        dropped.append(("tile_configs", f"the explicit tile list was flattened into axes for {dtype}/{layout}"))
    unknown_tile = sorted(set(tile_cfg) - set(TILE_KEYS) - set(CK_TILE_KEYS) - {"block_size"})
    if unknown_tile:
        raise ConfigError(f"unknown tile_config key(s) {unknown_tile}")
    unknown_trait = sorted(set(trait_cfg) - set(TRAIT_DEFAULTS) - {"reduction_strategy"})
    if unknown_trait:
        raise ConfigError(f"unknown trait_config key(s) {unknown_trait}")

    sweep = {}
    for key in TILE_KEYS:
        if key not in tile_cfg:
            raise ConfigError(f"legacy tile_config lacks {key!r}")
        sweep[key] = _spec(tile_cfg[key], key)
        mapped.append((f"tile_config.{key}", key))
    for key in CK_TILE_KEYS + ("block_size",):
        if key in tile_cfg:
            dropped.append((f"tile_config.{key}", DROPPED.get(key, "CK block size; derived by the target")))
    for key in TRAIT_DEFAULTS:
        if key in trait_cfg:
            dropped.append((f"trait_config.{key}", DROPPED[key]))

    strategies, source = None, "the bridge default (atomic)"
    if "reduction_strategy" in trait_cfg:  # legacy stream-K: a trait
        strategies = _values(trait_cfg["reduction_strategy"], "reduction_strategy")
        source = "trait_config.reduction_strategy"
    if "streamk_config" in raw:
        sk = raw["streamk_config"]
        extra = sorted(set(sk) - {"reduction_strategy"})
        if extra:
            raise ConfigError(f"unknown streamk_config key(s) {extra}")
        strategies = _values(sk["reduction_strategy"], "reduction_strategy")
        source = "streamk_config.reduction_strategy"
    if variant is None:
        variant = "stream_k" if strategies is not None else "regular"
    if variant == "stream_k":
        strategies = strategies or ["atomic"]  # the bridge's default when a config names none
        unknown_s = [s for s in strategies if s not in STRATEGIES]
        if unknown_s:
            raise ConfigError(f"unknown reduction strategy {unknown_s}; known: {', '.join(STRATEGIES)}")
        ours = sorted({STRATEGIES[s] for s in strategies})
        sweep["reduction"] = {"values": ours}
        mapped.append((source, "reduction (reduction -> linear)"))
        if target == "cuda" and "tree" in ours:
            mapped.append(("reduction_strategy=tree", "reduction tree, which on cuda combines split_k's K "
                           "slices (CUTLASS's stream-K has no tree): the sweep filters its points of "
                           "other decompositions; add the axes decomposition=split_k and splits"))
    for key in raw:
        if key == "problem":
            dropped.append(("problem", DROPPED["problem"] if raw[key] else "empty; " + DROPPED["problem"]))
        elif key in DROPPED:
            dropped.append((key, DROPPED[key]))
    tiles_m, tiles_n = _values(tile_cfg["tile_m"], "tile_m"), _values(tile_cfg["tile_n"], "tile_n")
    fields = target_fields(target, isa, tiles_m, tiles_n)
    sweep.update({key: {"values": [value]} for key, value in fields.items()})
    if target == "cpu":
        mapped.append(("(cpu target)", _cpu_mapping(fields, isa)))
    return Migration(sweep, tuple(mapped), tuple(dropped), ck_kernel_count(raw, tile_cfg, trait_cfg, strategies),
                     variant)


def ck_kernel_count(raw, tile_cfg, trait_cfg, strategies) -> int:
    """How many kernels CK generates from the config (before arch filtering)."""
    tiles = [_values(tile_cfg.get(k, [1]), k) for k in TILE_KEYS + CK_TILE_KEYS]
    traits = [_values(trait_cfg.get(k, TRAIT_DEFAULTS[k]), k) for k in TRAIT_DEFAULTS]
    count = 0
    for t in itertools.product(*tiles):
        tm, tn, tk, wm, wn, wk, xm, xn, xk = t
        if tm % (wm * xm) or tn % (wn * xn) or tk % (wk * xk):
            continue
        for pipe, sched, *_ in itertools.product(*traits):
            if pipe in COMPUTE_PIPELINES and sched == "interwave":
                continue
            count += 1
    return count * (len(strategies) if strategies else 1)
