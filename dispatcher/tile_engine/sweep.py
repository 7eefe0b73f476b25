"""Sweep configs: axes -> KernelConfigs.

A sweep config maps axes to `{"values": [...]}` or `{"min": a, "max": b,
"step": s}` (range(a, b + 1, s), step 1 when absent), as CK's Tile Engine
does. Axes are the block tile (`tile_m`, `tile_n`, `tile_k`) and the keys of
the target's and the variant's config blocks; they may be grouped under
`*_config` objects (`tile_config`, `target_config`, `variant_config`). An
unknown axis or an invalid value is an error that names it; a combination
the target or variant cannot build is filtered and counted with its reason.

`"catalog": true` starts from the variant's default configs for the target,
dtype and layout (what selection ranks): each is swept over the other axes,
whose values replace its own. `{"catalog": true}` alone tunes the catalog on
this machine, as a shipped tuning database is built.

`"fixed": {"bias": "col", "activation": "gelu"}` names variant-block values
that every problem of the sweep fixes (a fused epilogue): every kernel
carries them, every problem is measured and verified with them (a bias
operand, the activation), and the tuning database keys the times by them,
as a call with that epilogue looks them up. Without it a fused call takes
the plain problem's winner with its epilogue added.
"""

from __future__ import annotations

import itertools
from collections import Counter

import attrs

from .. import targets
from ..config import KernelConfig
from ..errors import ConfigError
from ..files import read_json
from ..plugins import get_manager
from ..records import Option

TILE_AXES = ("tile_m", "tile_n", "tile_k")
_SPEC_KEYS = {"values", "min", "max", "step"}


@attrs.frozen
class SweepPlan:
    configs: tuple          # buildable KernelConfigs, deduplicated by name
    filtered: tuple         # ((axis values dict, reason), ...)
    fixed: tuple = ()       # ((option, value), ...) every problem fixes, sorted

    def reasons(self) -> Counter:
        return Counter(reason for _, reason in self.filtered)


def load(path_or_dict) -> dict:
    if isinstance(path_or_dict, dict):
        return path_or_dict
    raw = read_json(path_or_dict, "sweep config")
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep config {path_or_dict} must be a JSON object of axes, "
                          f"got a {type(raw).__name__}")
    return raw


def flatten(raw: dict) -> dict:
    """Axis name -> spec, with `*_config` groups merged."""
    axes = {}
    for key, value in raw.items():
        if key.endswith("_config") and isinstance(value, dict) and not (_SPEC_KEYS & set(value)):
            for axis, spec in value.items():
                if axis in axes:
                    raise ConfigError(f"sweep axis {axis!r} is given twice")
                axes[axis] = spec
        else:
            axes[key] = value
    return axes


def axis_values(axis: str, spec) -> list:
    if not isinstance(spec, dict):
        raise ConfigError(f"sweep axis {axis!r} must be {{\"values\": [...]}} or "
                          f"{{\"min\", \"max\", \"step\"}}, got {spec!r}")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ConfigError(f"sweep axis {axis!r} has unknown key(s) {sorted(unknown)}; "
                          "use values, or min/max/step")
    if "values" in spec:
        if set(spec) != {"values"} or not isinstance(spec["values"], list) or not spec["values"]:
            raise ConfigError(f"sweep axis {axis!r}: 'values' must be a non-empty list, alone")
        return list(spec["values"])
    if not {"min", "max"} <= set(spec):
        raise ConfigError(f"sweep axis {axis!r} needs both min and max")
    lo, hi, step = spec["min"], spec["max"], spec.get("step", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi, step)) or step < 1:
        raise ConfigError(f"sweep axis {axis!r}: min, max and step must be integers, step >= 1")
    values = list(range(lo, hi + 1, step))
    if not values:
        raise ConfigError(f"sweep axis {axis!r}: min {lo} > max {hi}")
    return values


def expand(raw, *, variant: str, target: str, dtype: str, layout: str, out_dtype=None,
           max_kernels: int = 0) -> SweepPlan:
    axes = flatten(load(raw))
    record = get_manager().variant(variant)
    catalog = axes.pop("catalog", False)
    if not isinstance(catalog, bool):
        raise ConfigError(f"sweep key 'catalog' must be true or false, got {catalog!r}")
    fixed = fixed_values(axes.pop("fixed", {}), record)
    schema = {o.name: o for o in (*targets.get(target).options, *record.options)}
    schema.update({name: Option(name, None, low=1, high=1 << 16) for name in TILE_AXES})
    unknown = sorted(set(axes) - set(schema))
    if unknown:
        raise ConfigError(f"unknown sweep axis/axes {', '.join(map(repr, unknown))} for variant "
                          f"{variant!r} on target {target!r}; known: {', '.join(sorted(schema))}")
    twice = sorted(set(axes) & set(fixed))
    if twice:
        raise ConfigError(f"sweep axis/axes {', '.join(map(repr, twice))} also in 'fixed': the problems fix them")
    values = {}
    for axis, spec in axes.items():
        values[axis] = [schema[axis].check(v, f"sweep axis {axis!r}") for v in axis_values(axis, spec)]
    base = dict(variant=variant, target=target, dtype=dtype, layout=layout)
    if out_dtype:
        base["dtype_c"] = out_dtype
    configs, filtered = {}, []
    names = list(values)
    points = [dict(zip(names, combo)) for combo in itertools.product(*(values[n] for n in names))]
    if catalog:
        starts = record.default_configs(target, dtype, layout)
        if not starts:
            raise ConfigError(f"variant {variant!r} has no catalog on target {target!r} for {dtype} {layout}")
        points = [{**start, **p} for start in starts for p in points]
        names = sorted({n for p in points for n in p})
    made = targets.get(target).fit_sweep([KernelConfig.create(**base, **{**p, **fixed}) for p in points], names)
    for point, config in zip(points, made):
        reasons = config.problems()
        if reasons:
            filtered.append((point, "; ".join(reasons)))
        else:
            configs.setdefault(config.name, config)
    chosen = list(configs.values())
    if max_kernels:
        chosen = chosen[:max_kernels]
    return SweepPlan(tuple(chosen), tuple(filtered), tuple(sorted(fixed.items())))


def fixed_values(raw, record) -> dict:
    """The sweep's `fixed` object, each value checked against the variant's
    option of that name."""
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep key 'fixed' must be an object of variant options, got {raw!r}")
    schema = {o.name: o for o in record.options}
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ConfigError(f"sweep 'fixed' names {', '.join(map(repr, unknown))}, not an option of variant "
                          f"{record.name!r}; its options: {', '.join(sorted(schema)) or 'none'}")
    return {name: schema[name].check(value, f"sweep 'fixed' {name!r}") for name, value in raw.items()}
