"""A disposable benchmark worker: `python -m dispatcher.tile_engine.worker`.

Reads a header line (target, variant, dtypes, layout, problems, timing,
verify, device label) on stdin, then one kernel per line: `{"config": ...,
"key": build-cache key, "problems": [problem indices]}`. For each kernel it
loads the library already in this host's build cache under that key (never
builds, and needs no compiler), and for each of those problems runs it on
poisoned outputs, verifies against a float64 reference if asked, times it,
and prints one JSON line; then `{"done": name}`. A kernel that crashes or
hangs takes only this process down: the parent marks its row failed and
starts another worker.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from . import builder


def _log(record):
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class Bench:
    def __init__(self, header):
        from .. import targets
        from ..dispatch import Dispatcher
        from ..plugins import get_manager
        from ..timing import TimingOptions
        self.h = header
        self.target = targets.get(header["target"])
        self.kind = get_manager().variant(header["variant"]).problem_kind
        self.timing = TimingOptions(**header["timing"])
        self.d = Dispatcher(tuning=None)
        self.device = header.get("device", "")
        self.prepared = {}

    def library(self, config, key: str):
        """The library of `config` cached under `key`, or an error: workers never build."""
        from ..library import Library
        built = self.d.cache.lookup(key, config.name)
        if built is None:
            raise RuntimeError("not built (run the build phase first)")
        return Library(built.path, expected_name=config.name, config=config)

    def operands(self, idx, copy: int = 0):
        """Inputs of problem idx, made once: (problem, operands, outputs, host
        inputs, session). copy > 0: another set of buffers with the same values,
        for timing with rotating inputs (`TimingOptions.rotating`)."""
        key = (idx, copy)
        if key in self.prepared:
            return self.prepared[key]
        from .. import dtypes
        from ..kinds import prepare, role_names
        from ..plugins import get_manager
        from ..problem import prepare_grouped
        from ..verify import epilogue_operands, random_matrix
        rng = np.random.default_rng(1000 + idx)
        h, lay = self.h, self.h["layout"]
        shapes = h["problems"][idx] if self.kind == "grouped" else [h["problems"][idx]]
        As = [random_matrix(m, k, h["dtype"], lay[0], rng) for m, n, k in shapes]
        Bs = [random_matrix(k, n, h["dtype"], lay[1], rng) for m, n, k in shapes]
        out_token = dtypes.output_for(h["dtype"], h.get("out_dtype")).token
        # the fused epilogue every problem of the sweep fixes: its bias operand, its activation
        extras, choices = epilogue_operands(h.get("fixed", {}), shapes[0][0], shapes[0][1], out_token, rng)
        session = self.target.session(*As, *Bs, *extras.values())
        dev_a, dev_b = session.arrays[:len(As)], session.arrays[len(As):2 * len(As)]
        dev_extras = dict(zip(extras, session.arrays[2 * len(As):]))
        kw = dict(out_dtype=h.get("out_dtype"), target=h["target"], memory=session.memory,
                  allocate=session.empty)
        if self.kind == "grouped":
            problem, ops, outs = prepare_grouped(dev_a, dev_b, variant=h["variant"], **kw)
        else:
            record = get_manager().variant(h["variant"])
            roles = role_names(record)
            arrays = {roles["a"]: dev_a[0], roles["b"]: dev_b[0], **dev_extras}
            problem, blocks, out = prepare(record, arrays, {}, choices, **kw)
            ops, outs = blocks[0], [out]
        self.prepared[key] = (problem, ops, outs, (As, Bs, extras, choices), session)
        return self.prepared[key]

    def references(self, idx):
        """float64 results of problem idx, computed once for all kernels."""
        from ..verify import reference
        key = ("ref", idx)
        if key not in self.prepared:
            _, _, _, (As, Bs, extras, choices), _ = self.operands(idx)
            epi = dict(bias=extras.get("bias"), activation=choices.get("activation", "none"))
            self.prepared[key] = [reference(a, b, **epi) for a, b in zip(As, Bs)]
        return self.prepared[key]

    def measure(self, config, library, idx):
        from ..errors import UnsupportedProblem
        from ..timing import median
        from ..verify import max_rel, tolerance
        problem, ops, outs, _, session = self.operands(idx)
        options = {"stream": session.stream}
        row = {"kernel": config.name, "problem_idx": idx, "device": self.device}
        if self.kind == "grouped":
            row.update(group_count=len(problem.groups), total_flops=problem.flops)
        else:
            row.update(M=problem.m, N=problem.n, K=problem.k)
        for o in outs:  # unwritten elements stay NaN (or INT_MIN) and fail verification
            session.memory.poison(o, session.stream)
        try:
            self.d.launch(library, problem, ops, options)
        except UnsupportedProblem as e:
            return {**row, "status": "unsupported", "reason": str(e)}
        host = [session.finish(o) for o in outs]
        row["non_zero"] = int(sum(np.count_nonzero(np.nan_to_num(np.asarray(o, np.float64))) for o in host))
        if self.h.get("verify"):
            err = max(max_rel(o, ref) for o, ref in zip(host, self.references(idx)))
            tol = tolerance(config, max((s[2] for s in problem.shapes), default=1))
            row.update(max_rel=err, verified=err <= tol)
            if err > tol:
                return {**row, "status": "failed", "reason": f"wrong result: max_rel {err:.3g} > tolerance {tol:.3g}"}
        rotation = [ops] + [self.operands(idx, c)[1] for c in range(1, self.timing.rotating)]
        seconds = median(self.target.measure(lambda i: self.d.launch(library, problem, rotation[i], options),
                                             self.timing, session.stream))
        return {**row, "status": "ok", "reason": "", "latency_ms": seconds * 1e3,
                "tflops": problem.flops / seconds / 1e12}


def main():
    _pin_cpus()
    # a kernel that hangs never reads the closed stdin of a dead parent: watch it
    builder.exit_with_parent(int(os.environ.get("DISPATCHER_WORKER_PARENT", os.getppid())))
    from ..config import KernelConfig
    bench = Bench(json.loads(sys.stdin.readline()))
    _log({"ready": True})
    for line in sys.stdin:
        kernel = json.loads(line)
        config = KernelConfig.from_dict(kernel["config"])
        try:
            library = bench.library(config, kernel["key"])
        except Exception as e:
            for idx in kernel["problems"]:
                _log({"kernel": config.name, "problem_idx": idx, "status": "failed",
                      "reason": f"load: {type(e).__name__}: {e}"})
            _log({"done": config.name})
            continue
        for idx in kernel["problems"]:
            try:
                _log(bench.measure(config, library, idx))
            except Exception as e:
                _log({"kernel": config.name, "problem_idx": idx, "status": "failed",
                      "reason": f"{type(e).__name__}: {e}"})
        _log({"done": config.name})


def _pin_cpus():
    """DISPATCHER_WORKER_CPUS=0,1: pin this worker (and its OpenMP threads) to those CPUs."""
    cpus = os.environ.get("DISPATCHER_WORKER_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


if __name__ == "__main__":
    main()
