"""The instruction sets the CPU target builds for, and which one this machine runs.

A CPU kernel is compiled for one named ISA, never for "this machine"
(`-march=native`): its flags are a fixed x86-64 micro-architecture level or
the aarch64 base, so a library built here runs on every machine that has the
ISA, and its cache key and kernel name say which ISA it is. Each ISA also
fixes what the micro-kernel may use: the vector width, the number of vector
registers, and the default register micro-tile that fits them.

`DISPATCHER_CPU_ISA=avx512|avx2|generic|neon` chooses one explicitly; by
default it is the best one this machine can run.
"""

from __future__ import annotations

import functools
import os
import platform

import attrs

from ..errors import ConfigError

ENV = "DISPATCHER_CPU_ISA"


@attrs.frozen
class Isa:
    """One instruction set: what the micro-kernel may use and how to compile for it.

    machine: `platform.machine()` of the machines that run it.
    vector_bytes: the SIMD register width the micro-kernel's vectors use.
    registers: vector registers the compiler can allocate (accumulators,
        B vectors and the broadcast A value must fit, or the micro-kernel
        spills to memory on every k step).
    march: the compiler flags that select the ISA.
    needs: /proc/cpuinfo flags a machine must report to run it.
    micro_tile: (micro_m, micro_n), the default register micro-tile.
    """

    name: str
    machine: str
    vector_bytes: int
    registers: int
    march: tuple
    needs: frozenset
    micro_tile: tuple
    description: str

    def lanes(self, element_bytes: int = 4) -> int:
        return self.vector_bytes // element_bytes

    def registers_needed(self, micro_m: int, micro_n: int) -> int:
        """Vector registers of one k step: micro_m x (micro_n / lanes)
        accumulators, one B vector per accumulator column, one broadcast A."""
        columns = micro_n // self.lanes()
        return micro_m * columns + columns + 1

    def micro_tile_problem(self, micro_m: int, micro_n: int) -> str | None:
        """None if the micro-tile fits this ISA's registers, else why not."""
        if micro_n % self.lanes():
            return (f"micro_n {micro_n} is not a multiple of the {self.lanes()}-lane "
                    f"{self.vector_bytes * 8}-bit vector of ISA {self.name}")
        needed = self.registers_needed(micro_m, micro_n)
        if needed > self.registers:
            return (f"micro-tile {micro_m}x{micro_n} needs {needed} vector registers; ISA "
                    f"{self.name} has {self.registers} (its default is "
                    f"{self.micro_tile[0]}x{self.micro_tile[1]})")
        return None


# Best first: the default is the first one the machine can run.
ISAS = {
    isa.name: isa for isa in (
        Isa("avx512", "x86_64", 64, 32, ("-march=x86-64-v4", "-mtune=generic"),
            frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma",
                       "bmi2", "f16c", "movbe"}),
            (12, 32), "x86-64-v4: AVX-512, 512-bit vectors, 32 registers"),
        Isa("avx2", "x86_64", 32, 16, ("-march=x86-64-v3", "-mtune=generic"),
            frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}),
            (6, 16), "x86-64-v3: AVX2 and FMA, 256-bit vectors, 16 registers"),
        Isa("generic", "x86_64", 16, 16, ("-march=x86-64", "-mtune=generic"), frozenset(),
            (6, 8), "x86-64 baseline: SSE2, 128-bit vectors, 16 registers"),
        Isa("neon", "aarch64", 16, 32, ("-march=armv8-a",), frozenset(),
            (12, 8), "aarch64 (Armv8-A): NEON, 128-bit vectors, 32 registers"),
    )
}


def host_machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> frozenset:
    """The feature flags /proc/cpuinfo reports (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def why_not_runnable(isa: Isa) -> str | None:
    """None if this machine runs `isa`'s code, else why not."""
    if isa.machine != host_machine():
        return f"ISA {isa.name} is for {isa.machine} machines; this one is {host_machine()}"
    missing = sorted(isa.needs - _cpu_flags())
    if missing:
        return f"this CPU lacks {', '.join(missing)}, which ISA {isa.name} needs"
    return None


def supported() -> list:
    """The ISAs this machine runs, best first."""
    return [isa for isa in ISAS.values() if why_not_runnable(isa) is None]


def get(name: str) -> Isa:
    try:
        return ISAS[name]
    except KeyError:
        raise ConfigError(f"unknown CPU ISA {name!r}; choose one of {', '.join(ISAS)}") from None


def active() -> Isa:
    """The ISA kernels are built for by default: $DISPATCHER_CPU_ISA, else
    the best one this machine runs."""
    return _active(os.environ.get(ENV, "").strip())


@functools.lru_cache(maxsize=None)
def _active(requested: str) -> Isa:
    runnable = supported()
    if not requested:
        if not runnable:
            raise ConfigError(f"the cpu target has no ISA for {host_machine()} machines; "
                              f"it builds for {', '.join(sorted({i.machine for i in ISAS.values()}))}")
        return runnable[0]
    if requested not in ISAS:
        raise ConfigError(f"{ENV}={requested!r} is not a CPU ISA; choose one of {', '.join(ISAS)} "
                          "or unset it to use the best one this machine runs")
    isa = ISAS[requested]
    reason = why_not_runnable(isa)
    if reason:
        raise ConfigError(f"{ENV}={requested}: {reason}; this machine runs "
                          f"{', '.join(i.name for i in runnable) or 'none of them'}")
    return isa
