"""Does tuning pay? The sweep's winners vs the untuned selection, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/tuning_demo.py

Run after the CPU sweeps (commands in benchmarks/README.md), with the same
DISPATCHER_CACHE_DIR (the tuning database lives there). For every problem of
benchmarks/sweeps/cpu_*_problems.json it times the heuristic's choice
(selection without the database) and the tuned winner, and checks, through an
observing hook wrapper, that `dispatcher.gemm` / `grouped_gemm` launch the
tuned kernel. Writes benchmarks/results/tuning_demo.json.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import dispatcher
from common import environment, write
from dispatcher.api import Dispatcher
from dispatcher.cli import run_once
from dispatcher.hookspecs import hookimpl
from dispatcher.plugins import get_manager
from dispatcher.tile_engine import problems as problem_files
from dispatcher.tile_engine.engine import SweepOptions, problem_record
from dispatcher.timing import TimingOptions
from dispatcher.verify import random_matrix

SWEEPS = Path(__file__).resolve().parent / "sweeps"


class LaunchObserver:
    """A wrapper on dispatcher_launch: records which kernel each call ran."""

    def __init__(self):
        self.launched = []

    @hookimpl(wrapper=True)
    def dispatcher_launch(self, library, problem, operands, options):
        self.launched.append(library.name)
        return (yield)


def main():
    observer = LaunchObserver()
    get_manager().register(observer, "tuning-demo-observer")
    timing = TimingOptions(warmup=3, repeat=15)
    untuned, tuned = Dispatcher(tuning=None), Dispatcher()
    rows = []
    for variant in ("regular", "stream_k", "grouped"):
        kind = get_manager().variant(variant).problem_kind
        probs = problem_files.load(SWEEPS / f"cpu_{variant}_problems.json", kind)
        for shape in probs:
            o = SweepOptions(config=None, variant=variant, dtype="fp32", layout="rcr")
            problem = problem_record(shape, o, kind)
            heuristic, winner = untuned.select(problem), tuned.select(problem)
            kw = dict(variant=variant, dtype="fp32", layout="rcr", timing=timing)
            if kind == "grouped":
                kw["groups"] = list(shape)
            else:
                kw.update(m=shape[0], n=shape[1], k=shape[2])
            # each timed twice, interleaved, keeping the better: no cold-start artefacts
            t_heur, t_tuned = float("inf"), float("inf")
            for _ in range(2):
                t_heur = min(t_heur, run_once(untuned, config=heuristic, **kw)["latency_ms"])
                t_tuned = min(t_tuned, run_once(tuned, config=winner, **kw)["latency_ms"])
            # what the public API runs for this problem
            observer.launched.clear()
            rng = np.random.default_rng(0)
            if kind == "grouped":
                As = [random_matrix(m, k, "fp32", "r", rng) for m, n, k in shape]
                Bs = [random_matrix(k, n, "fp32", "c", rng) for m, n, k in shape]
                dispatcher.grouped_gemm(As, Bs, dispatcher=tuned)
            else:
                m, n, k = shape
                dispatcher.gemm(random_matrix(m, k, "fp32", "r", rng), random_matrix(k, n, "fp32", "c", rng),
                                variant=variant, dispatcher=tuned)
            rows.append({"variant": variant, "problem": [list(s) for s in problem.shapes],
                         "heuristic": heuristic.name, "heuristic_ms": t_heur,
                         "tuned": winner.name, "tuned_ms": t_tuned, "speedup": t_heur / t_tuned,
                         "gemm_launched": observer.launched[-1], "gemm_runs_tuned": observer.launched[-1] == winner.name})
            print(f"{variant:8} {str(shape)[:40]:40} tuned {t_heur / t_tuned:5.2f}x the heuristic; "
                  f"dispatcher.gemm ran the tuned kernel: {rows[-1]['gemm_runs_tuned']}")
    path = write("tuning_demo", {"environment": environment(), "rows": rows,
                                 "summary": {"best_speedup": max(r["speedup"] for r in rows),
                                             "problems_where_tuning_wins": sum(r["speedup"] > 1.05 for r in rows),
                                             "gemm_always_runs_tuned": all(r["gemm_runs_tuned"] for r in rows)}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
