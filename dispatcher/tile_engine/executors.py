"""Executors: where a sweep's builds and measurements run, chosen by name
(`--executor local|ray`).

An executor builds the distinct kernels of a sweep (`build`: {name: cache
key} and the failures) and hands out benchmark slots (`slots`), which the
shared benchmark phase (`runner.benchmark`) feeds from one work queue. The
driver, the process running the sweep, stays the only writer of rows and of
the tuning database, whatever the executor.

`local` builds in a process pool and runs one worker process per
`--devices` id on this machine. `ray` (`ray_executor`, imported only when
asked for, so that neither `import dispatcher` nor a local sweep imports
Ray) runs both on a Ray cluster.
"""

from __future__ import annotations

import importlib.util
import os

from ..errors import ConfigError
from . import builder
from .runner import WorkerProcess

NAMES = ("local", "ray")
# Options only one executor reads: giving one to the other is an error, not ignored.
OWN_OPTIONS = {"local": ("workers", "devices"),
               "ray": ("address", "slots", "slot_cpus", "slot_timeout")}


def create(options):
    """The executor `options.executor` names (a SweepOptions), its options checked."""
    name = options.executor
    if name not in NAMES:
        raise ConfigError(f"unknown executor {name!r}; known: {', '.join(NAMES)}")
    for other, names in OWN_OPTIONS.items():
        for option in names if other != name else ():
            if getattr(options, option):
                flag = "--" + option.replace("_", "-")
                raise ConfigError(f"{flag} is an option of --executor {other}, not of --executor {name}")
    if name == "local":
        return LocalExecutor(options)
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("--executor ray needs Ray: pip install 'gemm-dispatcher[ray]'")
    from .ray_executor import RayExecutor
    return RayExecutor(options)


class LocalExecutor:
    """Builds in a pool of this machine's processes; one slot per `--devices` id."""

    def __init__(self, options):
        self.workers = options.workers
        self.target = options.target
        self.devices = parse_devices(options.devices, options.target)

    def build(self, configs, progress: bool):
        return builder.build_all(configs, self.workers, progress)

    def slots(self, header: dict) -> list:
        return [LocalSlot(header, device, index, len(self.devices))
                for index, device in enumerate(self.devices)]

    def close(self):
        """Nothing outlives a local sweep's phases."""


class LocalSlot:
    """One `--devices` id: a worker process pinned to it."""

    def __init__(self, header: dict, device: str, index: int, count: int):
        self.label = f"{header['target']}:{device}"
        self.header = {**header, "device": self.label}
        self.env = slot_environment(header["target"], device, index, count)

    def open(self) -> WorkerProcess:
        return WorkerProcess(self.header, self.env)


def parse_devices(text, target: str) -> list:
    """--devices: ids "0,1" (one worker each; "0,0" runs two workers on GPU 0)
    or one id "3". Default: the target's (every visible GPU, or one CPU worker)."""
    if text is None or text == "":
        from .. import targets
        return targets.get(target).benchmark_devices()
    ids = [d.strip() for d in str(text).split(",") if d.strip()]
    if not ids or not all(d.isdigit() for d in ids):
        raise ConfigError(f"--devices wants device ids like 0 or 0,1, got {text!r}")
    return ids


def slot_environment(target: str, device: str, slot: int, slots: int) -> dict:
    """The environment of benchmark slot `slot` of `slots` on `device`: the
    target's share of the machine (CPUs, or one GPU)."""
    from .. import targets
    return {**os.environ, **targets.get(target).worker_environment(device, slot, slots)}
