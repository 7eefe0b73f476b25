"""The `swiglu` example plugin (examples/swiglu_gemm_plugin): a variant with its
own problem kind whose operands are named as users call them (x in the role of
a, w1 of b, w3 an extra operand with a K dim), installed as pip would install
it, and checked against a float64 reference on the same quantized inputs with
poisoned outputs.

Kept fast: four kernels (one per dtype x layout of x and w1 below), each run
with w3 and out in both layouts; every other call reuses the fp32 rcr kernel.
The rest of the dtype x layout grid is marked slow (`-m slow`)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import make_importable

ROOT = Path(__file__).resolve().parent.parent
KERNELS = [("fp32", "rcr"), ("fp32", "crr"), ("bf16", "rrr"), ("bf16", "ccr")]  # x and w1: r and c in each dtype
MORE = [("fp32", "rrr"), ("fp32", "ccr"), ("bf16", "rcr"), ("bf16", "crr")]

PRELUDE = textwrap.dedent("""
    import json, sys, numpy as np, dispatcher
    from dispatcher.dtypes import relative_tolerance
    from dispatcher.verify import max_rel, poison, random_matrix
    rng = np.random.default_rng(0)

    def operands(m, n, k, dtype="fp32", lx="r", l1="c", l3="r"):
        return (random_matrix(m, k, dtype, lx, rng), random_matrix(k, n, dtype, l1, rng),
                random_matrix(k, n, dtype, l3, rng))

    def reference(x, w1, w3, alpha=1.0):
        h1, h3 = (alpha * (x.astype(np.float64) @ w.astype(np.float64)) for w in (w1, w3))
        return h1 / (1.0 + np.exp(-h1)) * h3

    def tolerance(dtype, k):  # two products, each within a GEMM's bound
        return 2 * relative_tolerance(dtype, k)
""")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return make_importable(tmp_path_factory.mktemp("site"), ROOT / "examples" / "swiglu_gemm_plugin" / "swiglu_gemm",
                           "swiglu-gemm-plugin", "swiglu_gemm", "swiglu_gemm.plugin")


def _run(env, *args, script=None):
    command = [sys.executable, "-c", PRELUDE + textwrap.dedent(script)] if script else [sys.executable, "-m", "dispatcher"]
    proc = subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("dtype, layout", KERNELS + [pytest.param(*k, marks=pytest.mark.slow) for k in MORE])
def test_swiglu_matches_float64(env, dtype, layout):
    """x and w1 in the kernel's layout; w3 and out each row- and column-major,
    out a view inside a poisoned buffer. A column-major out is not a transposed
    problem for this kind (w3 has a K dim): the kernel writes a row-major
    temporary that the core copies into out; the values say it did."""
    rows = _run(env, dtype, layout, script="""
        dtype, (lx, l1, _) = sys.argv[1], sys.argv[2]
        rows = []
        for l3 in "rc":
            for order in "CF":
                x, w1, w3 = operands(101, 70, 300, dtype, lx, l1, l3)  # 3 x 2 tiles, 2 K blocks
                buf = poison(np.empty((104, 75), x.dtype, order=order))
                out = buf[1:102, 2:72]
                got = dispatcher.run("swiglu", x=x, w1=w1, w3=w3, out=out, alpha=0.75, options={"workers": 2})
                outside = np.isnan(buf.astype(np.float32)).sum() - np.isnan(out.astype(np.float32)).sum()
                rows.append(dict(case=l3 + order, same=got is out, outside_nan=int(outside),
                                 error=max_rel(out, reference(x, w1, w3, 0.75)), tol=tolerance(dtype, 300)))
        print(json.dumps(rows))
    """)
    for row in rows:
        assert row["same"] and row["outside_nan"] == 104 * 75 - 101 * 70, row
        assert row["error"] <= row["tol"], row


def test_swiglu_by_declared_names_and_bad_calls(env):
    """`dispatcher.run("swiglu", x=..., w1=..., w3=...)`: a new row-major result,
    single rows, columns and K, beta with c or out (column-major: through the
    row-major temporary); one bad call per error kind; the CLI's verified run."""
    res = _run(env, script="""
        res = {}
        x, w1, w3 = operands(37, 41, 29)
        y = dispatcher.run("swiglu", x=x, w1=w1, w3=w3)
        res["plain"] = [max_rel(y, reference(x, w1, w3)), list(y.shape), str(y.dtype), y.flags.c_contiguous]
        for m, n, k in ((1, 41, 29), (37, 1, 29), (37, 41, 1)):  # size-1 dims come as stride 0
            for l3 in "rc":
                a, b1, b3 = operands(m, n, k, l3=l3)
                res[f"{m}x{n}x{k}{l3}"] = max_rel(dispatcher.run("swiglu", x=a, w1=b1, w3=b3), reference(a, b1, b3))
        c = random_matrix(37, 41, "fp32", "r", rng)
        for case, order in (("beta c", "F"), ("beta out", "C"), ("beta c=out", "C")):
            out = np.array(random_matrix(37, 41, "fp32", "r", rng), order=order)
            want = reference(x, w1, w3) + 0.5 * (c if case == "beta c" else out)
            kw = dict(c=c) if case == "beta c" else dict(c=out) if case == "beta c=out" else {}
            dispatcher.run("swiglu", x=x, w1=w1, w3=w3, out=out, beta=0.5, **kw)
            res[case] = max_rel(out, want)
        half = {name: v.astype(np.float16) for name, v in dict(x=x, w1=w1, w3=w3).items()}
        for case, kw in {"wrong name": dict(x=x, w1=w1, w2=w3), "role names": dict(a=x, b=w1, w3=w3),
                         "w3 missing": dict(x=x, w1=w1), "w3 shape": dict(x=x, w1=w1, w3=w3[:, :40]),
                         "fp16": half, "w3 broadcast": dict(x=x, w1=w1, w3=w3[:1]),
                         "w3 broadcast, strict": dict(x=x, w1=w1, w3=w3[:1], strict=True)}.items():
            try:
                dispatcher.run("swiglu", **kw)
                res[case] = ["ran", ""]
            except Exception as e:
                res[case] = [type(e).__name__, str(e)]
        print(json.dumps(res))
    """)
    error, shape, dtype, c_order = res.pop("plain")
    assert error <= 1e-5 and shape == [37, 41] and dtype == "float32" and c_order
    for case, says in (("wrong name", "'w2'; it takes operands x, w1, c, out, w3"), ("role names", "'a', 'b'"),
                       ("w3 missing", "needs operand 'w3'"), ("w3 shape", "w3 has shape (29, 40)"),
                       ("fp16", "takes fp32, bf16 inputs, not fp16")):
        kind, why = res.pop(case)
        assert kind == ("DtypeError" if case == "fp16" else "ProblemError") and says in why, (case, why)
    # A K (or N) dim of 1 broadcasts by the kind's rules; the kernel refuses that w3 with
    # status -2 (its reason reaches the caller only from a strict call).
    assert res.pop("w3 broadcast")[0] == "UnsupportedProblem"
    kind, why = res.pop("w3 broadcast, strict")
    assert kind == "UnsupportedProblem" and "w3 broadcasts along K or N" in why, why
    assert all(error <= 1e-5 for error in res.values()), res
    row = _run(env, "run", "--variant", "swiglu", "--m", "37", "--n", "41", "--k", "29", "--layout", "rcr",
               "--repeat", "1", "--warmup", "0", "--verify", "--json")
    assert row["verified"] and row["max_rel"] <= 1e-5, row


def test_swiglu_beta_onto_a_column_major_out(env):
    """out += swiglu with a column-major out (no c, or c=out): the core computes
    this kind through a row-major temporary, which starts as out's values."""
    res = _run(env, script="""
        x, w1, w3 = operands(37, 41, 29)
        res = {}
        for case in ("out", "c=out"):
            out = np.asfortranarray(random_matrix(37, 41, "fp32", "r", rng))
            want = reference(x, w1, w3) + 0.5 * out
            try:
                dispatcher.run("swiglu", x=x, w1=w1, w3=w3, out=out, beta=0.5, **({"c": out} if case == "c=out" else {}))
                res[case] = max_rel(out, want)
            except Exception as e:
                res[case] = f"{type(e).__name__}: {e}"
        print(json.dumps(res))
    """)
    assert all(isinstance(error, float) and error <= 1e-5 for error in res.values()), res
