"""Selection's regret replayed offline on measured catalog times.

    python benchmarks/selection_replay.py benchmarks/results/cuda_gemm_midsize_h100_ef3555f.json \
        benchmarks/results/cuda_gemm_h100_ef3555f.json

For every bf16 row of `cuda_gemm.py` results (its `catalog_us`: each
catalog kernel's time on that shape, measured on the GPU; rcr, or the
row's own layout in the `mlp` part), asks this
checkout's selection, as a fresh install has it (the shipped tuning times,
no GPU needed), which kernel it would run, and prints that kernel's time
over the catalog's best: the regret a change to selection gives, before a
GPU run confirms it. A pick the run did not time (outside the catalog) is
counted apart. Shapes that helped choose a rule are no held-out check of it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import geomean  # noqa: E402
from dispatcher.api import Dispatcher  # noqa: E402
from dispatcher.problem import GemmProblem  # noqa: E402
from dispatcher.tuning import TuningDatabase  # noqa: E402

PARTS = ("regular", "unaligned", "skinny", "random", "mlp")


def measured_rows(paths) -> list:
    """(part, row) of each shape once (the first file that has it)."""
    seen, rows = set(), []
    for path in paths:
        result = json.loads(Path(path).read_text())
        for part in PARTS:
            for row in result.get(part, []):
                shape = (row["M"], row["N"], row["K"], row.get("layout", "rcr"))
                if "catalog_us" in row and shape not in seen:
                    seen.add(shape)
                    rows.append((part, row))
    return rows


def replay(rows) -> list:
    """[(part, shape, chosen kernel, what decided, regret or None)]."""
    d = Dispatcher(tuning=TuningDatabase(Path(tempfile.mkdtemp()) / "tuning.sqlite"))
    out = []
    for part, row in rows:
        layout = row.get("layout", "rcr")
        problem = GemmProblem(row["M"], row["N"], row["K"], "bf16", "bf16", layout, "regular", "cuda")
        found = d.explain(problem)
        chosen = found["chosen"].name
        times = dict(row["catalog_us"])
        if row.get("default_kernel_us"):
            times[row["default_kernel"]] = row["default_kernel_us"]
        regret = times[chosen] / min(row["catalog_us"].values()) if chosen in times else None
        tuned = found["tuned"]
        how = ("model" if not tuned else "exact" if tuned.exact else f"fitted ({tuned.fitted})" if tuned.fitted
               else f"{tuned.neighbours} neighbours")
        out.append((part, (row["M"], row["N"], row["K"]), layout, chosen, how, regret))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="cuda_gemm.py result JSON files")
    ap.add_argument("--quiet", action="store_true", help="only the summary")
    args = ap.parse_args()
    picks = replay(measured_rows(args.results))
    for part, shape, layout, chosen, how, regret in picks:
        if not args.quiet:
            shown = f"{regret:6.3f}" if regret is not None else "   n/a"
            print(f"{part:9} {'x'.join(map(str, shape)):>18} {layout}  {shown}  {how:13} {chosen}")
    regrets = [p[-1] for p in picks if p[-1] is not None]
    missing = len(picks) - len(regrets)
    print(f"{len(regrets)} shapes: regret geomean {geomean(regrets):.4f}, worst {max(regrets):.3f}"
          f"{f'; {missing} picks not timed in those runs' if missing else ''}")
    for part in PARTS:
        some = [p[-1] for p in picks if p[0] == part and p[-1] is not None]
        if some:
            print(f"  {part:9} {len(some):3} shapes: geomean {geomean(some):.4f}, worst {max(some):.3f}")
    return 0 if regrets and math.isfinite(geomean(regrets)) else 1


if __name__ == "__main__":
    sys.exit(main())
