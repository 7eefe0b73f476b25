#!/usr/bin/env python
"""Stress the build cache and the tuning database with concurrent processes,
threads, random corruption and SIGKILLs (issue 13).

A controller builds the configs, then starts `--workers` worker processes
(each with `--threads` actor threads) that share one build cache and one
tuning database. Each actor repeatedly does one random action:

  gemm      build (when absent or corrupt), load and run one of a few small
            fp32 configs on random operands, through a long-lived or a fresh
            `Dispatcher`; the result is checked against a float64 reference
  entries   `BuildCache.entries()`
  prune     `BuildCache.prune()`
  corrupt   damage a random entry: truncate or flip bytes of its library (in
            place, or as a new file renamed over it), delete its library or
            meta.json, swap in another kernel's library with its hash
            recomputed, write garbage meta.json, or add a stray folder
  record    write a tuning row with a problem key no other writer uses; an
            acknowledged row (record() returned True) is logged after the call
  contend   upsert one of a few problem keys every writer shares (the stored
            latency must end as the fastest acknowledged one)
  lookup    read the tuning database

The controller SIGKILLs a random worker (and its compiler) every
`--kill-every` seconds on average and starts a new one. At the end it stops
the workers, checks what must hold and writes the figures as JSON:

  wrong_answers             results that differ from the reference      (0)
  crashes                   workers that died without being killed      (0)
  python_errors             exceptions that are not DispatcherErrors    (0)
  lost_tuning_rows          acknowledged rows missing at the end        (0)
  lost_updates              shared keys whose stored latency is not the
                            fastest acknowledged one                    (0)
  unexplained_corrupt_reads corrupt entries no injected corruption
                            explains, by key and folder inode (a
                            half-written entry a reader saw)            (0)
  unexplained_gemm_failures gemm calls that raised (a DispatcherError)
                            although their entry was not damaged in the
                            minute before                               (0)
  hung_workers              workers that made no progress for 90 s, or
                            did not stop within 60 s when told          (0)
  recovery                  every config builds and runs correctly at the
                            end; the quarantine holds <= QUARANTINE_KEEP
                            copies after a set-aside; a killed build leaves
                            at most one staging folder and `prune` removes
                            them all once they are old

Usage (the committed results/cache_stress.json):

    python benchmarks/cache_stress.py --seconds 600 --out benchmarks/results/cache_stress.json

`tests/test_cache_stress.py` runs a bounded profile (20 s of stress) in the
fast suite. Exit status 1 when an invariant fails. Workers' logs, fault
handler dumps and stderr stay in the work folder when a run fails (or with
--keep).
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import mmap
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# What an actor thread is doing, one byte per thread in the worker's state
# file: the controller reads it just before a kill.
STATE_CODES = {"gemm": b"g", "compile": b"b", "set_aside": b"s", "prune": b"p", "entries": b"e",
               "corrupt": b"x", "record": b"t", "contend": b"u", "lookup": b"l", "idle": b"i",
               "starting": b"-"}
STATE_NAMES = {v: k for k, v in STATE_CODES.items()}
ACTIONS = {"gemm": 60, "entries": 6, "prune": 3, "corrupt": 6, "record": 12, "contend": 4,
           "lookup": 6}
CORRUPTIONS = {"truncate_in_place": 1, "flip_in_place": 1, "truncate_replace": 2,
               "flip_replace": 2, "delete_library": 1, "delete_meta": 1, "swap_library": 2,
               "garbage_meta": 2, "stray_folder": 1}
SHARED_KEYS = 8
EVENT_CAP = 5000  # logged lines per event kind and worker incarnation (the rest only counted)


def stress_configs():
    """A few small fp32 configs of the active ISA, one thread each (compiles stay few)."""
    import dispatcher
    from dispatcher.targets import cpu_isa

    mm, mn = cpu_isa.active().isa.micro_tile
    shapes = [("rrr", 4, 4, 32), ("rcr", 2, 2, 64), ("crr", 1, 1, 16), ("ccr", 3, 3, 32),
              ("rrr", 8, 2, 128)]
    return [dispatcher.KernelConfig.create(dtype="fp32", layout=layout, tile_m=mm * fm,
                                           tile_n=mn * fn, tile_k=tk, threads=1)
            for layout, fm, fn, tk in shapes]


# ------------------------------------------------------------------ worker
class Worker:
    def __init__(self, args):
        self.root = Path(args.root)
        self.cache_dir = self.root / "cache"
        self.slot, self.inc = args.slot, args.incarnation
        self.threads = args.threads
        self.pace = args.pace
        self.corrupt_every = args.corrupt_every
        self.parent = args.parent
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.logged = collections.Counter()
        tag = f"w{self.slot}.{self.inc}"
        self.log = open(self.root / "logs" / f"{tag}.jsonl", "a", buffering=1)
        self.acks = open(self.root / "acks" / f"{tag}.txt", "a", buffering=1)
        self.fault = open(self.root / "logs" / f"fault.{tag}.txt", "w")
        faulthandler.enable(self.fault, all_threads=True)
        state = self.root / "state" / f"w{self.slot}"
        with open(state, "wb") as f:
            f.write(b"-" * 64)
        self.state_file = open(state, "r+b")
        self.state = mmap.mmap(self.state_file.fileno(), 64)
        self.local = threading.local()
        self.seq = 0
        self.next_corrupt = time.monotonic() + self.rng.expovariate(1 / self.corrupt_every)

    # events and counters ---------------------------------------------
    def event(self, kind: str, **fields):
        with self.lock:
            self.counts[f"event.{kind}"] += 1
            if self.logged[kind] >= EVENT_CAP:
                self.counts["events_capped"] += 1
                return
            self.logged[kind] += 1
            self.log.write(json.dumps({"e": kind, "t": time.time(), **fields}) + "\n")

    def count(self, key: str, n: int = 1):
        with self.lock:
            self.counts[key] += n

    def snapshot(self):
        with self.lock:
            self.log.write(json.dumps({"e": "snap", "t": time.time(), "counts": self.counts}) + "\n")

    def set_state(self, what: str):
        i = getattr(self.local, "index", None)
        if i is not None:
            self.state[i] = STATE_CODES[what][0]

    # instrumentation: wraps, never changes, what the cache does --------
    def instrument(self):
        from dispatcher import build

        worker = self
        read_entry, set_aside = build._read_entry, build.BuildCache._set_aside
        compile_into = build.BuildCache._compile_into

        def observed_read_entry(entry, name=None):
            try:
                ino = os.stat(entry).st_ino
            except OSError:
                ino = None
            try:
                return read_entry(entry, name)
            except build.CacheError as e:
                worker.event("corrupt_seen", key=Path(entry).name, ino=ino, why=str(e)[:300])
                raise

        def observed_set_aside(self, entry, error):
            before = getattr(worker.local, "state", "gemm")
            worker.set_state("set_aside")
            worker.event("set_aside", key=Path(entry).name, why=str(error)[:200])
            try:
                return set_aside(self, entry, error)
            finally:
                worker.set_state(before)

        def observed_compile(staging, source, *rest):
            worker.set_state("compile")
            worker.event("compile", name=source.name)
            started = time.monotonic()
            compile_into(staging, source, *rest)
            worker.count("compile_seconds_ms", int(1000 * (time.monotonic() - started)))
            worker.set_state("gemm")

        build._read_entry = observed_read_entry
        build.BuildCache._set_aside = observed_set_aside
        build.BuildCache._compile_into = staticmethod(observed_compile)

    # actions ------------------------------------------------------------
    def do_gemm(self, rng):
        import numpy as np

        import dispatcher
        from dispatcher.api import Dispatcher
        from dispatcher.build import BuildCache

        i = rng.randrange(len(self.configs))
        config = self.configs[i]
        fresh = rng.random() < 0.3
        d = Dispatcher(cache=BuildCache(self.cache_dir), tuning=None) if fresh else self.dispatcher
        m, n, k = (rng.randint(2, 96) for _ in range(3))  # 1: the layout is ambiguous
        nrng = np.random.default_rng(rng.getrandbits(32))
        order = {"r": "C", "c": "F"}
        a = np.asarray(nrng.uniform(-1, 1, (m, k)), np.float32, order=order[config.layout[0]])
        b = np.asarray(nrng.uniform(-1, 1, (k, n)), np.float32, order=order[config.layout[1]])
        c = nrng.uniform(-1, 1, (m, n)).astype(np.float32)
        alpha, beta = 1.5, rng.choice([0.0, 0.5])
        out = np.full((m, n), np.nan, np.float32)
        dispatcher.gemm(a, b, c=c, alpha=alpha, beta=beta, out=out, config=config, dispatcher=d)
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c.astype(np.float64)
        self.count("gemm.fresh_dispatcher" if fresh else "gemm.long_lived_dispatcher")
        if not np.allclose(out, ref, rtol=1e-4, atol=1e-5 * (k + 1)):
            self.count("wrong_answers")
            self.event("wrong", config=config.name, shape=[m, n, k],
                       max_err=float(np.nanmax(np.abs(out - ref))) if np.isfinite(out).any() else None,
                       nan=int(np.isnan(out).sum()))

    def do_entries(self, rng):
        from dispatcher.build import BuildCache

        items = BuildCache(self.cache_dir).entries()
        self.count("entries.listed", len(items))
        self.count("entries.corrupt", sum(e["status"] == "corrupt" for e in items))

    def do_prune(self, rng):
        from dispatcher.build import BuildCache

        self.count("prune.removed", BuildCache(self.cache_dir).prune())

    def corrupt_due(self, rng) -> bool:
        """Corruptions are paced (else the workers would do nothing but rebuild)."""
        with self.lock:
            now = time.monotonic()
            if now < self.next_corrupt:
                return False
            self.next_corrupt = now + rng.expovariate(1 / self.corrupt_every)
            return True

    def do_corrupt(self, rng):
        try:
            self.corrupt(rng)
        except FileNotFoundError:  # the entry was moved aside or pruned meanwhile
            self.count("corrupt.raced")

    def corrupt(self, rng):
        kernels = self.cache_dir / "kernels"
        keys = sorted(os.listdir(kernels))
        mode = rng.choices(list(CORRUPTIONS), list(CORRUPTIONS.values()))[0]
        if mode == "stray_folder":
            stray = kernels / f"stray{rng.getrandbits(64):016x}"
            stray.mkdir()
            self.event("corrupt", key=stray.name, ino=os.stat(stray).st_ino, mode=mode)
            if rng.random() < 0.5:
                (stray / "half").write_bytes(b"\x7fELF")
            return
        if not keys:
            return
        key = rng.choice(keys)
        entry = kernels / key
        try:
            ino = os.stat(entry).st_ino
            meta = json.loads((entry / "meta.json").read_text())
            lib = entry / meta["library"]
            data = lib.read_bytes()
        except (OSError, ValueError, KeyError, TypeError):
            return  # already damaged or moved aside: pick another next time
        # logged before it is done: whatever a reader sees afterwards is explained
        self.event("corrupt", key=key, ino=ino, mode=mode)

        def replace(path, content: bytes):
            tmp = path.with_name(path.name + f".new{rng.getrandbits(32)}")
            tmp.write_bytes(content)
            os.rename(tmp, path)

        def flipped(content: bytes) -> bytes:
            content = bytearray(content)
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(len(content))
                content[pos] ^= rng.randint(1, 255)
            return bytes(content)

        if mode == "truncate_in_place":
            os.truncate(lib, rng.randrange(len(data)))
        elif mode == "flip_in_place":
            with open(lib, "r+b") as f:
                for _ in range(rng.randint(1, 8)):
                    f.seek(rng.randrange(len(data)))
                    f.write(bytes([rng.randint(0, 255)]))
        elif mode == "truncate_replace":
            replace(lib, data[:rng.randrange(len(data))])
        elif mode == "flip_replace":
            replace(lib, flipped(data))
        elif mode == "delete_library":
            lib.unlink()
        elif mode == "delete_meta":
            (entry / "meta.json").unlink()
        elif mode == "swap_library":
            import hashlib

            donors = [k for k in keys if k != key and not k.startswith("stray")]
            if not donors:
                return
            donor = kernels / rng.choice(donors)
            try:
                other = next(donor.glob("*.so")).read_bytes()
            except (OSError, StopIteration):
                return
            replace(lib, other)
            meta["sha256"] = hashlib.sha256(other).hexdigest()
            replace(entry / "meta.json", json.dumps(meta).encode())
        elif mode == "garbage_meta":
            garbage = rng.choice([b"", b"{", b"[]", b"null", b'{"name": 5}',
                                  json.dumps({**meta, "sha256": "0" * 64}).encode(),
                                  bytes(rng.getrandbits(8) for _ in range(64))])
            (entry / "meta.json").write_bytes(garbage)

    def problem(self, m, n, k):
        from dispatcher.problem import GemmProblem

        return GemmProblem(m, n, k, "fp32", "fp32", "rrr")

    def do_record(self, rng):
        from dispatcher.tuning import TuningDatabase

        with self.lock:
            self.seq += 1
            seq = self.seq
        problem = self.problem(100000 + self.slot, 1 + self.inc, seq)
        stored = TuningDatabase(self.cache_dir / "tuning.sqlite").record(
            problem, self.configs[0], rng.uniform(0.1, 10.0), source=f"w{self.slot}.{self.inc}")
        if stored:
            self.acks.write(f"U {problem.m}x{problem.n}x{problem.k}\n")
        else:
            self.count("record.refused")  # a new key must always be stored
            self.event("record_refused", problem=[problem.m, problem.n, problem.k])

    def do_contend(self, rng):
        from dispatcher.tuning import TuningDatabase

        problem = self.problem(7, 7, 1 + rng.randrange(SHARED_KEYS))
        latency = round(rng.uniform(0.001, 100.0), 6)
        key = f"{problem.m}x{problem.n}x{problem.k}"
        self.acks.write(f"T {key} {latency!r}\n")  # tried: may be stored even if killed now
        if TuningDatabase(self.cache_dir / "tuning.sqlite").record(problem, self.configs[0], latency):
            self.acks.write(f"S {key} {latency!r}\n")

    def do_lookup(self, rng):
        from dispatcher.tuning import TuningDatabase

        found = TuningDatabase(self.cache_dir / "tuning.sqlite").lookup(
            self.problem(7, 7, 1 + rng.randrange(SHARED_KEYS)))
        self.count("lookup.found" if found is not None else "lookup.none")

    # loop ---------------------------------------------------------------
    def actor(self, index: int):
        from dispatcher.errors import DispatcherError

        self.local.index = index
        rng = random.Random(self.rng.getrandbits(64))
        kinds, weights = list(ACTIONS), list(ACTIONS.values())
        while not self.stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            if kind == "corrupt" and not self.corrupt_due(rng):
                kind = "gemm"
            self.set_state(kind)
            self.local.state = kind
            try:
                getattr(self, f"do_{kind}")(rng)
                self.count(f"action.{kind}")
            except DispatcherError as e:
                self.count(f"error.{kind}.{type(e).__name__}")
                self.event("error", action=kind, type=type(e).__name__, msg=str(e)[:400])
            except Exception as e:  # a defect: every failure the library means is a DispatcherError
                self.count("python_errors")
                self.event("python_error", action=kind, type=type(e).__name__,
                           tb=traceback.format_exc()[-2000:])
            self.set_state("idle")
            if self.pace:
                time.sleep(rng.uniform(0, 2 * self.pace))

    def run(self, deadline: float):
        os.environ["DISPATCHER_CACHE_DIR"] = str(self.cache_dir)
        warnings.simplefilter("ignore")  # set-asides are counted by the instrumentation
        from dispatcher.api import Dispatcher
        from dispatcher.build import BuildCache

        self.instrument()
        self.configs = stress_configs()
        self.dispatcher = Dispatcher(cache=BuildCache(self.cache_dir), tuning=None)
        self.event("start", pid=os.getpid())
        actors = [threading.Thread(target=self.actor, args=(i,), daemon=True)
                  for i in range(self.threads)]
        for t in actors:
            t.start()
        stop_file = self.root / "stop"
        while time.time() < deadline and not stop_file.exists() and os.getppid() == self.parent:
            time.sleep(0.5)
            self.snapshot()
        self.stop.set()
        for t in actors:
            t.join(timeout=60)
        self.snapshot()
        self.event("stop", stuck=sum(t.is_alive() for t in actors))
        self.log.flush()
        self.acks.flush()
        os._exit(0)


# -------------------------------------------------------------- controller
class Slot:
    def __init__(self, index):
        self.index, self.incarnation, self.proc = index, -1, None
        self.started = self.progress_at = time.monotonic()
        self.last_total = -1


def _killpg(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(proc, timeout: float):
    """Bounded wait; True if it exited."""
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _last_snapshot(path: Path):
    """The newest complete counters line of a worker log, else None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if item.get("e") == "snap":
            return item["counts"]
    return None


def _events(path: Path):
    with open(path, "rb") as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue  # the worker was killed while writing this line


def machine() -> dict:
    cpu = "unknown"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from dispatcher.targets import cpu_isa
    compiler = subprocess.run([os.environ.get("CXX", "g++"), "--version"], capture_output=True,
                              text=True).stdout.splitlines()[:1]
    return {"cpu": cpu, "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()[0],
            "python": platform.python_version(), "platform": platform.platform(),
            "compiler": " ".join(compiler), "isa": cpu_isa.active().name}


class Controller:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="cache_stress."))
        for sub in ("cache", "logs", "acks", "state"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "stop").unlink(missing_ok=True)
        self.slots = [Slot(i) for i in range(args.workers)]
        self.kills = collections.Counter()      # by what the killed worker's threads were doing
        self.kill_count = 0
        self.crashes, self.hung = [], []
        self.pgids = set()

    def start(self, slot: Slot):
        slot.incarnation += 1
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "PYTHONFAULTHANDLER": "1"}
        cmd = [sys.executable, str(HERE), "worker", "--nice", "0", "--root", str(self.root),
               "--slot", str(slot.index), "--incarnation", str(slot.incarnation),
               "--threads", str(self.args.threads), "--seed", str(self.rng.getrandbits(63)),
               "--deadline", str(self.deadline + 5), "--pace", str(self.args.pace),
               "--corrupt-every", str(self.args.corrupt_every * self.args.workers),
               "--parent", str(os.getpid())]
        out = open(self.root / "logs" / f"stderr.w{slot.index}.{slot.incarnation}.txt", "w")
        slot.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=REPO)
        out.close()
        self.pgids.add(slot.proc.pid)
        slot.started = slot.progress_at = time.monotonic()
        slot.last_total = -1

    def kill(self, slot: Slot):
        try:
            with open(self.root / "state" / f"w{slot.index}", "rb") as f:
                doing = f.read(self.args.threads)
        except OSError:
            doing = b""
        _killpg(slot.proc)
        if not _wait(slot.proc, 30):
            self.hung.append({"slot": slot.index, "incarnation": slot.incarnation,
                              "why": "did not die within 30 s of SIGKILL"})
        self.kill_count += 1
        for code in doing or b"-" * self.args.threads:  # no state file yet: starting
            self.kills[STATE_NAMES.get(bytes([code]), "starting")] += 1

    def check_progress(self, slot: Slot, now: float):
        snap = _last_snapshot(self.root / "logs" / f"w{slot.index}.{slot.incarnation}.jsonl")
        total = sum(v for k, v in (snap or {}).items() if k.startswith("action."))
        if total != slot.last_total:
            slot.last_total, slot.progress_at = total, now
        elif now - slot.progress_at > 90:
            self.hung.append({"slot": slot.index, "incarnation": slot.incarnation,
                              "why": "no action completed for 90 s"})
            self.kill(slot)
            self.start(slot)

    def run(self) -> dict:
        args = self.args
        info = machine()
        self.prebuild()
        t0 = time.time()
        self.deadline = t0 + args.seconds
        for slot in self.slots:
            self.start(slot)
        next_kill = time.monotonic() + self.rng.expovariate(1 / args.kill_every)
        next_progress = time.monotonic() + 5
        try:
            while time.time() < self.deadline:
                now = time.monotonic()
                for slot in self.slots:
                    rc = slot.proc.poll()
                    if rc is not None:  # it was not killed by us: a crash
                        self.crashes.append({"slot": slot.index, "incarnation": slot.incarnation,
                                             "returncode": rc, **self.crash_report(slot)})
                        self.start(slot)
                if now >= next_kill:
                    victim = self.rng.choice(self.slots)
                    self.kill(victim)
                    self.start(victim)
                    next_kill = now + self.rng.expovariate(1 / args.kill_every)
                if now >= next_progress:
                    for slot in self.slots:
                        self.check_progress(slot, now)
                    next_progress = now + 5
                time.sleep(0.05)
            (self.root / "stop").write_text("")
            for slot in self.slots:
                if not _wait(slot.proc, 60):
                    self.hung.append({"slot": slot.index, "incarnation": slot.incarnation,
                                      "why": "did not stop within 60 s"})
                elif slot.proc.returncode != 0:
                    self.crashes.append({"slot": slot.index, "incarnation": slot.incarnation,
                                         "returncode": slot.proc.returncode,
                                         **self.crash_report(slot)})
        finally:
            for pgid in self.pgids:  # the workers and any compiler they started
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        seconds = time.time() - t0
        figures = self.summarize()
        figures.update(self.final_checks(figures))
        figures["seconds"] = round(seconds, 1)
        figures["prebuild_seconds"] = self.prebuild_seconds
        figures["machine"] = {**info, "load_average_at_end": os.getloadavg()[0]}
        figures["settings"] = {k: getattr(args, k) for k in
                               ("seconds", "workers", "threads", "kill_every", "corrupt_every",
                                "pace", "seed", "nice")}
        figures["failures"] = self.failures(figures)
        figures["ok"] = not figures["failures"]
        if not args.keep and figures["ok"] and not args.dir:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            figures["work_dir"] = str(self.root)
        return figures

    def prebuild(self):
        """Build the configs first: the stress is on the cache, not the compiler
        (corruptions still cause rebuilds, and kills land in them)."""
        from dispatcher.api import Dispatcher
        from dispatcher.build import BuildCache

        started = time.time()
        d = Dispatcher(cache=BuildCache(self.root / "cache"), tuning=None)
        for config in stress_configs():
            d.build(d.codegen(config))
        self.prebuild_seconds = round(time.time() - started, 1)

    def crash_report(self, slot: Slot) -> dict:
        tag = f"w{slot.index}.{slot.incarnation}"
        report = {}
        for name, path in (("fault", f"fault.{tag}.txt"), ("stderr", f"stderr.{tag}.txt")):
            try:
                report[name] = (self.root / "logs" / path).read_text(errors="replace")[-3000:]
            except OSError:
                pass
        return report

    # ------------------------------------------------------------ checks
    def summarize(self) -> dict:
        counts = collections.Counter()
        events = collections.Counter()  # from the event lines: written at once, kept if killed
        modes = collections.Counter()
        corruptions = {}            # (key, ino) -> [mode, ...]
        corrupt_seen, samples = [], collections.defaultdict(list)
        damaged_at = collections.defaultdict(list)  # key -> times it was damaged
        failed = []                                  # DispatcherErrors of gemm actions
        for log in sorted((self.root / "logs").glob("w*.jsonl")):
            for item in _events(log):
                kind = item.get("e")
                events[kind] += 1
                if kind == "corrupt":
                    modes[item["mode"]] += 1
                    damaged_at[item["key"]].append(item["t"])
                    corruptions.setdefault((item["key"], item["ino"]), []).append(item["mode"])
                elif kind == "corrupt_seen":
                    corrupt_seen.append(item)
                if kind == "error" and item["action"] == "gemm":
                    failed.append(item)
                elif kind in ("error", "python_error", "wrong", "record_refused"):
                    if len(samples[kind]) < 20:
                        samples[kind].append(item)
            counts.update(_last_snapshot(log) or {})
        corrupted_keys = {key for key, _ in corruptions}
        unexplained = [s for s in corrupt_seen if (s["key"], s["ino"]) not in corruptions
                       and not (s["ino"] is None and s["key"] in corrupted_keys)]
        # a failed gemm is explained when its entry was damaged in the minute before
        unexplained_failures = []
        for item in failed:
            key = re.search(r"kernels/([0-9a-f]{32})", item["msg"])
            if not key or not any(item["t"] - 60 <= t <= item["t"] + 1
                                  for t in damaged_at[key.group(1)]):
                unexplained_failures.append(item)
        actions = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith("action.")}
        errors = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith("error.")}
        return {
            "actions": dict(sorted(actions.items())),
            "actions_total": sum(actions.values()),
            "gemm_runs": {"long_lived_dispatcher": counts["gemm.long_lived_dispatcher"],
                          "fresh_dispatcher": counts["gemm.fresh_dispatcher"]},
            "kills": self.kill_count,
            "killed_threads_were": dict(self.kills),
            "restarts": sum(s.incarnation for s in self.slots),
            "corruptions_injected": events["corrupt"],
            "corruptions_by_mode": dict(sorted(modes.items())),
            "corruptions_cut_short": counts["corrupt.raced"],  # its entry was moved aside meanwhile
            "detections": {"corrupt_reads": events["corrupt_seen"],
                           "set_aside_and_rebuilt": events["set_aside"],
                           "removed_by_prune": counts["prune.removed"],
                           "entries_listed_corrupt": counts["entries.corrupt"]},
            "compiles": events["compile"],
            "events_capped": counts["events_capped"],
            "compile_seconds": round(counts["compile_seconds_ms"] / 1000, 1),
            "errors_by_action": dict(sorted(errors.items())),
            "gemm_failures": len(failed),
            "unexplained_gemm_failures": len(unexplained_failures),
            "unexplained_gemm_failure_samples": unexplained_failures[:10],
            "wrong_answers": counts["wrong_answers"],
            "python_errors": counts["python_errors"],
            "record_refused": counts["record.refused"],
            "unexplained_corrupt_reads": len(unexplained),
            "unexplained_samples": unexplained[:10],
            "samples": dict(samples),
        }

    def final_checks(self, figures) -> dict:
        import numpy as np

        os.environ["DISPATCHER_CACHE_DIR"] = str(self.root / "cache")
        import dispatcher
        from dispatcher import build
        from dispatcher.api import Dispatcher
        from dispatcher.build import BuildCache
        from dispatcher.tuning import TuningDatabase

        cache = BuildCache(self.root / "cache")
        tmp = cache.root / "tmp"
        at_end = {
            "entries": len(cache.entries()),
            "corrupt_entries": sum(e["status"] == "corrupt" for e in cache.entries()),
            "quarantined_copies": len(list(tmp.glob("*.corrupt.*"))),
            "staging_leftovers": len([p for p in tmp.iterdir() if ".corrupt." not in p.name]),
            "staging_leftovers_bound": "one per kill at most (documented: prune removes them after an hour)",
        }
        # every config builds (moving corrupt entries aside) and runs correctly
        recovered = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rng = np.random.default_rng(0)
            for config in stress_configs():
                d = Dispatcher(cache=cache, tuning=None)
                order = {"r": "C", "c": "F"}
                a = np.asarray(rng.uniform(-1, 1, (70, 50)), np.float32, order=order[config.layout[0]])
                b = np.asarray(rng.uniform(-1, 1, (50, 40)), np.float32, order=order[config.layout[1]])
                try:
                    out = dispatcher.gemm(a, b, config=config, dispatcher=d)
                    recovered += bool(np.allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3))
                except Exception as e:  # reported, counted as not recovered
                    figures.setdefault("final_errors", []).append(f"{config.name}: {e!r}"[:300])
            # one more set-aside: the quarantine is cut to its bound
            victim = d.build(d.codegen(stress_configs()[0]))
            cut = victim.path.with_name("cut")  # a new file: this process has the library mapped
            cut.write_bytes(victim.path.read_bytes()[:1000])
            os.rename(cut, victim.path)
            d.build(d.codegen(stress_configs()[0]))
        quarantined = len(list(tmp.glob("*.corrupt.*")))
        # leftovers of killed builds: prune removes them once they are an hour old
        for p in tmp.iterdir():
            os.utime(p, (0, 0))
        cache.prune()
        after = {"tmp_after_prune": len(list(tmp.iterdir())),
                 "corrupt_after_prune": sum(e["status"] == "corrupt" for e in cache.entries())}
        # the tuning database: every acknowledged row, the fastest shared one
        db = TuningDatabase(cache.root / "tuning.sqlite")
        rows = {r["problem"]: r["latency_ms"] for r in db.entries()}
        acked, tried, stored = set(), collections.defaultdict(set), collections.defaultdict(set)
        for path in (self.root / "acks").glob("*.txt"):
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "U":
                    acked.add(parts[1])
                elif len(parts) == 3 and parts[0] in "TS":
                    try:
                        (tried if parts[0] == "T" else stored)[parts[1]].add(float(parts[2]))
                    except ValueError:
                        pass  # a line cut by a kill
        lost = sorted(acked - set(rows))
        lost_updates = [k for k in stored if k not in rows or rows[k] > min(stored[k])
                        or rows[k] not in tried[k]]
        import sqlite3
        with sqlite3.connect(db.path) as con:
            integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        con.close()
        return {
            "at_end": at_end,
            "recovery": {"configs_correct_after_run": recovered, "configs": len(stress_configs()),
                         "quarantined_after_final_set_aside": quarantined,
                         "quarantine_bound": build.QUARANTINE_KEEP, **after},
            "tuning": {"acknowledged_unique_rows": len(acked), "rows_in_database": len(rows),
                       "shared_keys_stored_updates": sum(len(v) for v in stored.values()),
                       "integrity_check": integrity},
            "lost_tuning_rows": len(lost), "lost_rows_sample": lost[:10],
            "lost_updates": len(lost_updates),
            "crashes": len(self.crashes), "crash_reports": self.crashes[:5],
            "hung_workers": len(self.hung), "hung_reports": self.hung[:5],
        }

    def failures(self, f) -> list:
        checks = [
            ("wrong_answers", f["wrong_answers"] == 0),
            ("crashes", f["crashes"] == 0),
            ("python_errors", f["python_errors"] == 0),
            ("lost_tuning_rows", f["lost_tuning_rows"] == 0),
            ("lost_updates", f["lost_updates"] == 0),
            ("record_refused", f["record_refused"] == 0),
            ("unexplained_corrupt_reads", f["unexplained_corrupt_reads"] == 0),
            ("unexplained_gemm_failures", f["unexplained_gemm_failures"] == 0),
            ("hung_workers", f["hung_workers"] == 0),
            ("events_capped", f["events_capped"] == 0),  # else some reads went unchecked
            ("tuning_integrity", f["tuning"]["integrity_check"] == "ok"),
            ("recovery", f["recovery"]["configs_correct_after_run"] == f["recovery"]["configs"]),
            ("quarantine_bound", f["recovery"]["quarantined_after_final_set_aside"]
             <= f["recovery"]["quarantine_bound"]),
            ("staging_leftovers", f["at_end"]["staging_leftovers"] <= f["kills"]),
            ("tmp_after_prune", f["recovery"]["tmp_after_prune"] == 0),
            ("corrupt_after_prune", f["recovery"]["corrupt_after_prune"] == 0),
        ]
        return [name for name, ok in checks if not ok]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="controller", choices=["controller", "worker"])
    parser.add_argument("--seconds", type=float, default=600, help="how long to stress (default 600)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--threads", type=int, default=2, help="actor threads per worker (default 2)")
    parser.add_argument("--kill-every", type=float, default=3.0,
                        help="mean seconds between SIGKILLs of a random worker (default 3)")
    parser.add_argument("--corrupt-every", type=float, default=2.0,
                        help="mean seconds between corruptions, all workers together (default 2)")
    parser.add_argument("--pace", type=float, default=0.005,
                        help="mean pause between one thread's actions in seconds (default 0.005)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--nice", type=int, default=10,
                        help="niceness of the run (default 10: the machine is shared)")
    parser.add_argument("--dir", help="work folder (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--out", help="write the figures here as JSON")
    # worker-only
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--slot", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--incarnation", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.nice:
        try:
            os.nice(args.nice)  # a shared machine; the workers inherit it
        except OSError:
            pass
    if args.role == "worker":
        Worker(args).run(args.deadline)
        return 0
    figures = Controller(args).run()
    text = json.dumps(figures, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
    brief = {k: figures[k] for k in ("seconds", "actions_total", "kills", "corruptions_injected",
                                     "compiles", "gemm_failures", "wrong_answers", "crashes",
                                     "python_errors", "lost_tuning_rows", "lost_updates",
                                     "unexplained_corrupt_reads", "unexplained_gemm_failures",
                                     "failures")}
    print(json.dumps(brief, indent=1))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
