"""`KernelConfig`: one kernel, as a frozen, validated record.

The core owns the fields every GEMM has (variant, target, dtypes, layout,
block tile); the target owns the `target` block (e.g. the CPU micro-tile) and
the variant plugin owns the `variant` block (e.g. the stream-K reduction).
Both blocks are checked against the schemas their owners declare, so an
unknown key or value is an error that names it, never silently ignored.

`KernelConfig.name` is the join key across generated file, library,
registry entry, results row and tuning entry:

    gemm_{a}[x{b}]_{c}_{layout}_{tile_m}x{tile_n}x{tile_k}_{target}_{target block}{variant suffix}

e.g. `gemm_fp16_fp16_rcr_192x256x256_cpu_mt12x32_t0` or
`gemm_fp32_fp32_rcr_96x128x256_cpu_mt12x32_t0_streamk_linear_hybrid_w0`.
"""

from __future__ import annotations

import attrs

from . import dtypes, targets
from .errors import ConfigError, DtypeError
from .records import resolve_options

LAYOUTS = ("rcr", "rrr", "crr", "ccr", "rcc", "rrc", "crc", "ccc")
CORE_FIELDS = ("variant", "target", "dtype", "dtype_a", "dtype_b", "dtype_c", "layout",
               "tile_m", "tile_n", "tile_k")


def _dtype_token(value):
    try:
        return dtypes.get(value).token
    except DtypeError as e:
        raise ConfigError(str(e)) from None


# A block tile sizes per-thread buffers (the CPU's packed panels and block
# accumulator are tile_m x tile_k, tile_k x tile_n and tile_m x tile_n) that a
# kernel allocates inside its parallel region, so an absurd tile must be
# refused here: 96000 x 96000 asked for 37 GB per thread. 4096 is far above
# any useful tile on either target.
MAX_TILE = 4096


def _tile_size(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TILE:
        raise ConfigError(f"{attribute.name} must be a positive integer at most {MAX_TILE}, "
                          f"got {value!r}")


def _layout(instance, attribute, value):
    if value not in LAYOUTS:
        raise ConfigError(f"layout {value!r} is invalid; allowed: {', '.join(LAYOUTS)} "
                          "(A, B, C; r = row-major, c = column-major)")


@attrs.frozen
class KernelConfig:
    """Build one with `KernelConfig.create(...)` or `from_dict`, which fill
    and check the target and variant blocks."""

    variant: str
    target: str
    dtype_a: str = attrs.field(converter=_dtype_token)
    dtype_b: str = attrs.field(converter=_dtype_token)
    dtype_c: str = attrs.field(converter=_dtype_token)
    layout: str = attrs.field(validator=_layout)
    tile_m: int = attrs.field(validator=_tile_size)
    tile_n: int = attrs.field(validator=_tile_size)
    tile_k: int = attrs.field(validator=_tile_size)
    target_opts: tuple = ()
    variant_opts: tuple = ()

    def __attrs_post_init__(self):
        if self.dtype_a != self.dtype_b:
            raise ConfigError(f"dtype_a {self.dtype_a} and dtype_b {self.dtype_b} differ; "
                              "kernels take one input dtype")
        try:
            dtypes.output_for(self.dtype_a, self.dtype_c)
        except DtypeError as e:
            raise ConfigError(str(e)) from None

    # ---------------------------------------------------------------- views
    @property
    def dtype_acc(self) -> str:
        return dtypes.get(self.dtype_a).acc

    @property
    def target_params(self) -> dict:
        return dict(self.target_opts)

    @property
    def variant_params(self) -> dict:
        return dict(self.variant_opts)

    @property
    def name(self) -> str:
        from .plugins import get_manager

        dtype = self.dtype_a if self.dtype_a == self.dtype_b else f"{self.dtype_a}x{self.dtype_b}"
        target = targets.get(self.target)
        record = get_manager().variant(self.variant)
        return (f"gemm_{dtype}_{self.dtype_c}_{self.layout}_"
                f"{self.tile_m}x{self.tile_n}x{self.tile_k}_{self.target}_"
                f"{target.name_tokens(self.target_params)}{record.name_suffix(self.variant_params)}")

    def to_dict(self) -> dict:
        """Flat form: the core fields and both blocks' keys (see `from_dict`)."""
        d = {k: getattr(self, k) for k in ("variant", "target", "dtype_a", "dtype_b", "dtype_c",
                                           "layout", "tile_m", "tile_n", "tile_k")}
        d.update(self.target_opts)
        d.update(self.variant_opts)
        return d

    def replace(self, **changes) -> "KernelConfig":
        d = self.to_dict()
        d.update(changes)
        return KernelConfig.from_dict(d)

    # ----------------------------------------------------------- factories
    @classmethod
    def from_dict(cls, d: dict) -> "KernelConfig":
        return cls.create(**d)

    @classmethod
    def create(cls, variant="regular", target="cpu", dtype=None, dtype_a=None, dtype_b=None,
               dtype_c=None, layout="rcr", tile_m=None, tile_n=None, tile_k=None,
               **block_options) -> "KernelConfig":
        """Every key not a core field must belong to the target's or the
        variant's block; defaults come from their schemas."""
        from .plugins import get_manager

        record = get_manager().variant(variant)
        tgt = targets.get(target)
        dtype_a = dtype_a or dtype or "fp32"
        dtype_b = dtype_b or dtype_a
        dtype_c = dtype_c or dtypes.output_for(_dtype_token(dtype_a)).token
        target_keys = {o.name for o in tgt.options}
        variant_keys = {o.name for o in record.options}
        unknown = sorted(set(block_options) - target_keys - variant_keys)
        if unknown:
            raise ConfigError(
                f"unknown config key(s) {', '.join(map(repr, unknown))} for variant "
                f"{variant!r} on target {target!r}; known: "
                f"{', '.join(sorted(set(CORE_FIELDS) | target_keys | variant_keys))}")
        tile_m, tile_n, tile_k = (128 if t is None else t for t in (tile_m, tile_n, tile_k))
        config = cls(
            variant=variant, target=target, dtype_a=dtype_a, dtype_b=dtype_b, dtype_c=dtype_c,
            layout=layout, tile_m=tile_m, tile_n=tile_n, tile_k=tile_k,
            target_opts=resolve_options(
                tgt.options, {k: v for k, v in block_options.items() if k in target_keys},
                f"target {target!r}", {"dtype": _dtype_token(dtype_a), "layout": layout,
                                       "tile_m": tile_m, "tile_n": tile_n, "tile_k": tile_k}),
            variant_opts=resolve_options(
                record.options, {k: v for k, v in block_options.items() if k in variant_keys},
                f"variant {variant!r}"),
        )
        if target not in record.targets:
            raise ConfigError(f"variant {variant!r} does not support target {target!r}; "
                              f"it supports {', '.join(record.targets)}")
        for field, allowed in (("dtype_a", record.dtypes), ("layout", record.layouts)):
            if getattr(config, field) not in allowed:
                raise ConfigError(f"{field} {getattr(config, field)!r} is not supported by variant "
                                  f"{variant!r}; allowed: {', '.join(allowed)}")
        return config

    def problems(self) -> list[str]:
        """Why this config cannot be built on its target (empty if it can)."""
        target = targets.get(self.target)
        reasons = [target.check(self)]
        from .plugins import get_manager
        record = get_manager().variant(self.variant)
        schedule = target.template_schedule(self)
        if schedule is not None and schedule not in record.target_schedules:
            reasons.append(f"variant {self.variant!r} has no {schedule} kernel (its template does not implement "
                           f"the {self.target} target's {schedule} schedule)")
        reasons.append(record.check(self))
        return [r for r in reasons if r]
