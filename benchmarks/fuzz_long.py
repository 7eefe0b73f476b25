#!/usr/bin/env python
"""The long profile of the public-API fuzz (tests/test_fuzz.py, issue 13).

    python benchmarks/fuzz_long.py                 # >= 10,000 cases, about 30 min on 2 cores
    python benchmarks/fuzz_long.py --examples 200  # a quick look

1. Builds every kernel the fuzz can ask for (variant x input dtype x output
   dtype x layout x the fuzz's configs, the default selection included) into
   one fresh build cache, `--jobs` compiles at a time, so the fuzz itself
   compiles nothing.
2. Runs the three fuzz tests (`test_gemm[regular]`, `test_gemm[stream_k]`,
   `test_grouped`; `-m ""`: whatever markers exclude them from the suite) with
   `HYPOTHESIS_PROFILE=long`, `--examples` examples each
   (3400: 10,200 cases), as `--jobs` concurrent pytest processes on that
   cache, each with its own seed (`--seed` + its index; random by default).
3. Writes the summary to `--out` (default benchmarks/results/fuzz_long.json):
   cases in all and per variant, zero-size cases, guarded out= and c = out
   cases, stream-K status -2 of given configs, kernels built, failures (the
   test, the falsifying example, the error), seconds, the machine, its CPU
   and the ISA, versions and the seeds to replay a run.

Exit status 0 when every test passed and the case count was reached.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_fuzz.py::test_gemm[regular]", "tests/test_fuzz.py::test_gemm[stream_k]",
         "tests/test_fuzz.py::test_grouped"]


CASE_KEYS = ("cases regular", "cases stream_k", "cases grouped", "stream_k status -2 (given config, strict)")


def kernel_configs() -> list:
    """Every KernelConfig (as a dict) the fuzz can run: its explicit configs
    and the default selection's, for each dtype, output dtype and layout."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_fuzz

    from dispatcher import dtypes
    from dispatcher.api import Dispatcher
    from dispatcher.problem import GemmProblem, GroupedGemmProblem

    d = Dispatcher(tuning=None)
    found = {}
    for variant, labels in test_fuzz.CONFIG_LABELS.items():
        for token, layout in itertools.product(dtypes.INPUT_TOKENS, ("rcr", "rrr", "crr", "ccr")):
            for out in dtypes.get(token).outputs:
                if variant == "grouped":
                    problem = GroupedGemmProblem(((64, 64, 64),), token, out, layout, variant)
                else:
                    problem = GemmProblem(64, 64, 64, token, out, layout, variant)
                for label in labels:
                    fields = test_fuzz.config_for(variant, label, out)
                    config = d.select(problem) if fields is None else d.config_for(problem, fields)
                    found[config.name] = config.to_dict()
    return list(found.values())


def _build(fields: dict) -> str:
    from dispatcher import KernelConfig
    from dispatcher.api import Dispatcher

    config = KernelConfig.from_dict(fields)
    Dispatcher(tuning=None).library(config)
    return config.name


def prebuild(cache: Path, jobs: int) -> tuple:
    os.environ["DISPATCHER_CACHE_DIR"] = str(cache)
    configs = kernel_configs()
    start = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for done, _ in enumerate(pool.imap_unordered(_build, configs), 1):
            if done % 50 == 0 or done == len(configs):
                print(f"  built {done}/{len(configs)} kernels ({time.monotonic() - start:.0f} s)",
                      flush=True)
    return len(configs), time.monotonic() - start


def machine() -> dict:
    from dispatcher.targets import cpu_isa
    from dispatcher.targets.cpu import cpu_count

    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    import hypothesis
    import numpy
    return {"host": platform.node(), "cpu": model or platform.processor(), "cpus": cpu_count(),
            "isa": cpu_isa.active().name, "platform": platform.platform(),
            "python": platform.python_version(), "numpy": numpy.__version__,
            "hypothesis": hypothesis.__version__}


def failures_of(junit: Path) -> list:
    out = []
    if not junit.exists():
        return [{"test": "?", "error": "pytest wrote no report"}]
    for case in ET.parse(junit).getroot().iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            text = bad.text or ""
            example = [l for l in text.splitlines() if "Falsifying example" in l or "Draw 1" in l
                       or l.strip().startswith("E   {'variant'")]
            out.append({"test": f"{case.get('classname')}::{case.get('name')}",
                        "error": (bad.get("message") or "")[:2000],
                        "example": "\n".join(example)[:4000]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--examples", type=int, default=3400, help="examples per test (3 tests)")
    p.add_argument("--seed", type=int, default=None, help="base seed (default: random)")
    p.add_argument("--jobs", type=int, default=min(3, os.cpu_count() or 1),
                   help="concurrent compiles, then concurrent test processes")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fuzz_long.json"))
    p.add_argument("--cache", default=None, help="build cache to use (default: a fresh one)")
    p.add_argument("--no-prebuild", action="store_true",
                   help="let the tests build what they use (a quick run)")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz_long.") as tmp:
        tmp = Path(tmp)
        cache = Path(args.cache) if args.cache else tmp / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        kernels, build_s = 0, 0.0
        if not args.no_prebuild:
            print(f"prebuilding the fuzz's kernels into {cache} ({args.jobs} at a time)", flush=True)
            kernels, build_s = prebuild(cache, args.jobs)
        env = {**os.environ, "HYPOTHESIS_PROFILE": "long", "FUZZ_LONG_EXAMPLES": str(args.examples),
               "DISPATCHER_TEST_CACHE_DIR": str(cache)}
        runs, pending = [], list(enumerate(TESTS))
        fuzz_start = time.monotonic()
        while pending or runs:
            while pending and len([r for r in runs if r["proc"].poll() is None]) < args.jobs:
                i, test = pending.pop(0)
                stats, junit, log = tmp / f"stats{i}.json", tmp / f"junit{i}.xml", tmp / f"log{i}.txt"
                # -o addopts=: one process per job, not pyproject's -n auto workers each
                cmd = [sys.executable, "-m", "pytest", test, "-m", "", "-o", "addopts=", "-q", "-p", "no:cacheprovider",
                       "-W", "ignore::DeprecationWarning", f"--hypothesis-seed={seed + i}",
                       f"--junitxml={junit}"]
                print(f"running {test} (seed {seed + i})", flush=True)
                runs.append(dict(test=test, seed=seed + i, stats=stats, junit=junit, log=log,
                                 t0=time.monotonic(), cmd=cmd,
                                 proc=subprocess.Popen(cmd, cwd=ROOT, env={**env, "FUZZ_STATS": str(stats)},
                                                       stdout=open(log, "w"), stderr=subprocess.STDOUT)))
            if all(r["proc"].poll() is not None for r in runs) and not pending:
                break
            time.sleep(1)
            for r in runs:
                if r["proc"].poll() is not None and "seconds" not in r:
                    r["seconds"] = round(time.monotonic() - r["t0"], 1)
                    print(f"  {r['test']}: exit {r['proc'].returncode} after {r['seconds']} s", flush=True)
        fuzz_s = time.monotonic() - fuzz_start
        counts, failures, tests = {}, [], []
        for r in runs:
            stats = json.loads(r["stats"].read_text()) if r["stats"].exists() else {"counts": {}}
            for key, value in stats["counts"].items():
                counts[key] = counts.get(key, 0) + value
            failed = failures_of(r["junit"])
            if r["proc"].returncode != 0 and not failed:  # e.g. 5: nothing collected
                failed = [{"test": r["test"], "error": f"pytest exited {r['proc'].returncode}",
                           "example": ""}]
            failures += failed
            tests.append({"test": r["test"], "seed": r["seed"], "exit": r["proc"].returncode,
                          "seconds": r.get("seconds"), "cases": sum(v for k, v in stats["counts"].items()
                                                                    if k in CASE_KEYS),
                          "log_tail": "" if not failed else r["log"].read_text()[-3000:]})
    per_variant = {k.split(" ", 1)[1]: v for k, v in counts.items() if k.startswith("cases ") and
                   k.split(" ", 1)[1] in ("regular", "stream_k", "grouped")}
    unsupported = counts.get("stream_k status -2 (given config, strict)", 0)
    cases = sum(per_variant.values()) + unsupported
    summary = {
        "command": "python benchmarks/fuzz_long.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "profile": "long", "examples_per_test": args.examples, "seed": seed,
        "cases": cases, "cases_per_variant": per_variant,
        "stream_k_status_minus_2_of_given_configs": unsupported,
        "failures": len(failures), "failure_details": failures,
        "counts": counts, "kernels_prebuilt": kernels,
        "seconds": {"total": round(time.monotonic() - start, 1), "prebuild": round(build_s, 1),
                    "fuzz": round(fuzz_s, 1)},
        "jobs": args.jobs, "tests": tests, "machine": machine(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{cases} cases ({per_variant}), {len(failures)} failures, "
          f"{summary['seconds']['total']} s -> {args.out}")
    ok = not failures and all(t["exit"] == 0 for t in tests) and cases >= 3 * args.examples
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
