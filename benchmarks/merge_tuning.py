"""Merge a GPU session's exported times into a shipped tuning file.

    python benchmarks/merge_tuning.py NEW.json SHIPPED.json --about "what NEW measured" [--add]

NEW.json is what `gemm-dispatcher export-tuning` wrote on the GPU
(`gpu_session.sh tune`). Its rows replace every shipped row of the same
scope (variant, target, arch, dtype, output dtype, layout): a scope is
swept over one grid at a time, so a half-old, half-new scope would mix
times of different catalogs. Scopes NEW does not have stay as they are.
With --add, NEW's rows replace only the rows of their own problem and
kernel: a scope that holds more grids or kernels than NEW swept (regular
bf16 rcr: the mid-size grid, split-K and hybrid kernels) keeps them, and
its new kernels join it.
Sources lose the GPU machine's cache path, and `--about` is appended to
the file's own. The file is replaced whole or not at all.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dispatcher.tuning import SCOPE, read_shipped, write_shipped


def merged(new: list, shipped: list, add: bool = False) -> list:
    """shipped's rows of scopes new does not have (add: of problems and
    kernels new does not have), then new's rows (`write_shipped` sorts them)."""
    scope = lambda row: tuple(row[k] for k in SCOPE) + ((row["problem"], row["kernel"]) if add else ())  # noqa: E731
    replaced = {scope(r) for r in new}
    return [r for r in shipped if scope(r) not in replaced] + [
        {**r, "source": re.sub(r"^.*?(sweeps/)", r"\1", r.get("source", ""))} for r in new]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new")
    ap.add_argument("shipped")
    ap.add_argument("--about", required=True, help="what NEW measured, appended to the file's `about`")
    ap.add_argument("--add", action="store_true", help="replace only rows of NEW's problems and kernels")
    args = ap.parse_args()
    (_, new), shipped = read_shipped(args.new), Path(args.shipped)
    about, old = read_shipped(shipped) if shipped.exists() else ("", [])
    rows = merged(new, old, args.add)
    about = "; ".join(part for part in (about, args.about) if part)
    written = write_shipped(shipped, about, rows)
    print(f"{len(new)} rows merged into {shipped}: {written} rows (was {len(old)})")


if __name__ == "__main__":
    main()
