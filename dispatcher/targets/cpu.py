"""The `cpu` target: generated C++ with OpenMP, built by the system compiler.

Kernels instantiate the tile library in `dispatcher/native/cpu/`. The
target block of a CPU `KernelConfig` is the register micro-tile and the
thread count; the build is `-O3 -march=native -fopenmp`, so the cache key
carries this machine's instruction set.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess

import attrs

from .. import dtypes
from ..errors import ToolchainError
from ..records import Option
from . import register
from .toolchain import NATIVE_DIR, CompilerMixin, headers_hash

# C++ codec of each dtype token in dcpu:: (fp8 codecs take a decode table).
_CODECS = {
    "fp32": "dcpu::F32", "fp16": "dcpu::F16", "bf16": "dcpu::BF16",
    "int8": "dcpu::I8", "int32": "dcpu::I32",
}


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> frozenset:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def vector_bytes() -> int:
    """The widest SIMD register the micro-kernel should use here."""
    flags = _cpu_flags()
    if "avx512f" in flags:
        return 64
    if "avx2" in flags or "avx" in flags:
        return 32
    return 16


@attrs.frozen
class Toolchain(CompilerMixin):
    """A C++ compiler and the flags every CPU kernel is built with."""

    compiler: str
    flags: tuple
    label = "C++"

    @classmethod
    @functools.lru_cache(maxsize=None)
    def find(cls) -> "Toolchain":
        candidate = os.environ.get("CXX") or "g++"
        path = shutil.which(candidate) or shutil.which("c++")
        if not path:
            raise ToolchainError(
                f"no C++ compiler found (looked for {candidate!r} and 'c++' on PATH): "
                "install g++ with OpenMP (e.g. `apt-get install g++`) or set CXX")
        flags = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-fPIC", "-shared",
                 "-fvisibility=hidden", f"-I{NATIVE_DIR}")
        return cls(path, flags)

    @functools.cached_property
    def identity(self) -> str:
        """Compiler version and this CPU's ISA: both change the binary."""
        version = subprocess.run([self.compiler, "--version"], capture_output=True,
                                 text=True).stdout.splitlines()[:1]
        isa = hashlib.sha256(" ".join(sorted(_cpu_flags())).encode()).hexdigest()[:16]
        return f"{' '.join(version)} | {platform.machine()} isa:{isa} | headers:{headers_hash('cpu')}"


@attrs.frozen
class CpuTarget:
    name: str = "cpu"
    options: tuple = (
        Option("micro_m", 12, "rows of the register micro-tile", low=1, high=16),
        Option("micro_n", 32, "columns of the register micro-tile", choices=(16, 32, 48, 64)),
        Option("threads", 0, "OpenMP threads (0: all)", low=0, high=1024),
    )

    def toolchain(self) -> Toolchain:
        return Toolchain.find()

    def name_tokens(self, opts: dict) -> str:
        return f"mt{opts['micro_m']}x{opts['micro_n']}_t{opts['threads']}"

    def check(self, config) -> str | None:
        """None if the tile library can instantiate `config`, else why not."""
        o = config.target_params
        vec = vector_bytes() // 4
        if o["micro_n"] % vec:
            return f"micro_n {o['micro_n']} is not a multiple of the {vec}-lane vector"
        if o["micro_m"] * o["micro_n"] // vec > 28:
            return f"micro-tile {o['micro_m']}x{o['micro_n']} needs more than 28 vector registers"
        if config.tile_m % o["micro_m"] or config.tile_n % o["micro_n"]:
            return (f"tile {config.tile_m}x{config.tile_n} is not a multiple of the "
                    f"micro-tile {o['micro_m']}x{o['micro_n']}")
        if config.layout[2] != "r":
            return "CPU kernels write row-major C (column-major C is run transposed)"
        return None

    def prelude(self, config) -> str:
        """C++ that defines `KernelTraits` and `KERNEL_NAME` for `config`;
        every variant template starts with it."""
        o = config.target_params
        lines = ['#include "dispatcher_abi.h"', '#include "cpu/tile_gemm.hpp"', ""]
        codecs, tables = {}, set()
        for role, token in (("A", config.dtype_a), ("B", config.dtype_b), ("C", config.dtype_c)):
            if dtypes.get(token).is_float8:
                table = f"kDecode_{token}"
                if table not in tables:
                    tables.add(table)
                    values = ", ".join(repr(v) if v == v else "__builtin_nanf(\"\")"
                                       for v in dtypes.float8_decode_table(token))
                    values = values.replace("inf", "__builtin_inff()")
                    lines.append(f"static const float {table}[256] = {{{values}}};")
                codecs[role] = f"dcpu::Fp8<{table}>"
            else:
                codecs[role] = _CODECS[token]
        lines += [
            f'#define KERNEL_NAME "{config.name}"',
            "using KernelTraits = dcpu::Traits<",
            f"    {codecs['A']}, {codecs['B']}, {codecs['C']},",
            f"    {config.tile_m}, {config.tile_n}, {config.tile_k}, {o['micro_m']}, {o['micro_n']},",
            f"    {str(config.layout[0] == 'r').lower()}, {str(config.layout[1] == 'r').lower()},",
            f"    {vector_bytes()}, {o['threads']}>;",
            "",
        ]
        return "\n".join(lines)

    def arch_id(self) -> str:
        """What a tuning result is valid for: this machine's ISA."""
        isa = hashlib.sha256(" ".join(sorted(_cpu_flags())).encode()).hexdigest()[:12]
        return f"{platform.machine()}-{vector_bytes() * 8}bit-{isa}"

    def parallelism(self, config) -> int:
        """Workers a kernel of `config` runs on here."""
        return config.target_params["threads"] or cpu_count()

    def available(self) -> bool:
        return True

    def owns(self, array) -> bool:
        return True

    @property
    def memory(self):
        from ..memory import HOST
        return HOST

    def session(self, *arrays):
        from ..memory import HostSession
        return HostSession(*arrays)

    def parallelism_hint(self) -> str:
        return f"{cpu_count()} threads, {vector_bytes() * 8}-bit vectors"


def cpu_count() -> int:
    """CPUs this process may run on (OpenMP's default thread count)."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"])
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


CPU = register(CpuTarget())
