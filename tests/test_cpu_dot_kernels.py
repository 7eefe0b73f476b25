"""Every micro-kernel of this machine's ISAs (`cpu_isa`, `native/cpu/dot_ops.hpp`),
each with its own ISA spec, against the float64 reference on the same
quantized inputs, into poisoned outputs: every dtype it computes, every
variant (regular, stream-K split over workers, grouped, batched with a fused
bias and activation), K blocks that end in a partial k group, and for int8
the full range and the deepest K the int32 rule allows.

A micro-kernel whose extension this machine lacks is skipped with the reason
(its code is still compiled, and checked to hold its instruction); on a
machine that has it (the GPU host's Xeon: AVX512-BF16, VNNI, AMX) it runs:
`benchmarks/cpu_isa_check.sh`. The dtype x layout parity matrix runs the
active spec's micro-kernels (`-m parity`, rerun by CI per extension setting).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes, targets
from dispatcher.library import Library
from dispatcher.plugins import get_manager
from dispatcher.kinds import prepare_gemm
from dispatcher.problem import _deepest_exact_k, prepare_grouped
from dispatcher.targets import cpu_isa
from dispatcher.verify import max_rel, poison, random_matrix, reference, tolerance

# Many kernels built per ISA: CI runs them after the fast suite (-m kernels).
pytestmark = pytest.mark.kernels

CPU = targets.get("cpu")
# tile_k 30: every K block of an int8 kernel ends in a partial k group of 4.
TILE = dict(tile_m=24, tile_n=64, tile_k=30)
# A tile micro-kernel's (AMX, 32x32): K blocks of several tile chunks (32
# bf16 or 64 int8 k values), the last one partial.
TILE_OF_TILES = dict(tile_m=96, tile_n=64, tile_k=100)


def tile_for(spec: str) -> dict:
    """Block tiles for a kernel of `spec`: several blocks and partial ones on
    SHAPES, multiples of its micro-kernel's micro-tile."""
    kernel = cpu_isa.get(spec).own_kernel
    if kernel is not None and kernel.tiles:
        return TILE_OF_TILES
    mm, mn = cpu_isa.get(spec).micro_tile
    return dict(TILE, tile_m=math.lcm(TILE["tile_m"], mm), tile_n=math.lcm(TILE["tile_n"], mn))
SHAPES = [(37, 53, 71), (1, 1, 1), (131, 7, 257)]
# One layout of A and B per variant: each variant one kernel, all four layouts in all.
LAYOUTS = {"regular": "rc", "stream_k": "cr", "grouped": "rr", "batched": "cc"}


def variant_options(variant, dtype) -> dict:
    """Stream-K splits tiles three ways (workers=3); int32 partials are added
    atomically, others in order (atomic takes fp32 and int32 outputs only)."""
    if variant != "stream_k":
        return {}
    return dict(reduction="atomic" if dtype == "int8" else "linear", decomposition="hybrid")
# The instruction each x86 micro-kernel is built around (NEON's: test_neon_qemu.py).
INSTRUCTIONS = {"dcpu::DotBf16": "vdpbf16ps", "dcpu::DotU8S8": "vpdpbusd", "dcpu::MaddI16": "pmaddwd",
                "dcpu::TileBf16": "tdpbf16ps", "dcpu::TileS8": "tdpbssd"}


def kernel_spec(isa: cpu_isa.Isa, kernel: cpu_isa.MicroKernel) -> str:
    """The spec a micro-kernel is built for: its base and the extensions it needs."""
    return cpu_isa.Spec(isa, tuple(isa.extension(e) for e in kernel.needs)).name


HOST = [(kernel_spec(isa, kernel), kernel) for isa in cpu_isa.ISAS.values()
        if isa.machine == cpu_isa.host_machine() for kernel in isa.micro_kernels]
VARIANTS = ("regular", "stream_k", "grouped", "batched")
# Each policy runs every variant once, with its first dtype, on the best ISA
# of this machine that has it (else the best one: skipped); its other dtypes
# and ISAs (vector widths) run regular.
EVERY_VARIANT = {}
for spec, kernel in sorted(HOST, key=lambda sk: cpu_isa.why_not_runnable(cpu_isa.get(sk[0])) is not None):
    EVERY_VARIANT.setdefault(kernel.cpp, spec)
CASES = [pytest.param(spec, dtype, variant, id=f"{spec}-{dtype}-{variant}")
         for spec, kernel in HOST for i, dtype in enumerate(sorted(kernel.dtypes))
         for variant in (VARIANTS if i == 0 and EVERY_VARIANT[kernel.cpp] == spec else ("regular",))]


def runnable(spec: str) -> None:
    reason = cpu_isa.why_not_runnable(cpu_isa.get(spec))
    if reason:
        pytest.skip(reason)


def full_range(rows, cols, dtype, layout, rng):
    """int8 over its whole range (the VNNI offset and pmaddwd's pairs at their
    extremes), other dtypes as every test draws them."""
    if dtype != "int8":
        return random_matrix(rows, cols, dtype, layout, rng)
    x = rng.integers(-128, 128, size=(rows, cols)).astype(np.int8)
    return np.asfortranarray(x) if layout == "c" else x


def poisoned(shape, dtype):
    return lambda *_: poison(np.empty(shape, dtypes.output_for(dtype).numpy))


def run_variant(variant, spec, dtype, a, b, bias=None, library=None):
    """alpha * a @ b (+ bias, relu) through `variant` with `spec`'s kernel
    (block tiles `tile_for(spec)`) or with `library`, into poison."""
    d = dispatcher.api.default_dispatcher()
    config = dict(tile_for(spec), isa=spec)
    m, n = a.shape[0], b.shape[1]
    if variant == "grouped":
        problem, operands, (out,) = prepare_grouped([a], [b], allocate=poisoned((m, n), dtype))
        d.run(problem, operands, config)
        return out
    if variant == "batched":
        out = poisoned((2, m, n), dtype)()
        dispatcher.matmul(np.stack([a, a[::-1]]), b, out=out, bias=bias, activation="relu", config=config)
        return out
    problem, operands, out = prepare_gemm(a, b, variant=variant, allocate=poisoned((m, n), dtype))
    config.update(variant_options(variant, dtype))
    options = {"workers": 3} if variant == "stream_k" else None
    if library is None:
        d.run(problem, operands, config, options)
    else:
        d.launch(library, problem, operands, options)
    return out


@pytest.mark.parametrize("spec, dtype, variant", CASES)
def test_micro_kernel_matches_reference(spec, dtype, variant, rng):
    runnable(spec)
    config = dispatcher.KernelConfig.create(variant="regular" if variant == "grouped" else variant,
                                            dtype=dtype, isa=spec, **tile_for(spec))
    assert config.target_params["isa"] == spec, "the kernel is built for the spec under test"
    layout = LAYOUTS[variant]
    for m, n, k in SHAPES:
        a, b = full_range(m, k, dtype, layout[0], rng), full_range(k, n, dtype, layout[1], rng)
        if variant == "batched":
            bias = random_matrix(1, n, dtypes.output_for(dtype).token, "r", rng)[0]
            out = run_variant(variant, spec, dtype, a, b, bias)
            expected = np.maximum(np.stack([reference(a, b), reference(a[::-1], b)]) +
                                  bias.astype(np.float64), 0.0)
        else:
            out = run_variant(variant, spec, dtype, a, b)
            expected = reference(a, b)
        err = max_rel(out, expected)
        assert err <= tolerance(config, k), (spec, dtype, variant, (m, n, k), err)


@pytest.mark.parametrize("spec", sorted({spec for spec, kernel in HOST if "int8" in kernel.dtypes}))
@pytest.mark.parametrize("variant", ["regular", "stream_k"])
def test_int8_is_exact_at_the_deepest_k(spec, variant):
    """-128 x -128 products summed over the deepest K the int32 rule allows
    reach 2^31 - 16384: exact, with VNNI's offset sums wrapping on the way."""
    runnable(spec)
    k = _deepest_exact_k("int8")
    a = np.full((3, k), -128, np.int8, order="C" if LAYOUTS[variant][0] == "r" else "F")
    b = np.full((k, 5), -128, np.int8, order="C" if LAYOUTS[variant][1] == "r" else "F")
    b[:, 1], b[::2, 2], a[1, ::3] = 127, 127, 127
    out = run_variant(variant, spec, "int8", a, b)
    expected = a.astype(np.int64) @ b.astype(np.int64)
    assert expected.max() == 16384 * k and expected.max() <= np.iinfo(np.int32).max
    np.testing.assert_array_equal(out, expected)


def test_micro_kernels_this_machine_cannot_run_compile_to_their_instruction(tmp_path):
    """Each one's regular kernel, for its first dtype, built in parallel."""
    kernels = [(kernel, dispatcher.KernelConfig.create(dtype=sorted(kernel.dtypes)[0], isa=spec, **tile_for(spec)))
               for spec, kernel in HOST if cpu_isa.why_not_runnable(cpu_isa.get(spec))]
    if not kernels:
        pytest.skip("this machine runs every micro-kernel of its ISAs")
    if not shutil.which("objdump"):
        pytest.skip("needs objdump (binutils)")

    def disassemble(config):
        source = get_manager().hook.dispatcher_codegen(config=config, target=CPU)  # Dispatcher refuses it
        (name, text), = source.files
        (tmp_path / name).write_text(text)
        library = tmp_path / f"{config.name}.so"
        CPU.toolchain(config).compile(tmp_path / name, library, source.flags)
        return subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True).stdout

    with ThreadPoolExecutor(max_workers=len(kernels)) as pool:
        listings = list(pool.map(disassemble, [config for _, config in kernels]))
    for (kernel, config), listing in zip(kernels, listings):
        assert INSTRUCTIONS[kernel.cpp] in listing, f"{config.name} has no {INSTRUCTIONS[kernel.cpp]}"


def emulated_source(variant, dtype, policy, emulation, **config):
    """The source of a kernel of this machine's best base ISA whose
    micro-kernel policy is `policy`, defined by C++ `emulation` (a policy's
    panels with its instructions emulated): (config, source, text)."""
    base = cpu_isa.supported()[0].name
    config = dispatcher.KernelConfig.create(variant=variant, dtype=dtype, layout=LAYOUTS[variant] + "r",
                                            isa=base, **{**TILE, **config}, **variant_options(variant, dtype))
    source = get_manager().hook.dispatcher_codegen(config=config, target=CPU)
    (name, text), = source.files
    native = cpu_isa.get(base).micro_kernel(dtype).cpp
    assert text.count(native + ">") == 1
    text = text.replace(native + ">", policy + ">").replace("using KernelTraits", emulation + "using KernelTraits", 1)
    return config, source, text


def emulated(tmp_path, variant, dtype, policy, emulation, flags=(), **config):
    """`emulated_source`'s kernel, built: (library, config). Runs on any x86 machine."""
    config, source, text = emulated_source(variant, dtype, policy, emulation, **config)
    (name, _), = source.files
    (tmp_path / name).write_text(text)
    CPU.toolchain(config).compile(tmp_path / name, tmp_path / "kernel.so", (*source.flags, *flags))
    return Library(tmp_path / "kernel.so", expected_name=config.name, config=config), config


def int8_cases(rng):
    """Full-range int8 on every shape, and extremes at the deepest K."""
    k = _deepest_exact_k("int8")
    extremes = (np.full((3, k), -128, np.int8), np.full((k, 5), -128, np.int8))
    extremes[1][:, 1], extremes[0][1, ::3] = 127, 127
    return [(full_range(m, k_, "int8", "r", rng), full_range(k_, n, "int8", "r", rng))
            for m, n, k_ in SHAPES] + [extremes]


def check_emulated(library, config, variant, cases):
    for a, b in cases:
        a = np.asfortranarray(a) if LAYOUTS[variant][0] == "c" else np.ascontiguousarray(a)
        b = np.asfortranarray(b) if LAYOUTS[variant][1] == "c" else np.ascontiguousarray(b)
        out = run_variant(variant, config.target_params["isa"], config.dtype_a, a, b, library=library)
        if config.dtype_a == "int8":
            np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))
        else:
            assert max_rel(out, reference(a, b)) <= tolerance(config, a.shape[1]), (variant, a.shape, b.shape)


# vpdpbusd lane by lane: four unsigned x signed byte products added into the
# int32 lane modulo 2^32, as the instruction does.
EMULATED_VNNI = """
struct EmulatedDotU8S8 : dcpu::PanelsU8S8 {
    template <class V>
    static inline V step(V acc, V a, V b) {
        uint8_t u[sizeof(V)];
        int8_t s[sizeof(V)];
        uint32_t lanes[sizeof(V) / 4];
        std::memcpy(u, &b, sizeof u);
        std::memcpy(s, &a, sizeof s);
        std::memcpy(lanes, &acc, sizeof lanes);
        for (size_t l = 0; l < sizeof(V) / 4; ++l)
            for (int q = 0; q < 4; ++q) lanes[l] += uint32_t(int32_t(u[4 * l + q]) * s[4 * l + q]);
        std::memcpy(&acc, lanes, sizeof lanes);
        return acc;
    }
};
"""

X86 = pytest.mark.skipif(cpu_isa.host_machine() != "x86_64", reason="x86 micro-kernels")


@X86
@pytest.mark.parametrize("variant", ["regular", "stream_k"])
def test_vnni_panels_with_an_emulated_vpdpbusd(variant, tmp_path, rng):
    """DotU8S8's own packing (B + 128, A's row offsets after each sliver,
    partial k groups) and its accumulator wrapping on the way, checked on
    every x86 machine: its kernel source with the instruction emulated."""
    library, config = emulated(tmp_path, variant, "int8", "EmulatedDotU8S8", EMULATED_VNNI)
    check_emulated(library, config, variant, int8_cases(rng))


# AMX's eight tiles (16 rows x 64 bytes) per thread, and its two products:
# tdpbf16ps (float32 += pairs of bf16) and tdpbssd (int32 += quadruples of
# signed bytes, modulo 2^32).
EMULATED_AMX = """
struct EmulatedTiles {
    static inline thread_local unsigned char tile[8][16][64];
    static void configure() {}
    static void release() {}
    static void load(int t, const void* p, size_t stride) {
        for (int r = 0; r < 16; ++r) std::memcpy(tile[t][r], static_cast<const char*>(p) + r * stride, 64);
    }
    static void store(int t, void* p, size_t stride) {
        for (int r = 0; r < 16; ++r) std::memcpy(static_cast<char*>(p) + r * stride, tile[t][r], 64);
    }
    static void load_acc(const void* c, size_t stride) {
        const char* p = static_cast<const char*>(c);
        load(0, p, stride), load(1, p + 64, stride), load(2, p + 16 * stride, stride);
        load(3, p + 16 * stride + 64, stride);
    }
    static void zero_acc() { std::memset(tile, 0, 4 * sizeof tile[0]); }
    static void store_acc(void* c, size_t stride) {
        char* p = static_cast<char*>(c);
        store(0, p, stride), store(1, p + 64, stride), store(2, p + 16 * stride, stride);
        store(3, p + 16 * stride + 64, stride);
    }
    template <class Dot>
    static void multiply(const void* a, size_t a_stride, const void* b, size_t b_stride, Dot dot) {
        load(4, a, a_stride), load(5, static_cast<const char*>(a) + 16 * a_stride, a_stride);
        load(6, b, b_stride), load(7, static_cast<const char*>(b) + 64, b_stride);
        const int products[4][3] = {{0, 4, 6}, {1, 4, 7}, {2, 5, 6}, {3, 5, 7}};
        for (const auto& p : products)
            for (int m = 0; m < 16; ++m)
                for (int n = 0; n < 16; ++n) dot(tile[p[0]][m] + 4 * n, tile[p[1]][m], tile[p[2]], n);
    }
};

struct EmulatedTileBf16 : dcpu::TilePanelsBf16, EmulatedTiles {
    static float value(const unsigned char* p) {
        uint32_t bits = uint32_t(p[0] | p[1] << 8) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
    }
    static void multiply(const void* a, size_t a_stride, const void* b, size_t b_stride) {
        EmulatedTiles::multiply(a, a_stride, b, b_stride,
                                [](unsigned char* c, const unsigned char* arow, unsigned char (*bt)[64], int n) {
            float acc;
            std::memcpy(&acc, c, 4);
            for (int k = 0; k < 16; ++k)
                for (int q = 0; q < 2; ++q) acc += value(arow + 4 * k + 2 * q) * value(bt[k] + 4 * n + 2 * q);
            std::memcpy(c, &acc, 4);
        });
    }
};

struct EmulatedTileS8 : dcpu::TilePanelsS8, EmulatedTiles {
    static void multiply(const void* a, size_t a_stride, const void* b, size_t b_stride) {
        EmulatedTiles::multiply(a, a_stride, b, b_stride,
                                [](unsigned char* c, const unsigned char* arow, unsigned char (*bt)[64], int n) {
            uint32_t acc;
            std::memcpy(&acc, c, 4);
            for (int k = 0; k < 16; ++k)
                for (int q = 0; q < 4; ++q)
                    acc += uint32_t(int32_t(int8_t(arow[4 * k + q])) * int8_t(bt[k][4 * n + q]));
            std::memcpy(c, &acc, 4);
        });
    }
};
"""


@X86
@pytest.mark.parametrize("dtype, policy, variant", [
    ("bf16", "EmulatedTileBf16", "regular"), ("bf16", "EmulatedTileBf16", "stream_k"),
    ("fp8_e5m2", "EmulatedTileBf16", "regular"),
    ("int8", "EmulatedTileS8", "regular"), ("int8", "EmulatedTileS8", "stream_k")])
def test_amx_panels_and_tiles_with_emulated_tile_instructions(dtype, policy, variant, tmp_path, rng):
    """The AMX micro-kernel and its panels (A's 64-byte tile rows, B's pairs
    or quadruples, K blocks padded to whole tiles, 32x32 blocks in 2x2
    accumulator tiles, partial blocks, stream-K partials), checked on every
    x86 machine with the tile instructions emulated: what the Xeon's AMX
    adds is only the instructions themselves."""
    library, config = emulated(tmp_path, variant, dtype, policy, EMULATED_AMX, **TILE_OF_TILES,
                               micro_m=32, micro_n=32)
    cases = int8_cases(rng) if dtype == "int8" else [
        (full_range(m, k, dtype, "r", rng), full_range(k, n, dtype, "r", rng)) for m, n, k in SHAPES]
    check_emulated(library, config, variant, cases)


# The bf16 and int8 kernels the Xeon's benchmark selects (cpu_gemm.py's
# default selection, 16 threads): AMX, 96x256x256 block tiles. Its bf16
# 1024^3 child died in malloc ("invalid next size (unsorted)"), a heap
# corruption; these runs check that no AMX kernel writes outside its
# buffers: the output between guards, each per-thread buffer (packed A and
# B panels, block accumulator) between guard bytes (tile_gemm.hpp's
# DCPU_GUARD_BYTES), 16 workers (B panels cached, partial edge blocks,
# several K blocks with a partial one). Natively where this machine has
# AMX (also the benchmark's 1024^3), else with the tile instructions
# emulated (same addresses, same bytes).
AMX_KERNELS = {"bf16": ("avx512+amxbf16", "EmulatedTileBf16"), "int8": ("avx512+amxint8", "EmulatedTileS8")}
BENCH_TILE = dict(tile_m=96, tile_n=256, tile_k=256, micro_m=32, micro_n=32)
GUARD_BYTES = 4096
AMX_WORKERS = 16


def amx_library(tmp_path, variant, dtype, flags=()):
    """(library, config, native): `dtype`'s AMX kernel of BENCH_TILE, built
    with `flags`: the real one where this machine runs it, else emulated."""
    spec, policy = AMX_KERNELS[dtype]
    if cpu_isa.why_not_runnable(cpu_isa.get(spec)) is not None:
        return (*emulated(tmp_path, variant, dtype, policy, EMULATED_AMX, flags, **BENCH_TILE), False)
    config = dispatcher.KernelConfig.create(variant=variant, dtype=dtype, layout=LAYOUTS[variant] + "r",
                                            isa=spec, **BENCH_TILE, **variant_options(variant, dtype))
    assert config.target_params["isa"] == spec
    source = get_manager().hook.dispatcher_codegen(config=config, target=CPU)
    (name, text), = source.files
    (tmp_path / name).write_text(text)
    CPU.toolchain(config).compile(tmp_path / name, tmp_path / "kernel.so", (*source.flags, *flags))
    return Library(tmp_path / "kernel.so", expected_name=config.name, config=config), config, True


def run_between_guards(library, config, variant, a, b, workers):
    """`library` on a @ b into an output with poisoned guards on both sides:
    (out, the guards' bytes changed)."""
    m, n = a.shape[0], b.shape[1]
    out_type = dtypes.output_for(config.dtype_a).numpy
    margin = GUARD_BYTES // out_type.itemsize
    whole = poison(np.empty(m * n + 2 * margin, out_type))
    before = whole.view(np.uint8).copy()
    out = whole[margin:margin + m * n].reshape(m, n)
    problem, operands, _ = prepare_gemm(a, b, variant=variant, allocate=lambda *_: out)
    dispatcher.api.default_dispatcher().launch(library, problem, operands, {"workers": workers})
    guards = np.r_[0:GUARD_BYTES, before.size - GUARD_BYTES:before.size]
    return out, int(np.count_nonzero(whole.view(np.uint8)[guards] != before[guards]))


@X86
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
@pytest.mark.parametrize("variant", ["regular", "stream_k"])
def test_amx_kernels_write_only_inside_their_buffers(dtype, variant, tmp_path, rng):
    library, config, native = amx_library(tmp_path, variant, dtype, (f"-DDCPU_GUARD_BYTES={GUARD_BYTES}",))
    shapes = [(257, 1031, 600), (1024, 1024, 1024)] if native else [(257, 1031, 600)]
    for m, n, k in shapes:
        a, b = full_range(m, k, dtype, LAYOUTS[variant][0], rng), full_range(k, n, dtype, LAYOUTS[variant][1], rng)
        out, changed = run_between_guards(library, config, variant, a, b, AMX_WORKERS)  # KernelError: a buffer's guards
        assert changed == 0, f"{config.name} wrote {changed} bytes beside its output ({m}x{n}x{k})"
        if dtype == "int8":
            np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))
        else:
            assert max_rel(out, reference(a, b)) <= tolerance(config, k), (m, n, k)


GUARD_CHECK = r"""
#include "cpu/tile_gemm.hpp"
#include <cstdio>
int main() {
    const long offsets[] = {0, 99, 100, 127, 128, 4223, -1, -4096};  // into a 100-byte buffer
    for (long at : offsets) {
        auto* p = static_cast<unsigned char*>(dcpu::aligned_buffer(100));
        p[at] ^= 1;
        try {
            dcpu::check_guards(p, 100, "test");
            std::printf("%ld ok\n", at);
        } catch (const std::exception& e) {
            std::printf("%ld %s\n", at, e.what());
        }
        dcpu::AlignedFree()(p);
    }
}
"""


def test_the_guards_catch_a_write_beside_a_buffer(tmp_path):
    """The guards themselves (DCPU_GUARD_BYTES 4096, a 100-byte buffer):
    a write into the buffer passes, one past its end or before its start,
    within the guards, is an error naming the buffer and how far off."""
    tc = CPU.toolchain(dispatcher.KernelConfig.create(isa=cpu_isa.supported()[-1].name, **TILE))
    (tmp_path / "guards.cpp").write_text(GUARD_CHECK)
    flags = [f for f in tc.flags if f not in ("-shared", "-fvisibility=hidden")]
    subprocess.run([tc.compiler, *flags, f"-DDCPU_GUARD_BYTES={GUARD_BYTES}", str(tmp_path / "guards.cpp"),
                    "-o", str(tmp_path / "guards")], check=True)
    lines = subprocess.run([str(tmp_path / "guards")], capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines == ["0 ok", "99 ok",
                     "100 dcpu: the test buffer (100 bytes) was written 1 bytes past its end",
                     "127 dcpu: the test buffer (100 bytes) was written 28 bytes past its end",
                     "128 dcpu: the test buffer (100 bytes) was written 29 bytes past its end",
                     "4223 dcpu: the test buffer (100 bytes) was written 4124 bytes past its end",
                     "-1 dcpu: the test buffer was written 1 bytes before its start",
                     "-4096 dcpu: the test buffer was written 4096 bytes before its start"]


# A driver that runs one kernel's source as a program: M x N x K of bytes
# 0x3f (bf16 0.74, int8 63) on `workers` threads.
ASAN_DRIVER = r"""
#include <cstdio>
#include <vector>
extern "C" int64_t dispatcher_workspace_size(const dispatcher_gemm_args*) __attribute__((weak));
int main(int argc, char** argv) {
    const int64_t m = atol(argv[1]), n = atol(argv[2]), k = atol(argv[3]);
    std::vector<unsigned char> a(m * k * sizeof(KernelTraits::A::storage), 0x3f),
        b(k * n * sizeof(KernelTraits::B::storage), 0x3f), c(m * n * sizeof(KernelTraits::C::storage));
    dispatcher_gemm_args args{};
    args.a = a.data(), args.b = b.data(), args.c = c.data(), args.m = m, args.n = n, args.k = k;
    args.lda = KernelTraits::a_row ? k : m, args.ldb = KernelTraits::b_row ? n : k, args.ldc = n;
    args.alpha = 1.0, args.workers = atoi(argv[4]);
    std::vector<unsigned char> workspace(dispatcher_workspace_size ? dispatcher_workspace_size(&args) : 0);
    args.workspace = workspace.data(), args.workspace_bytes = int64_t(workspace.size());
    const int status = dispatcher_run_gemm(&args);
    std::printf("status %d %s\n", status, dispatcher_last_error());
    return status;
}
"""


@X86
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
@pytest.mark.parametrize("variant", ["regular", "stream_k"])
def test_emulated_amx_kernels_under_address_sanitizer(dtype, variant, tmp_path):
    """The AMX kernels of the benchmark's tiles, their tile instructions
    emulated (plain loads and stores of the same bytes), built as a program
    with AddressSanitizer: any read or write outside a buffer (the kernel's
    or the program's) stops it with a report."""
    config, source, text = emulated_source(variant, dtype, AMX_KERNELS[dtype][1], EMULATED_AMX, **BENCH_TILE)
    (tmp_path / "kernel.cpp").write_text(text + ASAN_DRIVER)
    tc = CPU.toolchain(config)
    flags = [f for f in tc.flags if f not in ("-shared", "-O3")]
    build = subprocess.run([tc.compiler, *flags, *source.flags, "-O1", "-g", "-fsanitize=address",
                            "-fno-omit-frame-pointer", str(tmp_path / "kernel.cpp"), "-o", str(tmp_path / "kernel")],
                           capture_output=True, text=True)
    if build.returncode and "asan" in build.stderr.lower():
        pytest.skip(f"no AddressSanitizer runtime: {build.stderr.strip().splitlines()[-1]}")
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(tmp_path / "kernel"), "257", "1031", "600", str(AMX_WORKERS)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.startswith("status 0"), run.stdout + run.stderr[-3000:]
