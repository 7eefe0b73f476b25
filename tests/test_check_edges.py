"""Every bounded input check, exactly at its limit (accepted, and computed
right) and exactly one past it (refused, with its specific error, before
anything is built). benchmarks/mutation_checks.py moves each boundary of
these checks by one, both ways, and runs this file first: every such
mutant must fail a test here (benchmarks/results/mutation_checks.json).
"""

import argparse

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import dispatcher
from dispatcher import errors
from dispatcher.api import Dispatcher
from dispatcher.cli import _at_least, _groups
from dispatcher.config import MAX_TILE, KernelConfig
from dispatcher.plugins import get_manager
from dispatcher.kinds import prepare_gemm
from dispatcher.records import MAX_WORKERS, resolve_launch_options
from dispatcher.targets import cpu_isa
from dispatcher.targets.cpu import CPU
from dispatcher.tile_engine import problems, sweep

SMALL = dict(tile_m=24, tile_n=64, tile_k=32)


def rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def ref(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def close(out, expected):
    return out.shape == expected.shape and np.allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.fixture
def no_build(monkeypatch):
    """A refusal must come before any kernel is built."""
    monkeypatch.setattr(Dispatcher, "library", lambda *a, **k: pytest.fail("a kernel was built"))


# ------------------------------------------------------- grouped_mm offsets
def experts(offsets, rows=12, k=8, n=16):
    return rand(rows, k), rand(len(offsets), k, n, seed=1), np.array(offsets, np.int32)


def stacked_reference(a, b, offsets):
    out, start = np.zeros((a.shape[0], b.shape[2])), 0
    for g, end in enumerate(offsets):
        out[start:end] = ref(a[start:end], b[g])
        start = end
    return out


@pytest.mark.parametrize("offsets", [[3, 3, 12], [0, 5, 12], [12, 12, 12]],
                         ids=["empty-group", "zero-first", "all-last"])
def test_offsets_at_their_limits_are_computed(offsets):
    """The last offset at exactly total_M, an empty group (a step of 0),
    a first offset of exactly 0."""
    a, b, o = experts(offsets)
    assert close(dispatcher.grouped_mm(a, b, o, config=SMALL), stacked_reference(a, b, o))


@pytest.mark.parametrize("offsets, match", [
    ([3, 4, 13], r"offsets\[2\] = 13 exceeds a's 12 rows"),    # one past total_M
    ([12, 12, 13], r"offsets\[2\] = 13 exceeds a's 12 rows"),  # the first offset past it is named
    ([-1, 4, 12], r"offsets\[0\] = -1 is smaller than 0"),     # one below 0
    ([3, 2, 12], r"offsets\[1\] = 2 is smaller than 3"),       # one step down
], ids=["past-total-m", "first-past-named", "below-zero", "step-down"])
def test_offsets_one_past_their_limits_are_refused_before_any_build(offsets, match, no_build):
    with pytest.raises(errors.ProblemError, match=match):
        dispatcher.grouped_mm(*experts(offsets))


def test_grouped_mm_groups_zero_elements_apart_are_one_weight():
    """b's group stride at its limit, 0 (one weight broadcast to every
    group), runs; one element below it (an int8 b reversed over groups,
    stride -1 byte) is refused."""
    a, w, o = experts([4, 9, 12])
    b = np.broadcast_to(w[:1], w.shape)
    assert b.strides[0] == 0
    assert close(dispatcher.grouped_mm(a, b, o, config=SMALL), stacked_reference(a, b, o))
    reversed_b = np.ones((2, 1, 1), np.int8)[::-1]
    assert reversed_b.strides[0] == -1
    with pytest.raises(errors.LayoutError, match="non-negative whole number of elements"):
        dispatcher.grouped_mm(np.ones((2, 1), np.int8), reversed_b, np.array([1, 2], np.int32))


# --------------------------------------------------------- int8 K bound
def test_int8_k_at_its_bound_is_exact():
    """K = 131071 with every product at its largest, (-128)^2: the int32
    accumulator holds 131071 * 16384 = 2^31 - 16384 exactly."""
    k = 131071
    a, b = np.full((1, k), -128, np.int8), np.full((k, 2), -128, np.int8)
    out = dispatcher.gemm(a, b, config=SMALL)
    assert out.dtype == np.int32 and np.array_equal(out, np.full((1, 2), k * 16384, np.int32))


@pytest.mark.parametrize("call", [
    lambda a, b: dispatcher.gemm(a, b),
    lambda a, b: dispatcher.grouped_gemm([a], [b]),
    lambda a, b: dispatcher.grouped_mm(a, b[None], np.array([1], np.int32)),
    lambda a, b: dispatcher.matmul(a[None], b),
], ids=["gemm", "grouped_gemm", "grouped_mm", "matmul"])
def test_int8_k_one_past_its_bound_is_refused(call, no_build):
    k = 131072
    with pytest.raises(errors.ProblemError, match="K = 131072 is too deep for int8"):
        call(np.ones((1, k), np.int8), np.ones((k, 1), np.int8))


# ------------------------------------------------------------------ tiles
@pytest.mark.parametrize("field", ["tile_m", "tile_n", "tile_k"])
def test_tile_sizes_at_and_past_their_limits(field):
    for ok in (1, MAX_TILE):
        assert getattr(KernelConfig.create(**{**SMALL, field: ok}), field) == ok
    for bad in (0, MAX_TILE + 1):
        with pytest.raises(errors.ConfigError, match=f"{field} must be a positive integer at most {MAX_TILE}"):
            KernelConfig.create(**{**SMALL, field: bad})


def test_micro_tile_register_bound():
    """avx2 has 16 vector registers: a 14x8 micro-tile needs 14 + 1 + 1 =
    16 (accepted), 15x8 needs 17 (refused); avx512's 32: 30x16 and 31x16."""
    for isa, fits, over in (("avx2", (14, 8), (15, 8)), ("avx512", (30, 16), (31, 16))):
        spec = cpu_isa.get(isa).isa  # the base ISA: its vector registers
        assert spec.registers_needed(*fits) == spec.registers and spec.micro_tile_problem(*fits) is None
        assert f"needs {spec.registers + 1} vector registers" in spec.micro_tile_problem(*over)


# ------------------------------------------------- options and workers
@pytest.mark.parametrize("field", ["micro_m", "micro_n", "threads"])
def test_cpu_block_options_at_and_past_their_range(field):
    option = {o.name: o for o in CPU.options}[field]
    for ok in (option.low, option.high):
        assert KernelConfig.create(**{**SMALL, field: ok}).target_params[field] == ok
    for bad in (option.low - 1, option.high + 1):
        with pytest.raises(errors.ConfigError, match=rf"{field}' = {bad} is out of range"):
            KernelConfig.create(**{**SMALL, field: bad})


@pytest.mark.parametrize("variant", ["regular", "stream_k"])
def test_workers_at_and_past_their_range(variant, no_build):
    record = get_manager().variant(variant)
    for ok in (0, MAX_WORKERS):
        assert resolve_launch_options(record, {"workers": ok})["workers"] == ok
    for bad in (-1, MAX_WORKERS + 1):
        with pytest.raises(errors.ConfigError, match=rf"'workers' = {bad} is out of range \[0, {MAX_WORKERS}\]"):
            dispatcher.gemm(rand(3, 4), rand(4, 5), variant=variant, options={"workers": bad})


# ---------------------------------------------------------------- strides
def view(base, shape, strides):
    """A view of `base`'s memory with element strides (not bytes)."""
    return as_strided(base, shape, tuple(s * base.itemsize for s in strides), writeable=False)


@pytest.mark.parametrize("transpose", [False, True])
def test_leading_dimension_at_and_one_below_its_limit(transpose):
    """A 2-row view whose rows are exactly `cols` apart (leading dim = cols)
    or padded runs; rows `cols - 1` apart overlap and are refused. The
    transposes check the column-major rule alike."""
    t = (lambda x: x.T) if transpose else (lambda x: x)
    base = rand(64)
    b = rand(4, 3) if not transpose else rand(2, 3)
    for ld in (4, 8):
        a = t(view(base, (2, 4), (ld, 1)))
        assert close(dispatcher.gemm(a, b[:a.shape[1]], config=SMALL), ref(a, b[:a.shape[1]]))
    with pytest.raises(errors.LayoutError, match="neither row- nor column-major"):
        dispatcher.gemm(t(view(base, (2, 4), (3, 1))), b[:2 if transpose else 4])


@pytest.mark.parametrize("transpose", [False, True])
def test_inner_stride_two_is_refused_even_for_two_columns(transpose):
    t = (lambda x: x.T) if transpose else (lambda x: x)
    a = t(view(rand(64), (3, 2), (4, 2)))
    with pytest.raises(errors.LayoutError, match="neither row- nor column-major"):
        dispatcher.gemm(a, rand(a.shape[1], 5))


def test_a_single_column_or_row_has_no_inner_stride_rule():
    """One column with any column step, one row with any row step (a
    broadcast row of stride 0 included) is read in place."""
    column = rand(3, 8)[:, ::8]          # (3, 1), strides (32, 32)
    row = np.broadcast_to(rand(1, 5), (1, 5))  # (1, 5), strides (0, 4)
    b = rand(1, 5)
    assert close(dispatcher.gemm(column, b, config=SMALL), ref(column, b))
    c = rand(5, 3)
    assert close(dispatcher.gemm(row, c, config=SMALL), ref(row, c))
    assert prepare_gemm(row, c)[0].layout[0] == "r"


def test_prepared_operands_keep_the_arrays_they_point_at_alive():
    """`prepare_gemm`'s argument blocks address their arrays by pointer; they
    hold the arrays too. benchmarks/cpu_gemm.py kept the operands and dropped
    the result (`problem, operands, _ = prepare_gemm(...)`), so every launch
    wrote C into freed memory: the Xeon's bf16 child died in malloc
    ("invalid next size (unsorted)"), a 64x64x64 one here by SIGSEGV."""
    import gc
    import weakref

    from dispatcher.library import gemm_args

    a, b = rand(37, 53), rand(53, 71)
    problem, operands, out = prepare_gemm(a, b)
    alive = weakref.ref(out)
    del out, a, b
    gc.collect()
    assert alive() is not None, "the operands let go of the result they write"
    d = Dispatcher(tuning=None)
    library = d.library(d.config_matching(problem, SMALL))
    for _ in range(3):  # the benchmark's pattern: launches, allocations between them
        junk = [np.ones(37 * 71, np.float32) for _ in range(8)]
        d.launch(library, problem, operands)
        del junk
    a, b, result = operands.owners
    assert close(result, ref(a, b))
    args = gemm_args(operands)  # the ABI struct holds them as well
    del operands, a, b, result
    gc.collect()
    assert alive() is not None
    del args
    gc.collect()
    assert alive() is None


def test_single_rows_and_columns_join_groups_of_either_layout():
    """A group's single row or column reads as row- and as column-major, so
    it joins groups of either layout: a vector as A's row (`v[None, :]`,
    row stride 0) among row-major groups, a row of a row-major matrix among
    column-major ones; a vector as B's column (`v[:, None]`, column stride
    0) among column-major groups, a column of a column-major matrix among
    row-major ones."""
    k, n = 6, 5
    v = rand(k, seed=3)
    for a_groups, b_groups in (([rand(4, k), v[None, :]], [np.asfortranarray(rand(k, n)), v[:, None]]),
                               ([np.asfortranarray(rand(4, k)), rand(3, k)[:1]],
                                [rand(k, n), np.asfortranarray(rand(k, 3))[:, :1]])):
        outs = dispatcher.grouped_gemm(a_groups, b_groups, config=SMALL)
        for out, a, b in zip(outs, a_groups, b_groups):
            assert close(out, ref(a, b))


def test_negative_strides_of_one_byte_are_named():
    """int8 reversed views whose stride is exactly -1 byte, on either axis."""
    column, row = np.ones((3, 1), np.int8)[::-1], np.ones((1, 3), np.int8)[:, ::-1]
    assert column.strides[0] == -1 and row.strides[1] == -1
    for a, b in ((column, np.ones((1, 2), np.int8)), (row, np.ones((3, 2), np.int8)),
                 (np.ones((2, 3), np.int8), column)):
        with pytest.raises(errors.LayoutError, match="negative strides"):
            dispatcher.gemm(a, b)


def test_declared_kinds_refuse_a_one_byte_negative_stride():
    with pytest.raises(errors.LayoutError, match="negative strides"):
        dispatcher.matmul(np.ones((2, 3, 1), np.int8)[:, ::-1], np.ones((1, 2), np.int8))


# ------------------------------------------------- declared problem kinds
def test_batched_operands_at_their_rank_limits(no_build):
    """A 1-D `a` is not a matrix (dispatcher.run takes 2-D and up); an extra
    operand may carry exactly the call's batch dims, not one more."""
    with pytest.raises(errors.ProblemError, match="takes a batched matrix a"):
        dispatcher.run("batched", a=rand(4), b=rand(4, 5))
    with pytest.raises(errors.ProblemError, match="more than the call's"):
        dispatcher.matmul(rand(2, 3, 4), rand(4, 5), bias=rand(1, 2, 1, 5))


def test_batched_bias_with_the_calls_batch_dims_and_a_vector_bias():
    a, b = rand(2, 3, 4), rand(4, 5, seed=1)
    for bias in (rand(2, 1, 5, seed=2), rand(5, seed=2)):
        out = dispatcher.matmul(a, b, bias=bias, config=SMALL)
        assert close(out, ref(a, b) + bias)


def test_out_batch_dims_of_stride_zero():
    """A size-1 batch dim of out may have stride 0 (nothing overlaps); a
    size-2 one may not (both batches would write one matrix)."""
    a, b = rand(1, 3, 4), rand(4, 5, seed=1)
    out = as_strided(np.empty((3, 5), np.float32), (1, 3, 5), (0, 20, 4))
    dispatcher.matmul(a, b, out=out, config=SMALL)
    assert close(out, ref(a, b))
    shared = as_strided(np.empty((3, 5), np.float32), (2, 3, 5), (0, 20, 4))
    with pytest.raises(errors.ProblemError, match="broadcast \\(stride 0\\) batch dim"):
        dispatcher.matmul(rand(2, 3, 4), b, out=shared)


# -------------------------------------------------- sweeps, problems, CLI
def test_sweep_step_at_and_below_its_limit():
    assert sweep.axis_values("tile_m", {"min": 24, "max": 26, "step": 1}) == [24, 25, 26]
    with pytest.raises(errors.ConfigError, match="step >= 1"):
        sweep.axis_values("tile_m", {"min": 24, "max": 26, "step": 0})


def test_problem_file_sizes_at_and_below_their_limits():
    assert problems.load([[1, 1, 1]], "gemm") == [(1, 1, 1)]
    assert problems.load([{"groups": [[0, 0, 0]]}], "grouped") == [((0, 0, 0),)]
    with pytest.raises(errors.ProblemError, match="three positive integers"):
        problems.load([[1, 0, 1]], "gemm")
    with pytest.raises(errors.ProblemError, match=r"\[M, N, K\] >= 0"):
        problems.load([{"groups": [[0, -1, 0]]}], "grouped")


def test_cli_numbers_at_and_below_their_limits():
    assert _at_least(1)("1") == 1 and _at_least(0)("0") == 0
    assert _at_least(0.1, float)("0.1") == 0.1
    for parse, bad in ((_at_least(1), "0"), (_at_least(0), "-1"), (_at_least(0.1, float), "0.09")):
        with pytest.raises(argparse.ArgumentTypeError, match="must be >="):
            parse(bad)
    assert _groups("0x0x0,1x2x3") == [(0, 0, 0), (1, 2, 3)]
    with pytest.raises(argparse.ArgumentTypeError, match="sizes >= 0"):
        _groups("1x-1x3")


# ---------------------------------------------------------- CUDA alignment
_STAGING_DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "cuda/staging.hpp"
struct Fp16Rrr { using ElementA = short; using ElementB = short; using ElementC = short;
                 static constexpr bool kARow = true, kBRow = true, kCRow = true; };
int main(int argc, char** argv) {  // k lda a_offset_bytes: A (8, k) fp16, B (k, 8), C (8, 8)
    const long k = atol(argv[1]), lda = atol(argv[2]), off = atol(argv[3]);
    dispatcher_gemm_args a{};
    a.a = reinterpret_cast<const void*>(1024 + off); a.b = reinterpret_cast<const void*>(4096);
    a.c = reinterpret_cast<void*>(8192);
    a.m = 8, a.n = 8, a.k = k, a.lda = lda, a.ldb = 8, a.ldc = 8;
    if (argc > 4) {  // a bias of strides (0, 0) fused along N: N = 1 ("bias") or N = 8 ("broadcast")
        dispatcher_operand bias{reinterpret_cast<const void*>(12288), 0, 0, 0};
        if (argv[4][0] == 'b' && argv[4][1] == 'i') a.n = 1, a.ldb = 1, a.ldc = 1;
        a.extra = &bias, a.extra_count = 1;
        dcuda::Staging s = dcuda::staging_of<Fp16Rrr, true, false>(&a);
        const long step = s.moves_in ? long(s.in[s.moves_in - 1].from.step) : -1;  // the bias is staged last
        const dispatcher_gemm_args body = s.bound(reinterpret_cast<void*>(4096));
        printf("%d %d %d %d %ld %d %ld\n", s.staged_a, s.staged_b, s.staged_c, s.staged_bias, long(body.n),
               int(dcuda::bias_contiguous(&body, false)), step);
        return 0;
    }
    const dcuda::Staging s = dcuda::staging_of<Fp16Rrr, false, false>(&a);
    printf("%d %d %d %ld %ld\n", s.staged_a, s.staged_b, s.staged_c, long(s.args.k), long(s.args.lda));
}
"""


def test_cuda_staging_at_and_one_past_16_bytes(tmp_path):
    """TMA needs 16-byte addresses, row pitches and contiguous extents, so
    the CUDA kernels stage what breaks that rule (native/cuda/staging.hpp,
    plain C++ compiled here, no GPU): an fp16 row-major A with K = 8 (16
    bytes) at an aligned address is read in place; a pitch of 18 bytes or an
    address 2 bytes off stages A alone; K = 9 pads K to 16, so B as well; a
    bias of one value (strides 0) is read as a contiguous vector."""
    import subprocess
    from pathlib import Path

    from dispatcher.targets.cpu import Toolchain
    native = Path(dispatcher.__file__).parent / "native"
    (tmp_path / "drive.cpp").write_text(_STAGING_DRIVER)
    exe = tmp_path / "drive"
    subprocess.run([Toolchain.find(cpu_isa.active().name).compiler, "-std=c++17", f"-I{native}", str(tmp_path / "drive.cpp"), "-o", str(exe)],
                   check=True, capture_output=True, timeout=120)

    def staged(k, lda, offset, *mode):
        done = subprocess.run([str(exe), str(k), str(lda), str(offset), *mode], capture_output=True, text=True,
                              check=True, timeout=30)
        return tuple(int(x) for x in done.stdout.split())

    assert staged(8, 8, 0) == (0, 0, 0, 8, 8)    # (A, B, C staged, K run, lda run)
    assert staged(8, 9, 0) == (1, 0, 0, 8, 8)    # pitch 18 bytes: A copied with pitch 16
    assert staged(8, 8, 2) == (1, 0, 0, 8, 8)    # address 2 bytes off
    assert staged(8, 8, 16) == (0, 0, 0, 8, 8)   # the next aligned address
    assert staged(9, 16, 0) == (1, 1, 0, 16, 16)  # K = 9: both inputs padded to K = 16
    assert staged(16, 16, 0) == (0, 0, 0, 16, 16)
    # A bias of strides (0, 0) fused along N, as the block the kernel gets
    # (bound, as the size query binds it too) has it: (A, B, C, bias staged,
    # N run, bias contiguous, the bias copy's source step). A Linear(d, 1)'s:
    # one value, N padded to 8, staged as a contiguous vector of 8.
    assert staged(8, 8, 0, "bias") == (0, 1, 1, 1, 8, 1, 1)
    # One value broadcast over N = 8: staged as a vector of that value (step 0).
    assert staged(8, 8, 0, "broadcast") == (0, 0, 0, 1, 8, 1, 0)
