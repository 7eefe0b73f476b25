"""The `cuda` target: CUTLASS 3.x SM90 instances built with nvcc, for Hopper.

Kernels instantiate CUTLASS templates through `dispatcher/native/cuda/`; the
CUTLASS headers come from the `nvidia-cutlass` package (the `cuda` extra).
The target block of a CUDA `KernelConfig` is the thread-block cluster, the
kernel schedule (warp-specialized cooperative or ping-pong) and the
mainloop stage count. Device memory and streams go through CuPy
(`dispatcher.targets.cuda_memory`), imported only when a kernel runs.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from importlib import metadata
import shutil
import subprocess
from pathlib import Path

import attrs

from .. import dtypes
from ..errors import ToolchainError
from ..records import Option
from . import cuda_model, register
from .toolchain import NATIVE_DIR, CompilerMixin, headers_hash

SUPPORTED_ARCHS = ("90a",)

_ELEMENTS = {
    "fp32": "float", "fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t",
    "fp8_e4m3": "cutlass::float_e4m3_t", "fp8_e5m2": "cutlass::float_e5m2_t",
}
INPUT_DTYPES = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
# A config's raster order as the generated source names it (`dcuda::schedule`):
# 0 leaves the scheduler's own rule.
RASTER_ORDERS = {"default": 0, "along_m": 1, "along_n": 2}


def _along_m(opts: dict, m: int, n: int, tile_m: int, tile_n: int) -> bool:
    """Whether a kernel hands out an (m, n) problem's tiles down C's
    columns: its raster option, or for `default` the rule of CUTLASS's
    persistent schedulers (`get_rasterization_order`: along M when C has
    more tile columns than rows, counted in whole clusters). The grouped
    scheduler's own default, along M always, is estimated with that rule
    too."""
    if opts["raster"] != "default":
        return opts["raster"] == "along_m"
    rows = math.ceil(math.ceil(m / tile_m) / opts["cluster_m"]) * opts["cluster_m"]
    columns = math.ceil(math.ceil(n / tile_n) / opts["cluster_n"]) * opts["cluster_n"]
    return columns > rows

_SCHEDULES = {  # option -> (mainloop, epilogue, pointer-array mainloop, pointer-array epilogue)
    "cooperative": ("cutlass::gemm::KernelTmaWarpSpecializedCooperative",
                    "cutlass::epilogue::TmaWarpSpecializedCooperative",
                    "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative",
                    "cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative"),
    "pingpong": ("cutlass::gemm::KernelTmaWarpSpecializedPingpong",
                 "cutlass::epilogue::TmaWarpSpecialized",
                 "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong",
                 "cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong"),
    # not CUTLASS: native/cuda/gemv.hpp, for M or N up to 4 (the traits keep the
    # cooperative names, which its templates do not instantiate)
    "gemv": ("cutlass::gemm::KernelTmaWarpSpecializedCooperative",
             "cutlass::epilogue::TmaWarpSpecializedCooperative",
             "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative",
             "cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative"),
}


def cutlass_includes() -> list:
    """Include folders of the `nvidia-cutlass` package, or ToolchainError."""
    spec = importlib.util.find_spec("cutlass_library")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError("the cuda target needs CUTLASS headers: "
                             "pip install 'gemm-dispatcher[cuda]' (the nvidia-cutlass package)")
    source = Path(list(spec.submodule_search_locations)[0]).resolve() / "source"
    folders = [source / "include", source / "tools" / "util" / "include"]
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        raise ToolchainError(f"nvidia-cutlass is installed but lacks {', '.join(missing)}")
    return folders


def find_nvcc() -> str:
    for candidate in (os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc"),
                      shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ToolchainError("nvcc not found (looked in $CUDA_HOME/bin, PATH and /usr/local/cuda/bin): "
                         "install the CUDA toolkit (12.4 or newer) or set CUDA_HOME")


def detect_arch() -> str:
    """`$DISPATCHER_CUDA_ARCH`, else the GPU's compute capability, else 90a
    (building without a GPU targets Hopper)."""
    if os.environ.get("DISPATCHER_CUDA_ARCH"):
        return os.environ["DISPATCHER_CUDA_ARCH"]
    try:
        from . import cuda_memory
        major, minor = cuda_memory.compute_capability()
        return f"{major}{minor}a" if (major, minor) == (9, 0) else f"{major}{minor}"
    except Exception:
        return "90a"


@functools.lru_cache(maxsize=None)
def _is_device_array():
    """`cuda_memory.is_device_array`, imported once: `owns` runs on every
    call whose target is "auto" or named (an import statement there cost
    6 us of a 256^3 call's 13 on the H100)."""
    from .cuda_memory import is_device_array
    return is_device_array


def fp8_fits(entry: dict) -> bool:
    """Whether an fp8 kernel of this tile keeps its accumulators in
    registers: CUTLASS's fp8 mainloop (without fast accumulation) adds each
    few MMAs' partial sums into a second fp32 accumulator, so a consumer
    warp group holds two; past 64x192 per warp group they spill (nvcc 13.0
    -Xptxas -v, sm_90a: 128x256x128 cooperative 858 bytes of spill stores,
    128x192x128 none) and 128x256x128 ran 2.5x slower than 128x128x128 on
    the H100 (4096^3: 309 vs 120 us;
    benchmarks/results/cuda_gemm_fp8_grouped_h100_64b8fe4.json). Cooperative tiles
    split over two warp groups, ping-pong tiles take one each."""
    groups = 2 if entry.get("schedule") == "cooperative" else 1
    return entry["tile_m"] * entry["tile_n"] <= 64 * 192 * groups


@attrs.frozen
class Toolchain(CompilerMixin):
    compiler: str
    flags: tuple
    arch: str
    label = "nvcc"

    @classmethod
    @functools.lru_cache(maxsize=None)
    def find(cls) -> "Toolchain":
        nvcc = find_nvcc()
        includes = cutlass_includes()
        arch = detect_arch()
        if arch not in SUPPORTED_ARCHS:
            raise ToolchainError(f"CUDA arch sm_{arch} is not supported; the cuda target builds "
                                 f"CUTLASS SM90 kernels for {', '.join('sm_' + a for a in SUPPORTED_ARCHS)}")
        flags = ("-std=c++17", "-O3", "-DNDEBUG", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                 "--expt-relaxed-constexpr", "-shared", "-Xcompiler=-fPIC,-fvisibility=hidden",
                 f"-I{NATIVE_DIR}", *(f"-I{p}" for p in includes))
        return cls(nvcc, flags, arch)

    @functools.cached_property
    def identity(self) -> str:
        version = subprocess.run([self.compiler, "--version"], capture_output=True, text=True).stdout
        try:
            cutlass_version = metadata.version("nvidia-cutlass")
        except metadata.PackageNotFoundError:
            cutlass_version = "?"
        return (f"{version.strip().splitlines()[-1]} | sm_{self.arch} | cutlass {cutlass_version} "
                f"| headers:{headers_hash('cuda')}")


@attrs.frozen
class CudaTarget:
    name: str = "cuda"
    pads = True  # its kernels stage operands that break TMA's 16-byte rule (native/cuda/staging.hpp)
    # No memset before a launch: CUTLASS's initialize_workspace clears what its
    # schedulers need, and the staged copies and tree partials are written whole.
    zeroes_workspace = False
    workspace_per_call = False  # a kernel's workspace follows the plan's shapes and alignment class
    options: tuple = (
        Option("cluster_m", 2, "thread-block cluster extent along M", choices=(1, 2, 4)),
        Option("cluster_n", 1, "thread-block cluster extent along N", choices=(1, 2, 4)),
        Option("schedule", "cooperative", "warp-specialized kernel schedule",
               choices=tuple(_SCHEDULES)),
        Option("stages", 0, "mainloop pipeline stages (0: as many as shared memory holds)",
               low=0, high=8),
        Option("swizzle", 1, "tile rasterization swizzle: tiles that run at once share operands in L2",
               choices=(1, 2, 4, 8)),
        Option("raster", "default", "the order the persistent scheduler hands out output tiles: "
               "along_m or along_n (consecutive tiles down a column or along a row of C), or "
               "default (the scheduler's own rule: CUTLASS steps along M when C has more tile "
               "columns than rows, else along N; its grouped scheduler along M)",
               choices=tuple(RASTER_ORDERS)),
    )

    def toolchain(self, config=None) -> Toolchain:
        """nvcc and its flags (one toolchain for every config)."""
        return Toolchain.find()

    def name_tokens(self, opts: dict) -> str:
        sched = {"cooperative": "coop", "pingpong": "pp", "gemv": "gemv"}[opts["schedule"]]
        stages = opts["stages"] or "auto"
        swizzle = f"_sw{opts['swizzle']}" if opts["swizzle"] != 1 else ""
        raster = {"default": "", "along_m": "_rm", "along_n": "_rn"}[opts["raster"]]
        return f"c{opts['cluster_m']}x{opts['cluster_n']}_{sched}_s{stages}{swizzle}{raster}"

    def default_tile_k(self, dtype: str) -> int:
        """The tile_k of the variants' catalogs: 128 bytes of A (64 bf16 or
        fp16, 128 fp8). NVIDIA's model prefers 256 bytes for bf16, but on the
        H200 128x256x64 ran 4096^3 at 0.98x cuBLAS and 128x256x128 at 0.82x
        (two pipeline stages fit instead of four; benchmarks/cuda_gemm.py)."""
        return 128 // dtypes.get(dtype).itemsize

    def catalog(self, entries, dtype: str) -> list:
        """A variant's catalog entries (dicts of tile_m, tile_n, cluster,
        schedule, ...) completed with the dtype's tile_k; for fp8, those
        whose accumulators fit its registers twice (`fp8_fits`)."""
        fp8 = dtypes.get(dtype).is_float8
        return [dict(e, tile_k=self.default_tile_k(dtype)) for e in entries if not fp8 or fp8_fits(e)]

    def check(self, config) -> str | None:
        o = config.target_params
        if config.dtype_a not in INPUT_DTYPES:
            return f"the cuda target takes {', '.join(INPUT_DTYPES)} inputs, not {config.dtype_a}"
        if config.dtype_c not in _ELEMENTS:
            return f"the cuda target cannot write {config.dtype_c}"
        if dtypes.get(config.dtype_a).is_float8 and config.layout[:2] != "rc":
            return "fp8 tensor-core MMA needs K-major operands: layout rcr"
        if config.layout[2] != "r":
            return "CUDA kernels write row-major C (column-major C is run transposed)"
        if o["schedule"] == "gemv":
            return _gemv_check(config)
        tile_ms = (128, 256) if o["schedule"] == "cooperative" else (64, 128)
        if config.tile_m not in tile_ms:
            return f"the {o['schedule']} schedule takes tile_m in {tile_ms}"
        if config.tile_n not in (64, 128, 192, 256):
            return "tile_n must be 64, 128, 192 or 256"
        if config.tile_k * dtypes.get(config.dtype_a).itemsize not in (64, 128, 256):
            return "tile_k must span 64, 128 or 256 bytes of A (e.g. 64 for bf16, 128 for fp8)"
        if o["cluster_m"] * o["cluster_n"] > 8:
            return "clusters of more than 8 CTAs are not portable"
        return None

    def fit_sweep(self, configs: list, axes) -> list:
        """A sweep's configs as they are: CUDA tiles have no micro-tile to fit."""
        return configs

    def prelude(self, config) -> str:
        o = config.target_params
        mainloop, epilogue, ptr_mainloop, ptr_epilogue = _SCHEDULES[o["schedule"]]
        layout = {"r": "cutlass::layout::RowMajor", "c": "cutlass::layout::ColumnMajor"}
        return "\n".join([
            '#include "cuda/cutlass_common.hpp"',
            "",
            f'#define KERNEL_NAME "{config.name}"',
            f"#define DCUDA_GEMV {int(o['schedule'] == 'gemv')}  // the gemv schedule: native/cuda/gemv.hpp",
            "struct KernelTraits {",
            f"    using ElementA = {_ELEMENTS[config.dtype_a]};",
            f"    using ElementB = {_ELEMENTS[config.dtype_b]};",
            f"    using ElementC = {_ELEMENTS[config.dtype_c]};",
            f"    using LayoutA = {layout[config.layout[0]]};",
            f"    using LayoutB = {layout[config.layout[1]]};",
            f"    using LayoutC = {layout[config.layout[2]]};",
            f"    static constexpr bool kARow = {str(config.layout[0] == 'r').lower()};",
            f"    static constexpr bool kBRow = {str(config.layout[1] == 'r').lower()};",
            f"    static constexpr bool kCRow = {str(config.layout[2] == 'r').lower()};",
            f"    using TileShape = cute::Shape<cute::_{config.tile_m}, cute::_{config.tile_n}, cute::_{config.tile_k}>;",
            f"    using ClusterShape = cute::Shape<cute::_{o['cluster_m']}, cute::_{o['cluster_n']}, cute::_1>;",
            f"    static constexpr int kStages = {o['stages']};",
            f"    static constexpr int kSwizzle = {o['swizzle']};",
            f"    static constexpr int kRaster = {RASTER_ORDERS[o['raster']]};  // dcuda::schedule",
            f"    using MainloopSchedule = {mainloop};",
            f"    using EpilogueSchedule = {epilogue};",
            f"    using PtrArrayMainloopSchedule = {ptr_mainloop};",
            f"    using PtrArrayEpilogueSchedule = {ptr_epilogue};",
            "};",
            "",
        ])

    def arch_id(self) -> str:
        return f"sm_{detect_arch()}"

    def neighbour_config(self, config):
        """The config to run a problem that only a nearby tuned problem's
        winner `config` decides: the same without its swizzle. A swizzle
        orders the tiles for L2 reuse in the tile grid it was measured on;
        it won the grid's large squares by 0-5% but ran 1.1-1.6x slower than
        its unswizzled twin on elongated problems near them (12226 x 2103 x
        3144, 32 x 14336 x 4096: H100, benchmarks/results/cuda_gemm_*), while
        the twin stayed within 0.2% on the squares."""
        return config.replace(swizzle=1) if config.target_params["swizzle"] != 1 else config

    def computed_tile(self, problem, config) -> tuple:
        """A CTA computes its whole tile, however little of it the problem covers."""
        return config.tile_m, config.tile_n

    def launched_tiles(self, problem, config) -> int:
        """Output tiles the kernel launches: each GEMM's tile grid rounded up
        to whole clusters (a 2x4 cluster on a problem one tile wide still
        runs four CTAs across, three of them idle)."""
        o = config.target_params

        def whole_clusters(size, tile, cluster):  # tiles along one side, rounded up to whole clusters
            return math.ceil(math.ceil(size / tile) / cluster) * cluster

        return sum(whole_clusters(m, config.tile_m, o["cluster_m"]) * whole_clusters(n, config.tile_n, o["cluster_n"])
                   for m, n, _ in problem.shapes)

    def a_panel_reuse(self, problem, config) -> int:
        """1: every CTA loads the A block of its own tile."""
        return 1

    def panel_reuse(self, problem, config, workers: int) -> int:
        """1: every CTA loads the A and B blocks of its own tile."""
        return 1

    def compute_rate(self, config) -> float:
        """1: NVIDIA's model ranks cuda configs; the occupancy model's rate is even."""
        return 1.0

    def measure(self, fn, options, stream: int = 0) -> list:
        """GPU seconds of repeated calls of fn(i) from CUDA events on `stream`
        (`timing.measure_cuda`)."""
        from ..timing import measure_cuda
        return measure_cuda(fn, options, stream)

    @property
    def model_name(self) -> str:
        return cuda_model.NAME

    def template_schedule(self, config) -> str | None:
        """The schedule of `config` that a variant's own template must
        implement ("gemv": its kernel is not a CUTLASS instance), or None;
        the core refuses it to variants whose record does not list it."""
        return "gemv" if config.target_params["schedule"] == "gemv" else None

    def takes_schedule(self, schedule: str, problem) -> bool:
        """Whether a kernel of this target's own `schedule` runs `problem`
        (gemv: M or N up to 4, rcr, 16-bit inputs)."""
        return (schedule == "gemv" and problem.layout == "rcr" and problem.dtype in ("bf16", "fp16")
                and all(min(m, n) <= GEMV_MAX_SMALL for m, n, _ in problem.shapes))

    def model_name_of(self, config) -> str:
        """What estimates `config` (`model_estimate`): NVIDIA's model, or for
        the gemv schedule its bandwidth estimate."""
        return GEMV_MODEL if config.target_params["schedule"] == "gemv" else self.model_name

    def model_estimate(self, problem, config, splits: int):
        """Microseconds NVIDIA's model expects for `config` on `problem` (the
        sum over its GEMMs), or None where the model does not know the config;
        for the gemv schedule, which that model does not know, `gemv_estimate_us`."""
        o = config.target_params
        if o["schedule"] == "gemv":
            return sum(gemv_estimate_us(m, n, k, config) for m, n, k in problem.shapes)
        total = 0.0
        for m, n, k in problem.shapes:
            if not (m and n and k):
                continue
            # K in fewer tiles than slices: a slice is a whole K tile, as the kernels cut it; but a
            # config that splits pays for its reduction even where K has one tile (at least 2 slices)
            slices = splits if splits == 1 else min(splits, max(2, -(-k // config.tile_k)))
            found = cuda_model.estimate_us(m, n, k, config.layout, config.dtype_a, config.dtype_c,
                                           (config.tile_m, config.tile_n), (o["cluster_m"], o["cluster_n"]),
                                           slices, o["swizzle"],
                                           _along_m(o, m, n, config.tile_m, config.tile_n))
            if found is None:
                return None
            total += found
        return total

    def prepare_process(self):
        """Nothing: CUDA kernels need no process settings before loading."""

    def benchmark_devices(self) -> list:
        """Benchmark workers of a sweep by default: one per visible GPU."""
        from . import cuda_memory
        return [str(i) for i in range(cuda_memory.device_count())] or ["0"]

    def worker_environment(self, device: str, slot: int, slots: int) -> dict:
        """A benchmark worker sees only its GPU."""
        return {"CUDA_VISIBLE_DEVICES": device}

    def ray_slot(self, nodes: list, slot_cpus: int) -> tuple:
        """(actor resources, worker environment, slots) of a Ray benchmark
        slot: one GPU (and `slot_cpus` CPUs, default 1), one slot per GPU."""
        return {"num_gpus": 1, "num_cpus": slot_cpus or 1}, {}, int(sum(r.get("GPU", 0) for r in nodes))

    def parallelism(self, config) -> int:
        """Multiprocessors of the GPU (132 on an H200 when none is visible)."""
        try:
            from . import cuda_memory
            return cuda_memory.multiprocessors()
        except Exception:
            return 132

    def shared_waves(self, items: int, workers: int, k_tiles: int) -> tuple:
        """(waves, work items run in pieces) of a kernel that shares its last
        wave out (`VariantRecord.shares_last_wave`), as CUTLASS's stream-K
        scheduler decides in its heuristic mode (tile_scheduler_params.h,
        `get_num_sk_tiles`): whole waves where the last one is full, is at
        least half full, or a tile has at most 8 K tiles to split; otherwise
        the last wave and the full one before it run stream-K, their K
        iterations spread evenly over the workers (waves unrounded), each of
        those tiles summed from pieces through fp32 partials in global
        memory. Those partials are what made hybrid kernels 1.2-1.3x slower
        than the fit expected at 1024 x 5632 x 2048 (H100, 176 tiles of
        256x128 all in pieces: 49 us against 39 fitted without them)."""
        full, waves = items // workers, -(-items // workers)
        if full == waves or k_tiles <= 8 or 2 * (items - full * workers) >= workers:
            return float(waves), 0
        return max(1.0, items / workers), (items - (full - 1) * workers if full > 1 else items)

    def available(self) -> bool:
        try:
            from . import cuda_memory
            return cuda_memory.device_count() > 0
        except Exception:
            return False

    def owns(self, array) -> bool:
        return _is_device_array()(array)

    @property
    def memory(self):
        from .cuda_memory import DEVICE
        return DEVICE

    def session(self, *arrays):
        from .cuda_memory import DeviceSession
        if not self.available():
            raise ToolchainError("target 'cuda' needs an NVIDIA GPU and CuPy; none is visible here")
        return DeviceSession(*arrays)

    def parallelism_hint(self) -> str:
        return f"{self.parallelism(None)} SMs"


# The gemv schedule (native/cuda/gemv.hpp): a config of it and what it runs.
GEMV_MAX_SMALL = 4  # M or N (its kMaxSmall)
GEMV_ROWS_PER_BLOCK = 4  # rows of the big operand a block computes (its kRowsPerBlock)
GEMV_TILE = (GEMV_MAX_SMALL, GEMV_ROWS_PER_BLOCK)  # (tile_m, tile_n) of its configs: the small side, a block's rows
# Fitted to the gemv kernel's times on the H100 (kernel alone, L2 flushed; bf16, M = 1, 2, 4 against N x K of
# 1024^2, 4096^2, 4096 x 14336 and 14336 x 4096: benchmarks/results/sweeps/cuda_h100_64a1b03/gemv.csv): a fixed
# 8 us, the big operand at 2.6 TB/s, and the small one's rereads (one per block) at 11 TB/s from L2. (CUTLASS's
# 64x128 ping-pong kernel took about 14 us + the same 2.6 TB/s there; NVIDIA's model puts it higher, 34 us for
# its 26 at 1 x 4096 x 4096.)
GEMV_BYTES_PER_US = 2.6e6
GEMV_L2_BYTES_PER_US = 11e6
GEMV_LAUNCH_US = 8.0
GEMV_MODEL = "gemv bandwidth estimate"


def _gemv_check(config) -> str | None:
    """Why a config of the gemv schedule cannot be built, or None (whether
    its variant's template implements the schedule: `template_schedule`)."""
    o = config.target_params
    if config.layout != "rcr":
        return "the gemv schedule reads A and B along K: layout rcr"
    if dtypes.get(config.dtype_a).is_float8:
        return "the gemv schedule takes fp16 and bf16 inputs"
    if (config.tile_m, config.tile_n) != GEMV_TILE:
        return (f"the gemv schedule's tiles are {GEMV_TILE[0]}x{GEMV_TILE[1]} (M or N up to {GEMV_MAX_SMALL}, "
                f"{GEMV_ROWS_PER_BLOCK} rows a block)")
    if (o["cluster_m"], o["cluster_n"], o["swizzle"], o["raster"]) != (1, 1, 1, "default"):
        return "the gemv schedule has no clusters, swizzle or raster order"
    return None


def gemv_estimate_us(m: int, n: int, k: int, config) -> float:
    """Microseconds of a gemv-schedule kernel on one problem: the big
    operand and C once at its measured HBM speed, the small operand once
    per block from L2, plus a launch; infinite for a problem it does not
    take, so it ranks after every kernel that does."""
    if not (m and n and k):
        return 0.0
    if min(m, n) > GEMV_MAX_SMALL:
        return math.inf
    small, big = sorted((m, n))
    size = dtypes.get(config.dtype_a).itemsize
    streamed = big * k * size + m * n * dtypes.get(config.dtype_c).itemsize
    reread = -(-big // GEMV_ROWS_PER_BLOCK) * small * k * size
    return streamed / GEMV_BYTES_PER_US + reread / GEMV_L2_BYTES_PER_US + GEMV_LAUNCH_US


CUDA = register(CudaTarget())
