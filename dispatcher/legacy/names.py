"""CK kernel names, in every legacy order, parsed into one record.

Forms read (see docs/migration.md):
  bridge      gemm_{dt}_{ly}_{pipe}_{epi}_{sched}_{PadM}_{PadN}_{PadK}_{Persist}_{tile}_{wave}_{wtile}[_streamk[_linear|_tree]|_grouped]
  executable  benchmark_gemm_streamk_{dt}_{ly}_{pipe}_{epi}_{sched}_{redux}_{PadM}_{PadN}_{PadK}_{Persist}_{tiles}
              (older builds: the strategy after the four booleans)
  header      {dt}_{ly}_{pipe}_{epi}_{sched}_{redux}_{bools}_{tiles}     (KERNEL_NAME, no gemm_ prefix)
  list file   gemm_{dt}_{ly}_{pipe}_{epi}_{sched}_{bools}_{redux}_{tiles}
The legacy strategy token `reduction` means linear.
"""

from __future__ import annotations

import re

import attrs

from ..errors import ConfigError
from ..targets import cpu, cpu_isa

DTYPES = {"fp16": "fp16", "bf16": "bf16", "fp8": "fp8_e4m3", "bf8": "fp8_e5m2", "int8": "int8", "fp32": "fp32"}
STRATEGIES = {"atomic": "atomic", "linear": "linear", "reduction": "linear", "tree": "tree"}
BRIDGE_SUFFIX = {"atomic": "_streamk", "linear": "_streamk_linear", "tree": "_streamk_tree"}
_TRIPLE = re.compile(r"^\d+x\d+x\d+$")
_BOOL = {"True": True, "False": False}


class NameError_(ConfigError):
    """A name that is not a CK GEMM kernel name in any known order."""


@attrs.frozen
class CkKernel:
    dtype: str
    layout: str
    pipeline: str
    epilogue: str
    scheduler: str
    pads: tuple
    persistent: bool
    tile: tuple
    wave: tuple
    warp_tile: tuple
    variant: str = "regular"           # regular | stream_k | grouped
    reduction: str | None = None       # stream-K: atomic | linear | tree
    form: str = "bridge"

    @property
    def bridge_name(self) -> str:
        """The CK Tile Dispatcher (bridge) name: the canonical CK form."""
        t = lambda v: "x".join(map(str, v))
        bools = "_".join(str(b) for b in (*self.pads, self.persistent))
        suffix = BRIDGE_SUFFIX[self.reduction] if self.variant == "stream_k" else (
            "_grouped" if self.variant == "grouped" else "")
        return (f"gemm_{self.dtype}_{self.layout}_{self.pipeline}_{self.epilogue}_{self.scheduler}_"
                f"{bools}_{t(self.tile)}_{t(self.wave)}_{t(self.warp_tile)}{suffix}")


def _split_tail(parts, name):
    """The three trailing AxBxC triples (tile, wave, warp tile) and the rest."""
    if len(parts) < 3 or not all(_TRIPLE.match(p) for p in parts[-3:]):
        raise NameError_(f"{name!r}: expected three MxNxK triples at the end")
    return parts[:-3], tuple(tuple(int(v) for v in p.split("x")) for p in parts[-3:])


def _bools(tokens, name):
    if len(tokens) != 4 or any(t not in _BOOL for t in tokens):
        raise NameError_(f"{name!r}: expected four True/False flags (pad M, N, K, persistent)")
    values = [_BOOL[t] for t in tokens]
    return tuple(values[:3]), values[3]


def parse(name: str) -> CkKernel:
    """A CK kernel name in any of the forms above -> CkKernel."""
    raw = name.strip()
    stem = re.sub(r"\.(hpp|so|json)$", "", raw.split("/")[-1])
    stem = re.sub(r"^lib", "", stem)
    stem = re.sub(r"^gemm_streamk_single_", "", stem)
    form, variant, strategy = "bridge", "regular", None
    if stem.startswith("benchmark_gemm_streamk_"):
        form, variant, stem = "executable", "stream_k", stem[len("benchmark_gemm_streamk_"):]
    elif not stem.startswith("gemm_"):
        form, variant = "header", "stream_k"
    else:
        stem = stem[len("gemm_"):]
        for suffix, (v, s) in (("_streamk_linear", ("stream_k", "linear")), ("_streamk_tree", ("stream_k", "tree")),
                               ("_streamk", ("stream_k", "atomic")), ("_grouped", ("grouped", None))):
            if stem.endswith(suffix):
                stem, variant, strategy = stem[: -len(suffix)], v, s
                break
    parts = stem.split("_")
    head, (tile, wave, warp_tile) = _split_tail(parts, raw)
    if len(head) < 5:
        raise NameError_(f"{raw!r}: too few fields before the tile triples")
    dt, ly, pipe, epi, sched, *rest = head
    if dt not in DTYPES:
        raise NameError_(f"{raw!r}: unknown dtype {dt!r}; known: {', '.join(DTYPES)}")
    if not re.fullmatch(r"[rc]{3}", ly):
        raise NameError_(f"{raw!r}: layout {ly!r} is not three r/c chars")
    if variant == "stream_k" and strategy is None:
        # the strategy sits before the booleans (executable, header) or after them (list file, old builds)
        if rest and rest[0] in STRATEGIES:
            strategy, rest = rest[0], rest[1:]
        elif rest and rest[-1] in STRATEGIES:
            strategy, rest = rest[-1], rest[:-1]
            form = "list" if form == "bridge" else form
        else:
            raise NameError_(f"{raw!r}: no reduction strategy (atomic, linear, reduction, tree)")
        strategy = STRATEGIES[strategy]
    elif form == "bridge" and variant == "regular" and len(rest) == 5 and rest[-1] in STRATEGIES:
        variant, strategy, rest, form = "stream_k", STRATEGIES[rest[-1]], rest[:-1], "list"
    pads, persistent = _bools(rest, raw)
    return CkKernel(dt, ly, pipe, epi, sched, pads, persistent, tile, wave, warp_tile,
                    variant, strategy, form)


def target_fields(target: str, isa: str | None, tiles_m, tiles_n) -> dict:
    """The target block a CK kernel of these block tiles needs on `target`,
    or ConfigError. On the cpu: the ISA (`isa`, None for the active one) and
    a micro-tile of it that divides every tile, because CK tiles are powers
    of two, which the ISA's default micro-tile need not divide. The ISA is
    in the block so the kernel is the one meant wherever it is built."""
    if target != "cpu":
        if isa:
            raise ConfigError(f"an ISA ({isa}) is a cpu target option, not a {target} one")
        return {}
    chosen = cpu_isa.get(isa) if isa else cpu_isa.active()
    micro = cpu.micro_tile_for(chosen.isa, tiles_m, tiles_n)
    if micro is None:
        raise ConfigError(f"no micro-tile of ISA {chosen.isa.name} divides tile_m {list(tiles_m)} and "
                          f"tile_n {list(tiles_n)} (micro_n must be a multiple of {chosen.isa.lanes()} lanes)")
    return {"isa": chosen.name, "micro_m": micro[0], "micro_n": micro[1]}


def to_config(k: CkKernel, target: str = "cpu", isa: str | None = None):
    """The gemm-dispatcher KernelConfig closest to a CK kernel on `target`
    (cpu: for ISA `isa`, default the active one), or ConfigError if there is
    no such kernel. It is not checked: whether the target, or this machine,
    can build it is `config.problems()`, a separate question, so a name maps
    the same on every machine."""
    from ..config import KernelConfig
    fields = dict(variant=k.variant, target=target, dtype=DTYPES[k.dtype], layout=k.layout,
                  tile_m=k.tile[0], tile_n=k.tile[1], tile_k=k.tile[2])
    if k.variant == "stream_k":
        fields["reduction"] = k.reduction
    if target == "cuda" and k.tile[0] == 64:
        fields["schedule"] = "pingpong"  # the cooperative schedule needs tile_m >= 128
    return KernelConfig.create(**fields, **target_fields(target, isa, [k.tile[0]], [k.tile[1]]))
