"""The Ray executor (`--executor ray [--address ADDR]`): a sweep's builds
and measurements on a Ray cluster. Imported only when asked for.

Builds: one Ray task per kernel (one CPU each, anywhere in the cluster)
builds into its host's build cache and returns two objects: a small status
for the driver and the library (its `meta.json` and bytes), which stays in
the object store. The driver keeps {cache key: (SHA-256, object ref)}: the
library travels content-addressed by its key, only to the hosts that
benchmark it, with no shared file system. A build task whose host dies is
run again by Ray, and so is one whose library is lost with its host before
every slot has fetched it (lineage reconstruction).

Slots: one actor each, holding `num_gpus=1` (and one CPU) on a GPU target or
`--slot-cpus` CPUs on the CPU target. The actor installs a kernel's library
into its host's build cache, checked against the SHA-256 the builder
recorded, and runs it in the same disposable worker process as the local
executor (`runner.WorkerProcess`), with the same per-measurement timeout:
a kernel that crashes or hangs fails its rows with the reason and the actor
starts a fresh worker process. The driver asks for one row at a time, so
it appends and fsyncs each as it arrives. An actor, worker or host that
dies, or an actor that stops answering, is `runner.SlotLost`: the kernel's
unmeasured problems go back on the queue once, for a fresh actor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import ray
from ray.exceptions import GetTimeoutError, RayError

from ..build import BuildCache
from ..config import KernelConfig
from ..errors import CacheError, ConfigError, DispatcherError
from . import builder
from .runner import SlotLost, WorkerDied, WorkerProcess

DEFAULT_SLOT_TIMEOUT = 300.0  # seconds for an actor to start, or a worker and its library to be ready
GRACE_SECONDS = 30.0          # beyond a worker's own timeout before the driver calls its actor lost


@ray.remote(num_cpus=1, num_returns=2)
def _build(config_dict: dict):
    """(status for the driver: (name, key, sha256, error)), (the library: {"meta", "image"} or None)."""
    name, built, error = builder.build(config_dict)
    if error:
        return (name, None, None, error), None
    image = built.path.read_bytes()
    meta = built.metadata
    return (name, built.key, meta["sha256"], None), {"meta": meta, "image": image}


@ray.remote(max_restarts=0)
class SlotActor:
    """One benchmark slot on whatever host Ray placed it: a worker process
    fed one kernel at a time, rows handed to the driver one at a time."""

    def __init__(self, header: dict, env: dict, index: int, start_timeout: float):
        gpus = ",".join(map(str, ray.get_gpu_ids()))
        node = ray.get_runtime_context().get_node_id()[:8]
        self.header = {**header, "device": f"{header['target']}:{gpus or index}@{node}"}
        self.worker = WorkerProcess(self.header, {**os.environ, **env}, start_timeout)
        self.cache = BuildCache()
        self.rows = iter(())

    def ready(self) -> str:
        return self.header["device"]

    def begin(self, kernel: dict, timeout: float, sha256: str, library: list) -> dict:
        """Get the kernel's library and a worker ready: {} if they are, else
        {"died": reason} (its rows fail) or {"lost": reason} (they are
        retried). `library`: [object ref], fetched only if this host's cache
        lacks the entry."""
        try:
            self._install(kernel, sha256, library[0])
        except (CacheError, RayError, OSError) as e:
            return {"died": f"library transfer: {type(e).__name__}: {e}"}
        answer = _reported(self._start_worker)
        if not answer:
            self.rows = self.worker.run(kernel, timeout)
        return answer

    def _start_worker(self) -> dict:
        if self.worker.proc is None:
            self.worker.start()
        return {}

    def _install(self, kernel: dict, sha256: str, ref):
        key, name = kernel["key"], KernelConfig.from_dict(kernel["config"]).name
        with contextlib.suppress(CacheError):  # a corrupt entry: installing replaces it
            if self.cache.lookup(key, name) is not None:
                return
        library = ray.get(ref)
        if library["meta"].get("sha256") != sha256:
            raise CacheError(f"the library received for {name} is not the one built (SHA-256 "
                             f"{library['meta'].get('sha256')}, expected {sha256})")
        self.cache.install(key, library["meta"], library["image"])

    def next(self) -> dict:
        """The next row, {"done": True} after the kernel's last, or {"died"
        or "lost": reason} as `begin`."""
        return _reported(lambda: next(self.rows, {"done": True}))

    def stop(self):
        self.worker.kill()


class RayWorker:
    """The driver's side of one slot's actor (`runner.benchmark`'s worker)."""

    def __init__(self, actor, label: str, libraries: dict, start_timeout: float):
        self.actor, self.label, self.libraries, self.start_timeout = actor, label, libraries, start_timeout

    def run(self, kernel: dict, timeout: float):
        sha256, ref = self.libraries[kernel["key"]]
        self._check(self._get(self.actor.begin.remote(kernel, timeout, sha256, [ref]),
                              self.start_timeout + timeout + GRACE_SECONDS))
        while True:
            record = self._check(self._get(self.actor.next.remote(), timeout + GRACE_SECONDS))
            if "done" in record:
                return
            yield record

    @staticmethod
    def _check(answer: dict) -> dict:
        """The actor's answer, unless it reports its worker gone."""
        if "died" in answer:
            raise WorkerDied(answer["died"])
        if "lost" in answer:
            raise SlotLost(answer["lost"])
        return answer

    @staticmethod
    def _get(ref, timeout: float):
        try:
            return ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            raise SlotLost(f"benchmark actor gave no answer within {timeout:g} s") from None
        except RayError as e:
            raise SlotLost(f"benchmark actor lost: {_first_line(e)}") from None

    def kill(self):
        """Stop the actor's worker process if the actor still answers, then the actor."""
        with contextlib.suppress(RayError):
            ray.get(self.actor.stop.remote(), timeout=5)
        with contextlib.suppress(RayError):
            ray.kill(self.actor)


class RaySlot:
    """A benchmark slot: opening it starts an actor with the slot's resources."""

    def __init__(self, index: int, header: dict, resources: dict, env: dict, executor):
        self.index, self.header, self.resources, self.env = index, header, resources, env
        self.executor = executor
        self.label = f"{header['target']}:ray-slot-{index}"

    def open(self) -> RayWorker:
        timeout = self.executor.slot_timeout
        actor = SlotActor.options(**self.resources).remote(self.header, self.env, self.index, timeout)
        try:
            label = ray.get(actor.ready.remote(), timeout=timeout)
        except RayError as e:
            with contextlib.suppress(RayError):
                ray.kill(actor)
            why = f"none started within {timeout:g} s" if isinstance(e, GetTimeoutError) else _first_line(e)
            raise SlotLost(f"no actor for benchmark slot {self.index} with {self.resources}: {why}") from None
        return RayWorker(actor, label, self.executor.libraries, timeout)


class RayExecutor:
    """Connects to the cluster at `--address` (None: starts a single-node
    cluster on this machine for the sweep's length)."""

    def __init__(self, options):
        self.target = options.target
        self.slot_count, self.slot_cpus = options.slots, options.slot_cpus
        self.slot_timeout = options.slot_timeout or DEFAULT_SLOT_TIMEOUT
        self.libraries = {}  # cache key -> (SHA-256, object ref of {"meta", "image"})
        start_here = {} if options.address else {"include_dashboard": False}
        # Ray prints the cluster's error messages (a node died, ...) to the
        # driver's stdout: they go to stderr, so that stdout (`--json`) stays clean
        self._stdout_to_stderr = contextlib.redirect_stdout(sys.stderr)
        self._stdout_to_stderr.__enter__()
        try:
            ray.init(address=options.address, logging_level=logging.WARNING, log_to_driver=False,
                     **start_here)
        except (ConnectionError, RuntimeError, ValueError) as e:
            self._stdout_to_stderr.__exit__(None, None, None)
            raise DispatcherError(f"cannot connect to the Ray cluster at {options.address}: "
                                  f"{_first_line(e)}") from None

    def build(self, configs, progress: bool):
        pending = {}
        for config in builder.unique(configs):
            status, library = _build.remote(config.to_dict())
            pending[status] = (config.name, library)
        return builder.tally(self._outcomes(pending), len(pending), progress)

    def _outcomes(self, pending: dict):
        """(name, key, error) of each build task as it finishes."""
        waiting = list(pending)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            name, library = pending[done[0]]
            try:
                _, key, sha256, error = ray.get(done[0])
            except RayError as e:
                yield name, None, f"build task failed: {_first_line(e)}"
                continue
            if key:
                self.libraries[key] = (sha256, library)
            yield name, key, error

    def slots(self, header: dict) -> list:
        resources, env, count = self._slot_plan()
        return [RaySlot(i, header, resources, env, self) for i in range(count)]

    def _slot_plan(self):
        """(actor resources, worker environment, slot count): the target's
        `ray_slot` plan (every GPU, or one slot per `--slot-cpus` CPUs of
        each node), unless `--slots` says how many."""
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        from .. import targets
        resources, env, count = targets.get(self.target).ray_slot(nodes, self.slot_cpus)
        plan = resources, env, self.slot_count or count
        if not plan[2]:
            raise ConfigError(f"the Ray cluster has no room for a benchmark slot of the {self.target} "
                              f"target ({plan[0]}); its nodes have {nodes}")
        return plan

    def close(self):
        """Disconnect (and stop the cluster if this sweep started it)."""
        try:
            ray.shutdown()
        finally:
            self._stdout_to_stderr.__exit__(None, None, None)


def _reported(step) -> dict:
    """step()'s answer, or how the worker went: {"died": reason} (its
    kernel's fault: the rows fail) or {"lost": reason} (not: they are retried)."""
    try:
        return step()
    except WorkerDied as e:
        return {"died": str(e)}
    except SlotLost as e:
        return {"lost": str(e)}


def _first_line(error) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
