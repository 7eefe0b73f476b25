"""The instruction sets the CPU target builds for, and which one this machine runs.

A CPU kernel is compiled for one named ISA, never for "this machine"
(`-march=native`): its flags are a fixed x86-64 micro-architecture level or
the aarch64 base, so a library built here runs on every machine that has the
ISA, and its cache key and kernel name say which ISA it is. Each ISA also
fixes what the micro-kernel may use: the vector width, the number of vector
registers, and the default register micro-tile that fits them.

Beyond its base level an ISA has *extensions*, the dot-product and matrix
instructions some machines add (AVX512-BF16, VNNI, AMX; NEON's dot product,
BF16 and I8MM). An ISA *spec* names a base and the extensions a kernel may
use, `avx512+bf16+vnni`. Each micro-kernel of the tile library
(`native/cpu/dot_ops.hpp`) computes some input dtypes and needs some
extensions; a kernel of one dtype uses the best micro-kernel its spec allows
whose micro-tile fits its block tile (AMX's 32x32 or the next one:
`Spec.kernel_specs`, `cpu.isa_value`) and is built and named for exactly
the extensions that micro-kernel needs (an fp32 kernel is `avx512` on every
AVX-512 machine; a bf16 one `avx512+bf16` where the active spec has bf16).

`DISPATCHER_CPU_ISA` chooses the spec (default: the best base this machine
runs with every extension of it the machine has):

    avx2                 the base alone (x86-64-v3)
    avx512+bf16+vnni     the base and exactly these extensions
    avx512-bf16          the base and every extension of it this machine has but bf16

An ISA or extension the machine cannot run is an error that names it.
"""

from __future__ import annotations

import functools
import os
import platform
import re

import attrs

from ..errors import ConfigError

ENV = "DISPATCHER_CPU_ISA"

# The input dtypes whose values bf16 holds exactly: bf16 itself and every
# 8-bit float (at most 3 mantissa bits, exponents within bf16's range), so a
# bf16 dot product computes them with today's float32 accuracy.
_BF16_EXACT = frozenset({"bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz"})


@attrs.frozen
class Extension:
    """Instructions beyond an ISA's base level.

    name: its token in a spec (`avx512+bf16`).
    title: what vendors call it.
    needs: /proc/cpuinfo flags a machine must report to run it.
    flags: compiler flags that enable it; one starting with "+" extends the
        base's -march value (aarch64's `-march=armv8.2-a+dotprod`).
    level: the architecture level it needs, which replaces the base's in
        -march (aarch64's extensions are features of Armv8.2-A and later, and
        GCC's intrinsics for them refuse an armv8-a caller).
    """

    name: str
    title: str
    needs: frozenset
    flags: tuple
    description: str
    level: str = ""


@attrs.frozen
class MicroKernel:
    """One micro-kernel of the tile library: the C++ policy type of
    `native/cpu/dot_ops.hpp`, the input dtypes it computes, and the
    extensions its instructions need. `pairs`: a matrix instruction whose
    accumulators are 2x2 blocks (of a pair of rows and a pair of columns);
    `tiles`: tile instructions (AMX: tile registers, not vector registers,
    so exactly its micro-tile); either has its own default micro-tile.
    `rate`: its peak multiply-adds per cycle and core over the base ISA's
    float32 FMAs (instruction tables: vdpbf16ps 2, vpdpbusd 4, tdpbf16ps
    16, tdpbssd 32), so selection ranks a config of a spec's best
    micro-kernel before one that falls back to a slower one."""

    cpp: str
    dtypes: frozenset
    needs: tuple = ()
    pairs: bool = False
    tiles: bool = False
    micro_tile: tuple | None = None
    rate: float = 1.0


# Every ISA's micro-kernel for whatever its extensions do not cover: outer
# products in the compute type (float32 FMAs, or int32 multiply-adds).
FMA = MicroKernel("dcpu::Fma", frozenset())


@attrs.frozen
class Isa:
    """One base instruction set: what the micro-kernel may use and how to compile for it.

    machine: `platform.machine()` of the machines that run it.
    vector_bytes: the SIMD register width the micro-kernel's vectors use.
    registers: vector registers the compiler can allocate (accumulators,
        B vectors and the broadcast A value must fit, or the micro-kernel
        spills to memory on every k step).
    march: the compiler flags that select the ISA.
    needs: /proc/cpuinfo flags a machine must report to run it.
    micro_tile: (micro_m, micro_n), the default register micro-tile.
    extensions: what a spec may add, in spec order.
    micro_kernels: best first; a dtype none of them computes uses `FMA`.
    """

    name: str
    machine: str
    vector_bytes: int
    registers: int
    march: tuple
    needs: frozenset
    micro_tile: tuple
    description: str
    extensions: tuple = ()
    micro_kernels: tuple = ()

    def lanes(self, element_bytes: int = 4) -> int:
        return self.vector_bytes // element_bytes

    def registers_needed(self, micro_m: int, micro_n: int, pairs: bool = False) -> int:
        """Vector registers of one k step: micro_m x (micro_n / lanes)
        accumulators, one B vector per accumulator column, one broadcast A;
        for a matrix instruction (`pairs`), a 2x2 block per register and one
        register per row pair of A and column pair of B."""
        if pairs:
            return (micro_m // 2) * (micro_n // 2) + micro_m // 2 + micro_n // 2
        columns = micro_n // self.lanes()
        return micro_m * columns + columns + 1

    def micro_tile_problem(self, micro_m: int, micro_n: int, pairs: bool = False) -> str | None:
        """None if the micro-tile fits this ISA's registers, else why not."""
        if micro_n % self.lanes():
            return (f"micro_n {micro_n} is not a multiple of the {self.lanes()}-lane "
                    f"{self.vector_bytes * 8}-bit vector of ISA {self.name}")
        if pairs and micro_m % 2:
            return f"micro_m {micro_m} is odd; a matrix instruction computes pairs of rows"
        needed = self.registers_needed(micro_m, micro_n, pairs)
        if needed > self.registers:
            return (f"micro-tile {micro_m}x{micro_n} needs {needed} vector registers; ISA "
                    f"{self.name} has {self.registers} (its default is "
                    f"{self.micro_tile[0]}x{self.micro_tile[1]})")
        return None

    def extension(self, name: str) -> Extension:
        for ext in self.extensions:
            if ext.name == name:
                return ext
        raise ConfigError(f"ISA {self.name} has no extension {name!r}; its extensions: "
                          f"{', '.join(e.name for e in self.extensions) or 'none'}")


# x86: pmaddwd on int8 sign-extended to int16 pairs (exact: no saturation).
_MADD_I16 = MicroKernel("dcpu::MaddI16", frozenset({"int8"}), rate=2.0)
# x86 VNNI: vpdpbusd, unsigned x signed bytes (B offset by 128, corrected by A's row sums).
_VNNI = MicroKernel("dcpu::DotU8S8", frozenset({"int8"}), ("vnni",), rate=4.0)

# Best first: the default is the first one the machine can run.
ISAS = {
    isa.name: isa for isa in (
        Isa("avx512", "x86_64", 64, 32, ("-march=x86-64-v4", "-mtune=generic"),
            frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma",
                       "bmi2", "f16c", "movbe"}),
            (12, 32), "x86-64-v4: AVX-512, 512-bit vectors, 32 registers",
            extensions=(
                Extension("bf16", "AVX512-BF16", frozenset({"avx512_bf16"}), ("-mavx512bf16",),
                          "vdpbf16ps: two bf16 products per float32 lane (bf16 and fp8 inputs)"),
                Extension("vnni", "AVX512-VNNI", frozenset({"avx512_vnni"}), ("-mavx512vnni",),
                          "vpdpbusd: four int8 products per int32 lane"),
                Extension("fp16", "AVX512-FP16", frozenset({"avx512_fp16"}), ("-mavx512fp16",),
                          "fp16 arithmetic in fp16: no kernel uses it (it has no dot product into "
                          "float32, and fp16 accumulation would break the float32 accumulation "
                          "every fp16 GEMM documents; fp16 converts with F16C)"),
                Extension("amxbf16", "AMX-BF16", frozenset({"amx_tile", "amx_bf16"}),
                          ("-mamx-tile", "-mamx-bf16"),
                          "tdpbf16ps: 16x16 float32 tiles += 16x32 by 32x16 bf16 (bf16 and fp8 inputs)"),
                Extension("amxint8", "AMX-INT8", frozenset({"amx_tile", "amx_int8"}),
                          ("-mamx-tile", "-mamx-int8"), "tdpbssd: 16x16 int32 tiles += 16x64 by 64x16 int8"),
            ),
            micro_kernels=(
                MicroKernel("dcpu::TileBf16", _BF16_EXACT, ("amxbf16",), tiles=True, micro_tile=(32, 32),
                            rate=16.0),
                MicroKernel("dcpu::TileS8", frozenset({"int8"}), ("amxint8",), tiles=True, micro_tile=(32, 32),
                            rate=32.0),
                MicroKernel("dcpu::DotBf16", _BF16_EXACT, ("bf16",), rate=2.0),
                _VNNI,
                _MADD_I16,
            )),
        Isa("avx2", "x86_64", 32, 16, ("-march=x86-64-v3", "-mtune=generic"),
            frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}),
            (6, 16), "x86-64-v3: AVX2 and FMA, 256-bit vectors, 16 registers",
            extensions=(
                Extension("vnni", "AVX-VNNI", frozenset({"avx_vnni"}), ("-mavxvnni",),
                          "VEX vpdpbusd: four int8 products per int32 lane"),
            ),
            micro_kernels=(_VNNI, _MADD_I16)),
        Isa("generic", "x86_64", 16, 16, ("-march=x86-64", "-mtune=generic"), frozenset(),
            (6, 8), "x86-64 baseline: SSE2, 128-bit vectors, 16 registers",
            micro_kernels=(_MADD_I16,)),
        Isa("neon", "aarch64", 16, 32, ("-march=armv8-a",), frozenset(),
            (12, 8), "aarch64 (Armv8-A): NEON, 128-bit vectors, 32 registers",
            extensions=(
                Extension("dotprod", "DotProd", frozenset({"asimddp"}), ("+dotprod",),
                          "sdot: four int8 products per int32 lane", "armv8.2-a"),
                Extension("bf16", "BF16", frozenset({"bf16"}), ("+bf16",),
                          "bfdot: two bf16 products per float32 lane (bf16 and fp8 inputs)",
                          "armv8.2-a"),
                Extension("i8mm", "I8MM", frozenset({"i8mm"}), ("+i8mm",),
                          "smmla: a 2x8 by 8x2 int8 matrix product per instruction", "armv8.2-a"),
            ),
            micro_kernels=(
                MicroKernel("dcpu::DotBf16", _BF16_EXACT, ("bf16",), rate=2.0),
                MicroKernel("dcpu::MmlaS8", frozenset({"int8"}), ("i8mm",), pairs=True, micro_tile=(8, 8),
                            rate=8.0),
                MicroKernel("dcpu::DotS8", frozenset({"int8"}), ("dotprod",), rate=4.0),
            )),
    )
}


@attrs.frozen
class Spec:
    """A base ISA and the extensions a kernel may use (in the base's order)."""

    isa: Isa
    extensions: tuple = ()

    @property
    def name(self) -> str:
        return "".join([self.isa.name, *(f"+{e.name}" for e in self.extensions)])

    @property
    def needs(self) -> frozenset:
        return self.isa.needs.union(*(e.needs for e in self.extensions))

    @property
    def march(self) -> tuple:
        """Compiler flags: the base's (at the extensions' level), "+x" ones
        appended to its -march value, then the others."""
        suffix = "".join(f for e in self.extensions for f in e.flags if f.startswith("+"))
        level = max((e.level for e in self.extensions), default="")
        base = tuple(("-march=" + (level or f.split("=", 1)[1]) + suffix) if f.startswith("-march=") else f
                     for f in self.isa.march)
        return base + tuple(dict.fromkeys(f for e in self.extensions for f in e.flags
                                          if not f.startswith("+")))

    def micro_kernel(self, dtype: str) -> MicroKernel:
        """The best micro-kernel of this spec for `dtype` inputs."""
        have = {e.name for e in self.extensions}
        return next((k for k in self.isa.micro_kernels if dtype in k.dtypes and set(k.needs) <= have),
                    FMA)

    def for_dtype(self, dtype: str) -> "Spec":
        """The spec a kernel of `dtype` inputs is built for: the base and the
        extensions its micro-kernel needs (none for a dtype they do not help)."""
        return self.kernel_specs(dtype)[0]

    def kernel_specs(self, dtype: str) -> list:
        """Every spec a kernel of `dtype` inputs may be built for under this
        one, best first: for each micro-kernel of it that computes `dtype`,
        the base and the extensions that micro-kernel needs, then the base
        alone (`FMA`). A config takes the first whose micro-tile fits its
        block tile (`cpu.isa_value`: AMX's 32x32 divides no 24-row tile, so
        such a tile falls back to the vector dot product)."""
        have = {e.name for e in self.extensions}
        specs = [Spec(self.isa, tuple(e for e in self.extensions if e.name in k.needs))
                 for k in self.isa.micro_kernels if dtype in k.dtypes and set(k.needs) <= have]
        return list(dict.fromkeys(specs + [Spec(self.isa)]))

    @property
    def own_kernel(self) -> MicroKernel | None:
        """The micro-kernel a kernel built for this spec (as `for_dtype`
        reduces it) runs where its extensions name one (None: the base's)."""
        names = tuple(e.name for e in self.extensions)
        return next((k for k in self.isa.micro_kernels if names and k.needs == names), None)

    @property
    def micro_tile(self) -> tuple:
        """The default micro-tile of a kernel built for this spec."""
        kernel = self.own_kernel
        return kernel.micro_tile if kernel and kernel.micro_tile else self.isa.micro_tile

    def micro_tile_problem(self, micro_m: int, micro_n: int) -> str | None:
        """None if a kernel of this spec can have this micro-tile, else why not."""
        kernel = self.own_kernel
        if kernel and kernel.tiles:
            if (micro_m, micro_n) != kernel.micro_tile:
                return (f"micro-tile {micro_m}x{micro_n}: the tile micro-kernel of {self.name} computes "
                        f"{kernel.micro_tile[0]}x{kernel.micro_tile[1]} (2x2 tiles of 16x16)")
            return None
        return self.isa.micro_tile_problem(micro_m, micro_n, bool(kernel and kernel.pairs))


def host_machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """The feature flags /proc/cpuinfo reports (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def why_not_runnable(spec) -> str | None:
    """None if this machine runs `spec`'s code (a Spec or an Isa), else why not."""
    spec = spec if isinstance(spec, Spec) else Spec(spec)
    isa = spec.isa
    if isa.machine != host_machine():
        return f"ISA {isa.name} is for {isa.machine} machines; this one is {host_machine()}"
    flags = cpu_flags()
    missing = sorted(isa.needs - flags)
    if missing:
        return f"this CPU lacks {', '.join(missing)}, which ISA {isa.name} needs"
    for ext in spec.extensions:
        missing = sorted(ext.needs - flags)
        if missing:
            return (f"this CPU lacks {', '.join(missing)} ({ext.title}), which extension "
                    f"{ext.name} of ISA {isa.name} needs")
    return None


def supported() -> list:
    """The base ISAs this machine runs, best first."""
    return [isa for isa in ISAS.values() if why_not_runnable(isa) is None]


def best(isa: Isa) -> Spec:
    """`isa` with every extension of it this machine runs."""
    return Spec(isa, tuple(e for e in isa.extensions if why_not_runnable(Spec(isa, (e,))) is None))


def runnable_specs() -> list:
    """What this machine runs, as text: each base with the extensions it has."""
    return [best(isa).name for isa in supported()]


def parity_settings() -> list:
    """The DISPATCHER_CPU_ISA values whose kernels differ from the default's
    on this machine: each extension (that a micro-kernel uses) of the best
    base turned off, then every other base with its extensions and with each
    turned off. CI reruns the parity tests under each."""
    settings = []
    for i, isa in enumerate(supported()):
        used = {name for kernel in isa.micro_kernels for name in kernel.needs}
        if i:
            settings.append(best(isa).name)
        settings += [f"{isa.name}-{e.name}" for e in best(isa).extensions if e.name in used]
    return settings


_SPEC = re.compile(r"(\w+)((?:[+-]\w+)*)")


@functools.lru_cache(maxsize=None)
def get(text: str) -> Spec:
    """The Spec `text` names: `base`, `base+ext+...` (exactly these) or
    `base-ext-...` (every extension of base this machine runs but these)."""
    match = _SPEC.fullmatch(text.strip())
    if not match:
        raise ConfigError(f"CPU ISA {text!r} is not BASE, BASE+EXT+... or BASE-EXT-... "
                          "(e.g. avx512, avx512+bf16+vnni, avx512-bf16)")
    base, rest = match.groups()
    if base not in ISAS:
        raise ConfigError(f"unknown CPU ISA {base!r}; choose one of {', '.join(ISAS)}, "
                          "optionally with extensions (avx512+bf16+vnni, avx512-bf16)")
    isa = ISAS[base]
    terms = re.findall(r"([+-])(\w+)", rest)
    signs = {sign for sign, _ in terms}
    if len(signs) > 1:
        raise ConfigError(f"CPU ISA {text!r} mixes + and -: write the extensions wanted "
                          f"({base}+EXT+...) or the ones not wanted of those this machine has "
                          f"({base}-EXT-...)")
    named = {isa.extension(name).name for _, name in terms}  # each one known to the base
    if signs == {"-"}:
        if why_not_runnable(isa):
            raise ConfigError(f"{text!r} removes extensions from those this machine has, but "
                              f"{why_not_runnable(isa)}")
        chosen = [e for e in best(isa).extensions if e.name not in named]
    else:
        chosen = [e for e in isa.extensions if e.name in named]
    return Spec(isa, tuple(chosen))


def active() -> Spec:
    """The spec kernels are built for by default: $DISPATCHER_CPU_ISA, else
    the best base this machine runs with all its extensions."""
    return _active(os.environ.get(ENV, "").strip())


@functools.lru_cache(maxsize=None)
def _active(requested: str) -> Spec:
    runnable = supported()
    if not requested:
        if not runnable:
            raise ConfigError(f"the cpu target has no ISA for {host_machine()} machines; "
                              f"it builds for {', '.join(sorted({i.machine for i in ISAS.values()}))}")
        return best(runnable[0])
    try:
        spec = get(requested)
    except ConfigError as e:
        raise ConfigError(f"{ENV}={requested!r} is not a CPU ISA: {e}; or unset it to use the "
                          "best one this machine runs") from None
    reason = why_not_runnable(spec)
    if reason:
        raise ConfigError(f"{ENV}={requested}: {reason}; this machine runs "
                          f"{', '.join(runnable_specs()) or 'none of them'} (or fewer of their extensions)")
    return spec
