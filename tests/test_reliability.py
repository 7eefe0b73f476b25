"""Issue 13: inputs that killed the process, wrote past a buffer or returned a
wrong answer, and plain Python errors where a `DispatcherError` belongs.

Calls that crashed the interpreter before the fix run in a child process, so
a regression fails this test instead of killing the test run. Outputs are
poisoned before every launch and values are checked against a float64
reference on the same inputs.
"""

import ast
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dispatcher
from dispatcher import errors
from dispatcher.verify import max_rel, poison, random_matrix, reference

SMALL = dict(tile_m=24, tile_n=64, tile_k=32)
INT32 = np.iinfo(np.int32)


def f32(*shape):
    return np.ones(shape, np.float32)


def as_int32(values):
    """The documented int32 rule: round half to even, saturate."""
    return np.clip(np.rint(values), INT32.min, INT32.max).astype(np.int32)


def guarded(shape, dtype, guard=16):
    """(an output view, the whole poisoned buffer around it): a kernel that
    writes past `out` changes the guard."""
    whole = poison(np.empty(shape[0] * shape[1] + 2 * guard, dtype))
    return whole[guard:guard + shape[0] * shape[1]].reshape(shape), whole


def guard_intact(whole, guard=16):
    rest = np.concatenate([whole[:guard], whole[-guard:]])
    return np.array_equal(rest, poison(rest.copy()), equal_nan=rest.dtype.kind == "f")


def in_child(body: str) -> list:
    """Run `body` in a fresh interpreter (the test's build cache); it prints
    one word per case. A crash fails the test with its signal, not the run."""
    code = "import numpy as np, dispatcher\nfrom dispatcher import errors\n" + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"child died with {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout.split()


# ------------------------------------------------ 1. config dicts are checked
@pytest.mark.parametrize("inputs, fields, field", [
    ("fp32", dict(dtype="fp16"), "dtype_a"),
    ("fp16", dict(dtype_c="fp32"), "dtype_c"),
    ("fp32", dict(layout="rcr"), "layout"),
    ("fp32", dict(variant="stream_k"), "variant"),
    ("fp32", dict(target="cuda"), "target|unknown target"),
])
def test_config_dict_that_disagrees_with_the_problem_is_refused(inputs, fields, field, rng):
    a = random_matrix(5, 7, inputs, "r", rng)
    b = random_matrix(7, 9, inputs, "r", rng)  # row-major: layout rrr
    out, whole = guarded((5, 9), a.dtype)
    with pytest.raises(errors.ConfigError, match=field):
        dispatcher.gemm(a, b, out=out, config={**SMALL, **fields})
    assert guard_intact(whole) and np.isnan(out.astype(np.float32)).all()


def test_config_dict_that_agrees_with_the_problem_runs(rng):
    a = random_matrix(5, 7, "fp16", "r", rng)
    b = random_matrix(7, 9, "fp16", "c", rng)
    out, whole = guarded((5, 9), np.float32)
    fields = dict(SMALL, dtype="fp16", dtype_c="fp32", layout="rcr", variant="regular", target="cpu")
    dispatcher.gemm(a, b, out=out, config=fields)
    assert max_rel(out, reference(a, b)) <= 1e-6 and guard_intact(whole)


# ------------------------------------------- 3. sizes bounded before native
def test_worker_counts_are_bounded_before_any_native_call():
    got = in_child("""
        a = np.ones((64, 64), np.float32)
        for variant in ("regular", "stream_k"):
            for workers in (100000, 40000, 1025, -1, 2**40):
                try:
                    dispatcher.gemm(a, a, variant=variant, options={"workers": workers})
                    print("accepted")
                except errors.ConfigError as e:
                    print("ConfigError" if "[0, 1024]" in str(e) else "unclear")
    """)
    assert got == ["ConfigError"] * 10


def test_tile_sizes_are_bounded_before_any_native_call():
    got = in_child("""
        a = np.ones((64, 64), np.float32)
        for tiles in (dict(tile_m=96000, tile_n=96000), dict(tile_m=10**9, tile_n=10**9),
                      dict(tile_k=2**31), dict(tile_m=4098)):
            try:
                dispatcher.gemm(a, a, config=dict(dict(tile_m=24, tile_n=64, tile_k=32), **tiles))
                print("accepted")
            except errors.ConfigError as e:
                print("ConfigError" if "4096" in str(e) else "unclear")
    """)
    assert got == ["ConfigError"] * 4


def test_largest_tiles_and_workers_run(rng):
    a = random_matrix(30, 40, "fp32", "r", rng)
    b = random_matrix(40, 20, "fp32", "r", rng)
    out = poison(np.empty((30, 20), np.float32))
    dispatcher.gemm(a, b, out=out, config=dict(tile_m=4092, tile_n=4096, tile_k=4096),
                    options={"workers": 1024})
    assert max_rel(out, reference(a, b)) <= 1e-6


def test_allocation_failure_in_a_kernel_thread_is_an_error_not_an_abort():
    """A C++ exception in an OpenMP thread used to call std::terminate."""
    got = in_child("""
        import resource
        a = np.ones((64, 64), np.float32)
        dispatcher.gemm(a, a, config=dict(tile_m=24, tile_n=64, tile_k=32))  # threads started
        d = dispatcher.api.default_dispatcher()
        problem, _, _ = dispatcher.kinds.prepare_gemm(a, a)
        big = dict(tile_m=4092, tile_n=4096, tile_k=32)
        d.library(d.config_matching(problem, big))  # built and loaded
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (32 << 20), resource.RLIM_INFINITY))
        try:
            dispatcher.gemm(a, a, config=big)  # a 67 MB block accumulator per thread
            print("ran")
        except errors.KernelError as e:
            print("KernelError" if "alloc" in str(e) else "unclear")
    """)
    assert got == ["KernelError"]


# ----------------------------- 4. stream-K applies alpha once, after reducing
@pytest.mark.parametrize("decomposition", ["stream_k", "hybrid"])
@pytest.mark.parametrize("reduction", ["atomic", "linear", "tree"])
@pytest.mark.parametrize("alpha, beta", [(0.5, 0.0), (1.5, 0.5), (-0.25, 1.0), (3e7 + 0.5, 2.5)])
def test_stream_k_int8_non_integer_alpha(reduction, decomposition, alpha, beta, rng):
    a = random_matrix(30, 300, "int8", "r", rng)
    b = random_matrix(300, 70, "int8", "c", rng)
    c = rng.integers(-1000, 1000, size=(30, 70)).astype(np.int32) | 1  # odd: beta*c has halves
    out = poison(np.empty((30, 70), np.int32))
    config = dict(SMALL, reduction=reduction, decomposition=decomposition)
    dispatcher.gemm(a, b, c=c, out=out, alpha=alpha, beta=beta, variant="stream_k", config=config,
                    options={"workers": 3})
    np.testing.assert_array_equal(out, as_int32(reference(a, b, c, alpha, beta)))


@pytest.mark.parametrize("reduction", ["atomic", "linear", "tree"])
def test_stream_k_fp32_alpha_beta_every_reduction(reduction, rng):
    a = random_matrix(30, 500, "fp32", "c", rng)
    b = random_matrix(500, 70, "fp32", "r", rng)
    c = random_matrix(30, 70, "fp32", "r", rng)
    out = poison(np.empty((30, 70), np.float32))
    config = dict(SMALL, reduction=reduction, decomposition="stream_k")
    dispatcher.gemm(a, b, c=c, out=out, alpha=0.3, beta=-1.5, variant="stream_k", config=config,
                    options={"workers": 3})
    assert max_rel(out, reference(a, b, c, 0.3, -1.5)) <= 1e-5


# ------------------------------------------------------ 5. one int32 rule
def test_k0_int32_rounds_beta_c_as_k1_does():
    c = np.array([[-3, 3, 5, -5, 7, 2**30]], np.int32)
    for beta in (1.3, 0.5, -1.5, 4.0):
        expected = as_int32(beta * c.astype(np.float64))
        k0 = dispatcher.gemm(np.ones((1, 0), np.int8), np.ones((0, 6), np.int8), c=c, beta=beta)
        k1 = dispatcher.gemm(np.zeros((1, 1), np.int8), np.zeros((1, 6), np.int8), c=c, beta=beta,
                             config=SMALL)
        np.testing.assert_array_equal(k0, expected)
        np.testing.assert_array_equal(k1, expected)


def test_int32_epilogue_saturates():
    a = np.full((2, 3), 100, np.int8)
    b = np.full((3, 4), 100, np.int8)
    c = np.full((2, 4), 2**31 - 10, np.int32)
    for alpha, beta in ((1e6, 0.0), (-1e6, 0.0), (1.0, 1.0), (0.0, -3.0)):
        out = poison(np.empty((2, 4), np.int32))
        dispatcher.gemm(a, b, c=c, out=out, alpha=alpha, beta=beta, config=SMALL)
        np.testing.assert_array_equal(out, as_int32(reference(a, b, c, alpha, beta)))


def test_int8_k_is_limited_to_exact_int32_accumulation():
    k = 131071  # every product -128 * -128: the sum is 2**31 - 16384, still exact
    a, b = np.full((1, k), -128, np.int8), np.full((k, 1), -128, np.int8)
    assert dispatcher.gemm(a, b, config=SMALL)[0, 0] == k * 128 * 128
    with pytest.raises(errors.ProblemError, match="131071"):
        dispatcher.gemm(np.ones((1, k + 1), np.int8), np.ones((k + 1, 1), np.int8))
    with pytest.raises(errors.ProblemError, match="131071"):
        dispatcher.grouped_gemm([np.ones((1, k + 1), np.int8)], [np.ones((k + 1, 1), np.int8)])


@pytest.mark.parametrize("alpha, beta", [(float("nan"), 0.0), (1.0, float("inf"))])
def test_int32_output_needs_finite_scalars(alpha, beta):
    c = np.zeros((2, 2), np.int32)
    with pytest.raises(errors.ProblemError, match="finite"):
        dispatcher.gemm(np.ones((2, 2), np.int8), np.ones((2, 2), np.int8), c=c, alpha=alpha, beta=beta)


# -------------------------------------------- 6. c and out: the same memory
@pytest.mark.parametrize("view", [lambda o: o[...], lambda o: o[:, :], lambda o: o.T.T, lambda o: o])
@pytest.mark.parametrize("order", ["C", "F"])
def test_c_may_be_the_same_memory_as_out(view, order, rng):
    a = random_matrix(20, 30, "fp32", "r", rng)
    b = random_matrix(30, 40, "fp32", "c", rng)
    c0 = random_matrix(20, 40, "fp32", "r", rng)
    out = np.array(c0, order=order)
    dispatcher.gemm(a, b, c=view(out), out=out, alpha=2.0, beta=-0.5, config=SMALL)
    assert max_rel(out, reference(a, b, c0, 2.0, -0.5)) <= 1e-5


def test_partial_overlap_of_c_and_out_is_refused():
    whole = f32(5, 5)
    with pytest.raises(errors.AliasingError, match="partially overlaps"):
        dispatcher.gemm(f32(4, 3), f32(3, 5), c=whole[:4], out=whole[1:], beta=1.0)
    with pytest.raises(errors.AliasingError, match="partially overlaps"):
        square = f32(4, 4)
        dispatcher.gemm(f32(4, 3), f32(3, 4), c=square.T, out=square, beta=1.0)


# ------------------------------------------------------ 7. no groups at all
@pytest.mark.parametrize("out_dtype", [None, "int32", "fp16", "bf16"])
def test_zero_groups_return_an_empty_list(out_dtype):
    assert dispatcher.grouped_gemm([], [], out_dtype=out_dtype) == []


def test_zero_groups_still_check_the_output_dtype():
    with pytest.raises(errors.DtypeError, match="dtype int4 is not supported"):
        dispatcher.grouped_gemm([], [], out_dtype="int4")


# --------------------------------------- 8. DispatcherErrors, not builtins
def test_variant_of_the_other_problem_kind():
    with pytest.raises(errors.ConfigError, match="grouped_gemm"):
        dispatcher.gemm(f32(3, 4), f32(4, 5), variant="grouped")
    with pytest.raises(errors.ConfigError, match="dispatcher.gemm"):
        dispatcher.grouped_gemm([f32(3, 4)], [f32(4, 5)], variant="regular")


@pytest.mark.parametrize("call, error, match", [
    (lambda: dispatcher.gemm(None, f32(4, 5)), errors.ProblemError, "a is None"),
    (lambda: dispatcher.gemm(f32(3, 4), None), errors.ProblemError, "b is None"),
    (lambda: dispatcher.grouped_gemm([None], [f32(4, 5)]), errors.ProblemError, r"a\[0\] is None"),
    (lambda: dispatcher.grouped_gemm(None, None), errors.ProblemError, "list of 2-D arrays"),
    (lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), config=[24, 64, 32]), errors.ConfigError,
     "KernelConfig or a dict"),
    (lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), options={"workers": "x"}), errors.ConfigError,
     "'workers' must be an integer"),
    (lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), options=[("workers", 2)]), errors.ConfigError,
     "options must be a dict"),
    (lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), alpha="2"), errors.ProblemError,
     "alpha must be a real number"),
    (lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), c=f32(3, 5), beta=1j), errors.ProblemError,
     "beta must be a real number"),
    (lambda: dispatcher.grouped_gemm([f32(3, 4)], [f32(4, 5)], alpha="2"), errors.ProblemError,
     "alpha must be a real number"),
    (lambda: dispatcher.gemm(f32(3, 4), f32(4, 5), options={"wrkers": 2}), errors.ConfigError,
     "unknown 'regular' launch option.*'wrkers'.*known: stream, workers"),
    (lambda: dispatcher.grouped_gemm([f32(3, 4)], [f32(4, 5)], options={"workers": 2}),
     errors.ConfigError, "unknown 'grouped' launch option.*'workers'"),
])
def test_bad_argument_is_a_dispatcher_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("where", ["a", "b", "c", "out"])
def test_masked_array_is_refused(where):
    arrays = dict(a=f32(3, 4), b=f32(4, 5), c=f32(3, 5), out=poison(f32(3, 5)))
    arrays[where] = np.ma.masked_array(arrays[where], mask=np.zeros(arrays[where].shape, bool))
    with pytest.raises(errors.ProblemError, match=f"{where} is a numpy masked array"):
        dispatcher.gemm(arrays.pop("a"), arrays.pop("b"), beta=1.0, **arrays)


def test_masked_array_in_a_group_is_refused():
    with pytest.raises(errors.ProblemError, match=r"b\[1\] is a numpy masked array"):
        dispatcher.grouped_gemm([f32(3, 4)] * 2, [f32(4, 5), np.ma.masked_array(f32(4, 5))])


def test_numeric_scalars_of_every_kind_are_accepted(rng):
    a = random_matrix(6, 7, "fp32", "r", rng)
    b = random_matrix(7, 8, "fp32", "r", rng)
    c = random_matrix(6, 8, "fp32", "r", rng)
    for alpha, beta in ((2, 1), (np.float32(0.5), np.int64(-1)), (np.float64(1.5), 0.25)):
        out = dispatcher.gemm(a, b, c=c, alpha=alpha, beta=beta, config=SMALL,
                              options={"workers": np.int64(2)})
        assert max_rel(out, reference(a, b, c, float(alpha), float(beta))) <= 1e-6


def test_kernel_workers_are_bound_but_the_calling_thread_is_not():
    """The workers of a kernel's parallel region are bound each to one CPU
    other than the caller's (Linux would otherwise wake them on the caller's
    core); the user's thread keeps the CPU set it had (OMP_PROC_BIND would
    have bound it to one CPU, and every thread it starts after)."""
    got = in_child("""
        import os, threading
        from dispatcher.verify import max_rel, poison, random_matrix, reference
        os.environ.pop("OMP_PROC_BIND", None); os.environ.pop("OMP_PLACES", None)
        before = os.sched_getaffinity(0)
        if len(before) < 2:
            print("right kept bound")  # one CPU: nothing to place
            raise SystemExit
        rng = np.random.default_rng(7)
        a = random_matrix(256, 192, "fp32", "r", rng)
        b = random_matrix(192, 320, "fp32", "r", rng)
        for _ in range(3):
            out = poison(np.empty((256, 320), np.float32))
            dispatcher.gemm(a, b, out=out, config=dict(tile_m=24, tile_n=64, tile_k=32), options={"workers": 2})
        print("right" if max_rel(out, reference(a, b)) <= 1e-5 else "wrong")
        print("kept" if os.sched_getaffinity(0) == before else "moved")
        others = [os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")
                  if int(t) != threading.get_native_id()]
        print("bound" if any(len(s) == 1 and s <= before for s in others) else "unbound")
    """)
    assert got == ["right", "kept", "bound"]


@pytest.mark.parametrize("setting, workers", [("OMP_PROC_BIND=false", 2), ("", 8)])
def test_kernel_workers_stay_unbound_where_the_user_or_the_team_size_says(setting, workers):
    """A user's OMP_PROC_BIND (any value, "false" too) leaves OpenMP's
    binding alone, and so does a team larger than the CPU set (binding
    would stack its extra workers on the other CPUs, away from the
    caller's)."""
    name, _, value = setting.partition("=")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_PROC_BIND", "OMP_PLACES")}
    if name:
        env[name] = value
    code = textwrap.dedent(f"""
        import os, threading, numpy as np, dispatcher
        from dispatcher.verify import max_rel, poison, random_matrix, reference
        cpus = os.sched_getaffinity(0)
        rng = np.random.default_rng(3)
        a = random_matrix(256, 192, "fp32", "r", rng)
        b = random_matrix(192, 320, "fp32", "r", rng)
        workers = {workers} if {workers} <= 2 else 4 * len(cpus)
        out = poison(np.empty((256, 320), np.float32))
        dispatcher.gemm(a, b, out=out, config=dict(tile_m=24, tile_n=64, tile_k=32), options={{"workers": workers}})
        print("right" if max_rel(out, reference(a, b)) <= 1e-5 else "wrong")
        others = [os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")
                  if int(t) != threading.get_native_id()]
        print("unbound" if all(s == cpus for s in others) else "bound")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["right", "unbound"]


@pytest.mark.parametrize("first, preset, expected", [
    ("", None, "4"),                 # dispatcher loads numpy: OpenBLAS reads the short spin
    ("", "9", "9"),                  # the user's own value wins
    ("import numpy\n", None, "4"),   # numpy loaded first: set for any OpenBLAS loaded later
])
def test_the_openblas_spin_variable_is_set_unless_the_user_set_one(first, preset, expected):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if preset is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = preset
    code = first + "import os, dispatcher\nprint(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(expected)]


_SPIN = """
import importlib.util, os, numpy, threadpoolctl
# the module alone, not the package (whose import shortens the spin)
where = os.path.join(importlib.util.find_spec("dispatcher").submodule_search_locations[0], "blas_threads.py")
spec = importlib.util.spec_from_file_location("blas_threads_alone", where)
alone = importlib.util.module_from_spec(spec)
spec.loader.exec_module(alone)
def spins():
    found = [alone.spin_variable(i["filepath"]) for i in threadpoolctl.threadpool_info()
             if i["internal_api"] == "openblas"]
    return None if not found or None in found else [v.value for v in found]
before = spins()
import dispatcher
print(before)
print(spins())
"""


@pytest.mark.parametrize("preset, after", [(None, 1 << 4), ("9", 1 << 9)])
def test_openblas_loaded_first_gets_the_short_spin_unless_the_user_set_one(preset, after):
    """numpy imported before dispatcher: OpenBLAS computed its spin from the
    environment already, and `import dispatcher` sets the spin itself (2^4
    cycles), not the variable; a value the user set stays."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if preset is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = preset
    done = subprocess.run([sys.executable, "-c", _SPIN], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    before, now = (ast.literal_eval(line) for line in done.stdout.splitlines()[-2:])
    if before is None:
        pytest.skip("this numpy's OpenBLAS has no thread_timeout symbol: left alone by design")
    assert before == [1 << (28 if preset is None else 9)] * len(before)  # what OpenBLAS computed
    assert now == [after] * len(before)


def test_a_library_without_the_symbol_is_left_alone(tmp_path):
    from dispatcher import blas_threads
    not_elf = tmp_path / "libfake.so"
    not_elf.write_bytes(b"not an ELF file at all")
    assert blas_threads.elf_symbols(str(not_elf), ("thread_timeout",)) == {}
    assert blas_threads.shorten_spin(str(not_elf)) is False
    assert blas_threads.shorten_spin(str(tmp_path / "missing.so")) is False
    assert blas_threads.elf_symbols(sys.executable, ("thread_timeout",)) == {}  # an ELF without it


def test_the_openblas_spin_is_written_only_where_every_check_holds(monkeypatch):
    """The symbol table read from disk must describe the loaded image: a
    function offset that does not match it (a file replaced since it was
    loaded), a read-only or function-typed `thread_timeout`, or two of
    them: nothing is read or written."""
    import threadpoolctl
    from dispatcher import blas_threads
    paths = [i["filepath"] for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]
    if not paths or blas_threads.spin_variable(paths[0]) is None:
        pytest.skip("no OpenBLAS with a thread_timeout symbol here")
    real = blas_threads.elf_symbols(paths[0], ("thread_timeout", "openblas_thread_timeout"))
    (var,), (fn,) = real["thread_timeout"], real["openblas_thread_timeout"]
    for broken in ({**real, "openblas_thread_timeout": [(fn[0] + 64, *fn[1:])]},    # another file
                   {**real, "thread_timeout": [(*var[:3], False)]},                 # read-only
                   {**real, "thread_timeout": [(var[0], var[1], 2, var[3])]},        # a function
                   {**real, "thread_timeout": [var, var]}):                         # ambiguous
        monkeypatch.setattr(blas_threads, "elf_symbols", lambda path, names, found=broken: found)
        assert blas_threads.spin_variable(paths[0]) is None, broken
        assert blas_threads.shorten_spin(paths[0]) is False
