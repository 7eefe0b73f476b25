"""Property-based fuzz of the public API (issue 13).

Each example is one call of `dispatcher.gemm` or `dispatcher.grouped_gemm`
(grouped outputs also through `prepare_grouped` + `Dispatcher.run` with
guarded result buffers) on drawn shapes (0 and 1 included), input dtype,
output dtype, layouts, strided views (row steps, padded leading dimensions,
offsets, transposes of larger arrays, a 1-row view with a column step),
`out=` views, `c`/`beta` (c separate, c = out, c = a view of out's
elements), `alpha`/`beta` of every numeric type, launch options, target
`cpu`/`auto` and the kernel config. Every example checks:

- the values against `dispatcher.verify.reference` (float64 on the same
  quantized inputs): an int32 output exactly (the documented round-half-even
  and saturate rule), a float output element-wise within
  `dispatcher.verify.tolerance` of the scale |alpha| |A| |B| + |beta| |C|
  (the bound of a dot product's rounding error, so a result that cancels to
  near zero is not a false alarm) plus the output type's smallest subnormal;
- that every input buffer, padding included, is bit-for-bit unchanged;
- that every bit of an output's buffer outside the output's elements (its
  padding, and guard regions before and after it) is unchanged;
- that c is never read when beta is 0 (such a c is all NaN).

Operand buffers are poisoned (NaN, or the int8/int32 minimum) outside the
views, so a kernel that reads past a view's elements computes a wrong value.

Kernels: a small fixed set of configs per variant (block tile 24x64x32 with
the ISA's default micro-tile, the stream-K reductions and decompositions,
and the default selection, which picks one config for all of these small
problems), so an example builds at most one new kernel and the session's
build cache is shared with the parity tests.

Profiles (`HYPOTHESIS_PROFILE`): `ci` (default: derandomized, a bounded
number of examples) and `long` (>= 10,000 examples over the three tests:
`python benchmarks/fuzz_long.py` runs it and writes
`benchmarks/results/fuzz_long.json`). `FUZZ_STATS` names a JSON file the
module writes its case counts to (the long script reads it).
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
import time

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

pytestmark = pytest.mark.stress  # minutes of builds: CI runs it after the fast suite

import dispatcher
from dispatcher import dtypes
from dispatcher.api import default_dispatcher
from dispatcher.errors import UnsupportedProblem
from dispatcher import kinds
from dispatcher.plugins import get_manager
from dispatcher.problem import ArraySpec, prepare_grouped
from dispatcher.targets.cpu import cpu_count
from dispatcher.verify import reference, tolerance

# No example database, and hypothesis' other files (its constants cache) outside the repository.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "gemm-dispatcher-hypothesis"))
_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Examples per test; the three tests together make the profile's case count.
settings.register_profile("fuzz-ci", max_examples=100, derandomize=True, **_COMMON)
settings.register_profile("fuzz-long", max_examples=int(os.environ.get("FUZZ_LONG_EXAMPLES", 3400)),
                          **_COMMON)
PROFILE_NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE_NAME not in ("ci", "long"):
    raise ValueError(f"HYPOTHESIS_PROFILE={PROFILE_NAME!r}: tests/test_fuzz.py has profiles ci and long")
PROFILE = settings.get_profile(f"fuzz-{PROFILE_NAME}")

SMALL = dict(tile_m=24, tile_n=64, tile_k=32)
GUARD = 64  # elements of guard region before and after every output buffer

STATS = collections.Counter()
KERNELS: set = set()


@pytest.fixture(scope="module", autouse=True)
def _write_stats():
    start = time.monotonic()
    yield
    path = os.environ.get("FUZZ_STATS")
    if path:
        with open(path, "w") as f:
            json.dump({"profile": PROFILE_NAME, "seconds": round(time.monotonic() - start, 1),
                       "counts": dict(sorted(STATS.items())),
                       "kernel_configs": len(KERNELS)}, f, indent=1)


# ---------------------------------------------------------------- buffers
def _poison_value(np_dtype):
    return np.iinfo(np_dtype).min if np.issubdtype(np_dtype, np.integer) else np.nan


def _bits(x: np.ndarray) -> np.ndarray:
    """The raw bits of each element, so NaN payloads compare too."""
    return x.view(f"u{x.itemsize}")


@attrs.frozen
class ViewSpec:
    """An operand as a view into a larger buffer: `order` r (rows outer) or
    c (a transpose of a larger row-major buffer); `step` between outer
    rows; `pad` extra elements of the leading dimension; `offset` of the
    first element; `inner_step` (> 1 only when the outer extent is <= 1:
    such a view is still one readable layout)."""

    order: str = "r"
    step: int = 1
    pad: int = 0
    offset: int = 0
    inner_step: int = 1


@attrs.define
class Buffer:
    """A flat buffer with guard regions around the storage of one view."""

    flat: np.ndarray
    view: np.ndarray
    mask: np.ndarray      # True at the view's elements
    before: np.ndarray    # the raw bits before the call

    def snapshot(self):
        self.before = _bits(self.flat).copy()

    def intact_outside_view(self) -> bool:
        return np.array_equal(_bits(self.flat)[~self.mask], self.before[~self.mask])

    def intact(self) -> bool:
        return np.array_equal(_bits(self.flat), self.before)


def _geometry(spec: ViewSpec, rows: int, cols: int):
    outer, inner = (rows, cols) if spec.order == "r" else (cols, rows)
    shape = (spec.offset + max(outer - 1, 0) * spec.step + 1 + spec.pad,
             spec.offset + max(inner - 1, 0) * spec.inner_step + 1 + spec.pad)
    index = (slice(spec.offset, spec.offset + outer * spec.step, spec.step),
             slice(spec.offset, spec.offset + inner * spec.inner_step, spec.inner_step))
    return shape, index


def make_buffer(spec: ViewSpec, rows: int, cols: int, np_dtype, values=None) -> Buffer:
    """A (rows, cols) view laid out as `spec` in a poisoned buffer with
    GUARD elements before and after; `values` (if given) written into it."""
    shape, index = _geometry(spec, rows, cols)
    size = shape[0] * shape[1]
    flat = np.empty(GUARD + size + GUARD, np_dtype)
    flat[...] = _poison_value(np_dtype)
    mask = np.zeros(flat.shape, bool)

    def view_of(f):
        v = f[GUARD:GUARD + size].reshape(shape)[index]
        return v if spec.order == "r" else v.T

    view = view_of(flat)
    view_of(mask)[...] = True
    assert view.shape == (rows, cols)
    if values is not None:
        view[...] = values
    return Buffer(flat, view, mask, None)


def random_values(rows, cols, token, rng, big=False):
    d = dtypes.get(token)
    if np.issubdtype(d.numpy, np.integer):
        if token == "int32":
            if big:  # near the int32 limits: saturation
                return rng.integers(-2**31, 2**31, size=(rows, cols)).astype(np.int32)
            return rng.integers(-1000, 1001, size=(rows, cols)).astype(np.int32)
        return rng.integers(-8, 9, size=(rows, cols)).astype(d.numpy)
    return rng.uniform(-2.0, 2.0, size=(rows, cols)).astype(d.numpy)


# ------------------------------------------------------------- strategies
SIZES = st.one_of(st.sampled_from([0, 1, 1, 2, 3, 5, 6, 7, 8, 12, 16, 17, 23, 24, 25, 48, 63, 64, 65]),
                  st.integers(0, 100))
K_SIZES = st.one_of(st.sampled_from([0, 1, 1, 2, 3, 31, 32, 33, 64, 65, 96, 97]), st.integers(0, 300))
GROUP_SIZES = st.one_of(st.sampled_from([0, 1, 1, 2, 7, 23, 24, 25, 64]), st.integers(0, 64))
GROUP_K = st.one_of(st.sampled_from([0, 1, 1, 2, 31, 32, 33, 65]), st.integers(0, 160))
SEEDS = st.integers(0, 2**32 - 1)
WORKERS = st.sampled_from([None, None, 0, 1, 2, 3, 5])
TARGETS = st.sampled_from(["cpu", "cpu", "cpu", "auto"])

FLOAT_SCALARS = [1.0, 0.0, -1.0, 0.5, 2.0, -0.375, 1.25, 3.0]
INT_SCALARS = FLOAT_SCALARS + [0.5, 1.5, -2.5, 1e6, -1e6, 3e7 + 0.5]  # ties and saturation


@st.composite
def scalars(draw, int32_out: bool, include_zero=True):
    values = INT_SCALARS if int32_out else FLOAT_SCALARS
    if not include_zero:
        values = [v for v in values if v != 0]
    value = draw(st.one_of(st.sampled_from(values), st.floats(-3, 3, allow_subnormal=False)))
    kinds = ["float", "np.float64", "np.float32"] + (["int", "np.int64"] if value == int(value) else [])
    kind = draw(st.sampled_from(kinds))  # the reference takes float() of what was passed
    return {"float": float, "np.float64": np.float64, "np.float32": np.float32,
            "int": int, "np.int64": np.int64}[kind](value)


@st.composite
def view_specs(draw, rows: int, cols: int, order=None, allow_inner_step=True):
    order = order or draw(st.sampled_from("rc"))
    outer = rows if order == "r" else cols
    inner_step = 1
    if allow_inner_step and outer <= 1:
        inner_step = draw(st.sampled_from([1, 1, 2, 3]))
    return ViewSpec(order, draw(st.sampled_from([1, 1, 1, 2, 3])), draw(st.sampled_from([0, 0, 1, 5])),
                    draw(st.sampled_from([0, 0, 1, 3])), inner_step)


def out_tokens(token):
    return dtypes.get(token).outputs


def config_for(variant: str, label: str, out_token: str):
    """The fuzz's kernel configs: `default` selects; the others are explicit."""
    if label == "default":
        return None
    if variant == "stream_k":
        if label == "sk-linear":
            return dict(SMALL, reduction="linear", decomposition="stream_k")
        atomic = out_token in ("fp32", "int32")  # the CPU's atomic reduction
        return dict(SMALL, reduction="atomic" if atomic else "linear", decomposition="hybrid")
    return dict(SMALL)


CONFIG_LABELS = {"regular": ["default", "small"], "stream_k": ["default", "sk-linear", "sk-hybrid"],
                 "grouped": ["default", "small"]}


def tolerance_for(variant, token, out_token, k, workers):
    config = dispatcher.KernelConfig.create(variant=variant, dtype=token, dtype_c=out_token,
                                            threads=workers or 0, **SMALL)
    return tolerance(config, k)


def check_values(out, a, b, c, alpha, beta, tol):
    """out against the float64 reference (see the module docstring)."""
    ref = reference(a, b, c, alpha, beta)
    assert out.shape == ref.shape
    if np.issubdtype(out.dtype, np.integer):
        info = np.iinfo(out.dtype)
        expected = np.clip(np.rint(ref), info.min, info.max).astype(out.dtype)
        bad = out != expected
        assert not bad.any(), (f"{bad.sum()} of {bad.size} int32 elements differ, first at "
                               f"{np.argwhere(bad)[0]}: {out[bad][:5]} != {expected[bad][:5]}")
        return
    scale = abs(alpha) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    if beta:
        scale = scale + abs(beta) * np.abs(c.astype(np.float64))
    got = out.astype(np.float64)
    err = np.abs(got - ref)
    slack = tol * scale + float(np.finfo(out.dtype).smallest_subnormal)
    bad = ~(err <= slack)  # NaN fails
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off, first at {np.argwhere(bad)[0]}: "
                           f"got {got[bad][:4]} want {ref[bad][:4]} (tolerance {tol:.3g} x scale)")


# ------------------------------------------------------------------ gemm
@st.composite
def gemm_cases(draw, variant):
    token = draw(st.sampled_from(dtypes.INPUT_TOKENS))
    explicit_out = draw(st.booleans())
    out_token = draw(st.sampled_from(out_tokens(token))) if explicit_out else dtypes.output_for(token).token
    m, k = draw(SIZES), draw(K_SIZES)
    b_is_a_t = draw(st.integers(0, 19)) == 0  # gemm(a, a.T): inputs share memory
    n = m if b_is_a_t else draw(SIZES)
    int32_out = out_token == "int32"
    out_mode = draw(st.sampled_from(["none", "view", "view"]))
    c_modes = ["none", "separate"] + (["out", "out[...]"] if out_mode == "view" else [])
    c_mode = draw(st.sampled_from(c_modes))
    beta = 0.0 if c_mode == "none" else draw(scalars(int32_out))
    return dict(
        variant=variant, token=token, out_token=out_token, explicit_out=explicit_out, m=m, n=n, k=k,
        a=draw(view_specs(m, k)), b=None if b_is_a_t else draw(view_specs(k, n)),
        out_mode=out_mode, out=draw(view_specs(m, n)), c_mode=c_mode, c=draw(view_specs(m, n)),
        c_big=int32_out and draw(st.integers(0, 9)) == 0,
        alpha=draw(scalars(int32_out)), beta=beta, pass_beta=beta != 0 or draw(st.booleans()),
        config=draw(st.sampled_from(CONFIG_LABELS[variant])), workers=draw(WORKERS),
        target=draw(TARGETS), seed=draw(SEEDS))


def run_gemm_case(case):
    note(repr(case))
    rng = np.random.default_rng(case["seed"])
    token, out_token, m, n, k = case["token"], case["out_token"], case["m"], case["n"], case["k"]
    in_np, out_np = dtypes.get(token).numpy, dtypes.get(out_token).numpy
    A = make_buffer(case["a"], m, k, in_np, random_values(m, k, token, rng))
    a = A.view
    if case["b"] is None:
        B, b = None, a.T
    else:
        B = make_buffer(case["b"], k, n, in_np, random_values(k, n, token, rng))
        b = B.view
    alpha, beta = case["alpha"], case["beta"]
    c_values = random_values(m, n, out_token, rng, big=case["c_big"])
    if beta == 0 and not np.issubdtype(out_np, np.integer):  # (bfloat16 is no np.floating)
        c_values = np.full((m, n), np.nan, out_np)  # c must not be read
    kwargs = dict(alpha=alpha, variant=case["variant"], target=case["target"],
                  config=config_for(case["variant"], case["config"], out_token))
    if case["pass_beta"]:
        kwargs["beta"] = beta
    if case["explicit_out"] or case["out_mode"] == "none" and out_token != dtypes.output_for(token).token:
        kwargs["out_dtype"] = out_token
    if case["workers"] is not None:
        kwargs["options"] = {"workers": case["workers"]}
    O = C = None
    if case["out_mode"] == "view":
        O = make_buffer(case["out"], m, n, out_np)
        kwargs["out"] = O.view
    if case["c_mode"] == "separate":
        C = make_buffer(case["c"], m, n, out_np, c_values)
        kwargs["c"] = C.view
    elif case["c_mode"] in ("out", "out[...]"):
        O.view[...] = c_values
        kwargs["c"] = O.view if case["c_mode"] == "out" else O.view[...]
    inputs = [x for x in (A, B, C) if x is not None]
    for x in (*inputs, O):
        if x is not None:
            x.snapshot()

    try:
        result = dispatcher.gemm(a, b, **kwargs)
    except UnsupportedProblem as e:  # a given config is strict: no fallback
        assert stream_k_has_too_few_iterations(case, a, b, kwargs), e
        assert O is None or O.intact_outside_view(), "memory outside out was written"
        for x, name in zip(inputs, ("a", "b", "c")):
            assert x.intact(), f"an input buffer ({name}) changed"
        STATS["stream_k status -2 (given config, strict)"] += 1
        return

    if O is not None:
        assert result is O.view
        assert O.intact_outside_view(), "memory outside out was written"
    assert result.shape == (m, n) and result.dtype == out_np, (result.shape, result.dtype)
    for x, name in zip(inputs, ("a", "b", "c")):
        assert x.intact(), f"an input buffer ({name}) changed"
    tol = tolerance_for(case["variant"], token, out_token, k, case["workers"])
    check_values(result, a, b, c_values, float(alpha), float(beta), tol)
    _count(case, m * n * k == 0)


def stream_k_has_too_few_iterations(case, a, b, kwargs) -> bool:
    """Whether the CPU stream-K kernel of a `stream_k` decomposition may
    refuse the problem (status -2): fewer tiles x K-iterations than workers."""
    config = kwargs["config"]
    if case["variant"] != "stream_k" or not config or config["decomposition"] != "stream_k":
        return False
    out_dtype = case["out_token"] if "out_dtype" in kwargs else None
    record = get_manager().variant("stream_k")
    arrays = {"a": a, "b": b, "c": kwargs.get("c"), "out": kwargs.get("out")}
    specs = tuple((o.name, ArraySpec.of(arrays[o.name])) for o in kinds.operands_of(record))
    problem = kinds.layout(record, specs, (), out_dtype, "cpu", case["beta"] != 0).problem
    tiles = -(-problem.m // config["tile_m"]) * -(-problem.n // config["tile_n"])
    workers = case["workers"] or cpu_count()
    return tiles * -(-problem.k // config["tile_k"]) < workers


def _count(case, empty):
    variant = case["variant"]
    STATS[f"cases {variant}"] += 1
    STATS[f"dtype {case['token']}"] += 1
    STATS[f"config {variant}:{case['config']}"] += 1
    if empty:
        STATS["cases with a zero size"] += 1
    if case.get("out_mode") == "view":
        STATS["gemm out= in a guarded buffer"] += 1
    if case.get("c_mode") in ("out", "out[...]"):
        STATS["gemm c is out"] += 1
    if case.get("path") == "guarded":
        STATS["grouped guarded results"] += 1
    KERNELS.add((variant, case["token"], case["out_token"], case["config"]))


@pytest.mark.parametrize("variant", ["regular", "stream_k"])
@settings(PROFILE)
@given(data=st.data())
def test_gemm(variant, data):
    run_gemm_case(data.draw(gemm_cases(variant), label="case"))


# --------------------------------------------------------------- grouped
@st.composite
def grouped_cases(draw):
    token = draw(st.sampled_from(dtypes.INPUT_TOKENS))
    explicit_out = draw(st.booleans())
    out_token = draw(st.sampled_from(out_tokens(token))) if explicit_out else dtypes.output_for(token).token
    count = draw(st.sampled_from([0, 1, 1, 2, 2, 3, 4]))
    a_order, b_order = draw(st.sampled_from("rc")), draw(st.sampled_from("rc"))
    groups = []
    for _ in range(count):
        m, n, k = draw(GROUP_SIZES), draw(GROUP_SIZES), draw(GROUP_K)
        # a column step is one layout only in a one-group call (the groups share one layout)
        groups.append(((m, n, k), draw(view_specs(m, k, a_order, count == 1)),
                       draw(view_specs(k, n, b_order, count == 1))))
    return dict(variant="grouped", token=token, out_token=out_token, explicit_out=explicit_out,
                groups=groups, alpha=draw(scalars(out_token == "int32")),
                config=draw(st.sampled_from(CONFIG_LABELS["grouped"])),
                path=draw(st.sampled_from(["api", "guarded"])), target=draw(TARGETS), seed=draw(SEEDS))


def run_grouped_case(case):
    note(repr(case))
    rng = np.random.default_rng(case["seed"])
    token, out_token = case["token"], case["out_token"]
    in_np, out_np = dtypes.get(token).numpy, dtypes.get(out_token).numpy
    As, Bs = [], []
    for (m, n, k), sa, sb in case["groups"]:
        As.append(make_buffer(sa, m, k, in_np, random_values(m, k, token, rng)))
        Bs.append(make_buffer(sb, k, n, in_np, random_values(k, n, token, rng)))
    for x in As + Bs:
        x.snapshot()
    list_a, list_b = [x.view for x in As], [x.view for x in Bs]
    alpha = case["alpha"]
    config = config_for("grouped", case["config"], out_token)
    out_dtype = out_token if case["explicit_out"] else None
    outputs = []
    if case["path"] == "api":
        results = dispatcher.grouped_gemm(list_a, list_b, out_dtype=out_dtype, alpha=alpha,
                                          config=config, target=case["target"])
    else:  # the same call with every result in a guarded, poisoned buffer
        def allocate(shape, np_dtype):
            buffer = make_buffer(ViewSpec(), *shape, np_dtype)
            buffer.snapshot()
            outputs.append(buffer)
            return buffer.view

        problem, operands, results = prepare_grouped(list_a, list_b, out_dtype=out_dtype,
                                                     alpha=alpha, allocate=allocate)
        if any(m * n for m, n, _ in problem.groups):
            default_dispatcher().run(problem, operands, config)
        assert len(outputs) == len(results) and all(r is o.view for r, o in zip(results, outputs))
    assert len(results) == len(case["groups"])
    for o in outputs:
        assert o.intact_outside_view(), "memory outside a grouped result was written"
    for x in As + Bs:
        assert x.intact(), "an input buffer changed"
    for ((m, n, k), _, _), a, b, result in zip(case["groups"], list_a, list_b, results):
        assert result.shape == (m, n) and result.dtype == out_np, (result.shape, result.dtype)
        check_values(result, a, b, None, float(alpha), 0.0,
                     tolerance_for("grouped", token, out_token, k, None))
    _count(case, not all(m * n * k for (m, n, k), _, _ in case["groups"]))


@settings(PROFILE)
@given(data=st.data())
def test_grouped(data):
    run_grouped_case(data.draw(grouped_cases(), label="case"))
