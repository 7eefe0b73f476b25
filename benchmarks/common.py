"""Shared helpers of the benchmark scripts: environment record, baselines, output.

Every figure a script reports is a ratio against a baseline measured in the
same run; times are medians over repeated runs (dispatcher.timing).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import attrs
import numpy as np

from dispatcher import targets
from dispatcher.timing import TimingOptions, measure, median

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "shapes.json"
SHAPES_IN_TREE = Path(__file__).resolve().parent.parent / "shared" / "bench" / "shapes.json"


def pyplot(path: Path, hint: str = ""):
    """matplotlib's pyplot (Agg backend) to draw `path` with, or None where
    matplotlib is not installed (said in one line): a benchmark's figures
    are its JSON, written first; the plot is extra."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not installed: no {Path(path).name} (pip install 'gemm-dispatcher[plot]'){hint}",
              file=sys.stderr)
        return None
    return plt


def load_shapes() -> dict:
    """The public benchmark corpus (../shared/bench/shapes.json, or shared/
    in the tree, as a device run carries it), if present."""
    for path in (SHAPES, SHAPES_IN_TREE, Path(os.environ.get("GEMM_SHAPES", "/nonexistent"))):
        if path.exists():
            return json.loads(path.read_text())
    raise SystemExit(f"benchmark corpus not found at {SHAPES}; set GEMM_SHAPES")


def environment() -> dict:
    """Machine (CPU model, the ISA flags it reports, load average), versions
    and the BLAS numpy really runs."""
    from dispatcher.targets import cpu_isa

    cpu = "unknown"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    known = set().union(*(cpu_isa.Spec(i, i.extensions).needs for i in cpu_isa.ISAS.values()))
    env = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": platform.machine(), "cpu": cpu, "cpus": targets.get("cpu").parallelism_hint(),
        "isa": cpu_isa.active().name, "isa_flags": sorted(known & cpu_isa.cpu_flags()),
        "runnable_isas": cpu_isa.runnable_specs(), "load_average": os.getloadavg(),
        "python": sys.version.split()[0], "numpy": np.__version__,
        "compiler": targets.get("cpu").toolchain().identity,
        "torch": sys.modules["torch"].__version__ if "torch" in sys.modules else None,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    try:
        from threadpoolctl import threadpool_info
        env["blas"] = [{k: i.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
                       for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        env["blas"] = "threadpoolctl not installed"
    return env


def warn_if_openblas_throttled():
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("OPENBLAS_L2_SIZE"):
        print("note: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set and slow numpy's baseline; run with "
              "`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` for numpy at its best", file=sys.stderr)


def time_call(fn, timing: TimingOptions) -> float:
    """Median seconds of fn()."""
    return median(measure(lambda i: fn(), timing))


def rotated(items, r: int) -> list:
    """`items` starting at its r-th (modulo its length): round r of a
    comparison starts with another contender each round."""
    items = list(items)
    return items[r % len(items):] + items[:r % len(items)] if items else []


def time_interleaved(fns: dict, timing: TimingOptions, rounds: int = 5, settle: float = 0.3,
                     timer=measure) -> dict:
    """{name: median seconds} of several callables, timed in alternating
    rounds: each round warms each callable up and times a few runs of it in a
    row (its steady state, caches warm), so a burst of load on a shared
    machine lands on every contender alike rather than on one of them.
    timer(fn, options): the seconds of each timed call of fn(i) (wall clock,
    `dispatcher.timing.measure`; on a GPU, CUDA events).

    Each block starts after `settle` idle seconds: OpenBLAS's and OpenMP's
    worker threads spin for a while after a call, and a contender started
    inside that window shares its cores with them (2x slower here). Round r
    starts with the r-th contender (the order rotates), so none always runs
    right after the same other one (on the 2-core EPYC, calls alternated one
    by one without a pause read a 240x512-tile kernel 0.97x OpenBLAS in a
    fixed order and 0.88-0.92 in shuffled ones)."""
    per_round = attrs.evolve(timing, repeat=max(1, timing.repeat // rounds))
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in rotated(fns.items(), r):
            time.sleep(settle)
            times[name] += timer(lambda i: fn(), per_round)
    return {name: median(t) for name, t in times.items()}


def write(name: str, payload: dict) -> Path:
    """benchmarks/results/<name>.json, or <name>.json where name is a path."""
    path = Path(f"{name}.json") if os.sep in name else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)
    return path


def geomean(values) -> float:
    values = [v for v in values if v > 0]
    return float(np.exp(np.mean(np.log(values)))) if values else 0.0
