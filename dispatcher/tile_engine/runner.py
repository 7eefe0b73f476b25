"""Benchmark phase: a shared work queue of kernels, one disposable worker
process per device slot, a per-kernel timeout.

Each slot owns one `python -m dispatcher.tile_engine.worker` process, pinned
to its device (`CUDA_VISIBLE_DEVICES=<id>` on the GPU; a disjoint set of
CPUs and `OMP_NUM_THREADS` on the CPU). A kernel that crashes the worker
or makes it hang fails its remaining rows with the reason; the slot starts
a new worker and takes the next kernel.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading

from tqdm import tqdm

from ..errors import ConfigError


class WorkerDied(Exception):
    pass


class WorkerProcess:
    def __init__(self, header: dict, env: dict, startup_timeout: float = 300.0):
        self.header, self.env, self.startup_timeout = header, env, startup_timeout
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "dispatcher.tile_engine.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=self.env, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()
        self.proc.stdin.write(json.dumps(self.header) + "\n")
        self.proc.stdin.flush()
        self._next(self.startup_timeout)

    @staticmethod
    def _pump(proc, lines):
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF

    def _next(self, timeout):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise WorkerDied(f"timed out after {timeout:g} s") from None
        if line is None:
            code = self.proc.wait()
            reason = f"worker crashed (signal {-code})" if code < 0 else f"worker exited with code {code}"
            self.proc = None
            raise WorkerDied(reason)
        return json.loads(line)

    def run(self, config_dict: dict, timeout: float):
        """Yield the rows of one kernel; WorkerDied if it crashed or hung."""
        if self.proc is None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(config_dict) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc = None
            raise WorkerDied("worker exited before the kernel was sent") from None
        while True:
            record = self._next(timeout)
            if "done" in record:
                return
            yield record

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def parse_devices(text, target: str) -> list:
    """--devices: ids "0,1" (one worker each; "0,0" runs two workers on GPU 0)
    or one id "3". Default: every visible GPU, or one CPU worker."""
    if text is None or text == "":
        if target == "cpu":
            return ["0"]
        from ..targets import cuda_memory
        return [str(i) for i in range(cuda_memory.device_count())] or ["0"]
    ids = [d.strip() for d in str(text).split(",") if d.strip()]
    if not ids or not all(d.isdigit() for d in ids):
        raise ConfigError(f"--devices wants device ids like 0 or 0,1, got {text!r}")
    return ids


def slot_environment(target: str, device: str, slot: int, slots: int) -> dict:
    env = dict(os.environ)
    if target == "cpu":
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        mine = cpus[slot::slots] or cpus
        env.update(DISPATCHER_WORKER_CPUS=",".join(map(str, mine)), OMP_NUM_THREADS=str(len(mine)),
                   OMP_PROC_BIND="close")
    else:
        env["CUDA_VISIBLE_DEVICES"] = device
    return env


def benchmark(configs, header: dict, devices: list, kernel_timeout: float, writer, todo: dict,
              progress: bool = True) -> list:
    """Measure every (kernel, problem) in `todo` ({name: [problem idx]}); rows, also written."""
    work = queue.Queue()
    for c in configs:
        if todo.get(c.name):
            work.put(c)
    total = sum(len(v) for v in todo.values())
    bar = tqdm(total=total, desc="benchmark", unit="run", disable=not progress, file=sys.stderr)
    rows, lock = [], threading.Lock()

    def emit(row):
        writer.write(row)
        with lock:
            rows.append(row)
            bar.update()
            bar.set_postfix(failed=sum(r["status"] != "ok" for r in rows))

    def slot(index, device):
        label = f"{header['target']}:{device}"
        worker = WorkerProcess({**header, "device": label, "todo": todo},
                               slot_environment(header["target"], device, index, len(devices)))
        while True:
            try:
                config = work.get_nowait()
            except queue.Empty:
                break
            pending = list(todo[config.name])
            try:
                for record in worker.run(config.to_dict(), kernel_timeout):
                    pending.remove(record["problem_idx"])
                    emit(record)
            except WorkerDied as e:
                for idx in pending:
                    emit({"kernel": config.name, "problem_idx": idx, "device": label,
                          "status": "failed", "reason": str(e)})
        worker.kill()

    threads = [threading.Thread(target=slot, args=(i, d)) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    return rows
