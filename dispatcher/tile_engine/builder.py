"""Build phase: every kernel of a sweep into the build cache, in parallel
processes, with a progress bar. Never loads a library.

The pool's processes die with the sweep: a sweep killed while it builds
(SIGKILL, an OOM kill) would otherwise leave them blocked for ever on the
pool's work queue, whose writing end they hold themselves. A compile they
had started finishes on its own and its staging folder is left for
`gemm-dispatcher kernels --prune`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from tqdm import tqdm

from ..config import KernelConfig
from ..errors import BuildError, DispatcherError

PARENT_POLL_SECONDS = 0.5


def _build_one(config_dict: dict):
    """In a pool process: (name, None) on success, (name, first error lines) on failure."""
    from ..api import Dispatcher
    config = KernelConfig.from_dict(config_dict)
    d = Dispatcher(tuning=None)
    try:
        d.build(d.codegen(config))
        return config.name, None
    except BuildError as e:
        return config.name, str(e)
    except DispatcherError as e:
        return config.name, f"{type(e).__name__}: {e}"


def _exit_with(parent: int):
    """Pool initializer: exit when the process `parent` (the sweep) is gone,
    checked at once and then every PARENT_POLL_SECONDS by a daemon thread
    (an orphan's parent changes: it is adopted by init or a subreaper)."""
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int):
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def build_all(configs, workers: int = 0, progress: bool = True):
    """(names built, [(name, error)]) for the distinct kernels of `configs`."""
    unique = {c.name: c for c in configs}
    workers = workers or os.cpu_count() or 1
    built, failures = [], []
    # spawn: each worker's parent is this process whatever the platform's
    # default start method (a forkserver would be the parent instead)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_exit_with, initargs=(os.getpid(),)) as pool:
        futures = [pool.submit(_build_one, c.to_dict()) for c in unique.values()]
        bar = tqdm(total=len(futures), desc="build", unit="kernel", disable=not progress,
                   file=sys.stderr)
        for future in as_completed(futures):
            name, error = future.result()
            (failures.append((name, error)) if error else built.append(name))
            bar.set_postfix(ok=len(built), failed=len(failures))
            bar.update()
        bar.close()
    return built, failures
