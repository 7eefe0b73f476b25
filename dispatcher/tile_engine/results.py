"""Sweep results: CSV with CK's columns plus status and reason, and JSON
lines (an environment record, then one record per measurement). Rows are
appended and flushed one at a time, so a killed sweep loses nothing already
measured; `done_keys` lets `--resume` skip them."""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

from ..errors import ConfigError
from ..files import read_text

GEMM_COLUMNS = ["kernel", "problem_idx", "M", "N", "K", "device", "latency_ms", "tflops", "non_zero",
                "max_rel", "verified", "status", "reason"]
GROUPED_COLUMNS = ["kernel", "problem_idx", "group_count", "total_flops", "latency_ms", "tflops",
                   "non_zero", "max_rel", "verified", "status", "reason"]


def columns(kind: str) -> list:
    return GROUPED_COLUMNS if kind == "grouped" else GEMM_COLUMNS


def environment(target: str) -> dict:
    from .. import targets
    from ..plugins import _version
    tgt = targets.get(target)
    try:
        compiler = tgt.toolchain().identity
    except Exception as e:  # a sweep without a toolchain still records why
        compiler = f"unavailable: {e}"
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": platform.machine(),
            "node": platform.node(), "python": sys.version.split()[0],
            "gemm_dispatcher": _version("gemm-dispatcher"), "target": target,
            "arch": tgt.arch_id(), "compiler": compiler}


class ResultWriter:
    def __init__(self, out_dir, kind: str, target: str):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.dir / "results.csv"
        self.jsonl_path = self.dir / "results.jsonl"
        self.columns = columns(kind)
        self._lock = threading.Lock()
        for path in (self.csv_path, self.jsonl_path):
            _drop_partial_line(path)
        new = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        if not new:
            with open(self.csv_path, newline="") as f:
                header = next(csv.reader(f), [])
            if header != self.columns:
                raise ConfigError(f"{self.csv_path} has columns {header}, expected {self.columns}; "
                                 "use another --out")
        self._csv = open(self.csv_path, "a", newline="")
        self._writer = csv.DictWriter(self._csv, fieldnames=self.columns, extrasaction="ignore")
        if new:
            self._writer.writeheader()
        self._jsonl = open(self.jsonl_path, "a")
        self._append_json({"environment": environment(target)})

    def _append_json(self, record):
        self._jsonl.write(json.dumps(record, default=str) + "\n")
        self._jsonl.flush()
        os.fsync(self._jsonl.fileno())

    def write(self, row: dict):
        with self._lock:
            self._writer.writerow(row)
            self._csv.flush()
            os.fsync(self._csv.fileno())
            self._append_json(row)

    def close(self):
        self._csv.close()
        self._jsonl.close()


def _drop_partial_line(path: Path):
    """A sweep killed mid-write can leave half a row: cut it off."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read(path) -> list:
    """Rows of a results CSV (or of results.csv in a folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    if not path.exists():
        return []
    return list(csv.DictReader(io.StringIO(read_text(path, "results file"), newline="")))


def done_keys(out_dir) -> set:
    """(kernel, problem_idx) pairs already measured (ok or failed)."""
    return {(r["kernel"], int(r["problem_idx"])) for r in read(out_dir)}
