"""Merge a GPU session's exported winners into a shipped tuning file.

    python benchmarks/merge_tuning.py NEW.json SHIPPED.json --about "what NEW measured"

NEW.json is what `gemm-dispatcher export-tuning` wrote on the GPU
(`gpu_session.sh tune`). Its rows replace every shipped row of the same
scope (variant, target, arch, dtype, output dtype, layout): a scope is
swept over one grid at a time, so a half-old, half-new scope would mix
winners of different catalogs. Scopes NEW does not have stay as they are.
Sources lose the GPU machine's cache path, and `--about` is appended to
the file's own. The file is replaced whole or not at all.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from dispatcher.tuning import SCOPE


def merged(new: list, shipped: list) -> list:
    """shipped's rows of scopes new does not have, then new's rows, sorted."""
    scope = lambda row: tuple(row[k] for k in SCOPE)  # noqa: E731
    replaced = {scope(r) for r in new}
    rows = [r for r in shipped if scope(r) not in replaced] + [
        {**r, "source": re.sub(r"^.*?(sweeps/)", r"\1", r.get("source", ""))} for r in new]
    return sorted(rows, key=lambda r: (*scope(r), r["size_a"], r["size_b"], r["size_c"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new")
    ap.add_argument("shipped")
    ap.add_argument("--about", required=True, help="what NEW measured, appended to the file's `about`")
    args = ap.parse_args()
    new, shipped = json.loads(Path(args.new).read_text()), Path(args.shipped)
    old = json.loads(shipped.read_text()) if shipped.exists() else {"about": "", "rows": []}
    rows = merged(new["rows"], old["rows"])
    about = "; ".join(part for part in (old["about"], args.about) if part)
    partial = shipped.with_name(f".{shipped.name}.partial")
    partial.write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n")
    partial.replace(shipped)
    print(f"{len(new['rows'])} rows merged into {shipped}: {len(rows)} rows (was {len(old['rows'])})")


if __name__ == "__main__":
    main()
