"""`gemm-dispatcher sweep`: expand -> build -> benchmark -> results -> tuning database."""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import attrs

from .. import dtypes, epilogue
from ..errors import ConfigError, DispatcherError
from ..kinds import KindProblem, non_default
from ..plugins import get_manager
from ..problem import GemmProblem, GroupedGemmProblem
from ..timing import TimingOptions
from ..tuning import TuningDatabase
from ..verify import ACTIVATION_REFERENCE
from . import executors, problems as problem_files, results, runner, sweep

DEFAULT_PROBLEMS = {
    "gemm": [(512, 512, 512), (1024, 1024, 1024), (1000, 1500, 700)],
    "grouped": [tuple((m, 512, 512) for m in (1, 64, 200, 512, 37, 300, 128, 450))],
}


@attrs.frozen
class SweepOptions:
    config: object
    variant: str
    target: str = "cpu"
    dtype: str = "fp32"
    layout: str = "rcr"
    out_dtype: str | None = None
    problems: object = None
    executor: str = "local"        # executors.NAMES
    workers: int = 0               # local: build processes
    devices: str | None = None     # local: benchmark slots
    address: str | None = None     # ray: the cluster (None: start one here)
    slots: int = 0                 # ray: benchmark slots (0: every GPU, or every node's CPUs)
    slot_cpus: int = 0             # ray: CPUs of a slot
    slot_timeout: float = 0.0      # ray: seconds for a slot's actor to start (0: the default)
    kernel_timeout: float = 60.0
    max_kernels: int = 0
    verify: bool = False
    out: str = "sweep_results"
    resume: bool = False
    timing: TimingOptions = TimingOptions()
    tuning: object = "default"
    progress: bool = True


def say(*parts):
    print(*parts, file=sys.stderr, flush=True)


def run(o: SweepOptions) -> dict:
    kind = get_manager().variant(o.variant).problem_kind
    plan = sweep.expand(o.config, variant=o.variant, target=o.target, dtype=o.dtype, layout=o.layout,
                        out_dtype=o.out_dtype, max_kernels=o.max_kernels)
    fixed = dict(plan.fixed)
    beyond = sorted(set(fixed) - {x.name for x in epilogue.OPTIONS})
    if o.verify and (beyond or fixed.get("activation", "none") not in ACTIVATION_REFERENCE):
        raise ConfigError(f"--verify has a reference for the fused epilogue's bias and activation "
                          f"({', '.join(ACTIVATION_REFERENCE)}); this sweep fixes "
                          f"{', '.join(f'{k}={v}' for k, v in plan.fixed)}: run it without --verify")
    probs = problem_files.load(o.problems, kind) if o.problems else DEFAULT_PROBLEMS[kind]
    say(f"sweep: {len(plan.configs)} kernel(s) x {len(probs)} problem(s); "
        f"{len(plan.filtered)} combination(s) filtered")
    for reason, count in plan.reasons().most_common():
        say(f"  filtered {count}: {reason}")

    done = results.done_keys(o.out)  # checked before building: a refusal should not cost a build
    if done and not o.resume:
        raise DispatcherError(f"{o.out} already holds {len(done)} measurement(s); "
                              "add --resume to continue that sweep, or choose another --out")

    started = time.perf_counter()
    executor = executors.create(o)
    seconds = {"executor": time.perf_counter() - started}  # wall time of each phase
    try:
        rows, configs, build_failures, writer = measure(executor, plan, probs, done, o, kind, seconds)
    except KeyboardInterrupt:
        # an interrupted sweep's measurements (already on disk, `results`) still tune selection
        recorded = record_winners(results.read(o.out), plan.configs, probs, o, kind, plan.fixed)
        say(f"interrupted: the times of {len(recorded)} problem(s) measured so far are in the tuning database; "
            f"--resume continues the sweep")
        raise
    finally:
        executor.close()
    if done:
        say(f"resume: skipped {len(done)} measurement(s) already in {writer.csv_path}")

    winners = record_winners(results.read(o.out), configs, probs, o, kind, plan.fixed)
    failed = [r for r in rows if r["status"] != "ok"]
    summary = {"kernels": len(plan.configs), "filtered": len(plan.filtered), "built": len(configs),
               "build_failed": len(build_failures), "measured": len(rows), "failed_rows": len(failed),
               "winners": winners, "csv": str(writer.csv_path),
               "seconds": {phase: round(t, 3) for phase, t in seconds.items()}}
    for r in failed:
        say(f"  {r['status']}: {r['kernel']} problem {r['problem_idx']}: {r.get('reason', '')}")
    return summary


def measure(executor, plan, probs, done, o: SweepOptions, kind: str, seconds: dict):
    """Build and benchmark on `executor`: (rows, configs built, build failures,
    writer); `seconds` gets the wall time of each phase."""
    started = time.perf_counter()
    keys, build_failures = executor.build(plan.configs, o.progress)
    seconds["build"] = time.perf_counter() - started
    for name, error in build_failures:
        say(f"build FAILED {name}:\n  " + "\n  ".join(error.splitlines()[:6]))
    configs = [c for c in plan.configs if c.name in keys]
    if not configs:
        raise DispatcherError("no kernel of the sweep was built")
    writer = results.ResultWriter(o.out, kind, o.target)
    todo = {c.name: [i for i in range(len(probs)) if (c.name, i) not in done] for c in configs}
    header = {"target": o.target, "variant": o.variant, "dtype": o.dtype, "layout": o.layout,
              "out_dtype": o.out_dtype, "problems": probs, "fixed": dict(plan.fixed), "verify": o.verify,
              "timing": attrs.asdict(o.timing)}
    try:
        started = time.perf_counter()
        rows = runner.benchmark(configs, keys, todo, executor.slots(header), o.kernel_timeout, writer,
                                o.progress)
        seconds["benchmark"] = time.perf_counter() - started
    finally:
        writer.close()
    return rows, configs, build_failures, writer


def problem_record(shape, o: SweepOptions, kind: str, fixed: tuple = ()):
    """The problem a sweep's times are recorded under: as a call of the same
    shape, and of the fixed epilogue (`fixed`), makes it for its lookup."""
    out = dtypes.output_for(o.dtype, o.out_dtype).token
    if kind == "grouped":
        return GroupedGemmProblem(tuple(shape), o.dtype, out, o.layout, o.variant, o.target)
    if fixed:
        m, n, k = shape
        return KindProblem(m=m, n=n, k=k, batch=1, dtype=o.dtype, out_dtype=out, layout=o.layout,
                           variant=o.variant, target=o.target, options=fixed,
                           fixed=non_default(get_manager().variant(o.variant), fixed))
    return GemmProblem(*shape, o.dtype, out, o.layout, o.variant, o.target)


def record_winners(rows, configs, probs, o: SweepOptions, kind: str, fixed: tuple = ()) -> dict:
    """Every ok (and, with --verify, verified) row's time into the tuning
    database (selection compares kernels across neighbouring problems);
    returns the fastest per problem."""
    by_name = {c.name: c for c in configs}
    best = defaultdict(lambda: None)
    problems = {}  # problem index -> its record, made once for its many rows
    measured = []
    for r in rows:
        if r["status"] != "ok" or r["kernel"] not in by_name:
            continue
        if o.verify and r.get("verified") not in ("True", True):
            continue
        idx = int(r["problem_idx"])
        if idx not in problems:
            problems[idx] = problem_record(probs[idx], o, kind, fixed)
        measured.append((problems[idx], by_name[r["kernel"]], float(r["latency_ms"])))
        if best[idx] is None or float(r["latency_ms"]) < float(best[idx]["latency_ms"]):
            best[idx] = r
    tuning = TuningDatabase.default() if o.tuning == "default" else o.tuning
    if tuning is not None and measured:
        tuning.record_all(measured, source=str(o.out))
    return {idx: {"kernel": r["kernel"], "latency_ms": float(r["latency_ms"]), "tflops": float(r["tflops"])}
            for idx, r in sorted(best.items()) if r is not None}
