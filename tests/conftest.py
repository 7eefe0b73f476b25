"""Shared fixtures: one build cache for the whole session (so each kernel is
compiled once per run) and helpers to run a config against the reference."""

import os

import numpy as np
import pytest


@pytest.hookimpl(trylast=True)  # after -m and -k deselected: `items` are the tests that run
def pytest_collection_modifyitems(config, items):
    """Unless a run selects `native` or `gpu` tests, the native modules
    (plain numpy calls; Linear's calls, a ~30 s build against torch's
    headers: docs/architecture.md and docs/pytorch.md, "Native calls") are
    switched off, so the fast suite and the other CPU runs never build
    them in the background, and their Python way stays tested; `-m native` tests them (CI runs that after
    the fast suite), and `-m gpu` runs with it as users do. Decided from
    the selected tests, before any runs; a switch already set is kept."""
    if not any(item.get_closest_marker("native") or item.get_closest_marker("gpu") for item in items):
        os.environ.setdefault("DISPATCHER_NO_NATIVE_CALLS", "1")


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """A fresh build cache per run, or $DISPATCHER_TEST_CACHE_DIR (e.g. kernels
    built ahead for a GPU machine by benchmarks/build_cuda.py). Under
    pytest-xdist the workers of one run share one cache (the cache takes
    concurrent builders: per-key locks, atomic renames), so a kernel is
    built once per run, not once per worker."""
    root = os.environ.get("DISPATCHER_TEST_CACHE_DIR")
    if not root and os.environ.get("PYTEST_XDIST_WORKER"):
        # each worker's basetemp is <run's folder>/popen-gwN: the run's folder is shared
        root = tmp_path_factory.getbasetemp().parent / "cache"
        root.mkdir(exist_ok=True)
    elif not root:
        root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("DISPATCHER_CACHE_DIR")
    os.environ["DISPATCHER_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("DISPATCHER_CACHE_DIR", None)
    else:
        os.environ["DISPATCHER_CACHE_DIR"] = old


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def make_importable(site, package_dir, dist_name, entry_name, module):
    """Copy a plugin package into `site` with a dist-info declaring its entry
    point, as `pip install` would; returns the environment that finds it."""
    import shutil
    from pathlib import Path

    site = Path(site)
    shutil.copytree(package_dir, site / Path(package_dir).name, dirs_exist_ok=True)
    info = site / f"{dist_name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[dispatcher.plugins]\n{entry_name} = {module}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def wait_until(condition, children, timeout: float, what: str, log=None):
    """Poll `condition` every 0.1 s until it holds. Fails as soon as every
    child in `children` (Popen or multiprocessing.Process objects) has exited
    with the condition still false, since nothing is left to make it true,
    and after `timeout` s at most; `log`: a file whose tail goes with the failure."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        alive = [c for c in children if (c.poll() if hasattr(c, "poll") else c.exitcode) is None]
        if children and not alive and not condition():
            codes = [c.returncode if hasattr(c, "returncode") else c.exitcode for c in children]
            pytest.fail(f"waiting for {what}: the child process(es) exited ({codes}) first"
                        + _tail(log))
        if time.monotonic() > deadline:
            pytest.fail(f"waiting for {what}: none after {timeout:g} s" + _tail(log))
        time.sleep(0.1)


def _tail(log, lines: int = 15) -> str:
    if log is None or not os.path.exists(log):
        return ""
    with open(log, errors="replace") as f:
        return "\n" + "".join(f.readlines()[-lines:])


def train_losses(model, x, y, steps: int = 5, backend=None) -> list:
    """Losses of `steps` SGD steps of `model` on one regression batch,
    compiled whole with torch.compile's `backend` if given: the PyTorch
    tests train a dispatcher.torch model and an nn.Linear one with this."""
    import torch

    run = torch.compile(model, fullgraph=True, backend=backend) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(run(x).float(), y.float())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def reaped(proc):
    """A context for a child process: killed and reaped if it is still
    running when the block exits (a failure inside it)."""
    import contextlib

    @contextlib.contextmanager
    def guard():
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
    return guard()


def assert_each_measured_once(rows, before, count: int):
    """Sweep rows after a kill mid-sweep: `count` distinct (kernel, problem)
    rows, each once and ok, the rows written `before` the kill first and unchanged."""
    keys = [(r["kernel"], r["problem_idx"]) for r in rows]
    assert len(keys) == len(set(keys)) == count
    assert rows[:len(before)] == before
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]


# ------------------------------------------------------------ parity grid
# The parity tests check every variant x dtype x layout against the float64
# reference. The fast suite runs a Latin square of that product: variant v
# runs dtype d with layout (d + v) mod (number of layouts), so every variant
# sees every dtype and every layout, and across the variants every dtype
# meets every layout (each pair of factors is covered). The other cells of
# the product are marked slow too: `-m "parity and not slow"` selects the
# square, `-m parity` the whole product, `-m slow` runs what the fast suite left out.
# The square's cells of three of the four fp8 encodings are slow too: their
# kernels differ from fp8_e4m3's only in the decode table the generator writes
# from ml_dtypes, and the fast suite had grown past its 8 minutes.
PARITY_VARIANTS = ("regular", "stream_k linear", "stream_k tree", "grouped")
SLOW_ONLY_DTYPES = ("fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz")


def parity_grid(variant, dtypes, layouts, offset=None):
    """pytest params (dtype, layout) for `variant`'s parity test over
    dtypes x layouts: the Latin-square cells marked parity, the rest parity
    and slow. `offset`: the square's row shift, by default the variant's
    index in PARITY_VARIANTS (required for a test outside them)."""
    shift = PARITY_VARIANTS.index(variant) if offset is None else offset
    params = []
    for d, dtype in enumerate(dtypes):
        for i, layout in enumerate(layouts):
            fast = (d + shift) % len(layouts) == i and dtype not in SLOW_ONLY_DTYPES
            marks = [pytest.mark.parity] + ([] if fast else [pytest.mark.slow])
            params.append(pytest.param(dtype, layout, marks=marks, id=f"{dtype}-{layout}"))
    return params


def built_native_module(module, variable: str, compilers: tuple):
    """`module`'s native module (dispatcher.native_module: `module.extension`
    and `module.failure`), built or found in the build cache; skips where
    the machine cannot build one (no compiler from $`variable` or
    `compilers`, no Python headers), fails where the build fails."""
    import shutil
    import sysconfig
    from pathlib import Path
    if not any(shutil.which(n) for n in (os.environ.get(variable), *compilers) if n):
        pytest.skip(f"no compiler for the native module (${variable} or {', '.join(compilers)})")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers (Python.h) for the native module")
    built = module.extension(wait=True)
    assert built is not None, module.failure()
    return built
