"""The `cpu` target: generated C++ with OpenMP, built by the system compiler.

Kernels instantiate the tile library in `dispatcher/native/cpu/`. The
target block of a CPU `KernelConfig` is the instruction set (`isa`, a
`cpu_isa` spec: the base and the extensions the kernel's micro-kernel uses),
the register micro-tile and the thread count. A kernel is compiled with its
spec's fixed flags (`-march=x86-64-v4 -mavx512bf16`, never `-march=native`),
and the spec is in its name, so a cached library or a tuned winner is only
ever used where that ISA and those extensions run.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import attrs

from .. import dtypes
from ..errors import BuildError, ConfigError, ToolchainError
from ..records import MAX_WORKERS, Option
from . import cpu_isa, register
from .precompiled_header import discard, precompiled_header
from .toolchain import NATIVE_DIR, CompilerMixin, headers_hash

# C++ codec of each dtype token in dcpu:: (fp8 codecs take a decode table).
_CODECS = {
    "fp32": "dcpu::F32", "fp16": "dcpu::F16", "bf16": "dcpu::BF16",
    "int8": "dcpu::I8", "int32": "dcpu::I32",
}


# Cross compilers by machine, for an ISA of another machine (the NEON kernels
# are cross-built on x86-64 and run under qemu in the test suite).
CROSS_COMPILERS = {"aarch64": "aarch64-linux-gnu-g++", "x86_64": "x86_64-linux-gnu-g++"}


@attrs.frozen
class Toolchain(CompilerMixin):
    """A C++ compiler and the flags every CPU kernel of one ISA is built with."""

    compiler: str
    flags: tuple
    isa: str
    label = "C++"

    @classmethod
    @functools.lru_cache(maxsize=None)
    def find(cls, isa_name: str) -> "Toolchain":
        spec = cpu_isa.get(isa_name)
        isa = spec.isa
        if isa.machine == cpu_isa.host_machine():
            candidate = os.environ.get("CXX") or "g++"
            path = shutil.which(candidate) or shutil.which("c++")
            advice = "install g++ with OpenMP (e.g. `apt-get install g++`) or set CXX"
        else:
            candidate = CROSS_COMPILERS.get(isa.machine, f"{isa.machine}-linux-gnu-g++")
            path = shutil.which(candidate)
            advice = f"install the cross compiler (e.g. `apt-get install {candidate}`)"
        if not path:
            raise ToolchainError(f"no C++ compiler for ISA {isa.name} found (looked for "
                                 f"{candidate!r} on PATH): {advice}")
        flags = ("-O3", *spec.march, "-fopenmp", "-std=c++17", "-fPIC", "-shared",
                 "-fvisibility=hidden", f"-I{NATIVE_DIR}")
        return cls(path, flags, spec.name)

    def compile(self, source, output, extra_flags=(), shared_dir=None) -> None:
        """Compile with the toolchain's precompiled header where `shared_dir`
        is given and one can be built there (precompiled_header.py). Should
        the build fail with it and succeed without, the header was at fault
        and is discarded; a kernel that fails both ways fails with the plain
        build's errors."""
        header = precompiled_header(self, shared_dir) if shared_dir is not None else None
        if header is None:
            return super().compile(source, output, extra_flags)
        try:
            super().compile(source, output, (*extra_flags, "-include", str(header)))
        except BuildError:
            super().compile(source, output, extra_flags)
            discard(header)

    @functools.cached_property
    def identity(self) -> str:
        """Compiler version and the ISA spec built for: both change the
        binary (the machine that builds does not)."""
        version = subprocess.run([self.compiler, "--version"], capture_output=True,
                                 text=True).stdout.splitlines()[:1]
        return f"{' '.join(version)} | isa:{self.isa} | headers:{headers_hash('cpu')}"


def _positive(*values) -> tuple | None:
    """`values` as ints if each is a positive integer (or its text), else None."""
    try:
        ints = tuple(int(v) for v in values if not isinstance(v, bool))
    except (TypeError, ValueError):
        return None
    return ints if len(ints) == len(values) and min(ints) > 0 else None


def isa_value(value, context: dict) -> str:
    """The canonical `isa` of a config: the spec `value` names, reduced to
    the extensions of the micro-kernel a kernel of the config's input dtype
    uses (`context`: the core fields and the block's given values).

    That is the spec's best micro-kernel for the dtype whose micro-tile fits
    the config (`Spec.kernel_specs`, best first): the block tile a whole
    multiple of the micro-tile the block gives, or where it gives none, of
    some valid micro-tile of it (`micro_tile_for`). AMX computes 32x32 and
    nothing else, so a 24x64 tile of a spec with AMX-BF16 and AVX512-BF16
    is `avx512+bf16` (vdpbf16ps, its 12x32 micro-tile), of one with AMX-BF16
    alone `avx512` (FMAs): every tile that builds without AMX builds with
    it. Where none fits, the best one (its build problem says why). It
    depends on the spec and the config only, never on this machine."""
    if not isinstance(value, str):
        raise ConfigError(f"an ISA is a string such as 'avx512+bf16', got {value!r}")
    spec = cpu_isa.get(value)
    dtype = context.get("dtype")
    if not dtype:
        return spec.name
    block = context.get("block", {})
    return _fitting_spec(spec.name, dtype, _positive(context.get("tile_m"), context.get("tile_n")),
                         _positive(block.get("micro_m", -1)), _positive(block.get("micro_n", -1)))


@functools.lru_cache(maxsize=4096)
def _fitting_spec(spec: str, dtype: str, tile, micro_m, micro_n) -> str:
    choices = cpu_isa.get(spec).kernel_specs(dtype)
    if tile is None:
        return choices[0].name
    for choice in choices:
        if micro_m is None and micro_n is None:
            if micro_tile_for(choice, [tile[0]], [tile[1]]) is not None:
                return choice.name
            continue
        mm = micro_m[0] if micro_m else choice.micro_tile[0]
        mn = micro_n[0] if micro_n else choice.micro_tile[1]
        if choice.micro_tile_problem(mm, mn) is None and tile[0] % mm == 0 and tile[1] % mn == 0:
            return choice.name
    return choices[0].name


def _spec_of(block: dict) -> cpu_isa.Spec:
    """The ISA spec a target block names (reduced to its dtype's), else the active one."""
    return cpu_isa.get(block["isa"]) if "isa" in block else cpu_isa.active()


# Spins of an idle OpenMP worker before it sleeps (see `prepare_process`).
SPIN_COUNT = 10_000


@attrs.frozen
class CpuTarget:
    """The micro-tile defaults to the config's ISA's, and the ISA to the
    active one (`cpu_isa.active`), so variant plugins name block tiles only."""

    name: str = "cpu"
    pads = False  # its kernels read operands at any alignment
    zeroes_workspace = True  # its stream-K kernels add partials into a zeroed workspace
    workspace_per_call = True  # ...sized by the OpenMP thread count of each call (plans ask each call)
    options: tuple = (
        Option("isa", lambda block: cpu_isa.active().name,
               "instruction set and extensions, e.g. avx512+bf16 (default: $DISPATCHER_CPU_ISA, "
               "else the best this machine runs), reduced to those of the best micro-kernel for "
               "the config's dtype whose micro-tile fits its tile",
               convert=isa_value),
        Option("micro_m", lambda block: _spec_of(block).micro_tile[0],
               "rows of the register micro-tile (default: the ISA's, or its micro-kernel's)", low=1, high=32),
        Option("micro_n", lambda block: _spec_of(block).micro_tile[1],
               "columns of the register micro-tile (default: the ISA's, or its micro-kernel's)", low=4, high=64),
        Option("threads", 0, "OpenMP threads (0: all)", low=0, high=MAX_WORKERS),
    )

    def toolchain(self, config=None) -> Toolchain:
        """The compiler and flags of `config`'s ISA (default: the active ISA)."""
        isa = config.target_params["isa"] if config is not None else cpu_isa.active().name
        return Toolchain.find(isa)

    def name_tokens(self, opts: dict) -> str:
        return f"{opts['isa']}_mt{opts['micro_m']}x{opts['micro_n']}_t{opts['threads']}"

    def check(self, config) -> str | None:
        """None if the tile library can instantiate `config` and this
        machine runs its ISA spec, else why not."""
        return self.build_problem(config) or cpu_isa.why_not_runnable(cpu_isa.get(config.target_params["isa"]))

    def build_problem(self, config) -> str | None:
        """None if `config` can be compiled for its ISA (wherever that runs)."""
        o = config.target_params
        isa = cpu_isa.get(o["isa"])
        micro = isa.micro_tile_problem(o["micro_m"], o["micro_n"])
        if micro:
            return micro
        if config.tile_m % o["micro_m"] or config.tile_n % o["micro_n"]:
            fits = micro_tile_for(isa, [config.tile_m], [config.tile_n])
            return (f"tile {config.tile_m}x{config.tile_n} is not a multiple of the "
                    f"micro-tile {o['micro_m']}x{o['micro_n']}; "
                    + (f"micro_m={fits[0]}, micro_n={fits[1]} divides it on ISA {isa.name}" if fits
                       else f"no micro-tile of ISA {isa.name} divides it"))
        if config.layout[2] != "r":
            return "CPU kernels write row-major C (column-major C is run transposed)"
        return None

    def fit_sweep(self, configs: list, axes) -> list:
        """A sweep's configs, each with a micro-tile of its ISA that divides
        its block tile (`micro_tile_for`: the ISA's default where it does),
        unless the sweep's `axes` name the micro-tile. The defaults (12x32
        on avx512, 6x16 on avx2) divide no tile of 32 or 64 rows; a config
        no micro-tile fits keeps its default and is filtered, with a reason
        that says so."""
        if {"micro_m", "micro_n"} & set(axes):
            return configs
        fitted = []
        for c in configs:
            o = c.target_params
            micro = micro_tile_for(cpu_isa.get(o["isa"]), [c.tile_m], [c.tile_n])
            same = micro is None or micro == (o["micro_m"], o["micro_n"])
            fitted.append(c if same else c.replace(micro_m=micro[0], micro_n=micro[1]))
        return fitted

    def prelude(self, config) -> str:
        """C++ that defines `KernelTraits` and `KERNEL_NAME` for `config`;
        every variant template starts with it."""
        o = config.target_params
        spec = cpu_isa.get(o["isa"])
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
            f"    {spec.isa.vector_bytes}, {o['threads']}, {spec.micro_kernel(config.dtype_a).cpp}>;",
            "",
        ]
        return "\n".join(lines)

    def arch_id(self) -> str:
        """What a tuning result is valid for: the active ISA spec."""
        return f"cpu-{cpu_isa.active().name}"

    def compute_rate(self, config) -> float:
        """Peak multiply-adds per cycle of `config`'s micro-kernel over the
        FMAs of its base ISA (`cpu_isa.MicroKernel.rate`): the occupancy
        model divides a config's cost by it, so a tile the spec's best
        micro-kernel (AMX) computes ranks before one that falls back."""
        return cpu_isa.get(config.target_params["isa"]).micro_kernel(config.dtype_a).rate

    def neighbour_config(self, config):
        """The config to run a problem that only a nearby tuned problem's
        winner `config` decides: that one (nothing in a CPU config is tied
        to the problem it was measured on)."""
        return config

    def computed_tile(self, problem, config) -> tuple:
        """(rows, columns) one block tile computes: a tile larger than the
        problem runs only the micro-tiles that cover it (a 64-row tile of
        an M = 16 problem computes 16 rows with an 8-row micro-tile, 24
        with a 12-row one; a grouped problem's largest group decides)."""
        o = config.target_params
        m, n = _largest_group(problem)
        return (max(1, min(config.tile_m, -(-m // o["micro_m"]) * o["micro_m"])),
                max(1, min(config.tile_n, -(-n // o["micro_n"]) * o["micro_n"])))

    def launched_tiles(self, problem, config) -> int:
        """Block tiles a kernel runs: its problem's (a thread takes them one by one)."""
        return problem.tile_count(config.tile_m, config.tile_n)

    def a_panel_reuse(self, problem, config) -> int:
        """Tiles that share one packed A block where a variant's kernel packs
        A once (`dcpu::SharedPackedA`): a tile row's column tiles, when
        there are at least 3 and all of A packed takes at most 4 MiB."""
        if not hasattr(problem, "m") or getattr(problem, "batch", 1) != 1:
            return 1  # one GEMM's A only
        m, n, k = problem.m, problem.n, problem.k
        tiles_n = -(-n // config.tile_n)
        packed = -(-m // config.tile_m) * config.tile_m * -(-k // config.tile_k) * config.tile_k \
            * dtypes.get(config.dtype_a).itemsize
        return tiles_n if tiles_n >= 3 and packed <= 4 << 20 else 1

    def panel_reuse(self, problem, config, workers: int) -> int:
        """Tiles that share one packed B panel: each thread runs a contiguous
        run of tiles, column by column, and packs a column's B panel once."""
        runs = problem.tile_count(config.tile_m, config.tile_n) // workers
        return max(1, min(runs, problem.tile_count(config.tile_m, 1 << 62)))

    model_name = "none"

    def template_schedule(self, config) -> str | None:
        """None: every cpu schedule is the tile library's."""
        return None

    def takes_schedule(self, schedule: str, problem) -> bool:
        """False: the cpu target has no schedule of its own (`template_schedule`)."""
        return False

    def model_name_of(self, config) -> str:
        """What estimates `config`: nothing of the target's own (`model_estimate`)."""
        return self.model_name

    def measure(self, fn, options, stream: int = 0) -> list:
        """Wall-clock seconds of repeated calls of fn(i) (`timing.measure`)."""
        from ..timing import measure
        return measure(fn, options)

    def model_estimate(self, problem, config, splits: int):
        """None: the CPU target has no performance model of its own; the
        core's occupancy model (with `panel_reuse`) ranks its configs."""
        return None

    def prepare_process(self):
        """Before this process loads its first kernel: OpenMP workers that
        finish a call spin for a short while (about a tenth of a
        millisecond, libgomp's GOMP_SPINCOUNT) and then sleep, instead of
        libgomp's default of up to 300,000 spins: user code alternates our
        calls with numpy's, whose OpenBLAS threads would otherwise share
        the cores with ours spinning (0.5-0.76x of either library's speed
        on 2 cores). libgomp reads it when it is loaded; a user's own
        OMP_WAIT_POLICY or GOMP_SPINCOUNT wins."""
        if "OMP_WAIT_POLICY" not in os.environ:
            os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))

    def benchmark_devices(self) -> list:
        """Benchmark workers of a sweep by default: one, on this machine's CPUs."""
        return ["0"]

    def worker_environment(self, device: str, slot: int, slots: int) -> dict:
        """Slot `slot` of `slots` gets every `slots`-th CPU of this process,
        bound, so concurrent benchmark workers do not share cores."""
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            list(range(os.cpu_count() or 1))
        mine = cpus[slot::slots] or cpus
        return dict(DISPATCHER_WORKER_CPUS=",".join(map(str, mine)), OMP_NUM_THREADS=str(len(mine)),
                    OMP_PROC_BIND="close")

    def ray_slot(self, nodes: list, slot_cpus: int) -> tuple:
        """(actor resources, worker environment, slots) of a Ray benchmark
        slot: `slot_cpus` CPUs (default: as many as the smallest node has),
        as many slots as the nodes' CPUs hold."""
        cpus = slot_cpus or min((int(r.get("CPU", 0)) for r in nodes if r.get("CPU")), default=0)
        count = sum(int(r.get("CPU", 0)) // cpus for r in nodes) if cpus else 0
        return {"num_cpus": cpus}, {"OMP_NUM_THREADS": str(cpus)}, count

    def parallelism(self, config) -> int:
        """Workers a kernel of `config` runs on here."""
        return config.target_params["threads"] or cpu_count()

    def shared_waves(self, items: int, workers: int, k_tiles: int) -> tuple:
        """(waves, work items run in pieces) of a kernel that shares its last
        wave out (`VariantRecord.shares_last_wave`): its threads split the
        last wave's K iterations evenly, so the waves count unrounded, at
        least one; no item counts as pieces, since a thread sums a partial
        tile in its own cache, at no cost the model tells apart."""
        return max(1.0, items / workers), 0

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
        spec = cpu_isa.active()
        return f"{cpu_count()} threads, ISA {spec.name} ({spec.isa.vector_bytes * 8}-bit vectors)"


def _largest_group(problem) -> tuple:
    """(M, N) of a problem's largest group: its own for one GEMM or a batch of
    equal ones (without listing a batch's copies), the largest of a grouped one."""
    if hasattr(problem, "m"):
        return problem.m, problem.n
    shapes = problem.shapes
    return max((s[0] for s in shapes), default=0), max((s[1] for s in shapes), default=0)


def micro_tile_for(isa, tiles_m, tiles_n) -> tuple | None:
    """The (micro_m, micro_n) of ISA spec `isa` that every block tile in `tiles_m`
    x `tiles_n` is a whole multiple of, or None if no valid one is.

    One micro-tile must serve a whole sweep of block tiles, and the ISA's
    default may divide none of them (12 rows on AVX-512, 6 on AVX2, against
    another tool's power-of-two tiles). The default wins when it divides;
    otherwise the one with the most accumulator elements, then the one whose
    width is nearest the default's (the shape the ISA's kernel is tuned for).
    Remembered: selection asks it for every default config of a new problem.
    """
    return _micro_tile_for(isa, tuple(tiles_m), tuple(tiles_n))


@functools.lru_cache(maxsize=1024)
def _micro_tile_for(isa, tiles_m: tuple, tiles_n: tuple) -> tuple | None:
    def divides(mm, mn):
        return all(t % mm == 0 for t in tiles_m) and all(t % mn == 0 for t in tiles_n)

    if divides(*isa.micro_tile):
        return isa.micro_tile
    bounds = {o.name: o for o in CPU.options}
    fits = [(mm, mn)
            for mm in range(bounds["micro_m"].low, bounds["micro_m"].high + 1)
            for mn in range(bounds["micro_n"].low, bounds["micro_n"].high + 1)
            if divides(mm, mn) and isa.micro_tile_problem(mm, mn) is None]
    return max(fits, key=lambda t: (t[0] * t[1], -abs(t[1] - isa.micro_tile[1])), default=None)


def cpu_count() -> int:
    """CPUs this process may run on (OpenMP's default thread count)."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"])
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


CPU = register(CpuTarget())
