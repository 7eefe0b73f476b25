"""Turn the catalog times of `cuda_gemm.py` results into shipped tuning times.

    python benchmarks/bench_to_tuning.py RESULTS.json [...] --parts mlp --out NEW.json --about "..."
    python benchmarks/merge_tuning.py NEW.json dispatcher/data/tuning/sm_90a.json --add --about "..."

A `cuda_gemm.py` row keeps every catalog kernel's time on its problem
(`catalog_us`: the kernel alone, its launch graph-replayed, the L2 flushed
before each), the same measurement a catalog sweep of that one problem
makes (`gemm-dispatcher sweep`). So where a GPU session has timed the
catalog on problems worth shipping (the MLP grid's forward, dX and dW GEMMs:
`--only mlp`), those times become rows of the shipped database without
timing them again. Rows of the parts named only (default: mlp), bf16, each
in its own layout; the architecture is the run's (`nvcc` in its
environment). Kernels outside the catalogs of those layouts and the
shipped file's configs are left out.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_sweeps  # noqa: E402
from dispatcher.tuning import SHIPPED_DIR, read_shipped, write_shipped  # noqa: E402


def arch_of(result: dict) -> str:
    """The run's CUDA architecture, e.g. sm_90a, from its environment."""
    found = re.search(r"\| (sm_\w+) \|", result["environment"].get("nvcc", ""))
    if not found:
        raise SystemExit("the results name no CUDA architecture (environment.nvcc): not a cuda_gemm.py run on a GPU")
    return found.group(1)


def configs_for(layouts: set, arch: str) -> dict:
    """Kernel name -> config dict: the bf16 catalogs of `layouts`, and every
    config the shipped file of `arch` names (the hybrid and split-K kernels)."""
    known = {c.name: c.to_dict() for c in cuda_sweeps.catalog(("regular",), ("bf16",), tuple(sorted(layouts)))}
    shipped = SHIPPED_DIR / f"{arch}.json"
    if shipped.exists():
        known.update({r["kernel"]: r["config"] for r in read_shipped(shipped)[1]})
    return known


def tuning_rows(result: dict, parts: list, source: str) -> list:
    """The shipped-time rows of `result`'s catalog times in `parts`."""
    arch = arch_of(result)
    rows = [(part, r) for part in parts for r in result.get(part, []) if "catalog_us" in r]
    configs = configs_for({r.get("layout", "rcr") for _, r in rows}, arch)
    updated = result["environment"].get("date", time.strftime("%Y-%m-%dT%H:%M:%S"))[:19]
    out = []
    for part, r in rows:
        for kernel, us in r["catalog_us"].items():
            if kernel not in configs:
                continue
            out.append({"variant": "regular", "target": "cuda", "arch": arch, "dtype": "bf16", "out_dtype": "bf16",
                        "layout": r.get("layout", "rcr"), "problem": f"{r['M']}x{r['N']}x{r['K']}",
                        "size_a": float(r["M"]), "size_b": float(r["N"]), "size_c": float(r["K"]),
                        "kernel": kernel, "latency_ms": us / 1e3, "source": f"{source} {part}",
                        "updated": updated, "config": configs[kernel]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="cuda_gemm.py result JSON files")
    ap.add_argument("--parts", default="mlp", help="comma-separated parts of the results (default: mlp)")
    ap.add_argument("--out", required=True, help="the shipped-times file to write (for merge_tuning.py)")
    ap.add_argument("--about", required=True, help="what the results measured, and where")
    args = ap.parse_args()
    rows = []
    for path in args.results:
        rows += tuning_rows(json.loads(Path(path).read_text()), args.parts.split(","), f"cuda_gemm {Path(path).name}")
    if not rows:
        raise SystemExit(f"no catalog times in the parts {args.parts} of {', '.join(args.results)}")
    written = write_shipped(Path(args.out), args.about, rows)
    print(f"{written} rows of {len(rows)} catalog times written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
