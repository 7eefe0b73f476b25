"""Benchmark phase, shared by every executor: a work queue of kernels (each
on one share of the problems at a time: `share_jobs`), one thread per
benchmark slot, a per-measurement timeout, the driver the only writer of
rows.

A slot is where one measurement at a time runs: an executor hands out slots
(a `label`, and `open()`, which gives a worker: its `label`, `run(kernel,
timeout)`, which yields rows, and `kill()`). Every worker ends in a disposable `python -m
dispatcher.tile_engine.worker` process (`WorkerProcess`), started here or on
another host. A kernel that crashes that process or makes it hang fails its
remaining rows with the reason (`WorkerDied`); the slot starts a new worker
and takes the next kernel. A slot whose worker is lost for a reason that is
not the kernel's (`SlotLost`: the worker process SIGKILLed by someone else,
as the OOM killer does; a Ray actor or node died) puts the kernel's
unmeasured problems back on the queue once, for a fresh worker, and fails
them with the reason the second time. A slot that cannot open a worker
retires; when the last one does, what is left on the queue fails.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading

import attrs
from tqdm import tqdm


class WorkerDied(Exception):
    """The kernel took its worker down (crash, hang) or could not be loaded:
    its remaining rows fail with this reason."""


class SlotLost(Exception):
    """The slot's worker is gone for a reason outside the kernel (its actor
    or host died, its process was SIGKILLed): its remaining rows are
    retried once."""


class WorkerProcess:
    def __init__(self, header: dict, env: dict, startup_timeout: float = 300.0):
        self.header, self.env, self.startup_timeout = header, env, startup_timeout
        self.label = header["device"]  # the device column of its rows
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "dispatcher.tile_engine.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                     env={**self.env, "DISPATCHER_WORKER_PARENT": str(os.getpid())})
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
            self.proc = None
            if code == -signal.SIGKILL:  # not the kernel's doing (timeouts are caught above)
                raise SlotLost("worker process killed (signal 9) from outside the sweep "
                               "(the OOM killer, a user)")
            reason = f"worker crashed (signal {-code})" if code < 0 else f"worker exited with code {code}"
            raise WorkerDied(reason)
        return json.loads(line)

    def run(self, kernel: dict, timeout: float):
        """Yield the rows of one kernel ({"config", "key", "problems"}, the
        worker's kernel line); WorkerDied if it crashed or hung."""
        if self.proc is None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(kernel) + "\n")
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


@attrs.frozen
class Job:
    """One kernel's problems (of one share: `share_jobs`) still to measure; `attempt` 1 is its retry."""
    config: object
    problems: tuple
    attempt: int = 0


# Shares of a sweep's problems, measured in turn (`share_jobs`).
PROBLEM_SHARES = 4


def share_jobs(configs, todo: dict, shares: int = PROBLEM_SHARES) -> list:
    """The jobs of `todo` ({name: [problem idx]}) in the order they run:
    every kernel on one share of its problems before any kernel on the
    next (share s: the problems whose index is s modulo `shares`, so each
    spans the grid, and a resumed sweep's shares are the same problems). A
    sweep stopped early (a time limit, Ctrl-C) then holds every kernel's
    time on the problems of the shares it finished, which rank the kernels
    there, rather than the first kernels' times on every problem and
    nothing of the rest (a 180 s sweep of 50 kernels on the GPU measured 20
    of them). A worker loads a library once per share."""
    jobs = []
    for share in range(shares):
        for c in configs:
            problems = tuple(p for p in todo.get(c.name, ()) if p % shares == share)
            if problems:
                jobs.append(Job(c, problems))
    return jobs


class JobQueue:
    """Jobs for the slots' threads. Every `take` is followed by a `finish`.
    `take` blocks while jobs are out (a lost slot may put one back) and
    returns None once every job is finished."""

    def __init__(self, jobs):
        self._jobs = collections.deque(jobs)
        self._open = len(self._jobs)
        self._cond = threading.Condition()

    def take(self):
        with self._cond:
            while not self._jobs and self._open > 0:
                self._cond.wait()
            return self._jobs.popleft() if self._jobs and self._open > 0 else None

    def abandon(self):
        """Every `take` returns None from now on (a slot's thread failed)."""
        with self._cond:
            self._open = 0
            self._cond.notify_all()

    def put_back(self, job: Job):
        """Queue `job` again (a retry, or a job its slot could not run); the
        taker still calls `finish` for the job it took."""
        with self._cond:
            self._jobs.append(job)
            self._open += 1
            self._cond.notify()

    def finish(self):
        with self._cond:
            self._open -= 1
            self._cond.notify_all()

    def drain(self) -> list:
        """Every job not taken, now finished."""
        with self._cond:
            left, self._jobs = list(self._jobs), collections.deque()
            self._open -= len(left)
            self._cond.notify_all()
            return left


def benchmark(configs, keys: dict, todo: dict, slots: list, kernel_timeout: float, writer,
              progress: bool = True) -> list:
    """Measure every (kernel, problem) in `todo` ({name: [problem idx]}) on
    `slots`; the rows, each also written by `writer` as it arrives.
    `keys`: {name: build-cache key}."""
    jobs = JobQueue(share_jobs(configs, todo))
    total = sum(len(todo.get(c.name, ())) for c in configs)
    bar = tqdm(total=total, desc="benchmark", unit="run", disable=not progress, file=sys.stderr)
    rows, lock = [], threading.Lock()
    live, errors = [len(slots)], []

    def emit(row):
        writer.write(row)
        with lock:
            rows.append(row)
            bar.update()
            bar.set_postfix(failed=sum(r["status"] != "ok" for r in rows))

    def fail(job, label, reason):
        for idx in job.problems:
            emit({"kernel": job.config.name, "problem_idx": idx, "device": label,
                  "status": "failed", "reason": reason})

    def retire(slot, job, reason):
        """The slot cannot open a worker: its job goes back; the last slot fails what is left."""
        jobs.put_back(job)
        jobs.finish()
        with lock:
            live[0] -= 1
            last = live[0] == 0
        if last:
            for left in jobs.drain():
                fail(left, slot.label, f"no benchmark slot left ({reason})")

    def run_slot(slot):
        try:
            measure_on(slot)
        except BaseException as e:  # not a worker's failure: a bug or the writer's; stop the sweep
            errors.append(e)
            jobs.abandon()

    def measure_on(slot):
        worker = None
        try:
            while (job := jobs.take()) is not None:
                if worker is None:
                    try:
                        worker = slot.open()
                    except SlotLost as e:
                        retire(slot, job, str(e))
                        return
                if not measure(worker, job):
                    worker = None
                jobs.finish()
        finally:
            if worker is not None:
                worker.kill()

    def measure(worker, job) -> bool:
        """Run one job on `worker`; False if the worker was lost (and killed)."""
        label, pending = worker.label, list(job.problems)
        kernel = {"config": job.config.to_dict(), "key": keys[job.config.name], "problems": pending[:]}
        try:
            for record in worker.run(kernel, kernel_timeout):
                pending.remove(record["problem_idx"])
                emit(record)
        except WorkerDied as e:
            fail(attrs.evolve(job, problems=pending), label, str(e))
        except SlotLost as e:
            worker.kill()
            if pending and job.attempt == 0:
                print(f"{label}: {e}; {len(pending)} measurement(s) of {job.config.name} back on the "
                      "queue for another worker", file=sys.stderr, flush=True)
                jobs.put_back(attrs.evolve(job, problems=tuple(pending), attempt=1))
            else:
                fail(attrs.evolve(job, problems=pending), label, f"{e} (on the retry too)")
            return False
        return True

    threads = [threading.Thread(target=run_slot, args=(s,)) for s in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    if errors:
        raise errors[0]
    return rows
