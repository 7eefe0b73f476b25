"""Plain numpy calls in C (dispatcher/numpy_calls.py and numpy_calls.c):
once the Python way has bound a plain `gemm(a, b)` / `matmul(a, b)`,
later calls with the same shapes, strides and dtypes run in C with the same
kernel; each result against the float64 reference of the same quantized
inputs (each call's result block is first handed a freed NaN block of its
size, so elements a kernel leaves unwritten show), anything else the Python
way."""

import os
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import dispatcher
import dispatcher.errors
from conftest import built_native_module
from dispatcher import native_module, numpy_calls
from dispatcher.plugins import get_manager
from dispatcher.verify import max_rel, reference

pytestmark = pytest.mark.native

DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16}
TOL = {"fp32": 1e-6, "bf16": 8e-3}


@pytest.fixture(scope="module", autouse=True)
def built():
    """The module before the tests (`built_native_module`)."""
    return built_native_module(numpy_calls, "CC", ("gcc", "cc", "clang"))


def quantized(shape, dtype, seed, order="C"):
    x = (np.random.default_rng(seed).random(shape) * 4 - 2).astype(DTYPES[dtype])
    return np.asfortranarray(x) if order == "F" else x


def poisoned(call, shape, dtype):
    """call(), its result's block first a freed NaN block of the result's size."""
    block = np.full(shape, np.nan, dtype)
    del block
    return call()


def counts(module):
    """(calls run in C, calls that went back to Python) so far."""
    return np.array(module.counts())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("orders", ["CC", "FC", "CF"])
@pytest.mark.parametrize("entry", ["gemm", "matmul"])
def test_warm_plain_calls_run_in_c_and_are_right(built, dtype, orders, entry):
    call = getattr(dispatcher, entry)
    m, n, k = 19, 23, 37
    a, b = quantized((m, k), dtype, 1, orders[0]), quantized((k, n), dtype, 2, orders[1])
    out_dtype = np.float32 if dtype == "fp32" else DTYPES[dtype]
    first = call(a, b)  # the Python way: plans, binds and hands the launch over
    before = counts(built)
    for seed in range(3):
        a[...] = quantized((m, k), dtype, 10 + seed)
        got = poisoned(lambda: call(a, b), (m, n), out_dtype)
        assert got.shape == (m, n) and got.dtype == first.dtype and got.flags.c_contiguous
        assert max_rel(got, reference(a, b)) <= TOL[dtype]
    assert (counts(built) - before).tolist() == [3, 0]


def test_a_new_shape_stride_or_dtype_goes_the_python_way_once(built):
    a, b = quantized((16, 16), "fp32", 3), quantized((16, 16), "fp32", 4)
    dispatcher.gemm(a, b)
    for x, y in [(quantized((16, 24), "fp32", 5), quantized((24, 8), "fp32", 6)),  # shapes
                 (quantized((16, 32), "fp32", 7)[:, :16], b),                       # strides
                 (quantized((16, 16), "bf16", 8), quantized((16, 16), "bf16", 9))]:  # dtype
        before = counts(built)
        first = dispatcher.gemm(x, y)
        middle = counts(built)
        again = dispatcher.gemm(x, y)
        assert (middle - before).tolist() == [0, 1]  # the Python way ...
        assert (counts(built) - middle).tolist() == [1, 0]  # ... then C
        assert np.array_equal(first, again)
        assert max_rel(again, reference(x, y)) <= TOL["bf16" if x.dtype != np.float32 else "fp32"]


def test_calls_that_are_not_plain_stay_on_the_python_way(built):
    a, b = quantized((16, 16), "fp32", 3), quantized((16, 16), "fp32", 4)
    dispatcher.gemm(a, b)
    out = np.full((16, 16), np.nan, np.float32)
    before = counts(built)
    assert max_rel(dispatcher.gemm(a, b, alpha=2.0), reference(a, b, alpha=2.0)) <= 1e-6
    dispatcher.gemm(a, b, out=out, out_dtype="fp32")
    assert max_rel(out, reference(a, b)) <= 1e-6
    assert max_rel(dispatcher.matmul(a, b, activation="relu"), np.maximum(reference(a, b), 0)) <= 1e-6
    assert max_rel(dispatcher.matmul(a[None], b[None])[0], reference(a, b)) <= 1e-6
    assert (counts(built) - before).tolist() == [0, 0]  # never asked


def test_calls_naming_their_arrays_own_target_run_in_c(built):
    """target="cpu" with numpy arrays changes nothing: gemm and matmul, with
    and without an output, take the native launches of "auto" calls."""
    a, b = quantized((16, 16), "fp32", 3), quantized((16, 16), "fp32", 4)
    out = np.full((16, 16), np.nan, np.float32)
    calls = (lambda: dispatcher.gemm(a, b, target="cpu"), lambda: dispatcher.matmul(a, b, target="cpu"),
             lambda: dispatcher.gemm(a, b, out=out, target="cpu"),
             lambda: dispatcher.matmul(a, b, out=out, target="cpu"))
    for call in calls:
        call()  # learned (or already)
    before = counts(built)
    for call in calls:
        out[...] = np.nan
        assert max_rel(call(), reference(a, b)) <= 1e-6
    assert (counts(built) - before).tolist() == [4, 0]


@pytest.mark.parametrize("entry", ["gemm", "matmul", "held plan"])
def test_calls_into_an_output_run_in_c_and_are_right(built, entry):
    """gemm(a, b, out=out), matmul's and a held plan's: once planned, later
    calls with an output of the same shape, strides and dtype write into
    it from C (a NaN-poisoned output each time); the output returned."""
    m, n, k = 19, 23, 37
    a, b = quantized((m, k), "fp32", 1), quantized((k, n), "fp32", 2)
    out = np.full((m, n), np.nan, np.float32)
    held = dispatcher.plan("regular", a=a, b=b, out=out)
    call = {"gemm": lambda: dispatcher.gemm(a, b, out=out), "matmul": lambda: dispatcher.matmul(a, b, out=out),
            "held plan": lambda: held(a, b, out=out)}[entry]
    call()  # the Python way: plans, binds and hands the launch over
    before = counts(built) if entry != "held plan" else None
    for seed in range(3):
        a[...] = quantized((m, k), "fp32", 10 + seed)
        out[...] = np.nan
        assert call() is out
        assert max_rel(out, reference(a, b)) <= TOL["fp32"]
    if before is not None:
        assert (counts(built) - before).tolist() == [3, 0]
    else:
        assert held.native  # a held plan calls its own launch


def test_a_held_plans_third_positional_array_is_c_never_the_planned_out(built):
    """A plan made with an out runs (a, b, out=out) natively; (a, b, x) names
    x as c, which the plan was not made with: refused, x left as it was; an
    out of an equal dtype object that is not numpy's own runs the Python way."""
    import pickle
    a, b = quantized((16, 16), "fp32", 3), quantized((16, 16), "fp32", 4)
    out = np.full((16, 16), np.nan, np.float32)
    held = dispatcher.plan(a=a, b=b, out=out)
    for _ in range(2):
        assert held(a, b, out=out) is out
    assert held.native
    x = np.full((16, 16), np.nan, np.float32)
    with pytest.raises(dispatcher.errors.ProblemError, match="do not match the plan"):
        held(a, b, x)
    assert np.isnan(x).all()
    other = pickle.loads(pickle.dumps(np.full((16, 16), np.nan, np.float32)))
    assert other.dtype == np.float32 and other.dtype is not np.dtype(np.float32)
    for _ in range(2):
        assert dispatcher.gemm(a, b, out=other) is other
        assert max_rel(other, reference(a, b)) <= TOL["fp32"]


def test_an_output_the_kernel_must_not_write_goes_the_python_way_and_is_refused(built):
    """An output of a learned kind that overlaps an operand or is read-only:
    C hands it back, and the Python way raises what it always did; one of
    another layout runs its own plan, right."""
    a, b = quantized((16, 16), "fp32", 3), quantized((16, 16), "fp32", 4)
    out = np.full((16, 16), np.nan, np.float32)
    dispatcher.gemm(a, b, out=out)
    dispatcher.gemm(a, b, out=out)
    with pytest.raises(dispatcher.errors.AliasingError):
        dispatcher.gemm(a, b, out=a)  # same shape, strides and dtype as out: the learned kind
    frozen = np.full((16, 16), np.nan, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(dispatcher.errors.ProblemError, match="read-only"):
        dispatcher.gemm(a, b, out=frozen)
    for other in (np.full((16, 16), np.nan, np.float32, order="F"),           # column-major
                  np.full((16, 32), np.nan, np.float32)[:, :16]):             # padded rows
        for _ in range(2):
            other[...] = np.nan
            assert dispatcher.gemm(a, b, out=other) is other
            assert max_rel(other, reference(a, b)) <= TOL["fp32"]


def test_a_plugin_registration_forgets_every_launch(built):
    a, b = quantized((16, 16), "fp32", 3), quantized((16, 16), "fp32", 4)
    dispatcher.gemm(a, b)

    class Nothing:
        pass
    manager = get_manager()
    manager.register(Nothing(), "nothing-numpy-calls-test")
    try:
        before = counts(built)
        first = dispatcher.gemm(a, b)  # the Python way, planned again
        again = dispatcher.gemm(a, b)
        assert (counts(built) - before).tolist() == [1, 1]
        assert np.array_equal(first, again) and max_rel(again, reference(a, b)) <= 1e-6
    finally:
        manager.unregister(name="nothing-numpy-calls-test")


def test_kinds_of_call_beyond_the_table_are_right(built):
    """More kinds of call than the table holds (256 sets of 4): each one
    pushed out goes the Python way again, none runs another's launch."""
    shapes = [(m, n, k) for m in range(1, 9) for n in range(1, 9) for k in range(1, 21)]  # 1280 kinds
    inputs = {s: (quantized(s[::2], "fp32", 0), quantized(s[2:0:-1], "fp32", 1)) for s in shapes}
    for _ in range(2):
        for (m, n, k), (a, b) in inputs.items():
            got = dispatcher.gemm(a, b)
            assert got.shape == (m, n)
            assert max_rel(got, reference(a, b)) <= 1e-6


def test_a_kind_pushed_out_of_the_table_comes_back(built):
    inputs = [(quantized((m, 7), "fp32", m), quantized((7, n), "fp32", n)) for m in range(1, 40) for n in range(1, 40)]
    for a, b in inputs:  # 1521 kinds through a table of 1024
        dispatcher.gemm(a, b)
    for a, b in inputs:  # the first one that was pushed out: the Python way, which learns it again ...
        before = counts(built)
        assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-6
        if (counts(built) - before).tolist() == [0, 1]:
            break
    else:
        pytest.fail("no kind of call was pushed out of the table")
    before = counts(built)
    for _ in range(2):
        assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-6
    assert (counts(built) - before).tolist() == [2, 0]  # ... then C


def test_kinds_that_keep_pushing_each_other_out_are_not_each_relearned_per_call(built, monkeypatch):
    made = []
    launch = numpy_calls.launch
    monkeypatch.setitem(native_module.KINDS, np.ndarray, native_module.Launches(
        lambda *args: made.append(1) or launch(*args), numpy_calls.learn))
    inputs = [(quantized((m, 5), "fp32", m), quantized((5, n), "fp32", n)) for m in range(1, 41) for n in range(1, 41)]
    rounds = 6
    for _ in range(rounds):  # 1600 kinds in turn through a table of 1024
        for a, b in inputs:
            dispatcher.gemm(a, b)
    assert len(made) <= 0.6 * rounds * len(inputs)  # learned again at doubling intervals, not per call
    a, b = inputs[-1]
    assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-6


def test_equal_dtypes_of_other_objects_are_right_and_cost_no_new_launch_per_call(built):
    a, b = quantized((16, 16), "fp32", 3), quantized((16, 16), "fp32", 4)
    other = np.dtype(np.float32).newbyteorder("=")
    assert other is not a.dtype and other == a.dtype
    x, y = a.view(other), b.view(other)
    held = dispatcher.plan(a=a, b=b)
    held(a, b), held(a, b)
    launch = held.native
    for _ in range(3):
        assert max_rel(dispatcher.gemm(x, y), reference(a, b)) <= 1e-6
        assert max_rel(held(x, y), reference(a, b)) <= 1e-6  # C misses (identity), Python runs it
    assert held.native is launch


def test_threads_calling_at_once_get_their_own_results(built):
    shapes = [(16, 16, 16), (24, 8, 40), (9, 31, 17), (64, 64, 64)]
    inputs = [(quantized((m, k), "fp32", i), quantized((k, n), "fp32", 10 + i)) for i, (m, n, k) in enumerate(shapes)]
    for a, b in inputs:
        dispatcher.gemm(a, b)
    errors = []

    def work(a, b):
        want = reference(a, b)
        for _ in range(300):
            got = dispatcher.gemm(a, b)
            if max_rel(got, want) > 1e-6:
                errors.append(got.shape)
    threads = [threading.Thread(target=work, args=pair) for pair in inputs for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def run_child(code: str, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


CHILD = """
import numpy as np, dispatcher
from dispatcher import numpy_calls
from dispatcher.verify import max_rel, reference
a = (np.random.default_rng(1).random((20, 30)) * 4 - 2).astype(np.float32)
b = (np.random.default_rng(2).random((30, 10)) * 4 - 2).astype(np.float32)
assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-6
"""


@pytest.mark.parametrize("cache", ["holds the module", "fresh"])
def test_a_new_process_runs_its_second_call_in_c(cache, tmp_path):
    """The first call loads the module from the build cache, or builds it
    there and then (a second, beside its kernel's build): no call after it
    goes the Python way while a build runs."""
    out = run_child(CHILD + """
module = numpy_calls.extension()
for _ in range(3):
    assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-6
print(module.counts())
""", **({} if cache == "holds the module" else {"DISPATCHER_CACHE_DIR": str(tmp_path)}))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(3, 0)"


def test_a_forked_child_runs_its_calls_right():
    out = run_child(CHILD + """
import os
numpy_calls.extension(wait=True)
dispatcher.gemm(a, b)
pid = os.fork()
if pid == 0:
    os._exit(0 if max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-6 else 3)
print(os.waitpid(pid, 0)[1])
""")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def test_the_switch_keeps_every_call_in_python():
    out = run_child(CHILD + "print(numpy_calls.extension(wait=True), numpy_calls.failure())\n",
                    **{native_module.SWITCH: "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"None {native_module.SWITCH} is set"


def test_a_held_plan_calls_its_own_launch_and_remakes_it_after_a_registration(built):
    a, b = quantized((21, 13), "fp32", 3), quantized((13, 17), "fp32", 4)
    held = dispatcher.plan(a=a, b=b)
    held(a, b)  # binds the kernel
    held(a, b)  # the runner, which makes the launch
    launch = held.native
    assert launch
    for seed in range(3):
        a[...] = quantized((21, 13), "fp32", 20 + seed)
        got = poisoned(lambda: held(a, b), (21, 17), np.float32)
        assert max_rel(got, reference(a, b)) <= 1e-6
    assert held.native is launch
    assert launch(b, a) is None and launch(a, b[:, :16]) is None  # another key: not its call
    with pytest.raises(dispatcher.errors.ProblemError, match="do not match the plan"):
        held(b, a)

    class Nothing:
        pass
    manager = get_manager()
    manager.register(Nothing(), "nothing-held-launch-test")
    try:
        assert launch(a, b) is None  # stale
        for _ in range(3):
            assert max_rel(held(a, b), reference(a, b)) <= 1e-6
        assert held.native and held.native is not launch
    finally:
        manager.unregister(name="nothing-held-launch-test")


def test_a_bad_switch_value_warns_and_keeps_every_call_right():
    out = run_child(CHILD + """
for _ in range(20):
    assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-6
print(numpy_calls.failure())
""", **{native_module.SWITCH: "maybe"})
    assert out.returncode == 0, out.stderr
    assert native_module.SWITCH in out.stdout and "native calls stay off" in out.stdout
    assert out.stderr.count("native calls stay off") == 1  # a warning, once


def test_launch_refuses_what_is_not_a_launch(built):
    a = np.zeros((4, 4), np.float32)
    key = ((a.shape, a.strides, a.dtype), (a.shape, a.strides, a.dtype))
    with pytest.raises(ValueError, match="argument block"):
        built.Launch(key, 1, b"short", 4, 4, np.dtype(np.float32), print)
    with pytest.raises(TypeError, match="dtype"):
        built.Launch(((a.shape, a.strides, "f4"), key[1]), 1, b"", 4, 4, np.dtype(np.float32), print)
    with pytest.raises(TypeError, match="takes a Launch"):
        built.learn(key)


def test_kinds_without_a_native_launch_are_remembered_within_bounds(built, monkeypatch):
    """matmul calls with a bias stay on the Python way (numpy's module runs
    plain calls only); what remembers that they have no native launch is
    bounded like the memo of calls, however many kinds come."""
    from dispatcher import api
    monkeypatch.setattr(api, "RUNNERS_KEPT", 8)
    monkeypatch.setattr(api, "_NATIVE_MISSES", {})
    before = counts(built)
    for n in range(1, 21):
        a, b = quantized((4, 6), "fp32", n), quantized((6, n), "fp32", n + 1)
        bias = quantized((n,), "fp32", n + 2)
        assert max_rel(dispatcher.matmul(a, b, bias=bias), reference(a, b) + bias) <= 1e-6
        assert len(api._NATIVE_MISSES) <= 8
    assert (counts(built) - before).tolist() == [0, 0]  # never asked
