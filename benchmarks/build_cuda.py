"""Build CUDA kernels into a build cache ahead of a GPU run, in parallel.

    python benchmarks/build_cuda.py --set catalog|tests|all [--jobs 2] [--pack OUT.tar.xz]

The sets (benchmarks/cuda_sweeps.py) are the variants' catalogs and the
configs the GPU tests use. Run it on the GPU machine itself (nvcc there,
many cores), or here and carry the cache packed with --pack.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_sweeps  # noqa: E402
from dispatcher.api import Dispatcher  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--set", default="all", help="a set of benchmarks/cuda_sweeps.py, or several joined by +: "
                    + ", ".join(sorted(cuda_sweeps.SETS)))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--pack", help="write the cache's kernels to this .tar.xz")
    args = ap.parse_args()
    d = Dispatcher()
    unknown = set(args.set.split("+")) - set(cuda_sweeps.SETS)
    if unknown:
        ap.error(f"unknown set(s) {', '.join(sorted(unknown))}; sets: {', '.join(sorted(cuda_sweeps.SETS))}")
    configs = list({c.name: c for name in args.set.split("+") for c in cuda_sweeps.SETS[name]()}.values())
    failures = []
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(lambda c: d.build(d.codegen(c)), c): c for c in configs}
        for f in tqdm(as_completed(futures), total=len(futures), desc=f"nvcc {args.set}", unit="kernel"):
            if f.exception() is not None:
                failures.append((futures[f].name, str(f.exception())[:2000]))
    for name, error in failures:
        print(f"FAILED {name}\n{error}", file=sys.stderr)
    print(f"{len(configs) - len(failures)} of {len(configs)} kernels in {d.cache.root}")
    if args.pack:
        subprocess.run(["tar", "-cJf", args.pack, "-C", str(d.cache.root), "kernels"], check=True)
        print(f"packed into {args.pack} ({Path(args.pack).stat().st_size / 1e6:.1f} MB)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
