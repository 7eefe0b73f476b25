"""Plans (dispatcher.plans): one kind of call is worked out once, then each
call binds pointers and launches. Counted, invalidated, refused and
checked against the float64 reference."""

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import dispatcher
from dispatcher.api import Dispatcher
from dispatcher.errors import AliasingError, ProblemError
from dispatcher.plugins import PluginManager
from dispatcher.plans import DEFAULT_SCALARS
from dispatcher.verify import max_rel, poison, random_matrix, reference

PLAIN = (("a", "b"), DEFAULT_SCALARS)  # `Plan.runners`' key of plain (a, b) calls

SMALL = dict(tile_m=24, tile_n=64, tile_k=32)


@pytest.fixture
def d(tmp_path):
    return Dispatcher(tuning=None, manager=PluginManager())


def test_a_kind_of_call_is_planned_once_and_replanned_for_what_changes_it(d, rng):
    a = random_matrix(40, 30, "fp32", "r", rng)
    b = random_matrix(30, 20, "fp32", "r", rng)
    assert max_rel(dispatcher.gemm(a, b, dispatcher=d), reference(a, b)) <= 1e-5
    assert len(d.plans) == 1
    for _ in range(3):  # same kind of call, new data: the same plan
        a2 = random_matrix(40, 30, "fp32", "r", rng)
        assert max_rel(dispatcher.gemm(a2, b, dispatcher=d), reference(a2, b)) <= 1e-5
    assert len(d.plans) == 1
    (plan,) = d.plans.values()
    assert plan.chosen is not None
    changes = [
        (random_matrix(41, 30, "fp32", "r", rng), b),                    # a new shape
        (np.asfortranarray(a), b),                                       # a new stride (layout)
        (random_matrix(80, 30, "fp32", "r", rng)[::2], b),               # a new stride (pitch)
        (a.astype(dispatcher.dtypes.get("bf16").numpy), b.astype(dispatcher.dtypes.get("bf16").numpy)),
    ]
    for count, (x, y) in enumerate(changes, start=2):
        out = dispatcher.gemm(x, y, dispatcher=d)
        assert len(d.plans) == count
        tol = 1e-5 if x.dtype == np.float32 else 2e-2
        assert max_rel(out, reference(x, y)) <= tol


def test_registering_a_plugin_forgets_every_plan(d, rng):
    a, b = random_matrix(16, 16, "fp32", "r", rng), random_matrix(16, 16, "fp32", "r", rng)
    dispatcher.gemm(a, b, dispatcher=d)
    (before,) = d.plans.values()

    class Nothing:
        pass
    d.manager.register(Nothing(), "nothing")
    assert max_rel(dispatcher.gemm(a, b, dispatcher=d), reference(a, b)) <= 1e-5
    (after,) = d.plans.values()
    assert after is not before


def test_a_held_plan_runs_new_data_and_refuses_other_arrays(d, rng):
    a = random_matrix(33, 17, "fp32", "r", rng)
    b = random_matrix(17, 45, "fp32", "c", rng)
    p = dispatcher.plan("regular", a=a, b=b, dispatcher=d)
    for _ in range(2):
        a2 = random_matrix(33, 17, "fp32", "r", rng)
        assert max_rel(p(a2, b), reference(a2, b)) <= 1e-5
    out = poison(np.empty((33, 45), np.float32))
    with pytest.raises(ProblemError, match="do not match the plan"):
        p(a, b, out=out)  # planned without out
    with pytest.raises(ProblemError, match="do not match the plan"):
        p(np.ascontiguousarray(b), np.ascontiguousarray(a.T))
    with pytest.raises(ProblemError, match="do not match the plan"):
        p(a, np.ascontiguousarray(b))  # another layout
    with pytest.raises(ProblemError, match="do not match the plan"):
        p(a, b, beta=1.0, c=out)  # beta changes the planned call
    held = dispatcher.plan("regular", a=a, b=b, out=out, dispatcher=d)
    assert held(a, b, out=out) is out and max_rel(out, reference(a, b)) <= 1e-5


def test_plain_gemm_calls_run_their_plans_pair_runner_with_the_plain_scalars(rng, monkeypatch):
    """`gemm(a, b)` with every default, the commonest call, runs its plan's
    pair runner (a key, a lookup, the entry point), made by the first such
    call; a call with other scalars on the same plan leaves them out of it,
    and so does a held plan of the same arrays."""
    from dispatcher import api
    a, b = random_matrix(37, 29, "fp32", "r", rng), random_matrix(29, 21, "fp32", "c", rng)
    c = random_matrix(37, 21, "fp32", "r", rng)
    assert max_rel(dispatcher.gemm(a, b, alpha=2.0), reference(a, b, alpha=2.0)) <= 1e-5  # makes the plan
    assert max_rel(dispatcher.gemm(a, b, c=c, beta=0.5), reference(a, b, c, beta=0.5)) <= 1e-5
    for _ in range(2):
        a2 = random_matrix(37, 29, "fp32", "r", rng)
        assert max_rel(dispatcher.gemm(a2, b), reference(a2, b)) <= 1e-5
    key = api.operands_key(a, b)
    plan = api._RUNNERS[key][0]
    runner, ran = plan.runners[PLAIN], []
    monkeypatch.setitem(plan.runners, PLAIN, lambda x, y: ran.append(1) or runner(x, y))
    from dispatcher import plans  # the runner's result starts poisoned: every element must be written
    monkeypatch.setattr(plans, "np", SimpleNamespace(ndarray=np.ndarray, empty=lambda *s: poison(np.empty(*s))))
    assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-5 and ran == [1]
    monkeypatch.setattr(plans, "np", np)
    monkeypatch.setitem(plan.runners, PLAIN, runner)
    assert max_rel(dispatcher.gemm(a, b, alpha=3.0), reference(a, b, alpha=3.0)) <= 1e-5 and ran == [1]
    held = dispatcher.plan("regular", a=a, b=b)
    for _ in range(3):  # the first call binds the kernel; the others run the pair runner
        a2 = random_matrix(37, 29, "fp32", "r", rng)
        assert max_rel(held(a2, b), reference(a2, b)) <= 1e-5
    assert held.plan.runners.get(PLAIN) is not None
    with pytest.raises(ProblemError, match="do not match the plan"):
        held(a, np.ascontiguousarray(b))  # another layout: not the pair's key, and refused
    scaled = dispatcher.plan("regular", a=a, b=b, alpha=2.0)  # its own scalars: never the pair runner
    assert max_rel(scaled(a, b), reference(a, b, alpha=2.0)) <= 1e-5
    assert max_rel(scaled(a, b), reference(a, b, alpha=2.0)) <= 1e-5 and scaled.scalars == (2.0, 0.0, 1.0, 1.0)


def test_a_call_nested_in_another_on_the_same_thread_leaves_its_argument_block_alone(rng):
    """Python can run between a runner pointing its argument block at the
    arrays and the kernel reading it (a signal handler, a profiler, a
    __del__); a call made there, through the same runner, gets a block of
    its own: both results are right (with one shared block the outer
    kernel ran on the inner call's arrays and wrote into a freed result)."""
    a1, b1, a2, b2 = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(4))
    bias1, bias2 = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    for _ in range(3):  # the runner serves the call from now on
        dispatcher.matmul(a1, b1, bias=bias1)
    inner = []

    def nest(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "_enter" and not inner:
            inner.append(None)
            inner[0] = dispatcher.matmul(a2, b2, bias=bias2)
    sys.setprofile(nest)
    try:
        outer = dispatcher.matmul(a1, b1, bias=bias1)
    finally:
        sys.setprofile(None)
    assert inner and inner[0] is not None, "the nested call did not run"
    assert max_rel(outer, reference(a1, b1) + bias1) < 1e-5
    assert max_rel(inner[0], reference(a2, b2) + bias2) < 1e-5


def test_calls_with_out_target_dispatcher_or_alpha_take_a_runner_of_their_own(rng, monkeypatch):
    """Arguments that only decide a call's plan (out, target, dispatcher,
    alpha, out_dtype, strict, autotune) are in its key: the second such
    call runs its plan's runner, into the given out (poisoned first), and
    still refuses an out that overlaps an input or is read-only; a held
    plan made with an out does the same."""
    from dispatcher import api, plans
    d = Dispatcher()
    a, b = random_matrix(27, 19, "fp32", "r", rng), random_matrix(19, 23, "fp32", "c", rng)
    out, ran = np.empty((27, 23), np.float32), []
    calls = {"out": lambda x: dispatcher.gemm(x, b, out=out),
             "target": lambda x: dispatcher.gemm(x, b, target="cpu", out_dtype="fp32"),
             "dispatcher": lambda x: dispatcher.gemm(x, b, out=out, dispatcher=d, strict=True),
             "alpha": lambda x: dispatcher.gemm(x, b, alpha=2.0, autotune=False),
             "matmul out": lambda x: dispatcher.matmul(x, b, out=out),
             "run alpha": lambda x: dispatcher.run("regular", a=x, b=b, out=out, alpha=2.0)}
    for name, call in calls.items():
        call(a)
        runs = len(api._RUNNERS)
        entry = next(v for v in api._RUNNERS.values() if isinstance(v[0], plans.Plan)
                     and v[0].specs[0][1].strides == a.strides and v[3] is (d if name == "dispatcher" else None)
                     and v[2][0] == (2.0 if "alpha" in name else 1.0)
                     and ("out" in v[1]) == (name not in ("target", "alpha")))
        runner = entry[0].runner(entry[1], entry[2])
        monkeypatch.setitem(entry[0].runners, entry[1:3], lambda *x, runner=runner: ran.append(name) or runner(*x))
        a2 = random_matrix(27, 19, "fp32", "r", rng)
        poison(out)
        got = call(a2)
        want = reference(a2, b, alpha=2.0 if "alpha" in name else 1.0)
        assert ran[-1] == name and len(api._RUNNERS) == runs and max_rel(got, want) <= 1e-5, name
        assert (got is out) == ("out" in entry[1]), name
    square = random_matrix(23, 23, "fp32", "r", rng)
    dispatcher.gemm(square, square[:, ::-1][:, ::-1].T.T, out=np.empty((23, 23), np.float32))
    for _ in range(2):  # the runner of this kind of call checks the out it is given
        with pytest.raises(AliasingError, match="out overlaps a"):
            dispatcher.gemm(square, square.copy(), out=square)
        with pytest.raises(ProblemError, match="read-only"):
            dispatcher.gemm(square, square.copy(), out=np.broadcast_to(np.empty((23, 23), np.float32), (23, 23)))
    held = dispatcher.plan("regular", a=a, b=b, out=out)
    for _ in range(2):
        poison(out)
        assert held(a, b, out=out) is out and max_rel(out, reference(a, b)) <= 1e-5
    assert held.plan.runners.get((("a", "b", "out"), DEFAULT_SCALARS)) is not None
    inside = out.reshape(-1)[:a.size].reshape(a.shape)  # a's specs, in out's memory
    with pytest.raises(AliasingError, match="out overlaps a"):
        held(inside, b, out=out)


def test_plain_matmul_calls_run_the_pair_runner_of_their_plan(rng):
    """`matmul(a, b)` with every default takes the same shortest path as
    `gemm(a, b)`: 2-D operands share gemm's plan, batched ones (a broadcast
    B too) their batched plan; a vector operand goes the general way."""
    from dispatcher import api
    cases = [((19, 23), (23, 11)), ((3, 19, 23), (3, 23, 11)), ((3, 19, 23), (23, 11)), ((23,), (23, 11))]
    for shape_a, shape_b in cases:
        a, b = rng.standard_normal(shape_a).astype(np.float32), rng.standard_normal(shape_b).astype(np.float32)
        for _ in range(3):  # the first call plans and binds; the others run the pair runner
            a2 = rng.standard_normal(shape_a).astype(np.float32)
            assert max_rel(dispatcher.matmul(a2, b), np.matmul(a2.astype(np.float64), b)) <= 1e-5
        assert (api.operands_key(a, b) in api._RUNNERS) == (len(shape_a) > 1), (shape_a, shape_b)
    a, b = rng.standard_normal((19, 23)).astype(np.float32), rng.standard_normal((23, 11)).astype(np.float32)
    plan = api._RUNNERS[api.operands_key(a, b)][0]
    assert dispatcher.gemm(a, b).shape == (19, 11) and api._RUNNERS[api.operands_key(a, b)][0] is plan  # gemm's too
    assert max_rel(dispatcher.matmul(a, b, alpha=2.0), 2 * reference(a, b)) <= 1e-5  # its own scalars
    batched = rng.standard_normal((3, 19, 23)).astype(np.float32)
    dispatcher.matmul(batched, batched[0].T.copy())  # a batched pair, with 3-D and 2-D keys
    for x, y in ((batched, batched[0].T.copy()), (batched, np.swapaxes(batched, 1, 2).copy())):
        dispatcher.matmul(x, y)
        with pytest.raises(ProblemError, match="2-D"):  # gemm takes no batched pair: it refuses as ever
            dispatcher.gemm(x, y)


def test_a_plain_calls_runner_is_dropped_when_its_plan_chooses_again(rng):
    """After a plugin registration the plan chooses (and binds) its kernel
    again, and the runner of plain calls is made anew for that kernel."""
    from dispatcher import api
    from dispatcher.plugins import get_manager
    a, b = random_matrix(21, 13, "fp32", "r", rng), random_matrix(13, 9, "fp32", "r", rng)
    for _ in range(2):
        dispatcher.gemm(a, b)
    plan = api._RUNNERS[api.operands_key(a, b)][0]
    before = plan.runners.get(PLAIN)
    assert before is not None

    class Nothing:
        pass
    manager = get_manager()
    manager.register(Nothing(), "nothing-test-plugin")
    try:
        for _ in range(2):
            assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-5
        now = api._RUNNERS[api.operands_key(a, b)][0]
        assert now.runners.get(PLAIN) is not None and now.runners[PLAIN] is not before
    finally:
        manager.unregister(name="nothing-test-plugin")


def test_beta_and_c_through_the_plan(d, rng):
    a, b = random_matrix(20, 12, "fp32", "r", rng), random_matrix(12, 28, "fp32", "r", rng)
    c = random_matrix(20, 28, "fp32", "r", rng)
    want = reference(a, b, c, alpha=2.0, beta=0.5)
    assert max_rel(dispatcher.gemm(a, b, c=c, alpha=2.0, beta=0.5, dispatcher=d), want) <= 1e-5
    out = c.copy()  # c is out: updated in place
    assert dispatcher.gemm(a, b, c=out, out=out, alpha=2.0, beta=0.5, dispatcher=d) is out
    assert max_rel(out, want) <= 1e-5
    out_col = np.asfortranarray(c)  # column-major out with beta: its own values scaled
    dispatcher.gemm(a, b, out=out_col, alpha=2.0, beta=0.5, dispatcher=d)
    assert max_rel(out_col, want) <= 1e-5
    with pytest.raises(ProblemError, match="beta != 0 needs c"):
        dispatcher.gemm(a, b, beta=1.0, dispatcher=d)
    big = np.zeros((40, 28), np.float32)
    with pytest.raises(AliasingError, match="partially overlaps"):
        dispatcher.gemm(a, b, c=big[:20], out=big[10:30], beta=1.0, dispatcher=d)


def test_column_major_out_with_a_k_dim_extra_operand_is_staged_not_transposed(rng):
    """A kind that declares an extra operand with a K dim is never
    transposed (the kernel could not tell its operands apart): the kernel
    writes a row-major temporary that is copied into a column-major out."""
    from dispatcher import kinds
    from dispatcher.records import VariantRecord

    record = VariantRecord("kdim", "kdim", ("cpu",), ("fp32",), ("rrr",),
                           operands=(*kinds.gemm_operands(),
                                     kinds.Operand("w", ("k", "n"), optional=True)))
    a, b = random_matrix(8, 5, "fp32", "r", rng), random_matrix(5, 6, "fp32", "r", rng)
    out = np.asfortranarray(np.zeros((8, 6), np.float32))
    specs = tuple((o.name, dispatcher.problem.ArraySpec.of({"a": a, "b": b, "out": out, "w": b}.get(o.name)))
                  for o in record.operands)
    layout = kinds.layout(record, specs, (), None, "cpu", False)
    assert layout.staged and not layout.transposed and layout.names[:2] == ("a", "b")
    mn = VariantRecord("mn", "mn", ("cpu",), ("fp32",), ("rrr",),
                       operands=(*kinds.gemm_operands(), kinds.Operand("w", ("m", "n"), optional=True)))
    layout = kinds.layout(mn, tuple((n, s) for n, s in specs if n != "w") + (("w", None),), (), None,
                          "cpu", False)
    assert layout.transposed and not layout.staged and layout.names[:2] == ("b", "a")


def test_target_follows_the_data(rng):
    a, b = random_matrix(8, 8, "fp32", "r", rng), random_matrix(8, 8, "fp32", "r", rng)
    assert isinstance(dispatcher.gemm(a, b), np.ndarray)  # target="auto": numpy -> cpu
    with pytest.raises(dispatcher.ConfigError, match="unknown target"):
        dispatcher.gemm(a, b, target="tpu")


def test_the_call_path_has_no_import_cycle():
    """A reader follows a call through one module per step: no module of
    the package imports one that (transitively) imports it back."""
    code = r'''
import ast, pathlib, sys
root = pathlib.Path(sys.argv[1])
mods = {}
for p in root.rglob("*.py"):
    parts = p.relative_to(root.parent).with_suffix("").parts
    mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
graph = {m: set() for m in mods}
for m, p in mods.items():
    pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(p.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
            graph[m].update(t for t in (subs or [target]) if t in mods and t != m)
def reaches(a, b, seen):
    for n in graph[a]:
        if n == b or (n not in seen and not seen.add(n) and reaches(n, b, seen)):
            return True
    return False
cycles = sorted(m for m in mods if m != "dispatcher" and reaches(m, m, set()) and m.count(".") >= 1
                and not all(n == "dispatcher" for n in graph[m]))
print("\n".join(cycles))
'''
    root = __import__("pathlib").Path(dispatcher.__file__).parent
    found = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "", f"modules on an import cycle:\n{found.stdout}"


def test_a_variant_names_its_operands(rng):
    """A record's operands play roles under names of its own: calls, the
    plan and errors use those names (the regular templates, renamed)."""
    from pathlib import Path

    import regular_gemm.plugin as regular
    from dispatcher import kinds
    from dispatcher.plugin_api import VariantRecord, configs_per_target, launches_gemm, registers, renders

    record = VariantRecord(
        "named", "named", ("cpu",), ("fp32",), ("rrr", "rcr"), options=regular.EPILOGUE_OPTIONS,
        name_suffix=regular.epilogue_suffix, problem_options=regular.epilogue_problem_options,
        default_configs=configs_per_target(cpu=(SMALL,)),
        operands=kinds.gemm_operands(a="x", b="w", out="y"))

    named = SimpleNamespace(dispatcher_register_variants=registers(record),
                            dispatcher_codegen=renders("named", Path(regular.__file__).parent),
                            dispatcher_launch=launches_gemm("named", registry=True))
    manager = dispatcher.plugins.get_manager()  # configs are checked against the process's plugins
    manager.register(named, "named")
    try:
        d = Dispatcher(tuning=None, manager=manager)
        x, w = random_matrix(20, 12, "fp32", "r", rng), random_matrix(12, 9, "fp32", "c", rng)
        y = poison(np.empty((20, 9), np.float32))
        assert dispatcher.run("named", x=x, w=w, y=y, dispatcher=d) is y
        assert max_rel(y, reference(x, w)) <= 1e-5
        held = dispatcher.plan("named", x=x, w=w, dispatcher=d)
        assert max_rel(held(x, w), reference(x, w)) <= 1e-5
        with pytest.raises(ProblemError, match="takes no argument.*'a'.*operands x, w, c, y"):
            dispatcher.run("named", a=x, w=w, dispatcher=d)
        with pytest.raises(ProblemError, match="w is None"):
            dispatcher.run("named", x=x, dispatcher=d)
        with pytest.raises(ProblemError, match="inner dimensions differ: x is"):
            dispatcher.run("named", x=x, w=x, dispatcher=d)
    finally:
        manager.unregister("named")


def test_fused_matmul_and_run_calls_take_their_own_runners(monkeypatch, rng):
    """`matmul` with only a bias and an activation, and `run` with only
    operands and variant values, take the shortest path too, each by a key
    of its own: another activation, or the same operands through `run`
    without one, is another plan with another kernel."""
    from dispatcher import api
    a, b = random_matrix(29, 23, "fp32", "r", rng), random_matrix(23, 17, "fp32", "c", rng)
    bias = random_matrix(1, 17, "fp32", "r", rng)[0]
    want = {act: reference(a, b) + bias.astype(np.float64) for act in ("relu", "none")}
    want["relu"] = np.maximum(want["relu"], 0.0)
    for _ in range(3):  # the first call plans and binds; the others run the runner
        assert max_rel(dispatcher.matmul(a, b, bias=bias, activation="relu"), want["relu"]) <= 1e-5
        assert max_rel(dispatcher.run("regular", a=a, b=b, bias=bias), want["none"]) <= 1e-5
    relu = api._RUNNERS[("matmul", "relu", ("a", "b", "bias"), api.operands_key(a, b, bias))]
    plain = api._RUNNERS[("run", "regular", ("a", "b", "bias"), (), api.operands_key(a, b, bias))]
    assert relu[0] is not plain[0] and relu[1] == plain[1] == ("a", "b", "bias")
    ran = []
    runner = relu[0].runner(relu[1], relu[2])
    monkeypatch.setitem(relu[0].runners, relu[1:3], lambda *x: ran.append(1) or runner(*x))
    from dispatcher import plans  # the runner's result starts poisoned: every element must be written
    monkeypatch.setattr(plans, "np", SimpleNamespace(ndarray=np.ndarray, empty=lambda *s: poison(np.empty(*s))))
    a2 = random_matrix(29, 23, "fp32", "r", rng)
    got = dispatcher.matmul(a2, b, bias=bias, activation="relu")
    assert ran == [1] and max_rel(got, np.maximum(reference(a2, b) + bias.astype(np.float64), 0.0)) <= 1e-5
    got = dispatcher.run("regular", a=a2, b=b, bias=bias, activation="relu")  # run's own key: not matmul's runner
    assert ran == [1] and max_rel(got, np.maximum(reference(a2, b) + bias.astype(np.float64), 0.0)) <= 1e-5


def test_plain_call_keys_never_skip_a_check_the_general_path_makes(rng):
    """A None argument is part of a plain run's key (the general path
    refuses `alpha=None` and unknown names, so such a call is never
    remembered and refused every time); a variant that is not a string and
    operands that are not arrays get the general path's errors."""
    a, b = random_matrix(9, 7, "fp32", "r", rng), random_matrix(7, 5, "fp32", "r", rng)
    for _ in range(2):
        assert max_rel(dispatcher.run("regular", a=a, b=b), reference(a, b)) <= 1e-5
    for bad in (dict(alpha=None), dict(beta=None), dict(foo=None)):
        for _ in range(2):
            with pytest.raises(dispatcher.DispatcherError):
                dispatcher.run("regular", a=a, b=b, **bad)
    with pytest.raises(dispatcher.DispatcherError):
        dispatcher.run(["regular"], a=a, b=b)
    with pytest.raises(dispatcher.DispatcherError):
        dispatcher.gemm((9, 7), b)


def test_the_memo_of_calls_is_bounded(rng, monkeypatch):
    """Each entry keeps its plan (and a dispatcher given to the call) alive,
    so the memo starts again past `RUNNERS_KEPT` entries instead of growing
    with every shape and dispatcher a program ever used; calls stay right."""
    from dispatcher import api
    monkeypatch.setattr(api, "_RUNNERS", {})
    monkeypatch.setattr(api, "RUNNERS_KEPT", 2)
    for m in (5, 6, 7, 8):
        a, b = random_matrix(m, 9, "fp32", "r", rng), random_matrix(9, 4, "fp32", "r", rng)
        for _ in range(2):
            assert max_rel(dispatcher.gemm(a, b, dispatcher=Dispatcher()), reference(a, b)) <= 1e-5
        assert 1 <= len(api._RUNNERS) <= 2


def test_a_plan_chosen_again_under_a_launch_wrapper_stops_calling_the_kernel_itself(rng):
    """A held plan shared with plain calls chooses again after a plugin
    registration; when the launch it binds then names no entry point (a
    wrapper that must see every launch), neither it nor the plain calls
    keep calling the old entry point behind the wrapper's back."""
    from dispatcher.hookspecs import hookimpl
    from dispatcher.plugins import get_manager
    seen = []

    class Tracer:
        @hookimpl(wrapper=True)
        def dispatcher_launch(self, library, problem, operands, options):
            seen.append(problem.variant)
            return (yield)
    a, b = random_matrix(23, 17, "fp32", "r", rng), random_matrix(17, 19, "fp32", "r", rng)
    for _ in range(2):
        dispatcher.gemm(a, b)
    held = dispatcher.plan("regular", a=a, b=b)
    held(a, b)
    manager = get_manager()
    manager.register(Tracer(), name="tracer-test-plugin")
    try:
        assert max_rel(held(a, b), reference(a, b)) <= 1e-5
        before = len(seen)
        for _ in range(3):
            assert max_rel(dispatcher.gemm(a, b), reference(a, b)) <= 1e-5
        assert before >= 1 and len(seen) - before == 3
    finally:
        manager.unregister(name="tracer-test-plugin")


def test_a_zero_alphas_sign_is_part_of_the_calls_key(rng):
    """0.0 and -0.0 are equal as dict keys but not as alphas (the sign of
    zero results): each call form keeps them apart, as numpy does."""
    a, b = random_matrix(16, 8, "fp32", "r", rng), random_matrix(8, 12, "fp32", "r", rng)
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        for call in (lambda alpha: dispatcher.gemm(a, b, alpha=alpha),
                     lambda alpha: dispatcher.run("regular", a=a, b=b, alpha=alpha)):
            for alpha in (first, first, second, second):
                got = call(alpha)
                assert np.array_equal(np.signbit(got), np.signbit(alpha * (a @ b))), (first, alpha)
